"""What the code built on models reads from one: the :class:`InspectableModel` protocol.

Inspection (:mod:`attnkit.inspect`), the pictures and the viewer (:mod:`attnkit.viz`) and the
web app (:mod:`attnkit.serve`) take any object with these attributes and methods, not only
an :class:`attnkit.models.Model`: a test stand-in, or a wrapper around another library's
model, works as well. :class:`attnkit.models.Model` implements it, which mypy checks here.

Shape letters: ``b`` texts, ``s`` tokens, ``h_sel`` the heads asked for, ``n_r`` the query
rows asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from torch import Tensor

    from attnkit.models.model import Model


class TokenizedLike(Protocol):
    """A text split into tokens, as :class:`attnkit.models.TokenizedText` gives it."""

    @property
    def ids(self) -> Tensor:
        """Token ids ``[1, s]``."""
        ...

    @property
    def tokens(self) -> list[str]:
        """The ``s`` token strings."""
        ...


class RunLike(Protocol):
    """One text's forward pass, as :class:`attnkit.models.ModelRun` gives it."""

    @property
    def ids(self) -> Tensor:
        """Token ids ``[1, s]``."""
        ...

    @property
    def tokens(self) -> list[str]:
        """The ``s`` token strings."""
        ...

    @property
    def offsets(self) -> Sequence[tuple[int, int]] | None:
        """Each token's ``(start, end)`` character span; ``None`` for a run given ids."""
        ...

    @property
    def attentions(self) -> Mapping[int, Tensor]:
        """Layer index → weights ``[1, h_sel, n_r, s]`` of the layers asked for."""
        ...

    @property
    def heads(self) -> list[int]:
        """The heads kept, in the order of dimension 1 of every map."""
        ...

    @property
    def rows(self) -> range:
        """The query positions of dimension 2 of every map (``range(s)`` unless some were asked)."""
        ...


@runtime_checkable
class InspectableModel(Protocol):
    """A model whose attention can be inspected: its sizes, its tokenizer, and runs that
    hand back attention maps.

    Attributes:
        name: what messages call it (``"smollm2"``).
        family: its family's name (``"llama"``, ``"bert"``).
        num_layers: layers; ``num_heads``: query heads per layer; ``num_kv_heads``:
            key/value heads per layer.
        max_length: the longest input in tokens.
        causal: a causal decoder (a token attends only to earlier ones).
        encoder_decoder: an encoder–decoder (T5, BART), which also reads a source and a
            target (:meth:`attnkit.models.Model.run_encoder_decoder`).

    The two flags make the model's kind, which what inspects a model asks of
    :func:`attnkit.models.model_kind` (with :func:`attnkit.models.model.kinds.require_kind`
    and :func:`attnkit.models.model.kinds.for_kind`) instead of reading them itself.
    """

    @property
    def name(self) -> str: ...

    @property
    def family(self) -> str: ...

    @property
    def num_layers(self) -> int: ...

    @property
    def num_heads(self) -> int: ...

    @property
    def num_kv_heads(self) -> int: ...

    @property
    def max_length(self) -> int: ...

    @property
    def causal(self) -> bool: ...

    @property
    def encoder_decoder(self) -> bool: ...

    def tokenize(self, text: str) -> TokenizedLike:
        """Split ``text`` into tokens.

        Raises:
            ValueError: a text the model cannot read (empty, longer than ``max_length``).
        """
        ...

    def run(
        self,
        text_or_ids: str | Tensor | Sequence[int],
        *,
        return_weights: bool | Sequence[int] = True,
        heads: Sequence[int] | None = None,
        logits: bool = True,
        rows: range | slice | None = None,
    ) -> RunLike:
        """One forward pass with the weights of the layers in ``return_weights`` (``True``: all;
        negative indices count from the end), of ``heads`` (default all) on the query
        positions ``rows`` (a range, or a slice of the tokens; default all); ``logits=False``
        skips the next-token logits when only attention is wanted.

        Raises:
            ValueError: a text the model cannot read, a layer, head or row out of range.
        """
        ...

    def run_batch(
        self,
        inputs: Sequence[str | Tensor | Sequence[int]],
        *,
        return_weights: bool | Sequence[int] = True,
        heads: Sequence[int] | None = None,
        logits: bool = True,
        stop: Callable[[], bool] | None = None,
        rows: range | slice | None = None,
    ) -> Sequence[RunLike]:
        """:meth:`run` on several inputs in as few passes as possible; ``stop()``, when
        given, is asked before the work and may end it with an error; ``rows`` are each
        input's own.

        Raises:
            ValueError: as :meth:`run`, for any of the inputs.
        """
        ...


if TYPE_CHECKING:

    def _model_is_inspectable(model: Model) -> InspectableModel:
        return model  # mypy: Model implements InspectableModel
