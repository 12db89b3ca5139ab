"""Every benchmark script answers ``--help`` and a mistyped option from its own arguments,
before it imports PyTorch or touches a model, and writes nothing: not in the model cache,
not in the home folder, not in the repository."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted((ROOT / "benchmarks").glob("bench_*.py")) + [
    ROOT / "benchmarks" / n for n in ("run_all.py", "tune_linear_kernel.py")
]
HEAVY = ("torch", "attnkit", "transformers", "httpx", "matplotlib", "numpy")

# Runs a script as ``python SCRIPT ARGS`` would, then names the heavy modules it imported.
RUNNER = f"""
import runpy, sys
script, *args = sys.argv[1:]
sys.argv = [script, *args]
try:
    runpy.run_path(script, run_name="__main__")
finally:
    print("imported:", sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)
"""


def snapshot(folder: Path) -> dict[str, int]:
    """Every file under ``folder`` with its modification time."""
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


def run(script: Path, args: list[str], home: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "HOME": str(home),
        "ATTNKIT_HOME": str(home / "attnkit-cache"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "HF_HOME": str(home / "hf"),
        # Bytecode caches are the interpreter's writing, not the script's.
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    return subprocess.run(
        [sys.executable, "-c", RUNNER, str(script), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=home,
        timeout=120,
    )


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_help_and_a_mistyped_option_import_nothing_heavy_and_write_nothing(script, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    watched = [ROOT / "benchmarks", ROOT / "docs"]
    before = [snapshot(folder) for folder in watched]

    shown = run(script, ["--help"], home)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("usage:") and "--update-docs" in shown.stdout
    assert "imported: []" in shown.stderr

    mistyped = run(script, ["--no-such-option"], home)
    assert mistyped.returncode == 2
    assert "unrecognized arguments: --no-such-option" in mistyped.stderr
    assert "imported: []" in mistyped.stderr

    assert not list(home.iterdir())
    assert [snapshot(folder) for folder in watched] == before
