"""How long the ``attnkit`` command takes from start to finish, against ``import torch``.

Every command runs as a fresh process, the way a user types it: ``attnkit inspect`` and
``attnkit heads`` on the tutorial's sentence with SmolLM2 (when it is fetched; nothing is
downloaded), ``attnkit explain`` (no model), ``attnkit --help`` and an argument error
(``inspect --method grad`` without ``--target``). The baseline, ``python -c "import torch"``,
runs in the same rounds, each round in an alternating order, so that the machine's load hits
every contender alike; the report gives each command's median wall time and its ratio to the
baseline's median.

Targets: ``inspect`` at most 1.5x ``import torch``; ``--help`` and the argument error at most
0.3 s (they import nothing heavy).

    python benchmarks/bench_startup.py [--rounds 5] [--quick] [--update-docs]

Results: benchmarks/results/startup.json and .md (not with --quick).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

TEXT = "The cat sat on the mat."
BASELINE = "import torch"
INSPECT_TARGET_RATIO = 1.5
QUICK_TARGET_S = 0.3


def commands(out: Path, with_model: bool) -> dict[str, list[str]]:
    """Each contender's argv, the baseline first; commands that write, into ``out``."""
    python = [sys.executable]
    attnkit = [sys.executable, "-m", "attnkit"]
    found = {
        BASELINE: [*python, "-c", "import torch"],
        "attnkit --help": [*attnkit, "--help"],
        "argument error": [*attnkit, "inspect", "x", "--method", "grad"],
        "attnkit explain": [*attnkit, "explain"],
    }
    if with_model:
        found["attnkit inspect"] = [*attnkit, "inspect", TEXT, "--out", str(out / "inspect")]
        found["attnkit heads"] = [*attnkit, "heads", TEXT, "--out", str(out / "heads")]
    return found


def run_once(argv: list[str]) -> float:
    """Wall time of one fresh process, which must end as the command says it does."""
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - start
    expected = 2 if argv[-2:] == ["--method", "grad"] else 0
    if done.returncode != expected:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}, expected {expected}:\n{done.stderr[-2000:]}")
    return seconds


def measure(argvs: dict[str, list[str]], rounds: int) -> dict[str, list[float]]:
    """Every contender once per round, in alternating order (after one unmeasured round
    that warms the file cache)."""
    for argv in argvs.values():
        run_once(argv)
    samples: dict[str, list[float]] = {name: [] for name in argvs}
    order = list(argvs.items())
    for round_ in range(rounds):
        for name, argv in order if round_ % 2 == 0 else order[::-1]:
            samples[name].append(run_once(argv))
    return samples


def smollm2_fetched() -> bool:
    from attnkit.models.registry import home

    return (home() / "smollm2" / "config.json").is_file()


def report(samples: dict[str, list[float]]) -> tuple[dict, str]:
    from benchmarks.common import markdown_table

    medians = {name: statistics.median(times) for name, times in samples.items()}
    baseline = medians[BASELINE]
    ratios = {name: seconds / baseline for name, seconds in medians.items()}
    targets = {"attnkit inspect": f"≤ {INSPECT_TARGET_RATIO}×", "attnkit --help": f"≤ {QUICK_TARGET_S} s"}
    targets["argument error"] = f"≤ {QUICK_TARGET_S} s"
    met = {}
    if "attnkit inspect" in ratios:
        met["attnkit inspect"] = ratios["attnkit inspect"] <= INSPECT_TARGET_RATIO
    for name in ("attnkit --help", "argument error"):
        met[name] = medians[name] <= QUICK_TARGET_S
    rows = [
        [
            f"`{name}`" if name != "argument error" else "`attnkit inspect x --method grad` (argument error)",
            f"{medians[name]:.2f}",
            f"{ratios[name]:.2f}×",
            targets.get(name, ""),
            ("met" if met[name] else "missed") if name in met else "",
        ]
        for name in samples
    ]
    rounds = len(samples[BASELINE])
    markdown = (
        "## Start-up: the `attnkit` command against `import torch`\n\n"
        f"`python benchmarks/bench_startup.py`: each command as a fresh process, {rounds} rounds in "
        'alternating order with the baseline `python -c "import torch"`; medians of wall time. '
        f'The model commands run on SmolLM2 (fetched) with the sentence "{TEXT}".\n\n'
        + markdown_table(["command", "median (s)", "ratio to import torch", "target", ""], rows)
    )
    data = {"rounds": rounds, "samples_s": samples, "median_s": medians, "ratio_to_import_torch": ratios, "met": met}
    return data, markdown


def main(argv: list[str] | None = None) -> int:
    from benchmarks.common import benchmark_parser

    parser = benchmark_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=5, help="paired rounds (default: 5)")
    parser.add_argument(
        "--quick", action="store_true", help="2 rounds, no model commands, nothing saved: checks the script"
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    rounds = 2 if args.quick else args.rounds
    with_model = not args.quick and smollm2_fetched()
    if not args.quick and not with_model:
        print("SmolLM2 is not fetched (attnkit models fetch smollm2): inspect and heads are left out", file=sys.stderr)
    # The commands write their pictures into a folder of their own, removed afterwards.
    with tempfile.TemporaryDirectory(prefix="attnkit-bench-startup-") as tmp:
        samples = measure(commands(Path(tmp), with_model), rounds)
    data, markdown = report(samples)
    print(markdown)
    if not args.quick:
        from benchmarks.common import write_results

        write_results("startup", {**data, "cpus": os.cpu_count()}, markdown, update_docs=args.update_docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
