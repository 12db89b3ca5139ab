"""Runs of several inputs at once: :meth:`attnkit.models.Model.run_batch` (a mixin over
the attributes listed on :class:`BatchMixin`, so that it never imports
:mod:`attnkit.models.model`), with the padding of shorter inputs, each input's rows and
positions cut out of the batch's results, and a ``stop`` asked before every layer.

Shape letters: ``b`` batch, ``s`` number of tokens (padded), ``n`` one input's tokens,
``h_sel`` selected heads, ``e`` model dim, ``v`` vocabulary size.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from attnkit.deprecation import renamed_keywords
from attnkit.models.checkpoints.memory import check_run_memory
from attnkit.models.model.attentions import LayerAttentions
from attnkit.models.model.core import ModelCore
from attnkit.models.model.runs import ModelRun, RunStopped, self_attention_weights
from attnkit.nn import ActivationCache, DecoderLayer, EncoderLayer, LayerSelection, StackOutput
from attnkit.nn.hooks import HookPoint, NameFilter
from attnkit.nn.text_module import TextModule


class BatchMixin(ModelCore):
    """:meth:`run_batch` over the attributes below.

    Attributes (what the mixin reads of its class):
        module: the network.
        causal: whether a token attends only to itself and earlier tokens.
        num_layers: depth.
    """

    module: TextModule
    causal: bool
    num_layers: int

    @renamed_keywords(cache="names_filter", removed_in="0.3")
    def run_batch(
        self,
        inputs: Sequence[str | Tensor | Sequence[int]],
        *,
        return_weights: LayerSelection = True,
        heads: Sequence[int] | None = None,
        logits: bool = True,
        stop: Callable[[], bool] | None = None,
        names_filter: NameFilter = (),
        padding_side: Literal["right", "left"] = "right",
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
            heads: the heads to keep, as in :meth:`run`.
            logits: compute the next-token logits (LLaMA); ``False`` skips the vocabulary
                projection (a sixth of SmolLM2's work) when only attention is wanted, and
                every run's ``logits`` is ``None``.
            stop: asked before every layer; when it returns ``True`` the pass ends with
                :class:`RunStopped` (a server stops the work of clients that have gone).
            names_filter: the activations to return in each run's :attr:`ModelRun.cache`, as
                :meth:`run` takes them: each run's own row, without the padding.
            padding_side: where a causal model pads shorter inputs, ``"right"`` or
                ``"left"``.

        Returns:
            One :class:`ModelRun` per input, in order.

        Raises:
            TypeError, ValueError: as :meth:`run`, for any input (before any runs); the
                memory limit counts the padded batch.
            RunStopped: ``stop`` returned ``True``.
        """
        if padding_side not in ("right", "left"):
            raise ValueError(f'padding_side must be "right" or "left", got {padding_side!r}')
        prepared = [self.prepare_input(item) for item in inputs]
        layers, head_list = self._selection(return_weights, heads)
        lengths = [ids.shape[1] for ids, _, _ in prepared]
        groups: dict[int, list[int]] = {}
        for i, n in enumerate(lengths):
            groups.setdefault(0 if self.causal else n, []).append(i)
        padded = [(len(group), max(lengths[i] for i in group)) for group in groups.values()]
        check_run_memory(
            self,
            padded,
            weight_layers=len(layers),
            names_filter=names_filter,
            logits=logits,
            on=f"{len(prepared)} inputs",
            advice="run fewer at once",
        )
        runs: list[ModelRun | None] = [None] * len(prepared)
        points = self.module.hook_points() if names_filter != () else {}
        with torch.no_grad(), self._stopped_by(stop):
            for group, (_, s) in zip(groups.values(), padded):
                ids, padding = pad_rows([prepared[i][0][0] for i in group], s, padding_side)  # [b, s] x 2
                # Padding at the end is unseen by a causal model's tokens: no mask needed.
                needs_mask = padding_side == "left" and not bool(padding.all())
                forward = self._forward(
                    ids,
                    layers=layers,
                    padding=padding if needs_mask else None,
                    logits=logits,
                    names_filter=names_filter,
                )
                for row, i in enumerate(group):
                    n = lengths[i]
                    own = slice(s - n, s) if padding_side == "left" else slice(0, n)
                    rows = _BatchRows(forward.out, forward.logits, _rows_of(forward.cache, points, row, own), row, own)
                    runs[i] = self._run_of_row(prepared[i], rows, layers, head_list)
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
    ) -> ModelRun:
        """The :class:`ModelRun` of one input of a batch: its row, without the padding."""
        own_ids, tokens, offsets = prepared
        row, own = rows.row, rows.own
        hidden = rows.out.output  # [b, s, e]
        weights = {
            layer: self_attention_weights(rows.out, layer)[row : row + 1, head_list, own, own].float()
            for layer in layers
        }  # [1, h_sel, n, n] each
        return ModelRun(
            ids=own_ids,
            tokens=tokens,
            offsets=offsets,
            logits=None if rows.scores is None else rows.scores[row : row + 1, own].float().clone(),  # [1, n, v]
            last_hidden_state=hidden[row : row + 1, own].float().clone(),  # [1, n, e]
            attentions=LayerAttentions(weights, self.num_layers),
            heads=head_list,
            cache=rows.cache,
        )


@dataclass(frozen=True)
class _BatchRows:
    """Where one input's results lie in a batch's: the family's output, the logits (or
    ``None``), the input's own cache, its row and its positions (without the padding)."""

    out: StackOutput
    scores: Tensor | None
    cache: ActivationCache
    row: int
    own: slice


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
