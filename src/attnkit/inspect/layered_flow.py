"""Maximum flows through a layered graph, many pairs at once, on SciPy's compiled solver.

The graph has levels ``0 .. T`` of ``s`` nodes each; the only edges go from node ``k`` of
level ``t`` to node ``i`` of level ``t + 1``, with capacity ``capacities[t, i, k] >= 0``. The
flow of a pair ``(i, j)`` is the maximum flow from node ``j`` of level 0 to node ``i`` of
level ``T``. Only one node of the first and of the last level takes part in a pair's
problem, so each pair is solved on its own copy of the levels in between.

SciPy's solver (Dinic's algorithm, compiled) takes 32-bit integer capacities and one source
and sink per call. So that a call's fixed cost is shared, a batch of pairs becomes one
graph: a copy per pair, every copy's source fed by one super-source and every sink draining
into one super-sink; in a maximum flow of disjoint copies, each copy carries its own
maximum, read on its edge from the super-source. Capacities are scaled so that the whole
batch's flow fits 32 bits, and rounded down, so that the integer flow, scaled back, is a
flow of the real graph: a lower bound. A minimum cut of the integer problem is a cut of the
real graph, and its real capacity an upper bound. Most pairs of attention flow are limited
by their source or their sink: when the integer flow fills the source's edges or the
sink's, that star is such a cut, and the residual graph of a batch is searched for one only
when a pair fills neither. The bounds differ by less than the cut's number of edges over
the scale; the upper bound is returned, and a pair whose bounds differ by more than
:data:`GAP_TOLERANCE` is solved again alone, at the finest scale.

The solver holds the interpreter's lock while it works, so the batches are solved one after
the other.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

# Pairs per call to the solver: more share its fixed cost, fewer leave a finer scale and
# a graph that stays in the processor's caches (measured on MiniLM's flow: 16 pairs per
# call took 0.65 of the time of 64).
BATCH = 16

# The largest difference between a pair's lower and upper bound that is returned without
# solving the pair again alone.
GAP_TOLERANCE = 1e-5

# The integer flow of a whole batch stays below this (SciPy's capacities are 32-bit).
_INT_BUDGET = 2**30


def layered_max_flows(capacities: NDArray[np.float64], pairs: NDArray[np.intp]) -> NDArray[np.float64]:
    """The maximum flow of each pair through a layered graph.

    Args:
        capacities: ``[T, s, s]``, entry ``[t, i, k]`` the capacity of the edge from node
            ``k`` of level ``t`` to node ``i`` of level ``t + 1``; finite and ``>= 0``.
        pairs: ``[n, 2]`` rows ``(i, j)``: to node ``i`` of level ``T`` from node ``j`` of
            level 0.

    Returns:
        ``[n]`` float64, each at most :data:`GAP_TOLERANCE` above the exact maximum flow
        (a pair solved again alone: its minimum cut's number of edges over ``2**30``).

    Raises:
        ValueError: capacities not ``[T, s, s]`` with ``T >= 1``, negative or not finite;
            pairs not ``[n, 2]`` indices below ``s``.
    """
    caps = np.asarray(capacities, dtype=np.float64)
    if caps.ndim != 3 or caps.shape[1] != caps.shape[2] or caps.shape[0] < 1:
        raise ValueError(f"capacities must be [levels, s, s] with at least one level, got shape {list(caps.shape)}")
    if not np.isfinite(caps).all() or (caps < 0).any():
        raise ValueError("capacities must be finite and >= 0")
    pairs = np.asarray(pairs, dtype=np.intp)
    if pairs.ndim != 2 or pairs.shape[1] != 2:
        raise ValueError(f"pairs must be [n, 2] rows (i, j), got shape {list(pairs.shape)}")
    s = caps.shape[1]
    if pairs.size and (pairs.min() < 0 or pairs.max() >= s):
        raise ValueError(f"pairs must be (i, j) with 0 <= i, j < {s}, got indices {pairs.min()} .. {pairs.max()}")
    if not len(pairs):
        return np.zeros(0)
    # The most any pair can carry: what leaves its source, and what enters its sink.
    most = min(float(caps[0].sum(0).max()), float(caps[-1].sum(1).max()))
    batch = _Batch(caps, min(BATCH, len(pairs)), most)

    def solve(chunk: NDArray[np.intp]) -> NDArray[np.float64]:
        lower, upper = batch.solve(chunk)
        for n in np.flatnonzero(upper - lower > GAP_TOLERANCE):
            upper[n] = _Batch(caps, 1, most).solve(chunk[n : n + 1])[1][0]
        return upper

    return np.concatenate([solve(pairs[start : start + batch.size]) for start in range(0, len(pairs), batch.size)])


class _Batch:
    """The graph of up to ``size`` pairs, built once and refilled for each batch.

    Node 0 is the super-source and node 1 the super-sink; copy ``c`` takes the ``n`` nodes
    from ``2 + c * n``: its source, node ``k`` of level ``t`` (``0 < t < T``) at
    ``1 + (t - 1) * s + k``, its sink last. Edges are listed row by row in column order,
    which is the compressed sparse row layout: only the capacities change between batches.
    """

    def __init__(self, caps: NDArray[np.float64], size: int, most: float) -> None:
        levels, s = caps.shape[0], caps.shape[1]
        self.caps, self.size = caps, size
        # Capacities are scaled so that the flows of a whole batch fit the solver's 32 bits.
        self.scale = _INT_BUDGET / (size * max(most, 1e-300))
        n = (levels - 1) * s + 2
        sink = n - 1
        # One copy's edges: (row, column, capacity or NaN where it depends on the pair),
        # the column -1 standing for the super-sink.
        if levels == 1:
            rows, cols, middle = [np.array([0])], [np.array([sink])], [np.array([np.nan])]
        else:
            k = np.arange(s)
            rows, cols, middle = [np.zeros(s, dtype=np.intp)], [1 + k], [np.full(s, np.nan)]
            for t in range(1, levels - 1):
                # [t, i, k] read as rows k, columns i; an edge of no capacity (a causal
                # model's later tokens) carries nothing and crosses every cut for free.
                tails, heads = np.nonzero(caps[t].T > 0)
                rows.append(1 + (t - 1) * s + tails)
                cols.append(1 + t * s + heads)
                middle.append(caps[t].T[tails, heads])
            rows.append(1 + (levels - 2) * s + k)
            cols.append(np.full(s, sink))
            middle.append(np.full(s, np.nan))
        rows.append(np.array([sink]))
        cols.append(np.array([-1]))
        middle.append(np.array([np.nan]))
        row, col, value = np.concatenate(rows), np.concatenate(cols), np.concatenate(middle)
        offsets = 2 + n * np.arange(size)  # [m] the copies' sources
        self.offsets = offsets
        # Every edge of the batch in row order: the super-source's, then each copy's.
        self.rows = np.concatenate([np.zeros(size, dtype=np.intp), np.add.outer(offsets, row).ravel()])
        copy_cols = np.where(col < 0, 1 - offsets[:, None], col) + offsets[:, None]  # [m, edges]
        self.cols = np.concatenate([offsets, copy_cols.ravel()])
        self.real = np.concatenate([np.zeros(size), np.tile(value, size)])
        self.copy = np.concatenate([np.full(size, -1), np.repeat(np.arange(size), len(row))])
        per_copy = len(row)
        base = size + per_copy * np.arange(size)[:, None]  # [m, 1] where each copy's edges start
        source_edges = s if levels > 1 else 1
        self.source_slots = base + np.arange(source_edges)  # [m, s]
        last = per_copy - 1 - (s if levels > 1 else 0)
        self.sink_slots = base + last + np.arange(s if levels > 1 else 0)  # [m, s]
        self.out_slots = base[:, 0] + per_copy - 1  # [m] each sink's edge to the super-sink
        self.nodes = 2 + n * size
        # Capacities rounded down: the integer flow, scaled back, is a flow of the real graph.
        self.integer = np.floor(np.nan_to_num(self.real) * self.scale).astype(np.int32)
        self.indptr = np.concatenate([[0], np.cumsum(np.bincount(self.rows, minlength=self.nodes))])

    def solve(self, pairs: NDArray[np.intp]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Lower and upper bounds of each pair's maximum flow, from one call to the solver."""
        from scipy.sparse import csr_matrix
        from scipy.sparse.csgraph import breadth_first_order, maximum_flow

        m = len(pairs)
        i, j = pairs[:, 0], pairs[:, 1]
        # Every batch writes the same slots: the capacities are refilled in place.
        real, integer = self.real, self.integer
        if self.caps.shape[0] == 1:
            real[self.source_slots[:m]] = self.caps[0, i, j][:, None]
        else:
            real[self.source_slots[:m]] = self.caps[0][:, j].T  # [m, s]
            real[self.sink_slots[:m]] = self.caps[-1][i, :]  # [m, s]
        # Copies beyond the pairs (in the last batch) get no capacity at all.
        real[self.source_slots[m:]] = 0.0
        real[self.sink_slots[m:]] = 0.0
        slots = np.concatenate([self.source_slots.ravel(), self.sink_slots.ravel()])
        integer[slots] = np.floor(real[slots] * self.scale)
        # The super edges never limit a copy: one more than the most it can carry.
        bounds = np.minimum(self.caps[0][:, j].sum(0), self.caps[-1][i, :].sum(1))  # [m]
        feed = np.zeros(self.size, dtype=np.int32)
        feed[:m] = np.ceil(bounds * self.scale) + 1
        integer[: self.size] = feed
        integer[self.out_slots] = feed
        real[self.out_slots] = np.inf
        graph = csr_matrix((integer, self.cols, self.indptr), shape=(self.nodes, self.nodes))
        flow = maximum_flow(graph, 0, 1).flow.tocsr()
        carried = flow.getrow(0).toarray().ravel()[self.offsets[:m]]  # [m] integer flows
        lower = carried / self.scale
        # A pair whose integer flow fills its source's or its sink's edges has that star as
        # a minimum cut of its integer graph: the star's real capacity bounds it from above.
        stars = [self.source_slots[:m]] + ([self.sink_slots[:m]] if self.caps.shape[0] > 1 else [])
        upper = np.full(m, np.inf)
        for slots in stars:
            filled = integer[slots].sum(1) <= carried
            upper[filled] = np.minimum(upper[filled], real[slots].sum(1)[filled])
        if np.isfinite(upper).all():
            return lower, np.maximum(upper, lower)
        # What the source still reaches in the residual graph is the source side of a
        # minimum cut; its edges' real capacities bound the real flow from above.
        residual = (graph - flow).tocsr()
        residual.data = (residual.data > 0).astype(np.int8)
        residual.eliminate_zeros()
        reached = np.zeros(self.nodes, dtype=bool)
        reached[breadth_first_order(residual, 0, directed=True, return_predecessors=False)] = True
        crossing = reached[self.rows] & ~reached[self.cols] & (self.copy >= 0)
        cut = np.bincount(self.copy[crossing], weights=real[crossing], minlength=self.size)[:m]
        return lower, np.maximum(np.minimum(upper, cut), lower)
