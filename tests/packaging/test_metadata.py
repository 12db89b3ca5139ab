"""The project's metadata in pyproject.toml as packaging tools read it today: the license is an
SPDX expression (not the TOML table setuptools deprecates) and the files it names exist."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_license_is_an_spdx_expression_with_its_text_shipped():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT"
    assert project["license-files"], "license-files names the license's text"
    for pattern in project["license-files"]:
        matched = list(ROOT.glob(pattern))
        assert matched, f"license-files pattern {pattern!r} matches no file in {ROOT}"
    assert "MIT License" in (ROOT / "LICENSE").read_text()


def test_the_build_requires_a_setuptools_that_reads_license_expressions():
    # setuptools reads project.license as an SPDX string and project.license-files from 77.0 on.
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    assert "setuptools>=77" in requires
