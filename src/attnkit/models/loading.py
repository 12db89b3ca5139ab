"""``load``: a name, a folder or a Hugging Face name → a checked checkpoint → its family →
a :class:`attnkit.models.Model`.

Which thing a string names, in this order (the first that applies wins):

1. a model attnkit fetches by name (``"smollm2"``, ``"minilm"``), from attnkit's cache;
2. an existing folder (``./TinyLlama/TinyLlama-1.1B-Chat-v1.0`` on disk is that folder);
3. a Hugging Face name ``ORG/NAME`` (:mod:`attnkit.models.checkpoints.hub`): the snapshot folder in the
   Hugging Face cache, downloaded first when online and missing.

Whichever it is, the folder then goes through the same checks (:mod:`attnkit.models.checkpoints`).
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnkit.models.checkpoints.errors import CheckpointError
from attnkit.models.checkpoints.files import read_config, resolve, weight_files
from attnkit.models.checkpoints.hub import is_hub_name, snapshot
from attnkit.models.checkpoints.manifest import read_manifest, verify_manifest
from attnkit.models.checkpoints.memory import check_fits, weight_bytes
from attnkit.models.checkpoints.quantization import FP8_DTYPES, dequantize, dequantized_headers, read_quantization
from attnkit.models.checkpoints.registry import MODELS
from attnkit.models.checkpoints.tokenizer import Tokenizer
from attnkit.models.checkpoints.weights import check_weight_map, load_tensors, read_headers
from attnkit.models.families.bridge import bridgeable, load_bridged
from attnkit.models.families.family import ModelFamily
from attnkit.models.families.meta_device import buffer_bytes, materialize_buffers
from attnkit.models.families.table import FAMILIES, unsupported_model_type
from attnkit.models.model import Model
from attnkit.models.model.names import DTYPE_NAMES

# The dtypes ``load(dtype=...)`` and ``--dtype`` take by name.
DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_NAMES}


def locate(name_or_path: str | os.PathLike[str], revision: str | None = None) -> tuple[str, Path]:
    """The display name and checkpoint folder of a fetched model's name, a folder or a
    Hugging Face name, in that order of precedence.

    Args:
        name_or_path: ``"smollm2"``, a folder, or ``ORG/NAME``.
        revision: a branch, tag or commit of a Hugging Face name (default ``main``).

    Returns:
        ``(name, folder)``: a Hugging Face model's name is ``ORG/NAME`` (``ORG/NAME@REV``
        with a revision) and its folder the snapshot.

    Raises:
        ModelNotFound: a fetched model's name not fetched yet, or a string that is none of
            the three.
        HubError: a Hugging Face name that cannot be opened (see
            :func:`attnkit.models.checkpoints.hub.snapshot`).
        ValueError: a revision given with a fetched name or a folder.
    """
    key = str(name_or_path)
    if key in MODELS or Path(key).expanduser().exists() or not is_hub_name(key):
        if revision is not None:
            raise ValueError(f"a revision applies to Hugging Face names (ORG/NAME); {key!r} is not one")
        return resolve(name_or_path)
    return (key if revision is None else f"{key}@{revision}"), snapshot(key, revision)


def choose_dtype(dtype: torch.dtype | str, device: torch.device, hf_config: Mapping[str, Any]) -> torch.dtype:
    """The dtype of the weights: ``dtype`` itself, or for ``"auto"`` float32 on the CPU and
    the checkpoint's own (``torch_dtype`` or ``dtype`` of ``config.json``, when float32,
    bfloat16 or float16) elsewhere.

    Raises:
        TypeError: neither ``"auto"`` nor one of :data:`DTYPES`, by name or as a
            ``torch.dtype`` (float64 and the float8 kinds are refused: attnkit's modules
            compute in these three).
    """
    if isinstance(dtype, str):
        if dtype == "auto":
            if device.type == "cpu":
                return torch.float32
            stated = hf_config.get("torch_dtype", hf_config.get("dtype"))
            return DTYPES.get(stated, torch.float32) if isinstance(stated, str) else torch.float32
        if dtype in DTYPES:
            return DTYPES[dtype]
    if not isinstance(dtype, torch.dtype) or dtype not in DTYPES.values():
        raise TypeError(
            f"dtype must be 'auto', {', '.join(map(repr, DTYPES))} or one of those torch dtypes, got {dtype!r}"
        )
    return dtype


def load(
    name_or_path: str | os.PathLike[str],
    *,
    revision: str | None = None,
    dtype: torch.dtype | str = "auto",
    device: str | torch.device = "cpu",
) -> Model:
    """Load a fetched model by name, a local Hugging Face folder, or a Hugging Face name
    (``ORG/NAME``) onto attnkit modules.

    The folder must hold ``config.json`` (a ``model_type`` of
    :data:`attnkit.models.families.table.FAMILIES`, or of a causal language model of
    ``transformers`` whose attention runs through its attention interface, loaded through
    the bridge: :mod:`attnkit.models.families.bridge`), safetensors weights (sharded too, with
    ``model.safetensors.index.json``) and ``tokenizer.json``. Each safetensors header is checked against
    its file's size, and a fetched model's files against the sizes and SHA-256 recorded at
    fetch time. The weights' size in ``dtype`` is compared with the memory free on
    ``device`` (:mod:`attnkit.models.checkpoints.memory`) before any is read. Weights are
    memory-mapped and become the parameters without copies or random initialisation.

    Args:
        name_or_path: ``"smollm2"``, ``"minilm"``, a folder, or ``ORG/NAME`` (precedence
            in this order: :func:`locate`).
        revision: the branch, tag or commit of a Hugging Face name (default ``main``).
        dtype: the weights' floating dtype: a ``torch.dtype``, ``"float32"``,
            ``"bfloat16"``, ``"float16"``, or ``"auto"`` (float32 on the CPU, the
            checkpoint's ``torch_dtype`` on a GPU). Runs return attention maps, logits
            and hidden states in float32 whatever it is.
        device: where to put them.

    Returns:
        A :class:`Model` in evaluation mode.

    Raises:
        ModelNotFound: a known model not fetched yet (the message names
            ``attnkit models fetch NAME``), or neither a known name, a folder nor a
            Hugging Face name.
        HubError: a Hugging Face name absent from the cache while offline, gated without
            a token, unknown, or without safetensors weights.
        CheckpointError: a corrupt, truncated, crafted or unsupported checkpoint (a
            ``ValueError`` whose message names the file and the field at fault): sizes in
            ``config.json`` beyond :data:`attnkit.models.checkpoints.config_reader.CONFIG_LIMITS`, weights
            that do not fit the configuration, a tokenizer with an id beyond the embedding's
            rows: all checked before any module is built; weights that are not finite.
        MemoryEstimateError: weights larger than the memory free on ``device``.
        ValueError: a missing ``config.json`` or weights; a revision with a fetched name
            or a folder.
        TypeError: a ``dtype`` other than ``"auto"``, float32, bfloat16 and float16,
            before anything is read.
    """
    target = torch.device(device)
    choose_dtype(dtype, target, {})  # refuse a bad dtype before anything is read
    name, folder = locate(name_or_path, revision)
    manifest = read_manifest(folder)
    if manifest is not None:
        verify_manifest(folder, manifest, name)
    hf_config = read_config(folder)
    model_type = hf_config.get("model_type")
    weights_dtype = choose_dtype(dtype, target, hf_config)
    if isinstance(model_type, str) and model_type not in FAMILIES and bridgeable(model_type):
        return _load_bridged(name, folder, hf_config, weights_dtype, target)
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise CheckpointError(folder / "config.json", unsupported_model_type(model_type), field="model_type")
    family = FAMILIES[model_type]
    files = weight_files(folder)
    # Everything the folder says is compared before any weight is read, and the module is
    # built on the ``meta`` device (no storage), so that a crafted config.json cannot make
    # this allocate more than the weights themselves.
    quantization = read_quantization(hf_config, folder / "config.json")
    stored = read_headers(files)
    check_weight_map(folder, stored)
    headers = dequantized_headers(stored, quantization)  # the tensors as they will be loaded
    config = family.read_config(hf_config, path=folder / "config.json")
    module = family.build(config)
    _check_weights_fit(module, family, config, headers, folder)
    tokenizer = _tokenizer(folder, family.eos_token_ids(config, folder), config.vocab_size)
    smaller = "" if weights_dtype.itemsize <= 2 else "load in bfloat16 (--dtype bfloat16) to halve it, or "
    tables = buffer_bytes(module)  # rotary cosines and sines, ALiBi slopes: made at load
    check_fits(
        weight_bytes(headers, weights_dtype) + tables,
        target,
        what=f"the weights of {name} in {str(weights_dtype).removeprefix('torch.')}"
        + (" and its position tables" if tables else ""),
        advice=f"{smaller}free memory or use a smaller model",
    )
    tensors = load_tensors(files, dtype=weights_dtype, exact=stored.keys() - headers.keys() | _fp8(stored))
    if quantization is not None:
        tensors = dequantize(tensors, quantization, weights_dtype)
    state, _ = family.state_dict_from_hf(tensors, config)
    module.load_state_dict(state, strict=True, assign=True)
    materialize_buffers(module)
    family.finish(module, config)
    module = module.to(target).eval()
    return Model(name=name, model_family=family, path=folder, config=config, module=module, tokenizer=tokenizer)


def _load_bridged(
    name: str, folder: Path, hf_config: dict[str, Any], dtype: torch.dtype, device: torch.device
) -> Model:
    """A ``model_type`` without a family, through ``transformers`` (:mod:`attnkit.models.families.bridge`),
    named with its label (``tiny-olmo2 (bridge:olmo2)``) so that every record and title says so."""
    family, config, module = load_bridged(folder, hf_config, dtype=dtype, device=device, name=name)
    tokenizer = _tokenizer(folder, family.eos_token_ids(config, folder), config.vocab_size)
    labelled = f"{name} ({family.name})"
    return Model(name=labelled, model_family=family, path=folder, config=config, module=module, tokenizer=tokenizer)


def _tokenizer(folder: Path, eos: tuple[int, ...], vocab_size: int) -> Tokenizer:
    """The folder's ``tokenizer.json``, whose ids must fit the embedding.

    Raises:
        CheckpointError: a token id beyond ``vocab_size``.
    """
    tokenizer_path = folder / "tokenizer.json"
    tokenizer = Tokenizer.from_file(tokenizer_path, eos_token_ids=eos)
    if tokenizer.largest_id >= vocab_size:
        raise CheckpointError(
            tokenizer_path,
            f"has token id {tokenizer.largest_id}, but the model's embedding has "
            f"vocab_size={vocab_size} rows (config.json)",
            field="vocab_size",
        )
    return tokenizer


_LAYER_INDEX = re.compile(r"^(\w+)\.layers\.(\d+)\.")


def _fp8(headers: Mapping[str, tuple[Path, str, list[int]]]) -> set[str]:
    """The names of the fp8 tensors."""
    return {key for key, (_, kind, _) in headers.items() if kind in FP8_DTYPES}


def _layer_counts(state: Mapping[str, Any]) -> dict[str, int]:
    """The number of layers of each stack (``encoder``, ``decoder``) that attnkit keys of a
    state dict name."""
    indices: dict[str, set[int]] = {}
    for key in state:
        if match := _LAYER_INDEX.match(key):
            indices.setdefault(match.group(1), set()).add(int(match.group(2)))
    return {stack: len(found) for stack, found in indices.items()}


def _check_weights_fit(
    module: nn.Module,
    family: ModelFamily,
    config: Any,
    headers: dict[str, tuple[Path, str, list[int]]],
    folder: Path,
) -> None:
    """Check that the tensors the safetensors headers describe are exactly the ones
    ``module``, the family's build of ``config`` on the ``meta`` device, needs.

    Raises:
        CheckpointError: a layer count that differs from the weights', missing, unexpected
            (a tensor the module would not use: every tensor is used, but for the known
            redundant ones each family drops, listed in docs/models.md), misshaped or
            non-floating weights.
    """
    where = next(iter(headers.values()))[0] if len({f for f, _, _ in headers.values()}) == 1 else folder
    expected = module.state_dict()
    described = {
        key: torch.empty(shape, dtype=torch.float32 if dtype in _FLOAT_DTYPES else torch.int64, device="meta")
        for key, (_, dtype, shape) in headers.items()
    }
    state, unknown = family.state_dict_from_hf(described, config)
    # A tensor's name in the file (a piece of a fused tensor goes by attnkit's name): the name
    # every message below gives.
    file_name = {id(t): key for key, t in described.items()}
    # A tensor a family renames to a key the module does not have is unused too.
    unknown = [*unknown, *sorted(file_name.get(id(state[key]), key) for key in set(state) - set(expected))]
    # Depth first: the clearest message when config.json and the weights disagree on it.
    fields = dict(getattr(config, "layer_count_fields", ()))
    for stack, want in _layer_counts(expected).items():
        got = _layer_counts(state).get(stack, 0)
        if got != want:
            field = fields.get(stack, "num_hidden_layers")
            raise CheckpointError(
                folder / "config.json", f"{field} is {want}, but the weights hold {got} layers", field=field
            )
    missing = sorted(set(expected) - set(state))
    if missing or unknown:
        raise CheckpointError(
            where,
            f"the weights do not fit the configuration: missing {_few(missing)}, unexpected {_few(unknown)}",
            field=(missing or unknown)[0],
        )
    wrong = [
        (file_name.get(id(state[key]), key), list(state[key].shape), list(t.shape))
        for key, t in expected.items()
        if state[key].shape != t.shape
    ]
    if wrong:
        shown = [f"{key} is {got}, expected {want}" for key, got, want in wrong]
        raise CheckpointError(
            where, f"weights of the wrong shape for config.json's sizes: {_few(shown)}", field=wrong[0][0]
        )
    integers = sorted({file_name.get(id(t), key) for key, t in state.items() if not t.is_floating_point()})
    if integers:
        raise CheckpointError(where, f"weights must be floating point: {_few(integers)}", field=integers[0])


_FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16"})


def _few(items: list[str], limit: int = 5) -> str:
    shown = ", ".join(itertools.islice(items, limit))
    return f"[{shown}{', ...' if len(items) > limit else ''}]" if items else "[]"
