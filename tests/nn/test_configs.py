"""The configs the attnkit.nn modules are built from: frozen, checked when made, and taken
whole by the modules."""

from __future__ import annotations

import dataclasses

import pytest

from attnkit.nn import (
    AttentionConfig,
    DecoderLayer,
    DecoderLM,
    DecoderLMConfig,
    EncoderLayer,
    LayerConfig,
    MultiHeadAttention,
    Transformer,
    TransformerConfig,
)


def test_configs_are_frozen_and_keep_a_checked_copy_of_the_kernel_options():
    options = {"window": 2}
    config = AttentionConfig(16, 2, kernel="local", kernel_options=options)
    options["window"] = 99
    assert config.kernel_options == {"window": 2}
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.num_heads = 4  # type: ignore[misc]


def test_a_layer_config_gives_its_attention_config():
    layer = LayerConfig(16, 2, 32, num_kv_heads=1, head_dim=4, dropout=0.2, bias=False)
    assert layer.attention() == AttentionConfig(16, 2, num_kv_heads=1, head_dim=4, bias=False, dropout=0.2)
    # A kernel without weights has no dropout on them.
    tiled = LayerConfig(16, 2, 32, kernel="tiled", dropout=0.2)
    assert tiled.attention().dropout == 0.0


def test_a_stack_config_is_a_layer_config_plus_the_stack_options():
    lm = DecoderLMConfig(16, 2, 32, vocab_size=10, num_layers=3, norm="rms")
    assert lm.layer() == LayerConfig(16, 2, 32, dropout=0.0, activation="gelu", norm="rms", norm_first=True)
    assert type(lm.layer()) is LayerConfig
    paper = TransformerConfig()
    assert (paper.embed_dim, paper.num_heads, paper.ff_dim, paper.num_encoder_layers) == (512, 8, 2048, 6)
    assert paper.layer() == LayerConfig(512, 8, 2048)


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: LayerConfig(16, 2, 32, activation="tanh"), ValueError, "activation must be one of"),
        (lambda: LayerConfig(16, 3, 32), ValueError, "embed_dim must be divisible by num_heads"),
        (lambda: DecoderLMConfig(16, 2, 32, vocab_size=0, num_layers=1), ValueError, "vocab_size and num_layers"),
        (lambda: TransformerConfig(num_decoder_layers=0), ValueError, "num_decoder_layers must be >= 1"),
        (lambda: AttentionConfig(16, 2, kernel="local"), TypeError, "needs the option 'window'"),
    ],
)
def test_a_config_is_checked_when_it_is_made(make, error, message):
    with pytest.raises(error, match=message):
        make()


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: MultiHeadAttention(LayerConfig(16, 2, 32)), "AttentionConfig"),  # type: ignore[arg-type]
        (lambda: EncoderLayer(AttentionConfig(16, 2)), "LayerConfig"),  # type: ignore[arg-type]
        (lambda: DecoderLayer(AttentionConfig(16, 2)), "LayerConfig"),  # type: ignore[arg-type]
        (lambda: DecoderLM(LayerConfig(16, 2, 32)), "DecoderLMConfig"),  # type: ignore[arg-type]
        (lambda: Transformer(LayerConfig(16, 2, 32)), "TransformerConfig"),  # type: ignore[arg-type]
    ],
)
def test_a_module_takes_only_its_own_config(make, expected):
    with pytest.raises(TypeError, match=f"config must be an attnkit.nn.{expected}"):
        make()
