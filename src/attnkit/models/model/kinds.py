"""What kind a model is and what each kind can do, said in one place.

A model is one of three kinds (:data:`MODEL_KINDS`): ``"causal"``, a causal decoder, whose
tokens attend only to earlier ones and whose logits predict the next token (SmolLM2,
Gemma 3); ``"bidirectional"``, an encoder whose tokens attend to the whole text (MiniLM,
BERT); ``"encoder-decoder"``, which reads a source and writes a target through three kinds
of attention (T5, BART). :func:`model_kind` says which, from the two attributes of the
:class:`attnkit.models.InspectableModel` protocol (``encoder_decoder``, then ``causal``), so
that a model of your own needs nothing more. The web app's ``GET /api/info`` and the
viewer's data name the kinds with these strings.

The inspection tools, the command line and the web app ask this module instead of reading
those attributes themselves: :func:`require_kind` refuses a model of a kind a job cannot
take (:class:`ModelKindError`, which says what was expected and what was got), and
:func:`for_kind` picks the one handler of a job whose kinds hold the model's. The sets of
kinds below are what each kind can do; a job names the set it needs.

No PyTorch: the command line and the web app read it before anything heavy loads; it sits
below :class:`attnkit.models.Model`, whose generation asks it too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, Protocol, TypeVar, get_args

ModelKind = Literal["bidirectional", "causal", "encoder-decoder"]
# Every kind, in the order messages list them.
MODEL_KINDS: tuple[ModelKind, ...] = get_args(ModelKind)

# The kinds that read one text through one stack of self-attention (Model.run, the maps,
# the head surveys and detectors, the long-context summaries).
ONE_TEXT: frozenset[ModelKind] = frozenset({"causal", "bidirectional"})
# The kinds that read a source and a target (Model.run_encoder_decoder).
SOURCE_AND_TARGET: frozenset[ModelKind] = frozenset({"encoder-decoder"})
# The kinds whose logits predict the next token of the text they read (attribution
# patching, the needle probe).
NEXT_TOKEN: frozenset[ModelKind] = frozenset({"causal"})
# The kinds whose output is read as a sentence embedding: the mean of the last hidden states
# (what ablation, patching and the gradient-weighted maps measure without next-token logits).
SENTENCE_EMBEDDING: frozenset[ModelKind] = frozenset({"bidirectional"})
# The kinds that generate text (Model.generate: a causal decoder continues its prompt, an
# encoder-decoder writes the target of its source).
GENERATES: frozenset[ModelKind] = frozenset({"causal", "encoder-decoder"})

# How a message names a model of each kind.
_CALLED: dict[ModelKind, str] = {
    "bidirectional": "a bidirectional encoder",
    "causal": "a causal decoder",
    "encoder-decoder": "an encoder-decoder",
}

Handler = TypeVar("Handler")


class Kinded(Protocol):
    """What :func:`model_kind` reads: the two attributes that say a kind, which a model (of
    :class:`attnkit.models.InspectableModel`) and a family of
    :data:`attnkit.models.families.table.FAMILIES` both have."""

    @property
    def causal(self) -> bool: ...

    @property
    def encoder_decoder(self) -> bool: ...


class KindedModel(Kinded, Protocol):
    """What this module reads of a model: the attributes of
    :class:`attnkit.models.InspectableModel` that say its kind and name it in messages."""

    @property
    def name(self) -> str: ...

    @property
    def family(self) -> str: ...


class ModelKindError(ValueError):
    """A model of a kind the job asked of it cannot take (a ``ValueError``)."""


def model_kind(model: Kinded) -> ModelKind:
    """Which of :data:`MODEL_KINDS` ``model`` is: ``"encoder-decoder"`` when its
    ``encoder_decoder`` is true, else ``"causal"`` or ``"bidirectional"`` by its ``causal``."""
    if model.encoder_decoder:
        return "encoder-decoder"
    return "causal" if model.causal else "bidirectional"


def require_kind(model: KindedModel, kinds: frozenset[ModelKind], *, what: str) -> ModelKind:
    """``model``'s kind, checked to be one of ``kinds``.

    Args:
        model: the model a job was given.
        kinds: the kinds the job takes (:data:`ONE_TEXT`, :data:`NEXT_TOKEN`, ...).
        what: what the job does that the model's kind cannot, as the message says it after
            the model (``"attribution patching measures next-token logits"``).

    Raises:
        ModelKindError: another kind: ``"t5 is an encoder-decoder (t5); attribution patching
            measures next-token logits (expected a causal decoder)"``.
    """
    kind = model_kind(model)
    if kind not in kinds:
        expected = " or ".join(_CALLED[k] for k in MODEL_KINDS if k in kinds)
        raise ModelKindError(f"{model.name} is {_CALLED[kind]} ({model.family}); {what} (expected {expected})")
    return kind


def for_kind(model: KindedModel, handlers: Mapping[frozenset[ModelKind], Handler], *, what: str) -> Handler:
    """The handler of ``model``'s kind: how one job is done on each kind, in one mapping
    from the kinds each handler takes (``{ONE_TEXT: run_maps, SOURCE_AND_TARGET:
    run_encoder_decoder}``) instead of a branch on the model's attributes in every caller.

    Args:
        model: the model the job was given.
        handlers: kinds → what does the job on them; no kind in two entries.
        what: as :func:`require_kind`'s, for a kind no entry takes.

    Raises:
        ModelKindError: a kind no entry takes (as :func:`require_kind`).
    """
    kind = require_kind(model, frozenset().union(*handlers), what=what)
    return next(handler for kinds, handler in handlers.items() if kind in kinds)
