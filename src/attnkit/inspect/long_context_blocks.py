"""Exact attention weights of consecutive query rows, recomputed one block at a time, and
every per-query statistic of the long-context summaries taken from that one block.

A block is ``m`` consecutive query rows ``r0 .. r0 + m - 1`` of ``n_h`` heads against the
keys ``k0 .. k1 - 1`` they may attend to (``l = k1 - k0``). Its scores are written by one
matrix product per key/value head straight into a reused buffer ``[n_h, m, L]`` whose row
``i`` holds ``m`` columns of padding, the ``l`` keys, then at least ``m`` more columns of
padding. Read with a row stride of ``L + 1`` instead of ``L`` (the *skewed view*
``[n_h, m, l + m]``), column ``u`` of every row is the key at the same signed distance
``δ = r0 - k0 + m - u`` from its query, padding where there is no such key. So:

- the causal mask and a sliding window are fills of whole columns of the skewed view;
- the mass at each distance is a sum over the rows of the skewed view, and a query's mean
  distance and mass within a window are one product of the skewed view with a few columns
  of distances;
- the entropy is ``log Z - Σ_j e_ij (s_ij - max_i) / Z`` with ``e_ij = exp(s_ij - max_i)``
  and ``Z`` its row sum: no logarithm per weight;
- the top ``k`` keys come from the ``k`` chunks of :data:`TOP_CHUNK` keys with the largest
  maxima (every one of the ``k`` strongest keys lies in one of them).

Weights stay unnormalised (``e``, the largest of each row is 1); every statistic divides by
``Z`` once per row. Padding and masked keys hold ``-inf`` (``exp`` of a huge finite negative
number takes a slow path, several times the cost of a normal one), so their ``e`` is 0;
before the entropy's ``e · (s - max)`` they are set to 0, as ``0 · -inf`` would be NaN.

Shape letters: ``n_h`` heads, ``m`` rows of a block, ``l`` keys of a block, ``d`` head dim,
``k`` top keys.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

# Keys per chunk of the two-stage top-k: each chunk's maximum, then the best chunks' keys.
TOP_CHUNK = 64
# Statistics a block can compute (the names of summarize_layer's `statistics`).
STATISTICS = ("sink", "distance", "window", "entropy", "top")


@dataclass
class BlockStatistics:
    """The statistics of one block of ``m`` query rows of ``n_h`` heads.

    Attributes:
        sink, distance, within_window, entropy: ``[n_h, m]``, ``None`` when not asked.
        distance_mass: ``[n_h, l + m]`` the weights summed over the rows at each distance
            ``mass_at`` (query ``0`` of the text not counted), ``None`` when not asked.
        mass_at: ``[l + m]`` the absolute distance of each column of ``distance_mass``.
        top_keys, top_weights: ``[n_h, m, k]`` strongest keys first (``-1`` and ``0`` where a
            query has fewer than ``k`` keys); ``k`` is at most ``top_k`` (0 when not asked).
        weights: ``[n_h, m, l]`` the normalised weights of keys ``k0 ..``, when asked.
    """

    sink: Tensor | None
    distance: Tensor | None
    within_window: Tensor | None
    entropy: Tensor | None
    distance_mass: Tensor | None
    mass_at: Tensor
    top_keys: Tensor
    top_weights: Tensor
    weights: Tensor | None


def head_groups(heads: Sequence[int], num_heads: int, num_kv_heads: int) -> list[tuple[int, int, int]]:
    """Runs of consecutive chosen heads that share a key/value head, as
    ``(first position, end position, key/value head)`` in ``heads``: one matrix product each."""
    group = num_heads // num_kv_heads
    runs: list[tuple[int, int, int]] = []
    for position, head in enumerate(heads):
        kv = head // group
        if runs and runs[-1][2] == kv and runs[-1][1] == position:
            runs[-1] = (runs[-1][0], position + 1, kv)
        else:
            runs.append((position, position + 1, kv))
    return runs


def row_blocks(rows: Tensor, block_rows: int) -> Iterator[tuple[int, int, int]]:
    """Blocks of consecutive positions among sorted ``rows [n_r]``, each at most
    ``block_rows`` long, as ``(index of its first row in rows, first position, rows)``."""
    positions = rows.tolist()
    start = 0
    while start < len(positions):
        end = start + 1
        while end < len(positions) and end - start < block_rows and positions[end] == positions[end - 1] + 1:
            end += 1
        yield start, positions[start], end - start
        start = end


class BlockScorer:
    """Exact weights of chosen heads for blocks of consecutive query rows, and their
    statistics (module docstring), with the buffers reused from block to block.

    Args:
        q: the chosen heads' queries ``[n_h, s, d]``, already multiplied by the layer's
            query factor (its scale, divided by the soft cap when there is one).
        k: keys ``[h_kv, s, d]``.
        groups: :func:`head_groups` of the chosen heads.
        softcap: scores become ``softcap · tanh(q·k)`` (``q`` already divided by it), or ``None``.
        lowest, highest: the signed distances ``i - j`` a query may attend to (``None``:
            unbounded), from the causal mask and the sliding window.
        statistics: which of :data:`STATISTICS` to compute.
        top_k: keys kept per query for ``"top"``.
        sink_tokens: the first tokens counted as the sink.
        window: the distance below which attention counts as within the window.
        max_rows, max_keys: the most rows and keys of any block: the buffers are made that
            large at once (a buffer that grew block by block, as the keys of causal blocks
            do, would be new memory to fault in for every block).
    """

    def __init__(
        self,
        q: Tensor,
        k: Tensor,
        groups: list[tuple[int, int, int]],
        *,
        softcap: float | None,
        lowest: int | None,
        highest: int | None,
        statistics: Collection[str],
        top_k: int,
        sink_tokens: int,
        window: int,
        max_rows: int,
        max_keys: int,
    ) -> None:
        self.q, self.k, self.groups = q, k, groups
        self.softcap, self.lowest, self.highest = softcap, lowest, highest
        self.statistics = frozenset(statistics)
        self.top_k = top_k if "top" in self.statistics else 0
        # A window wider than the text counts every key: the same as the text's length,
        # which any distance tensor can be compared with (a huge int would overflow).
        self.sink_tokens, self.window = sink_tokens, min(window, k.shape[1])
        self._capacity = q.shape[0] * max_rows * self._width(max_rows, max_keys)
        self._buffers: dict[str, Tensor] = {}

    def _width(self, m: int, n_keys: int) -> int:
        """Columns ``L`` of a block's rows: the keys, ``m`` of padding on each side, and for
        the top keys a whole number of chunks."""
        width = n_keys + 2 * m
        return -(-width // TOP_CHUNK) * TOP_CHUNK if self.top_k else width

    def _buffer(self, name: str, shape: tuple[int, int, int]) -> Tensor:
        """A reused buffer viewed as ``shape`` (its contents are whatever the last block left)."""
        numel = math.prod(shape)
        buffer = self._buffers.get(name)
        if buffer is None or buffer.numel() < numel:
            buffer = torch.empty(max(numel, self._capacity), dtype=self.q.dtype, device=self.q.device)
            self._buffers[name] = buffer
        return buffer[:numel].view(shape)

    def _scores(self, r0: int, m: int, k0: int, k1: int) -> Tensor:
        """Scores ``[n_h, m, L]`` of rows ``r0 ..`` and keys ``k0 .. k1 - 1`` in the padded
        layout (module docstring), ``-inf`` where masked and in the padding."""
        n_h, d = self.q.shape[0], self.q.shape[2]
        n_keys = k1 - k0
        width = self._width(m, n_keys)
        scores = self._buffer("scores", (n_h, m, width))
        for p0, p1, kv in self.groups:
            # Rows of consecutive heads have one stride in this layout: one product writes them.
            out = scores.as_strided(((p1 - p0) * m, n_keys), (width, 1), scores.storage_offset() + p0 * m * width + m)
            torch.mm(self.q[p0:p1, r0 : r0 + m].reshape(-1, d), self.k[kv, k0:k1].T, out=out)  # [g·m, l]
        if self.softcap is not None:
            scores[..., m : m + n_keys].tanh_().mul_(self.softcap)
        self._fill_unseen(scores, r0, k0, n_keys, float("-inf"))
        return scores

    def _fill_unseen(self, block: Tensor, r0: int, k0: int, n_keys: int, value: float) -> None:
        """Set the padding of a block ``[n_h, m, L]`` and the keys its rows may not attend
        to (whole columns of the skewed view) to ``value``."""
        m = block.shape[1]
        block[..., :m].fill_(value)
        block[..., m + n_keys :].fill_(value)
        skewed = _skewed(block, n_keys)  # [n_h, m, l + m], column u: distance r0 - k0 + m - u
        nearest_column = r0 - k0 + m
        if self.lowest is not None:
            skewed[..., max(0, nearest_column - self.lowest + 1) :].fill_(value)
        if self.highest is not None:
            skewed[..., : max(0, nearest_column - self.highest)].fill_(value)

    def block(self, r0: int, m: int, k0: int, k1: int, *, keep_weights: bool = False) -> BlockStatistics:
        """The statistics of query rows ``r0 .. r0 + m - 1`` over keys ``k0 .. k1 - 1``
        (every key any of those rows may attend to).

        Args:
            r0, m: the block's first query position and its number of rows.
            k0, k1: its key range.
            keep_weights: also return the normalised weights ``[n_h, m, l]``.
        """
        n_keys = k1 - k0
        scores = self._scores(r0, m, k0, k1)  # [n_h, m, L]
        scores.sub_(scores.amax(-1, keepdim=True))  # s - max: 0 at each row's strongest key
        if "entropy" in self.statistics:
            e = torch.exp(scores, out=self._buffer("weights", tuple(scores.shape)))  # type: ignore[arg-type]
        else:
            e = scores.exp_()
        skewed = _skewed(e, n_keys)  # [n_h, m, l + m]
        signed = r0 - k0 + m - torch.arange(n_keys + m, device=e.device)  # [l + m]
        distance = signed.abs()
        columns = torch.stack([torch.ones_like(distance), distance, distance < self.window]).to(e.dtype)  # [3, l + m]
        # Rows of the product: Z, Σ e·dist and Σ e·near of each query (columns @ skewedᵀ reads
        # the skewed view in place; skewed @ columnsᵀ would copy it).
        sums = torch.bmm(columns.expand(e.shape[0], -1, -1), skewed.transpose(1, 2))  # [n_h, 3, m]
        total = sums[:, 0]  # [n_h, m]
        wanted = self.statistics
        mass = None
        if "distance" in wanted:
            share = 1 / total  # [n_h, m]
            if r0 == 0:
                share[:, 0] = 0  # query 0 of a causal text can only attend to itself: not counted
            mass = torch.bmm(share[:, None, :], skewed)[:, 0]  # [n_h, l + m]
        entropy = None
        if "entropy" in wanted:
            self._fill_unseen(scores, r0, k0, n_keys, 0.0)
            dot = torch.bmm(e.view(-1, 1, e.shape[-1]), scores.view(-1, e.shape[-1], 1)).view(total.shape)
            entropy = (total.log() - dot / total) / math.log(2)
        sink = None
        if "sink" in wanted:
            sink = e[..., m : m + max(0, min(n_keys, self.sink_tokens - k0))].sum(-1) / total
        top_keys, top_weights = self._top(e, total, m, k0)
        return BlockStatistics(
            sink=sink,
            distance=sums[:, 1] / total if "distance" in wanted else None,
            within_window=sums[:, 2] / total if "window" in wanted else None,
            entropy=entropy,
            distance_mass=mass,
            mass_at=distance,
            top_keys=top_keys,
            top_weights=top_weights,
            weights=e[..., m : m + n_keys] / total[..., None] if keep_weights else None,
        )

    def _top(self, e: Tensor, total: Tensor, m: int, k0: int) -> tuple[Tensor, Tensor]:
        """The ``top_k`` strongest keys ``[n_h, m, k]`` of unnormalised weights ``e [n_h, m, L]``
        and their weights: from the chunks of :data:`TOP_CHUNK` keys with the largest maxima
        when there are many chunks, else directly."""
        n_h, _, width = e.shape
        if not self.top_k:
            empty = torch.zeros(n_h, m, 0, dtype=e.dtype, device=e.device)
            return empty.long(), empty
        count = min(self.top_k, width)
        chunks = width // TOP_CHUNK
        if width % TOP_CHUNK == 0 and chunks > 2 * count:
            tiles = e.view(n_h * m, chunks, TOP_CHUNK)
            best = tiles.amax(-1).topk(count, dim=-1).indices.view(n_h, m, count)  # [n_h, m, k] chunks
            query = torch.arange(n_h * m, device=e.device)[:, None]
            candidates = tiles[query, best.view(n_h * m, count)]  # [n_h·m, k, C]
            values, within = candidates.view(n_h, m, -1).topk(count, dim=-1)  # [n_h, m, k]
            columns = best.gather(2, within // TOP_CHUNK) * TOP_CHUNK + within % TOP_CHUNK
        else:
            values, columns = e.topk(count, dim=-1)  # [n_h, m, k]
        taken = values > 0
        keys = torch.where(taken, columns - m + k0, -1)
        return keys, torch.where(taken, values / total[..., None], 0)


def _skewed(t: Tensor, n_keys: int) -> Tensor:
    """The skewed view ``[n_h, m, l + m]`` of a block ``[n_h, m, L]`` (module docstring)."""
    n_h, m, width = t.shape
    return t.as_strided((n_h, m, n_keys + m), (m * width, width + 1, 1), t.storage_offset())
