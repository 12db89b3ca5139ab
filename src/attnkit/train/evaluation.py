"""Evaluating a trained model on held-out examples: greedy decoding scored against the
answers, and how much each head attends along the task's alignment.

Shape letters: ``L`` layers, ``h`` heads, ``n`` examples, ``s_out`` target length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attnkit.train.model import AttentionMaps, DecoderOnlyTransformer, EncoderDecoderTransformer
from attnkit.train.tasks import Task

# The held-out stream is seeded apart from the training one (which uses the seed itself).
HELD_OUT_SEED_OFFSET = 0x5EED_0FF
# Examples decoded at once during evaluation, and whose attention weights are kept at once.
EVAL_BATCH = 500
ATTENTION_BATCH = 100

Model = EncoderDecoderTransformer | DecoderOnlyTransformer


@dataclass(frozen=True)
class Evaluation:
    """Greedy decoding of held-out examples.

    Attributes:
        exact_match: the fraction of examples whose every output token (EOS included) is
            right.
        token_accuracy: the fraction of right output tokens.
        inputs: ``[n, s_in]`` on the CPU.
        targets: ``[n, s_out]``.
        predictions: ``[n, s_out]``.
    """

    exact_match: float
    token_accuracy: float
    inputs: Tensor
    targets: Tensor
    predictions: Tensor


def held_out_generator(seed: int) -> torch.Generator:
    """The generator of the held-out examples of a run seeded with ``seed``."""
    return torch.Generator().manual_seed(seed + HELD_OUT_SEED_OFFSET)


@torch.no_grad()
def evaluate(model: Model, task: Task, *, size: int, seed: int, device: torch.device | str) -> Evaluation:
    """Greedy decoding of ``size`` held-out examples, scored against the answers.

    Args:
        model: a trained model for ``task``.
        task: the task.
        size: how many held-out examples.
        seed: the run's seed; the examples come from :func:`held_out_generator`.
        device: where the model is.

    Returns:
        An :class:`Evaluation`.
    """
    batch = task.sample(size, held_out_generator(seed), held_out=True)
    predictions = torch.cat(
        [model.generate(chunk.to(device), task.target_length).cpu() for chunk in batch.inputs.split(EVAL_BATCH)]
    )  # [n, s_out]
    right = predictions == batch.targets  # [n, s_out]
    return Evaluation(
        exact_match=right.all(dim=1).float().mean().item(),
        token_accuracy=right.float().mean().item(),
        inputs=batch.inputs,
        targets=batch.targets,
        predictions=predictions,
    )


def inspect_attention(
    model: Model, task: Task, evaluation: Evaluation, device: torch.device
) -> tuple[AttentionMaps, Tensor | None]:
    """The attention of the model while it produced its held-out predictions (teacher
    forcing on its own output computes what greedy decoding computed).

    Returns:
        The maps of the first example only (weights ``[L, 1, h, s_out, s_k]``, on the CPU),
        and for tasks with an alignment each head's alignment fraction over every example
        (``[L, h]``), else ``None``. Examples go through in chunks: the full weights of
        every example at once could be far larger than the model.
    """
    aligned = task.aligned_keys()
    first: AttentionMaps | None = None
    total: Tensor | None = None
    chunks = zip(evaluation.inputs.split(ATTENTION_BATCH), evaluation.predictions.split(ATTENTION_BATCH))
    for inputs, predictions in chunks:
        maps = model.attention_maps(inputs.to(device), predictions.to(device))
        if first is None:
            first = AttentionMaps(maps.kind, maps.weights[:, :1].cpu(), maps.keys[:1].cpu())
        if aligned is not None:
            part = alignment_fractions(maps.weights, aligned).cpu() * inputs.shape[0]  # [L, h]
            total = part if total is None else total + part
    assert first is not None  # eval_size >= 1
    return first, None if total is None else total / evaluation.inputs.shape[0]


def alignment_fractions(weights: Tensor, aligned_keys: Tensor) -> Tensor:
    """For each head, the fraction of query positions whose most-attended key is the
    expected one.

    Args:
        weights: ``[L, n, h, s_q, s_k]`` attention weights.
        aligned_keys: ``[s]`` with ``s <= s_q``: the expected key of query ``i``;
            queries from ``s`` on are not counted.

    Returns:
        ``[L, h]`` fractions in ``[0, 1]``.
    """
    rows = aligned_keys.shape[0]
    argmax = weights[..., :rows, :].argmax(dim=-1)  # [L, n, h, s]
    return (argmax == aligned_keys.to(argmax.device)).float().mean(dim=(1, 3))  # [L, h]


def alignment_report(task: Task, fractions: Tensor | None) -> dict[str, Any] | None:
    """The ``alignment`` entry of ``metrics.json``: how much each head attends along the
    task's alignment (diagonal for ``copy``, anti-diagonal for ``reverse``).

    Args:
        task: the task.
        fractions: ``[L, h]`` from :func:`alignment_fractions`, or ``None``.

    Returns:
        ``{"pattern", "fractions" ([layer][head]), "best": {"layer", "head", "fraction"}}``,
        layers and heads counted from 0; ``None`` without fractions.
    """
    if fractions is None:
        return None
    best = int(fractions.argmax())
    layer, head = divmod(best, fractions.shape[1])
    return {
        "pattern": task.alignment,
        "fractions": [[round(f, 4) for f in row] for row in fractions.tolist()],
        "best": {"layer": layer, "head": head, "fraction": round(fractions[layer, head].item(), 4)},
    }
