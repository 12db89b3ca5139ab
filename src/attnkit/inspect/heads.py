"""Per-head statistics of attention maps: what kind of pattern each head computes.

Every statistic takes the weights of one sequence, ``[layers, heads, s, s]`` (query rows,
key columns, rows summing to 1), and returns one number per head, ``[layers, heads]``.
They average over the queries ``1 .. s-1``: query 0 of a causal model can only attend to
itself, which would count as "self" and "first token" for every head alike.

- :func:`entropy`: how spread out each query's attention is, in bits (0 = one key,
  ``log2 n`` = uniform over ``n`` keys).
- :func:`mean_distance`: how far, in tokens, the attended keys are from the query.
- :func:`previous_token_mass`, :func:`first_token_mass` (the "attention sink"),
  :func:`self_mass`: the share of attention on one position relative to the query.
- :func:`induction_score`: on a random sequence repeated twice, the share each query of
  the second half puts on the token right after the earlier occurrence of itself, the
  signature of induction heads (``A B ... A → B``).
- :func:`token_mass`: how much the occurrences of one token attend to those of another
  (does "it" attend to "animal"?), with :func:`find_token` to locate them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

# Markers tokenizers put inside token strings: byte-level BPE spaces and newlines (GPT-2,
# LLaMA 3, SmolLM), SentencePiece spaces (LLaMA 1/2, T5), WordPiece continuations (BERT).
_TOKEN_MARKERS = ("Ġ", "Ċ", "▁", "##")

STATISTICS = ("entropy", "distance", "previous", "first", "self")


def entropy(weights: Tensor) -> Tensor:
    """Mean entropy of each head's attention rows, in bits.

    Args:
        weights: ``[layers, heads, s, s]`` attention of one sequence, ``s >= 2``.

    Returns:
        ``[layers, heads]``.

    Raises:
        ValueError: ``weights`` is not ``[layers, heads, s, s]`` with ``s >= 2``.
    """
    rows = _queries(weights)  # [layers, heads, s - 1, s]
    # xlogy gives 0 for p = 0, where p log p -> 0.
    return -(torch.special.xlogy(rows, rows).sum(-1) / math.log(2)).mean(-1)


def mean_distance(weights: Tensor) -> Tensor:
    """Mean distance in tokens between each query and the keys it attends to,
    ``sum_j w[i, j] * |i - j|``, averaged over queries.

    Args:
        weights: ``[layers, heads, s, s]``, ``s >= 2``.

    Returns:
        ``[layers, heads]``.

    Raises:
        ValueError: ``weights`` is not ``[layers, heads, s, s]`` with ``s >= 2``.
    """
    rows = _queries(weights)  # [layers, heads, s - 1, s]
    s = weights.shape[-1]
    pos = torch.arange(s, device=weights.device, dtype=weights.dtype)
    distance = (pos[1:, None] - pos[None, :]).abs()  # [s - 1, s]
    return (rows * distance).sum(-1).mean(-1)


def previous_token_mass(weights: Tensor) -> Tensor:
    """Mean weight each query puts on the token just before it.

    Args:
        weights: ``[layers, heads, s, s]``, ``s >= 2``.

    Returns:
        ``[layers, heads]``.

    Raises:
        ValueError: ``weights`` is not ``[layers, heads, s, s]`` with ``s >= 2``.
    """
    _queries(weights)
    return weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1)  # diagonal: [layers, heads, s - 1]


def first_token_mass(weights: Tensor) -> Tensor:
    """Mean weight each query puts on the first token (the "attention sink").

    Args:
        weights: ``[layers, heads, s, s]``, ``s >= 2``.

    Returns:
        ``[layers, heads]``.

    Raises:
        ValueError: ``weights`` is not ``[layers, heads, s, s]`` with ``s >= 2``.
    """
    return _queries(weights)[..., 0].mean(-1)


def self_mass(weights: Tensor) -> Tensor:
    """Mean weight each query puts on its own token.

    Args:
        weights: ``[layers, heads, s, s]``, ``s >= 2``.

    Returns:
        ``[layers, heads]``.

    Raises:
        ValueError: ``weights`` is not ``[layers, heads, s, s]`` with ``s >= 2``.
    """
    _queries(weights)
    return weights.diagonal(dim1=-2, dim2=-1)[..., 1:].mean(-1)  # diagonal: [layers, heads, s]


def head_statistics(weights: Tensor) -> dict[str, Tensor]:
    """Every per-head statistic of one sequence's attention, keyed as :data:`STATISTICS`.

    Args:
        weights: ``[layers, heads, s, s]``, ``s >= 2``.

    Returns:
        ``{"entropy", "distance", "previous", "first", "self"}`` → ``[layers, heads]``.

    Raises:
        ValueError: ``weights`` is not ``[layers, heads, s, s]`` with ``s >= 2``.
    """
    return {
        "entropy": entropy(weights),
        "distance": mean_distance(weights),
        "previous": previous_token_mass(weights),
        "first": first_token_mass(weights),
        "self": self_mass(weights),
    }


def induction_score(weights: Tensor, *, start: int, period: int) -> Tensor:
    """Mean weight each query of a repeated segment puts on the token that followed its
    earlier occurrence.

    The sequence holds random tokens ``r`` at ``start .. start+period-1`` and the same
    tokens again at ``start+period .. start+2*period-1``; the query at
    ``start + period + i`` is scored on key ``start + i + 1``.

    Args:
        weights: ``[layers, heads, s, s]`` attention on that sequence.
        start: position of the first random token (after a BOS or ``[CLS]``).
        period: length of the random segment, ``>= 1``.

    Returns:
        ``[layers, heads]``.

    Raises:
        ValueError: the two segments do not fit in ``s`` or the arguments are not positive.
    """
    _check_square(weights)
    s = weights.shape[-1]
    if start < 0 or period < 1 or start + 2 * period > s:
        raise ValueError(
            f"a repeated segment of period {period} starting at {start} needs {start + 2 * period} tokens, got {s}"
        )
    queries = torch.arange(start + period, start + 2 * period, device=weights.device)  # [period]
    return weights[..., queries, queries - period + 1].mean(-1)


def token_mass(weights: Tensor, queries: Sequence[int], keys: Sequence[int]) -> Tensor:
    """How much the query positions attend to the key positions: the weight on all of
    ``keys`` together, averaged over ``queries``.

    Args:
        weights: ``[layers, heads, s, s]``.
        queries: query positions (e.g. every "it").
        keys: key positions (e.g. every "animal").

    Returns:
        ``[layers, heads]``.

    Raises:
        ValueError: empty or out-of-range positions.
    """
    _check_square(weights)
    s = weights.shape[-1]
    for name, positions in (("queries", queries), ("keys", keys)):
        if not positions:
            raise ValueError(f"{name} must name at least one position")
        if not all(0 <= p < s for p in positions):
            raise ValueError(f"{name} {list(positions)} must be positions in 0..{s - 1}")
    rows = weights[..., list(queries), :]  # [layers, heads, n_queries, s]
    return rows[..., list(keys)].sum(-1).mean(-1)


def strip_markers(token: str) -> str:
    """A token string as it reads: tokenizer markers (``Ġ``, ``▁``, ``##``) and surrounding
    spaces removed. ``"Ġanimal"`` gives ``"animal"``."""
    for marker in _TOKEN_MARKERS:
        token = token.replace(marker, "")
    return token.strip()


def normalize_token(token: str) -> str:
    """A token string as a word to match: :func:`strip_markers`, lower-cased.
    ``"Ġanimal"`` and ``"##Animal"`` both give ``"animal"``."""
    return strip_markers(token).lower()


def find_token(tokens: Sequence[str], word: str, *, what: str = "token") -> list[int]:
    """Positions of the tokens (or words) that spell ``word`` once normalised
    (:func:`normalize_token`).

    Args:
        tokens: the texts tokens stand for (``" animal"``), or the tokenizer's strings
            (``"Ġanimal"``), or words.
        word: what to look for, e.g. ``"it"``.
        what: what ``tokens`` are, for the error message (``"token"``, ``"word"``).

    Returns:
        The matching positions, in order.

    Raises:
        ValueError: nothing matches; the message lists the tokens.
    """
    target = normalize_token(word)
    found = [i for i, token in enumerate(tokens) if normalize_token(token) == target]
    if not found:
        listed = " ".join(f"{i}:{strip_markers(t) or repr(t)}" for i, t in enumerate(tokens))
        raise ValueError(f"no {what} {word!r} in the text; its {what}s are {listed}")
    return found


def rank_heads(scores: Tensor, *, top: int | None = None, descending: bool = True) -> list[tuple[int, int, float]]:
    """Heads ordered by a per-head score.

    Args:
        scores: ``[layers, heads]``.
        top: keep this many (all when ``None``).
        descending: highest first.

    Returns:
        ``(layer, head, score)`` tuples; ties keep layer-then-head order.

    Raises:
        ValueError: ``scores`` is not 2-D.
    """
    if scores.ndim != 2:
        raise ValueError(f"scores must be [layers, heads], got shape {list(scores.shape)}")
    flat = scores.flatten().tolist()
    n_heads = scores.shape[1]
    order = sorted(range(len(flat)), key=lambda i: -flat[i] if descending else flat[i])
    return [(i // n_heads, i % n_heads, flat[i]) for i in order[:top]]


def _check_square(weights: Tensor) -> None:
    if weights.ndim != 4 or weights.shape[-1] != weights.shape[-2]:
        raise ValueError(f"weights must be [layers, heads, s, s], got shape {list(weights.shape)}")


def _queries(weights: Tensor) -> Tensor:
    """The rows of queries ``1 .. s-1``, ``[layers, heads, s - 1, s]``, after checking the shape."""
    _check_square(weights)
    if weights.shape[-1] < 2:
        raise ValueError(f"statistics need at least 2 tokens, got weights of shape {list(weights.shape)}")
    return weights[..., 1:, :]
