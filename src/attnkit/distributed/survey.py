"""Per-head statistics over a corpus split across ranks (``attnkit heads --file F --nproc N``).

Each rank runs the model on its contiguous share of the texts; the per-text results are
gathered and combined in text order on every rank, so the survey is the one a single
process computes from the same texts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch.distributed as dist

from attnkit.distributed.layout import shard_ranges
from attnkit.inspect.survey import INDUCTION_PERIOD, INDUCTION_SEED, HeadSurvey, TextSurvey, survey_heads_with

if TYPE_CHECKING:
    from attnkit.models import Model


def survey_heads(
    model: Model,
    texts: Sequence[str],
    *,
    source: str | None = None,
    target: str | None = None,
    level: str = "token",
    period: int = INDUCTION_PERIOD,
    seed: int = INDUCTION_SEED,
    group: dist.ProcessGroup | None = None,
) -> HeadSurvey:
    """:func:`attnkit.inspect.survey.survey_heads` with the texts split across the ranks of
    ``group``; every rank passes all the texts and gets the whole survey.

    Raises:
        ValueError: as the single-process survey; a text that fails on one rank fails the
            survey on every rank (the first failing text's error), never a hang.
        RuntimeError: torch.distributed is not initialised.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "torch.distributed is not initialised: launch with torchrun and call attnkit.distributed.init()"
        )
    return survey_heads_with(
        model,
        texts,
        functools.partial(_across_ranks, group=group),
        source=source,
        target=target,
        level=level,
        period=period,
        seed=seed,
    )


def _across_ranks(
    count: int, survey_one: Callable[[int], TextSurvey], *, group: dist.ProcessGroup | None
) -> list[TextSurvey]:
    """The parts of all ``count`` texts on every rank: each rank surveys its contiguous
    share and the shares are gathered. A text that fails on one rank fails every rank with
    the first failing text's error."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    ((start, stop),) = shard_ranges(count, rank, world)
    mine: list[TextSurvey] | tuple[int, str] = []
    try:
        mine = [survey_one(index) for index in range(start, stop)]
    except ValueError as err:
        mine = (start, str(err))  # every rank learns of it, so nobody waits for ever
    gathered: list[list[TextSurvey] | tuple[int, str]] = [[] for _ in range(world)]
    dist.all_gather_object(gathered, mine, group=group)
    errors = sorted(part for part in gathered if isinstance(part, tuple))
    if errors:
        raise ValueError(errors[0][1])
    return [part for share in gathered if isinstance(share, list) for part in share]
