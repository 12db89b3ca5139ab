"""Head detectors: how much of each head's attention on a text follows a detection
pattern, for every head, as TransformerLens' ``detect_head`` with its ``"mul"`` measure.

A detection pattern is ``[s, s]`` (query rows, key columns), ``1`` where a head of the
kind would attend:

- ``"previous-token"``: each token attends to the one before it.
- ``"duplicate-token"``: each token attends to the earlier occurrences of itself.
- ``"induction"``: each token attends to the tokens right after the earlier occurrences
  of itself (``A B ... A → B``): the duplicate-token pattern moved one key to the right.
- a user's own ``[s, s]`` pattern (the "it → animal" rows of a coreference head, say).

A head's score is the share of its attention mass, over every query of the text, that
falls where the pattern is (``Σ pattern · weights / Σ weights``): ``1`` for a head that
attends only there, near ``0`` for one that never does. Queries that have no place to go
in the pattern (the first tokens of a text, for duplicates) still count in the
denominator, as in TransformerLens; ``exclude_bos`` and ``exclude_current`` leave the
first key and each query's own key out of both sums.

Shape letters: ``L`` layers, ``h`` heads, ``s`` tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attnkit.deprecation import deprecated_aliases
from attnkit.inspect.names import DETECTORS
from attnkit.models.protocol import InspectableModel

__all__ = ["DETECTORS", "HeadDetection", "detect_heads", "detection_pattern"]


def detection_pattern(kind: str, ids: Tensor | Sequence[int]) -> Tensor:
    """The ``[s, s]`` float pattern of one of :data:`DETECTORS` for token ids ``[s]``.

    Raises:
        ValueError: an unknown kind, ids that are not one sequence.
    """
    ids = torch.as_tensor(ids)
    if ids.ndim != 1:
        raise ValueError(f"ids must be one sequence [s], got {list(ids.shape)}")
    s = ids.shape[0]
    if kind == "previous-token":
        return torch.diag(torch.ones(s - 1), -1)
    duplicate = torch.tril(ids[:, None] == ids[None, :], diagonal=-1)  # [s, s], keys before the query
    if kind == "duplicate-token":
        return duplicate.float()
    if kind == "induction":
        after = torch.zeros(s, s, dtype=torch.bool)
        after[:, 1:] = duplicate[:, :-1]  # the key after each earlier occurrence
        return torch.tril(after).float()
    raise ValueError(f"detector must be one of {DETECTORS} or an [s, s] pattern, got {kind!r}")


@deprecated_aliases(model="model_name", removed_in="0.3")
@dataclass(frozen=True)
class HeadDetection:
    """Every head's score against one detection pattern on one text.

    Attributes:
        model_name: the model's name.
        detector: the kind (:data:`DETECTORS`) or ``"custom"``.
        text: the text (``""`` for ids).
        tokens: its token strings.
        layers: the layers, in the order of the rows of ``scores``.
        columns: the heads' numbers, as labels.
        scores: ``[L, h]`` float32 in ``[0, 1]``.
        pattern: the ``[s, s]`` detection pattern used.
    """

    model_name: str
    detector: str
    text: str
    tokens: list[str]
    layers: list[int]
    columns: list[str]
    scores: Tensor
    pattern: Tensor

    def top(self, n: int = 5) -> list[tuple[int, int, float]]:
        """The ``n`` highest-scoring heads as ``(layer, head, score)``."""
        flat = self.scores.flatten()
        order = flat.argsort(descending=True)[:n].tolist()
        h = self.scores.shape[1]
        return [(self.layers[i // h], i % h, float(flat[i])) for i in order]

    def to_dict(self, digits: int = 6) -> dict[str, Any]:
        """A JSON-ready dict; ``scores[row][column]`` as the ablation grid lays them out."""
        return {
            "model": self.model_name,
            "kind": "detection",
            "detector": self.detector,
            "text": self.text,
            "tokens": self.tokens,
            "layers": self.layers,
            "columns": self.columns,
            "scores": [[round(v, digits) for v in row] for row in self.scores.tolist()],
        }


def detect_heads(
    model: InspectableModel,
    text_or_ids: str | Tensor | Sequence[int],
    detector: str | Tensor,
    *,
    layers: Sequence[int] | None = None,
    exclude_bos: bool = False,
    exclude_current: bool = False,
    prepend_bos: bool | None = None,
) -> HeadDetection:
    """Score every head of ``layers`` against a detection pattern on one text.

    Args:
        model_name: the model.
        text_or_ids: the text, or its ids ``[s]`` / ``[1, s]``.
        detector: one of :data:`DETECTORS`, or a ``[s, s]`` pattern (any non-negative
            weights; rows are queries).
        layers: the layers to score (negative from the end); default all.
        exclude_bos: leave key 0 (the first token, an attention sink in many models) out.
        exclude_current: leave each query's own key out.
        prepend_bos: for a text, as :meth:`attnkit.models.Model.tokenize` takes it
            (``True``: a BOS first, as TransformerLens' ``detect_head``).

    Returns:
        A :class:`HeadDetection`.

    Raises:
        ValueError: an unknown detector, a pattern of another shape than ``[s, s]``, a
            text the model refuses, a layer out of range.
    """
    # prepend_bos is a keyword of the models that tokenize texts (attnkit.models.Model).
    options: dict[str, Any] = {} if prepend_bos is None else {"prepend_bos": prepend_bos}
    run = model.run(text_or_ids, return_weights=True if layers is None else list(layers), logits=False, **options)
    ids = run.ids[0]
    s = ids.shape[0]
    if isinstance(detector, Tensor):
        if detector.shape != (s, s):
            raise ValueError(
                f"a detection pattern must be [s, s] = [{s}, {s}] for this text, got {list(detector.shape)}"
            )
        pattern, name = detector.float(), "custom"
    else:
        pattern, name = detection_pattern(detector, ids), detector
    chosen = sorted(run.attentions)
    weights = torch.stack([run.attentions[i][0] for i in chosen]).float()  # [L, h, s, s]
    keep = torch.ones(s, s)
    if exclude_bos:
        keep[:, 0] = 0
    if exclude_current:
        keep.fill_diagonal_(0)
    weights = weights * keep.to(weights.device)
    total = weights.sum((-1, -2)).clamp(min=torch.finfo(weights.dtype).tiny)  # [L, h]
    scores = (weights * pattern.to(weights.device)).sum((-1, -2)) / total  # [L, h]
    return HeadDetection(
        model_name=model.name,
        detector=name,
        text=text_or_ids if isinstance(text_or_ids, str) else "",
        tokens=list(run.tokens),
        layers=chosen,
        columns=[str(h) for h in run.heads],
        scores=scores.cpu(),
        pattern=pattern.cpu(),
    )
