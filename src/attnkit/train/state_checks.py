"""Checking a training checkpoint's state, field by field, before a run continues from it.

The checkpoint's checksum detects corruption, not tampering: anyone can recompute it. So
every field of a checkpoint is compared with the state a fresh run of the same config has
(:meth:`attnkit.train.loop._Trainer.state`): the same keys, the same kinds of values, the
same tensor shapes and dtypes, finite numbers, and the optimizer's moments shaped like the
parameters they belong to. A crafted or broken checkpoint is then a ``ValueError`` that
names the field, never a traceback at the first step or a run that writes ``NaN``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

# The fields whose tensors hold one entry per step done: their length is checked apart.
_PER_STEP = ("losses", "accuracies")
# Optional parts of a state: a CUDA generator state (from a GPU run). (Parameter-group
# settings may be missing too: another torch version may not write them, and torch fills
# in their defaults.)
_OPTIONAL = ("rng.cuda",)
_ADAM_MOMENTS = ("exp_avg", "exp_avg_sq")


def check_model(weights: Any, expected: dict[str, Tensor]) -> None:
    """Check a checkpoint's model weights against ``expected``, the state dict of the
    model its config describes (built on the ``meta`` device, so that weights that do not
    fit are refused before a model of the config's size is allocated).

    Raises:
        ValueError: a missing or unknown weight, one of another shape or dtype, or one
            holding NaN or infinite values.
    """
    _check_like(weights, expected, "model")


def check_state(state: dict[str, Any], fresh: dict[str, Any], parameter_shapes: list[torch.Size]) -> None:
    """Check a checkpoint's ``state`` against ``fresh``, the state of a new run of the same
    config (its model weights: :func:`check_model`).

    Args:
        state: the checkpoint's content (its format, config, step and per-step records
            already checked).
        fresh: ``_Trainer.state()`` of a freshly built run.
        parameter_shapes: the shapes of the optimizer's parameters, in its order.

    Raises:
        ValueError: the first field that differs in kind, shape or dtype from the fresh
            state, a number that is not finite, or optimizer and scheduler state that does
            not fit the step; the message names the field as ``optimizer.param_groups[0].lr``.
    """
    step = state["step"]
    for key, want in fresh.items():
        if key in ("config", "format", "step", "model", *_PER_STEP):
            continue
        if key == "optimizer":
            _check_optimizer(state[key], want, parameter_shapes)
        else:
            _check_like(state[key], want, key)
    scheduler = state["scheduler"]
    if scheduler["last_epoch"] != step or scheduler["_step_count"] != step + 1:
        raise ValueError(
            f"scheduler.last_epoch must be the step {step} (and _step_count {step + 1}), got "
            f"{scheduler['last_epoch']} and {scheduler['_step_count']}"
        )
    if not (math.isfinite(state["seconds"]) and state["seconds"] >= 0):
        raise ValueError(f"seconds must be a finite number >= 0, got {state['seconds']!r}")
    for key in _PER_STEP:
        if not bool(torch.isfinite(state[key]).all()):
            raise ValueError(f"{key} must be finite numbers (the run that wrote it diverged)")


def _check_optimizer(got: Any, want: dict[str, Any], parameter_shapes: list[torch.Size]) -> None:
    _check_keys(got, want, "optimizer")
    groups = got["param_groups"]
    if not isinstance(groups, list) or len(groups) != len(want["param_groups"]):
        raise ValueError(f"optimizer.param_groups must be a list of {len(want['param_groups'])}, got {_kind(groups)}")
    for i, (group, fresh_group) in enumerate(zip(groups, want["param_groups"], strict=True)):
        where = f"optimizer.param_groups[{i}]"
        if not isinstance(group, dict):
            raise ValueError(f"{where} must be a dict, got {_kind(group)}")
        unknown = sorted(map(str, set(group) - set(fresh_group)))
        if unknown:
            raise ValueError(f"{where} has unknown fields {unknown}")
        missing = sorted(set(fresh_group) - set(group))
        if missing:
            raise ValueError(f"{where} lacks the fields {missing}")
        for key, value in group.items():
            _check_like(value, fresh_group[key], f"{where}.{key}")
        if list(group.get("params", [])) != fresh_group["params"]:
            raise ValueError(f"{where}.params must be the parameter indices 0..{len(fresh_group['params']) - 1}")
        if group.get("lr", 0) < 0:
            raise ValueError(f"{where}.lr must be >= 0, got {group['lr']!r}")
    moments = got["state"]
    if not isinstance(moments, dict):
        raise ValueError(f"optimizer.state must be a dict, got {_kind(moments)}")
    for index, entry in moments.items():
        where = f"optimizer.state[{index!r}]"
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(parameter_shapes):
            raise ValueError(f"{where}: not the index of one of the {len(parameter_shapes)} parameters")
        if not isinstance(entry, dict) or set(entry) != {"step", *_ADAM_MOMENTS}:
            raise ValueError(f"{where} must hold step, exp_avg and exp_avg_sq, got {_kind(entry)}")
        _check_tensor(entry["step"], torch.Size([]), torch.float32, f"{where}.step")
        for name in _ADAM_MOMENTS:
            _check_tensor(entry[name], parameter_shapes[index], torch.float32, f"{where}.{name}")


def _check_like(got: Any, want: Any, where: str) -> None:
    """``got`` has the kind of ``want``: recursively, the same keys, lengths, tensor shapes
    and dtypes; numbers finite."""
    if isinstance(want, Tensor):
        _check_tensor(got, want.shape, want.dtype, where)
    elif isinstance(want, dict):
        _check_keys(got, want, where)
        for key, value in got.items():
            if key in want:
                _check_like(value, want[key], f"{where}.{key}")
            elif not (isinstance(value, Tensor) and value.dtype == torch.uint8 and value.ndim == 1):
                # the one optional part: a CUDA generator state
                raise ValueError(f"{where}.{key} must be a generator state (uint8 tensor), got {_kind(value)}")
    elif isinstance(want, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(want):
            raise ValueError(f"{where} must be a list of {len(want)}, got {_kind(got)}")
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _check_like(g, w, f"{where}[{i}]")
    elif isinstance(want, bool) or want is None:
        if not (got is None or isinstance(got, bool)):
            raise ValueError(f"{where} must be true, false or null, got {_kind(got)}")
    elif isinstance(want, (int, float)):
        number = isinstance(got, (int, float)) and not isinstance(got, bool)
        if not number or (isinstance(want, int) and not isinstance(got, int)) or not math.isfinite(got):
            expected = "an integer" if isinstance(want, int) else "a finite number"
            raise ValueError(f"{where} must be {expected}, got {_kind(got)}")
    elif not isinstance(got, type(want)):
        raise ValueError(f"{where} must be a {type(want).__name__}, got {_kind(got)}")


def _check_keys(got: Any, want: dict[str, Any], where: str) -> None:
    if not isinstance(got, dict):
        raise ValueError(f"{where} must be a dict, got {_kind(got)}")
    optional = {key.split(".", 1)[1] for key in _OPTIONAL if key.startswith(f"{where}.")}
    missing = sorted(map(str, set(want) - set(got)))
    unknown = sorted(map(str, set(got) - set(want) - optional))
    if missing or unknown:
        raise ValueError(f"{where} does not have the fields it needs: missing {_few(missing)}, unknown {_few(unknown)}")


def _few(names: list[str], limit: int = 5) -> str:
    return "[" + ", ".join(names[:limit]) + (", ...]" if len(names) > limit else "]")


def _check_tensor(got: Any, shape: torch.Size, dtype: torch.dtype, where: str) -> None:
    if not isinstance(got, Tensor) or got.shape != shape or got.dtype != dtype:
        raise ValueError(f"{where} must be a {dtype} tensor of shape {list(shape)}, got {_kind(got)}")
    if got.is_floating_point() and not bool(torch.isfinite(got).all()):
        raise ValueError(f"{where} holds values that are not finite (NaN or infinite)")


def _kind(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"a {value.dtype} tensor of shape {list(value.shape)}"
    return f"{value!r}"[:80] if isinstance(value, (int, float, str, bool, type(None))) else type(value).__name__
