"""Crafted ``attnkit-manifest.json`` files: every one is read, or refused with a ValueError
naming the field, never a TypeError, KeyError or RecursionError, and never a look at a
file outside the model's folder."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnkit.cli import main
from attnkit.models.checkpoints.manifest import read_manifest, verify_manifest
from attnkit.models.checkpoints.registry import MANIFEST
from attnkit.models.checkpoints.store import available

CONFIG = b'{"model_type": "llama"}'
GOOD = {"size": len(CONFIG), "sha256": hashlib.sha256(CONFIG).hexdigest(), "mtime_ns": 0}


def _folder(tmp_path: Path, manifest: str | dict) -> Path:
    folder = tmp_path / "cache" / "crafted"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_bytes(CONFIG)
    text = manifest if isinstance(manifest, str) else json.dumps({"family": "llama", **manifest})
    (folder / MANIFEST).write_text(text)
    return folder


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ({"files": {"config.json": 5}}, r"files\['config.json'\] must be an object with size and sha256"),
        ({"files": {"config.json": {}}}, r"files\['config.json'\].size is missing or not valid"),
        ({"files": {"config.json": {**GOOD, "size": "5"}}}, r"files\['config.json'\].size is missing or not valid"),
        ({"files": {"config.json": {**GOOD, "sha256": 7}}}, r"files\['config.json'\].sha256 is missing or not valid"),
        ({"files": {"config.json": {**GOOD, "mtime_ns": -1}}}, r"files\['config.json'\].mtime_ns is missing"),
        ({"files": {"../../../../etc/passwd": GOOD}}, r"files\['../../../../etc/passwd'\] is not the name of a file"),
        ({"files": {"/etc/passwd": GOOD}}, r"files\['/etc/passwd'\] is not the name of a file in the folder"),
        ({"files": {"..": GOOD}}, r"is not the name of a file in the folder"),
        ({"files": {}, "family": 3}, r"'family' must be a string"),
        ({"files": []}, r"it has no 'files' object"),
        ("[" * 200_000 + "]" * 200_000, r"nested too deep to read"),
        (" " * (2**20 + 1), r"larger than 1048576 bytes"),
    ],
)
def test_crafted_manifests_are_refused_naming_the_field(tmp_path, manifest, message):
    folder = _folder(tmp_path, manifest)
    with pytest.raises(ValueError, match=message):
        read_manifest(folder)
    assert available(home=tmp_path / "cache") == []  # the listing leaves it out instead of failing


def test_models_list_survives_a_deeply_nested_manifest(tmp_path, monkeypatch, capsys):
    # Before: RecursionError out of `attnkit models list`.
    _folder(tmp_path, "{" + '"a":{' * 200_000 + "}" * 200_001)
    monkeypatch.setenv("ATTNKIT_HOME", str(tmp_path / "cache"))
    code = main(["models", "list"])
    out, err = capsys.readouterr()
    assert code == 0 and "Traceback" not in err


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=70)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8,
)
names = st.one_of(
    st.sampled_from(["config.json", "missing.bin", "../x", "/etc/passwd", ".", "..", "a/b", "", "C:\\x", "\x00"]),
    st.text(max_size=12),
)
entries = st.one_of(
    json_values,
    st.fixed_dictionaries({}, optional={"size": json_values, "sha256": json_values, "mtime_ns": json_values}),
    st.just(GOOD),
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(files=st.one_of(json_values, st.dictionaries(names, entries, max_size=3)), family=json_values)
def test_fuzzed_manifests_are_read_or_refused_with_a_value_error(tmp_path_factory, files, family):
    folder = _folder(tmp_path_factory.mktemp("m"), {"files": files, "family": family})
    outside = []
    real_stat = os.stat

    def watched_stat(path, *args, **kwargs):
        if not os.path.abspath(path).startswith(str(folder)):
            outside.append(path)
        return real_stat(path, *args, **kwargs)

    try:
        manifest = read_manifest(folder)
        assert manifest is not None
        os.stat = watched_stat
        try:
            verify_manifest(folder, manifest, "crafted")
        finally:
            os.stat = real_stat
    except ValueError as err:
        assert str(err).startswith(str(folder)), err
    assert not outside, outside
