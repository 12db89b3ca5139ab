"""The options that open checkpoints add to attnkit.nn, each against its formula (or
against transformers' own function): partial and scaled rotary, explicit head dims,
per-head norms, score scale, soft-capping, sliding windows, biases on the input
projections only, tanh-GELU and GeGLU, (1 + w) RMSNorm, parallel and sandwich-normed
layers, scaled embeddings and soft-capped logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

from attnkit import masks
from attnkit.functional import attention
from attnkit.nn import (
    AttentionConfig,
    DecoderLayer,
    DecoderLM,
    FeedForward,
    LayerConfig,
    MultiHeadAttention,
    RMSNorm,
    RotaryEmbedding,
)
from attnkit.nn.rope_scaling import DynamicNTKRopeScaling, LinearRopeScaling, Llama3RopeScaling, YarnRopeScaling

E, H, D = 32, 4, 8


def _split(t: torch.Tensor, heads: int) -> torch.Tensor:
    b, s, _ = t.shape
    return t.view(b, s, heads, -1).transpose(1, 2)


@pytest.mark.parametrize(
    ("rope", "scaling"),
    [
        ({"rope_type": "linear", "factor": 4.0}, LinearRopeScaling(4.0)),
        (
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
            Llama3RopeScaling(8.0, 1.0, 4.0, 32),
        ),
        ({"rope_type": "dynamic", "factor": 2.0}, DynamicNTKRopeScaling(2.0, 64)),
        (
            {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "mscale_all_dim": 1.0},
            YarnRopeScaling(4.0, 16),
        ),
        (
            {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "beta_fast": 16.0},
            YarnRopeScaling(40.0, 4096, beta_fast=16.0),
        ),
    ],
)
def test_rope_scaling_frequencies_equal_transformers(rope: dict, scaling) -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.LlamaConfig(
        hidden_size=256,
        num_attention_heads=4,
        max_position_embeddings=64,
        rope_parameters={"rope_theta": 10000.0, **rope},
    )
    expected, _ = ROPE_INIT_FUNCTIONS[rope["rope_type"]](config, "cpu")
    assert_close(scaling.frequencies(10000.0, 64), expected, rtol=1e-6, atol=0)
    if scaling.varies_with_length:
        longer, _ = ROPE_INIT_FUNCTIONS[rope["rope_type"]](config, "cpu", seq_len=100)
        assert_close(scaling.frequencies(10000.0, 64, 100), longer, rtol=1e-6, atol=0)
        assert not torch.allclose(longer, expected)


def test_dynamic_rotary_changes_frequencies_past_max_positions_only() -> None:
    rotary = RotaryEmbedding(8, max_positions=16, scaling=DynamicNTKRopeScaling(2.0, 16))
    plain = RotaryEmbedding(8, max_positions=16)
    x = torch.randn(1, 2, 20, 8)
    assert_close(rotary.rotate_from(x[:, :, :16], 0), plain.rotate_from(x[:, :, :16], 0))
    grown = rotary.rotate_from(x, 0)
    frequencies = DynamicNTKRopeScaling(2.0, 16).frequencies(10000.0, 8, 20)
    cos, sin = rotary.cos_sin(torch.arange(20), frequencies)
    half = torch.cat((-x[..., 4:], x[..., :4]), dim=-1)
    assert_close(grown, x * cos + half * sin)
    assert_close(rotary.rotate(x, torch.arange(20)), grown)


def test_partial_rotary_rotates_the_first_dims_only() -> None:
    rotary = RotaryEmbedding(8, rotary_dim=4, max_positions=8)
    x = torch.randn(2, 3, 5, 8)
    out = rotary.rotate_from(x, 2)
    assert_close(out[..., 4:], x[..., 4:], rtol=0, atol=0)
    assert_close(out[..., :4], RotaryEmbedding(4).rotate_from(x[..., :4], 2))
    with pytest.raises(ValueError, match="rotary_dim must be even"):
        RotaryEmbedding(8, rotary_dim=10)


def test_attention_options_equal_their_formula() -> None:
    torch.manual_seed(0)
    head_dim, scale, softcap, window = 12, 0.3, 2.0, 3
    mha = MultiHeadAttention(
        AttentionConfig(
            E,
            H,
            num_kv_heads=2,
            head_dim=head_dim,
            bias=True,
            out_bias=False,
            scale=scale,
            softcap=softcap,
            window=window,
        ),
        q_norm=RMSNorm(head_dim),
        k_norm=RMSNorm(head_dim),
    ).eval()
    assert mha.q_proj.weight.shape == (H * head_dim, E) and mha.q_proj.bias is not None
    assert mha.out_proj.bias is None and mha.out_proj.weight.shape == (E, H * head_dim)
    x = torch.randn(2, 7, E)
    out = mha(x, causal=True, return_weights=True)
    q = mha.q_norm(_split(mha.q_proj(x), H))
    k = mha.k_norm(_split(mha.k_proj(x), 2)).repeat_interleave(2, dim=1)
    v = _split(mha.v_proj(x), 2).repeat_interleave(2, dim=1)
    scores = torch.tanh(q @ k.transpose(-1, -2) * scale / softcap) * softcap
    allowed = masks.sliding_window(window - 1).to_dense(7, 7)
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    assert_close(out.weights, weights)
    assert_close(out.output, mha.out_proj((weights @ v).transpose(1, 2).reshape(2, 7, H * head_dim)))
    # The fused path (no weights asked for) computes the same.
    assert_close(mha(x, causal=True), out.output)


def test_window_with_a_cache_equals_the_full_pass() -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(AttentionConfig(E, H, window=3), positional=RotaryEmbedding(E // H)).eval()
    x = torch.randn(1, 9, E)
    full = mha(x, causal=True)
    from attnkit.nn import KVCache

    cache = KVCache()
    steps = [mha(x[:, :5], causal=True, kv_cache=cache)]
    steps += [mha(x[:, i : i + 1], causal=True, kv_cache=cache) for i in range(5, 9)]
    assert_close(torch.cat(steps, dim=1), full)
    # Without the window every key is seen: the outputs differ.
    plain = MultiHeadAttention(AttentionConfig(E, H), positional=RotaryEmbedding(E // H)).eval()
    plain.load_state_dict(mha.state_dict())
    assert not torch.allclose(plain(x, causal=True)[:, -1], full[:, -1])


def test_a_windowed_decoding_step_shows_weights_over_every_cached_key() -> None:
    """A step attends to the window's keys alone; asked for its weights, it shows them
    over every cached key, zero outside the window, with the same output."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(AttentionConfig(E, H, window=3), positional=RotaryEmbedding(E // H)).eval()
    from attnkit.nn import KVCache

    x = torch.randn(2, 8, E)
    cache = KVCache()
    mha(x[:, :7], causal=True, kv_cache=cache)
    before = len(cache)
    seen = mha(x[:, 7:], causal=True, kv_cache=cache, return_weights=True)
    assert seen.weights.shape == (2, H, 1, 8)
    assert (seen.weights[..., :5] == 0).all()
    assert_close(seen.weights.sum(-1), torch.ones(2, H, 1))
    cache_again = KVCache()
    mha(x[:, :before], causal=True, kv_cache=cache_again)
    assert_close(mha(x[:, 7:], causal=True, kv_cache=cache_again), seen.output)


def test_attention_option_errors() -> None:
    with pytest.raises(ValueError, match="need kernel='auto'"):
        MultiHeadAttention(AttentionConfig(E, H, window=4, kernel="tiled"))
    with pytest.raises(ValueError, match="softcap must be a positive number"):
        MultiHeadAttention(AttentionConfig(E, H, softcap=0.0))
    with pytest.raises(ValueError, match="window must be a positive int"):
        MultiHeadAttention(AttentionConfig(E, H, window=0))
    with pytest.raises(ValueError, match="embed_dim must be divisible"):
        MultiHeadAttention(AttentionConfig(30, 4))
    assert MultiHeadAttention(AttentionConfig(30, 4, head_dim=8)).q_proj.out_features == 32


@pytest.mark.parametrize(
    ("activation", "formula"),
    [
        ("gelu_tanh", lambda ff, x: ff.down_proj(F.gelu(ff.up_proj(x), approximate="tanh"))),
        ("geglu", lambda ff, x: ff.down_proj(F.gelu(ff.gate_proj(x)) * ff.up_proj(x))),
        (
            "geglu_tanh",
            lambda ff, x: ff.down_proj(F.gelu(ff.gate_proj(x), approximate="tanh") * ff.up_proj(x)),
        ),
    ],
)
def test_feed_forward_activations(activation: str, formula) -> None:
    ff = FeedForward(E, 16, activation=activation)
    x = torch.randn(3, E)
    assert_close(ff(x), formula(ff, x))
    if ff.packable:
        ff.pack_projections()
        with torch.no_grad():
            assert_close(ff(x), formula(ff, x))


def test_rms_norm_plus_one() -> None:
    norm = RMSNorm(E, eps=1e-6, plus_one=True)
    assert (norm.weight == 0).all()
    nn.init.normal_(norm.weight)
    x = torch.randn(2, E)
    assert_close(norm(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + norm.weight))


def test_parallel_and_output_normed_layers() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 5, E)
    parallel = DecoderLayer(
        LayerConfig(E, H, 16, dropout=0.0, norm_first=True, parallel=True), cross_attention=False
    ).eval()
    expected = x + parallel.self_attn(parallel.self_attn_norm(x), causal=True) + parallel.ff(parallel.ff_norm(x))
    assert_close(parallel(x), expected)
    sandwich = DecoderLayer(
        LayerConfig(E, H, 16, dropout=0.0, norm_first=True, norm="rms", output_norms=True), cross_attention=False
    )
    for norm in (sandwich.self_attn_out_norm, sandwich.ff_out_norm):
        nn.init.normal_(norm.weight)
    mid = x + sandwich.self_attn_out_norm(sandwich.self_attn(sandwich.self_attn_norm(x), causal=True))
    assert_close(sandwich(x), mid + sandwich.ff_out_norm(sandwich.ff(sandwich.ff_norm(mid))))
    with pytest.raises(ValueError, match="pre-norm layer without cross-attention"):
        DecoderLayer(LayerConfig(E, H, 16, parallel=True))


def test_decoder_lm_from_parts_scales_embeddings_and_caps_logits() -> None:
    torch.manual_seed(0)
    layers = [
        DecoderLayer(
            LayerConfig(E, H, 16, dropout=0.0, norm_first=True),
            cross_attention=False,
            self_attn=MultiHeadAttention(
                AttentionConfig(E, H, window=2 if i == 0 else None), positional=RotaryEmbedding(E // H)
            ),
        )
        for i in range(2)
    ]
    model = DecoderLM.from_parts(
        nn.Embedding(50, E), layers, final_norm=nn.LayerNorm(E), embedding_scale=3.0, logit_softcap=5.0
    ).eval()
    ids = torch.randint(0, 50, (1, 6))
    x = model.token_embedding(ids) * 3.0
    for layer in model.decoder.layers:
        x = layer(x)
    logits = model.lm_head(model.decoder.final_norm(x))
    assert_close(model(ids), torch.tanh(logits / 5.0) * 5.0)
    assert model(ids).abs().max() < 5.0
    assert model.lm_head.weight is model.token_embedding.weight
    generated = model.generate(ids, 4)
    step = ids
    for _ in range(4):
        step = torch.cat((step, model(step)[:, -1].argmax(-1, keepdim=True)), dim=1)
    assert torch.equal(generated, step)


def test_attention_reference_is_unchanged_without_options() -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(AttentionConfig(E, H)).eval()
    x = torch.randn(1, 4, E)
    q, k, v = (_split(proj(x), H) for proj in (mha.q_proj, mha.k_proj, mha.v_proj))
    expected = attention(q, k, v, causal=True)
    assert_close(mha(x, causal=True), mha.out_proj(expected.transpose(1, 2).reshape(1, 4, E)))
