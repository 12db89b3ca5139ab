"""Long sequences: local, linear, block-sparse and memory-efficient exact attention against
SDPA (full, causal, dense boolean mask) and compiled FlexAttention, forward and
forward+backward, time and peak extra memory, b=1, h=8, d=64, float32.

Run alone: ``python benchmarks/bench_long.py`` (about 6-9 minutes on 2 busy cores), or
``--lengths 1024,4096`` for a quick look, ``--full`` to also run the cells skipped for time.

Memory is the growth of the process's peak resident set (``VmHWM``, reset through
``/proc/self/clear_refs``) during one call, measured in a child process whose ``malloc``
returns every block of 128 KiB or more to the system when freed (``mallopt``), so freed
memory is not reused unseen. Inputs (and a dense mask, for the baselines that take one) are
allocated before the reset and not counted; outputs and gradients are.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import benchmark_parser  # noqa: E402

LENGTHS = (1024, 4096, 16384, 65536)


def arguments() -> argparse.ArgumentParser:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    parser.add_argument("--full", action="store_true", help="also run the cells skipped for time")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument(
        "--threads",
        default="auto",
        help="torch threads for every contender: a number, or 'auto' = 1 when the machine is oversubscribed "
        "(1-min load average above the core count) and torch's default otherwise",
    )
    parser.add_argument("--memory-child", action="store_true", help=argparse.SUPPRESS)
    return parser


if __name__ == "__main__":
    # --help and a mistyped option end here, before PyTorch is imported or a model touched.
    arguments().parse_args()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from attnkit import masks  # noqa: E402
from attnkit.functional import attention, linear_attention, local_attention, sparse_attention  # noqa: E402
from attnkit.functional.block_status import FULL, PARTIAL, classify_blocks  # noqa: E402
from attnkit.functional.local import scores_computed  # noqa: E402
from attnkit.functional.sparse import kept_fraction  # noqa: E402
from attnkit.functional.tiled import make_plan  # noqa: E402
from benchmarks.common import RESULTS, markdown_table, matmul_gflops, write_results  # noqa: E402

B, H, D = 1, 8, 64
WINDOW = 256
DOC = 2048  # tokens per document in the document + causal pattern
STRIDE = 128
QUADRATIC_FWD_MAX = 16384  # dense baselines: forward up to here
QUADRATIC_BWD_MAX = 4096  # dense baselines: forward+backward up to here (16K costs ~10-25 s a call)
DENSE_MASK_MAX = 16384  # a [s, s] bool mask: 256 MiB at 16K, 4 GiB at 64K
FLEX_MAX = 16384  # FlexAttention compiles (and builds its block mask) once per length

LABELS = {
    "sdpa_full": "SDPA, no mask",
    "sdpa_causal": "SDPA `is_causal`",
    "sdpa_window_mask": "SDPA, dense window mask",
    "flex_window": "FlexAttention (compiled), window",
    "local": f"attnkit `local_attention` (w={WINDOW}, causal)",
    "linear": "attnkit `linear_attention` (elu+1, causal)",
    "linear_favor": "attnkit `linear_attention` (FAVOR+, m=128, causal)",
    "sdpa_doc_mask": "SDPA, dense document+causal mask",
    "tiled_doc": "attnkit `attention(mask=document & causal)` (tiled)",
    "sdpa_strided_mask": "SDPA, dense strided mask",
    "sparse_strided": f"attnkit `sparse_attention` (strided {STRIDE}, permuted)",
}


# ---------------------------------------------------------------------------------------
# Contenders: each returns (forward fn, skip reason); fns close over ready inputs.
# ---------------------------------------------------------------------------------------


class Cell:
    """Inputs and the per-length state (dense masks, compiled Flex) shared by contenders."""

    def __init__(self, s: int, grad: bool, full: bool, flex_cache: dict):
        g = torch.Generator().manual_seed(s)
        self.s, self.grad, self.full = s, grad, full
        self.q, self.k, self.v = (torch.randn(B, H, s, D, generator=g).requires_grad_(grad) for _ in range(3))
        self.flex_cache = flex_cache
        self._dense: dict[str, torch.Tensor] = {}
        self.doc_mask = masks.document(torch.arange(s) // DOC) & masks.causal()

    def dense(self, name: str) -> torch.Tensor:
        if name not in self._dense:
            pattern = {
                "window": masks.sliding_window(WINDOW) & masks.causal(),
                "doc": self.doc_mask,
                "strided": masks.strided(STRIDE) & masks.causal(),
            }[name]
            self._dense[name] = pattern.to_dense(self.s, self.s)  # [1, 1, s, s]
        return self._dense[name]

    def quadratic_skip(self, *, mask: bool = False) -> str | None:
        if self.full:
            return (
                None
                if not (mask and self.s > DENSE_MASK_MAX)
                else f"a dense [s, s] mask is {self.s**2 / 2**30:.0f} GiB"
            )
        if mask and self.s > DENSE_MASK_MAX:
            return f"a dense [s, s] mask is {self.s**2 / 2**30:.0f} GiB"
        if self.grad and self.s > QUADRATIC_BWD_MAX:
            return "time budget (quadratic forward+backward)"
        if self.s > QUADRATIC_FWD_MAX:
            return "time budget (quadratic forward)"
        return None


def contender(name: str, cell: Cell) -> tuple[Callable[[], torch.Tensor] | None, str | None]:
    q, k, v, s = cell.q, cell.k, cell.v, cell.s
    if name == "sdpa_full":
        return (lambda: F.scaled_dot_product_attention(q, k, v)), cell.quadratic_skip()
    if name == "sdpa_causal":
        skip = cell.quadratic_skip()
        if skip and s <= (16384 if cell.grad else 65536):
            skip = None  # the targets compare against it: fwd+bwd at 16K, fwd at 64K
        return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)), skip
    if name in ("sdpa_window_mask", "sdpa_doc_mask", "sdpa_strided_mask"):
        skip = cell.quadratic_skip(mask=True)
        if skip:
            return None, skip
        dense = cell.dense(name.split("_")[1])
        return (lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense)), None
    if name == "flex_window":
        if cell.grad:
            return None, "FlexAttention has no CPU backward (NotImplementedError)"
        if s > FLEX_MAX and not cell.full:
            return None, "time budget (compile and block mask per length)"
        fn = cell.flex_cache.get(s)
        if fn is None:
            fn = cell.flex_cache[s] = _compile_flex(s)
        return (lambda: fn(q, k, v)), None
    if name == "local":
        return (lambda: local_attention(q, k, v, window=WINDOW, causal=True)), None
    if name == "linear":
        return (lambda: linear_attention(q, k, v, causal=True)), None
    if name == "linear_favor":
        proj = cell.flex_cache.setdefault("favor", None)
        if proj is None:
            from attnkit.functional import favor_projection

            proj = cell.flex_cache["favor"] = favor_projection(D, 128, seed=0)
        return (lambda: linear_attention(q, k, v, causal=True, feature_map="favor", projection=proj)), None
    long_backward = None if cell.full or not (cell.grad and s > 16384) else "time budget (64K forward+backward)"
    if name == "tiled_doc":
        return (lambda: attention(q, k, v, mask=cell.doc_mask)), long_backward
    if name == "sparse_strided":
        return (
            lambda: sparse_attention(q, k, v, mask=masks.strided(STRIDE), causal=True, permute=STRIDE)
        ), long_backward
    raise KeyError(name)


def flex_block_mask(mask: masks.Mask, s: int, block: int = 128):
    """A FlexAttention ``BlockMask`` for a square ``mask``, built from attnkit's block
    classification (the mask's block test), without evaluating a single pair."""
    from torch.nn.attention.flex_attention import BlockMask

    pos = torch.arange(s)
    status = classify_blocks(mask, None, pos, pos, block, block)  # [n_q_blocks, n_k_blocks]

    def pack(selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        order = torch.argsort((~selected).to(torch.int8), dim=1, stable=True)  # selected first
        return selected.sum(1).to(torch.int32)[None, None], order.to(torch.int32)[None, None]

    fn = mask.fn

    def mask_mod(b, h, q_idx, kv_idx):
        return fn(b, h, q_idx, kv_idx)

    return BlockMask.from_kv_blocks(
        *pack(status == PARTIAL), *pack(status == FULL), BLOCK_SIZE=block, mask_mod=mask_mod, seq_lengths=(s, s)
    )


def _compile_flex(s: int):
    """Compile FlexAttention for length ``s``; the compile and block-mask build times are
    recorded apart (``FLEX_SETUP``)."""
    from torch.nn.attention.flex_attention import flex_attention

    start = time.perf_counter()
    block_mask = flex_block_mask(masks.sliding_window(WINDOW) & masks.causal(), s)
    built = time.perf_counter() - start
    compiled = torch.compile(flex_attention, dynamic=False)
    x, y, z = (torch.randn(B, H, s, D) for _ in range(3))
    start = time.perf_counter()
    out = compiled(x, y, z, block_mask=block_mask)
    FLEX_SETUP[s] = {"block_mask_s": built, "compile_s": time.perf_counter() - start}
    err = (out - local_attention(x, y, z, window=WINDOW, causal=True)).abs().max().item()
    if err > 1e-4:
        raise RuntimeError(f"FlexAttention and local_attention disagree by {err} at s={s}")
    return lambda q, k, v: compiled(q, k, v, block_mask=block_mask)


FLEX_SETUP: dict[int, dict[str, float]] = {}
TARGET_BASELINES = {"sdpa_full", "sdpa_causal", "sdpa_window_mask"}
FORWARD = [
    "sdpa_full",
    "sdpa_causal",
    "sdpa_window_mask",
    "flex_window",
    "local",
    "linear",
    "linear_favor",
    "sdpa_doc_mask",
    "tiled_doc",
    "sdpa_strided_mask",
    "sparse_strided",
]


def _run(fn: Callable[[], torch.Tensor], grad: bool, cell: Cell) -> None:
    out = fn()
    if grad:
        out.backward(torch.ones_like(out))
        for t in (cell.q, cell.k, cell.v):
            t.grad = None


def measure_times(cell: Cell, names: list[str], budget_s: float = 6.0) -> dict[str, dict]:
    """Median seconds per call, contenders interleaved round-robin so that drift in the
    machine's load hits all alike; slow contenders get fewer repeats."""
    fns, rows = {}, {}
    for name in names:
        fn, skip = contender(name, cell)
        if skip:
            rows[name] = {"skipped": skip}
            continue
        start = time.perf_counter()
        _run(fn, cell.grad, cell)  # warm-up; kept as the only sample of slow calls
        first = time.perf_counter() - start
        fns[name] = fn
        slow = first > budget_s / 2
        rows[name] = {"samples": [first] if slow else []}
        rows[name]["repeats"] = 1 if slow else max(1, min(5, int(budget_s / max(first, 1e-3))))
        if slow and name in TARGET_BASELINES and first < 10:
            rows[name]["repeats"] = 3  # the targets divide by these: a median, not one sample
    for _ in range(max([rows[n]["repeats"] for n in fns] + [0])):
        for name, fn in fns.items():
            if len(rows[name]["samples"]) >= rows[name]["repeats"]:
                continue
            start = time.perf_counter()
            _run(fn, cell.grad, cell)
            rows[name]["samples"].append(time.perf_counter() - start)
    for name in fns:
        rows[name]["seconds"] = statistics.median(rows[name]["samples"])
    return rows


# ---------------------------------------------------------------------------------------
# Memory, in a child process.
# ---------------------------------------------------------------------------------------


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_extra_mib(fn: Callable[[], None]) -> float:
    gc.collect()
    before = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    fn()
    return (_status_kib("VmHWM") - before) / 1024


def memory_child(lengths: list[int], full: bool) -> dict:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD: fixed, so big frees go back to the OS
    libc.mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD
    out: dict = {}
    flex_cache: dict = {}
    for s in lengths:
        for grad in (False, True):
            cell = Cell(s, grad, full, flex_cache)
            for name in FORWARD:
                fn, skip = contender(name, cell)
                quadratic = name.startswith("sdpa")
                if skip is None and quadratic and s > (QUADRATIC_BWD_MAX if grad else QUADRATIC_FWD_MAX) and not full:
                    skip = "time budget"
                if skip:
                    continue
                if not quadratic and s <= 16384:
                    _run(fn, grad, cell)  # warm-up: lazy initialisation
                out[f"{name}|{s}|{int(grad)}"] = peak_extra_mib(lambda: _run(fn, grad, cell))  # noqa: F821 (deleted after the loop)
            del cell
            gc.collect()
    return out


def measure_memory(lengths: list[int], full: bool) -> dict:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--memory-child",
        "--lengths",
        ",".join(map(str, lengths)),
        "--threads",
        str(torch.get_num_threads()),
    ]
    if full:
        cmd.append("--full")
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        print("memory child failed:\n" + proc.stderr[-2000:], file=sys.stderr)
        return {}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------
# Report.
# ---------------------------------------------------------------------------------------


def _threads(spec: str) -> int:
    if spec != "auto":
        return int(spec)
    cores = os.cpu_count() or 1
    return 1 if os.getloadavg()[0] > cores else torch.get_num_threads()


def _fmt_time(row: dict | None) -> str:
    if row is None:
        return "—"
    if "skipped" in row:
        return f"skipped: {row['skipped']}"
    t = row["seconds"]
    return f"{t * 1e3:.1f} ms" if t < 1 else f"{t:.2f} s"


def _ratio(a: dict, b: dict) -> float | None:
    if a is None or b is None or "seconds" not in a or "seconds" not in b:
        return None
    return b["seconds"] / a["seconds"]


def main(argv: list[str] | None = None) -> dict:
    parser = arguments()
    args = parser.parse_args([] if argv is None else argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    threads = _threads(args.threads)
    torch.set_num_threads(threads)
    if args.memory_child:
        print(json.dumps(memory_child(lengths, args.full)))
        return {}

    torch.manual_seed(0)
    started = time.perf_counter()
    load_before = os.getloadavg()
    mm = matmul_gflops()
    print(f"torch.mm: {mm:.1f} GFLOP/s")
    times: dict = {}
    flex_cache: dict = {}
    for s in lengths:
        for grad in (False, True):
            cell = Cell(s, grad, args.full, flex_cache)
            rows = measure_times(cell, FORWARD)
            times[f"{s}|{int(grad)}"] = rows
            for name, row in rows.items():
                print(f"s={s:6d} {'fwd+bwd' if grad else 'fwd    '} {name:18s} {_fmt_time(row)}", flush=True)
            del cell
            gc.collect()
    memory = {} if args.no_memory else measure_memory(lengths, args.full)

    # Facts for the targets.
    plans = {}
    for s in lengths:
        x = torch.empty(1, 1, s, 1)
        plan = make_plan(
            x, x, x, mask=masks.document(torch.arange(s) // DOC) & masks.causal(), bias=None, causal=False, scale=1.0
        )
        plans[s] = {
            "tiled_kept_fraction": plan.kept_fraction,
            "strided_kept_fraction_permuted": kept_fraction(masks.strided(STRIDE), s, s, causal=True, permute=STRIDE),
            "strided_kept_fraction_natural": kept_fraction(masks.strided(STRIDE), s, s, causal=True),
        }
    counting = scores_computed(1000, 1000, window=10)
    data = {
        "shape": {"b": B, "h": H, "d": D, "dtype": "float32", "window": WINDOW, "doc_tokens": DOC, "stride": STRIDE},
        "matmul_gflops": mm,
        "times": times,
        "memory_mib": memory,
        "flex_setup": {str(k): v for k, v in FLEX_SETUP.items()},
        "patterns": {str(k): v for k, v in plans.items()},
        "counting_1000_tokens_window_10": counting,
        "wall_s": time.perf_counter() - started,
        "load_average_1min": {"start": load_before[0], "end": os.getloadavg()[0]},
        "threads": torch.get_num_threads(),
    }
    targets = _targets(times, memory, plans, lengths)
    data["targets"] = targets
    plot = _plot(times, lengths)
    write_results("long", data, _markdown(data, lengths, targets, plot), update_docs=args.update_docs)
    print(f"done in {data['wall_s']:.0f} s")
    return data


def _get(times: dict, s: int, grad: bool, name: str) -> dict | None:
    return times.get(f"{s}|{int(grad)}", {}).get(name)


def _targets(times: dict, memory: dict, plans: dict, lengths: list[int]) -> list[dict]:
    out = []

    def add(what: str, value: float | None, goal: str, ok: bool | None):
        out.append({"target": what, "measured": value, "goal": goal, "met": ok})

    s = 16384
    if s in lengths:
        r = _ratio(_get(times, s, False, "local"), _get(times, s, False, "sdpa_window_mask"))
        add("local w=256, 16K, causal, fwd: speed ÷ SDPA dense window mask", r, "≥ 20×", None if r is None else r >= 20)
        r = _ratio(_get(times, s, False, "local"), _get(times, s, False, "flex_window"))
        add(
            "local w=256, 16K, causal, fwd: speed ÷ compiled Flex (compile excluded)",
            r,
            "≥ 1.0×",
            None if r is None else r >= 1.0,
        )
        r = _ratio(_get(times, s, True, "local"), _get(times, s, True, "sdpa_causal"))
        add("local w=256, 16K, fwd+bwd: speed ÷ SDPA is_causal fwd+bwd", r, "≥ 10×", None if r is None else r >= 10)
        r = _ratio(_get(times, s, False, "linear"), _get(times, s, False, "sdpa_causal"))
        add("linear causal, 16K, fwd: speed ÷ SDPA is_causal", r, "≥ 5×", None if r is None else r >= 5)
        mem = memory.get(f"tiled_doc|{s}|0")
        add(
            "exact attention, 16K, document+causal pattern: peak extra memory (MiB)",
            mem,
            "< 64 MiB",
            None if mem is None else mem < 64,
        )
        full, tiled = _get(times, s, False, "sdpa_full"), _get(times, s, False, "tiled_doc")
        if full and tiled and "seconds" in full and "seconds" in tiled:
            frac = plans[s]["tiled_kept_fraction"]
            r = tiled["seconds"] / (full["seconds"] * frac)
            add(
                f"exact attention, 16K, document+causal: time ÷ (SDPA no mask × {frac:.3f} blocks kept)",
                r,
                "≤ 1.5",
                r <= 1.5,
            )
    if 65536 in lengths:
        r = _ratio(_get(times, 65536, False, "linear"), _get(times, 65536, False, "sdpa_causal"))
        add("linear causal, 64K, fwd: speed ÷ SDPA is_causal", r, "≥ 20×", None if r is None else r >= 20)
    mems = [(s, memory.get(f"local|{s}|1")) for s in lengths]
    mems = [(s, m) for s, m in mems if m is not None]
    if len(mems) >= 2:
        (s0, m0), (s1, m1) = mems[-2], mems[-1]
        growth = math.log(m1 / m0) / math.log(s1 / s0)
        add(
            f"local fwd+bwd: peak extra memory growth exponent from s={s0} to s={s1} (1 = linear, 2 = quadratic)",
            growth,
            "≤ 1.1 (linear in s)",
            growth <= 1.1,
        )
    return out


def _plot(times: dict, lengths: list[int]) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install 'attnkit[viz]'): no plot")
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 6.5), sharey=True)
    colors = plt.get_cmap("tab20").colors
    for ax, grad in zip(axes, (False, True)):
        for i, name in enumerate(FORWARD):
            pts = [(s, _get(times, s, grad, name)) for s in lengths]
            pts = [(s, r["seconds"]) for s, r in pts if r and "seconds" in r]
            style = "--" if name.startswith(("sdpa", "flex")) else "-"
            ax.plot(
                *(zip(*pts) if pts else ([], [])),
                style,
                marker="o",
                color=colors[(2 * i) % 20 + (i >= 10)],
                label=LABELS[name].replace("`", ""),
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length s")
        ax.set_title("forward + backward" if grad else "forward")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("seconds per call (b=1, h=8, d=64, float32)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle("Long sequences: dashed = PyTorch baselines, solid = attnkit")
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    # With the results; --update-docs copies it beside the documentation's other pictures.
    path = RESULTS / "bench-long.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return "images/bench-long.png"


def _markdown(data: dict, lengths: list[int], targets: list[dict], plot: str | None) -> str:
    memory = data["memory_mib"]
    lines = [
        "## Long sequences: local, linear, block-sparse and tiled exact attention",
        "",
        f"b={B}, h={H}, d={D}, float32, {torch.get_num_threads()} threads; `torch.mm` ran at "
        f"{data['matmul_gflops']:.1f} GFLOP/s in the same run. Local window w={WINDOW} (causal); document "
        f"pattern: documents of {DOC} tokens, causal; strided pattern: stride {STRIDE}, causal. Times are medians "
        "of interleaved calls (slow calls once). Memory: growth of peak RSS during one call, above the inputs "
        "(a dense mask counts as an input), in a child process that returns freed blocks to the system; "
        "outputs and gradients count. Run alone: `python benchmarks/bench_long.py`. "
        f"Machine load (1-min load average) {data['load_average_1min']['start']:.1f} at the start and "
        f"{data['load_average_1min']['end']:.1f} at the end of this run, on {os.cpu_count()} cores. On an "
        "oversubscribed machine every multi-threaded operator also waits for its threads to be scheduled, "
        "which weighs on kernels made of many operators far more than on one fused call; `--threads auto` "
        "then runs every contender on 1 thread (this run: "
        f"{data['threads']} thread{'s' if data['threads'] > 1 else ''}).",
        "",
    ]
    headers = ["kernel"] + [f"s={s} fwd" for s in lengths] + [f"s={s} fwd+bwd" for s in lengths]
    rows = []
    for name in FORWARD:
        row = [LABELS[name]]
        for grad in (False, True):
            for s in lengths:
                cell = _get(data["times"], s, grad, name)
                text = _fmt_time(cell)
                mem = memory.get(f"{name}|{s}|{int(grad)}")
                if mem is not None and cell and "seconds" in cell:
                    text += f" / {mem:.0f} MiB"
                row.append(text)
        rows.append(row)
    lines += ["Time / peak extra memory per call:", "", markdown_table(headers, rows), ""]
    if FLEX_SETUP:
        lines.append(
            "FlexAttention setup, not in the times above (first call, compiled; later lengths reuse "
            "Inductor's cache, so only the first compile is cold; the block mask is built from attnkit's "
            "block classification): "
            + "; ".join(
                f"s={s}: compile {v['compile_s']:.1f} s, block mask {v['block_mask_s'] * 1e3:.0f} ms"
                for s, v in sorted(FLEX_SETUP.items())
            )
            + "."
        )
        lines.append("")
    lines += ["Targets, ratios from this run:", ""]
    lines.append(
        markdown_table(
            ["target", "measured", "goal", "met"],
            [
                [
                    t["target"],
                    "—" if t["measured"] is None else f"{t['measured']:.2f}",
                    t["goal"],
                    "—" if t["met"] is None else ("yes" if t["met"] else "**no**"),
                ]
                for t in targets
            ],
        )
    )
    lines.append("")
    pat = data["patterns"]
    lines.append(
        "Blocks kept (of all query-block × key-block pairs): "
        + "; ".join(
            f"s={s}: document+causal {pat[str(s)]['tiled_kept_fraction']:.3f}, strided natural order "
            f"{pat[str(s)]['strided_kept_fraction_natural']:.3f}, strided permuted {pat[str(s)]['strided_kept_fraction_permuted']:.4f}"
            for s in lengths
        )
        + "."
    )
    c = data["counting_1000_tokens_window_10"]
    lines += [
        "",
        "Counting the scores (1000 tokens, window ±10): full attention computes "
        f"{c['full']:,} scores; local attention needs {c['allowed']:,} ({c['allowed'] / c['full']:.1%}, "
        f"about 20,000, a 98% cut), and the blocked kernel evaluates {c['computed']:,} ({c['computed'] / c['full']:.1%}) "
        "including the padding of its blocks.",
    ]
    if plot:
        lines += ["", f"![time against length, log-log]({plot})"]
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
