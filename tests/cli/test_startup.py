"""What the ``attnkit`` command does to start quickly: PyTorch's threads wait asleep."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Runs `attnkit --version` in a fresh interpreter and prints the OpenMP wait policy after.
VERSION_THEN_POLICY = """
import os
from attnkit.cli import main
try:
    main(["--version"])
except SystemExit:
    pass
print(os.environ.get("OMP_WAIT_POLICY"))
"""


def policy_after_the_command(**env: str) -> str:
    environment = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | env
    done = subprocess.run(
        [sys.executable, "-c", VERSION_THEN_POLICY], capture_output=True, text=True, env=environment, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()[-1]


def test_pytorch_threads_wait_asleep_unless_the_user_said_otherwise():
    assert policy_after_the_command() == "PASSIVE"
    assert policy_after_the_command(OMP_WAIT_POLICY="ACTIVE") == "ACTIVE"


# Runs `attnkit inspect` in a fresh interpreter, as its process's command (no argv given)
# and then called with an argv list, with a model load that records whether the garbage
# collector runs and then fails; prints what it saw.
COLLECTOR_DURING_LOAD = """
import gc, sys
import attnkit.models
from attnkit.cli import main

seen = []

def load(name, **options):
    seen.append(gc.isenabled())
    raise ValueError("no model here")

attnkit.models.load = load
sys.argv = ["attnkit", "inspect", "hi", "--model", "smollm2", "--out", sys.argv[1]]
as_process = main()
after_process = gc.isenabled()
as_call = main(["inspect", "hi", "--model", "smollm2", "--out", sys.argv[1]])
print(as_process, seen[0], after_process, as_call, seen[1], gc.isenabled())
"""

# Pauses the collector for a start-up, ends it, and prints the collector's state.
START_UP_ENDED = """
import gc
from attnkit.cli.common import pause_collection, resume_collection

pause_collection()
paused = gc.isenabled()
resume_collection()
print(paused, gc.isenabled(), gc.get_freeze_count() > 0)
"""


def run_script(script: str, *argv: str) -> str:
    done = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()[-1]


@pytest.mark.slow
def test_the_collector_waits_for_the_model_only_in_a_process_of_its_own(tmp_path):
    """As the process's command, the start-up runs without the garbage collector, which
    is back once the command ends (here: on the load's error); called with arguments from
    another program, the command leaves the collector alone."""
    assert run_script(COLLECTOR_DURING_LOAD, str(tmp_path)) == "2 False True 2 True True"


def test_the_end_of_start_up_freezes_what_it_created_and_collects_again():
    assert run_script(START_UP_ENDED) == "False True True"
