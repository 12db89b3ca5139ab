"""The package as a user gets it: ``python -m build`` makes a wheel that installs into a fresh
virtual environment which already has torch, without pip touching torch, and the installed
``attnkit`` command runs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*command: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    # Without PYTHONPATH: the new environment must not see this checkout's sources.
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    done = subprocess.run(
        [str(part) for part in command], capture_output=True, text=True, cwd=cwd, timeout=600, env=env
    )
    assert done.returncode == 0, f"{command} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.slow
def test_the_wheel_installs_beside_an_existing_torch_and_runs(tmp_path):
    pytest.importorskip("build")
    # No build isolation: setuptools comes from the development extras, so nothing is downloaded.
    built = run(
        sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", tmp_path / "dist", ROOT, cwd=tmp_path
    )
    # setuptools warns about deprecated metadata (a license table, say) that later releases refuse.
    assert "deprecated" not in (built.stdout + built.stderr).lower(), built.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("attnkit-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(f"attnkit-{wheel.name.split('-')[1]}.dist-info/METADATA").decode()
    # The viewer's static files travel with the code; the tests and docs do not.
    assert "attnkit/viz/viewer/static/viewer.js" in names and "attnkit/__main__.py" in names
    assert not any(name.startswith(("tests/", "docs/")) for name in names)
    # The license as an SPDX expression, its text inside the wheel.
    assert "License-Expression: MIT" in metadata.splitlines()
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)

    # A fresh environment that sees this one's packages (torch, numpy, pip) but not its own
    # attnkit: a folder of links to everything else, named in a .pth file. (Its own pip
    # would bring an older setuptools that hides the one torch needs.)
    host = tmp_path / "host-packages"
    host.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if "attnkit" not in entry.name.lower():
            (host / entry.name).symlink_to(entry)
    env = tmp_path / "venv"
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    (site / "host-packages.pth").write_text(f"{host}\n")
    torch_before = run(python, "-c", "import torch; print(torch.__version__, torch.__file__)").stdout

    # --no-index: pip may not download anything, so it can only use the torch that is there.
    install = run(python, "-m", "pip", "install", "--no-index", "--disable-pip-version-check", wheel)
    assert "torch" not in install.stdout.split("Successfully installed")[-1]
    installed = json.loads(run(python, "-m", "pip", "list", "--format", "json", "--path", site).stdout)
    assert [p["name"] for p in installed] == ["attnkit"]
    assert run(python, "-c", "import torch; print(torch.__version__, torch.__file__)").stdout == torch_before

    attnkit = env / "bin" / "attnkit"
    where = run(python, "-c", "import attnkit; print(attnkit.__file__)").stdout
    assert where.startswith(str(site))  # the wheel's attnkit, not this checkout's
    from attnkit import __version__

    assert run(attnkit, "--version").stdout == f"attnkit {__version__}\n"
    explained = run(attnkit, "explain", cwd=tmp_path).stdout
    # the worked example's context vector, within one unit of the printed last digit
    context = re.search(r"^context +\[([^\]]*)\]", explained, re.M)
    assert context, explained
    assert [float(x) for x in context.group(1).split(",")] == pytest.approx([0.1575, 0.1575, 0.1316, 0.1575], abs=1e-4)
