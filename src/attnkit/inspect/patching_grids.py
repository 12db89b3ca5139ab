"""Patching of every block kind over every layer and position in one call, exactly
(:func:`every_block_patching`) or by its linear approximation (:func:`attribution_patching`).

A grid is an :class:`attnkit.inspect.interventions.InterventionEffects` (its rows, columns
and :attr:`~attnkit.inspect.interventions.InterventionEffects.axes` say what each axis is);
:class:`PatchingGrids` holds one per ``(component, by)`` of :data:`EVERY`:

- the residual stream into each layer and the attention and MLP blocks' outputs, by layer
  and position (layers × positions: TransformerLens' ``get_act_patch_block_every``);
- each head's ``z``, ``q``, ``k``, ``v`` and ``pattern`` at every position at once (layers ×
  heads, ``k`` and ``v`` by key/value head: ``get_act_patch_attn_head_all_pos_every``), and
  at one position for every head (layers × positions).

Attribution patching replaces each patch by the first-order term of its effect:
``(clean activation - corrupted activation) · ∂metric/∂activation`` at the corrupted run,
summed over what the patch replaces (a head's every position, or a position's every head
and dimension) and divided by the clean-minus-corrupted difference of the metric, as the
exact grids are. One forward and one backward pass of the corrupted text (the gradients
the activation cache keeps, ``incl_bwd=True``), and one forward pass of the clean one,
give every grid.

Shape letters: ``L`` layers, ``h`` heads, ``s`` tokens, ``d`` head dim, ``e`` model dim.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from attnkit.inspect import interventions
from attnkit.inspect.interventions import InterventionEffects, MetricFunction
from attnkit.inspect.maps import token_labels
from attnkit.inspect.metrics import Metric, MetricInput, log_probability, logit_difference, of_logits
from attnkit.models.model.kinds import NEXT_TOKEN, require_kind
from attnkit.nn.hooks import backward_of_scalar

if TYPE_CHECKING:
    from attnkit.models import Model

# Every (component, by) a sweep patches by default: the blocks by layer and position, each
# per-head component at every position (by head) and at one position (by layer and position).
BLOCKS = ("resid_pre", "attn_out", "mlp_out")
EVERY = (
    *((component, "layer-position") for component in BLOCKS),
    *((component, "head") for component in interventions.PER_HEAD),
    *((component, "layer-position") for component in interventions.PER_HEAD),
)


@dataclass(frozen=True)
class PatchingGrids:
    """The grids of one sweep, one per ``(component, by)``.

    Attributes:
        model_name: the model's name.
        kind: ``"patching"`` (exact) or ``"attribution patching"`` (linear approximation).
        grids: the grids, in the order asked for.
    """

    model_name: str
    kind: str
    grids: tuple[InterventionEffects, ...]

    def __getitem__(self, key: tuple[str, str]) -> InterventionEffects:
        """The grid of ``(component, by)``, e.g. ``grids["z", "head"]``.

        Raises:
            KeyError: a pair the sweep did not patch (the message lists those it did).
        """
        for grid in self.grids:
            if (grid.component, grid.by) == key:
                return grid
        raise KeyError(f"no grid {key!r}; this sweep has {', '.join(repr(k) for k in self.keys())}")

    def keys(self) -> list[tuple[str, str]]:
        """The ``(component, by)`` of every grid, in order."""
        return [(grid.component, grid.by) for grid in self.grids]

    def to_dict(self, digits: int = 6) -> dict[str, Any]:
        """A JSON-ready dict: the model, the kind and every grid's own dict."""
        return {
            "model": self.model_name,
            "kind": self.kind,
            "grids": [grid.to_dict(digits) for grid in self.grids],
        }


def every_block_patching(
    model: Model,
    clean: str,
    corrupt: str,
    *,
    metric: str | MetricFunction | Metric | None = None,
    target: str | None = None,
    wrong: str | None = None,
    layers: Sequence[int] | None = None,
    grids: Sequence[tuple[str, str]] = EVERY,
) -> PatchingGrids:
    """Activation patching of every ``(component, by)`` of ``grids`` over every layer and
    position (or head): one :func:`attnkit.inspect.interventions.activation_patching` per
    grid, with the same texts, metric and layers.

    Args:
        model: a causal decoder or a bidirectional encoder :mod:`attnkit.models` model.
        clean: the clean text.
        corrupt: the corrupted text, of the same number of tokens.
        metric, target, wrong, layers: as :func:`~attnkit.inspect.interventions.activation_patching`
            takes them.
        grids: the ``(component, by)`` pairs to patch (default :data:`EVERY`); ``by`` is
            ``"head"``, ``"layer-position"`` or ``"position"``.

    Returns:
        :class:`PatchingGrids` of kind ``"patching"``.

    Raises:
        ValueError: no grid, a pair patching cannot run (with what it says), and what
            :func:`~attnkit.inspect.interventions.activation_patching` refuses.
    """
    if not grids:
        raise ValueError("grids must name at least one (component, by) pair, got none")
    done = tuple(
        interventions.activation_patching(
            model, clean, corrupt, by=by, component=component, metric=metric, target=target, wrong=wrong, layers=layers
        )
        for component, by in grids
    )
    return PatchingGrids(model.name, "patching", done)


def attribution_patching(
    model: Model,
    clean: str,
    corrupt: str,
    *,
    metric: str | MetricFunction | Metric | None = None,
    target: str | None = None,
    wrong: str | None = None,
    layers: Sequence[int] | None = None,
    grids: Sequence[tuple[str, str]] = EVERY,
) -> PatchingGrids:
    """The linear approximation of :func:`every_block_patching`: each cell is
    ``(clean - corrupted activation) · ∂metric/∂activation`` at the corrupted run, summed
    over what the patch replaces, over ``clean - corrupted`` of the metric.

    Args:
        model: a causal decoder :mod:`attnkit.models` model.
        clean: the clean text.
        corrupt: the corrupted text, of the same number of tokens.
        metric: ``"logit-diff"`` (default: ``target`` minus ``wrong`` at the last position),
            ``"log-p"`` (of ``target``), a function of the last position's logits ``[b, v]``
            → ``[b]``, or a :class:`attnkit.inspect.metrics.Metric`.
        target, wrong: the tokens of the named metrics.
        layers: layer indices (negative from the end); default all.
        grids: the ``(component, by)`` pairs (default :data:`EVERY`); ``by`` is ``"head"``,
            ``"layer-position"`` or ``"position"`` (every layer of ``layers`` together).

    Returns:
        :class:`PatchingGrids` of kind ``"attribution patching"``: each grid's effects are
        the estimated fractions of the difference restored.

    Raises:
        ValueError: an encoder or encoder–decoder, texts of different token lengths, texts
            the metric does not tell apart, an unknown pair, a component the layers lack,
            and the tokens the metric refuses.
    """
    _check_attribution(model, grids)
    chosen = as_metric(model, metric, target, wrong)
    layer_list = model.layer_indices(layers)
    if not layer_list:
        raise ValueError("layers must name at least one layer, got none")
    clean_enc, corrupt_enc = interventions.same_length_pair(model, clean, corrupt)
    components = sorted({component for component, _ in grids})
    names = {(c, i): interventions.hook_point(model, c, i) for c in components for i in layer_list}
    reads = list(chosen.reads)
    with torch.no_grad():
        clean_logits, clean_cache = model.run_with_cache(clean_enc.ids, names_filter=[*names.values(), *reads])
        clean_value = float(chosen(_input(clean_logits, clean_enc.ids, clean_cache, reads))[0])
    corrupt_value, corrupted, gradients = metric_gradients(model, corrupt_enc.ids, chosen, list(names.values()))
    gap = clean_value - corrupt_value
    if abs(gap) < 1e-6:
        raise ValueError(
            f"the clean and corrupted texts give the same measure ({clean_value:.6g}); there is no difference to restore"
        )
    labels = token_labels(clean, clean_enc.tokens, clean_enc.offsets)
    done = []
    for component, by in grids:
        rows = []
        for layer in layer_list:
            name = names[component, layer]
            terms = (clean_cache[name][0].to(gradients[name]) - corrupted[name][0]) * gradients[name][0]
            rows.append(_summed(terms, component, by))
        effects = torch.stack(rows)  # [L, h or s], or [L, h, s] by head and position
        if by == "position":
            effects = effects.sum(0, keepdim=True)  # [1, s]: every layer patched together
        heads = effects.shape[1] if by == "head-position" else 0
        effects = effects.flatten(0, 1) if by == "head-position" else effects  # [L * h, s]
        count = effects.shape[1]
        done.append(
            InterventionEffects(
                model_name=model.name,
                kind="attribution patching",
                metric=f"fraction of the {chosen.name} restored (linear approximation)",
                by=by,
                component=component,
                layers=layer_list,
                columns=[str(head) for head in range(count)] if by == "head" else labels,
                effects=(effects / gap).float().cpu(),
                texts={"clean": clean, "corrupt": corrupt},
                tokens=list(clean_enc.tokens),
                target=target,
                wrong=wrong,
                replacement="clean",
                baseline={"clean": clean_value, "corrupt": corrupt_value},
                rows=[f"L{layer}H{head}" for layer in layer_list for head in range(heads)] if heads else None,
            )
        )
    return PatchingGrids(model.name, "attribution patching", tuple(done))


def _check_attribution(model: Model, grids: Sequence[tuple[str, str]]) -> None:
    """Refuse a model without next-token logits, no grid, and a grid attribution patching
    cannot estimate."""
    require_kind(model, NEXT_TOKEN, what="attribution patching measures next-token logits")
    if not grids:
        raise ValueError("grids must name at least one (component, by) pair, got none")
    for component, by in grids:
        if by == "dest-src":
            raise ValueError(
                "attribution patching runs by 'head', 'layer-position', 'position' or 'head-position', not 'dest-src'"
            )
        interventions.check_where(by, component)


def metric_gradients(
    model: Model, ids: Tensor, metric: Metric, names: list[str]
) -> tuple[float, dict[str, Tensor], dict[str, Tensor]]:
    """One forward and backward pass of ``ids`` ``[1, s]`` (the gradients the cache keeps,
    :meth:`attnkit.models.Model.run_with_hooks` with ``incl_bwd=True``): the metric's value,
    and the activation and the metric's gradient with respect to it at each hook name (each
    ``[1, ...]``, float64)."""
    reads = list(metric.reads)
    with torch.enable_grad():
        run = model.run_with_hooks(ids, names_filter=list(dict.fromkeys([*names, *reads])), incl_bwd=True)
        assert run.logits is not None  # a causal decoder's run
        value = metric(MetricInput(run.logits.float(), ids, {name: run.cache[name] for name in reads}))[0]
        backward_of_scalar(value, run.cache)
    run.cache.detach_entries()
    activations = {name: run.cache[name].double() for name in names}
    return float(value.detach()), activations, {name: run.cache.grads[name].double() for name in names}


def as_metric(
    model: Model, metric: str | MetricFunction | Metric | None, target: str | None, wrong: str | None
) -> Metric:
    """``metric`` as a :class:`Metric` of a causal model's logits: a named one (with its
    tokens), a function of the last position's logits ``[b, v]``, or a Metric itself."""
    name = interventions.check_metric(model, metric, target, wrong)
    if isinstance(metric, Metric):
        return metric
    if name == "logit-diff":
        interventions.token_ids(model, name, target, wrong)
        assert target is not None and wrong is not None
        return logit_difference(model, target, wrong)
    if name == "log-p":
        interventions.token_ids(model, name, target, wrong)
        assert target is not None
        return log_probability(model, target)
    assert callable(metric)
    function = metric
    label = getattr(function, "__name__", "")
    return of_logits(
        lambda logits: function(logits[:, -1]), "metric" if not label or label == "<lambda>" else f"metric {label}"
    )


def _input(logits: Tensor, ids: Tensor, cache: Any, reads: list[str]) -> MetricInput:
    return MetricInput(logits.float(), ids, {name: cache[name] for name in reads})


def _summed(terms: Tensor, component: str, by: str) -> Tensor:
    """The first-order terms of one layer's activation, ``[h, s, d or s_k]`` per head or
    ``[s, e]``, summed into the cells of a grid row: ``[h]`` by head, ``[s]`` by position,
    ``[h, s]`` by head and position."""
    if by == "head":
        return terms.sum((1, 2))  # [h]
    if by == "head-position":
        return terms.sum(-1)  # [h, s]
    if component in interventions.PER_HEAD:
        return terms.sum((0, 2))  # [s]: every head at that query position
    return terms.sum(-1)  # [s]
