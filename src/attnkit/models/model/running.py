"""Runs of a :class:`attnkit.models.Model`: :meth:`~RunMixin.run` on one input and
:meth:`~RunMixin.run_batch` on several at once, through one forward path
(:meth:`~RunMixin._forward`, which :meth:`attnkit.models.Model.run_with_hooks` takes too);
a mixin over the attributes listed on :class:`RunMixin`, so that it never imports
:mod:`attnkit.models.model.model`. A batch pads shorter inputs, cuts each input's rows and
positions out of the batch's results, and asks a ``stop`` before every layer.

Shape letters: ``b`` batch, ``s`` number of tokens (padded), ``n`` one input's tokens,
``h_sel`` selected heads, ``n_r`` selected query rows, ``e`` model dim, ``v`` vocabulary size.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from attnkit.deprecation import renamed_keywords
from attnkit.functional.indices import normalize_indices, normalize_rows, select_indices
from attnkit.models.checkpoints.memory import MAP_ADVICE, check_run_memory
from attnkit.models.model.attentions import LayerAttentions
from attnkit.models.model.core import ModelCore
from attnkit.models.model.layer_range import stopped_at
from attnkit.models.model.runs import ForwardPass, ModelRun, RunStopped, returned_float, self_attention_weights
from attnkit.nn import ActivationCache, DecoderLayer, EncoderLayer, LayerSelection, StackOutput, WeightSelection
from attnkit.nn.hooks import HookPoint, Hooks, NameFilter
from attnkit.nn.text_module import TextModule


class RunMixin(ModelCore):
    """:meth:`run` and :meth:`run_batch` over the attributes below.

    Attributes (what the mixin reads of its class):
        name: for messages.
        module: the network.
        causal: whether a token attends only to itself and earlier tokens.
        num_layers, num_heads: sizes.
    """

    name: str
    module: TextModule
    causal: bool
    num_layers: int
    num_heads: int

    @renamed_keywords(cache="names_filter", removed_in="0.3")
    def run(
        self,
        text_or_ids: str | Tensor | Sequence[int],
        *,
        return_weights: LayerSelection = True,
        heads: Sequence[int] | None = None,
        logits: bool = True,
        rows: range | slice | None = None,
        names_filter: NameFilter = (),
        prepend_bos: bool | None = None,
    ) -> ModelRun:
        """One forward pass: logits (a causal decoder) or hidden states, and attention weights.

        Every layer's output comes from the fused kernel, which never materialises the
        ``[h, s, s]`` weights; a layer whose weights are asked for also forms those of the
        chosen heads on the chosen rows, and no others
        (:class:`attnkit.nn.WeightSelection`): one head's map of one layer costs
        ``rows × s × 4`` bytes beyond a plain pass. Hooks of enclosing :meth:`hooks`
        blocks act on the run (:mod:`attnkit.nn.hooks`).

        Args:
            text_or_ids: a text, or token ids ``[s]`` / ``[1, s]``.
            return_weights: ``True`` for every layer's weights, ``False`` for none, or a list
                of layer indices (negative ones count from the end: ``-1`` is the last layer),
                as the ``return_weights`` of the :mod:`attnkit.nn` stacks.
            heads: the heads whose weights to form (negative ones count from the end);
                default all.
            logits: compute the next-token logits (a causal decoder); ``False`` skips the vocabulary
                projection when only attention is wanted, and the run's ``logits`` is
                ``None``.
            rows: the query positions whose weights to form: a ``range``, or a ``slice``
                as a list of the ``s`` tokens is sliced (``slice(-64, None)``: the last 64);
                default all.
            names_filter: the activations to return in :attr:`ModelRun.cache`: names
                (:meth:`hook_names`), a predicate on names, or ``None`` for every one.
            prepend_bos: for a text, ``None`` tokenizes as the model's tokenizer does,
                ``True`` puts the BOS token first (TransformerLens' default), ``False``
                leaves it out (:meth:`tokenize`).

        Returns:
            A :class:`ModelRun`.

        Raises:
            TypeError: ids that are not integers.
            ValueError: an empty or too long input, ids outside the vocabulary, a layer,
                head or row out of range, or an unknown name in ``names_filter`` (the
                message lists the names).
            MemoryEstimateError: the weights, cached activations and logits asked for
                would exceed the memory available on the model's device
                (:mod:`attnkit.models.checkpoints.memory`).
        """
        ids, tokens, offsets = self.prepare_input(text_or_ids, prepend_bos=prepend_bos)
        layers, head_list = self._selection(return_weights, heads)
        s = ids.shape[1]
        row_range = normalize_rows(rows, s, context=f"the input has {s} tokens")
        check_run_memory(
            self,
            [(1, s)],
            weight_layers=len(layers),
            heads=len(head_list),
            rows=len(row_range),
            names_filter=names_filter,
            logits=logits,
            on=f"{s} tokens",
            advice=MAP_ADVICE,
        )
        selection = WeightSelection(heads=tuple(head_list), rows=row_range)
        # no_grad rather than inference_mode: the returned tensors stay ordinary tensors
        # that callers may use in any mode.
        with torch.no_grad():
            forward = self._forward(
                ids, layers=dict.fromkeys(layers, selection), logits=logits, names_filter=names_filter
            )
            attentions = {i: self_attention_weights(forward.out, i) for i in layers}  # [1, h_sel, n_r, s] each
        return ModelRun(
            ids=ids,
            tokens=tokens,
            offsets=offsets,
            logits=None if forward.logits is None else returned_float(forward.logits),
            last_hidden_state=returned_float(forward.out.output),  # [1, s, e]
            attentions=LayerAttentions(attentions, self.num_layers),
            heads=head_list,
            rows=row_range,
            cache=forward.cache,
        )

    def _forward(
        self,
        ids: Tensor,
        *,
        layers: Collection[int] | Mapping[int, WeightSelection] = (),
        padding: Tensor | None = None,
        logits: bool = True,
        hooks: Hooks | None = None,
        names_filter: NameFilter = (),
        backward_hooks: Hooks | None = None,
        incl_bwd: bool = False,
        start_at_layer: int = 0,
        residual: Tensor | None = None,
        stop_at_layer: int | None = None,
    ) -> ForwardPass:
        """The one forward path of :meth:`run`, :meth:`run_batch` and :meth:`run_with_hooks`:
        ids ``[b, s]`` through the network's hook points, in the caller's autograd mode.

        Args:
            ids: token ids ``[b, s]``, checked, on any device (moved to the model's).
            layers: the layers whose weights to return (every head's), or layer → the
                :class:`attnkit.nn.WeightSelection` of its weights to form.
            padding: ``None``, or ``[b, s]`` bool ``True`` on tokens and ``False`` on
                padding (on either side), which no token attends to.
            logits: compute the next-token logits (where the network has a head).
            hooks: name → function, applied after those of enclosing :meth:`hooks` blocks.
            names_filter: the activations to keep, as :meth:`run` takes them.
            backward_hooks: name → function on the gradient of that activation.
            incl_bwd: also keep the kept activations' gradients when a backward pass
                reaches them (:attr:`attnkit.nn.ActivationCache.grads`).
            start_at_layer, residual: start at this layer from this residual stream
                ``[b, s, e]`` (a :class:`attnkit.nn.DecoderLM`), ``ids`` giving the shape.
            stop_at_layer: end before this layer (:func:`~attnkit.models.model.layer_range.stopped_at`):
                the output is then the residual stream there, without logits.

        Returns:
            A :class:`attnkit.models.model.runs.ForwardPass`.
        """
        start = {} if residual is None else {"start_at_layer": start_at_layer, "residual": residual.to(self.device)}
        with (
            self.module.hook_session(
                hooks, names_filter=names_filter, backward_hooks=backward_hooks, incl_bwd=incl_bwd
            ) as kept,
            stopped_at(self.module, stop_at_layer, self.num_layers) as stopped,
        ):
            out = self.module.last_hidden_state(
                ids.to(self.device),
                padding=None if padding is None else padding.to(self.device),
                return_weights=layers if isinstance(layers, Mapping) else list(layers),
                **start,
            )
            assert isinstance(out, StackOutput)  # a record whenever return_weights is a list
            scores = self.module.logits(out.output) if logits and stop_at_layer is None else None  # [b, s, v]
        if stopped:
            return ForwardPass(StackOutput(stopped[0], []), None, kept)  # the residual stream [b, s, e]
        return ForwardPass(out, scores, kept)

    def _selection(self, return_weights: LayerSelection, heads: Sequence[int] | None) -> tuple[list[int], list[int]]:
        """The layers whose weights a run returns and the heads it keeps, checked."""
        head_list = normalize_indices(
            heads, self.num_heads, "head", context=f"{self.name} has {self.num_heads} heads per layer"
        )
        return self.layer_indices(return_weights), head_list

    def layer_indices(self, selection: LayerSelection | None) -> list[int]:
        """The layers a run or an analysis of this model works on: ``selection`` (``True`` or
        ``None`` for all, ``False`` for none, or indices, negative ones from the end) as
        sorted distinct indices ``0 .. num_layers - 1``.

        Raises:
            IndexOutOfRange: a layer out of range; the message gives the valid range.
            NotAnIndex: a layer that is not an int.
        """
        return select_indices(selection, self.num_layers, "layer", context=f"{self.name} has {self.num_layers} layers")

    @renamed_keywords(cache="names_filter", removed_in="0.3")
    def run_batch(
        self,
        inputs: Sequence[str | Tensor | Sequence[int]],
        *,
        return_weights: LayerSelection = True,
        heads: Sequence[int] | None = None,
        logits: bool = True,
        stop: Callable[[], bool] | None = None,
        rows: range | slice | None = None,
        names_filter: NameFilter = (),
        padding_side: Literal["right", "left"] = "right",
        prepend_bos: bool | None = None,
    ) -> list[ModelRun]:
        """:meth:`run` on several inputs at once, in as few forward passes as possible.

        A causal model runs every input in one pass, shorter ones padded at the end (a
        token never attends to later ones, so the padding changes nothing before it) or,
        with ``padding_side="left"``, at the start, masked and with each row's positions
        counted from its first token. A bidirectional model runs the inputs of each length
        together. Each run equals :meth:`run` of its input up to float rounding (matrix
        products of another batch size may sum in another order). Hooks of enclosing
        :meth:`hooks` blocks see the padded batch.

        Args:
            inputs: texts or token ids, as :meth:`run` takes them.
            return_weights: the layers whose weights to return, as in :meth:`run`.
            heads: the heads whose weights to form, as in :meth:`run`.
            logits: compute the next-token logits (a causal decoder); ``False`` skips the vocabulary
                projection (a sixth of SmolLM2's work) when only attention is wanted, and
                every run's ``logits`` is ``None``.
            stop: asked before every layer; when it returns ``True`` the pass ends with
                :class:`RunStopped` (a server stops the work of clients that have gone).
            rows: the query positions whose weights to form, as in :meth:`run`, of each
                input (a slice counts from each input's own end).
            names_filter: the activations to return in each run's :attr:`ModelRun.cache`, as
                :meth:`run` takes them: each run's own row, without the padding.
            padding_side: where a causal model pads shorter inputs, ``"right"`` or
                ``"left"``.
            prepend_bos: for texts, as in :meth:`run`.

        Returns:
            One :class:`ModelRun` per input, in order.

        Raises:
            TypeError, ValueError: as :meth:`run`, for any input (before any runs); the
                memory limit counts the padded batch.
            RunStopped: ``stop`` returned ``True``.
        """
        if padding_side not in ("right", "left"):
            raise ValueError(f'padding_side must be "right" or "left", got {padding_side!r}')
        prepared = [self.prepare_input(item, prepend_bos=prepend_bos) for item in inputs]
        layers, head_list = self._selection(return_weights, heads)
        lengths = [ids.shape[1] for ids, _, _ in prepared]
        row_ranges = [normalize_rows(rows, n, context=f"input {i} has {n} tokens") for i, n in enumerate(lengths)]
        groups: dict[int, list[int]] = {}
        for i, n in enumerate(lengths):
            groups.setdefault(0 if self.causal else n, []).append(i)
        padded = [(len(group), max(lengths[i] for i in group)) for group in groups.values()]
        owns = {i: _own(lengths[i], s, padding_side) for group, (_, s) in zip(groups.values(), padded) for i in group}
        # The rows each pass forms: those of its inputs, in padded positions, end to end.
        asked = [_union([_shifted(row_ranges[i], owns[i]) for i in group]) for group in groups.values()]
        check_run_memory(
            self,
            padded,
            weight_layers=len(layers),
            heads=len(head_list),
            rows=max((len(r) for r in asked), default=0),
            names_filter=names_filter,
            logits=logits,
            on=f"{len(prepared)} inputs",
            advice="run fewer at once, or " + MAP_ADVICE,
        )
        runs: list[ModelRun | None] = [None] * len(prepared)
        points = self.module.hook_points() if names_filter != () else {}
        with torch.no_grad(), self._stopped_by(stop):
            for group, (_, s), formed in zip(groups.values(), padded, asked):
                ids, padding = pad_rows([prepared[i][0][0] for i in group], s, padding_side)  # [b, s] x 2
                # Padding at the end is unseen by a causal model's tokens: no mask needed.
                needs_mask = padding_side == "left" and not bool(padding.all())
                forward = self._forward(
                    ids,
                    layers=dict.fromkeys(layers, WeightSelection(heads=tuple(head_list), rows=formed)),
                    padding=padding if needs_mask else None,
                    logits=logits,
                    names_filter=names_filter,
                )
                for row, i in enumerate(group):
                    own, mine = owns[i], _shifted(row_ranges[i], owns[i])
                    kept = slice(mine.start - formed.start, mine.stop - formed.start)
                    batch_rows = _BatchRows(
                        forward.out, forward.logits, _rows_of(forward.cache, points, row, own), row, own, kept
                    )
                    runs[i] = self._run_of_row(prepared[i], batch_rows, layers, head_list, row_ranges[i])
        return [run for run in runs if run is not None]

    @contextlib.contextmanager
    def _stopped_by(self, stop: Callable[[], bool] | None) -> Iterator[None]:
        """Ask ``stop`` before every layer while the block runs, and end the pass with
        :class:`RunStopped` when it returns ``True``."""
        if stop is None:
            yield
            return

        def check(_module: nn.Module, _args: Any) -> None:
            if stop():
                raise RunStopped("the run was stopped")

        # Asked through each layer's self-attention norm, a module call in every layer
        # (before the attention in pre-norm layers, after it in post-norm ones).
        layers = [m for m in self.module.modules() if isinstance(m, (EncoderLayer, DecoderLayer))]
        handles = [layer.self_attn_norm.register_forward_pre_hook(check) for layer in layers]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _run_of_row(
        self,
        prepared: tuple[Tensor, list[str], list[tuple[int, int]] | None],
        rows: _BatchRows,
        layers: list[int],
        head_list: list[int],
        row_range: range,
    ) -> ModelRun:
        """The :class:`ModelRun` of one input of a batch: its row, without the padding."""
        own_ids, tokens, offsets = prepared
        row, own = rows.row, rows.own
        hidden = rows.out.output  # [b, s, e]
        weights = {
            layer: self_attention_weights(rows.out, layer)[row : row + 1, :, rows.kept, own].clone() for layer in layers
        }  # [1, h_sel, n_r, n] each
        return ModelRun(
            ids=own_ids,
            tokens=tokens,
            offsets=offsets,
            logits=None
            if rows.scores is None
            else returned_float(rows.scores[row : row + 1, own]).clone(),  # [1, n, v]
            last_hidden_state=returned_float(hidden[row : row + 1, own]).clone(),  # [1, n, e]
            attentions=LayerAttentions(weights, self.num_layers),
            heads=head_list,
            rows=row_range,
            cache=rows.cache,
        )


@dataclass(frozen=True)
class _BatchRows:
    """Where one input's results lie in a batch's: the family's output, the logits (or
    ``None``), the input's own cache, its row, its positions (without the padding) and its
    chosen rows among those the maps hold."""

    out: StackOutput
    scores: Tensor | None
    cache: ActivationCache
    row: int
    own: slice
    kept: slice


def _own(n: int, s: int, padding_side: str) -> slice:
    """The positions of an input of ``n`` tokens padded to ``s`` on ``padding_side``."""
    return slice(s - n, s) if padding_side == "left" else slice(0, n)


def _shifted(rows: range, own: slice) -> range:
    """An input's chosen rows as positions of the padded pass its tokens lie at (``own``)."""
    return range(own.start + rows.start, own.start + rows.stop)


def _union(ranges: Sequence[range]) -> range:
    """The rows from the first start to the last stop of ``ranges``."""
    return range(min(r.start for r in ranges), max(r.stop for r in ranges))


def _rows_of(cache: ActivationCache, points: Mapping[str, HookPoint], row: int, own: slice) -> ActivationCache:
    """One row of a batch's cache, its positions cut to ``own`` (the padding of a shorter
    input removed), as copies."""
    out = ActivationCache(cache.model)
    for name, activation in cache.items():
        index: list[slice] = [slice(row, row + 1)] + [slice(None)] * (activation.ndim - 1)
        for dim in points[name].positions:
            index[dim] = own
        out[name] = activation[tuple(index)].clone()
    return out


def pad_rows(rows: Sequence[Tensor], length: int, side: str) -> tuple[Tensor, Tensor]:
    """Token id rows ``[n_i]`` padded to ``length`` on ``side`` with id 0: ``(ids [b, s],
    padding [b, s])``, the padding ``True`` on tokens."""
    ids = torch.zeros(len(rows), length, dtype=torch.long)  # [b, s]
    padding = torch.zeros(len(rows), length, dtype=torch.bool)  # [b, s]
    for row, tokens in enumerate(rows):
        own = slice(length - len(tokens), length) if side == "left" else slice(0, len(tokens))
        ids[row, own] = tokens
        padding[row, own] = True
    return ids, padding
