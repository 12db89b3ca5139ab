"""RMSNorm, FeedForward and make_norm against their formulas and reference implementations."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnkit.nn import FeedForward, RMSNorm, RotaryEmbedding, make_norm
from tests.nn.helpers import assert_close


def test_rms_norm_matches_formula_and_torch() -> None:
    torch.manual_seed(0)
    norm = RMSNorm(8, eps=1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 3, 8)
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    assert_close(norm(x), expected)
    reference = nn.RMSNorm(8, eps=1e-6)
    reference.load_state_dict(norm.state_dict())
    assert_close(norm(x), reference(x))


def test_rms_norm_computes_its_statistic_in_float32() -> None:
    x = torch.full((1, 4), 300.0, dtype=torch.float16)  # 300² overflows float16
    out = RMSNorm(4).half()(x)
    assert out.dtype == torch.float16
    assert torch.isfinite(out).all()
    assert_close(out.float(), torch.ones(1, 4))


@pytest.mark.parametrize("plus_one", [False, True])
@pytest.mark.parametrize("scale_hooked", [False, True])
def test_rms_norm_keeps_float64_inputs_in_float64(plus_one: bool, scale_hooked: bool) -> None:
    torch.manual_seed(0)
    norm = RMSNorm(8, eps=1e-6, plus_one=plus_one).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 3, 8, dtype=torch.float64) * 1e3 + 1.0 / 3.0
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + norm.weight if plus_one else norm.weight)
    if scale_hooked:  # a hook on the scale: the statistic is formed apart and divided by
        norm.scale.permanent = (lambda scale, hook: scale * 1,)
    out = norm(x)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, expected, rtol=1e-13, atol=0)


def test_make_norm() -> None:
    assert isinstance(make_norm("layer", 4, 1e-12), nn.LayerNorm)
    assert make_norm("layer", 4, 1e-12).eps == 1e-12
    assert make_norm("layer", 4, 1e-5, bias=False).bias is None
    assert isinstance(make_norm("rms", 4, 1e-5), RMSNorm)
    with pytest.raises(ValueError, match="norm must be one of"):
        make_norm("batch", 4, 1e-5)


@pytest.mark.parametrize("activation", ["relu", "gelu", "swiglu"])
def test_feed_forward_formulas(activation: str) -> None:
    torch.manual_seed(1)
    ff = FeedForward(8, 12, activation=activation)
    x = torch.randn(2, 3, 8)
    up = x @ ff.up_proj.weight.T + ff.up_proj.bias
    if activation == "relu":
        hidden = up.clamp(min=0)
    elif activation == "gelu":
        hidden = 0.5 * up * (1 + torch.erf(up / 2**0.5))
    else:
        gate = x @ ff.gate_proj.weight.T + ff.gate_proj.bias
        hidden = gate * torch.sigmoid(gate) * up
    expected = hidden @ ff.down_proj.weight.T + ff.down_proj.bias
    assert_close(ff(x), expected)
    n_matrices = 3 if activation == "swiglu" else 2
    assert sum(p.dim() == 2 for p in ff.parameters()) == n_matrices


def test_feed_forward_errors() -> None:
    with pytest.raises(ValueError, match="activation must be one of"):
        FeedForward(4, 8, activation="tanh")
    with pytest.raises(ValueError, match="dropout"):
        FeedForward(4, 8, dropout=1.5)
    assert FeedForward(4, 8, bias=False).up_proj.bias is None


def test_llama_blocks_match_hugging_face() -> None:
    """RoPE (half-split, θ = 1e5) and RMSNorm as SmolLM2's checkpoints expect them."""
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    from transformers import LlamaConfig

    torch.manual_seed(2)
    config = LlamaConfig(
        hidden_size=576, num_attention_heads=9, num_key_value_heads=3, rope_theta=1e5, rms_norm_eps=1e-5
    )
    hf_rope = llama.LlamaRotaryEmbedding(config)
    q, k = torch.randn(2, 9, 7, 64), torch.randn(2, 3, 7, 64)
    positions = torch.arange(3, 10).expand(2, 7)
    cos, sin = hf_rope(q, positions)
    hf_q, hf_k = llama.apply_rotary_pos_emb(q, k, cos, sin)
    rope = RotaryEmbedding(64, theta=1e5)
    assert torch.equal(rope.rotate(q, positions), hf_q)
    assert torch.equal(rope.rotate(k, positions), hf_k)

    hf_norm = llama.LlamaRMSNorm(576, eps=1e-5)
    with torch.no_grad():
        hf_norm.weight.uniform_(0.5, 1.5)
    norm = RMSNorm(576, eps=1e-5)
    norm.load_state_dict(hf_norm.state_dict())
    x32 = torch.randn(2, 7, 576) * 3
    assert torch.equal(norm(x32), hf_norm(x32))  # float32: torch's fused kernel, bit for bit
    x = torch.randn(2, 7, 576, dtype=torch.bfloat16)
    assert torch.equal(norm.to(torch.bfloat16)(x), hf_norm.to(torch.bfloat16)(x))
