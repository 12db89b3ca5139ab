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
import resource
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


def run_once(argv: list[str]) -> tuple[float, float]:
    """Wall time and processor time (user and system, every thread) of one fresh process,
    which must end as the command says it does."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    expected = 2 if argv[-2:] == ["--method", "grad"] else 0
    if done.returncode != expected:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}, expected {expected}:\n{done.stderr[-2000:]}")
    return seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(argvs: dict[str, list[str]], rounds: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Every contender once per round, in alternating order (after one unmeasured round
    that warms the file cache).

    Returns:
        ``(wall seconds, processor seconds)``, each a list per contender.
    """
    for argv in argvs.values():
        run_once(argv)
    samples: dict[str, list[float]] = {name: [] for name in argvs}
    processor: dict[str, list[float]] = {name: [] for name in argvs}
    order = list(argvs.items())
    for round_ in range(rounds):
        for name, argv in order if round_ % 2 == 0 else order[::-1]:
            wall, cpu = run_once(argv)
            samples[name].append(wall)
            processor[name].append(cpu)
    return samples, processor


def smollm2_fetched() -> bool:
    from attnkit.models.checkpoints.registry import home

    return (home() / "smollm2" / "config.json").is_file()


def report(samples: dict[str, list[float]], processor: dict[str, list[float]], load: float) -> tuple[dict, str]:
    from benchmarks.common import markdown_table

    medians = {name: statistics.median(times) for name, times in samples.items()}
    baseline = medians[BASELINE]
    ratios = {name: seconds / baseline for name, seconds in medians.items()}
    cpu_medians = {name: statistics.median(times) for name, times in processor.items()}
    cpu_ratios = {name: seconds / cpu_medians[BASELINE] for name, seconds in cpu_medians.items()}
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
            f"{cpu_medians[name]:.2f} ({cpu_ratios[name]:.2f}×)",
            targets.get(name, ""),
            ("met" if met[name] else "missed") if name in met else "",
        ]
        for name in samples
    ]
    rounds = len(samples[BASELINE])
    markdown = (
        "## Start-up: the `attnkit` command against `import torch`\n\n"
        f"`python benchmarks/bench_startup.py`: each command as a fresh process, {rounds} rounds in "
        'alternating order with the baseline `python -c "import torch"`; medians of wall time, and of '
        "processor time (user and system, every thread), which a machine busy with other work "
        f"lengthens less. The model commands run on SmolLM2 (fetched) with the sentence "
        f'"{TEXT}". Load average when the run ended: {load:.1f}.\n\n'
        + markdown_table(["command", "median (s)", "ratio to import torch", "processor (s, ratio)", "target", ""], rows)
    )
    data = {
        "rounds": rounds,
        "samples_s": samples,
        "median_s": medians,
        "ratio_to_import_torch": ratios,
        "processor_samples_s": processor,
        "processor_median_s": cpu_medians,
        "processor_ratio_to_import_torch": cpu_ratios,
        "load_average": load,
        "met": met,
    }
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
        samples, processor = measure(commands(Path(tmp), with_model), rounds)
    data, markdown = report(samples, processor, os.getloadavg()[0])
    print(markdown)
    if not args.quick:
        from benchmarks.common import write_results

        write_results("startup", {**data, "cpus": os.cpu_count()}, markdown, update_docs=args.update_docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
