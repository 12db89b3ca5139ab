"""Ring attention on real gloo processes when the inputs hold NaN (it must reach the output
as in single-process attention, never vanish into finite numbers) and when the ranks
disagree on a shape, a dtype or an option (the same ValueError on every rank, quickly,
instead of a wrong result, an abort in the transport or a hang)."""

from __future__ import annotations

import pytest
import torch

from tests.distributed.processes import run_ranks

# Several processes each (torchrun-style ranks): seconds per test, left out of make test-fast.
pytestmark = pytest.mark.slow

NAN = float("nan")


def _nan_cases() -> list[tuple[str, dict, str, tuple]]:
    """(name, options, which input gets a NaN, where) for 16 positions, 2 heads."""
    cases = []
    for layout in ("contiguous", "zigzag"):
        for d_v in (8, 6):  # d == d_v: the fused CPU kernel; d != d_v: the eager one
            for causal in (False, True):
                options = dict(layout=layout, causal=causal, d_v=d_v)
                tag = f"{layout} d_v={d_v} causal={causal}"
                cases += [
                    (f"NaN key {tag}", options, "k", (0, 0, 12, 0)),
                    (f"NaN key at position 0 {tag}", options, "k", (0, 1, 0, 3)),
                    (f"NaN query {tag}", options, "q", (0, 1, 3, 2)),
                    (f"NaN value {tag}", options, "v", (0, 0, 5, 1)),
                ]
    return cases


def _check_nan_propagates(rank: int, world: int) -> None:
    import attnkit
    from attnkit.distributed import ring_attention, shard

    failures = []
    for name, options, which, where in _nan_cases():
        gen = torch.Generator().manual_seed(len(name))
        inputs = {
            "q": torch.randn(1, 2, 16, 8, generator=gen, dtype=torch.float64),
            "k": torch.randn(1, 2, 16, 8, generator=gen, dtype=torch.float64),
            "v": torch.randn(1, 2, 16, options["d_v"], generator=gen, dtype=torch.float64),
        }
        inputs[which][where] = NAN
        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        want = attnkit.attention(q, k, v, causal=options["causal"], engine="reference")
        layout = options["layout"]
        got = ring_attention(
            *(shard(t, layout=layout) for t in (q, k, v)), causal=options["causal"], layout=layout, block_size=(4, 3)
        )
        want = shard(want, layout=layout)
        # A row is NaN when its query holds one or it may attend to a key holding one. A NaN
        # value reaches the rows that may attend to it, and may reach others whose weight on
        # it is 0 (the reference spreads it so: 0 * NaN), in the column it is in.
        allowed = torch.ones(16, 16, dtype=torch.bool)
        if options["causal"]:
            allowed = allowed.tril()
        kv_nan = k.isnan().any(-1) | v.isnan().any(-1)  # [b, h, s]
        meets = (q.isnan().any(-1).unsqueeze(-1) | kv_nan.unsqueeze(-2)) & allowed  # [b, h, s, s]
        must_nan = shard(meets.any(-1), dim=2, layout=layout)  # [b, h, s_local]
        got_nan = got.isnan().any(-1)
        exact = which != "v"
        if (exact and not torch.equal(got_nan, must_nan)) or not bool(got_nan[must_nan].all()):
            failures.append(f"{name}: NaN rows {got_nan.nonzero().tolist()}, expected {must_nan.nonzero().tolist()}")
        elif bool((got.isnan() & ~want.isnan()).any()):
            failures.append(f"{name}: NaN rows {got_nan.nonzero().tolist()} where attention gives numbers")
        elif not torch.allclose(got[~want.isnan()], want[~want.isnan()], atol=1e-10):
            failures.append(f"{name}: finite entries differ from single-process attention")
    if failures:
        raise AssertionError(f"rank {rank}: {len(failures)} failures:\n" + "\n".join(failures))


@pytest.mark.timeout(120)
def test_ring_attention_propagates_nan_as_single_process_attention_does():
    # Before: a NaN key dropped its shard's contribution (finite, wrong rows), a NaN query
    # row came back as zeros.
    run_ranks(_check_nan_propagates, 2, timeout=100)


def _mismatches(rank: int) -> list[tuple[str, dict, str]]:
    """(name, this rank's arguments, the message every rank must raise)."""
    other = rank == 1
    shape = dict(b=1, h=2, h_kv=2, s=8, d=8, d_v=8)
    return [
        ("causal", dict(causal=other), "needs the same causal on every rank, got False on rank 0 and True on rank 1"),
        (
            "layout",
            dict(layout="zigzag" if other else "contiguous"),
            "needs the same layout on every rank, got 'contiguous' on rank 0 and 'zigzag' on rank 1",
        ),
        ("head dim", dict(shape={**shape, "d": 4 if other else 8}), "same head dim on every rank, got 8 on rank 0"),
        ("value dim", dict(shape={**shape, "d_v": 6 if other else 8}), "same value head dim on every rank"),
        ("batch", dict(shape={**shape, "b": 1 + rank}), "same batch size on every rank, got 1 on rank 0 and 2"),
        ("heads", dict(shape={**shape, "h": 2 + 2 * rank}), "same number of query heads on every rank"),
        ("GQA", dict(shape={**shape, "h_kv": 2 - rank}), "same number of key/value heads on every rank"),
        (
            "dtype",
            dict(dtype=torch.float32 if other else torch.float64),
            "same dtype on every rank, got torch.float64 on rank 0 and torch.float32 on rank 1",
        ),
        ("mask", dict(window=3 + rank), "needs the same mask on every rank; ranks 0 and 1 differ"),
        ("scale", dict(scale=0.5 if other else None), "same scale on every rank, got the default on rank 0 and 0.5"),
        ("gradients", dict(grad=other), "same need for gradients"),
        ("shard lengths", dict(shape={**shape, "s": 8 + rank}), "do not come from cutting a sequence"),
        # A rank whose own arguments are refused still tells the others, who stop too.
        ("refused on one rank", dict(layout="striped" if other else "contiguous"), "rank 1 refused its arguments"),
    ]


def _check_mismatches_raise_alike(rank: int, world: int) -> None:
    import torch.distributed as dist

    from attnkit import masks
    from attnkit.distributed import ring_attention

    failures = []
    for name, args, message in _mismatches(rank):
        shape = args.get("shape", dict(b=1, h=2, h_kv=2, s=8, d=8, d_v=8))
        dtype = args.get("dtype", torch.float64)
        q = torch.randn(shape["b"], shape["h"], shape["s"], shape["d"], dtype=dtype)
        k = torch.randn(shape["b"], shape["h_kv"], shape["s"], shape["d"], dtype=dtype)
        v = torch.randn(shape["b"], shape["h_kv"], shape["s"], shape["d_v"], dtype=dtype)
        q.requires_grad_(args.get("grad", False))
        window = args.get("window")
        try:
            ring_attention(
                q,
                k,
                v,
                causal=args.get("causal", False),
                layout=args.get("layout", "contiguous"),
                mask=None if window is None else masks.sliding_window(window),
                scale=args.get("scale"),
            )
            got = "no error"
        except (TypeError, ValueError) as err:
            got = str(err)
        every: list = [None] * world
        dist.all_gather_object(every, got)
        if name == "refused on one rank":  # the refusing rank raises its own error
            if "layout must be one of" not in every[1] or message not in every[0]:
                failures.append(f"{name}: {every}")
        elif any(m != every[0] for m in every) or message not in every[0]:
            failures.append(f"{name}: expected {message!r} alike on every rank, got {every}")
    # The ranks are still in step: a call that agrees runs.
    q = torch.randn(1, 2, 8, 8, dtype=torch.float64)
    assert ring_attention(q, q, q).shape == q.shape
    if failures:
        raise AssertionError(f"rank {rank}: {len(failures)} failures:\n" + "\n".join(failures))


@pytest.mark.timeout(90)
def test_ranks_that_disagree_raise_the_same_error_on_every_rank():
    # Before: a differing option gave a wrong result on both ranks, a differing shape or
    # dtype aborted one rank in gloo and reset the other's connection.
    run_ranks(_check_mismatches_raise_alike, 2, timeout=60, collective_timeout=20)
