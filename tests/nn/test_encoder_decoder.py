"""attnkit.nn.EncoderDecoderLM: the three kinds of attention in its records, cached
decoding equal to the full pass, source padding, and the built attention modules that
layers take."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnkit.nn import (
    AttentionConfig,
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderDecoderLM,
    EncoderLayer,
    LayerConfig,
    LearnedPositionalEmbedding,
    LMHead,
    MultiHeadAttention,
    RelativePositionBias,
    SequenceEmbedding,
    source_padding_mask,
)

V, E, H = 23, 16, 2


def tiny(*, relative: bool = False, seed: int = 0) -> EncoderDecoderLM:
    """Two encoder and three decoder layers; T5-like (relative bias, unscaled scores,
    pre-norm RMS) with ``relative``, else BART-like (learned positions with an offset,
    post-norm)."""
    torch.manual_seed(seed)
    token = nn.Embedding(V, E)
    if relative:
        enc_bias, dec_bias = RelativePositionBias(H, num_buckets=8), RelativePositionBias(H, bidirectional=False)

        def attn(bias: RelativePositionBias | None) -> MultiHeadAttention:
            return MultiHeadAttention(AttentionConfig(E, H, head_dim=4, bias=False, score="dot"), positional=bias)

        options = dict(norm="rms", norm_first=True, bias=False, dropout=0.0, activation="geglu_tanh")
        encoder = Encoder([EncoderLayer(LayerConfig(E, H, 24, **options), self_attn=attn(enc_bias)) for _ in range(2)])
        decoder = Decoder(
            [
                DecoderLayer(LayerConfig(E, H, 24, **options), self_attn=attn(dec_bias), cross_attn=attn(None))
                for _ in range(3)
            ]
        )
        source, target = SequenceEmbedding(token), SequenceEmbedding(token)
    else:
        encoder = Encoder([EncoderLayer(LayerConfig(E, H, 24, dropout=0.0, activation="gelu")) for _ in range(2)])
        decoder = Decoder([DecoderLayer(LayerConfig(E, H, 24, dropout=0.0, activation="gelu")) for _ in range(3)])

        def embedding() -> SequenceEmbedding:
            position = LearnedPositionalEmbedding(40, E)
            return SequenceEmbedding(token, scale=E**0.5, position=position, position_offset=2, norm=nn.LayerNorm(E))

        source, target = embedding(), embedding()
    return EncoderDecoderLM(
        source_embedding=source,
        target_embedding=target,
        encoder=encoder,
        decoder=decoder,
        head=LMHead(E, V, input_scale=0.5, bias=True),
        decoder_start_token_id=0,
    ).eval()


@pytest.mark.parametrize("relative", [False, True])
def test_records_hold_the_three_kinds_of_attention(relative: bool) -> None:
    model = tiny(relative=relative)
    source, target = torch.randint(0, V, (2, 7)), torch.randint(0, V, (2, 5))
    out = model(source, target, return_weights=True)
    assert out.logits.shape == (2, 5, V)
    torch.testing.assert_close(out.logits, model(source, target), rtol=1e-5, atol=1e-6)  # fused vs reference path
    assert [w.self_attention.shape for w in out.encoder_weights] == [(2, H, 7, 7)] * 2
    assert [w.self_attention.shape for w in out.decoder_weights] == [(2, H, 5, 5)] * 3
    assert [w.cross_attention.shape for w in out.decoder_weights] == [(2, H, 5, 7)] * 3
    for w in out.decoder_weights:
        assert torch.all(w.self_attention.triu(1) == 0)  # causal
        torch.testing.assert_close(w.cross_attention.sum(-1), torch.ones(2, H, 5))


@pytest.mark.parametrize("relative", [False, True])
def test_cached_decoding_equals_the_full_pass(relative: bool) -> None:
    model = tiny(relative=relative)
    source = torch.randint(0, V, (2, 6))
    tokens = list(model.stream(source, 6))
    produced = torch.stack(tokens, dim=1)  # [2, 6]
    decoder_input = torch.cat((torch.zeros(2, 1, dtype=torch.long), produced[:, :-1]), dim=1)
    full = model(source, decoder_input)  # [2, 6, V]
    assert torch.equal(full.argmax(-1), produced)
    # Step by step with a cache: the same logits as the full pass.
    memory = model.encode(source)
    cache = model.new_kv_cache()
    steps = [model.head(model.decode(decoder_input[:, i : i + 1], memory, kv_cache=cache)) for i in range(6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)
    assert torch.equal(model.generate(source, 6), produced)


def test_source_padding_changes_nothing_for_the_real_tokens() -> None:
    model = tiny()
    source, target = torch.randint(1, V, (1, 5)), torch.randint(1, V, (1, 4))
    padded = torch.cat((source, torch.zeros(1, 3, dtype=torch.long)), dim=1)
    mask = torch.tensor([[True] * 5 + [False] * 3])
    out = model(padded, target, source_mask=mask, return_weights=True)
    torch.testing.assert_close(out.logits, model(source, target), rtol=1e-5, atol=1e-5)
    assert torch.all(out.decoder_weights[0].cross_attention[..., 5:] == 0)
    assert source_padding_mask(mask).shape == (1, 1, 1, 8)
    with pytest.raises(TypeError, match="bool"):
        source_padding_mask(mask.long())


def test_generate_stops_once_every_row_ended() -> None:
    model = tiny()
    source = torch.randint(0, V, (1, 4))
    first = int(next(model.stream(source, 1)))
    assert model.generate(source, 5, eos_token_id=first).tolist() == [[first]]


def test_errors_say_what_was_expected() -> None:
    model = tiny()
    with pytest.raises(TypeError, match="source must be integer token ids"):
        model.encode(torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"target must be \[b, s\]"):
        model.decode(torch.zeros(3, dtype=torch.long), torch.zeros(1, 3, E))
    with pytest.raises(ValueError, match="max_new_tokens must be >= 0"):
        model.stream(torch.zeros(1, 3, dtype=torch.long), -1)
    with pytest.raises(ValueError, match="needs cross-attention"):
        EncoderDecoderLM(
            source_embedding=model.source_embedding,
            target_embedding=model.target_embedding,
            encoder=model.encoder,
            decoder=Decoder([DecoderLayer(LayerConfig(E, H, 8), cross_attention=False)]),
            head=model.head,
            decoder_start_token_id=0,
        )
    with pytest.raises(ValueError, match="position_offset"):
        SequenceEmbedding(nn.Embedding(3, E), position_offset=2)


def test_layers_take_built_attention_modules() -> None:
    cross = MultiHeadAttention(AttentionConfig(E, H, score="dot", bias=False))
    layer = DecoderLayer(LayerConfig(E, H, 8), cross_attn=cross)
    assert layer.cross_attn is cross
    assert EncoderLayer(LayerConfig(E, H, 8), self_attn=cross).self_attn is cross
    with pytest.raises(ValueError, match="cross_attention=False"):
        DecoderLayer(LayerConfig(E, H, 8), cross_attention=False, cross_attn=cross)
    with pytest.raises(ValueError, match="cross_attn has embed_dim=8, the layer has embed_dim=16"):
        DecoderLayer(LayerConfig(E, H, 8), cross_attn=MultiHeadAttention(AttentionConfig(8, 2)))
    with pytest.raises(TypeError, match="self_attn must be an attnkit.nn.MultiHeadAttention"):
        EncoderLayer(LayerConfig(E, H, 8), self_attn=nn.Linear(E, E))  # type: ignore[arg-type]
