"""Models by their Hugging Face name (``ORG/NAME``, at a revision), with ``huggingface_hub``.

A name resolves the way ``transformers`` resolves it, to a snapshot folder of the user's
Hugging Face cache (``HF_HUB_CACHE``, or ``HF_HOME/hub``, or ``~/.cache/huggingface/hub``):

1. A snapshot already in the cache that holds a whole checkpoint (``config.json``,
   ``tokenizer.json`` and safetensors weights) is used as it is, without a network request:
   a model downloaded earlier for ``transformers`` opens without a copy.
2. Otherwise, unless ``HF_HUB_OFFLINE=1``, the repository's file list is read and only
   :func:`wanted_files` are downloaded (configuration, safetensors weights and their
   index, tokenizer files), with ``huggingface_hub``'s progress bars on stderr. Pickled
   weights (``*.bin``, ``*.pt``, ``*.pth``, ``*.ckpt``) are never downloaded: unpickling
   can run arbitrary code.
   ``HF_TOKEN`` (or the token ``hf auth login`` saved) opens gated repositories.

The environment is read at each call, not when ``huggingface_hub`` was first imported.
This module imports neither PyTorch nor ``huggingface_hub`` until a name is resolved.
"""

from __future__ import annotations

import importlib
import os
import re
from pathlib import Path
from typing import Any

# A repository id as the Hub accepts it: an owner and a name, each of letters, digits, ``-``,
# ``_`` and ``.``, starting and ending with a letter, digit or ``_``, at most 96 characters;
# ``--`` and ``..`` nowhere (the cache spells ``/`` as ``--``), and no ``.git`` at the end.
HUB_NAME = re.compile(r"(?!.*(?:--|\.\.))(?!.*\.git$)\w(?:[\w.-]{0,94}\w)?/\w(?:[\w.-]{0,94}\w)?", re.ASCII)
# A revision: a branch, a tag or a commit hash. Git's own rules, and what keeps a revision a
# single name inside the cache's ``refs/`` folder: no ``..``, no leading ``/`` or ``-``, no
# control characters, spaces or ``~^:?*[\``.
REVISION = re.compile(r"(?!/|-)(?!.*(?:\.\.|//|@\{|/$|\.lock$|\.$))[^\x00-\x20\x7f~^:?*\[\\]{1,255}")

# Files taken from a repository's top level (besides the safetensors weights).
CONFIG_FILES = ("config.json", "generation_config.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
SAFETENSORS_INDEX = "model.safetensors.index.json"
# Shards as transformers names them: model-00001-of-00004.safetensors.
_SHARD = re.compile(r"model-\d+-of-\d+\.safetensors")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


class HubError(ValueError):
    """A Hugging Face name that cannot be opened; the one-line message says why and what to do."""


def is_hub_name(name: str) -> bool:
    """Whether ``name`` is a repository id the Hugging Face Hub accepts, ``ORG/NAME``."""
    return HUB_NAME.fullmatch(name) is not None


def check_revision(revision: str) -> None:
    """Refuse a revision that is no branch, tag or commit name.

    Raises:
        HubError: ``..``, a leading ``/`` or ``-``, NUL, control characters, spaces, or
            another character git refuses in a reference name.
    """
    if not isinstance(revision, str) or REVISION.fullmatch(revision) is None:
        raise HubError(
            f"revision must be a branch, tag or commit hash (no '..', leading '/' or '-', spaces or control "
            f"characters), got {revision!r}"
        )


def cache_folder() -> Path:
    """The Hugging Face cache, from the environment as it is now: ``HF_HUB_CACHE``,
    ``HUGGINGFACE_HUB_CACHE``, ``HF_HOME/hub``, ``XDG_CACHE_HOME/huggingface/hub``, or
    ``~/.cache/huggingface/hub``."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(variable):
            return Path(os.path.expandvars(os.environ[variable])).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.path.expandvars(os.environ["HF_HOME"])).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set to a true value now."""
    return any(
        os.environ.get(variable, "").strip().upper() in {"1", "ON", "YES", "TRUE"}
        for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def wanted_files(repo_files: list[str]) -> list[str]:
    """The files of a repository that attnkit downloads: ``config.json``,
    ``generation_config.json``, the tokenizer files, and the safetensors weights
    (``model.safetensors``, or ``model.safetensors.index.json`` and its
    ``model-*-of-*.safetensors`` shards), all from the top level. Other safetensors files
    (adapters, the same weights in another layout) and pickled weights are left out.

    Args:
        repo_files: every file path of the repository at the revision.

    Returns:
        The paths to download, in the order given.
    """
    top = set(repo_files)
    if "model.safetensors" in top:
        weights = {"model.safetensors"}
    elif SAFETENSORS_INDEX in top:
        weights = {SAFETENSORS_INDEX, *(f for f in top if _SHARD.fullmatch(f))}
    else:
        weights = set()
    keep = weights | set(CONFIG_FILES) | set(TOKENIZER_FILES)
    return [f for f in repo_files if f in keep]


def snapshot(name: str, revision: str | None = None) -> Path:
    """The snapshot folder of Hugging Face model ``name`` at ``revision``: from the cache,
    or downloaded (only :func:`wanted_files`) when online.

    Args:
        name: ``ORG/NAME``.
        revision: a branch, tag or commit hash (default ``"main"``).

    Returns:
        ``CACHE/models--ORG--NAME/snapshots/COMMIT``.

    Raises:
        HubError: offline and not in the cache; a repository or revision that does not
            exist; a gated or private repository without a token; a repository without
            safetensors weights; a download that failed.
        ImportError: ``huggingface_hub`` is not installed.
    """
    if revision is not None:
        check_revision(revision)
    hub = _huggingface_hub()
    errors = importlib.import_module("huggingface_hub.errors")
    where = f"{name}@{revision}" if revision else name
    cache = cache_folder()
    try:
        cached = Path(hub.snapshot_download(name, revision=revision, cache_dir=cache, local_files_only=True))
    except (errors.LocalEntryNotFoundError, FileNotFoundError, OSError):
        cached = None
    if cached is not None:
        _check_inside(cached, cache, name)
    if cached is not None and (_complete(cached) or offline()):
        return cached  # an incomplete one offline: the folder checks say what it lacks
    if offline():
        get = f"hf download {name}" + (f" --revision {revision}" if revision else "")
        raise HubError(
            f"{where} is not in the Hugging Face cache ({cache}) and HF_HUB_OFFLINE is set: unset HF_HUB_OFFLINE "
            f"to download it, or run `{get}` where the Hub is reachable"
        )
    token = os.environ.get("HF_TOKEN") or None
    try:
        info = hub.HfApi().model_info(name, revision=revision, token=token)
        repo_files = [s.rfilename for s in info.siblings or []]
        files = wanted_files(repo_files)
        if not any(f.endswith(".safetensors") for f in files):
            raise HubError(_no_safetensors(where, repo_files))
        folder = hub.snapshot_download(
            name,
            revision=info.sha,
            cache_dir=cache,
            token=token,
            allow_patterns=files,
        )
        # The branch or tag asked for points at the commit just downloaded (snapshot_download
        # recorded the commit under its own hash).
        if revision and revision != info.sha:
            _record_ref(cache, name, revision, info.sha)
        elif revision is None:
            _record_ref(cache, name, "main", info.sha)
    except errors.GatedRepoError:
        raise HubError(
            f"{name} is a gated repository: accept its terms on https://huggingface.co/{name}, then set HF_TOKEN "
            "to an access token or run `hf auth login`"
        ) from None
    except errors.RevisionNotFoundError:
        raise HubError(f"{name} has no revision {revision!r} (a branch, tag or commit hash)") from None
    except errors.RepositoryNotFoundError:
        login = "" if token else "; if it is private, set HF_TOKEN or run `hf auth login`"
        raise HubError(f"no model repository {name!r} on the Hugging Face Hub{login}") from None
    except (errors.HfHubHTTPError, errors.LocalEntryNotFoundError, OSError, *_network_errors()) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise HubError(
            f"cannot download {where} from the Hugging Face Hub: {reason}; check the network, or set "
            "HF_HUB_OFFLINE=1 to use only the cache"
        ) from None
    _check_inside(Path(folder), cache, name)
    return Path(folder)


def _network_errors() -> tuple[type[BaseException], ...]:
    """The errors of the HTTP libraries huggingface_hub uses, whichever its version (httpx2,
    httpx, requests), for a network that cannot be reached: a name that does not resolve, a
    refused connection, a timeout."""
    found: list[type[BaseException]] = []
    for module, error in (("httpx2", "HTTPError"), ("httpx", "HTTPError"), ("requests", "RequestException")):
        try:
            found.append(getattr(importlib.import_module(module), error))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def _check_inside(folder: Path, cache: Path, name: str) -> None:
    """Refuse a snapshot folder outside its repository's ``snapshots/`` in the cache: a
    ``refs/`` file that names ``../..`` would otherwise open any folder as the model."""
    snapshots = (cache / ("models--" + name.replace("/", "--")) / "snapshots").resolve()
    if folder.resolve().parent != snapshots:
        raise HubError(
            f"the Hugging Face cache resolves {name} to {folder}, outside {snapshots}: a refs/ file names "
            "something other than a commit; delete the repository's folder from the cache and download it again"
        )


def _huggingface_hub() -> Any:
    try:
        return importlib.import_module("huggingface_hub")
    except ImportError as err:
        raise ImportError(f"Hugging Face names need huggingface_hub ({err}): pip install 'attnkit[models]'") from None


def _complete(folder: Path) -> bool:
    """Whether a snapshot holds a whole checkpoint: configuration, tokenizer, weights."""
    if not (folder / "config.json").is_file() or not (folder / "tokenizer.json").is_file():
        return False
    return (folder / "model.safetensors").is_file() or (folder / SAFETENSORS_INDEX).is_file()


def _no_safetensors(where: str, repo_files: list[str]) -> str:
    pickled = sorted(f for f in repo_files if f.endswith(PICKLE_SUFFIXES))
    if pickled:
        return (
            f"{where} has only pickled weights ({', '.join(pickled[:3])}{', ...' if len(pickled) > 3 else ''}) and no "
            "safetensors: attnkit never unpickles, because unpickling runs arbitrary code; use a revision or copy "
            "of the model with model.safetensors"
        )
    return f"{where} has no safetensors weights (model.safetensors or {SAFETENSORS_INDEX}) at its top level"


def _record_ref(cache: Path, name: str, revision: str, commit: str) -> None:
    """Write ``refs/REVISION`` = ``commit`` in the repository's cache folder, as
    ``huggingface_hub`` does, so that an offline call finds the revision by its name."""
    if re.fullmatch(r"[0-9a-f]{40}", revision):
        return
    ref = cache / ("models--" + name.replace("/", "--")) / "refs" / revision
    try:
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(commit)
    except OSError:
        pass  # the cache still works online; an offline call will say the name is missing
