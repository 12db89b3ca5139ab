"""Run every benchmarks/bench_*.py module's main() in turn (``make bench``), each with its
default arguments; ``--update-docs`` then rebuilds docs/benchmarks.md from the results."""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.common import benchmark_parser, rebuild_report  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    args = benchmark_parser(__doc__).parse_args(argv)
    names = sorted(p.stem for p in HERE.glob("bench_*.py"))
    for name in names:
        print(f"== {name}", flush=True)
        start = time.perf_counter()
        importlib.import_module(f"benchmarks.{name}").main([])
        print(f"== {name} done in {time.perf_counter() - start:.1f} s\n", flush=True)
    if args.update_docs:
        rebuild_report()
        print("Report: docs/benchmarks.md")
    else:
        print("Results: benchmarks/results/ (--update-docs rebuilds docs/benchmarks.md from them)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
