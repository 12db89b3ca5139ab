"""Checked reads of a ``config.json``, shared by every family: sizes, numbers, flags,
choices among strings, token ids, attention heads, rotary encodings and sliding windows.

A checkpoint's ``config.json`` is untrusted: each read checks the field's type and range and
refuses anything else with a :class:`attnkit.models.checkpoints.errors.CheckpointError` that names the
file and the field, says what was expected and shows what was found. A field that is absent
or ``null`` takes the default the caller gives (required without one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnkit.models.checkpoints.errors import CheckpointError, short_repr
from attnkit.nn.rope_scaling import (
    DynamicNTKRopeScaling,
    LinearRopeScaling,
    Llama3RopeScaling,
    RopeScaling,
    YarnRopeScaling,
    yarn_mscale,
)

# Limits on the sizes a config.json may give, far above any checkpoint attnkit runs on two
# cores but far below what would exhaust memory before the weights are compared.
CONFIG_LIMITS: dict[str, int] = {
    "vocab_size": 2**21,
    "hidden_size": 2**16,
    "num_hidden_layers": 1024,
    "num_attention_heads": 1024,
    "num_key_value_heads": 1024,
    "intermediate_size": 2**18,
    "max_position_embeddings": 2**17,
    "type_vocab_size": 1024,
    "head_dim": 2**12,
}
REQUIRED = object()
# The smallest normal float32: a config value below it computes as 0 (or its inverse as inf).
_FLOAT32_TINY = torch.finfo(torch.float32).tiny


def config_int(
    config: dict[str, Any],
    key: str,
    *,
    path: Path,
    default: Any = REQUIRED,
    minimum: int = 1,
    maximum: int | None = None,
) -> int:
    """An integer field of a ``config.json``, checked.

    Args:
        config: the parsed file.
        key: the field.
        path: the file, for messages.
        default: the value when the field is absent (or ``null``); required without one.
        minimum: the smallest value accepted.
        maximum: the largest (default :data:`CONFIG_LIMITS` of ``key``).

    Raises:
        CheckpointError: a missing field, or one that is not an integer in range.
    """
    value = config.get(key)
    if value is None:
        if default is REQUIRED:
            raise CheckpointError(path, f"{key} is missing, and the model needs it", field=key)
        return default
    maximum = CONFIG_LIMITS.get(key, 2**31 - 1) if maximum is None else maximum
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise CheckpointError(
            path, f"{key} must be an integer from {minimum} to {maximum}, got {short_repr(value)}", field=key
        )
    return value


def config_float(config: dict[str, Any], key: str, *, path: Path, default: float, low: float, high: float) -> float:
    """A number field of a ``config.json``, finite and ``low < value <= high``, and either
    0 or of a size that float32 holds (at least ``1.2e-38``: a smaller one would compute
    as 0, and its inverse as infinity).

    Raises:
        CheckpointError: a field that is not a number in range.
    """
    value = config.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value <= high:
        raise CheckpointError(
            path, f"{key} must be a number above {low} and at most {high}, got {short_repr(value)}", field=key
        )
    if value != 0 and abs(value) < _FLOAT32_TINY:
        raise CheckpointError(
            path, f"{key} must be 0 or at least {_FLOAT32_TINY:.3g} in size (float32), got {value!r}", field=key
        )
    return float(value)


def config_bool(config: dict[str, Any], key: str, *, path: Path, default: bool) -> bool:
    """A boolean field of a ``config.json``: JSON ``true`` or ``false`` (``null`` or absent
    is ``default``). A string such as ``"false"`` is refused rather than read as true.

    Raises:
        CheckpointError: a field that is not a boolean.
    """
    value = config.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise CheckpointError(path, f"{key} must be true or false, got {short_repr(value)}", field=key)
    return value


@dataclass(frozen=True)
class Rope:
    """The rotary encoding of one layer.

    Attributes:
        theta: the base of the frequencies.
        scaling: how they are stretched for long contexts, or ``None``.
    """

    theta: float
    scaling: RopeScaling | None = None


class ConfigReader:
    """Checked reads of one ``config.json``; every error names the file and the field.

    Args:
        config: the parsed file.
        path: the file.
        aliases: field → the older name a family's files may give it instead (GPT-NeoX's
            ``rotary_emb_base`` for ``rope_theta``): read where the field itself is absent
            or ``null``, and named in errors as the file names it.
    """

    def __init__(self, config: dict[str, Any], path: Path, *, aliases: Mapping[str, str] | None = None) -> None:
        self.config = config
        self.path = path
        self.aliases = dict(aliases or {})

    def field(self, key: str) -> str:
        """The name the file gives ``key``: its alias where the file has that and no value
        under ``key``."""
        alias = self.aliases.get(key)
        if alias is not None and self.config.get(key) is None and alias in self.config:
            return alias
        return key

    def size(
        self,
        key: str,
        default: Any = REQUIRED,
        *,
        minimum: int = 1,
        maximum: int | None = None,
        like: str | None = None,
    ) -> int:
        """An integer field from ``minimum`` to a limit
        (:func:`attnkit.models.checkpoints.config_reader.config_int`).

        Args:
            key: the field.
            default: its value when absent or ``null``; required without one.
            minimum: the smallest value accepted.
            maximum: the largest; default the limit of ``like`` (of ``key`` itself without
                ``like``; ``2**31 - 1`` for a field that has none).
            like: the field of :data:`attnkit.models.checkpoints.config_reader.CONFIG_LIMITS` whose limit
                bounds this one, for a family that names a common size its own way (T5's
                ``d_model`` is a ``hidden_size``).

        Raises:
            CheckpointError: a missing field, or one that is not an integer in range.
        """
        if maximum is None:
            maximum = CONFIG_LIMITS[like] if like is not None else CONFIG_LIMITS.get(key)
        return config_int(
            self.config, self.field(key), path=self.path, default=default, minimum=minimum, maximum=maximum
        )

    def token_id(self, key: str, vocab_size: int, default: int) -> int:
        """A token id field (``pad_token_id``, ``decoder_start_token_id``).

        Raises:
            CheckpointError: a value that is not an integer in ``[0, vocab_size)``.
        """
        return self.size(key, default, minimum=0, maximum=vocab_size - 1)

    def number(self, key: str, default: float, *, low: float = 0.0, high: float = 1e12) -> float:
        """A number field with ``low < value <= high``."""
        return config_float(self.config, self.field(key), path=self.path, default=default, low=low, high=high)

    def flag(self, key: str, default: bool) -> bool:
        """A boolean field (:func:`attnkit.models.checkpoints.config_reader.config_bool`)."""
        return config_bool(self.config, self.field(key), path=self.path, default=default)

    def optional_number(self, key: str) -> float | None:
        """A positive number field, or ``None`` when absent or ``null``."""
        return None if self.config.get(self.field(key)) is None else self.number(key, 0.0)

    def refuse(self, key: str, detail: str) -> CheckpointError:
        """The error for a field attnkit cannot load."""
        key = self.field(key)
        return CheckpointError(self.path, f"{key}: {detail}", field=key)

    def choice(self, key: str, mapping: dict[str, Any], default: str) -> Any:
        """The value ``mapping`` gives a string field.

        Raises:
            CheckpointError: a value that is not a key of ``mapping`` (listed in the message).
        """
        key = self.field(key)
        value = self.config.get(key, default)
        if value is None:
            value = default
        if not isinstance(value, str) or value not in mapping:
            known = ", ".join(repr(k) for k in mapping)
            raise CheckpointError(
                self.path, f"{key}={short_repr(value)} is not supported (attnkit has {known})", field=key
            )
        return mapping[value]

    def heads(self, hidden: int) -> tuple[int, int, int]:
        """``(num_attention_heads, num_key_value_heads, head_dim)``, checked against each
        other (``head_dim`` defaults to ``hidden_size / num_attention_heads``)."""
        heads = self.size("num_attention_heads")
        kv_heads = self.size("num_key_value_heads", heads, maximum=heads)
        if heads % kv_heads:
            raise self.refuse("num_key_value_heads", f"{heads} query heads are not a multiple of {kv_heads}")
        if self.config.get("head_dim") is None and hidden % heads:
            raise self.refuse("num_attention_heads", f"hidden_size={hidden} is not a multiple of {heads} heads")
        head_dim = self.size("head_dim", hidden // heads)
        return heads, kv_heads, head_dim

    def head_count(self, key: str, *, width: int, width_key: str) -> int:
        """A number of attention heads that divides the model width ``width`` (the field
        ``width_key``), bounded as ``num_attention_heads``.

        Raises:
            CheckpointError: a count out of range, or one that does not divide ``width``.
        """
        heads = self.size(key, like="num_attention_heads")
        if width % heads:
            raise self.refuse(key, f"{width_key}={width} is not a multiple of {heads} heads")
        return heads

    def eos(self, vocab_size: int) -> tuple[int, ...]:
        """``eos_token_id``: absent, one id or a list of ids."""
        return token_ids(self.config.get("eos_token_id"), vocab_size, self.path)

    def no_flags(self, *keys: str, detail: str = "true is not supported") -> None:
        """Refuse features attnkit does not implement that a field switches on, saying
        ``detail``."""
        for key in keys:
            if self.flag(key, False):
                raise self.refuse(key, detail)

    def rope(self, *, head_dim: int, layer_type: str | None = None) -> tuple[Rope, float]:
        """The rotary encoding and its partial factor, from transformers 5's
        ``rope_parameters`` (per layer type where it is keyed so) or transformers 4's
        ``rope_theta`` and ``rope_scaling``.

        Args:
            head_dim: the head dim (the rotated dims' count must stay even).
            layer_type: the key of per-layer-type parameters (Gemma 3), if they are keyed.

        Returns:
            ``(rope, partial_rotary_factor)``.

        Raises:
            CheckpointError: scaling attnkit does not implement (LongRoPE; YaRN with an
                attention factor other than 1), or parameters out of range.
        """
        key = next((k for k in ("rope_parameters", "rope_scaling") if self.config.get(k)), "rope_parameters")
        params = self.config.get(key) or {}
        if not isinstance(params, dict):
            raise self.refuse(key, f"must be an object, got {short_repr(params)}")
        if layer_type is not None and layer_type in params:
            key = f"{key}.{layer_type}"
            params = params[layer_type]
            if not isinstance(params, dict):
                raise self.refuse(key, f"must be an object, got {short_repr(params)}")
        top = (self.field(k) for k in ("rope_theta", "partial_rotary_factor"))
        merged: dict[str, Any] = {k: self.config[k] for k in top if k in self.config}
        merged |= params
        sub = ConfigReader(merged, self.path, aliases=self.aliases)
        theta = sub.number("rope_theta", 10000.0, low=1.0)
        partial = sub.number("partial_rotary_factor", 1.0, high=1.0)
        rope_type = merged.get("rope_type", merged.get("type", "default"))
        scaling: RopeScaling | None
        try:
            if rope_type == "default":
                scaling = None
            elif rope_type == "linear":
                scaling = LinearRopeScaling(sub.number("factor", 1.0))
            elif rope_type == "llama3":
                scaling = Llama3RopeScaling(
                    sub.number("factor", 8.0),
                    sub.number("low_freq_factor", 1.0),
                    sub.number("high_freq_factor", 4.0),
                    sub.size("original_max_position_embeddings", 8192),
                )
            elif rope_type == "dynamic":
                scaling = DynamicNTKRopeScaling(sub.number("factor", 1.0), self.size("max_position_embeddings", 2048))
            elif rope_type == "yarn":
                scaling = _yarn(sub, key, self.size("max_position_embeddings", 2048))
            else:
                raise self.refuse(
                    key,
                    f"rope_type={short_repr(rope_type)} is not supported "
                    "(attnkit has 'default', 'linear', 'llama3', 'dynamic', 'yarn')",
                )
        except ValueError as err:
            if isinstance(err, CheckpointError):
                raise
            raise self.refuse(key, str(err)) from None
        rotary_dim = int(head_dim * partial)
        if rotary_dim < 2 or rotary_dim % 2:
            raise self.refuse(key, f"rotates {rotary_dim} dims of each {head_dim}-dim head; they must be even and >= 2")
        return Rope(theta, scaling), partial

    def context_length(self, rope: Rope, default: int) -> int:
        """The most tokens a text may have: ``max_position_embeddings``, times the factor of
        dynamic scaling, which exists to run past the trained context."""
        length = self.size("max_position_embeddings", default)
        if isinstance(rope.scaling, DynamicNTKRopeScaling):
            return min(int(length * rope.scaling.factor), CONFIG_LIMITS["max_position_embeddings"])
        return length

    def windows(self, num_layers: int, *, sliding_by_default: bool) -> tuple[int | None, ...]:
        """The sliding window of every layer: ``sliding_window`` on the layers that
        ``layer_types`` marks ``"sliding_attention"`` (every layer when there is no
        ``layer_types`` and ``sliding_by_default``), ``None`` on the others."""
        window = self.config.get("sliding_window")
        if window is None or not self.flag("use_sliding_window", True):
            return (None,) * num_layers
        size = self.size("sliding_window")
        types = self.config.get("layer_types")
        if types is None:
            return ((size,) if sliding_by_default else (None,)) * num_layers
        if not isinstance(types, list) or len(types) != num_layers:
            raise self.refuse("layer_types", f"must list one type per layer ({num_layers}), got {short_repr(types)}")
        known = {"sliding_attention": size, "full_attention": None}
        unknown = [t for t in types if not isinstance(t, str) or t not in known]
        if unknown:
            raise self.refuse("layer_types", f"{short_repr(unknown[0])} is not supported (attnkit has {list(known)})")
        return tuple(known[t] for t in types)


def token_ids(value: object, vocab_size: int, path: Path) -> tuple[int, ...]:
    """``eos_token_id``: absent, one id or a list of ids, each in ``[0, vocab_size)``.

    Raises:
        CheckpointError: anything else.
    """
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < vocab_size for v in values):
        raise CheckpointError(
            path, f"eos_token_id must be token ids in [0, {vocab_size}), got {short_repr(value)}", field="eos_token_id"
        )
    return tuple(values)


def _yarn(read: ConfigReader, key: str, max_positions: int) -> YarnRopeScaling:
    """YaRN's frequencies from rotary parameters (``factor``, defaulting to the ratio of
    ``max_position_embeddings`` to ``original_max_position_embeddings`` as transformers
    does; ``beta_fast``, ``beta_slow``, ``truncate``).

    Raises:
        CheckpointError: an attention factor other than 1 (YaRN scales the rotated
            queries and keys then, which attnkit does not), or parameters out of range.
    """
    if read.config.get("factor") is None:
        factor = max_positions / read.size("original_max_position_embeddings", like="max_position_embeddings")
    else:
        factor = read.number("factor", 1.0)
    attention_factor = read.optional_number("attention_factor")
    if attention_factor is None:
        mscale, all_dim = read.optional_number("mscale"), read.optional_number("mscale_all_dim")
        if mscale and all_dim:
            attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, all_dim)
        else:
            attention_factor = yarn_mscale(factor, 1.0)
    if abs(attention_factor - 1.0) > 1e-12:
        raise read.refuse(
            key,
            f"rope_type='yarn' is not supported with attention factor {attention_factor:.6g} (attnkit reads "
            "YaRN whose attention factor is 1, as DeepSeek-V3's mscale = mscale_all_dim gives)",
        )
    return YarnRopeScaling(
        factor,
        read.size("original_max_position_embeddings", like="max_position_embeddings"),
        beta_fast=read.number("beta_fast", 32.0),
        beta_slow=read.number("beta_slow", 1.0),
        truncate=read.flag("truncate", True),
    )
