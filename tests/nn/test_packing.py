"""Packed projections: same results, same parameters, and a safe return to separate
products whenever the packed matrix could be stale or gradients are needed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnkit.nn import (
    AttentionConfig,
    DecoderLM,
    DecoderLMConfig,
    Encoder,
    EncoderLayer,
    FeedForward,
    LayerConfig,
    MultiHeadAttention,
    PackedLinears,
    pack_projections,
)
from attnkit.nn.packing import PACKED_ROWS
from tests.nn.helpers import assert_close

V, E, H = 23, 16, 4
LLAMA_LIKE = dict(positional="rotary", num_kv_heads=2, rope_theta=1e5, activation="swiglu", norm="rms", bias=False)


def _pair(**options) -> tuple[DecoderLM, DecoderLM]:
    torch.manual_seed(0)
    plain = DecoderLM(DecoderLMConfig(E, H, 32, vocab_size=V, num_layers=2, **options)).eval()
    packed = DecoderLM(DecoderLMConfig(E, H, 32, vocab_size=V, num_layers=2, **options)).eval()
    packed.load_state_dict(plain.state_dict())
    assert pack_projections(packed) == 4  # two attentions, two gated feed-forwards
    return plain, packed


def test_packed_model_computes_the_same_with_the_same_parameters() -> None:
    plain, packed = _pair(**LLAMA_LIKE)
    assert packed.state_dict().keys() == plain.state_dict().keys()
    attn = packed.decoder.layers[0].self_attn
    assert attn.q_proj.weight.data_ptr() == attn._packed.weight.data_ptr()  # a view, not a copy
    assert attn._packed.sizes == (E, E // 2, E // 2)
    tokens = torch.randint(0, V, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert attn._packed.usable(torch.zeros(2, 1, E))  # a decoding step of two sequences
        assert_close(packed(tokens), plain(tokens))
        cache_plain, cache_packed = plain.new_kv_cache(capacity=7), packed.new_kv_cache(capacity=7)
        for i in range(7):
            step = tokens[:, i : i + 1]
            assert_close(packed(step, kv_cache=cache_packed), plain(step, kv_cache=cache_plain))
        result = packed(tokens, return_weights=[1])
        assert_close(result.weights[1].self_attention, plain(tokens, return_weights=True).weights[1].self_attention)


def test_training_uses_the_parameters_and_keeps_the_packed_matrix_in_step() -> None:
    plain, packed = _pair(**LLAMA_LIKE)
    tokens = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(2))
    for model in (plain, packed):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model(tokens).square().mean().backward()  # grad enabled: the separate products
        optimizer.step()
    attn = packed.decoder.layers[0].self_attn
    assert attn.k_proj.weight.grad is not None
    assert_close(attn._packed.weight[E : E + E // 2], attn.k_proj.weight.detach())  # updated in place, through the view
    with torch.no_grad():
        assert_close(packed(tokens), plain(tokens))


def test_replaced_or_converted_parameters_fall_back_to_separate_products() -> None:
    plain, packed = _pair(**LLAMA_LIKE)
    tokens = torch.randint(0, V, (1, 4), generator=torch.Generator().manual_seed(3))
    ff = packed.decoder.layers[1].ff
    ff.up_proj.weight = nn.Parameter(ff.up_proj.weight.detach() * 2)
    with torch.no_grad():
        assert not ff._packed.usable(torch.zeros(1, 1, E))
        plain.decoder.layers[1].ff.up_proj.weight.mul_(2)
        assert_close(packed(tokens), plain(tokens))
        wide = packed.double()
        assert not wide.decoder.layers[0].self_attn._packed.usable(torch.zeros(1, 1, E, dtype=torch.float64))
        assert_close(wide(tokens).float(), plain(tokens))


def test_a_prompt_runs_the_separate_products() -> None:
    _, packed = _pair(**LLAMA_LIKE)
    attn, ff = packed.decoder.layers[0].self_attn, packed.decoder.layers[0].ff
    with torch.no_grad():
        assert attn._packed.usable(torch.zeros(1, PACKED_ROWS, E))
        assert not attn._packed.usable(torch.zeros(1, PACKED_ROWS + 1, E))
        assert not ff._packed.usable(torch.zeros(PACKED_ROWS + 1, 1, E))
        products = []
        handle = torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: products.append(m))
        try:
            packed(torch.zeros(1, 5, dtype=torch.long))
        finally:
            handle.remove()
    # The separate linears ran: q, k, v and the output projection, gate, up and down, in
    # each of the two layers, and the head.
    assert sum(isinstance(m, nn.Linear) for m in products) == 2 * (4 + 3) + 1


def test_bert_style_projections_with_biases() -> None:
    torch.manual_seed(4)
    encoder = Encoder([EncoderLayer(LayerConfig(E, H, 32, dropout=0.0, activation="gelu")) for _ in range(2)]).eval()
    x = torch.randn(2, 6, E)
    with torch.no_grad():
        expected = encoder(x)
        assert pack_projections(encoder) == 2  # the ungated feed-forwards have nothing to pack
        assert encoder.layers[0].self_attn._packed.bias.shape == (3 * E,)
        assert_close(encoder(x), expected)


def test_errors() -> None:
    with pytest.raises(ValueError, match="only self-attention projections can be packed"):
        MultiHeadAttention(AttentionConfig(E, H, kdim=8, vdim=8)).pack_projections()
    with pytest.raises(ValueError, match="only gated blocks"):
        FeedForward(E, 32, activation="gelu").pack_projections()
    with pytest.raises(ValueError, match="all have a bias or all have none"):
        PackedLinears([nn.Linear(4, 4), nn.Linear(4, 4, bias=False)])
    with pytest.raises(ValueError, match="share input dim"):
        PackedLinears([nn.Linear(4, 4), nn.Linear(5, 4)])
    with pytest.raises(ValueError, match="nothing to pack"):
        PackedLinears([])
