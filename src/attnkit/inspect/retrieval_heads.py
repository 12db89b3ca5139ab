"""Retrieval heads: a needle-in-a-haystack probe and each head's retrieval score.

The probe places a fact (the needle) at a chosen depth of a long filler text, then asks
for it and appends the needle again as the answer, so that one forward pass reads the
whole prompt and the answer (teacher forcing). For each answer token the model copies from
the needle — its prediction at the position before is that token — a head *retrieves* it
when its strongest key at that query is the needle token being copied. A head's retrieval
score (Wu et al. 2024, "Retrieval Head Mechanistically Explains Long-Context Factuality")
is the share of the needle's tokens it retrieves: 1 for a head that copies every token,
0 for one that never looks at the needle's right token.

The weights come from :func:`attnkit.inspect.long_context.long_context_summaries` for the
answer's queries only: memory and time stay those of a forward pass at any length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.inspect.long_context import long_context_summaries
from attnkit.models.model.kinds import NEXT_TOKEN, require_kind

DEFAULT_NEEDLE = "The secret code of the blue lighthouse is 7391 and it opens the north gate."
DEFAULT_QUESTION = " What is the secret code of the blue lighthouse? Repeat the sentence that gives it:"
DEFAULT_FILLER = (
    "The river bends past the old mill, where farmers bring their grain each autumn. "
    "Children play by the water while the wheel turns slowly. The village keeps its "
    "market on Saturdays, and travellers stop to buy bread, apples and cheese. "
)


@dataclass(frozen=True)
class NeedleProbe:
    """A needle-in-a-haystack prompt with its answer, as token ids.

    Attributes:
        ids: ``[s]`` the filler with the needle inside, the question, then the needle again.
        needle: ``(start, stop)`` of the needle in the haystack.
        answer: ``(start, stop)`` of the repeated needle at the end.
        depth: where the needle starts, as a fraction of the filler.
    """

    ids: Tensor
    needle: tuple[int, int]
    answer: tuple[int, int]
    depth: float

    @property
    def queries(self) -> list[int]:
        """The positions that predict the answer's tokens (each one before its token)."""
        return list(range(self.answer[0] - 1, self.answer[1] - 1))


def needle_probe(
    model: object,
    *,
    length: int = 1024,
    depth: float = 0.5,
    needle: str = DEFAULT_NEEDLE,
    question: str = DEFAULT_QUESTION,
    filler: str = DEFAULT_FILLER,
) -> NeedleProbe:
    """Build a :class:`NeedleProbe` of about ``length`` tokens for a model's tokenizer.

    Args:
        model: an :class:`attnkit.models.Model` of a causal family.
        length: tokens of the whole prompt (filler, needle, question and answer).
        depth: where the needle goes in the filler, ``0`` (start) to ``1`` (end).
        needle, question, filler: the texts (the filler is repeated to fill ``length``).

    Raises:
        ValueError: a depth outside ``[0, 1]``, a length too short for the needle, the
            question and the answer, or a model that is not causal.
    """
    from attnkit.models.model import Model

    if not isinstance(model, Model):
        raise TypeError(f"model must be an attnkit.models.Model, got {type(model).__name__}")
    require_kind(model, NEXT_TOKEN, what="the needle probe asks the model to repeat the needle")
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth}")
    first = model.tokenizer.encode(filler)
    prefix = [int(i) for i, special in zip(first.ids[0], first.special) if special and first.offsets[0] == (0, 0)][:1]
    filler_ids = _plain_ids(model, " " + filler.strip())
    needle_ids = _plain_ids(model, " " + needle.strip())
    question_ids = _plain_ids(model, question)
    fixed = len(prefix) + 2 * len(needle_ids) + len(question_ids)
    room = length - fixed
    if room < 1:
        raise ValueError(f"length must be more than {fixed} tokens for this needle and question, got {length}")
    if length > model.max_length:
        raise ValueError(f"length must be at most {model.name}'s {model.max_length} tokens, got {length}")
    repeated = (filler_ids * (room // len(filler_ids) + 1))[:room]
    cut = round(depth * room)
    ids = prefix + repeated[:cut] + needle_ids + repeated[cut:] + question_ids + needle_ids
    start = len(prefix) + cut
    answer_start = len(ids) - len(needle_ids)
    return NeedleProbe(
        ids=torch.tensor(ids, dtype=torch.long),
        needle=(start, start + len(needle_ids)),
        answer=(answer_start, len(ids)),
        depth=depth,
    )


def _plain_ids(model: object, text: str) -> list[int]:
    """The ids of ``text`` without the special tokens the tokenizer adds."""
    encoded = model.tokenizer.encode(text)  # type: ignore[attr-defined]
    return [int(i) for i, special in zip(encoded.ids[0], encoded.special) if not special]


@dataclass(frozen=True)
class RetrievalScores:
    """Per-head retrieval scores of one :class:`NeedleProbe`.

    Attributes:
        scores: ``[layers, h]`` the share of needle tokens each head retrieved (layers in
            ``layers`` order).
        layers: the layer indices of the rows of ``scores``.
        copied: how many answer tokens the model predicted (greedy) correctly.
        needle_tokens: the needle's length in tokens (the denominator).
    """

    scores: Tensor
    layers: list[int]
    copied: int
    needle_tokens: int

    def top(self, n: int = 10) -> list[tuple[int, int, float]]:
        """The ``n`` best heads as ``(layer, head, score)``, best first."""
        flat = self.scores.flatten()
        order = flat.argsort(descending=True, stable=True)[:n]
        h = self.scores.shape[1]
        return [(self.layers[int(i) // h], int(i) % h, float(flat[i])) for i in order]


def retrieval_scores(
    model: object, probe: NeedleProbe, *, layers: list[int] | None = None, engine: str = "auto"
) -> RetrievalScores:
    """Each head's retrieval score on ``probe`` (module docstring).

    Args:
        model: the :class:`attnkit.models.Model` the probe was built for.
        probe: from :func:`needle_probe`.
        layers: the layers to score (default all).
        engine: as :func:`attnkit.inspect.long_context.summarize_layer` (on CUDA the fused
            Triton kernel by default).

    Returns:
        A :class:`RetrievalScores`.
    """
    queries = probe.queries
    run = long_context_summaries(
        model, probe.ids, layers=layers, rows=queries, top_k=1, logits_at=queries, statistics=("top",), engine=engine
    )
    assert run.logits is not None  # asked for at the queries
    targets = probe.ids[probe.answer[0] : probe.answer[1]]  # [n] the tokens to copy
    copied = run.logits.argmax(-1).cpu() == targets  # [n]
    n0, n1 = probe.needle
    chosen = sorted(run.summaries)
    rows = []
    for layer in chosen:
        strongest = run.summaries[layer].top_keys[..., 0].cpu()  # [h, n]
        in_needle = (strongest >= n0) & (strongest < n1)
        same_token = probe.ids[strongest.clamp(min=0)] == targets[None, :]
        hits = in_needle & same_token & copied[None, :]
        rows.append(hits.sum(-1).double() / targets.numel())
    return RetrievalScores(
        scores=torch.stack(rows), layers=chosen, copied=int(copied.sum()), needle_tokens=targets.numel()
    )
