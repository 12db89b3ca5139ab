"""The engines agree: every built-in mask runs inside compiled FlexAttention with the same
bits as eager evaluation, and forcing an engine gives the same result as the others.

Compiling FlexAttention on the CPU takes 10-30 s per mask and shape, so the Flex tests share
shapes and masks, and the first one covers every built-in mask with a single compiled
kernel: head ``i`` of the call attends under mask ``i``.
"""

from __future__ import annotations

import sys
from functools import partial

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import attnkit
from attnkit import masks
from attnkit.functional import flex
from attnkit.functional.engines import choose_attention_engine
from attnkit.functional.sparse import strided_pattern
from tests.functional.dense_reference import dense_attention

B, S = 2, 200  # not a multiple of Flex's 128-token blocks


def _builtin_masks() -> dict[str, masks.Mask]:
    dense = torch.rand(S, S, generator=torch.Generator().manual_seed(0)) < 0.3
    ids = torch.tensor([0] * 50 + [1] * 90 + [2] * 60)
    hf = torch.ones(B, S, dtype=torch.long)
    hf[1, 150:] = 0
    blocked = torch.triu(torch.ones(S, S, dtype=torch.bool), 1)
    return {
        "full": masks.full(),
        "causal": masks.causal(),
        "sliding_window": masks.sliding_window(5),
        "sliding_window_both": masks.sliding_window(3, 2),
        "sliding_window_huge": masks.sliding_window(sys.maxsize, sys.maxsize),
        "padding": masks.padding([40, 157]),
        "strided": masks.strided(4),
        "fixed": masks.fixed(8, 2),
        "random": masks.random(0.3, seed=2),
        "global_tokens": masks.global_tokens([0, 17, 130]),
        "document": masks.document(ids),
        "document_per_batch": masks.document(torch.stack([ids, ids.flip(0)])),
        "from_dense": masks.from_dense(dense),
        "from_hf_padding": masks.from_hf_padding(hf),
        "from_torch_mha": masks.from_torch_mha(blocked),
        "composed": (masks.causal() & masks.sliding_window(7)) | masks.global_tokens([3]),
        "inverted": ~masks.strided(3) & masks.causal(),
        "strided_pattern": strided_pattern(16) & masks.causal(),
    }


# Ops that a mask function inlined into a GPU FlexAttention kernel may not use: creating,
# moving or reducing tensors ("Buffers cannot be created while lowering a pointwise subgraph").
_NOT_POINTWISE = (
    "zeros",
    "ones",
    "full",
    "empty",
    "arange",
    "_to_copy",
    "to.",
    "any",
    "all",
    "sum",
    "amax",
    "isin",
    "scalar_tensor",
)


@pytest.mark.parametrize("name", sorted(_builtin_masks()))
def test_every_builtin_mask_is_pointwise(name):
    mask = _builtin_masks()[name]
    idx = [
        torch.arange(n, dtype=torch.int32).view(shape)
        for n, shape in ((B, (B, 1, 1, 1)), (3, (1, 3, 1, 1)), (S, (1, 1, S, 1)), (S, (1, 1, 1, S)))
    ]
    graph = make_fx(mask.fn)(*idx).graph
    ops = [str(node.target) for node in graph.nodes if node.op == "call_function"]
    offending = [op for op in ops if any(bad in op.split("aten.")[-1] for bad in _NOT_POINTWISE)]
    assert not offending, f"mask {mask.name} is not pointwise: {offending}"


@pytest.mark.slow
def test_every_builtin_mask_gives_the_same_bits_inside_compiled_flex():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    named = _builtin_masks()
    fns = [m.fn for m in named.values()]

    def by_head(b, h, q_idx, kv_idx):
        allowed = fns[0](b, h, q_idx, kv_idx)
        for i, fn in enumerate(fns[1:], start=1):
            allowed = torch.where(h == i, fn(b, h, q_idx, kv_idx), allowed)
        return allowed

    h = len(fns)
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, h, S, 16, generator=gen) for _ in range(3))
    block_mask = create_block_mask(by_head, B, h, S, S, device="cpu", BLOCK_SIZE=flex.BLOCK)
    out = torch.compile(flex_attention, dynamic=False)(q, k, v, block_mask=block_mask)
    for i, (name, mask) in enumerate(named.items()):
        allowed = mask.to_dense(S, S, batch_size=B)  # [B, 1, S, S]
        expected = dense_attention(q[:, i : i + 1], k[:, i : i + 1], v[:, i : i + 1], allowed=allowed)[0]
        err = (out[:, i : i + 1].double() - expected).abs().max().item()
        assert err < 1e-5, f"{name}: compiled Flex differs from the eager mask by {err}"


@pytest.mark.slow
def test_random_mask_bits_do_not_depend_on_the_index_dtype():
    # Compiled GPU kernels pass int32 indices: the hash must stay inside 32-bit range.
    mask = masks.random(0.05, seed=9)
    q64 = torch.arange(0, 70000, 7, dtype=torch.int64).view(-1, 1)
    kv64 = torch.arange(0, 70000, 11, dtype=torch.int64).view(1, -1)
    bits64 = mask.fn(None, None, q64, kv64)
    bits32 = mask.fn(None, None, q64.to(torch.int32), kv64.to(torch.int32))
    assert torch.equal(bits64, bits32)
    assert 0.04 < bits64.float().mean().item() < 0.06


def _qkv(h=4, h_kv=2, s_q=S, s_k=S, d=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(B, n, s, d, generator=gen) for n, s in ((h, s_q), (h_kv, s_k), (h_kv, s_k)))


@pytest.mark.slow
def test_forced_engines_agree_for_a_mask_with_gqa_and_fewer_queries_than_keys():
    q, k, v = _qkv(s_q=150)
    window = masks.sliding_window(37)  # causal local attention, the same mask local_attention uses
    outs = {e: attnkit.attention(q, k, v, mask=window, engine=e) for e in ("flex", "blockwise", "reference", "sdpa")}
    local = attnkit.local_attention(q, k, v, window=37, causal=True, engine="flex")
    for engine, out in {**outs, "local flex": local}.items():
        assert (out - outs["reference"]).abs().max().item() < 1e-5, engine


@pytest.mark.slow
def test_flex_with_a_bias_and_rows_with_nothing_allowed():
    q, k, v = _qkv()
    bias = torch.randn(1, 4, S, S, generator=torch.Generator().manual_seed(3))
    mask = masks.padding([0, 150]) & masks.causal()  # batch entry 0 attends to nothing
    got = attnkit.tiled_attention(q, k, v, mask=mask, bias=bias, engine="flex")
    want = attnkit.tiled_attention(q, k, v, mask=mask, bias=bias, engine="blockwise")
    assert (got - want).abs().max().item() < 1e-5
    assert torch.equal(got[0], torch.zeros_like(got[0]))


@pytest.mark.slow
def test_sparse_attention_on_flex_uses_the_permuted_layout():
    q, k, v = _qkv(s_q=256, s_k=256)
    pattern = strided_pattern(16)
    got = attnkit.sparse_attention(q, k, v, mask=pattern, causal=True, permute=16, engine="flex")
    want = attnkit.sparse_attention(q, k, v, mask=pattern, causal=True, permute=16, engine="blockwise")
    assert (got - want).abs().max().item() < 1e-5


@pytest.mark.slow
def test_many_different_masks_stay_compiled(monkeypatch):
    # torch.compile keeps 8 versions of a function by default and then falls back, silently,
    # to eager FlexAttention. Twelve masks in a row must all be compiled (a graph each);
    # dynamo's tracing is what is tested, so the "eager" backend stands in for inductor.
    from torch._dynamo.utils import counters
    from torch.nn.attention.flex_attention import flex_attention

    monkeypatch.setattr(flex, "_compiled", torch.compile(flex_attention, backend="eager", dynamic=False))
    q, k, v = _qkv(h=2, h_kv=2, s_q=64, s_k=64)
    before = counters["stats"]["unique_graphs"]
    for w in range(12):
        attnkit.attention(q, k, v, mask=masks.sliding_window(w + 1), engine="flex")
    assert counters["stats"]["unique_graphs"] - before == 12


def test_a_rebuilt_mask_reuses_its_block_mask():
    q, k, v = _qkv(h=2, h_kv=2, s_q=64, s_k=64)
    first = flex.cached_block_mask(masks.causal() & masks.sliding_window(9), B, 2, 64, 64, q.device, None, None, 0)
    again = flex.cached_block_mask(masks.causal() & masks.sliding_window(9), B, 2, 64, 64, q.device, None, None, 0)
    other = flex.cached_block_mask(masks.causal() & masks.sliding_window(10), B, 2, 64, 64, q.device, None, None, 0)
    assert again is first and other is not first


def test_engine_errors_say_what_was_asked():
    q, k, v = _qkv(h=2, h_kv=2, s_q=32, s_k=32)
    with pytest.raises(ValueError, match=r"engine must be one of .* got 'cuda'"):
        attnkit.attention(q, k, v, causal=True, engine="cuda")
    with pytest.raises(
        ValueError, match=r"local_attention runs on the engines \['auto', 'flex', 'blockwise'\], got engine='sdpa'"
    ):
        attnkit.local_attention(q, k, v, window=3, engine="sdpa")
    with pytest.raises(ValueError, match=r"engine='flex' cannot return weights"):
        attnkit.attention(q, k, v, causal=True, return_weights=True, engine="flex")
    with pytest.raises(ValueError, match=r"cannot return the log-sum-exp on the CPU"):
        attnkit.tiled_attention(q, k, v, causal=True, return_lse=True, engine="flex")
    with pytest.raises(ValueError, match=r"no backward on the CPU"):
        attnkit.attention(q.requires_grad_(), k, v, mask=masks.causal(), engine="flex")


def test_auto_keeps_the_cpu_on_the_blockwise_engine(monkeypatch):
    calls = []
    monkeypatch.setattr(flex, "_call", lambda *a, **kw: calls.append(1))
    q, k, v = _qkv(h=2, h_kv=2, s_q=32, s_k=32)
    attnkit.attention(q, k, v, mask=masks.sliding_window(3))
    attnkit.local_attention(q, k, v, window=3)
    assert calls == []


def test_auto_sends_a_bias_without_a_mask_to_sdpa_on_the_cpu():
    q, k, v = _qkv(h=2, h_kv=2, s_q=32, s_k=32)
    bias = torch.randn(1, 2, 32, 32)
    choose = partial(choose_attention_engine, "auto", q, v, sdpa_serves=False, needs_reference=False, bias=bias)
    assert choose(bias_alone=True) == "sdpa"  # T5's relative positions, ALiBi: read as they are
    assert choose(bias_alone=False) == "blockwise"  # with a mask, blocks skip what it leaves empty
    got = attnkit.attention(q, k, v, bias=bias)
    assert (got - attnkit.attention(q, k, v, bias=bias, engine="reference")).abs().max().item() < 1e-5
