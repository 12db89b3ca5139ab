"""Per-head statistics of a real model over one or many texts (``attnkit heads``).

The text statistics of :mod:`attnkit.inspect.heads` are computed on each text and averaged
over the texts; the induction score is computed once, on a fixed-seed sequence of random
tokens repeated twice, run through the model itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from attnkit.deprecation import deprecated_aliases
from attnkit.inspect import heads as H
from attnkit.inspect.maps import LEVELS, readable_run
from attnkit.inspect.names import CROSS_STATISTICS, INDUCTION_PERIOD, STATISTICS
from attnkit.inspect.words import aggregate, word_groups

if TYPE_CHECKING:
    from attnkit.models import Model

INDUCTION_SEED = 0

# What each statistic measures, for tables, pictures and JSON.
DESCRIPTIONS = STATISTICS
# The statistics of an encoder-decoder's cross-attention that self-attention has not
# (attnkit.inspect.encoder_decoder.survey_encoder_decoder), and every statistic a survey may hold.
CROSS_DESCRIPTIONS = CROSS_STATISTICS
ALL_DESCRIPTIONS = {**DESCRIPTIONS, **CROSS_DESCRIPTIONS}


@dataclass(frozen=True)
class TokenPair:
    """How much one token attends to another, per head.

    Attributes:
        source: the attending token, as asked (``"it"``).
        target: the attended token (``"animal"``).
        mass: ``[layers, heads]`` weight of ``source`` on ``target``, averaged over texts.
        texts: how many texts contain both tokens (the others are skipped).
        uniform: the mass a head spreading evenly over the keys ``source`` can see would
            put on ``target`` — the baseline to compare ``mass`` with.
        level: ``"token"`` (``source`` and ``target`` are tokens) or ``"word"`` (words of
            the text, their attention aggregated by
            :func:`attnkit.inspect.words.aggregate`).
    """

    source: str
    target: str
    mass: Tensor
    texts: int
    uniform: float
    level: str = "token"


@deprecated_aliases(model="model_name", removed_in="0.3")
@dataclass(frozen=True)
class HeadSurvey:
    """Per-head statistics of one model.

    Attributes:
        model_name: the model's name.
        num_layers: layers of the model.
        num_heads: query heads per layer.
        texts: how many texts the text statistics average over.
        tokens: tokens over all texts.
        statistics: each name of :data:`DESCRIPTIONS` → ``[layers, heads]``.
        induction_period: length of the repeated random segment.
        induction_seed: seed of the random segment.
        pair: the ``--from``/``--to`` result, when asked.
        attention: ``"self"``, or which attention of an encoder–decoder
            (``"encoder"``, ``"decoder"``, ``"cross"``: :func:`attnkit.inspect.encoder_decoder.survey_encoder_decoder`).
        notes: what the survey left out and why (the induction score of a model whose
            context is shorter than its probe).
    """

    model_name: str
    num_layers: int
    num_heads: int
    texts: int
    tokens: int
    statistics: dict[str, Tensor]
    induction_period: int
    induction_seed: int
    pair: TokenPair | None = None
    attention: str = "self"
    notes: tuple[str, ...] = ()

    def to_dict(self, digits: int = 6) -> dict[str, Any]:
        """A JSON-ready dict; each statistic as ``[layer][head]`` rounded to ``digits``."""

        def grid(values: Tensor) -> list[list[float]]:
            return [[round(v, digits) for v in row] for row in values.tolist()]

        data: dict[str, Any] = {
            "model": self.model_name,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "texts": self.texts,
            "tokens": self.tokens,
            "attention": self.attention,
            "induction": {"period": self.induction_period, "seed": self.induction_seed},
            "notes": list(self.notes),
            "statistics": {
                name: {"description": ALL_DESCRIPTIONS[name], "values": grid(values)}
                for name, values in self.statistics.items()
            },
        }
        if self.pair is not None:
            data["pair"] = {
                "from": self.pair.source,
                "to": self.pair.target,
                "level": self.pair.level,
                "texts": self.pair.texts,
                "uniform": round(self.pair.uniform, digits),
                "values": grid(self.pair.mass),
            }
        return data


def survey_heads(
    model: Model,
    texts: Sequence[str],
    *,
    source: str | None = None,
    target: str | None = None,
    level: str = "token",
    period: int = INDUCTION_PERIOD,
    seed: int = INDUCTION_SEED,
) -> HeadSurvey:
    """Per-head statistics of ``model`` over ``texts``, and optionally how much token (or
    word) ``source`` attends to token (or word) ``target``.

    Args:
        model: an :mod:`attnkit.models` model.
        texts: one or more texts, each run on its own.
        source: the attending token or word of the pair (``"it"``, ``"고파서"``), matched
            with the text it stands for, ignoring case and surrounding spaces
            (:func:`attnkit.inspect.heads.find_token`).
        target: the attended token or word (``"animal"``); given together with ``source``.
        level: ``"token"``, or ``"word"`` to match and measure the pair between the words
            of the texts (:func:`attnkit.inspect.words.word_groups`).
        period: length of the random segment of the induction score.
        seed: its seed.

    Returns:
        :class:`HeadSurvey`.

    Raises:
        ValueError: no texts, an empty text or one of a single token, a text longer than
            the model's context, only one of ``source``/``target``, an unknown level, or no
            text containing both (the message lists the tokens or words).
    """
    return survey_heads_with(
        model, texts, _every_text, source=source, target=target, level=level, period=period, seed=seed
    )


# Computes the parts of a survey of ``count`` texts: called with ``count`` and the function
# that surveys the text of index ``i`` (from 0), it returns the parts of all the texts.
PartsOfTexts = Callable[[int, Callable[[int], "TextSurvey"]], list["TextSurvey"]]


def survey_heads_with(
    model: Model,
    texts: Sequence[str],
    parts_of_texts: PartsOfTexts,
    *,
    source: str | None = None,
    target: str | None = None,
    level: str = "token",
    period: int = INDUCTION_PERIOD,
    seed: int = INDUCTION_SEED,
) -> HeadSurvey:
    """:func:`survey_heads`, with ``parts_of_texts`` deciding where each text's
    :class:`TextSurvey` is computed: here, one after the other (:func:`survey_heads`), or
    across the ranks of a process group (:func:`attnkit.distributed.survey_heads`).

    Args:
        model, texts, source, target, level, period, seed: as :func:`survey_heads`.
        parts_of_texts: ``(count, survey_one) -> parts``: the parts of all ``count`` texts,
            where ``survey_one(i)`` surveys the text of index ``i``.

    Raises:
        ValueError: as :func:`survey_heads`, checked before any text is run.
    """
    if not texts:
        raise ValueError("give at least one text")
    if (source is None) != (target is None):
        raise ValueError("give both the token that attends (source) and the token attended to (target)")
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {level!r}")

    def survey_one(index: int) -> TextSurvey:
        return survey_text(model, texts[index], index + 1, source=source, target=target, level=level)

    parts = parts_of_texts(len(texts), survey_one)
    return combine_surveys(model, parts, source=source, target=target, level=level, period=period, seed=seed)


def _every_text(count: int, survey_one: Callable[[int], TextSurvey]) -> list[TextSurvey]:
    """Every text surveyed here, in order."""
    return [survey_one(index) for index in range(count)]


@dataclass(frozen=True)
class TextSurvey:
    """What one text contributes to a :class:`HeadSurvey` (see :func:`combine_surveys`).

    Attributes:
        number: the text's place in the survey, from 1.
        tokens: its tokens.
        statistics: each text statistic of :mod:`attnkit.inspect.heads` → ``[layers, heads]``.
        pair_mass: ``[layers, heads]`` weight of the pair's source on its target, when a pair
            was asked and the text holds both; ``pair_uniform``: the even-spread baseline.
        pair_miss: why the text does not hold the pair (the tokens or words it has).
    """

    number: int
    tokens: int
    statistics: dict[str, Tensor]
    pair_mass: Tensor | None = None
    pair_uniform: float = 0.0
    pair_miss: str | None = None


def survey_text(
    model: Model,
    text: str,
    number: int,
    *,
    source: str | None = None,
    target: str | None = None,
    level: str = "token",
) -> TextSurvey:
    """The statistics of one text, the ``number``-th of a survey (arguments as
    :func:`survey_heads`).

    Raises:
        ValueError: an empty text, one of a single token, or one longer than the model's
            context.
    """
    if not text.strip():
        raise ValueError(f"text {number} is empty")
    run = model.run(text, logits=False)
    weights = _stack(run.attentions)  # [layers, heads, s, s]
    if weights.shape[-1] < 2:
        raise ValueError(f"text {number} ({text!r}) is a single token; statistics need at least 2")
    statistics = H.head_statistics(weights)
    if source is None or target is None:
        return TextSurvey(number, weights.shape[-1], statistics)
    readable = readable_run(model, run, text)
    # The same grouping applies to the weights and to the even-spread baseline.
    groups = word_groups(readable.text, readable.tokens) if level == "word" else None
    units = [w.text for w in groups] if groups is not None else [t.text for t in readable.tokens]
    try:
        queries, keys = H.find_token(units, source, what=level), H.find_token(units, target, what=level)
    except ValueError as err:
        return TextSurvey(number, weights.shape[-1], statistics, pair_miss=str(err))
    pair_weights = weights
    uniform = _uniform_weights(weights.shape[-1], causal=model.causal)[None, None]  # [1, 1, s, s]
    if groups is not None:
        pair_weights, uniform = aggregate(weights, groups), aggregate(uniform, groups)  # [..., w, w]
    return TextSurvey(
        number,
        weights.shape[-1],
        statistics,
        pair_mass=H.token_mass(pair_weights, queries, keys),
        pair_uniform=float(H.token_mass(uniform, queries, keys)),
    )


def combine_surveys(
    model: Model,
    parts: Sequence[TextSurvey],
    *,
    source: str | None = None,
    target: str | None = None,
    level: str = "token",
    period: int = INDUCTION_PERIOD,
    seed: int = INDUCTION_SEED,
) -> HeadSurvey:
    """The survey of the texts of ``parts`` (which may have been computed in different
    processes), averaged in text order, plus the induction score.

    Raises:
        ValueError: no parts, or a pair asked that no text contains.
    """
    if not parts:
        raise ValueError("give at least one text")
    parts = sorted(parts, key=lambda part: part.number)
    totals: dict[str, Tensor] = {}
    pair_total, pair_texts, uniform_total, misses = None, 0, 0.0, []
    for part in parts:
        for name, values in part.statistics.items():
            totals[name] = values if name not in totals else totals[name] + values
        if part.pair_miss is not None:
            misses.append(f"text {part.number}: {part.pair_miss}" if len(parts) > 1 else part.pair_miss)
        if part.pair_mass is not None:
            pair_total = part.pair_mass if pair_total is None else pair_total + part.pair_mass
            pair_texts += 1
            uniform_total += part.pair_uniform
    pair = None
    if source is not None and target is not None:
        if pair_total is None:
            raise ValueError(
                misses[0] if len(misses) == 1 else f"no text contains both {source!r} and {target!r}; {misses[0]}"
            )
        pair = TokenPair(source, target, pair_total / pair_texts, pair_texts, uniform_total / pair_texts, level)
    statistics = {name: total / len(parts) for name, total in totals.items()}
    notes = []
    missing = _induction_impossible(model, period)
    if missing is None:
        statistics["induction"] = induction_scores(model, period=period, seed=seed)
    else:
        notes.append(f"no induction score: its probe is {period} distinct random tokens repeated twice, {missing}")
    return HeadSurvey(
        model_name=model.name,
        num_layers=model.num_layers,
        num_heads=model.num_heads,
        texts=len(parts),
        tokens=sum(part.tokens for part in parts),
        statistics=statistics,
        induction_period=period,
        induction_seed=seed,
        pair=pair,
        notes=tuple(notes),
    )


def induction_scores(model: Model, *, period: int = INDUCTION_PERIOD, seed: int = INDUCTION_SEED) -> Tensor:
    """The induction score of every head on ``period`` random tokens repeated twice,
    between the special tokens the tokenizer adds to any text (``[CLS]`` … ``[SEP]``).

    The random tokens are drawn from the whole vocabulary but its added tokens
    (``<|im_start|>``, ``[MASK]``, ...).

    Returns:
        ``[layers, heads]``.

    Raises:
        ValueError: the sequence would not fit in the model's context.
    """
    prefix, suffix = _specials_around(model)
    length = len(prefix) + 2 * period + len(suffix)
    if length > model.max_length:
        raise ValueError(
            f"an induction period of {period} needs {length} tokens; {model.name} takes {model.max_length}"
        )
    added = model.tokenizer.backend.get_added_tokens_decoder()
    segment = random_token_ids(model.tokenizer.vocab_size, period, seed=seed, exclude=added)  # [period]
    ids = torch.cat([prefix, segment, segment, suffix])[None]  # [1, s]
    run = model.run(ids, logits=False)
    return H.induction_score(_stack(run.attentions), start=len(prefix), period=period)


def _specials_around(model: Model) -> tuple[Tensor, Tensor]:
    """The ids the tokenizer adds before and after any text (``[CLS]`` … ``[SEP]``)."""
    probe = model.tokenize("a")
    first = probe.special.index(False)
    last = len(probe.special) - probe.special[::-1].index(False)
    return probe.ids[0, :first], probe.ids[0, last:]


def _induction_impossible(model: Model, period: int) -> str | None:
    """Why :func:`induction_scores` cannot run on ``model`` (a context or a vocabulary too
    small for its probe), or ``None``."""
    prefix, suffix = _specials_around(model)
    length = len(prefix) + 2 * period + len(suffix)
    if length > model.max_length:
        return f"{length} tokens, and {model.name} reads at most {model.max_length}"
    ordinary = model.tokenizer.vocab_size - len(model.tokenizer.backend.get_added_tokens_decoder())
    if ordinary < period:
        return f"and {model.name}'s vocabulary has {ordinary} ordinary tokens"
    return None


def random_token_ids(vocab_size: int, n: int, *, seed: int, exclude: Iterable[int] = ()) -> Tensor:
    """``n`` distinct token ids drawn uniformly from ``0 .. vocab_size-1`` but ``exclude``;
    the same for the same seed.

    Returns:
        ``[n]`` int64.

    Raises:
        ValueError: fewer than ``n`` ids to draw from.
    """
    excluded = set(exclude)
    candidates = torch.tensor([i for i in range(vocab_size) if i not in excluded], dtype=torch.long)
    if n > len(candidates):
        raise ValueError(f"cannot draw {n} distinct tokens from a vocabulary of {len(candidates)} ordinary tokens")
    generator = torch.Generator().manual_seed(seed)
    return candidates[torch.randperm(len(candidates), generator=generator)[:n]]


def _stack(attentions: dict[int, Tensor]) -> Tensor:
    """A run's per-layer ``[1, heads, s, s]`` as ``[layers, heads, s, s]``."""
    return torch.cat([attentions[layer] for layer in sorted(attentions)]).float()


def _uniform_weights(s: int, *, causal: bool) -> Tensor:
    """``[s, s]``: each query spreading its attention evenly over the keys it may see (all
    of them, or those up to itself when causal)."""
    visible = torch.ones(s, s).tril() if causal else torch.ones(s, s)
    return visible / visible.sum(-1, keepdim=True)
