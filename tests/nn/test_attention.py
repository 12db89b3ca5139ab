"""MultiHeadAttention: parity with torch.nn.MultiheadAttention, grouped-query heads,
positional encodings, the KV cache, head-count invariance and error messages."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from attnkit import masks
from attnkit.nn import (
    ALiBi,
    AttentionConfig,
    KVCache,
    MultiHeadAttention,
    MultiHeadOutput,
    RelativePositionBias,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    WeightSelection,
    mask_from_torch,
)
from tests.nn.helpers import assert_close, assert_grads_match, padding_blocked, random_blocked, torch_mha_grads
from tests.reference import causal_allowed, naive_attention

E, H = 16, 4


# ---------------------------------------------------------------------------------------
# Parity with torch.nn.MultiheadAttention, forward and gradients.
# ---------------------------------------------------------------------------------------

CASES = ["self", "cross", "kdim_vdim", "attn_mask", "float_mask", "key_padding", "both_masks", "no_bias"]


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("case", CASES)
def test_from_torch_matches_forward_and_gradients(case: str, batch_first: bool) -> None:
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    b, s_q = 3, 5
    kdim, vdim = (6, 10) if case == "kdim_vdim" else (E, E)
    ref = nn.MultiheadAttention(E, H, batch_first=batch_first, kdim=kdim, vdim=vdim, bias=case != "no_bias")
    ours = MultiHeadAttention.from_torch(ref)

    query = torch.randn(b, s_q, E, generator=g, requires_grad=True)
    if case == "self":
        key = value = query
    else:
        key = torch.randn(b, 7, kdim, generator=g, requires_grad=True)
        value = key if kdim == vdim else torch.randn(b, 7, vdim, generator=g, requires_grad=True)
    s_k = key.shape[1]
    attn_mask = key_padding_mask = None
    if case in ("attn_mask", "both_masks"):
        attn_mask = random_blocked(s_q, s_k, g)
    if case == "float_mask":
        attn_mask = torch.zeros(s_q, s_k).masked_fill(random_blocked(s_q, s_k, g), float("-inf"))
    if case in ("key_padding", "both_masks"):
        key_padding_mask = padding_blocked([s_k, 3, 1], s_k)

    def to_torch(t: torch.Tensor) -> torch.Tensor:
        return t if batch_first else t.transpose(0, 1)

    ref_out, ref_weights = ref(
        to_torch(query),
        to_torch(key),
        to_torch(value),
        attn_mask=attn_mask,
        key_padding_mask=key_padding_mask,
        need_weights=True,
        average_attn_weights=False,
    )
    ref_out = to_torch(ref_out)
    context = None if case == "self" else (key if key is value else (key, value))
    result = ours(query, context, mask=mask_from_torch(attn_mask, key_padding_mask), return_weights=True)
    assert isinstance(result, MultiHeadOutput)
    assert_close(result.output, ref_out)
    assert_close(result.weights, ref_weights)

    upstream = torch.randn(ref_out.shape, generator=g)
    inputs = [t for t in {id(t): t for t in (query, key, value)}.values()]
    ref_grads = torch.autograd.grad(ref_out, inputs, upstream, retain_graph=True)
    (ref_out * upstream).sum().backward(inputs=list(ref.parameters()))
    our_grads = torch.autograd.grad(result.output, inputs, upstream, retain_graph=True)
    (result.output * upstream).sum().backward(inputs=list(ours.parameters()))
    for ours_g, ref_g in zip(our_grads, ref_grads):
        assert_close(ours_g, ref_g)
    assert_grads_match(ours, torch_mha_grads(ref))


def test_from_torch_rejects_unsupported_options() -> None:
    with pytest.raises(ValueError, match="add_bias_kv"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(E, H, add_bias_kv=True))
    with pytest.raises(TypeError, match="MultiheadAttention"):
        MultiHeadAttention.from_torch(nn.Linear(E, E))


def test_mask_from_torch_conventions() -> None:
    blocked = torch.tensor([[False, True], [False, False]])
    assert torch.equal(mask_from_torch(blocked), ~blocked[None, None])
    as_float = torch.zeros(2, 2).masked_fill(blocked, float("-inf"))
    assert torch.equal(mask_from_torch(as_float), ~blocked[None, None])
    padding = torch.tensor([[False, True]])
    assert torch.equal(mask_from_torch(key_padding_mask=padding), torch.tensor([True, False]).view(1, 1, 1, 2))
    per_head = torch.zeros(2 * 3, 2, 2, dtype=torch.bool)
    assert mask_from_torch(per_head, num_heads=3).shape == (2, 3, 2, 2)
    assert mask_from_torch() is None
    with pytest.raises(ValueError, match="other than 0 and -inf"):
        mask_from_torch(torch.full((2, 2), 0.5))
    with pytest.raises(ValueError, match="num_heads"):
        mask_from_torch(per_head)
    with pytest.raises(TypeError, match="bool"):
        mask_from_torch(torch.zeros(2, 2, dtype=torch.long))


# ---------------------------------------------------------------------------------------
# Against the float64 reference: GQA, masks, scores.
# ---------------------------------------------------------------------------------------


def _reference_mha(m: MultiHeadAttention, x: torch.Tensor, context: torch.Tensor, **kwargs) -> tuple:
    """Project with the module's own weights, attend with the naive reference, merge."""
    b, s_q, _ = x.shape
    q = m.q_proj(x).view(b, s_q, m.num_heads, -1).transpose(1, 2)
    k = m.k_proj(context).view(b, context.shape[1], m.num_kv_heads, -1).transpose(1, 2)
    v = m.v_proj(context).view(b, context.shape[1], m.num_kv_heads, -1).transpose(1, 2)
    out, weights = naive_attention(q, k, v, **kwargs)
    merged = out.transpose(1, 2).reshape(b, s_q, -1).to(x.dtype)
    return m.out_proj(merged), weights


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_grouped_query_attention_matches_reference(num_kv_heads: int) -> None:
    torch.manual_seed(1)
    m = MultiHeadAttention(AttentionConfig(E, H, num_kv_heads=num_kv_heads))
    assert m.k_proj.out_features == num_kv_heads * (E // H)
    x = torch.randn(2, 6, E)
    result = m(x, causal=True, return_weights=True)
    expected, weights = _reference_mha(m, x, x, allowed=causal_allowed(6, 6))
    assert_close(result.output, expected)
    assert_close(result.weights.double(), weights)


def test_weights_rows_sum_to_one_and_fully_masked_rows_are_zero() -> None:
    torch.manual_seed(2)
    m = MultiHeadAttention(AttentionConfig(E, H))
    x = torch.randn(2, 4, E)
    allowed = torch.ones(2, 1, 4, 4, dtype=torch.bool)
    allowed[1, :, 2] = False  # query 2 of batch entry 1 may attend to nothing
    result = m(x, mask=allowed, return_weights=True)
    sums = result.weights.sum(-1)
    assert_close(sums[0], torch.ones_like(sums[0]))
    assert torch.all(result.weights[1, :, 2] == 0)
    assert torch.isfinite(result.output).all()
    # The query that saw nothing gets zero heads, so only the output bias remains.
    assert_close(result.output[1, 2], m.out_proj.bias)


def test_accepts_attnkit_masks() -> None:
    torch.manual_seed(3)
    m = MultiHeadAttention(AttentionConfig(E, H))
    x = torch.randn(2, 5, E)
    assert_close(m(x, mask=masks.causal()), m(x, causal=True))
    padded = m(x, mask=masks.padding([5, 3]))
    dense = m(x, mask=torch.tensor([[True] * 5, [True] * 3 + [False] * 2]).view(2, 1, 1, 5))
    assert_close(padded, dense)


# ---------------------------------------------------------------------------------------
# The seed's claim: H heads cost about as much as one.
# ---------------------------------------------------------------------------------------


def _forward_flops(m: MultiHeadAttention, x: torch.Tensor) -> int:
    # return_weights takes the path that materialises scores, which the counter sees;
    # it does not see inside the fused CPU SDPA kernel.
    with FlopCounterMode(display=False) as counter:
        m(x, return_weights=True)
    return counter.get_total_flops()


def test_one_and_eight_heads_have_equal_parameters_and_flops() -> None:
    e, b, s = 64, 2, 10
    x = torch.randn(b, s, e)
    one, eight = MultiHeadAttention(AttentionConfig(e, 1)), MultiHeadAttention(AttentionConfig(e, 8))
    n_params = [sum(p.numel() for p in m.parameters()) for m in (one, eight)]
    assert n_params[0] == n_params[1] == 4 * (e * e + e)
    projections = 4 * 2 * b * s * e * e
    for heads, m in ((1, one), (8, eight)):
        attention_flops = 4 * b * heads * s * s * (e // heads)  # DESIGN.md's formula
        assert _forward_flops(m, x) == projections + attention_flops
    assert _forward_flops(one, x) == _forward_flops(eight, x)


# ---------------------------------------------------------------------------------------
# Position: permutation equivariance without it, relative positions with it.
# ---------------------------------------------------------------------------------------


def test_self_attention_without_positional_encoding_is_permutation_equivariant() -> None:
    torch.manual_seed(4)
    m = MultiHeadAttention(AttentionConfig(E, H, num_kv_heads=2))
    x = torch.randn(2, 7, E)
    perm = torch.randperm(7)
    assert_close(m(x[:, perm]), m(x)[:, perm])


def test_rotary_attention_is_not_permutation_equivariant() -> None:
    torch.manual_seed(4)
    m = MultiHeadAttention(AttentionConfig(E, H), positional=RotaryEmbedding(E // H))
    x = torch.randn(2, 7, E)
    perm = torch.arange(6, -1, -1)
    assert not torch.allclose(m(x[:, perm]), m(x)[:, perm], atol=1e-4)


def test_rotary_attention_depends_only_on_relative_positions() -> None:
    torch.manual_seed(5)
    m = MultiHeadAttention(AttentionConfig(E, H), positional=RotaryEmbedding(E // H, theta=100.0))
    x = torch.randn(1, 6, E)
    shifted = m(x, positions=torch.arange(6) + 37, return_weights=True)
    plain = m(x, return_weights=True)
    assert_close(shifted.weights, plain.weights)
    assert_close(shifted.output, plain.output)


@pytest.mark.parametrize("make", [lambda: ALiBi(H), lambda: RelativePositionBias(H, num_buckets=8, max_distance=16)])
def test_bias_encodings_enter_the_scores(make) -> None:
    torch.manual_seed(6)
    positional = make()
    m = MultiHeadAttention(AttentionConfig(E, H), positional=positional)
    x = torch.randn(2, 5, E)
    result = m(x, causal=True, return_weights=True)
    b, s = 2, 5
    q = m.q_proj(x).view(b, s, H, -1).transpose(1, 2)
    k = m.k_proj(x).view(b, s, H, -1).transpose(1, 2)
    v = m.v_proj(x).view(b, s, H, -1).transpose(1, 2)
    out, weights = naive_attention(q, k, v, allowed=causal_allowed(s, s), bias=positional(s, s))
    assert_close(result.weights.double(), weights)
    assert_close(result.output, m.out_proj(out.transpose(1, 2).reshape(b, s, E).float()))


# ---------------------------------------------------------------------------------------
# KV cache: decoding step by step equals recomputing the whole sequence.
# ---------------------------------------------------------------------------------------

POSITIONALS = {
    "none": lambda: None,
    "rotary": lambda: RotaryEmbedding(E // H),
    "alibi": lambda: ALiBi(H),
    "t5": lambda: RelativePositionBias(H, num_buckets=8, max_distance=16, bidirectional=False),
}


@pytest.mark.parametrize("positional", sorted(POSITIONALS))
@pytest.mark.parametrize("num_kv_heads", [H, 2])
def test_cached_self_attention_equals_full_recomputation(positional: str, num_kv_heads: int) -> None:
    torch.manual_seed(7)
    m = MultiHeadAttention(AttentionConfig(E, H, num_kv_heads=num_kv_heads), positional=POSITIONALS[positional]())
    x = torch.randn(2, 9, E)
    full = m(x, causal=True, return_weights=True)
    cache = KVCache()
    steps = []
    for start, stop in ((0, 4), (4, 5), (5, 7), (7, 8), (8, 9)):  # a prefill, single steps and a chunk
        step = m(x[:, start:stop], causal=True, kv_cache=cache, return_weights=True)
        assert_close(step.weights, full.weights[:, :, start:stop, :stop])
        steps.append(step.output)
    assert len(cache) == 9 and cache.keys.shape == (2, num_kv_heads, 9, E // H)
    assert_close(torch.cat(steps, dim=1), full.output)


def test_cached_rotary_attention_with_per_row_positions() -> None:
    torch.manual_seed(8)
    m = MultiHeadAttention(AttentionConfig(E, H, num_kv_heads=2), positional=RotaryEmbedding(E // H))
    x = torch.randn(2, 5, E)
    positions = torch.tensor([[0, 1, 2, 3, 4], [3, 4, 5, 6, 7]])
    full = m(x, causal=True, positions=positions)
    cache = KVCache()
    first = m(x[:, :3], causal=True, positions=positions[:, :3], kv_cache=cache)
    rest = m(x[:, 3:], causal=True, positions=positions[:, 3:], kv_cache=cache)
    assert_close(torch.cat((first, rest), dim=1), full)


def test_cross_attention_cache_projects_the_context_once() -> None:
    torch.manual_seed(9)
    m = MultiHeadAttention(AttentionConfig(E, H))
    memory = torch.randn(2, 6, E)
    x = torch.randn(2, 3, E)
    calls = []
    m.k_proj.register_forward_hook(lambda *_: calls.append(1))
    cache = KVCache()
    outputs = [m(x[:, i : i + 1], memory, kv_cache=cache) for i in range(3)]
    assert len(calls) == 1 and len(cache) == 6
    assert_close(torch.cat(outputs, dim=1), m(x, memory))


def test_kv_cache_rejects_mismatched_appends() -> None:
    cache = KVCache()
    cache.append(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
    with pytest.raises(ValueError, match="do not fit the cached"):
        cache.append(torch.zeros(1, 3, 1, 4), torch.zeros(1, 3, 1, 4))
    with pytest.raises(ValueError, match="expected keys"):
        cache.append(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 2, 4))
    cache.reset()
    assert len(cache) == 0 and cache.keys is None


# ---------------------------------------------------------------------------------------
# Modules keep no state; the kernel option; errors.
# ---------------------------------------------------------------------------------------


def test_state_dict_holds_only_weights() -> None:
    m = MultiHeadAttention(AttentionConfig(E, H), positional=RotaryEmbedding(E // H))
    assert set(m.state_dict()) == {f"{p}_proj.{w}" for p in ("q", "k", "v", "out") for w in ("weight", "bias")}
    m(torch.randn(1, 3, E), return_weights=True)
    assert not any(isinstance(v, torch.Tensor) and v.dim() == 4 for v in vars(m).values())


def test_dropout_applies_only_in_training() -> None:
    torch.manual_seed(10)
    m = MultiHeadAttention(AttentionConfig(E, H, dropout=0.5))
    x = torch.randn(2, 5, E)
    m.eval()
    assert torch.equal(m(x), m(x))
    m.train()
    assert not torch.allclose(m(x), m(x))


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (
            lambda: MultiHeadAttention(AttentionConfig(10, 3)),
            ValueError,
            "embed_dim must be divisible by num_heads, got embed_dim=10 and num_heads=3",
        ),
        (
            lambda: MultiHeadAttention(AttentionConfig(12, 6, num_kv_heads=4)),
            ValueError,
            "num_heads must be divisible by num_kv_heads",
        ),
        (lambda: MultiHeadAttention(AttentionConfig(0, 1)), ValueError, "embed_dim must be >= 1"),
        (lambda: MultiHeadAttention(AttentionConfig(8.0, 2)), TypeError, "embed_dim must be an int"),
        (lambda: MultiHeadAttention(AttentionConfig(E, H, dropout=1.0)), ValueError, r"dropout must be in \[0, 1\)"),
        (
            lambda: MultiHeadAttention(AttentionConfig(E, H, kernel="flash")),
            ValueError,
            "unknown attention kernel 'flash'; expected one of",
        ),
        (lambda: MultiHeadAttention(AttentionConfig(E, H, score="cosine")), TypeError, "score must be"),
        (
            lambda: MultiHeadAttention(AttentionConfig(E, H), positional=SinusoidalPositionalEncoding(E)),
            TypeError,
            "added to the embeddings",
        ),
        (lambda: MultiHeadAttention(AttentionConfig(E, H), positional=ALiBi(8)), ValueError, "built for 8 heads"),
        (
            lambda: MultiHeadAttention(AttentionConfig(E, H), positional=RotaryEmbedding(8)),
            ValueError,
            "built for head_dim 8",
        ),
    ],
)
def test_constructor_errors(build, error, message) -> None:
    with pytest.raises(error, match=message):
        build()


def test_forward_errors() -> None:
    m = MultiHeadAttention(AttentionConfig(E, H))
    x = torch.randn(2, 5, E)
    with pytest.raises(ValueError, match=r"x must be \[b, s_q, e\] with e = 16, got \[2, 5, 8\]"):
        m(torch.randn(2, 5, 8))
    with pytest.raises(TypeError, match="floating-point"):
        m(torch.ones(2, 5, E, dtype=torch.long))
    with pytest.raises(ValueError, match=r"context key input must be \[b, s_k, 16\] with b = 2"):
        m(x, torch.randn(3, 4, E))
    with pytest.raises(ValueError, match="same length"):
        m(x, (torch.randn(2, 4, E), torch.randn(2, 3, E)))
    with pytest.raises(ValueError, match="does not broadcast"):
        m(x, mask=torch.ones(5, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="KVCache"):
        m(x, kv_cache={})
    cross = MultiHeadAttention(AttentionConfig(E, H, kdim=6, vdim=6))
    with pytest.raises(ValueError, match="self-attention needs kdim == vdim == embed_dim"):
        cross(x)
    rotary = MultiHeadAttention(AttentionConfig(E, H), positional=RotaryEmbedding(E // H))
    with pytest.raises(ValueError, match="self-attention only"):
        rotary(x, torch.randn(2, 4, E))
    with pytest.raises(ValueError, match=r"positions must be \[s\] or \[b, s\] with s = 5"):
        rotary(x, positions=torch.arange(4))
    with pytest.raises(ValueError, match="cannot move ALiBi"):
        MultiHeadAttention(AttentionConfig(E, H), positional=ALiBi(H))(x, positions=torch.arange(5))


def test_long_sequence_kernels_are_chosen_by_option():
    torch.manual_seed(0)
    x = torch.randn(2, 40, 32)
    dense = MultiHeadAttention(AttentionConfig(32, 4, num_kv_heads=2))
    for kernel, options, mask in [
        ("local", {"window": 5}, masks.sliding_window(5)),
        ("sparse", {"mask": masks.strided(4)}, masks.strided(4)),
        ("tiled", {}, None),
    ]:
        fast = MultiHeadAttention(AttentionConfig(32, 4, num_kv_heads=2, kernel=kernel, kernel_options=options))
        fast.load_state_dict(dense.state_dict())
        expected = dense(x, mask=mask, causal=True)
        torch.testing.assert_close(fast(x, causal=True), expected, atol=1e-5, rtol=0)
        assert kernel in repr(fast)
    linear = MultiHeadAttention(AttentionConfig(32, 4, kernel="linear", kernel_options={"feature_map": "elu"}))
    assert linear(x, causal=True).shape == (2, 40, 32)


def test_kernel_option_errors_are_clear():
    with pytest.raises(ValueError, match="without dropout; got score='dot', dropout=0.0"):
        MultiHeadAttention(AttentionConfig(32, 4, kernel="local", score="dot", kernel_options={"window": 2}))
    local = MultiHeadAttention(AttentionConfig(32, 4, kernel="local", kernel_options={"window": 2}))
    x = torch.randn(1, 8, 32)
    with pytest.raises(ValueError, match="does not return attention weights"):
        local(x, return_weights=True)
    with pytest.raises(ValueError, match="takes no mask or score bias"):
        local(x, mask=masks.causal())


def test_from_torch_keeps_float64_weights_exactly() -> None:
    # Built in the source's dtype: float64 weights are not rounded through float32.
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(8, 2, dtype=torch.float64)
    ours = MultiHeadAttention.from_torch(ref)
    assert ours.q_proj.weight.dtype == torch.float64
    assert torch.equal(ours.q_proj.weight, ref.in_proj_weight[:8])
    assert torch.equal(ours.v_proj.bias, ref.in_proj_bias[16:])
    assert torch.equal(ours.out_proj.weight, ref.out_proj.weight)
    separate = nn.MultiheadAttention(8, 2, kdim=4, vdim=6, dtype=torch.float64)
    assert torch.equal(MultiHeadAttention.from_torch(separate).k_proj.weight, separate.k_proj_weight)


def test_the_dispatcher_kernel_is_called_auto() -> None:
    from attnkit.functional import attention, get_kernel
    from attnkit.nn import KERNELS

    assert KERNELS["auto"] is attention and get_kernel("auto") is attention
    assert "dense" not in KERNELS
    with pytest.raises(ValueError, match="unknown attention kernel 'dense'"):
        MultiHeadAttention(AttentionConfig(E, H, kernel="dense"))


def test_kernel_options_are_checked_at_construction() -> None:
    with pytest.raises(TypeError, match="kernel 'sparse' needs the option"):
        MultiHeadAttention(AttentionConfig(32, 4, kernel="sparse"))
    with pytest.raises(TypeError, match="needs an attnkit.masks.Mask"):
        MultiHeadAttention(
            AttentionConfig(32, 4, kernel="sparse", kernel_options={"mask": torch.ones(4, 4, dtype=torch.bool)})
        )
    with pytest.raises(TypeError, match="kernel 'auto' takes no option 'window'; its options: "):
        MultiHeadAttention(AttentionConfig(32, 4, kernel_options={"window": 2}))
    with pytest.raises(ValueError, match="chunk_size must be an int >= 1"):
        MultiHeadAttention(AttentionConfig(32, 4, kernel="linear", kernel_options={"chunk_size": 0}))
    with pytest.raises(TypeError, match="feature_map must be"):
        MultiHeadAttention(AttentionConfig(32, 4, kernel="linear", kernel_options={"feature_map": "softmax"}))
    with pytest.raises(ValueError, match="block_size must be an int >= 1"):
        MultiHeadAttention(AttentionConfig(32, 4, kernel="tiled", kernel_options={"block_size": (64, 0)}))


def test_the_dispatcher_takes_its_options_from_the_module() -> None:
    torch.manual_seed(0)
    x = torch.randn(1, 6, E)
    default = MultiHeadAttention(AttentionConfig(E, H))
    reference = MultiHeadAttention(AttentionConfig(E, H, kernel_options={"engine": "reference"}))
    reference.load_state_dict(default.state_dict())
    assert_close(reference(x, causal=True), default(x, causal=True))
    with pytest.raises(ValueError, match="engine"):
        MultiHeadAttention(AttentionConfig(E, H, kernel_options={"engine": "warp"}))(x)


def test_a_weight_selection_forms_the_chosen_heads_and_rows_beside_the_fused_output() -> None:
    torch.manual_seed(0)
    for options in ({}, {"softcap": 5.0}, {"window": 4}, {"score": "dot", "scale": 0.3}):
        m = MultiHeadAttention(AttentionConfig(32, 4, num_kv_heads=2, **options)).eval()
        x = torch.randn(2, 10, 32)
        with torch.no_grad():
            plain = m(x, causal=True)
            full = m(x, causal=True, return_weights=True)
            chosen = m(x, causal=True, return_weights=WeightSelection(heads=(3, 1), rows=range(2, 7)))
        assert torch.equal(chosen.output, plain), options
        assert chosen.weights.shape == (2, 2, 5, 10) and chosen.weights.dtype == torch.float32
        torch.testing.assert_close(chosen.weights, full.weights[:, [3, 1], 2:7], rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match=r"heads must be in 0 .. 3 \(the module has 4\), got \[4\]"):
        m(x, return_weights=WeightSelection(heads=(4,)))
    with pytest.raises(ValueError, match=r"rows must lie in 0 .. 9 \(the call has 10 queries\)"):
        m(x, return_weights=WeightSelection(rows=range(8, 11)))
    with pytest.raises(ValueError, match="step 1"):
        WeightSelection(rows=range(0, 10, 2))
    with pytest.raises(TypeError, match="rows must be a range"):
        WeightSelection(rows=slice(0, 3))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="indices >= 0"):
        WeightSelection(heads=(-1,))


def test_a_fully_masked_row_of_a_selection_is_zeros() -> None:
    m = MultiHeadAttention(AttentionConfig(16, 2)).eval()
    x = torch.randn(1, 4, 16)
    mask = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    mask[..., 2, :] = False
    with torch.no_grad():
        chosen = m(x, mask=mask, return_weights=WeightSelection(heads=(1,), rows=range(1, 3)))
    assert torch.equal(chosen.weights[0, 0, 1], torch.zeros(4)) and not chosen.weights.isnan().any()
