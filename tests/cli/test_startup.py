"""What the ``attnkit`` command does to start quickly: PyTorch's threads wait asleep."""

from __future__ import annotations

import os
import subprocess
import sys

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
