"""Metrics of a run for ablation, patching and attribution patching: a function of the
logits of every position (and, if it asks, of named activations of the run), one number
per row of a batch.

:class:`Metric` wraps such a function; the ready ones are :func:`logit_difference`,
:func:`log_probability` and :func:`loss`; :func:`of_logits` and :func:`of_cache` wrap a
function of your own. :func:`attnkit.inspect.interventions.head_ablation`,
:func:`~attnkit.inspect.interventions.activation_patching`,
:func:`~attnkit.inspect.patching_grids.every_block_patching` and
:func:`~attnkit.inspect.patching_grids.attribution_patching` take one as ``metric=``.

Shape letters: ``b`` rows of a batch, ``s`` tokens, ``v`` vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torch import Tensor

from attnkit.functional.finite import check_finite
from attnkit.models.model.lens import lm_cross_entropy

if TYPE_CHECKING:
    from attnkit.models import Model


@dataclass(frozen=True)
class MetricInput:
    """What a metric reads of a run.

    Attributes:
        logits: ``[b, s, v]`` float32, every position's next-token logits.
        ids: ``[b, s]``, the token ids the run read.
        cache: the activations the metric named in :attr:`Metric.reads`, name → ``[b, ...]``.
    """

    logits: Tensor
    ids: Tensor
    cache: Mapping[str, Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class Metric:
    """A measure of a run, one number per row: ``function(MetricInput) -> [b]``.

    Attributes:
        function: the measure.
        name: what it measures, in words (it labels the grids).
        reads: hook names (:meth:`attnkit.models.Model.hook_names`) whose activations the
            function reads from :attr:`MetricInput.cache`.
    """

    function: Callable[[MetricInput], Tensor]
    name: str
    reads: tuple[str, ...] = ()

    def __call__(self, run: MetricInput) -> Tensor:
        """``[b]`` float32: the measure of each row of ``run``.

        Raises:
            ValueError: a function that does not return one finite number per row.
        """
        rows = run.logits.shape[0]
        values = self.function(run)
        if not isinstance(values, Tensor) or values.shape != (rows,):
            got = list(values.shape) if isinstance(values, Tensor) else type(values).__name__
            raise ValueError(f"the metric {self.name!r} must return one number per row, a tensor [{rows}], got {got}")
        check_finite(values.detach().float(), f"the metric {self.name!r}")
        return values.float()


def logit_difference(model: Model, target: str, wrong: str, *, position: int = -1) -> Metric:
    """``logit(target) - logit(wrong)`` at ``position`` (default the last).

    Raises:
        ValueError: a token that is not a single token of ``model``.
    """
    target_id, wrong_id = model.to_single_token(target, what="target"), model.to_single_token(wrong, what="wrong")
    return Metric(
        lambda run: run.logits[:, position, target_id] - run.logits[:, position, wrong_id],
        f"logit difference {target!r} - {wrong!r}",
    )


def log_probability(model: Model, target: str, *, position: int = -1) -> Metric:
    """``log p(target)`` as the next token at ``position`` (default the last).

    Raises:
        ValueError: a target that is not a single token of ``model``.
    """
    target_id = model.to_single_token(target, what="target")
    return Metric(lambda run: run.logits[:, position].log_softmax(-1)[:, target_id], f"log p({target!r})")


def loss() -> Metric:
    """The mean next-token cross-entropy of each row on the ids it read (position ``i``
    predicting token ``i + 1``; TransformerLens' ``loss_fn`` per row)."""
    return Metric(lambda run: lm_cross_entropy(run.logits, run.ids, per_token=True).mean(-1), "next-token loss")


def of_logits(function: Callable[[Tensor], Tensor], name: str | None = None) -> Metric:
    """A metric of the logits of every position: ``function(logits [b, s, v]) -> [b]``;
    ``name`` defaults to the function's own name."""
    return Metric(lambda run: function(run.logits), name or _named(function))


def of_cache(
    function: Callable[[MetricInput], Tensor], reads: list[str] | tuple[str, ...], name: str | None = None
) -> Metric:
    """A metric that reads activations of the run as well: ``function(MetricInput) -> [b]``,
    with the hook names ``reads`` in :attr:`MetricInput.cache`."""
    return Metric(function, name or _named(function), tuple(reads))


def _named(function: Callable[..., Tensor]) -> str:
    label = getattr(function, "__name__", "")
    return "metric" if not label or label == "<lambda>" else f"metric {label}"
