"""Step-by-step explanation of one attention computation, as one works it by hand.

The numbers come from :func:`attnkit.attention` itself (weights and context vectors) and from
the same score functions it uses, so the explanation cannot drift from the library.

Shape letters: ``n_q`` query tokens, ``n_k`` key tokens, ``d`` head dim, ``d_v`` value dim.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor

from attnkit.functional import attention, masks
from attnkit.functional.scores import dot_scores

# The worked example: "The cat sat on the mat", d_model = 4.
EXAMPLE_TOKENS = ["the₁", "cat", "sat", "on", "the₂", "mat"]
EXAMPLE_QK = [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 1, 1], [0, 0, 1, 1], [1, 0, 0, 1], [1, 1, 0, 0]]
EXAMPLE_V = [
    [0.1, 0.0, 0.1, 0.0],
    [0.0, 0.2, 0.0, 0.2],
    [0.3, 0.3, 0.3, 0.3],
    [0.0, 0.0, 0.1, 0.1],
    [0.1, 0.0, 0.0, 0.1],
    [0.2, 0.2, 0.0, 0.0],
]


@dataclass(frozen=True)
class ExplainInput:
    """Numbers to explain: ``q [n_q, d]``, ``k [n_k, d]``, ``v [n_k, d_v]`` and labels."""

    query_tokens: list[str]
    key_tokens: list[str]
    q: Tensor
    k: Tensor
    v: Tensor


@dataclass(frozen=True)
class QueryStep:
    """Every intermediate value for one query row.

    Attributes:
        index: the query's row.
        token: its label.
        scores: ``q · kᵢ`` for each key ``[n_k]``.
        scaled: the scores times the scale ``[n_k]``.
        allowed: which keys the query may attend to ``[n_k]`` (all, unless causal).
        weights: softmax of the allowed scaled scores ``[n_k]``.
        context: the weighted sum of values ``[d_v]``.
    """

    index: int
    token: str
    scores: list[float]
    scaled: list[float]
    allowed: list[bool]
    weights: list[float]
    context: list[float]


@dataclass(frozen=True)
class Explanation:
    """The whole computation, ready to print or serialise."""

    inputs: ExplainInput
    score: str
    scale: float
    causal: bool
    steps: list[QueryStep]

    @property
    def shapes(self) -> list[tuple[str, str, str]]:
        """``(step, operation, shape)`` rows, as in a summary table of the computation."""
        n_q = len(self.steps)
        n_k, d = self.inputs.k.shape
        d_v = self.inputs.v.shape[1]
        scale_name = "× scale" if self.score == "dot" else "÷ √d_k"
        return [
            ("1. scores", f"Q · Kᵀ: ({n_q} x {d}) × ({n_k} x {d})ᵀ", f"({n_q} x {n_k})"),
            ("2. scale", f"{scale_name} ({self.scale:.4f})", f"({n_q} x {n_k})"),
            ("3. softmax", "exp(x) / Σ exp(x), per row", f"({n_q} x {n_k})"),
            ("4. weighted sum", f"weights × V: ({n_q} x {n_k}) × ({n_k} x {d_v})", f"({n_q} x {d_v})"),
        ]

    def to_dict(self) -> dict:
        """A JSON-ready description (full precision floats)."""
        return {
            "query_tokens": self.inputs.query_tokens,
            "key_tokens": self.inputs.key_tokens,
            "q": self.inputs.q.tolist(),
            "k": self.inputs.k.tolist(),
            "v": self.inputs.v.tolist(),
            "score": self.score,
            "scale": self.scale,
            "causal": self.causal,
            "queries": [
                {
                    "index": s.index,
                    "token": s.token,
                    "scores": s.scores,
                    "scaled_scores": s.scaled,
                    "allowed": s.allowed,
                    "weights": s.weights,
                    "context": s.context,
                }
                for s in self.steps
            ],
            "shapes": [{"step": a, "operation": b, "shape": c} for a, b, c in self.shapes],
        }


def example_input() -> ExplainInput:
    """The worked "The cat sat on the mat" example, with Q = K."""
    qk = torch.tensor(EXAMPLE_QK, dtype=torch.float64)
    return ExplainInput(
        list(EXAMPLE_TOKENS), list(EXAMPLE_TOKENS), qk, qk.clone(), torch.tensor(EXAMPLE_V, dtype=torch.float64)
    )


def load_input(path: str | Path) -> ExplainInput:
    """Read a JSON file with ``tokens``, ``q``, ``k``, ``v`` (and optionally
    ``query_tokens`` when the queries are other tokens than the keys, as in
    cross-attention).

    Raises:
        ValueError: the file is missing, not JSON, or its numbers do not fit together.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"input file not found: {path}") from None
    except IsADirectoryError:
        raise ValueError(f"{path} is a folder; give a JSON file") from None
    except OSError as err:
        raise ValueError(f"cannot read {path}: {err.strerror or err}") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object with tokens, q, k, v; got {type(data).__name__}")
    missing = [key for key in ("tokens", "q", "k", "v") if key not in data]
    if missing:
        raise ValueError(f"{path} is missing {', '.join(missing)} (expected tokens, q, k, v)")
    for name in ("tokens", "query_tokens"):
        if name in data and not isinstance(data[name], list):
            raise ValueError(f"{path}: {name} must be a list of tokens, got {type(data[name]).__name__}")
    key_tokens = [str(t) for t in data["tokens"]]
    query_tokens = [str(t) for t in data.get("query_tokens", key_tokens)]
    q, k, v = (_matrix(path, name, data[name]) for name in ("q", "k", "v"))
    return make_input(query_tokens, key_tokens, q, k, v)


def make_input(query_tokens: Sequence[str], key_tokens: Sequence[str], q: Tensor, k: Tensor, v: Tensor) -> ExplainInput:
    """Check that labels and matrices fit together.

    Raises:
        ValueError: with the sizes that disagree.
    """
    if q.shape[0] != len(query_tokens):
        raise ValueError(f"q has {q.shape[0]} rows but there are {len(query_tokens)} query tokens")
    if k.shape[0] != len(key_tokens) or v.shape[0] != len(key_tokens):
        raise ValueError(f"k has {k.shape[0]} rows and v {v.shape[0]}, but there are {len(key_tokens)} tokens")
    if q.shape[1] != k.shape[1]:
        raise ValueError(f"q and k must have the same width, got q {list(q.shape)} and k {list(k.shape)}")
    if len(key_tokens) == 0:
        raise ValueError("there must be at least one token")
    return ExplainInput(list(query_tokens), list(key_tokens), q, k, v)


def _matrix(path: Path, name: str, rows: object) -> Tensor:
    try:
        t = torch.tensor(rows, dtype=torch.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: {name} must be a list of equal-length lists of numbers ({err})") from None
    if t.ndim != 2:
        raise ValueError(f"{path}: {name} must be a 2-D list (one row per token), got shape {list(t.shape)}")
    return t


def resolve_queries(inputs: ExplainInput, query: str | None) -> list[int]:
    """Rows to explain: ``None`` or ``"all"`` for every row, a token label, or a row number.

    Raises:
        ValueError: the token is unknown or ambiguous.
    """
    labels = inputs.query_tokens
    if query is None or query == "all":
        return list(range(len(labels)))
    if query.isdigit() and int(query) < len(labels):
        return [int(query)]
    matches = [i for i, t in enumerate(labels) if t == query]
    if not matches:  # "the" matches "the₁" and "the₂": compare without subscripts
        matches = [i for i, t in enumerate(labels) if t.rstrip("₀₁₂₃₄₅₆₇₈₉").lower() == query.lower()]
    if len(matches) == 1:
        return matches
    choices = ", ".join(f"{i}={t}" for i, t in enumerate(labels))
    if not matches:
        raise ValueError(f"query {query!r} is not one of the tokens ({choices}); give a token, a row number or 'all'")
    raise ValueError(f"query {query!r} matches rows {matches}; give a row number instead ({choices})")


def explain(
    inputs: ExplainInput, *, queries: Sequence[int], score: str = "scaled_dot", causal: bool = False
) -> Explanation:
    """Compute every step of attention for the chosen query rows.

    Args:
        inputs: tokens and matrices.
        queries: query rows to explain.
        score: ``"scaled_dot"`` (divide by √d_k) or ``"dot"`` (no scaling).
        causal: each query may only attend to keys at or before its own position.

    Raises:
        ValueError: an unknown score.
    """
    if score not in ("scaled_dot", "dot"):
        raise ValueError(f'score must be "scaled_dot" or "dot", got {score!r}')
    q, k, v = inputs.q[None, None], inputs.k[None, None], inputs.v[None, None]  # [1, 1, n, d]
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if score == "scaled_dot" else 1.0
    kind: Literal["scaled_dot", "dot"] = "scaled_dot" if score == "scaled_dot" else "dot"
    result = attention(q, k, v, causal=causal, score=kind, return_weights=True)
    weights = result.weights
    assert weights is not None  # asked for
    raw = dot_scores(q, k)[0, 0]  # [n_q, n_k]
    n_q, n_k = raw.shape
    allowed = (masks.causal() if causal else masks.full()).to_dense(n_q, n_k)[0, 0]  # [n_q, n_k]
    steps = [
        QueryStep(
            index=i,
            token=inputs.query_tokens[i],
            scores=raw[i].tolist(),
            scaled=(raw[i] * scale).tolist(),
            allowed=allowed[i].tolist(),
            weights=weights[0, 0, i].tolist(),
            context=result.output[0, 0, i].tolist(),
        )
        for i in queries
    ]
    return Explanation(inputs, score, scale, causal, steps)
