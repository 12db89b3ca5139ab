"""What the attention viewer shows, as a typed record, and its JSON form.

A :class:`ViewerData` holds one or more :class:`Section` s — ``"self"`` for a decoder-only
(causal) or encoder-only (bidirectional) model; ``"encoder"``, ``"decoder"`` and ``"cross"``
for an encoder–decoder — each with its query tokens, key tokens, and the post-softmax
weights of some layers and heads ``[L, h, s_q, s_k]``.

The JSON form (``docs/viewer.md``) stores each layer's weights as unsigned 16-bit integers
``round(w * 65535)``, little-endian, zlib-compressed and base64-encoded: a weight is
recovered as ``q / 65535``, within ``1 / 131070 ≈ 7.6e-6`` of the original — far finer
than the ``1e-3`` anyone compares maps at — in about a third of the bytes that decimal
text with three significant digits would take, and one layer can be decoded without the
others.

Shape letters: ``L`` layers present, ``h`` heads present, ``s_q`` query length, ``s_k``
key length.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnkit.deprecation import deprecated_aliases, renamed_keywords
from attnkit.inspect.names import ATTENTION_KINDS, VIEWER_MODES
from attnkit.models.checkpoints.chat import Turn
from attnkit.models.model.kinds import MODEL_KINDS, ModelKind

# The kinds of data are the kinds of model (attnkit.models.model.kinds).
Kind = ModelKind
KINDS: tuple[str, ...] = MODEL_KINDS
# The sections each kind may have, in display order: a self-attention page may add its colour
# modes (attnkit.inspect.names.VIEWER_MODES) beside its weights.
SECTION_NAMES: dict[str, tuple[str, ...]] = {
    "bidirectional": ("self", *VIEWER_MODES),
    "causal": ("self", *VIEWER_MODES),
    "encoder-decoder": ATTENTION_KINDS,
}

FORMAT = "attnkit-viewer"
VERSION = 1
# The largest quantised weight: a weight w in [0, 1] is written as the uint16 round(w · 65535).
QUANTISED_MAX = 65535
SCALE = 1.0 / QUANTISED_MAX
# Post-softmax weights may overshoot 1 or undershoot 0 by a rounding error, not more.
_RANGE_SLACK = 1e-4
# zlib level 1: most of level 9's size on this data at several times the speed, which
# matters when a server encodes a request's weights.
_ZLIB_LEVEL = 1


def _as_tokens(tokens: Sequence[str], what: str) -> tuple[str, ...]:
    if isinstance(tokens, str) or not all(isinstance(t, str) for t in tokens):
        raise TypeError(f"{what} must be a sequence of str, got {type(tokens).__name__}")
    return tuple(tokens)


def _as_indices(indices: Sequence[int], what: str) -> tuple[int, ...]:
    out = tuple(int(i) for i in indices)
    if any(i < 0 for i in out) or len(set(out)) != len(out):
        raise ValueError(f"{what} must be distinct non-negative indices, got {list(out)}")
    return out


@dataclass(frozen=True)
class Section:
    """One kind of attention in a model: queries of one sequence attending to keys of one
    sequence, for some layers and heads.

    Attributes:
        query_tokens: ``s_q`` token strings, one per weight row.
        key_tokens: ``s_k`` token strings, one per weight column.
        layers: the model's indices of the ``L`` layers present, in order.
        heads: the model's indices of the ``h`` heads present, in order.
        weights: post-softmax weights ``[L, h, s_q, s_k]``, float32 on the CPU.
        causal: whether query ``i`` may only attend to keys ``<= i`` (the viewer greys out
            the masked cells).
        windows: per layer present, the sliding window of a local layer (query ``i``
            attends only to keys ``j`` with ``i - j < window``, the viewer greys out the
            others) or ``None`` for a global layer; ``None`` for a section without local
            layers.
        word_starts: for a self-attention section between tokens, whether each token
            starts a word of the text (the viewer marks word boundaries, which token labels
            stripped of their spaces hide); ``None`` when not known.
        turns: for a self-attention section over a conversation in a chat template, each
            message's :class:`attnkit.models.checkpoints.chat.Turn` over the section's tokens
            (or words): the viewer shows each token's turn and role, and the template's role
            markers; ``None`` for a plain text.

    Raises:
        TypeError: tokens are not strings, weights not a floating-point tensor.
        ValueError: shapes disagree with the tokens, layers or heads; indices repeat or are
            negative; weights are not finite or outside ``[0, 1]``.
    """

    query_tokens: tuple[str, ...]
    key_tokens: tuple[str, ...]
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    weights: Tensor = field(repr=False)
    causal: bool = False
    windows: tuple[int | None, ...] | None = None
    word_starts: tuple[bool, ...] | None = None
    turns: tuple[Turn, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "query_tokens", _as_tokens(self.query_tokens, "query_tokens"))
        object.__setattr__(self, "key_tokens", _as_tokens(self.key_tokens, "key_tokens"))
        object.__setattr__(self, "layers", _as_indices(self.layers, "layers"))
        object.__setattr__(self, "heads", _as_indices(self.heads, "heads"))
        w = self.weights
        if not isinstance(w, Tensor) or not w.dtype.is_floating_point:
            raise TypeError(f"weights must be a floating-point tensor, got {getattr(w, 'dtype', type(w).__name__)}")
        expected = [len(self.layers), len(self.heads), len(self.query_tokens), len(self.key_tokens)]
        if list(w.shape) != expected:
            raise ValueError(
                f"weights must be [layers, heads, s_q, s_k] = {expected} for {len(self.layers)} layers, "
                f"{len(self.heads)} heads, {len(self.query_tokens)} query and {len(self.key_tokens)} key tokens, "
                f"got {list(w.shape)}"
            )
        if min(expected) == 0:
            raise ValueError(f"a section needs at least one layer, head, query and key, got {expected}")
        w = w.detach().to(device="cpu", dtype=torch.float32)
        if not torch.isfinite(w).all():
            raise ValueError("weights must be finite, got NaN or infinity")
        low, high = float(w.min()), float(w.max())
        if low < -_RANGE_SLACK or high > 1 + _RANGE_SLACK:
            raise ValueError(f"weights must be post-softmax values in [0, 1], got values in [{low:.4g}, {high:.4g}]")
        object.__setattr__(self, "weights", w)
        object.__setattr__(self, "windows", self._checked_windows())
        if self.word_starts is not None:
            starts = tuple(bool(b) for b in self.word_starts)
            if len(starts) != len(self.query_tokens) or self.key_tokens != self.query_tokens:
                raise ValueError(
                    f"word_starts must give one flag per token of a section whose keys are its queries "
                    f"({len(self.query_tokens)}), got {len(starts)}"
                )
            object.__setattr__(self, "word_starts", starts)
        if self.turns is not None:
            object.__setattr__(self, "turns", self._checked_turns())

    def _checked_turns(self) -> tuple[Turn, ...]:
        """``turns`` as a tuple of ordered spans inside a section whose keys are its queries."""
        turns = tuple(Turn.from_dict(t) if isinstance(t, Mapping) else t for t in self.turns or ())
        last = 0
        for turn in turns:
            inside = last <= turn.start < turn.stop <= len(self.query_tokens)
            if not inside or not turn.start <= turn.content_start <= turn.content_stop <= turn.stop:
                raise ValueError(
                    f"turns must be ordered spans of the {len(self.query_tokens)} tokens, their content inside, "
                    f"got {turn}"
                )
            last = turn.stop
        if self.key_tokens != self.query_tokens:
            raise ValueError("turns are for a section whose keys are its queries (a conversation's self-attention)")
        return turns

    def _checked_windows(self) -> tuple[int | None, ...] | None:
        """``windows`` as a tuple, ``None`` when no layer is local."""
        if self.windows is None:
            return None
        windows = tuple(None if w is None else int(w) for w in self.windows)
        if len(windows) != len(self.layers) or any(w is not None and w < 1 for w in windows):
            raise ValueError(
                f"windows must give one positive window or None per layer ({len(self.layers)}), got {list(windows)}"
            )
        return windows if any(w is not None for w in windows) else None

    @classmethod
    def from_layers(
        cls,
        query_tokens: Sequence[str],
        key_tokens: Sequence[str],
        attentions: Mapping[int, Tensor],
        *,
        heads: Sequence[int] | None = None,
        causal: bool = False,
        windows: Mapping[int, int | None] | None = None,
        word_starts: Sequence[bool] | None = None,
        turns: Sequence[Turn] | None = None,
    ) -> Section:
        """Build a section from per-layer weights, as models hand them back.

        Args:
            query_tokens: ``s_q`` token strings.
            key_tokens: ``s_k`` token strings.
            attentions: model layer index → weights ``[h, s_q, s_k]`` (or ``[1, h, s_q, s_k]``
                with a batch of one); layers are sorted by index.
            heads: the model's head indices the ``h`` rows stand for (default ``0 .. h-1``).
            causal: see :class:`Section`.
            windows: model layer index → its sliding window (``None`` or absent: a global
                layer); default every layer global.
            word_starts: see :class:`Section`.
            turns: see :class:`Section`.

        Returns:
            The section.

        Raises:
            ValueError: no layers, a batch larger than one, layers of different shapes, or
                anything :class:`Section` rejects.
        """
        if not attentions:
            raise ValueError("attentions must hold at least one layer, got none")
        layers = sorted(attentions)
        maps: list[Tensor] = []
        for layer in layers:
            w = attentions[layer]
            if w.ndim == 4:
                if w.shape[0] != 1:
                    raise ValueError(f"layer {layer}: expected a batch of one [1, h, s_q, s_k], got {list(w.shape)}")
                w = w[0]  # [h, s_q, s_k]
            if w.ndim != 3:
                raise ValueError(f"layer {layer}: weights must be [h, s_q, s_k], got {list(w.shape)}")
            if maps and w.shape != maps[0].shape:
                raise ValueError(
                    f"every layer must have the same shape, got {list(maps[0].shape)} for layer {layers[0]} "
                    f"and {list(w.shape)} for layer {layer}"
                )
            maps.append(w.detach().to(device="cpu", dtype=torch.float32))
        weights = torch.stack(maps)  # [L, h, s_q, s_k]
        head_ids = range(weights.shape[1]) if heads is None else heads
        layer_windows = None if windows is None else tuple(windows.get(layer) for layer in layers)
        return cls(
            tuple(query_tokens),
            tuple(key_tokens),
            tuple(layers),
            tuple(head_ids),
            weights,
            causal,
            layer_windows,
            None if word_starts is None else tuple(word_starts),
            None if turns is None else tuple(turns),
        )

    def map(self, layer: int, head: int) -> Tensor:
        """The ``[s_q, s_k]`` weights of one of the model's layers and heads.

        Raises:
            KeyError: the layer or head is not in this section.
        """
        if layer not in self.layers or head not in self.heads:
            raise KeyError(
                f"layer {layer}, head {head} not present; layers {list(self.layers)}, heads {list(self.heads)}"
            )
        return self.weights[self.layers.index(layer), self.heads.index(head)]

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form (see ``docs/viewer.md``), weights quantised and encoded."""
        quantised = torch.round(self.weights.clamp(0.0, 1.0) * QUANTISED_MAX).to(torch.int32).numpy().astype("<u2")
        return {
            "causal": self.causal,
            "query_tokens": list(self.query_tokens),
            "key_tokens": list(self.key_tokens),
            "layers": list(self.layers),
            "heads": list(self.heads),
            **({} if self.windows is None else {"windows": list(self.windows)}),
            **({} if self.word_starts is None else {"word_starts": list(self.word_starts)}),
            **({} if self.turns is None else {"turns": [turn.to_dict() for turn in self.turns]}),
            "weights": {
                "shape": list(self.weights.shape),
                "dtype": "uint16",
                "byteorder": "little",
                "scale": SCALE,
                "compression": "zlib",
                "encoding": "base64",
                "data": [
                    base64.b64encode(zlib.compress(layer.tobytes(), _ZLIB_LEVEL)).decode("ascii") for layer in quantised
                ],
            },
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Section:
        """Inverse of :meth:`to_dict`; weights come back within ``SCALE / 2`` of the original.

        Raises:
            ValueError: an unknown encoding, or data that does not match the shape.
        """
        w = d["weights"]
        encoding = (w.get("dtype"), w.get("byteorder"), w.get("compression"), w.get("encoding"))
        if encoding != ("uint16", "little", "zlib", "base64"):
            raise ValueError(
                f"unsupported weights encoding {encoding}, expected ('uint16', 'little', 'zlib', 'base64')"
            )
        shape = [int(n) for n in w["shape"]]
        if len(shape) != 4 or len(w["data"]) != shape[0]:
            raise ValueError(f"weights shape {shape} does not match {len(w['data'])} encoded layers")
        layers = [np.frombuffer(zlib.decompress(base64.b64decode(s)), dtype="<u2") for s in w["data"]]
        flat = np.concatenate(layers).astype(np.float32) * np.float32(w["scale"])
        if flat.size != int(np.prod(shape)):
            raise ValueError(f"weights shape {shape} needs {int(np.prod(shape))} values, got {flat.size}")
        weights = torch.from_numpy(flat.reshape(shape))
        return cls(
            d["query_tokens"],
            d["key_tokens"],
            d["layers"],
            d["heads"],
            weights,
            bool(d["causal"]),
            d.get("windows"),
            d.get("word_starts"),
            d.get("turns"),
        )


@deprecated_aliases(model="model_name", removed_in="0.3")
@dataclass(frozen=True)
class ViewerData:
    """Everything the attention viewer displays.

    Attributes:
        model_name: the model's name, shown in the page's title.
        kind: ``"bidirectional"`` or ``"causal"`` self-attention (one section, ``"self"``),
            or ``"encoder-decoder"`` (sections among ``"encoder"``, ``"decoder"``,
            ``"cross"``).
        sections: section name → :class:`Section`, in display order.
        text: the input text, when there is one (an encoder–decoder's source).
        level: what the rows and columns stand for: ``"token"``, or ``"word"`` for
            attention between the words of the text.
        target_text: an encoder–decoder's target, when there is one.
        generated: the model wrote the target itself (greedy decoding), none having been
            given.

    Raises:
        ValueError: an unknown kind, an unknown level, sections that do not belong to it, or a self-attention
            section whose ``causal`` flag contradicts the kind.
    """

    model_name: str
    kind: Kind
    sections: Mapping[str, Section]
    text: str = ""
    level: str = "token"
    target_text: str = ""
    generated: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.level not in ("token", "word"):
            raise ValueError(f"level must be token or word, got {self.level!r}")
        if (self.target_text or self.generated) and self.kind != "encoder-decoder":
            raise ValueError(f"only an encoder-decoder has a target text, got a {self.kind} model's data with one")
        allowed = SECTION_NAMES[self.kind]
        unknown = [name for name in self.sections if name not in allowed]
        if not self.sections or unknown:
            raise ValueError(f"a {self.kind} model's sections must be among {list(allowed)}, got {list(self.sections)}")
        if self.kind != "encoder-decoder":
            if "self" not in self.sections:
                raise ValueError(f"a {self.kind} model needs its self section, got only {list(self.sections)}")
            own = self.sections["self"]
            for name, section in self.sections.items():
                if section.causal != (self.kind == "causal"):
                    raise ValueError(f"a {self.kind} model's {name} section must have causal={self.kind == 'causal'}")
                if section.query_tokens != own.query_tokens:
                    raise ValueError(f"the {name} section must have the self section's tokens")
        # Display order is the kind's order, whatever order the caller used.
        object.__setattr__(self, "sections", {name: self.sections[name] for name in allowed if name in self.sections})

    @classmethod
    @renamed_keywords(model="model_name", removed_in="0.3")
    def from_run(
        cls,
        model_name: str,
        tokens: Sequence[str],
        attentions: Mapping[int, Tensor],
        *,
        causal: bool,
        heads: Sequence[int] | None = None,
        text: str = "",
        level: str = "token",
        windows: Mapping[int, int | None] | None = None,
        word_starts: Sequence[bool] | None = None,
        turns: Sequence[Turn] | None = None,
    ) -> ViewerData:
        """Self-attention of a decoder-only or encoder-only model over one text.

        Args:
            model_name: the model's name.
            tokens: ``s`` token strings (or words, with ``level="word"``).
            attentions: layer index → ``[h, s, s]`` (or ``[1, h, s, s]``) weights.
            causal: a decoder (``True``) or an encoder (``False``).
            heads: the head indices of the ``h`` rows (default ``0 .. h-1``).
            text: the input text.
            level: ``"token"``, or ``"word"`` when the rows and columns are words.
            windows: layer index → its sliding window, for a model with local layers
                (``None`` or absent: global).
            word_starts: between tokens, whether each token starts a word of the text.
            turns: the turns of a conversation in a chat template (:class:`Section`).

        Returns:
            Data of kind ``"causal"`` or ``"bidirectional"``.

        Raises:
            ValueError: an unknown level, or see :meth:`Section.from_layers`.
        """
        section = Section.from_layers(
            tokens,
            tokens,
            attentions,
            heads=heads,
            causal=causal,
            windows=windows,
            word_starts=word_starts,
            turns=turns,
        )
        return cls(model_name, "causal" if causal else "bidirectional", {"self": section}, text, level)

    @classmethod
    @renamed_keywords(model="model_name", removed_in="0.3")
    def encoder_decoder(
        cls,
        model_name: str,
        source_tokens: Sequence[str],
        target_tokens: Sequence[str],
        *,
        encoder: Mapping[int, Tensor] | None = None,
        decoder: Mapping[int, Tensor] | None = None,
        cross: Mapping[int, Tensor] | None = None,
        heads: Sequence[int] | Mapping[str, Sequence[int]] | None = None,
        text: str = "",
        decoder_key_tokens: Sequence[str] | None = None,
        level: str = "token",
        target_text: str = "",
        generated: bool = False,
    ) -> ViewerData:
        """The three kinds of attention of an encoder–decoder model.

        Args:
            model_name: the model's name.
            source_tokens: the encoder's ``s_src`` tokens.
            target_tokens: the decoder's ``s_tgt`` tokens (the rows of the decoder and
                cross sections).
            encoder: layer → ``[h, s_src, s_src]`` encoder self-attention.
            decoder: layer → ``[h, s_tgt, s_tgt]`` causal decoder self-attention.
            cross: layer → ``[h, s_tgt, s_src]``, decoder queries attending to encoder keys.
            heads: the head indices of the ``h`` rows (default ``0 .. h-1``), or a
                mapping ``"encoder"``/``"decoder"``/``"cross"`` → indices when the stacks
                hold different heads (BART with other encoder and decoder head counts).
            text: the source text.
            decoder_key_tokens: the columns of the decoder section when they are not the
                target tokens (what each position reads: the start token, then the target
                but its last token); default ``target_tokens``.
            level: ``"token"``, or ``"word"`` when the tokens are words.
            target_text: the target text.
            generated: the model wrote the target itself (greedy decoding).

        Returns:
            Data of kind ``"encoder-decoder"`` with the sections given.

        Raises:
            ValueError: none of the three given, or see :meth:`Section.from_layers`.
        """
        sections = {}

        def of(kind: str) -> Sequence[int] | None:
            return heads.get(kind) if isinstance(heads, Mapping) else heads

        if encoder:
            sections["encoder"] = Section.from_layers(source_tokens, source_tokens, encoder, heads=of("encoder"))
        if decoder:
            keys = target_tokens if decoder_key_tokens is None else decoder_key_tokens
            sections["decoder"] = Section.from_layers(target_tokens, keys, decoder, heads=of("decoder"), causal=True)
        if cross:
            sections["cross"] = Section.from_layers(target_tokens, source_tokens, cross, heads=of("cross"))
        return cls(model_name, "encoder-decoder", sections, text, level, target_text, generated)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form documented in ``docs/viewer.md``."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "model": self.model_name,
            "kind": self.kind,
            "text": self.text,
            "level": self.level,
            "sections": {name: section.to_dict() for name, section in self.sections.items()},
        } | ({"target_text": self.target_text, "generated": self.generated} if self.kind == "encoder-decoder" else {})

    def to_json(self) -> str:
        """:meth:`to_dict` as compact JSON text."""
        return json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ViewerData:
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: not viewer data, or a version this library does not read.
        """
        if d.get("format") != FORMAT or d.get("version") != VERSION:
            raise ValueError(
                f"expected format {FORMAT!r} version {VERSION}, got {d.get('format')!r} version {d.get('version')!r}"
            )
        sections = {name: Section.from_dict(s) for name, s in d["sections"].items()}
        return cls(
            d["model"],
            d["kind"],
            sections,
            d.get("text", ""),
            d.get("level", "token"),
            d.get("target_text", ""),
            bool(d.get("generated", False)),
        )

    @classmethod
    def from_json(cls, text: str) -> ViewerData:
        """Inverse of :meth:`to_json`.

        Raises:
            ValueError: malformed JSON, or see :meth:`from_dict`.
        """
        return cls.from_dict(json.loads(text))
