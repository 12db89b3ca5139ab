"""Run every benchmarks/bench_*.py module's main() in turn (``make bench``)."""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def main() -> int:
    names = sorted(p.stem for p in HERE.glob("bench_*.py"))
    for name in names:
        print(f"== {name}", flush=True)
        start = time.perf_counter()
        importlib.import_module(f"benchmarks.{name}").main()
        print(f"== {name} done in {time.perf_counter() - start:.1f} s\n", flush=True)
    print("Report: docs/benchmarks.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
