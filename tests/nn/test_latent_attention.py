"""MultiHeadLatentAttention against transformers' DeepSeek-V3 attention with the same
weights, cached decoding against full recomputation, the cache's size against
grouped-query attention's, and the config's checks."""

from __future__ import annotations

import pytest
import torch

from attnkit.nn import KVCache, LatentAttentionConfig, MultiHeadLatentAttention, RotaryEmbedding
from attnkit.nn.latent_attention import yarn_mscale

transformers = pytest.importorskip("transformers")
SIZES = {"kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 12}
_RENAMED = {
    "o_proj": "out_proj",
    "kv_a_proj_with_mqa": "kv_a_proj",
    "q_a_layernorm": "q_a_norm",
    "kv_a_layernorm": "kv_a_norm",
}


def _pair(q_lora_rank, interleaved):
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek

    config = transformers.DeepseekV3Config(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=q_lora_rank,
        rope_interleave=interleaved,
        **SIZES,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = deepseek.DeepseekV3Attention(config, 0).eval()
    for p in hf.parameters():
        torch.nn.init.normal_(p, std=0.2)
    ours = MultiHeadLatentAttention(
        LatentAttentionConfig(64, 4, q_lora_rank=q_lora_rank, interleaved_rotary=interleaved, **SIZES),
        positional=RotaryEmbedding(8, theta=config.rope_parameters["rope_theta"]),
    )
    state = {}
    for key, value in hf.state_dict().items():
        for theirs, mine in _RENAMED.items():
            key = key.replace(theirs, mine)
        state[key] = value
    ours.load_state_dict(state, strict=True)
    return hf, ours, deepseek.DeepseekV3RotaryEmbedding(config)


@pytest.mark.parametrize(("q_lora_rank", "interleaved"), [(24, True), (None, False)])
def test_equals_transformers_deepseek_v3_attention(q_lora_rank, interleaved) -> None:
    hf, ours, rotary = _pair(q_lora_rank, interleaved)
    x = torch.randn(2, 7, 64)
    cos, sin = rotary(x, torch.arange(7)[None].expand(2, -1))
    causal = torch.full((7, 7), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        expected, expected_weights = hf(x, (cos, sin), causal)
        record = ours.forward_record(x, causal=True, return_weights=True)
        fused = ours(x, causal=True)
    torch.testing.assert_close(record.output, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(record.weights, expected_weights, rtol=0, atol=1e-6)
    torch.testing.assert_close(fused, expected, rtol=0, atol=1e-5)


def test_cached_decoding_equals_full_recomputation_and_keeps_latents() -> None:
    _, ours, _ = _pair(24, True)
    x = torch.randn(2, 9, 64)
    with torch.no_grad():
        full = ours(x, causal=True)
        cache = KVCache()
        steps = [ours(x[:, :5], causal=True, kv_cache=cache)]
        steps += [ours(x[:, i : i + 1], causal=True, kv_cache=cache) for i in range(5, 9)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-5)
    assert cache.keys.shape == (2, 1, 9, 16) and cache.values.shape == (2, 1, 9, 8)


def test_the_cache_is_a_fraction_of_grouped_query_attentions() -> None:
    # DeepSeek-V3's sizes: 128 heads of 128 (+64 rotary) dims; a latent of 512.
    config = LatentAttentionConfig(
        7168, 128, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, q_lora_rank=1536
    )
    assert config.cached_numbers_per_token() == 576
    gqa_8_heads = 2 * 8 * 128  # the same width with 8 key/value heads of 128
    mha = 2 * 128 * 128
    assert mha // config.cached_numbers_per_token() == 56 and gqa_8_heads / 576 > 3.5


def test_yarn_mscale() -> None:
    assert yarn_mscale(1.0, 1.0) == 1.0
    assert yarn_mscale(40.0, 1.0) == pytest.approx(0.1 * torch.log(torch.tensor(40.0)).item() + 1)


def test_hook_points_and_replaced_latent() -> None:
    _, ours, _ = _pair(24, True)
    x = torch.randn(1, 5, 64)
    seen = {}

    def keep(name):
        def hook(t):
            seen[name] = t.shape

        return hook

    names = ("latent", "rotary_key", "q", "k", "v", "scores", "pattern", "z", "result")
    for name in names:
        getattr(ours, name).permanent = ((lambda t, p, name=name: keep(name)(t)),)
    with torch.no_grad():
        ours(x, causal=True)
    for name in names:
        getattr(ours, name).permanent = ()
    assert seen == {
        "latent": (1, 5, 16),
        "rotary_key": (1, 1, 5, 8),
        "q": (1, 4, 5, 24),
        "k": (1, 4, 5, 24),
        "v": (1, 4, 5, 12),
        "scores": (1, 4, 5, 5),
        "pattern": (1, 4, 5, 5),
        "z": (1, 4, 5, 12),
        "result": (1, 4, 5, 64),
    }
    ours.latent.permanent = ((lambda t, p: torch.zeros_like(t)),)
    with torch.no_grad():
        zeroed = ours(x, causal=True)
    ours.latent.permanent = ()
    assert not torch.allclose(zeroed, ours(x, causal=True))


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"qk_rope_head_dim": 7}, "must be even"),
        ({"kv_lora_rank": 0}, "kv_lora_rank must be >= 1"),
        ({"q_lora_rank": 0}, "q_lora_rank must be >= 1"),
        ({"scale": -1.0}, "scale must be a positive number"),
    ],
)
def test_config_refuses_bad_sizes(change, error) -> None:
    with pytest.raises(ValueError, match=error):
        LatentAttentionConfig(64, 4, **(SIZES | change))


def test_refuses_cross_attention() -> None:
    _, ours, _ = _pair(None, False)
    with pytest.raises(ValueError, match="self-attention"):
        ours(torch.randn(1, 3, 64), torch.randn(1, 3, 64))


def test_refuses_a_rotary_encoding_of_another_size() -> None:
    config = LatentAttentionConfig(64, 4, **SIZES)
    with pytest.raises(ValueError, match="qk_rope_head_dim 8"):
        MultiHeadLatentAttention(config, positional=RotaryEmbedding(16))
