"""What a model of one text is measured by, said once per kind: its readout.

A causal decoder predicts the next token: ablation, patching and the gradient-weighted maps
read its next-token logits at the last position and measure a target token there (its
log-probability, or its logit minus a wrong token's). A bidirectional encoder predicts no
token: they read its last hidden states and measure the sentence embedding (the mean of the
token vectors, :func:`attnkit.inspect.targets.sentence_embedding`) by a cosine, and refuse
target tokens and metrics of logits. :func:`readout` picks the :class:`Readout` of a
model's kind (:data:`CAUSAL_READOUT`, :data:`ENCODER_READOUT`) through
:func:`attnkit.models.model.kinds.for_kind`; the analyses ask it instead of the model's
``causal``. An encoder–decoder reads a source and a target and has no readout of one text
(:mod:`attnkit.inspect.encoder_decoder_ablation` measures the target text's log-probability).

Shape letters: ``b`` rows of a batch, ``s`` tokens, ``e`` model dim, ``v`` vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attnkit.inspect import targets
from attnkit.models.model.kinds import NEXT_TOKEN, SENTENCE_EMBEDDING, KindedModel, ModelKind, for_kind

if TYPE_CHECKING:
    from attnkit.models import Model


@dataclass(frozen=True)
class Readout:
    """What the output of a model of one kind is read from, how a target is taken, what a
    metric compares, and what is refused with which message.

    Attributes:
        kind: the kind of model read this way (:data:`attnkit.models.MODEL_KINDS`).
        called: how a refusal names the model after its name (``"is causal: "``).
        default_metric: the metric of patching when none is given.
        metrics: the named metrics (:data:`attnkit.inspect.names.METRICS`) it takes.
        other_metric: what a refusal of another named metric says (``{metric}``: the metric
            given).
        refused_tokens: what a refusal of target or wrong tokens says (``{given}``: the tokens
            given), or ``None`` where the readout takes them.
        refused_metric_object: what a refusal of a :class:`attnkit.inspect.metrics.Metric`
            (which reads logits) says, or ``None`` where it takes one.
        output: a run's output (logits ``[b, s, v]`` or last hidden states ``[b, s, e]``) →
            what a metric reads, float32.
        output_of_hidden: ``(model, last hidden states [b, s, e])`` → the same, forming only
            the logits a metric reads.
        ablation_target: ``(model, target)`` → the id of an ablation's target token, or
            ``None`` where the readout measures without one.
        ablation_measure: ``(target, target id)`` → an ablation's measure in words, and as a
            function of a batch's :attr:`output` (the unablated row first) → ``[b]``.
        ablation_effects: ``(measure of the unablated run, measures)`` → ``(effects,
            baseline)``.
        gradient_target: ``(model, target)`` → what the gradient-weighted maps differentiate:
            last hidden states ``[1, s, e]`` → a scalar.
    """

    kind: ModelKind
    called: str
    default_metric: str
    metrics: tuple[str, ...]
    other_metric: str
    refused_tokens: str | None
    refused_metric_object: str | None
    output: Callable[[Tensor], Tensor]
    output_of_hidden: Callable[[Model, Tensor], Tensor]
    ablation_target: Callable[[Model, str | None], int | None]
    ablation_measure: Callable[[str | None, int | None], tuple[str, Callable[[Tensor], Tensor]]]
    ablation_effects: Callable[[Tensor, Tensor], tuple[Tensor, float]]
    gradient_target: Callable[[Model, str], Callable[[Tensor], Tensor]]

    def refusal(self, model: KindedModel, what: str) -> str:
        """A refusal's message: the model, its kind as :attr:`called` says, and ``what``."""
        return f"{model.name} {self.called}{what}"

    def refuse_tokens(self, model: KindedModel, **tokens: str | None) -> None:
        """Refuse the tokens given (``target=``, ``wrong=``) where the readout takes none.

        Raises:
            ValueError: a token given to a readout without tokens.
        """
        given = [name for name, value in tokens.items() if value is not None]
        if self.refused_tokens is not None and given:
            raise ValueError(self.refusal(model, self.refused_tokens.format(given=" or ".join(given))))

    def refuse_metric_object(self, model: KindedModel) -> None:
        """Refuse a :class:`attnkit.inspect.metrics.Metric` where the readout has no logits.

        Raises:
            ValueError: a readout without logits.
        """
        if self.refused_metric_object is not None:
            raise ValueError(self.refusal(model, self.refused_metric_object))

    def check_named_metric(self, model: KindedModel, metric: str) -> None:
        """Refuse a named metric the readout does not take.

        Raises:
            ValueError: a metric not in :attr:`metrics`.
        """
        if metric not in self.metrics:
            raise ValueError(self.refusal(model, self.other_metric.format(metric=repr(metric))))


def _last_position(out: Tensor) -> Tensor:
    return out[:, -1].float()  # [b, v]


def _next_token_target(model: Model, target: str | None) -> int:
    if target is None:
        raise ValueError(CAUSAL_READOUT.refusal(model, "give the target token whose log-probability to measure"))
    return targets.single_token(model, target, what="target")


def _log_p_measure(target: str | None, target_id: int | None) -> tuple[str, Callable[[Tensor], Tensor]]:
    assert target is not None and target_id is not None  # a causal model's target is checked

    def measure(output: Tensor) -> Tensor:
        return torch.log_softmax(output, dim=-1)[:, target_id]  # [b]

    return f"change in log p({target!r}) at the last position", measure


def _change_from_unablated(base: Tensor, measured: Tensor) -> tuple[Tensor, float]:
    return measured - base, float(base)


def _log_p_of_target(model: Model, target: str) -> Callable[[Tensor], Tensor]:
    target_id = targets.single_token(model, target)

    def value(hidden: Tensor) -> Tensor:
        logits = targets.last_logits(model, hidden)  # [1, v]
        targets.warn_if_space_missing(model, target, target_id, logits[0].detach())
        return torch.log_softmax(logits, dim=-1)[0, target_id]

    return value


CAUSAL_READOUT = Readout(
    kind="causal",
    called="is causal: ",
    default_metric="logit-diff",
    metrics=("logit-diff", "log-p"),
    other_metric=(
        "its metrics are 'logit-diff', 'log-p' or a function of the next-token logits; "
        "'cosine' is the sentence-embedding metric of encoders"
    ),
    refused_tokens=None,
    refused_metric_object=None,
    output=_last_position,
    output_of_hidden=targets.last_logits,
    ablation_target=_next_token_target,
    ablation_measure=_log_p_measure,
    ablation_effects=_change_from_unablated,
    gradient_target=_log_p_of_target,
)


def _hidden_states(out: Tensor) -> Tensor:
    return out.float()  # [b, s, e]


def _no_target(model: Model, target: str | None) -> None:
    return None


def _cosine_measure(target: str | None, target_id: int | None) -> tuple[str, Callable[[Tensor], Tensor]]:
    def measure(output: Tensor) -> Tensor:
        embeddings = targets.sentence_embedding(output)  # [b, e]
        return targets.cosine_to(embeddings, embeddings[0]) - 1.0

    return "change in the cosine of the sentence embedding to the unablated one (cos - 1)", measure


def _already_a_change(base: Tensor, measured: Tensor) -> tuple[Tensor, float]:
    return measured, 0.0


def _cosine_to_target_text(model: Model, target: str) -> Callable[[Tensor], Tensor]:
    with torch.no_grad():
        reference = targets.sentence_embedding(
            model.run_with_hooks(model.tokenize(target).ids, logits=False).last_hidden_state
        )[0]  # [e]
    return lambda hidden: targets.cosine_to(targets.sentence_embedding(hidden), reference)[0]


ENCODER_READOUT = Readout(
    kind="bidirectional",
    called="is a bidirectional encoder without next-token logits; ",
    default_metric="cosine",
    metrics=("cosine",),
    other_metric=(
        "its metric is 'cosine' (to the clean sentence embedding) or a function of the last hidden states, got {metric}"
    ),
    refused_tokens="it measures the sentence embedding and takes no {given} token",
    refused_metric_object="a Metric reads logits: give 'cosine' or a function of the last hidden states",
    output=_hidden_states,
    output_of_hidden=lambda model, hidden: _hidden_states(hidden),
    ablation_target=_no_target,
    ablation_measure=_cosine_measure,
    ablation_effects=_already_a_change,
    gradient_target=_cosine_to_target_text,
)


def readout(model: KindedModel) -> Readout:
    """The :class:`Readout` of ``model``'s kind.

    Raises:
        attnkit.models.ModelKindError: an encoder–decoder, which reads two texts.
    """
    return for_kind(
        model,
        {NEXT_TOKEN: CAUSAL_READOUT, SENTENCE_EMBEDDING: ENCODER_READOUT},
        what="one text's output is measured by next-token logits or a sentence embedding",
    )
