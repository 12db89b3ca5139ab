"""How much memory loading or running a model will take, checked before it is allocated.

One estimator for every entry: the weights in the chosen dtype at load; the attention maps,
the cached activations and the logits a run asks for; the KV cache of a generation. Each
is compared with the memory free where it will live (:func:`available_memory`), and a
request that does not fit is refused with one line naming the estimate, the limit and what
lowers it, before anything is allocated.

Shape letters: ``b`` batch, ``h`` query heads, ``h_kv`` key/value heads, ``s`` tokens,
``d`` head dim, ``e`` model dim, ``v`` vocabulary.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnkit.nn.hooks import NameFilter, cached_points

# Caps the memory attnkit believes it may use (a size: "8GB", "512MB", or bytes), below
# what the system reports; for sharing a machine, and for tests.
LIMIT_VARIABLE = "ATTNKIT_MEMORY_LIMIT"
# What lowers the estimate of a run that returns attention maps, in a refusal.
MAP_ADVICE = (
    "ask for fewer heads (--heads), query rows (--rows) or layers (--layers), fewer cached activations, "
    "or a shorter text"
)

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
_CGROUP_FILES = (
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # cgroup v2
    ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),  # v1
)


class MemoryEstimateError(ValueError):
    """A load or run whose estimated memory exceeds what is available; nothing was allocated.

    Attributes:
        needed: the estimate, in bytes.
        available: the limit it was compared with, in bytes.
    """

    def __init__(self, message: str, *, needed: int, available: int) -> None:
        super().__init__(message)
        self.needed = needed
        self.available = available


def gib(size: float) -> str:
    """A byte count in GiB (MiB below one GiB, KiB below one MiB), for messages."""
    if size >= 2**30:
        return f"{size / 2**30:.1f} GiB"
    return f"{size / 2**20:.0f} MiB" if size >= 2**20 else f"{size / 2**10:.0f} KiB"


def available_memory(device: torch.device | str = "cpu") -> tuple[int, str]:
    """The memory free for new tensors on ``device`` now, and what that figure is.

    On the CPU: ``MemAvailable`` of ``/proc/meminfo``, or less when this process's cgroup
    has a lower limit (its limit less its usage). On CUDA: the free memory the driver
    reports (``torch.cuda.mem_get_info``) plus what PyTorch's caching allocator holds
    unused (reserved but not allocated), which the driver counts as taken though new
    tensors reuse it. :data:`LIMIT_VARIABLE`, when set, caps either. Where nothing can
    be read (another system), no limit.

    Returns:
        ``(bytes, description)``, e.g. ``(12_000_000_000, "available RAM")``.

    Raises:
        ValueError: :data:`LIMIT_VARIABLE` is not a size.
    """
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        unused = max(int(torch.cuda.memory_reserved(device)) - int(torch.cuda.memory_allocated(device)), 0)
        found = [(int(free) + unused, f"free memory on {device} (the driver's free memory and PyTorch's unused cache)")]
    else:
        found = _system_memory()
    configured = os.environ.get(LIMIT_VARIABLE)
    if configured:
        found.append((_parse_size(configured), f"{LIMIT_VARIABLE}={configured}"))
    if not found:
        return 2**63, "no known limit"
    return min(found)


def check_fits(needed: int, device: torch.device | str, *, what: str, advice: str) -> None:
    """Refuse ``needed`` bytes that exceed :func:`available_memory` on ``device``.

    Args:
        needed: the estimate, in bytes.
        device: where they would be allocated.
        what: what they are, e.g. ``"the weights of org/model in float32"``.
        advice: what lowers the estimate, e.g. ``"load in bfloat16 (--dtype bfloat16)"``.

    Raises:
        MemoryEstimateError: over the limit, naming the estimate, the limit and ``advice``.
    """
    available, description = available_memory(device)
    if needed > available:
        raise MemoryEstimateError(
            f"{what} would take about {gib(needed)}, more than the {gib(available)} of {description}; {advice}",
            needed=needed,
            available=available,
        )


def weight_bytes(headers: dict[str, tuple[Path, str, list[int]]], dtype: torch.dtype) -> int:
    """The bytes of a checkpoint's tensors once loaded: floating ones in ``dtype``, the
    others (and fp8 ones, which :mod:`attnkit.models.checkpoints.quantization` turns into
    floating ones first) at their own size.

    Args:
        headers: tensor name → ``(file, safetensors dtype, shape)`` (as
            :func:`attnkit.models.checkpoints.weights.read_headers` gives them).
        dtype: the floating dtype of the loaded weights.
    """
    size = dtype.itemsize
    total = 0
    for _, kind, shape in headers.values():
        numel = 1
        for n in shape:
            numel *= n
        total += numel * (size if kind in {"F64", "F32", "F16", "BF16"} else _INTEGER_BYTES.get(kind, 8))
    return total


_INTEGER_BYTES = {"I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def attention_bytes(
    num_layers: int, num_heads: int, batches: Iterable[tuple[int, int]], *, rows: int | None = None
) -> int:
    """The float32 attention maps ``[b, h, n_r, s]`` of ``num_layers`` layers, over batches
    of ``(b, s)``: ``num_heads`` heads (those asked for), ``n_r = min(rows, s)`` query rows
    (every row for ``None``), every key."""
    return sum(num_layers * num_heads * b * (s if rows is None else min(rows, s)) * s * 4 for b, s in batches)


def kv_cache_bytes(num_layers: int, num_kv_heads: int, head_dim: int, positions: int, itemsize: int) -> int:
    """The keys and values ``[1, h_kv, positions, d]`` a generation caches in every layer."""
    return 2 * num_layers * num_kv_heads * positions * head_dim * itemsize


@dataclass(frozen=True)
class Widths:
    """The sizes an activation per token can have.

    Attributes:
        h: query heads.
        h_kv: key/value heads.
        d: head dim.
        e: model dim.
        ffn: the feed-forward hidden dim.
    """

    h: int
    h_kv: int
    d: int
    e: int
    ffn: int


def activation_bytes(points: Iterable[tuple[int, str]], *, b: int, s: int, widths: Widths, itemsize: int) -> int:
    """An upper bound on the activations a run caches at hook points.

    Args:
        points: ``(number of position dimensions, name)`` of every point cached: a point
            with two (``pattern``, ``scores``) holds ``[b, h, s, s]``; by the end of its
            name, ``q``/``z`` ``[b, s, h, d]``, ``k``/``v`` ``[b, s, h_kv, d]`` (and so
            the queries and keys before a rotary encoding, ``q_unrotated``/``k_unrotated``),
            ``result`` (each head's output in the model dim) ``[b, s, h, e]``, a norm's
            ``scale`` ``[b, s, 1]``, the residual stream and the blocks' outputs
            ``[b, s, e]``, any other (the feed-forward's) ``[b, s, max(e, ffn)]``.
        b: the batch size.
        s: the tokens per row.
        widths: the model's sizes.
        itemsize: bytes per element in the model's dtype.
    """
    w = widths
    per_token = {"q": w.h * w.d, "z": w.h * w.d, "k": w.h_kv * w.d, "v": w.h_kv * w.d, "result": w.h * w.e, "scale": 1}
    per_token |= {"q_unrotated": per_token["q"], "k_unrotated": per_token["k"]}
    per_token |= dict.fromkeys(("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "embed", "final"), w.e)
    total = 0
    for positions, name in points:
        if positions >= 2:
            total += b * w.h * s * s
        else:
            total += b * s * per_token.get(name.rsplit(".", 1)[-1], max(w.e, w.ffn))
    return total * itemsize


def run_bytes(
    model: Any,
    batches: Sequence[tuple[int, int]],
    *,
    weight_layers: int,
    heads: int | None = None,
    rows: int | None = None,
    names_filter: NameFilter = (),
    logits: bool = True,
) -> int:
    """The memory a forward pass of ``model`` hands back: the float32 attention maps of
    ``weight_layers`` layers (the heads and rows asked for: no other head's map is formed,
    :class:`attnkit.nn.WeightSelection`), the activations ``names_filter`` asks for, and
    the float32 logits. Every cached
    activation counts as read: a cache computes its attention scores, patterns and
    per-head results on first read (:class:`attnkit.nn.activation_cache.DeferredActivations`),
    and a run whose cache could not be read whole is refused up front rather than
    failing at a read.

    Args:
        model: an :class:`attnkit.models.Model` (its heads, config and network).
        batches: ``(b, s)`` of each batch the pass runs.
        weight_layers: the layers whose attention maps are returned.
        heads: the heads of each map (default every head).
        rows: the query rows of each map (default every row).
        names_filter: the activations kept, as :meth:`attnkit.models.Model.run` takes them.
        logits: whether logits ``[b, s, v]`` are computed.

    Raises:
        ValueError: an unknown name in ``names_filter``.
    """
    itemsize = next(model.module.parameters()).dtype.itemsize
    points = {} if names_filter == () else cached_points(names_filter, model.module.hook_points())
    shapes = [(len(point.positions), name) for point, name in points.items()]
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // model.num_heads
    widths = Widths(model.num_heads, model.num_kv_heads, head_dim, config.hidden_size, config.intermediate_size)
    needed = attention_bytes(weight_layers, model.num_heads if heads is None else heads, batches, rows=rows)
    for b, s in batches:
        needed += activation_bytes(shapes, b=b, s=s, widths=widths, itemsize=itemsize)
        needed += b * s * config.vocab_size * 4 if logits else 0
    return needed


def check_run_memory(
    model: Any,
    batches: Sequence[tuple[int, int]],
    *,
    weight_layers: int,
    heads: int | None = None,
    rows: int | None = None,
    names_filter: NameFilter = (),
    logits: bool = True,
    on: str,
    advice: str,
) -> None:
    """Refuse a forward pass of ``model`` whose results (:func:`run_bytes`) would not fit
    in the memory free on its device (:func:`available_memory`), before it runs.

    Args:
        model: an :class:`attnkit.models.Model`.
        batches, weight_layers, heads, rows, names_filter, logits: as :func:`run_bytes`
            takes them.
        on: what the pass runs on, for the message (``"3000 tokens"``).
        advice: what lowers the estimate, for the message.

    Raises:
        ValueError: an unknown name in ``names_filter``.
        MemoryEstimateError: a total over :func:`available_memory` on the model's device;
            the message names the maps' share (layers × heads × rows × keys × 4 bytes).
    """
    heads = model.num_heads if heads is None else heads
    needed = run_bytes(
        model, batches, weight_layers=weight_layers, heads=heads, rows=rows, names_filter=names_filter, logits=logits
    )
    counted = [
        "attention maps",
        *(["cached activations"] if names_filter != () else []),
        *(["logits"] if logits else []),
    ]
    parts = counted[0] if len(counted) == 1 else ", ".join(counted[:-1]) + " and " + counted[-1]
    maps = ""
    if weight_layers and batches:
        size = gib(attention_bytes(weight_layers, heads, batches, rows=rows))
        maps = f" (maps: {size})"
        if len(batches) == 1:
            b, s = batches[0]
            n_r = s if rows is None else min(rows, s)
            inputs = "" if b == 1 else f" × {b} inputs"
            maps = (
                f" (maps: {_counted(weight_layers, 'layer')} × {_counted(heads, 'head')} × {_counted(n_r, 'row')} "
                f"× {_counted(s, 'key')} × 4 bytes{inputs} = {size})"
            )
    check_fits(needed, model.device, what=f"the {parts} of {model.name} on {on}{maps}", advice=advice)


def _counted(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _system_memory() -> list[tuple[int, str]]:
    found = []
    meminfo = _read("/proc/meminfo")
    if meminfo and (match := re.search(r"^MemAvailable:\s+(\d+) kB", meminfo, re.MULTILINE)):
        found.append((int(match.group(1)) * 1024, "available RAM (MemAvailable)"))
    for limit_file, usage_file in _CGROUP_FILES:
        limit, usage = _read(limit_file), _read(usage_file)
        if limit and usage and limit.strip().isdigit() and usage.strip().isdigit() and int(limit) < 2**60:
            found.append((max(int(limit) - int(usage), 0), "memory left under this process's cgroup limit"))
            break
    return found


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read(1 << 16)
    except (OSError, UnicodeDecodeError):
        return None


def _parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else ""
    if not match or unit not in _UNITS:
        raise ValueError(f'{LIMIT_VARIABLE} must be a size such as "8GB", "512MiB" or a byte count, got {text!r}')
    return int(float(match.group(1)) * _UNITS[unit])
