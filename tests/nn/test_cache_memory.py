"""Memory for large cached activations (attnkit.nn.cache_memory): a tensor like
torch.empty's, and cached scores, patterns and results written into it are those of a
pass without it, bit for bit."""

from __future__ import annotations

import torch

from attnkit.functional.pattern import attention_pattern
from attnkit.nn import cache_memory
from attnkit.nn.cache_memory import MIN_BYTES, empty_large


def test_empty_large_is_a_writable_contiguous_tensor_of_the_shape_asked() -> None:
    rows = MIN_BYTES // (4 * 1000) + 1  # over the size that is populated
    t = empty_large((2, rows, 1000), torch.float32, torch.device("cpu"))
    assert t.shape == (2, rows, 1000) and t.dtype == torch.float32 and t.is_contiguous()
    t.fill_(3.0)
    assert t.sum().item() == 3.0 * t.numel()
    small = empty_large((3, 4), torch.float64, torch.device("cpu"))
    assert small.shape == (3, 4) and small.dtype == torch.float64


def test_a_kernel_that_refuses_the_advice_leaves_torch_empty(monkeypatch) -> None:
    monkeypatch.setattr(cache_memory, "_madvise", lambda: lambda address, length, advice: -1)
    monkeypatch.setattr(cache_memory._state, "populate", True)
    t = empty_large((MIN_BYTES // 4 + 8,), torch.float32, torch.device("cpu"))
    assert t.numel() == MIN_BYTES // 4 + 8 and not cache_memory._state.populate


def test_pattern_written_into_allocated_memory_equals_the_plain_one_bit_for_bit() -> None:
    torch.manual_seed(0)
    q, k = torch.randn(1, 6, 512, 32), torch.randn(1, 2, 512, 32)  # GQA, 6 MiB of scores
    seen: dict[str, list[torch.Tensor]] = {"plain": [], "allocated": []}
    plain, _ = attention_pattern(
        q, k, mask=None, causal=True, scale=0.2, edit_scores=lambda s: seen["plain"].append(s) or s
    )
    allocated, _ = attention_pattern(
        q,
        k,
        mask=None,
        causal=True,
        scale=0.2,
        edit_scores=lambda s: seen["allocated"].append(s) or s,
        allocate=empty_large,
    )
    assert torch.equal(allocated, plain) and torch.equal(seen["allocated"][0], seen["plain"][0])
    unmasked, _ = attention_pattern(q, k, mask=None, causal=False, scale=0.2)
    assert torch.equal(attention_pattern(q, k, mask=None, causal=False, scale=0.2, allocate=empty_large)[0], unmasked)
