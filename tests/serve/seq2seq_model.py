"""A tiny encoder–decoder model folder for the app's tests: the network ``attnkit train``
builds for the reverse task, untrained (random weights), written as a run writes it, so
that :func:`attnkit.models.load` reads it like any T5 or BART folder."""

from __future__ import annotations

from pathlib import Path

import torch

from attnkit.train.config import TrainConfig
from attnkit.train.export import write_model_folder
from attnkit.train.model import build_model
from attnkit.train.tasks import make_task

# The symbols "0" .. "5", 2 + 2 layers of 2 heads.
CONFIG = TrainConfig(task="reverse", length=5, symbols=6, d_model=16, heads=2, layers=2, ff=32)


def write_seq2seq_folder(folder: Path, seed: int = 0) -> Path:
    """Write the folder and return it."""
    task = make_task(CONFIG.task, length=CONFIG.length, symbols=CONFIG.symbols)
    torch.manual_seed(seed)
    model = build_model(
        task.vocab_size,
        decoder_only=False,
        d_model=CONFIG.d_model,
        heads=CONFIG.heads,
        layers=CONFIG.layers,
        ff=CONFIG.ff,
        dropout=0.0,
    )
    folder.mkdir(parents=True, exist_ok=True)
    write_model_folder(model, CONFIG, task, folder)
    return folder
