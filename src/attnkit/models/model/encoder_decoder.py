"""Runs of an encoder–decoder checkpoint (T5, BART) on a source and a target, with its
three kinds of attention: :meth:`attnkit.models.Model.run_encoder_decoder`.

Shape letters: ``s_src`` source tokens, ``s_tgt`` target tokens, ``h_sel`` selected heads,
``e`` model dim, ``v`` vocabulary size.

The decoder reads the target shifted right: its input is the decoder start token followed
by every target token but the last, and position ``i`` predicts target token ``i``. Maps
label each decoder position by the target token it produces, so a cross-attention map has
the target tokens as rows and the source tokens as columns, and row ``i`` is where the
model looked while producing target token ``i``. The columns of the decoder's
self-attention are the decoder's input tokens (the start token, then the target).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attnkit.deprecation import deprecated_aliases
from attnkit.functional.indices import normalize_indices, select_indices
from attnkit.models.checkpoints.memory import check_fits
from attnkit.models.model.attentions import LayerAttentions
from attnkit.models.model.names import ATTENTION_KINDS
from attnkit.models.model.running import pad_rows
from attnkit.models.model.runs import returned_float
from attnkit.nn import EncoderDecoderLM, LayerSelection, MultiHeadAttention, StackOutput, WeightSelection

# The heads to keep: one list for every kind of attention, or a list per kind (a kind left
# out keeps all its heads); None keeps all.
HeadSelection = Sequence[int] | Mapping[str, Sequence[int]] | None


@deprecated_aliases(encoder_hidden_states="encoder_last_hidden_state", removed_in="0.3")
@dataclass(frozen=True)
class EncoderDecoderRun:
    """What one teacher-forced pass of an encoder–decoder produced.

    Attributes:
        source_ids: ``[1, s_src]``.
        source_text: the source as text (decoded when it was given as ids).
        source_tokens: the ``s_src`` source token strings.
        source_offsets: each source token's character span in the source text (``None``
            for a run on ids).
        target_ids: ``[1, s_tgt]``, the tokens the decoder produces (its end-of-sequence
            token included when the target has one).
        target_tokens: their strings.
        target_offsets: their character spans in :attr:`target_text` (``None`` when the
            target was generated or given as ids).
        target_text: the target as text (decoded when it was generated).
        generated: the model produced the target itself (greedy decoding), no target
            having been given.
        decoder_input_ids: ``[1, s_tgt]``: the decoder start token, then the target but
            its last token.
        decoder_input_tokens: their strings (the columns of decoder self-attention).
        logits: ``[1, s_tgt, v]``: row ``i`` predicts target token ``i``.
        encoder_last_hidden_state: the encoder's output ``[1, s_src, e]`` (the memory the
            cross-attention reads).
        encoder_attentions: encoder layer → ``[1, h_sel, s_src, s_src]``.
        decoder_attentions: decoder layer → ``[1, h_sel, s_tgt, s_tgt]`` (causal).
        cross_attentions: decoder layer → ``[1, h_sel, s_tgt, s_src]``: target rows,
            source columns.
        heads: kind (``"encoder"``, ``"decoder"``, ``"cross"``) → the selected head
            indices of its maps (the stacks may have different head counts: BART's
            ``encoder_attention_heads`` and ``decoder_attention_heads``).
    """

    source_ids: Tensor
    source_text: str
    source_tokens: list[str]
    source_offsets: list[tuple[int, int]] | None
    target_ids: Tensor
    target_tokens: list[str]
    target_offsets: list[tuple[int, int]] | None
    target_text: str
    generated: bool
    decoder_input_ids: Tensor
    decoder_input_tokens: list[str]
    logits: Tensor
    encoder_last_hidden_state: Tensor
    encoder_attentions: LayerAttentions
    decoder_attentions: LayerAttentions
    cross_attentions: LayerAttentions
    heads: dict[str, list[int]]

    def attentions(self, kind: str) -> LayerAttentions:
        """The maps of one kind: ``"encoder"``, ``"decoder"`` or ``"cross"``.

        Raises:
            ValueError: another kind.
        """
        if kind not in ATTENTION_KINDS:
            raise ValueError(f"attention kind must be one of {', '.join(ATTENTION_KINDS)}, got {kind!r}")
        return {
            "encoder": self.encoder_attentions,
            "decoder": self.decoder_attentions,
            "cross": self.cross_attentions,
        }[kind]

    def tokens(self, kind: str) -> tuple[list[str], list[str]]:
        """``(row tokens, column tokens)`` of the maps of one kind.

        Raises:
            ValueError: an unknown kind.
        """
        self.attentions(kind)
        if kind == "encoder":
            return self.source_tokens, self.source_tokens
        if kind == "decoder":
            return self.target_tokens, self.decoder_input_tokens
        return self.target_tokens, self.source_tokens


def network(model: Any) -> EncoderDecoderLM:
    """The :class:`attnkit.nn.EncoderDecoderLM` of an :class:`attnkit.models.Model`.

    Raises:
        ValueError: a model that is not an encoder–decoder.
    """
    if not isinstance(model.module, EncoderDecoderLM):
        raise ValueError(
            f"{model.name} is a {model.family} model, not an encoder-decoder; it has one text and one "
            "self-attention (use run)"
        )
    return model.module


def attention_head_counts(module: EncoderDecoderLM) -> dict[str, int]:
    """Heads per layer of each kind of attention of an encoder–decoder network:
    ``{"encoder": h_enc, "decoder": h_dec, "cross": h_cross}``."""
    first_encoder, first_decoder = module.encoder.layers[0], module.decoder.layers[0]
    counts = {
        "encoder": first_encoder.self_attn,
        "decoder": first_decoder.self_attn,
        "cross": getattr(first_decoder, "cross_attn", None),
    }
    out = {}
    for kind, attention in counts.items():
        assert isinstance(attention, MultiHeadAttention)  # every decoder layer has cross-attention
        out[kind] = attention.num_heads
    return out


def select_heads(model: Any, heads: HeadSelection) -> dict[str, list[int]]:
    """The heads of each kind of attention that ``heads`` selects.

    Raises:
        ValueError: an unknown kind, or a head a stack does not have (the message names
            the stack and its head count).
    """
    counts = attention_head_counts(network(model))
    if isinstance(heads, Mapping):
        unknown = [kind for kind in heads if kind not in ATTENTION_KINDS]
        if unknown:
            raise ValueError(f"heads are selected per kind: {', '.join(ATTENTION_KINDS)}; got {unknown[0]!r}")
    out = {}
    for kind, count in counts.items():
        asked = heads.get(kind) if isinstance(heads, Mapping) else heads
        context = f"{model.name}'s {_STACK_NAMES[kind]} has {count} heads per layer"
        out[kind] = normalize_indices(asked, count, "head", context=context)
    return out


_STACK_NAMES = {"encoder": "encoder", "decoder": "decoder self-attention", "cross": "cross-attention"}


def generate_target(model: Any, source_ids: Tensor, max_new_tokens: int) -> list[int]:
    """Greedy decoding of a source (the encoder once, the decoder with its KV cache),
    ending with the end-of-sequence token when the model produces one within
    ``max_new_tokens``, or at the model's ``max_length`` (the positions it has; the KV
    cache is never larger).

    Args:
        model: an encoder–decoder :class:`attnkit.models.Model`.
        source_ids: ``[1, s_src]``.
        max_new_tokens: the most tokens to produce.

    Returns:
        The produced ids, the end-of-sequence token included.
    """
    produced: list[int] = []
    steps = min(max_new_tokens, model.max_length)
    for token in network(model).stream(source_ids.to(model.device), steps):  # [1]
        produced.append(int(token))
        if produced[-1] in model.tokenizer.eos_token_ids:
            break
    return produced


def _check_memory(model: Any, maps: int, count: int, s_src: int, s_tgt: int) -> None:
    """Refuse a pass over ``count`` source-and-target pairs (padded to ``s_src`` and
    ``s_tgt`` tokens) whose float32 attention maps of the heads asked for (``maps``
    bytes) and float32 logits exceed the memory available on the model's device."""
    check_fits(
        maps + 4 * count * s_tgt * model.config.vocab_size,
        model.device,
        what=f"the attention maps and logits of {model.name} on {s_src} source and {s_tgt} target tokens"
        + ("" if count == 1 else f" (each of {count} pairs, padded)"),
        advice="ask for fewer heads (--heads), fewer layers (--layers) or shorter texts",
    )


class EncoderDecoderMixin:
    """The runs of an encoder–decoder on a source and a target, as methods of
    :class:`attnkit.models.Model` (a mixin over what :func:`run_encoder_decoder_batch` reads of a
    model, so that this module never imports :mod:`attnkit.models.model`)."""

    encoder_decoder: bool
    num_heads: int

    @property
    def heads_per_kind(self) -> dict[str, int]:
        """Heads per layer of each kind of attention: ``{"self": num_heads}`` for a model
        of one text; ``{"encoder", "decoder", "cross"}`` for an encoder–decoder, whose
        stacks may differ (BART's ``encoder_attention_heads`` and
        ``decoder_attention_heads``; :attr:`num_heads` is the encoder's)."""
        if not self.encoder_decoder:
            return {"self": self.num_heads}
        return attention_head_counts(network(self))

    def run_encoder_decoder(
        self,
        source: str | Tensor | Sequence[int],
        target: str | Tensor | Sequence[int] | None = None,
        *,
        encoder_layers: LayerSelection = True,
        decoder_layers: LayerSelection = True,
        heads: HeadSelection = None,
        max_new_tokens: int = 32,
    ) -> EncoderDecoderRun:
        """A source and a target through an encoder–decoder, with its three kinds of
        attention: the encoder's self-attention, the decoder's masked self-attention and
        the decoder's cross-attention to the source (:mod:`attnkit.models.model.encoder_decoder`).

        Without a target the model produces one first, greedily (the encoder once, the
        decoder with its KV cache) until its end-of-sequence token or ``max_new_tokens``;
        the maps are then those it computed while producing it.

        Args:
            source: a text, or token ids ``[s]`` / ``[1, s]``.
            target: a text or ids (tokenized with the model's special tokens, e.g. T5's
                closing ``</s>``), or ``None`` to generate it.
            encoder_layers: the encoder layers whose weights to return (``True`` for all,
                indices, negative from the end).
            decoder_layers: the decoder layers whose self- and cross-attention weights to
                return.
            heads: the heads to keep: one list for every kind of attention, or a mapping
                kind (``"encoder"``, ``"decoder"``, ``"cross"``) → list, for stacks with
                different head counts (:attr:`heads_per_kind`); default all.
            max_new_tokens: the most tokens to generate when no target is given.

        Returns:
            A :class:`attnkit.models.model.encoder_decoder.EncoderDecoderRun`.

        Raises:
            ValueError: a model that is not an encoder–decoder, an empty or too long text,
                a layer or head out of range.
            MemoryEstimateError: the maps of the heads asked for and the logits would
                exceed the memory available on the model's device.
            TypeError: ids that are not integers.
        """
        return self.run_encoder_decoder_batch(
            [source],
            [target],
            encoder_layers=encoder_layers,
            decoder_layers=decoder_layers,
            heads=heads,
            max_new_tokens=max_new_tokens,
        )[0]

    def run_encoder_decoder_batch(
        self,
        sources: Sequence[str | Tensor | Sequence[int]],
        targets: Sequence[str | Tensor | Sequence[int] | None] | None = None,
        *,
        encoder_layers: LayerSelection = True,
        decoder_layers: LayerSelection = True,
        heads: HeadSelection = None,
        max_new_tokens: int = 32,
    ) -> list[EncoderDecoderRun]:
        """:meth:`run_encoder_decoder` on several source/target pairs in one pass: the sources
        padded at the end and masked (a source mask), the decoder inputs padded at the end
        (a decoder position never reads later ones, so the padding changes nothing before
        it). Each run is cropped to its own tokens and equals :meth:`run_encoder_decoder` of its
        pair up to float rounding.

        Args:
            sources: texts or token ids.
            targets: one target (text, ids, or ``None`` to generate it greedily) per
                source; ``None`` generates every target.
            encoder_layers, decoder_layers, heads, max_new_tokens: as :meth:`run_encoder_decoder`.

        Returns:
            One :class:`attnkit.models.model.encoder_decoder.EncoderDecoderRun` per pair, in order.

        Raises:
            ValueError: no sources, another number of targets, or what
                :meth:`run_encoder_decoder` refuses for any pair (the memory limit counts the
                padded batch).
            TypeError: ids that are not integers.
        """
        return run_encoder_decoder_batch(
            self,
            sources,
            targets,
            encoder_layers=encoder_layers,
            decoder_layers=decoder_layers,
            heads=heads,
            max_new_tokens=max_new_tokens,
        )


@dataclass(frozen=True)
class _Pair:
    """One source and target, tokenized (the target generated when none was given)."""

    source: str | Tensor | Sequence[int]
    source_ids: Tensor  # [1, s_src]
    source_tokens: list[str]
    source_offsets: list[tuple[int, int]] | None
    target_ids: Tensor  # [1, s_tgt]
    target_tokens: list[str]
    target_offsets: list[tuple[int, int]] | None
    target_text: str
    generated: bool


def run_encoder_decoder_batch(
    model: Any,
    sources: Sequence[str | Tensor | Sequence[int]],
    targets: Sequence[str | Tensor | Sequence[int] | None] | None = None,
    *,
    encoder_layers: LayerSelection = True,
    decoder_layers: LayerSelection = True,
    heads: HeadSelection = None,
    max_new_tokens: int = 32,
) -> list[EncoderDecoderRun]:
    """:meth:`attnkit.models.Model.run_encoder_decoder_batch` of ``model`` (an
    :class:`attnkit.models.Model`)."""
    module = network(model)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if isinstance(sources, (str, Tensor)) or not sources:
        raise ValueError("sources must be a non-empty list of texts or token ids (run_encoder_decoder takes one)")
    wanted = [None] * len(sources) if targets is None else list(targets)
    if len(wanted) != len(sources):
        raise ValueError(f"give one target (or None) per source: got {len(wanted)} targets for {len(sources)} sources")
    num_decoder_layers = len(module.decoder.layers)
    encoder_list = select_indices(
        encoder_layers, model.num_layers, "layer", context=f"the encoder has {model.num_layers} layers"
    )
    decoder_list = select_indices(
        decoder_layers, num_decoder_layers, "layer", context=f"the decoder has {num_decoder_layers} layers"
    )
    head_lists = select_heads(model, heads)
    pairs = [_prepare(model, source, target, max_new_tokens) for source, target in zip(sources, wanted)]
    s_src = max(pair.source_ids.shape[1] for pair in pairs)
    s_tgt = max(pair.target_ids.shape[1] for pair in pairs)
    per_pair = len(head_lists["encoder"]) * len(encoder_list) * s_src * s_src + len(decoder_list) * s_tgt * (
        len(head_lists["decoder"]) * s_tgt + len(head_lists["cross"]) * s_src
    )
    _check_memory(model, 4 * len(pairs) * per_pair, len(pairs), s_src, s_tgt)
    start = torch.tensor([module.decoder_start_token_id])
    decoder_inputs = [torch.cat((start, pair.target_ids[0, :-1])) for pair in pairs]  # [s_tgt_i] each
    source_ids, source_mask = pad_rows([pair.source_ids[0] for pair in pairs], s_src, "right")  # [b, s_src] x 2
    # The target is padded at the end: a decoder position never sees later ones, so no mask.
    decoder_input_ids, _ = pad_rows(decoder_inputs, s_tgt, "right")  # [b, s_tgt]
    mask = None if bool(source_mask.all()) else source_mask.to(model.device)
    # Only the heads asked for are formed (WeightSelection), each kind its own.
    encoder_asked = dict.fromkeys(encoder_list, WeightSelection(heads=tuple(head_lists["encoder"])))
    decoder_asked = dict.fromkeys(
        decoder_list, WeightSelection(heads=tuple(head_lists["decoder"]), cross_heads=tuple(head_lists["cross"]))
    )
    with torch.no_grad():
        encoded = module.encode(source_ids.to(model.device), source_mask=mask, return_weights=encoder_asked)
        assert isinstance(encoded, StackOutput)  # a record whenever return_weights is a mapping
        decoded = module.decode(
            decoder_input_ids.to(model.device), encoded.output, source_mask=mask, return_weights=decoder_asked
        )
        assert isinstance(decoded, StackOutput)
        logits = module.head(decoded.output)  # [b, s_tgt, v]
    batch = _PaddedPass(encoded, decoded, logits, encoder_list, decoder_list, head_lists)
    return [_pair_run(model, pair, row, decoder_inputs[row], batch) for row, pair in enumerate(pairs)]


@dataclass(frozen=True)
class _PaddedPass:
    """What one padded pass over a batch of pairs produced, and what to keep of it."""

    encoded: StackOutput
    decoded: StackOutput
    logits: Tensor  # [b, s_tgt, v]
    encoder_layers: list[int]
    decoder_layers: list[int]
    heads: dict[str, list[int]]

    def kept(self, row: int, layer: int, kind: str, rows: int, columns: int) -> Tensor:
        """``[1, h_sel, rows, columns]``: one layer's map of one kind (of the kept heads,
        the only ones formed) for the pair in ``row``, cropped to its tokens."""
        record = (self.encoded if kind == "encoder" else self.decoded).weights[layer]
        assert record is not None  # every layer in the lists was asked for
        weights = record.cross_attention if kind == "cross" else record.self_attention  # [b, h_sel, s_q, s_k]
        assert weights is not None  # the decoder's layers all have cross-attention
        return weights[row : row + 1, :, :rows, :columns]  # [1, h_sel, s_q, s_k] of this pair


def _pair_run(model: Any, pair: _Pair, row: int, decoder_input: Tensor, batch: _PaddedPass) -> EncoderDecoderRun:
    """The run of the pair in row ``row`` of a padded pass, cropped to its own tokens."""
    n, m = pair.source_ids.shape[1], pair.target_ids.shape[1]
    num_decoder_layers = len(network(model).decoder.layers)
    encoder_maps = {i: batch.kept(row, i, "encoder", n, n) for i in batch.encoder_layers}
    decoder_maps = {i: batch.kept(row, i, "decoder", m, m) for i in batch.decoder_layers}
    cross_maps = {i: batch.kept(row, i, "cross", m, n) for i in batch.decoder_layers}
    return EncoderDecoderRun(
        source_ids=pair.source_ids,
        source_text=pair.source if isinstance(pair.source, str) else model.tokenizer.decode(pair.source_ids[0]),
        source_tokens=pair.source_tokens,
        source_offsets=pair.source_offsets,
        target_ids=pair.target_ids,
        target_tokens=pair.target_tokens,
        target_offsets=pair.target_offsets,
        target_text=pair.target_text,
        generated=pair.generated,
        decoder_input_ids=decoder_input[None],  # [1, s_tgt]
        decoder_input_tokens=[model.tokenizer.id_to_token(i) for i in decoder_input.tolist()],
        logits=returned_float(batch.logits[row : row + 1, :m]),  # [1, s_tgt, v]
        encoder_last_hidden_state=returned_float(batch.encoded.output[row : row + 1, :n]),  # [1, s_src, e]
        encoder_attentions=LayerAttentions(encoder_maps, model.num_layers),
        decoder_attentions=LayerAttentions(decoder_maps, num_decoder_layers),
        cross_attentions=LayerAttentions(cross_maps, num_decoder_layers),
        heads=batch.heads,
    )


def _prepare(
    model: Any, source: str | Tensor | Sequence[int], target: str | Tensor | Sequence[int] | None, max_new_tokens: int
) -> _Pair:
    """One pair tokenized, its target generated when it is ``None``.

    Raises:
        ValueError: what :meth:`attnkit.models.Model.prepare_input` refuses, or a model
            that produces no token for the source.
    """
    source_ids, source_tokens, source_offsets = model.prepare_input(source)
    target_ids, target_tokens, target_offsets, target_text = _target(model, source_ids, target, max_new_tokens)
    if target_ids.shape[1] == 0:
        raise ValueError(f"{model.name} produced no token for this source; give a target text")
    return _Pair(
        source, source_ids, source_tokens, source_offsets, target_ids, target_tokens, target_offsets, target_text,
        target is None,
    )  # fmt: skip


def _target(
    model: Any, source_ids: Tensor, target: str | Tensor | Sequence[int] | None, max_new_tokens: int
) -> tuple[Tensor, list[str], list[tuple[int, int]] | None, str]:
    """``(ids [1, s_tgt], tokens, offsets, text)`` of the given target, or of the one the
    model generates greedily from the source when ``target`` is ``None``."""
    if target is not None:
        target_ids, target_tokens, target_offsets = model.prepare_input(target)
        target_text = target if isinstance(target, str) else model.tokenizer.decode(target_ids[0])
        return target_ids, target_tokens, target_offsets, target_text
    target_ids = torch.tensor([generate_target(model, source_ids, max_new_tokens)])  # [1, s_tgt]
    target_tokens = [model.tokenizer.id_to_token(i) for i in target_ids[0].tolist()]
    return target_ids, target_tokens, None, model.tokenizer.decode(target_ids[0], skip_special_tokens=True)
