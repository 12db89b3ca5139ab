"""A trained encoder–decoder as a model folder that :func:`attnkit.models.load` reads, so
that ``attnkit inspect``, ``heads`` and ``serve`` take ``--model RUN_FOLDER`` as they take
a T5 or BART folder (the family :mod:`attnkit.models.families.trained`)."""

from __future__ import annotations

import json
from pathlib import Path

from attnkit.models.checkpoints.errors import require
from attnkit.models.families.trained import TrainedConfig, saved_state
from attnkit.train.config import TrainConfig
from attnkit.train.model import EncoderDecoderTransformer
from attnkit.train.tasks import BOS, EOS, SPECIAL_TOKENS, Task
from attnkit.viz.files import atomic_path, write_text_atomic

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
TOKENIZER_NAME = "tokenizer.json"


def write_model_folder(model: EncoderDecoderTransformer, config: TrainConfig, task: Task, out: Path) -> list[Path]:
    """Write ``config.json``, ``model.safetensors`` and ``tokenizer.json`` of ``model``
    into ``out``, each atomically.

    The tokenizer splits a text at whitespace and reads each piece as one of the task's
    symbols (``"4 3 5 8"``); ``<s>`` and ``</s>`` are its special tokens.

    Args:
        model: a trained encoder–decoder.
        config: its run's options (the sizes).
        task: its task (the vocabulary).
        out: the run's folder.

    Returns:
        The paths written.

    Raises:
        OSError: a file cannot be written (the ones written before are complete).
    """
    safetensors_torch = require("safetensors.torch")
    weights = {key: value.detach().cpu().contiguous() for key, value in saved_state(model.network).items()}
    sizes = TrainedConfig(
        vocab_size=task.vocab_size,
        d_model=config.d_model,
        num_layers=config.layers,
        num_decoder_layers=config.layers,
        num_heads=config.heads,
        ffn_dim=config.ff,
        decoder_start_token_id=BOS,
        eos_token_ids=(EOS,),
    )
    content = {**sizes.to_hf(), "task": task.name}
    written = [write_text_atomic(out / CONFIG_NAME, json.dumps(content, indent=2) + "\n")]
    with atomic_path(out / WEIGHTS_NAME) as temporary:
        safetensors_torch.save_file(weights, str(temporary), metadata={"format": "pt"})
    written.append(out / WEIGHTS_NAME)
    written.append(write_text_atomic(out / TOKENIZER_NAME, _tokenizer_json(task.vocab)))
    return written


def _tokenizer_json(vocab: list[str]) -> str:
    """A ``tokenizer.json`` of whole-word symbols (the id of a symbol is its index)."""
    tokenizers = require("tokenizers")
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({word: i for i, word in enumerate(vocab)}))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    # Decoded as WordPiece decodes words that are never continuations: joined by spaces
    # (which also tells attnkit.inspect how the tokens spell a text).
    backend.decoder = tokenizers.decoders.WordPiece(prefix="##", cleanup=False)
    return backend.to_str(pretty=True)
