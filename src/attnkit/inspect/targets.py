"""What an analysis measures on a model's output: the next-token log-probability or logit of
a target token (causal models), or the sentence embedding (bidirectional encoders, mean
pooling as sentence-transformers does for MiniLM).

Shape letters: ``b`` batch, ``s`` tokens, ``e`` model dim, ``v`` vocabulary size.
"""

from __future__ import annotations

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


def last_logits(model: Model, hidden: Tensor) -> Tensor:
    """Next-token logits at the last position, ``[b, v]`` float32, from hidden states
    ``[b, s, e]`` (the head runs on the last position only)."""
    return model.architecture.logits(model.module, hidden[:, -1:])[:, 0].float()


def sentence_embedding(hidden: Tensor) -> Tensor:
    """The mean of the token vectors, ``[b, e]`` float32, from hidden states ``[b, s, e]``:
    the pooling of sentence-transformers models such as all-MiniLM-L6-v2 (before their
    final normalisation, which a cosine does not see)."""
    return hidden.float().mean(1)


def cosine_to(embeddings: Tensor, reference: Tensor) -> Tensor:
    """Cosine similarity of each row of ``embeddings [b, e]`` with ``reference [e]``: ``[b]``."""
    return torch.nn.functional.cosine_similarity(embeddings, reference[None], dim=-1)
