"""Which part of a layer's attention weights a pass forms: :class:`WeightSelection`.

A module asked for its weights with ``return_weights=True`` forms every head's
``[b, h, s_q, s_k]`` weights. Asked with a :class:`WeightSelection` it forms only the
chosen heads' weights on the chosen query rows, ``[b, n_h, n_r, s_k]`` in float32, from its
queries and keys (:func:`attnkit.functional.iter_weights_on_demand`), while every head's
output comes from the fused kernel as in a pass that asks for no weights. One head of one
layer on 32K tokens is then 4 GiB of weights, not 4 GiB times the number of heads.

Shape letters: ``b`` batch, ``h`` query heads, ``s_q`` query length, ``s_k`` key length,
``n_h`` chosen heads, ``n_r`` chosen rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class WeightSelection:
    """The heads and query rows of one layer whose attention weights to form.

    Give it as a layer's ``return_weights`` (or, in a stack, as the value of a layer in a
    mapping: ``return_weights={-1: WeightSelection(heads=(0,))}``).

    Attributes:
        heads: the self-attention's query heads, ``0 .. h - 1``, in the order the weights
            hold them; ``None`` for every head.
        rows: the query positions, a ``range`` with step 1 (``range(1000, 1010)``);
            ``None`` for every row. Rows past the end of a shorter query are refused.
        cross_heads: the heads of a decoder layer's cross-attention (its rows are
            ``rows``); ``None`` for every head.

    Raises:
        TypeError: heads that are not ints, rows that are not a ``range``.
        ValueError: a negative head, rows with another step or a negative start.
    """

    heads: tuple[int, ...] | None = None
    rows: range | None = None
    cross_heads: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("heads", "cross_heads"):
            chosen = getattr(self, name)
            if chosen is None:
                continue
            if isinstance(chosen, (str, bytes)) or not isinstance(chosen, Sequence):
                raise TypeError(f"{name} must be a sequence of head indices, got {chosen!r}")
            if any(isinstance(i, bool) or not isinstance(i, int) for i in chosen):
                raise TypeError(f"{name} must be ints, got {list(chosen)}")
            if any(i < 0 for i in chosen):
                raise ValueError(f"{name} must be indices >= 0, got {list(chosen)}")
            object.__setattr__(self, name, tuple(chosen))
        if self.rows is not None:
            if not isinstance(self.rows, range):
                raise TypeError(f"rows must be a range of query positions, got {self.rows!r}")
            if self.rows.step != 1 or self.rows.start < 0:
                raise ValueError(f"rows must be a range with step 1 starting at 0 or later, got {self.rows!r}")

    def cross(self) -> WeightSelection:
        """What a decoder layer asks of its cross-attention: ``cross_heads`` on ``rows``."""
        return WeightSelection(heads=self.cross_heads, rows=self.rows)

    def head_indices(self, num_heads: int) -> list[int]:
        """The chosen heads of a module with ``num_heads`` heads.

        Raises:
            ValueError: a head past ``num_heads - 1``.
        """
        if self.heads is None:
            return list(range(num_heads))
        if any(i >= num_heads for i in self.heads):
            raise ValueError(
                f"heads must be in 0 .. {num_heads - 1} (the module has {num_heads}), got {list(self.heads)}"
            )
        return list(self.heads)

    def row_range(self, s_q: int) -> range:
        """The chosen rows of a call with ``s_q`` queries.

        Raises:
            ValueError: rows past ``s_q``.
        """
        if self.rows is None:
            return range(s_q)
        if self.rows.stop > s_q and len(self.rows) > 0:
            raise ValueError(f"rows must lie in 0 .. {s_q - 1} (the call has {s_q} queries), got {self.rows!r}")
        return self.rows

    def take(self, weights: Tensor) -> Tensor:
        """The chosen heads and rows of every head's weights ``[b, h, s_q, s_k]``:
        ``[b, n_h, n_r, s_k]``."""
        rows = self.row_range(weights.shape[2])
        heads = self.head_indices(weights.shape[1])
        chosen = weights if self.heads is None else weights[:, heads]
        return chosen[:, :, rows.start : rows.stop]
