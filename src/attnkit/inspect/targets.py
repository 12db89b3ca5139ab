"""What an analysis measures on a model's output: the next-token log-probability or logit of
a target token (causal models), or the sentence embedding (bidirectional encoders, mean
pooling as sentence-transformers does for MiniLM). Which of the two a model's output is
measured by is its kind's :func:`attnkit.inspect.readouts.readout`.

Shape letters: ``b`` batch, ``s`` tokens, ``e`` model dim, ``v`` vocabulary size.
"""

from __future__ import annotations

import inspect
import warnings
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from attnkit.models import Model


def single_token(model: Model, token: str, *, what: str = "target") -> int:
    """The id of the one token that spells ``token``.

    Args:
        model: the model whose tokenizer decides.
        token: the token's text, leading space included where the word follows a space
            (``" Paris"``).
        what: what the token is, for the message (``"target"``, ``"wrong"``).

    Returns:
        The token id.

    Raises:
        ValueError: ``token`` is empty or is not exactly one token; the message says how it
            tokenises.
    """
    return model.to_single_token(token, what=what)


# How many of the likeliest next tokens count as likely, for warn_if_space_missing.
LIKELY_TOKENS = 10


def warn_if_space_missing(model: Model, token: str, token_id: int, logits: Tensor, *, what: str = "target") -> None:
    """Warn when ``token`` has no leading space, is not among the :data:`LIKELY_TOKENS`
    likeliest next tokens, and the same word with a leading space is: a word after a space
    is its own token, space included, so ``"Paris"`` measures a token the model would not
    predict where ``" Paris"`` is expected.

    Args:
        model: the model whose tokenizer spells the spaced form.
        token: the token as given; ``token_id`` its id.
        logits: the next-token logits ``[v]`` at the last position of the unaltered run.
        what: what the token is, for the message (``"target"``).
    """
    if token.startswith(" "):
        return
    try:
        spaced_id = single_token(model, " " + token)
    except ValueError:
        return
    likely = set(logits.topk(min(LIKELY_TOKENS, logits.numel())).indices.tolist())
    if token_id in likely or spaced_id not in likely:
        return
    log_p = torch.log_softmax(logits.float(), dim=-1)
    warnings.warn(
        f"the {what} {token!r} is not among the {LIKELY_TOKENS} likeliest next tokens (log p "
        f"{log_p[token_id].item():.2f}), but {' ' + token!r} is (log p {log_p[spaced_id].item():.2f}): a word "
        f"after a space is its own token, space included; did you mean {' ' + token!r}?",
        stacklevel=_stacklevel_of_the_callers_line(),
    )


# attnkit's own source folder: frames in it are attnkit's, not the user's.
_ATTNKIT_FOLDER = str(Path(__file__).resolve().parent.parent)


def _stacklevel_of_the_callers_line() -> int:
    """The ``stacklevel`` that makes the warning of the function calling this one name the
    first line outside attnkit (the user's call of ``head_ablation``, ``gradient_weighted``,
    ...), however deep inside attnkit the warning is raised; ``1`` (the warning's own line)
    when every frame is attnkit's (the command line)."""
    here = inspect.currentframe()
    frame: FrameType | None = None if here is None else here.f_back  # the function that warns: stacklevel 1
    level = 1
    while frame is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(_ATTNKIT_FOLDER):
        frame = frame.f_back
        level += 1
    return level if frame is not None else 1


def last_logits(model: Model, hidden: Tensor) -> Tensor:
    """Next-token logits at the last position, ``[b, v]`` float32, from hidden states
    ``[b, s, e]`` (the head runs on the last position only).

    Raises:
        ValueError: a model without a language-model head.
    """
    logits = model.module.logits(hidden[:, -1:])  # [b, 1, v]
    if logits is None:
        raise ValueError(f"{model.name} ({model.family}) has no language-model head: no next-token logits")
    return logits[:, 0].float()


def sentence_embedding(hidden: Tensor) -> Tensor:
    """The mean of the token vectors, ``[b, e]`` float32, from hidden states ``[b, s, e]``:
    the pooling of sentence-transformers models such as all-MiniLM-L6-v2 (before their
    final normalisation, which a cosine does not see)."""
    return hidden.float().mean(1)


def cosine_to(embeddings: Tensor, reference: Tensor) -> Tensor:
    """Cosine similarity of each row of ``embeddings [b, e]`` with ``reference [e]``: ``[b]``."""
    return torch.nn.functional.cosine_similarity(embeddings, reference[None], dim=-1)
