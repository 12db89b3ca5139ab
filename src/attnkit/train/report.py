"""What a finished training run reports: ``metrics.json`` and the heatmap of a held-out
example."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from attnkit.train.config import TrainConfig
from attnkit.train.evaluation import Evaluation, Model
from attnkit.train.model import AttentionMaps
from attnkit.train.tasks import Task

METRICS_NAME = "metrics.json"


def draw_example(
    task: Task, maps: AttentionMaps, evaluation: Evaluation, alignment: dict[str, Any] | None, out: Path
) -> Path:
    """Heatmap of the first held-out example: the best-aligned head when the task has an
    alignment, else the last layer averaged over heads."""
    from attnkit.viz.heatmap import draw_heatmap

    what = "Cross-attention" if maps.kind == "cross" else "Self-attention"
    if alignment is not None:
        layer, head = alignment["best"]["layer"], alignment["best"]["head"]
        weights = maps.weights[layer, 0, head]  # [s_out, s_k]
        title = f"{task.name}: {what.lower()}, layer {layer} head {head} ({alignment['pattern']})"
    else:
        layer = maps.weights.shape[0] - 1
        weights = maps.weights[layer, 0].mean(dim=0)  # [s_out, s_k]
        title = f"{task.name}: {what.lower()}, layer {layer}, mean of heads"
    return draw_heatmap(
        weights,
        task.tokens(evaluation.predictions[0]),
        task.tokens(maps.keys[0]),
        out / f"{maps.kind}_attention.png",
        title=title,
        xlabel="Input token (key)",
        ylabel="Output token (query that produced it)",
    )


def run_metrics(
    config: TrainConfig,
    task: Task,
    model: Model,
    loss_curve: list[dict[str, float]],
    steps: int,
    train_seconds: float,
    evaluation: Evaluation | None,
    alignment: dict[str, Any] | None,
    heatmap: Path | None,
    eval_seconds: float,
    device: torch.device,
) -> dict[str, Any]:
    """The content of ``metrics.json`` of a finished run; a run that diverged (its final
    loss not finite) is not evaluated, and says so with ``"diverged": true``."""
    curve = loss_curve
    metrics: dict[str, Any] = {
        "task": task.name,
        "config": config.to_dict(),
        "model": {
            "kind": "decoder-only" if task.decoder_only else "encoder-decoder",
            "parameters": sum(p.numel() for p in model.parameters()),
        },
        "steps": steps,
        "train": {"first_loss": curve[0]["loss"], "final_loss": curve[-1]["loss"], "loss_curve": curve},
        "diverged": evaluation is None,
        "held_out": None
        if evaluation is None
        else {
            "examples": config.eval_size,
            "exact_match": round(evaluation.exact_match, 6),
            "token_accuracy": round(evaluation.token_accuracy, 6),
        },
        "example": None
        if evaluation is None or heatmap is None
        else {
            "input": task.tokens(evaluation.inputs[0]),
            "target": task.tokens(evaluation.targets[0]),
            "prediction": task.tokens(evaluation.predictions[0]),
            "heatmap": heatmap.name,
        },
        "time": {"train_seconds": round(train_seconds, 3), "evaluation_seconds": round(eval_seconds, 3)},
        "environment": {"device": str(device), "threads": torch.get_num_threads(), "torch": torch.__version__},
    }
    if alignment is not None:
        metrics["alignment"] = alignment
    return metrics


def metrics_json(metrics: dict[str, Any]) -> str:
    """``metrics`` as strict JSON: a number that is not finite (the losses of a run that
    diverged) is written as ``null``, since ``NaN`` and ``Infinity`` are not JSON."""

    def finite(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {key: finite(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [finite(item) for item in value]
        return value

    return json.dumps(finite(metrics), indent=2, allow_nan=False) + "\n"
