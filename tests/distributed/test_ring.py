"""Ring attention on real gloo processes against single-process attention on the whole
sequence: outputs, log-sum-exp and the gradients of q, k and v.

Each test starts its ranks once and runs every case inside them (starting processes is the
slow part); a failing case fails the test with the case's name and its error."""

from __future__ import annotations

import math

import pytest
import torch

from attnkit import masks
from attnkit.distributed import shard_length, shard_positions, shard_ranges
from tests.distributed.processes import RanksFailed, run_ranks

# Several processes each (torchrun-style ranks): seconds per test, left out of make test-fast.
pytestmark = pytest.mark.slow

# float64 against the float64 reference; float32 against the float64 reference of the same
# (float32-rounded) inputs.
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}


def _document_ids(seq_len: int) -> torch.Tensor:
    """Documents of lengths 5, 9, 3, 5, 9, 3, ... laid end to end."""
    ids, doc = [], 0
    while len(ids) < seq_len:
        ids += [doc] * (5, 9, 3)[doc % 3]
        doc += 1
    return torch.tensor(ids[:seq_len])


def _cases(seq_len: int) -> list[dict]:
    """(name, options) of every checked configuration for one sequence length."""
    cases = []
    for layout in ("contiguous", "zigzag"):
        cases += [
            dict(name=f"no mask {layout}", layout=layout),
            dict(name=f"causal {layout}", layout=layout, causal=True),
            dict(name=f"sliding window {layout}", layout=layout, mask=masks.sliding_window(4)),
            dict(name=f"symmetric window {layout}", layout=layout, mask=masks.sliding_window(3, 3)),
            dict(name=f"document {layout}", layout=layout, mask=masks.document(_document_ids(seq_len))),
            dict(
                name=f"document causal {layout}",
                layout=layout,
                causal=True,
                mask=masks.document(_document_ids(seq_len)),
            ),
            dict(name=f"GQA causal {layout}", layout=layout, causal=True, heads=(4, 2)),
            dict(name=f"MQA window {layout}", layout=layout, mask=masks.sliding_window(6), heads=(3, 1)),
            # Query 0 may attend to nothing: zero output, lse -inf, zero gradient.
            dict(
                name=f"row with nothing allowed {layout}", layout=layout, causal=True, mask=~masks.sliding_window(0, 0)
            ),
            dict(name=f"float32 causal {layout}", layout=layout, causal=True, dtype=torch.float32),
            dict(
                name=f"float32 document GQA {layout}",
                layout=layout,
                heads=(4, 2),
                dtype=torch.float32,
                mask=masks.document(_document_ids(seq_len)),
            ),
        ]
    return cases


def _reference(q, k, v, dout, *, mask, causal):
    """Single-process float64 attention on the whole sequence: output, lse, grads."""
    import attnkit

    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    out = attnkit.attention(q, k, v, mask=mask, causal=causal)
    (out * dout.double()).sum().backward()
    g = q.shape[1] // k.shape[1]
    scores = (q @ k.repeat_interleave(g, 1).transpose(-1, -2)) / math.sqrt(q.shape[-1])  # [b, h, s, s]
    s = q.shape[2]
    allowed = torch.ones(s, s, dtype=torch.bool)
    if mask is not None:
        allowed = allowed & mask.to_dense(s, s)
    if causal:
        allowed = allowed & masks.causal().to_dense(s, s)
    lse = torch.logsumexp(scores.detach().masked_fill(~allowed, float("-inf")), -1)  # [b, h, s]
    return out.detach(), lse, q.grad, k.grad, v.grad


def _max_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    both_inf = torch.isinf(got) & torch.isinf(want) & (torch.sign(got) == torch.sign(want))
    diff = torch.where(both_inf, torch.zeros_like(got), (got - want).abs())
    return float(diff.max()) if diff.numel() else 0.0


def _check_ring_cases(rank: int, world: int, seq_lens: list[int]) -> None:
    from attnkit.distributed import RingTimings, ring_attention, shard

    failures = []
    for seq_len in seq_lens:
        for case in _cases(seq_len):
            name = f"{case['name']}, s={seq_len}, {world} ranks"
            dtype = case.get("dtype", torch.float64)
            h, h_kv = case.get("heads", (2, 2))
            layout = case["layout"]
            gen = torch.Generator().manual_seed(seq_len * 101 + len(name))
            q = torch.randn(2, h, seq_len, 8, generator=gen, dtype=torch.float64).to(dtype)
            k = torch.randn(2, h_kv, seq_len, 8, generator=gen, dtype=torch.float64).to(dtype)
            v = torch.randn(2, h_kv, seq_len, 6, generator=gen, dtype=torch.float64).to(dtype)
            dout = torch.randn(2, h, seq_len, 6, generator=gen, dtype=torch.float64).to(dtype)
            want = _reference(q, k, v, dout, mask=case.get("mask"), causal=case.get("causal", False))
            q_l, k_l, v_l = (shard(t, layout=layout).requires_grad_() for t in (q, k, v))
            timings = RingTimings()
            result = ring_attention(
                q_l,
                k_l,
                v_l,
                causal=case.get("causal", False),
                mask=case.get("mask"),
                layout=layout,
                return_lse=True,
                block_size=(4, 3),
                timings=timings,
            )
            (result.output * shard(dout, layout=layout)).sum().backward()
            got = (result.output, result.lse, q_l.grad, k_l.grad, v_l.grad)
            tolerance = TOLERANCE[dtype]
            for what, g, w in zip(("output", "lse", "dq", "dk", "dv"), got, want):
                err = _max_error(g, shard(w, layout=layout))
                if not err <= tolerance:
                    failures.append(f"{name}: {what} differs by {err:.3g} (tolerance {tolerance:g})")
            if result.output.dtype != dtype or result.lse.shape != q_l.shape[:3]:
                failures.append(f"{name}: output {result.output.dtype} lse {list(result.lse.shape)}")
            if timings.steps != world:
                failures.append(f"{name}: {timings.steps} ring steps, expected {world}")
            if name.startswith("causal contiguous") and rank == 0 and timings.skipped != world - 1:
                failures.append(f"{name}: rank 0 skipped {timings.skipped} steps, expected {world - 1}")
    if failures:
        raise AssertionError(f"rank {rank}: {len(failures)} failures:\n" + "\n".join(failures))


def _check_two_ranks(rank: int, world: int) -> None:
    # 23 and 30: lengths that 2 ranks (and 4 zigzag chunks) do not divide, and 12, that they do.
    _check_ring_cases(rank, world, [23, 12, 30])
    _check_gather_and_errors(rank, world)


@pytest.mark.timeout(240)
def test_ring_attention_two_ranks_matches_single_process_and_gather_inverts_shard():
    run_ranks(_check_two_ranks, 2, timeout=200)


@pytest.mark.timeout(240)
def test_ring_attention_three_ranks_matches_single_process():
    # 4 < 2 * 3 zigzag chunks: some chunks, and rank 2's whole zigzag shard, are empty.
    run_ranks(_check_ring_cases, 3, [25, 4], timeout=200)


def test_shard_layouts_cover_the_sequence_once():
    for seq_len in (0, 1, 5, 12, 23):
        for world in (1, 2, 3, 4):
            for layout in ("contiguous", "zigzag"):
                every = torch.cat([shard_positions(seq_len, r, world, layout) for r in range(world)])
                assert sorted(every.tolist()) == list(range(seq_len)), (seq_len, world, layout)
                lengths = [shard_length(seq_len, r, world, layout) for r in range(world)]
                assert max(lengths) - min(lengths) <= (1 if layout == "contiguous" else 2)
    # The remainder goes to the first ranks (contiguous) / the first chunks (zigzag).
    assert [shard_ranges(7, r, 3) for r in range(3)] == [[(0, 3)], [(3, 5)], [(5, 7)]]
    assert [shard_ranges(7, r, 2, "zigzag") for r in range(2)] == [[(0, 2), (6, 7)], [(2, 4), (4, 6)]]


def test_shard_layout_rejects_bad_arguments():
    with pytest.raises(ValueError, match="layout must be one of"):
        shard_ranges(8, 0, 2, "striped")
    with pytest.raises(ValueError, match="rank must be in"):
        shard_ranges(8, 2, 2)


def _check_gather_and_errors(rank: int, world: int) -> None:
    from attnkit.distributed import gather, ring_attention, shard

    for layout in ("contiguous", "zigzag"):
        for seq_len in (7, 10):
            x = torch.arange(2 * seq_len * 3, dtype=torch.float64).view(2, seq_len, 3).requires_grad_()
            local = shard(x, dim=1, layout=layout)
            assert local.shape[1] == shard_length(seq_len, rank, world, layout)
            whole = gather(local, dim=1, layout=layout)
            assert torch.equal(whole, x.detach()), (layout, seq_len)
            # Every rank's copy of the whole feeds the loss: the shard's gradient sums them.
            (whole * (rank + 1)).sum().backward()
            expected = torch.full_like(local, sum(r + 1 for r in range(world)))
            assert torch.equal(x.grad.index_select(1, shard_positions(seq_len, rank, world, layout)), expected)
    q = torch.zeros(1, 2, 3 + rank, 4, dtype=torch.float64)  # lengths 3, 4: not a contiguous cut
    try:
        ring_attention(q, q, q)
    except ValueError as err:
        assert "do not come from cutting a sequence" in str(err), err
    else:
        raise AssertionError("mismatched shard lengths were accepted")
    q = torch.zeros(1, 2, 3, 4)
    for call, message in (
        (lambda: ring_attention(q, q, q, mask=torch.ones(6, 6, dtype=torch.bool)), "must be an attnkit.masks.Mask"),
        (lambda: ring_attention(q, q, q, mask=masks.from_dense(torch.ones(6, 6, dtype=torch.bool))), "one size"),
        (lambda: ring_attention(q, q[:, :, :2], q), "same s_local"),
        (lambda: ring_attention(q, q[:, :1, :, :3], q[:, :1]), "same head dim"),
        (lambda: ring_attention(q, q, q, layout="striped"), "layout must be one of"),
    ):
        try:
            call()
        except (TypeError, ValueError) as err:
            assert message in str(err), (message, err)
        else:
            raise AssertionError(f"no error for {message!r}")


def _fail_on_rank_one(rank: int, world: int) -> None:
    import torch.distributed as dist

    if rank == 1:
        raise RuntimeError("rank one gives up")
    dist.barrier()  # rank 0 would wait here for ever without the harness


@pytest.mark.timeout(60)
def test_a_failing_rank_fails_the_run_quickly_with_its_error():
    with pytest.raises(RanksFailed, match="rank one gives up") as failure:
        run_ranks(_fail_on_rank_one, 2, timeout=45)
    assert str(failure.value).startswith("rank 1 of 2 failed")  # the cause, before its effects


def _hang_on_rank_zero(rank: int, world: int) -> None:
    import time

    if rank == 0:
        time.sleep(600)


@pytest.mark.timeout(60)
def test_a_hanging_rank_is_killed_at_the_time_limit():
    with pytest.raises(RanksFailed, match="did not finish within 8 s"):
        run_ranks(_hang_on_rank_zero, 2, timeout=8)


def test_ring_attention_needs_an_initialised_process_group():
    from attnkit.distributed import ring_attention

    q = torch.zeros(1, 1, 2, 4)
    with pytest.raises(RuntimeError, match="torchrun"):
        ring_attention(q, q, q)
