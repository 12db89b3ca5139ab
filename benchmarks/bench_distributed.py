"""Ring attention across processes on one machine: time, peak memory per rank and the share
of time spent waiting on communication, for 1, 2 and 4 ranks (gloo, one thread per rank).

Run: ``python benchmarks/bench_distributed.py`` (about 20 minutes on 2 busy cores), or
``--lengths 16384 --ranks 1 2`` for a quick look. ``--check`` instead runs a small
correctness check against single-process attention on the devices present (NCCL and one
GPU per rank when CUDA is available, else gloo on the CPU) and prints what ran.

Every cell starts fresh processes (one per rank) that create only their own shards of q, k
and v (causal, b=1, float32, d=64). Memory per rank is the growth of the process's peak
resident set (``VmHWM``, reset through ``/proc/self/clear_refs``) from just before its
inputs are allocated to the end of the call: the shards of q, k, v, the output, the
key/value buffers in transit and the kernel's working memory; ``malloc`` is told to return
every block of 128 KiB or more to the system when freed. Time is the slowest rank's wall
time of one forward call after a barrier. Wait share is the part of that time ranks spent
blocked on transfers that the compute did not hide (mean over ranks).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import benchmark_parser  # noqa: E402


def arguments() -> argparse.ArgumentParser:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--lengths", type=int, nargs="+", default=[16384, 32768, 65536, 131072])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument(
        "--layout-length",
        type=int,
        default=32768,
        help="sequence length of the zigzag-against-contiguous comparison (0: skip)",
    )
    parser.add_argument("--layout-rounds", type=int, default=3)
    parser.add_argument("--skip-memory", action="store_true", help="skip the memory comparison at s=65536")
    parser.add_argument(
        "--only", choices=["layouts", "memory"], help="measure only this comparison and replace it in the saved results"
    )
    parser.add_argument("--check", action="store_true", help="run the correctness check and print what ran")
    parser.add_argument("--check-ranks", type=int, default=1, help="ranks of --check (one GPU each under NCCL)")
    return parser


if __name__ == "__main__":
    # --help and a mistyped option end here, before PyTorch is imported or a model touched.
    arguments().parse_args()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from benchmarks.common import RESULTS, markdown_table, write_results  # noqa: E402

HEAD_DIM = 64
# The sweep: one head (time grows with heads; memory ratios depend only on the grouping).
SWEEP_HEADS = (1, 1)
# Memory at the acceptance length, by query heads per key/value head: none, 2, 4.
MEMORY_HEADS = ((1, 1), (2, 1), (4, 1))
ACCEPTANCE_LENGTH = 65536


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _cell_rank(rank: int, world: int, store_file: str, result_dir: str, cell: dict) -> None:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD: fixed, so big frees go back to the OS
    libc.mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store_file}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=1800),
    )
    import attnkit
    from attnkit.distributed import RingTimings, ring_attention, shard_length

    seq_len, h, h_kv, layout = cell["seq_len"], cell["heads"], cell["kv_heads"], cell["layout"]
    timings = RingTimings()

    def call(q, k, v, timings=None):
        if cell["kernel"] == "attention":  # the single-process entry point, for comparison
            return attnkit.attention(q, k, v, causal=True)
        return ring_attention(q, k, v, causal=True, layout=layout, timings=timings)

    # Warm-up on a short sequence: loads kernels and opens the connections.
    small = torch.randn(1, h, shard_length(64 * world, rank, world, layout), HEAD_DIM)
    call(small, small[:, :h_kv], small[:, :h_kv])
    del small
    gc.collect()
    before = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    s_local = shard_length(seq_len, rank, world, layout)
    gen = torch.Generator().manual_seed(rank)
    q = torch.randn(1, h, s_local, HEAD_DIM, generator=gen)
    k = torch.randn(1, h_kv, s_local, HEAD_DIM, generator=gen)
    v = torch.randn(1, h_kv, s_local, HEAD_DIM, generator=gen)
    dist.barrier()
    start, cpu_start = time.perf_counter(), time.process_time()
    out = call(q, k, v, timings)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    peak_mib = (_status_kib("VmHWM") - before) / 1024
    del out
    result = {
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "peak_mib": peak_mib,
        "wait_s": timings.wait,
        "compute_s": timings.compute,
        "skipped_steps": timings.skipped,
    }
    Path(result_dir, f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def run_cell(
    seq_len: int, world: int, *, heads: tuple[int, int] = SWEEP_HEADS, layout: str = "zigzag", kernel: str = "ring"
) -> dict:
    """One measurement on ``world`` fresh processes; the slowest rank's time, the largest
    rank's memory, the mean wait share. ``kernel="attention"`` (one rank) measures
    :func:`attnkit.attention` instead of ring attention."""
    cell = {"seq_len": seq_len, "heads": heads[0], "kv_heads": heads[1], "layout": layout, "kernel": kernel}
    with tempfile.TemporaryDirectory(prefix="attnkit-bench-") as tmp:
        mp.start_processes(
            _cell_rank, args=(world, os.path.join(tmp, "store"), tmp, cell), nprocs=world, start_method="spawn"
        )
        ranks = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]
    shares = [r["wait_s"] / max(r["seconds"], 1e-9) for r in ranks]
    return {
        **cell,
        "ranks": world,
        "seconds": max(r["seconds"] for r in ranks),
        "cpu_seconds": max(r["cpu_seconds"] for r in ranks),
        "peak_mib_per_rank": max(r["peak_mib"] for r in ranks),
        "wait_share": sum(shares) / len(shares),
        "per_rank": ranks,
    }


def _log(text: str) -> None:
    print(text, flush=True)


def sweep(lengths: list[int], ranks: list[int]) -> list[dict]:
    rows = []
    for seq_len in lengths:
        for world in ranks:
            row = run_cell(seq_len, world)
            rows.append(row)
            _log(
                f"s={seq_len:>6} ranks={world}: {row['seconds']:7.2f} s ({row['cpu_seconds']:.2f} s CPU), "
                f"{row['peak_mib_per_rank']:7.1f} MiB/rank, "
                f"wait {row['wait_share']:.1%}"
            )
    return rows


def memory_acceptance(seq_len: int) -> list[dict]:
    """Peak memory per rank, 4 ranks against 1 process (ring attention alone, and
    attnkit.attention), for each head grouping."""
    rows = []
    for heads in MEMORY_HEADS:
        one = run_cell(seq_len, 1, heads=heads)["peak_mib_per_rank"]
        sdpa = run_cell(seq_len, 1, heads=heads, kernel="attention")["peak_mib_per_rank"]
        four = run_cell(seq_len, 4, heads=heads)["peak_mib_per_rank"]
        rows.append(
            {
                "heads": heads[0],
                "kv_heads": heads[1],
                "one_process_ring_mib": one,
                "one_process_attention_mib": sdpa,
                "four_ranks_mib": four,
                "ratio_to_ring": four / one,
                "ratio_to_attention": four / sdpa,
            }
        )
        _log(
            f"memory s={seq_len} h={heads[0]} h_kv={heads[1]}: 1 process {one:.1f} MiB (attnkit.attention "
            f"{sdpa:.1f}), 4 ranks {four:.1f} MiB/rank, ratios {four / one:.3f} / {four / sdpa:.3f}"
        )
    return rows


def layout_acceptance(seq_len: int, rounds: int) -> dict:
    """Causal zigzag against contiguous on 2 ranks of one thread each, alternating: the
    slowest rank's CPU time (its time with a core of its own) and its wall time."""
    cpu: dict[str, list[float]] = {"contiguous": [], "zigzag": []}
    wall: dict[str, list[float]] = {"contiguous": [], "zigzag": []}
    for round_ in range(rounds):
        order = ("contiguous", "zigzag") if round_ % 2 == 0 else ("zigzag", "contiguous")
        for layout in order:
            row = run_cell(seq_len, 2, layout=layout)
            cpu[layout].append(row["cpu_seconds"])
            wall[layout].append(row["seconds"])
    best_cpu = {layout: min(ts) for layout, ts in cpu.items()}
    best_wall = {layout: min(ts) for layout, ts in wall.items()}
    result = {
        "seq_len": seq_len,
        "cpu_seconds": cpu,
        "wall_seconds": wall,
        "speedup": best_cpu["contiguous"] / best_cpu["zigzag"],
        "wall_speedup": best_wall["contiguous"] / best_wall["zigzag"],
    }
    _log(
        f"layout s={seq_len}: slowest rank's CPU time contiguous {best_cpu['contiguous']:.2f} s, zigzag "
        f"{best_cpu['zigzag']:.2f} s, speedup {result['speedup']:.2f}x (wall: {best_wall['contiguous']:.2f} s, "
        f"{best_wall['zigzag']:.2f} s, {result['wall_speedup']:.2f}x)"
    )
    return result


def report(rows: list[dict], memory: list[dict], layouts: dict) -> str:
    table = markdown_table(
        ["s", "ranks", "wall time (s)", "slowest rank's CPU time (s)", "peak MiB per rank", "wait share"],
        [
            [
                f"{r['seq_len']}",
                f"{r['ranks']}",
                f"{r['seconds']:.2f}",
                f"{r['cpu_seconds']:.2f}",
                f"{r['peak_mib_per_rank']:.1f}",
                f"{r['wait_share']:.1%}",
            ]
            for r in rows
        ],
    )
    mem_table = markdown_table(
        [
            "h",
            "h_kv",
            "1 process, ring (MiB)",
            "1 process, attnkit.attention (MiB)",
            "4 ranks (MiB per rank)",
            "ratio to ring",
            "ratio to attnkit.attention",
        ],
        [
            [
                f"{m['heads']}",
                f"{m['kv_heads']}",
                f"{m['one_process_ring_mib']:.1f}",
                f"{m['one_process_attention_mib']:.1f}",
                f"{m['four_ranks_mib']:.1f}",
                f"{m['ratio_to_ring']:.3f}",
                f"{m['ratio_to_attention']:.3f}",
            ]
            for m in memory
        ],
    )
    layout_text = (
        (
            f"causal, s={layouts['seq_len']}, 2 ranks of one thread, best of {len(layouts['cpu_seconds']['zigzag'])} "
            f"runs each, alternating. The slowest rank's CPU time (what it would take with a core of its own): "
            f"contiguous {min(layouts['cpu_seconds']['contiguous']):.2f} s, zigzag "
            f"{min(layouts['cpu_seconds']['zigzag']):.2f} s — zigzag **{layouts['speedup']:.2f}x** faster. Wall time "
            f"on this shared machine: contiguous {min(layouts['wall_seconds']['contiguous']):.2f} s, zigzag "
            f"{min(layouts['wall_seconds']['zigzag']):.2f} s ({layouts['wall_speedup']:.2f}x), which depends mostly on "
            "how much of the 2 cores the other programs left to the ranks during each run."
        )
        if layouts
        else "(not measured in this run)"
    )
    return f"""## Distributed: ring attention on gloo (`bench_distributed.py`)

Ring attention, causal, zigzag layout, b=1, h={SWEEP_HEADS[0]}, h_kv={SWEEP_HEADS[1]},
d={HEAD_DIM}, float32, one forward call; every rank is a
separate process with one thread, all on this machine's {os.cpu_count()} cores (so 4 ranks share 2
cores: time does not drop with ranks here, memory per rank does). Peak memory per rank counts
the rank's shards of q, k, v, its output, the key/value shards in transit and the kernel's
working memory. Wait share: time blocked on transfers the compute did not hide. The machine is
shared and busy: wall times include waiting for a core; CPU times do not.

{table}

Peak memory per rank, causal s={ACCEPTANCE_LENGTH}, 4 ranks against one process running the
same kernel without communication, and against one process calling `attnkit.attention`
(PyTorch's fused CPU kernel), by head grouping:

{mem_table}

Each rank holds 1/4 of q, k, v and the output, plus about one key/value shard in transit
(the forward pass moves shards in 8 pieces: the pieces of the held shard not yet computed and
sent, and those of the next shard received so far), so the ratio approaches
`(2 + 4/g) / (4 (2 + 2/g))` for g query heads per key/value head, before the kernel's working
memory: 0.375 without grouping, 0.3 at g=4.

Layouts: {layout_text}

Not measured here: NCCL on GPUs (no GPU on this machine), several machines.
"""


def _check_rank(rank: int, world: int, store_file: str, result_dir: str) -> None:
    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() >= world
    backend = "nccl" if use_cuda else "gloo"
    device = torch.device(f"cuda:{rank}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend,
        init_method=f"file://{store_file}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )
    import attnkit
    from attnkit import masks
    from attnkit.distributed import RingTimings, gather, ring_attention, shard

    errors = {}
    for layout in ("contiguous", "zigzag"):
        for name, mask, causal in (("causal", None, True), ("window", masks.sliding_window(100), False)):
            gen = torch.Generator().manual_seed(0)
            q = torch.randn(2, 4, 1000, 64, generator=gen, dtype=torch.float64).to(device)
            k = torch.randn(2, 2, 1000, 64, generator=gen, dtype=torch.float64).to(device)
            v = torch.randn(2, 2, 1000, 64, generator=gen, dtype=torch.float64).to(device)
            q_l, k_l, v_l = (shard(t, layout=layout).requires_grad_() for t in (q, k, v))
            out_l = ring_attention(q_l, k_l, v_l, causal=causal, mask=mask, layout=layout)
            out_l.sum().backward()
            qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
            ref = attnkit.attention(qr, kr, vr, mask=mask, causal=causal)
            ref.sum().backward()
            errors[f"{layout} {name}"] = max(
                float((gather(out_l.detach(), layout=layout) - ref.detach()).abs().max()),
                *(
                    float((g.grad - shard(r.grad, layout=layout)).abs().max())
                    for g, r in ((q_l, qr), (k_l, kr), (v_l, vr))
                ),
            )
    q32 = torch.randn(1, 8, 16384 // world, 64, device=device)
    timings = RingTimings()
    ring_attention(q32, q32, q32, causal=True, layout="zigzag")  # warm-up
    if use_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    ring_attention(q32, q32, q32, causal=True, layout="zigzag", timings=timings)
    if use_cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    Path(result_dir, f"rank{rank}.json").write_text(
        json.dumps(
            {
                "backend": backend,
                "device": str(device),
                "device_name": torch.cuda.get_device_name(device) if use_cuda else "cpu",
                "max_error_float64": errors,
                "seconds_s16384_h8_causal": seconds,
            }
        )
    )
    dist.destroy_process_group()


def check(world: int) -> int:
    with tempfile.TemporaryDirectory(prefix="attnkit-check-") as tmp:
        mp.start_processes(
            _check_rank, args=(world, os.path.join(tmp, "store"), tmp), nprocs=world, start_method="spawn"
        )
        ranks = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]
    worst = max(max(r["max_error_float64"].values()) for r in ranks)
    for r, result in enumerate(ranks):
        print(
            f"rank {r}: {result['backend']} on {result['device']} ({result['device_name']}), "
            f"max error (float64, output and grads) {max(result['max_error_float64'].values()):.2e}, "
            f"causal s=16384/{world} per rank h=8 d=64 float32 forward {result['seconds_s16384_h8_causal'] * 1e3:.1f} ms"
        )
    ok = worst < 1e-10
    print("check passed" if ok else f"check FAILED: max error {worst:.2e} >= 1e-10")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = arguments()
    args = parser.parse_args(argv)
    if args.check:
        return check(args.check_ranks)
    started = time.perf_counter()
    if args.only:
        saved = json.loads((RESULTS / "distributed.json").read_text())
        saved.pop("environment", None)
        if args.only == "layouts":
            saved["layouts"] = layout_acceptance(args.layout_length, args.layout_rounds)
        else:
            saved["memory"] = memory_acceptance(ACCEPTANCE_LENGTH)
        write_results(
            "distributed",
            saved,
            report(saved["sweep"], saved["memory"], saved["layouts"]),
            update_docs=args.update_docs,
        )
        print(f"replaced the {args.only} comparison in benchmarks/results/distributed.json and .md")
        return 0
    layouts = layout_acceptance(args.layout_length, args.layout_rounds) if args.layout_length else {}
    memory = [] if args.skip_memory else memory_acceptance(ACCEPTANCE_LENGTH)
    rows = sweep(args.lengths, args.ranks)
    data = {
        "sweep": rows,
        "memory": memory,
        "layouts": layouts,
        "wall_seconds": time.perf_counter() - started,
        "config": {"head_dim": HEAD_DIM, "heads": SWEEP_HEADS, "dtype": "float32", "threads_per_rank": 1},
    }
    write_results("distributed", data, report(rows, memory, layouts), update_docs=args.update_docs)
    print(f"wrote benchmarks/results/distributed.json and .md in {data['wall_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
