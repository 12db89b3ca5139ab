"""Shared tools for the benchmarks: arguments, timing, the matmul ceiling, and writing reports.

Every benchmark measures its baselines in the same process, on the same threads, and
reports ratios; absolute times on a shared machine are noisy.

Every script parses its arguments before it imports PyTorch or touches a model, so that
``--help`` and a mistyped option answer at once, and writes only under benchmarks/results/
(and the model cache, ``$ATTNKIT_HOME``, when it fetches a model); ``--update-docs``, for
the maintainers, also rebuilds docs/benchmarks.md (and its pictures) from those results.
This module imports PyTorch only inside the functions that measure.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
REPORT = ROOT / "docs" / "benchmarks.md"
# Pictures a benchmark draws (benchmarks/results/*.png) are copied here with the report.
REPORT_IMAGES = ROOT / "docs" / "images"


def benchmark_parser(doc: str | None) -> argparse.ArgumentParser:
    """The argument parser every benchmark script starts from: its description is the first
    paragraph of ``doc``, and ``--update-docs`` is there."""
    parser = argparse.ArgumentParser(
        description=(doc or "").split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--update-docs",
        action="store_true",
        help="also rebuild docs/benchmarks.md from benchmarks/results/ (for the maintainers; "
        "without it, only benchmarks/results/ is written)",
    )
    return parser


def median_time(fn: Callable[[], object], *, repeat: int = 5, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` in seconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved_samples(
    fns: dict[str, Callable[[], object]],
    *,
    repeat: int = 7,
    warmup: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Every time of several functions measured round-robin, ``repeat`` rounds, so that
    drift in the machine's load hits every contender alike: ``samples[name][r]`` is round
    ``r``. ``clock=time.thread_time`` measures the CPU time of the calling thread instead of
    wall time: for one-threaded work on a shared machine, the time the thread waited for a
    core is then not counted."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns.items())
    for round_ in range(repeat):
        # Alternate the order each round, so that neither contender always runs right
        # after the other (caches, allocator state, frequency scaling).
        for name, fn in order if round_ % 2 == 0 else order[::-1]:
            start = clock()
            fn()
            samples[name].append(clock() - start)
    return samples


def interleaved_times(
    fns: dict[str, Callable[[], object]],
    *,
    repeat: int = 7,
    warmup: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """Median times of :func:`interleaved_samples`."""
    samples = interleaved_samples(fns, repeat=repeat, warmup=warmup, clock=clock)
    return {name: statistics.median(ts) for name, ts in samples.items()}


def paired_ratio(numerator: list[float], denominator: list[float]) -> float:
    """The median over rounds of ``numerator[r] / denominator[r]``, for two contenders of
    :func:`interleaved_samples`.

    Why not the ratio of the two medians: on a shared machine the same work runs 10–15%
    slower for spells of a few seconds. The two
    times of one round are taken back to back, so a spell mostly falls on both sides of a
    round's ratio, while each median alone keeps it. Measured over 40 rounds of a 12-layer
    model's prefill, 15 rounds gave ratios that moved by 0.010 (standard deviation) between
    windows; the ratio of medians moved by 0.025, and by 0.056 over 5 rounds.

    Raises:
        ValueError: the lists are empty or of different lengths.
    """
    if not numerator or len(numerator) != len(denominator):
        raise ValueError(
            f"expected two equally long, non-empty lists of times, got {len(numerator)} and {len(denominator)}"
        )
    return statistics.median(n / d for n, d in zip(numerator, denominator))


def matmul_gflops(n: int = 2048, dtype: torch.dtype | None = None) -> float:
    """``torch.mm`` throughput on this machine now (float32 by default): the practical
    compute ceiling."""
    import torch

    dtype = dtype or torch.float32
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    seconds = median_time(lambda: torch.mm(a, b), repeat=5)
    return 2 * n**3 / seconds / 1e9


def attention_flops(b: int, h: int, s_q: int, s_k: int, d: int, causal: bool = False) -> float:
    """``4 b h s_q s_k d`` for one forward; half of it for causal."""
    flops = 4 * b * h * s_q * s_k * d
    return flops / 2 if causal else flops


class DeviceMemory:
    """The peak memory this process takes on a device beyond a starting point (:meth:`begin`),
    such as the loaded weights: on CUDA what PyTorch's allocator hands out
    (``torch.cuda.max_memory_allocated``); on the CPU the growth of the peak resident set
    (``VmHWM`` of ``/proc/self/status``, reset through ``/proc/self/clear_refs``; 0 where
    there is no such file).

    Args:
        device: ``"cuda"``, ``"cuda:1"``, ``"cpu"``.
    """

    def __init__(self, device: str) -> None:
        self.device = device
        self.cuda = device.startswith("cuda")
        self.start = 0

    def begin(self) -> None:
        """Count from now: the peak is reset to what is held now."""
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start = int(torch.cuda.memory_allocated(self.device))
            return
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            pass
        self.start = _status_bytes("VmHWM")

    def peak(self) -> int:
        """The most held since :meth:`begin`, beyond what was held then, in bytes."""
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)
            return int(torch.cuda.max_memory_allocated(self.device)) - self.start
        return _status_bytes("VmHWM") - self.start


def _status_bytes(field: str) -> int:
    """A size field of ``/proc/self/status`` (``VmHWM``, ``VmRSS``) in bytes; 0 where there is none."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


def device_name(device: str) -> str:
    """What the measurements ran on: the GPU's name (``NVIDIA H200``), or the CPU's."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()})"


def environment() -> dict:
    import torch

    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def write_results(name: str, data: dict, markdown: str, *, update_docs: bool = False) -> None:
    """Save ``results/NAME.json`` and ``results/NAME.md``; with ``update_docs`` (a script's
    ``--update-docs``, for the maintainers), also rebuild docs/benchmarks.md from every
    section present, so each benchmark can be rerun alone. Nothing else is written."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({"environment": environment(), **data}, indent=2) + "\n")
    (RESULTS / f"{name}.md").write_text(markdown.strip() + "\n")
    if update_docs:
        rebuild_report()


def rebuild_report() -> None:
    """Rebuild docs/benchmarks.md from every ``results/*.md`` (also for results measured on
    another machine and copied here, such as a GPU run), and copy ``results/*.png`` beside
    the documentation's other pictures."""
    for picture in sorted(RESULTS.glob("*.png")):
        REPORT_IMAGES.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(picture, REPORT_IMAGES / picture.name)
    sections = [p.read_text().strip() for p in sorted(RESULTS.glob("*.md"))]
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(
        "# Benchmarks\n\n"
        "Generated by `python benchmarks/run_all.py --update-docs` (or a single script's "
        "`--update-docs`) from the sections in `benchmarks/results/*.md`. Every ratio "
        "compares contenders measured in the same run, on the same machine and threads.\n\n"
        + "\n\n".join(sections)
        + "\n"
    )
