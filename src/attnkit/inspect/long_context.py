"""Attention over long texts without the ``[s, s]`` map: per-head summaries streamed one
block of query rows at a time, a block-reduced map, and exact zoomed blocks.

A map is ``[h, s, s]``: at 32K tokens one head is 4 GiB of floats, so the usual recipe
(``output_attentions=True``) stops fitting after a few thousand tokens. Here the forward
pass runs on the fused kernels; the queries and keys of each chosen layer are taken from
its ``q`` and ``k`` hook points as the pass meets them, and that layer's exact weights are
recomputed ``rows`` query rows at a time with the layer's own score function (its scale,
Gemma's soft-capping, its sliding window, the causal mask), reduced, and dropped before
the next block. Memory stays at one block of ``[heads, rows, keys]`` scores and the
``[heads, s]`` results.

What a :class:`LayerSummary` holds, for every chosen head and query ``i`` (keys ``j``,
weights ``p_ij`` summing to 1 over the keys ``i`` may attend to; the distance is ``i - j``
in a causal model, ``|i - j|`` otherwise):

- ``sink``: ``Σ_{j < n_sink} p_ij``, the mass on the first ``n_sink`` tokens (attention
  sinks);
- ``distance``: ``Σ_j p_ij · dist(i, j)``, the mean attention distance of the query;
- ``within_window``: the mass on keys at distance ``< window``, what a sliding window of
  that size would keep (``1 - within_window`` is the mass beyond it);
- ``entropy``: ``-Σ_j p_ij log2 p_ij`` in bits;
- ``distance_mass``: ``[heads, s]``, the attention mass at each distance summed over the
  queries (divided by their number): the distribution behind the distance quantiles;
- ``top_keys``, ``top_weights``: ``[heads, s, k]`` the ``k`` strongest keys of every
  query and their weights (``-1`` and ``0`` where a query has fewer than ``k`` keys).

Head summaries (:meth:`LayerSummary.head_table`) average the per-query values over the
queries ``1 .. s-1`` (query 0 of a causal model can only attend to itself), as
:mod:`attnkit.inspect.heads` does for short texts.

Shape letters: ``h`` query heads, ``h_kv`` key/value heads, ``s`` tokens, ``d`` head dim,
``n_h`` chosen heads, ``m`` rows of a block, ``l`` keys of a block.
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attnkit.inspect.long_context_blocks import STATISTICS, BlockScorer, BlockStatistics, head_groups, row_blocks
from attnkit.models.model.kinds import ONE_TEXT, require_kind
from attnkit.nn.hooked_attention import MultiHeadAttention

if TYPE_CHECKING:
    from attnkit.models.model import Model

# Scores held at once by one block of the torch engine on the CPU: n_h * rows * keys floats
# (16 Mi ≈ 64 MiB in float32), and its most rows per block.
DEFAULT_BLOCK_BUDGET = 1 << 24
MAX_BLOCK_ROWS = 128
# The same on a GPU (block_limits): 256 Mi scores, 512 rows.
GPU_BLOCK_BUDGET = 1 << 28
GPU_MAX_BLOCK_ROWS = 512
DEFAULT_QUANTILES = (0.25, 0.5, 0.75, 0.9)
SUMMARY_ENGINES = ("auto", "torch", "triton")


@dataclass(frozen=True)
class LayerScoring:
    """How one self-attention layer turns queries and keys into weights, as the layer does.

    Attributes:
        scale: multiplies ``q·k``.
        softcap: the scaled scores become ``softcap · tanh(scores / softcap)`` (Gemma 2),
            or ``None``.
        window: each query sees only the ``window`` keys ending at itself (Mistral, Gemma's
            local layers), or ``None``.
        causal: a query sees only itself and earlier keys.
    """

    scale: float
    softcap: float | None = None
    window: int | None = None
    causal: bool = True

    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        """Scores ``[n_h, m, l]`` of queries ``[n_h, m, d]`` and keys ``[n_h, l, d]``, with
        the layer's order of operations (soft-capping: ``q`` takes ``scale / softcap``
        first, as :class:`attnkit.nn.MultiHeadAttention` does)."""
        if self.softcap is None:
            return (q * self.scale) @ k.transpose(-1, -2)
        return torch.tanh((q * (self.scale / self.softcap)) @ k.transpose(-1, -2)) * self.softcap

    @property
    def query_factor(self) -> float:
        """What :meth:`scores` multiplies the queries by before ``q·k``."""
        return self.scale if self.softcap is None else self.scale / self.softcap

    def distance_range(self) -> tuple[int | None, int | None]:
        """The lowest and highest signed distance ``i - j`` from a query ``i`` to a key
        ``j`` it may attend to (``None``: unbounded), from the causal mask and the window."""
        reach = None if self.window is None else self.window - 1
        if self.causal:
            return 0, reach
        return (None if reach is None else -reach), reach

    def key_range(self, r0: int, r1: int, s: int) -> tuple[int, int]:
        """The keys ``k0:k1`` that queries ``r0:r1`` may attend to, as one range."""
        if self.causal:
            k1 = r1
        else:
            k1 = s if self.window is None else min(s, r1 + self.window - 1)
        k0 = max(0, r0 - self.window + 1) if self.window is not None else 0
        return k0, k1

    def allowed(self, rows: Tensor, keys: Tensor) -> Tensor | None:
        """Bool ``[m, l]``: which keys each query row may attend to, or ``None`` if all."""
        allowed = None
        if self.causal:
            allowed = keys[None, :] <= rows[:, None]
        if self.window is not None:
            near = rows[:, None] - keys[None, :] < self.window
            if not self.causal:
                near = near & (keys[None, :] - rows[:, None] < self.window)
            allowed = near if allowed is None else allowed & near
        return allowed


def layer_scoring(attention: MultiHeadAttention, *, causal: bool, where: str = "this layer") -> LayerScoring:
    """The :class:`LayerScoring` of a self-attention module.

    Raises:
        ValueError: a layer whose weights cannot be reproduced from its queries and keys
            alone: a positional score bias (ALiBi, T5's relative positions), a score
            module (additive, Luong), or a kernel other than ``"auto"`` (local, sparse,
            linear attention). Scaled and unscaled (``"dot"``) products are reproduced.
    """
    if attention.kernel != "auto":
        raise ValueError(
            f"{where} runs the {attention.kernel!r} kernel, whose weights are not softmax(q·k) over the causal "
            "mask: long-context summaries need kernel='auto'"
        )
    if attention.positional is not None and not attention.positional.takes_positions:
        raise ValueError(
            f"{where} adds a positional score bias ({type(attention.positional).__name__}): long-context "
            "summaries reproduce scores from queries and keys alone and cannot include it"
        )
    if not isinstance(attention.score, str):
        raise ValueError(
            f"{where} scores with {type(attention.score).__name__}, not a dot product: long-context summaries "
            "need scaled dot-product scores"
        )
    head_dim = attention.head_dim
    default = head_dim**-0.5 if attention.score == "scaled_dot" else 1.0
    scale = default if attention.scale is None else float(attention.scale)
    return LayerScoring(scale=scale, softcap=attention.softcap, window=attention.window, causal=causal)


@dataclass
class LayerSummary:
    """Per-query attention statistics of the chosen heads of one layer (module docstring).

    Attributes:
        layer: the layer index.
        heads: the chosen heads, ``[n_h]``.
        rows: the query positions summarised, ``[n_r]`` (every position by default).
        sink_tokens, window: as asked.
        sink, distance, within_window, entropy: ``[n_h, n_r]`` float64, or ``None`` when
            not among the ``statistics`` asked (``"sink"``, ``"distance"``, ``"window"``,
            ``"entropy"``).
        distance_mass: ``[n_h, s]`` float64, mass at each distance averaged over the rows
            ``rows >= 1`` (``None`` with ``distance``).
        top_keys: ``[n_h, n_r, k]`` int64 key positions, strongest first (``-1`` padding);
            ``k`` is 0 when ``"top"`` was not asked.
        top_weights: ``[n_h, n_r, k]`` their weights (``0`` padding).
        block_max, block_mean: ``[n_h, ceil(s/B), ceil(s/B)]`` the block-reduced map, when
            asked for (``map_block=B``); the mean counts masked pairs as 0.
    """

    layer: int
    heads: list[int]
    rows: Tensor
    sink_tokens: int
    window: int
    causal: bool
    sink: Tensor | None
    distance: Tensor | None
    within_window: Tensor | None
    entropy: Tensor | None
    distance_mass: Tensor | None
    top_keys: Tensor
    top_weights: Tensor
    map_block: int | None = None
    block_max: Tensor | None = None
    block_mean: Tensor | None = None

    def _counted(self) -> Tensor:
        """Which rows the head averages count: queries ``1 .. s-1`` (all if only row 0)."""
        counted = self.rows >= 1
        return counted if bool(counted.any()) else torch.ones_like(counted)

    def head_table(self, quantiles: Sequence[float] = DEFAULT_QUANTILES) -> list[dict[str, float | int]]:
        """One dict per chosen head: ``layer``, ``head``, ``sink``, ``distance`` (mean),
        ``distance_q25`` … (quantiles of the distance distribution of
        :attr:`distance_mass`), ``within_window``, ``beyond_window``, ``entropy``, all
        averaged over the queries ``1 .. s-1`` (those computed)."""
        counted = self._counted()
        table = []
        for i, head in enumerate(self.heads):
            row: dict[str, float | int] = {"layer": self.layer, "head": head}
            if self.sink is not None:
                row["sink"] = float(self.sink[i, counted].mean())
            if self.distance is not None and self.distance_mass is not None:
                row["distance"] = float(self.distance[i, counted].mean())
                for q, value in zip(quantiles, distance_quantiles(self.distance_mass[i], quantiles)):
                    row[f"distance_q{round(q * 100)}"] = value
            if self.within_window is not None:
                row["within_window"] = float(self.within_window[i, counted].mean())
                row["beyond_window"] = 1.0 - row["within_window"]
            if self.entropy is not None:
                row["entropy"] = float(self.entropy[i, counted].mean())
            table.append(row)
        return table


def distance_quantiles(mass: Tensor, quantiles: Sequence[float]) -> list[int]:
    """The smallest distances ``t`` with ``Σ_{d <= t} mass[d] >= q · Σ mass`` for each
    ``q``: quantiles of the attention distance, from its mass at each distance ``[s]``."""
    total = float(mass.sum())
    cumulative = mass.cumsum(0)
    out = []
    for q in quantiles:
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantiles must be in [0, 1], got {q}")
        # A relative tolerance keeps float rounding in the sum from moving a quantile by a bin.
        reached = cumulative >= q * total * (1 - 1e-12)
        out.append(int(reached.nonzero()[0, 0]) if bool(reached.any()) else mass.numel() - 1)
    return out


def _head_keys(k: Tensor, heads: Tensor, num_heads: int) -> Tensor:
    """Keys ``[n_h, s, d]`` of the chosen query heads from ``k [h_kv, s, d]`` (GQA: the key
    head of each query head, no copy per head beyond the chosen ones)."""
    group = num_heads // k.shape[0]
    return k.index_select(0, torch.div(heads, group, rounding_mode="floor"))


def iter_weight_blocks(
    q: Tensor,
    k: Tensor,
    scoring: LayerScoring,
    *,
    heads: Tensor,
    rows: Tensor,
    block_rows: int,
) -> Iterator[tuple[Tensor, int, Tensor]]:
    """Exact weights of chosen heads and query rows, a block of rows at a time.

    Args:
        q: ``[h, s, d]``; k: ``[h_kv, s, d]``.
        scoring: the layer's :class:`LayerScoring`.
        heads: chosen query heads ``[n_h]``; rows: chosen query rows ``[n_r]``, increasing.
        block_rows: rows per block.

    Yields:
        ``(block_rows_positions [m], k0, weights [n_h, m, l])``: the weights of keys
        ``k0 .. k0 + l - 1`` (every key outside that range has weight 0).
    """
    s = k.shape[1]
    q_heads = q.index_select(0, heads)  # [n_h, s, d]
    k_heads = _head_keys(k, heads, q.shape[0])  # [n_h, s, d]
    for start in range(0, rows.numel(), block_rows):
        r = rows[start : start + block_rows]  # [m]
        k0, k1 = scoring.key_range(int(r[0]), int(r[-1]) + 1, s)
        keys = torch.arange(k0, k1, device=q.device)
        scores = scoring.scores(q_heads.index_select(1, r), k_heads[:, k0:k1])  # [n_h, m, l]
        allowed = scoring.allowed(r, keys)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        yield r, k0, torch.softmax(scores, dim=-1)


def summarize_layer(
    q: Tensor,
    k: Tensor,
    scoring: LayerScoring,
    *,
    layer: int = 0,
    heads: Sequence[int] | None = None,
    rows: Sequence[int] | Tensor | None = None,
    top_k: int = 8,
    sink_tokens: int = 1,
    window: int = 256,
    map_block: int | None = None,
    block_budget: int | None = None,
    statistics: Collection[str] = STATISTICS,
    engine: str = "auto",
    stop: Callable[[], bool] | None = None,
) -> LayerSummary:
    """Summarise one layer's attention from its queries and keys, never holding ``[s, s]``.

    Two engines compute the same statistics. ``"torch"``: each block of consecutive query
    rows gets its exact weights from one recomputed block of scores, and every statistic
    comes from that block (:class:`attnkit.inspect.long_context_blocks.BlockScorer`).
    ``"triton"``: one fused kernel per layer streams the keys of every 64 rows of a head
    twice and keeps each block of scores in registers
    (:mod:`attnkit.inspect.long_context_triton`). Either way a sliding-window layer only
    computes the keys of its window.

    Args:
        q: ``[h, s, d]`` (or ``[1, h, s, d]``), the layer's queries after the rotary
            encoding (its ``q`` hook point); k: ``[h_kv, s, d]`` (or ``[1, h_kv, s, d]``).
        scoring: the layer's :class:`LayerScoring` (:func:`layer_scoring`).
        layer: recorded in the result.
        heads: query heads to summarise (default all).
        rows: query positions to summarise (default all).
        top_k: keys kept per query.
        sink_tokens: how many first tokens count as the sink.
        window: the distance below which attention counts as ``within_window``.
        map_block: also reduce the map to ``B × B`` blocks (max and mean); needs every row.
        block_budget: the torch engine's most scores held at once (``n_h × rows × keys``);
            default from the device (:func:`block_limits`).
        statistics: which of ``"sink"``, ``"distance"`` (mean and quantiles),
            ``"window"``, ``"entropy"`` and ``"top"`` (the top keys) to compute; the
            others are ``None`` (no top keys: ``k`` = 0).
        engine: ``"torch"``, ``"triton"`` (CUDA tensors in float32, float16 or bfloat16, or
            any device under Triton's interpreter, ``TRITON_INTERPRET=1``), or ``"auto"``:
            triton on CUDA where it can run, torch otherwise.
        stop: asked before every block of the torch engine (before the one launch of the
            triton engine); when it returns ``True`` the summary ends with
            :class:`attnkit.models.RunStopped`.

    Returns:
        A :class:`LayerSummary` (statistics in float64 whatever the dtype of ``q``).

    Raises:
        RunStopped: ``stop()`` returned ``True``.
        ValueError: shapes that do not fit, heads or rows out of range, a size below 1, an
            unknown statistic or engine, the triton engine where it cannot run.
    """
    q, k = _one_sequence(q, k)
    budget, max_rows = block_limits(q.device, q.dtype)
    block_budget = budget if block_budget is None else block_budget
    _check_sizes(top_k=top_k, sink_tokens=sink_tokens, window=window, block_budget=block_budget)
    wanted = _checked_statistics(statistics)
    chosen_engine = summary_engine(engine, q)
    h, s, _ = q.shape
    head_list, row_t = _chosen_heads_and_rows(h, s, heads, rows, map_block, q.device)
    summary = _empty_summary(
        q, scoring, layer, head_list, row_t, top_k=top_k, sink_tokens=sink_tokens, window=window, map_block=map_block
    )
    _keep_only(summary, wanted)
    if chosen_engine == "triton":
        _check_stop(stop)
        _summarize_on_kernel(q, k, scoring, summary, wanted)
    else:
        block_rows = _block_rows(len(head_list), s, block_budget, max_rows=max_rows)
        _summarize_in_blocks(q, k, scoring, summary, wanted, block_rows=block_rows, stop=stop)
    return summary


def _summarize_in_blocks(
    q: Tensor,
    k: Tensor,
    scoring: LayerScoring,
    summary: LayerSummary,
    wanted: frozenset[str],
    *,
    block_rows: int,
    stop: Callable[[], bool] | None,
) -> None:
    """Fill ``summary`` (from :func:`_empty_summary`) with the torch engine: blocks of
    ``block_rows`` consecutive query rows, one :class:`BlockScorer` block each, ``stop``
    asked before each."""
    h, s, _ = q.shape
    head_list, row_t, map_block = summary.heads, summary.rows, summary.map_block
    block_max = summary.block_max
    block_sum = None if block_max is None else torch.zeros_like(block_max, dtype=torch.float64)
    lowest, highest = scoring.distance_range()
    blocks = [(done, r0, m, *scoring.key_range(r0, r0 + m, s)) for done, r0, m in row_blocks(row_t, block_rows)]
    scorer = BlockScorer(
        q.index_select(0, torch.tensor(head_list, device=q.device)) * scoring.query_factor,  # [n_h, s, d]
        k,
        head_groups(head_list, h, k.shape[0]),
        softcap=scoring.softcap,
        lowest=lowest,
        highest=highest,
        statistics=wanted,
        top_k=summary.top_keys.shape[-1],
        sink_tokens=summary.sink_tokens,
        window=summary.window,
        max_rows=max(m for _, _, m, _, _ in blocks),
        max_keys=max(k1 - k0 for _, _, _, k0, k1 in blocks),
    )
    for done, r0, m, k0, k1 in blocks:
        _check_stop(stop)
        block = scorer.block(r0, m, k0, k1, keep_weights=block_max is not None)
        _store_block(summary, slice(done, done + m), block)
        if block_max is not None and block_sum is not None and map_block is not None and block.weights is not None:
            _reduce_blocks(block.weights, r0, k0, map_block, block_max, block_sum)
    if summary.distance_mass is not None:
        summary.distance_mass /= max(1, int((row_t >= 1).sum()))
    if block_sum is not None and map_block is not None:
        summary.block_mean = (block_sum / _block_sizes(s, map_block, q.device)).to(q.dtype)


def _summarize_on_kernel(
    q: Tensor, k: Tensor, scoring: LayerScoring, summary: LayerSummary, wanted: frozenset[str]
) -> None:
    """Fill ``summary`` (from :func:`_empty_summary`) with the triton engine: one launch of
    :func:`attnkit.inspect.long_context_triton.layer_statistics`."""
    from attnkit.inspect.long_context_triton import STATISTIC_PLANES, layer_statistics

    s = q.shape[1]
    got = layer_statistics(
        q,
        k,
        torch.tensor(summary.heads, device=q.device),
        summary.rows,
        factor=scoring.query_factor,
        softcap=scoring.softcap,
        causal=scoring.causal,
        window=scoring.window,
        top_k=summary.top_keys.shape[-1],
        sink_tokens=summary.sink_tokens,
        near=summary.window,
        second_pass=bool(wanted - {"top"}) or summary.map_block is not None,
        histogram=summary.distance_mass is not None,
        map_block=summary.map_block,
    )
    for plane, name in enumerate(STATISTIC_PLANES):
        if getattr(summary, name) is not None:
            setattr(summary, name, got.stats[plane].double())
    if summary.distance_mass is not None and got.mass is not None:
        summary.distance_mass = got.mass.double() / max(1, int((summary.rows >= 1).sum()))
    weights, order = got.top_weights.sort(dim=-1, descending=True, stable=True)  # [n_h, n_r, k]
    summary.top_weights = weights.to(q.dtype)
    summary.top_keys = got.top_keys.gather(-1, order)
    if got.block_max is not None and got.block_sum is not None and summary.map_block is not None:
        summary.block_max = got.block_max.to(q.dtype)
        sizes = _block_sizes(s, summary.map_block, q.device)
        summary.block_mean = (got.block_sum.double() / sizes).to(q.dtype)


def summary_engine(engine: str, q: Tensor) -> str:
    """The engine of :func:`summarize_layer` that runs queries ``q``: ``engine`` itself,
    checked, or what ``"auto"`` picks (triton for CUDA tensors of float32, float16 or
    bfloat16 where Triton is installed; torch otherwise).

    Raises:
        ValueError: an unknown engine, or triton for tensors it cannot take.
        ImportError: triton without Triton installed.
    """
    _check_engine(engine)
    kernel_dtype = q.dtype in (torch.float32, torch.float16, torch.bfloat16)
    if engine == "triton":
        if not kernel_dtype:
            raise ValueError(f"engine='triton' takes float32, float16 or bfloat16 tensors, got {q.dtype}")
        if q.device.type != "cuda" and not _interpreting():
            raise ValueError(
                "engine='triton' runs on CUDA tensors (or on any device under Triton's interpreter, "
                f"TRITON_INTERPRET=1), got tensors on {q.device}"
            )
        if importlib.util.find_spec("triton") is None:
            raise ImportError("engine='triton' needs Triton: pip install triton (CUDA builds of PyTorch include it)")
        return engine
    if engine == "auto":
        usable = q.device.type == "cuda" and kernel_dtype and importlib.util.find_spec("triton") is not None
        return "triton" if usable else "torch"
    return engine


def _check_engine(engine: str) -> None:
    """Raise ``ValueError`` unless ``engine`` is one of :data:`SUMMARY_ENGINES`."""
    if engine not in SUMMARY_ENGINES:
        raise ValueError(f"engine must be one of {', '.join(SUMMARY_ENGINES)}, got {engine!r}")


def _interpreting() -> bool:
    """Whether Triton's interpreter runs kernels (on CPU tensors) instead of compiling them."""
    return os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on")


def block_limits(device: torch.device, dtype: torch.dtype) -> tuple[int, int]:
    """The torch engine's default block budget (scores held at once) and most rows per block
    on ``device``: :data:`DEFAULT_BLOCK_BUDGET` and :data:`MAX_BLOCK_ROWS` on the CPU, where
    short blocks follow the causal triangle closely and stay in its caches; on a GPU, whose
    many small passes over a block run at memory speed, up to :data:`GPU_BLOCK_BUDGET` scores
    (a quarter of the free memory at most: the block and its weights, in ``dtype``) and
    :data:`GPU_MAX_BLOCK_ROWS` rows."""
    if device.type == "cpu":
        return DEFAULT_BLOCK_BUDGET, MAX_BLOCK_ROWS
    from attnkit.models.checkpoints.memory import available_memory

    free, _ = available_memory(device)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    budget = min(GPU_BLOCK_BUDGET, max(DEFAULT_BLOCK_BUDGET, free // (4 * itemsize)))
    return budget, GPU_MAX_BLOCK_ROWS


def _checked_statistics(statistics: Collection[str]) -> frozenset[str]:
    """``statistics`` as a set, checked against :data:`STATISTICS`.

    Raises:
        ValueError: an unknown name, or a plain string (which would be read letter by letter).
    """
    if isinstance(statistics, str) or any(name not in STATISTICS for name in statistics):
        raise ValueError(f"statistics must be a collection of {', '.join(STATISTICS)}, got {statistics!r}")
    return frozenset(statistics)


def _keep_only(summary: LayerSummary, wanted: frozenset[str]) -> None:
    """Drop the fields of ``summary`` that ``wanted`` does not ask for."""
    if "sink" not in wanted:
        summary.sink = None
    if "distance" not in wanted:
        summary.distance = summary.distance_mass = None
    if "window" not in wanted:
        summary.within_window = None
    if "entropy" not in wanted:
        summary.entropy = None
    if "top" not in wanted:
        summary.top_keys = summary.top_keys[..., :0]
        summary.top_weights = summary.top_weights[..., :0]


def _one_sequence(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    """``q [h, s, d]`` and ``k [h_kv, s, d]``, from those or a batch of one sequence of each.

    Raises:
        ValueError: a batch of more than one sequence, or shapes that do not fit.
    """
    if q.ndim == 4 and k.ndim == 4:
        if q.shape[0] != 1 or k.shape[0] != 1:
            raise ValueError(f"q and k must hold one sequence, got batches of {q.shape[0]} and {k.shape[0]}")
        q, k = q[0], k[0]  # [h, s, d], [h_kv, s, d]
    if q.ndim != 3 or k.ndim != 3 or q.shape[1:] != k.shape[1:] or q.shape[0] % k.shape[0]:
        raise ValueError(
            f"q must be [h, s, d] and k [h_kv, s, d] with h_kv dividing h, got {list(q.shape)} and {list(k.shape)}"
        )
    return q, k


def _check_sizes(**sizes: int) -> None:
    """Check that each of ``sizes`` (by argument name) is an int of at least 1.

    Raises:
        ValueError: naming the first one that is not.
    """
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def _chosen_heads_and_rows(
    h: int,
    s: int,
    heads: Sequence[int] | None,
    rows: Sequence[int] | Tensor | None,
    map_block: int | None,
    device: torch.device,
) -> tuple[list[int], Tensor]:
    """The heads to summarise (default all ``h``) and the query rows ``[n_r]``, sorted
    without repeats (default all ``s``), checked against the sizes and ``map_block``.

    Raises:
        ValueError: heads or rows out of range, or a ``map_block`` below 1 or without every row.
    """
    head_list = list(range(h)) if heads is None else [int(x) for x in heads]
    if not head_list or any(not 0 <= x < h for x in head_list):
        raise ValueError(f"heads must be in 0..{h - 1}, got {head_list}")
    row_t = torch.arange(s, device=device) if rows is None else torch.as_tensor(rows, dtype=torch.long, device=device)
    if row_t.ndim != 1 or row_t.numel() == 0 or int(row_t.min()) < 0 or int(row_t.max()) >= s:
        raise ValueError(f"rows must be positions in 0..{s - 1}, got {rows!r}")
    row_t = torch.unique(row_t)  # sorted
    if map_block is not None and (row_t.numel() != s or isinstance(map_block, bool) or map_block < 1):
        raise ValueError(f"map_block needs every row and an int >= 1, got map_block={map_block!r}")
    return head_list, row_t


def _block_rows(n_h: int, s: int, block_budget: int, *, max_rows: int) -> int:
    """Query rows per block: as many as ``block_budget`` scores allow for ``n_h`` heads over
    ``s`` keys, at most ``max_rows`` (whatever the map's block: rows fold into its cells
    wherever they start)."""
    # Short blocks follow the causal triangle closely (a block computes keys up to its last row).
    return max(1, min(max_rows, block_budget // (n_h * s)))


def _empty_summary(
    q: Tensor,
    scoring: LayerScoring,
    layer: int,
    heads: list[int],
    rows: Tensor,
    *,
    top_k: int,
    sink_tokens: int,
    window: int,
    map_block: int | None,
) -> LayerSummary:
    """A :class:`LayerSummary` of zeros (``-1`` top keys) for ``heads`` and ``rows`` of queries
    ``q [h, s, d]``, for :func:`_fold_block` to fill; its ``block_max`` is zeros when
    ``map_block`` is given, its ``block_mean`` is left ``None``."""
    s, device = q.shape[1], q.device
    n_h, n_r = len(heads), rows.numel()
    sink = torch.zeros(n_h, n_r, dtype=torch.float64, device=device)
    kept = min(top_k, s)
    n_blocks = math.ceil(s / map_block) if map_block is not None else 0
    return LayerSummary(
        layer=layer,
        heads=heads,
        rows=rows,
        sink_tokens=sink_tokens,
        window=window,
        causal=scoring.causal,
        sink=sink,
        distance=torch.zeros_like(sink),
        within_window=torch.zeros_like(sink),
        entropy=torch.zeros_like(sink),
        distance_mass=torch.zeros(n_h, s, dtype=torch.float64, device=device),
        top_keys=torch.full((n_h, n_r, kept), -1, dtype=torch.long, device=device),
        top_weights=torch.zeros(n_h, n_r, kept, dtype=q.dtype, device=device),
        map_block=map_block,
        block_max=torch.zeros(n_h, n_blocks, n_blocks, dtype=q.dtype, device=device) if map_block else None,
    )


def _store_block(summary: LayerSummary, out: slice, block: BlockStatistics) -> None:
    """Write one block's per-query statistics into ``summary``'s rows ``out``, and add its
    mass at each distance to ``summary.distance_mass``."""
    f64 = torch.float64
    for name in ("sink", "distance", "within_window", "entropy"):
        target, value = getattr(summary, name), getattr(block, name)
        if target is not None and value is not None:
            target[:, out] = value.to(f64)
    if summary.distance_mass is not None and block.distance_mass is not None:
        reach = block.mass_at < summary.distance_mass.shape[1]  # columns of keys beyond the text hold 0
        summary.distance_mass.index_add_(1, block.mass_at[reach], block.distance_mass[:, reach].to(f64))
    kept = block.top_keys.shape[-1]
    summary.top_keys[:, out, :kept] = block.top_keys
    summary.top_weights[:, out, :kept] = block.top_weights


def _reduce_blocks(w: Tensor, r0: int, k0: int, b: int, block_max: Tensor, block_sum: Tensor) -> None:
    """Fold weights ``[n_h, m, l]`` of rows ``r0 ..`` and keys ``k0 ..`` into the ``b × b``
    block maxima and sums, each row and key into the cell it falls in: nothing larger than
    the weights and the cells they touch is made, whatever ``b``."""
    key_max = _fold_cells(w, k0, b, lambda x: x.amax(-1))  # [n_h, m, nj]
    key_sum = _fold_cells(w, k0, b, lambda x: x.sum(-1, dtype=torch.float64))  # [n_h, m, nj]
    cell_max = _fold_cells(key_max.transpose(1, 2), r0, b, lambda x: x.amax(-1)).transpose(1, 2)  # [n_h, ni, nj]
    cell_sum = _fold_cells(key_sum.transpose(1, 2), r0, b, lambda x: x.sum(-1)).transpose(1, 2)  # [n_h, ni, nj]
    i0, j0 = r0 // b, k0 // b
    cells = (slice(None), slice(i0, i0 + cell_max.shape[1]), slice(j0, j0 + cell_max.shape[2]))
    block_max[cells] = torch.maximum(block_max[cells], cell_max)
    block_sum[cells] += cell_sum


def _fold_cells(x: Tensor, start: int, b: int, reduce: Callable[[Tensor], Tensor]) -> Tensor:
    """``reduce`` (over the last dimension) of each cell of ``b`` positions along the last
    dimension of ``x [..., n]``, whose first position is ``start``: ``[..., cells]``, the
    first and last cells cut where ``x`` begins and ends (no padding)."""
    n = x.shape[-1]
    first = min(n, -start % b)  # positions before the first cell boundary
    whole = (n - first) // b * b
    parts = [
        reduce(x[..., a:z].unflatten(-1, (-1, size)))
        for a, z, size in ((0, first, first), (first, first + whole, b), (first + whole, n, n - first - whole))
        if z > a
    ]
    return torch.cat(parts, -1) if len(parts) > 1 else parts[0]


def _block_sizes(s: int, b: int, device: torch.device) -> Tensor:
    """Entries in each ``b × b`` block of an ``s × s`` map ``[n, n]`` (edge blocks are smaller)."""
    n = math.ceil(s / b)
    sizes = torch.full((n,), b, dtype=torch.float64, device=device)
    sizes[-1] = s - b * (n - 1)
    return sizes[:, None] * sizes[None, :]


def exact_block(
    q: Tensor,
    k: Tensor,
    scoring: LayerScoring,
    *,
    head: int,
    rows: tuple[int, int],
    keys: tuple[int, int],
    block_budget: int | None = None,
) -> Tensor:
    """Exact weights ``[r1 - r0, k1 - k0]`` of one head for query rows ``r0:r1`` and keys
    ``k0:k1`` (each row normalised over all of its keys, not only those shown).

    Args:
        q, k: as :func:`summarize_layer`.
        scoring: the layer's :class:`LayerScoring`.
        head: the query head.
        rows, keys: ``(start, stop)`` ranges.
        block_budget: the most scores held at once; default from the device (:func:`block_limits`).

    Raises:
        ValueError: a head or range out of bounds.
    """
    if q.ndim == 4:
        q, k = q[0], k[0]
    h, s, _ = q.shape
    if not 0 <= head < h:
        raise ValueError(f"head must be in 0..{h - 1}, got {head}")
    (r0, r1), (k0, k1) = rows, keys
    if not (0 <= r0 < r1 <= s and 0 <= k0 < k1 <= s):
        raise ValueError(f"rows and keys must be non-empty ranges within 0..{s}, got rows {rows} and keys {keys}")
    out = torch.zeros(r1 - r0, k1 - k0, dtype=q.dtype, device=q.device)
    if block_budget is None:
        block_budget = block_limits(q.device, q.dtype)[0]
    block_rows = max(1, block_budget // s)
    head_t = torch.tensor([head], device=q.device)
    row_t = torch.arange(r0, r1, device=q.device)
    for r, start, w in iter_weight_blocks(q, k, scoring, heads=head_t, rows=row_t, block_rows=block_rows):
        lo, hi = max(k0, start), min(k1, start + w.shape[-1])
        if lo < hi:
            out[int(r[0]) - r0 : int(r[-1]) + 1 - r0, lo - k0 : hi - k0] = w[0, :, lo - start : hi - start]
    return out


@dataclass
class LongContextRun:
    """What :func:`long_context_summaries` returns.

    Attributes:
        ids: the token ids ``[s]``.
        summaries: layer index → its :class:`LayerSummary`.
        logits: ``[len(logits_at), vocab]`` next-token logits at the positions asked, or ``None``.
        logits_at: those positions.
        scorings: layer index → its :class:`LayerScoring`.
        kept_qk: layer index → ``(q [h, s, d], k [h_kv, s, d])`` when ``keep_qk`` was set
            (for exact zoomed blocks later: :func:`exact_block`).
    """

    ids: Tensor
    summaries: dict[int, LayerSummary]
    logits: Tensor | None
    logits_at: list[int]
    scorings: dict[int, LayerScoring]
    kept_qk: dict[int, tuple[Tensor, Tensor]] = field(default_factory=dict)

    def head_table(self, quantiles: Sequence[float] = DEFAULT_QUANTILES) -> list[dict[str, float | int]]:
        """Every summarised head's row (:meth:`LayerSummary.head_table`), by layer then head."""
        return [row for i in sorted(self.summaries) for row in self.summaries[i].head_table(quantiles)]


def long_context_summaries(
    model: object,
    text_or_ids: str | Tensor | Sequence[int],
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    rows: Sequence[int] | None = None,
    top_k: int = 8,
    sink_tokens: int = 1,
    window: int = 256,
    map_block: int | None = None,
    logits_at: Sequence[int] = (),
    keep_qk: bool = False,
    block_budget: int | None = None,
    statistics: Collection[str] = STATISTICS,
    local_statistics: Collection[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    engine: str = "auto",
    stop: Callable[[], bool] | None = None,
) -> LongContextRun:
    """Per-head summaries of a real model's attention over a long text, in bounded memory.

    One forward pass on the fused kernels (no layer forms its weights); each chosen layer's
    queries and keys are summarised by :func:`summarize_layer` as the pass reaches it, and
    dropped. Without ``logits_at`` the pass ends after the last chosen layer.

    Args:
        model: an :class:`attnkit.models.Model` of a decoder or encoder family.
        text_or_ids: the text, or token ids ``[s]`` / ``[1, s]``.
        layers: layers to summarise (negative from the end; default all).
        heads, rows, top_k, sink_tokens, window, map_block, block_budget, statistics, engine:
            as :func:`summarize_layer` (on CUDA the fused Triton kernel by default).
        local_statistics: the statistics of sliding-window layers, when they differ from
            ``statistics`` (``("distance",)``: only how far Gemma's local layers look).
        logits_at: positions whose next-token logits to return (the vocabulary projection
            runs on those rows only).
        keep_qk: keep each chosen layer's queries and keys in the result (``2 · s · h · d``
            floats per layer) for :func:`exact_block`.
        progress: called with ``(layers done, layers chosen)`` after each layer.
        stop: asked before every layer and every block of query rows (the torch engine; the
            triton engine runs a layer in one launch); when it returns ``True`` the run ends with :class:`attnkit.models.RunStopped` (a server stops
            the work of a client that has gone).

    Returns:
        A :class:`LongContextRun`.

    Raises:
        RunStopped: ``stop()`` returned ``True``.
        ValueError: an encoder–decoder, a layer the summaries cannot reproduce exactly
            (:func:`layer_scoring`), or arguments out of range.
    """
    model = _summarizable(model, engine)
    ids, _, _ = model.prepare_input(text_or_ids)
    chosen = _layer_list(layers, model.num_layers)
    positions = _positions(logits_at, ids.shape[1])
    wanted = _checked_statistics(statistics)
    local_wanted = wanted if local_statistics is None else _checked_statistics(local_statistics)
    scorings = {
        i: layer_scoring(model.module.self_attention(i), causal=model.causal, where=f"{model.name} layer {i}")
        for i in chosen
    }

    def summarise(layer: int, q: Tensor, k: Tensor) -> LayerSummary:
        return summarize_layer(
            q,
            k,
            scorings[layer],
            layer=layer,
            heads=heads,
            rows=rows,
            top_k=top_k,
            sink_tokens=sink_tokens,
            window=window,
            map_block=map_block,
            block_budget=block_budget,
            statistics=wanted if scorings[layer].window is None else local_wanted,
            engine=engine,
            stop=stop,
        )

    pass_ = _SummarisingPass(
        chosen, summarise, keep_qk=keep_qk, progress=progress, stop=stop, through_last_layer=bool(positions)
    )
    hidden = pass_.run(model, ids)
    logits = _next_token_logits(model, hidden, positions) if hidden is not None else None
    return LongContextRun(
        ids=ids[0],
        summaries=pass_.summaries,
        logits=logits,
        logits_at=positions,
        scorings=scorings,
        kept_qk=pass_.kept,
    )


class _Summarised(Exception):
    """Every chosen layer is summarised and nothing after them is wanted: the pass ends."""


class _SummarisingPass:
    """One forward pass that summarises each chosen layer from its ``q`` and ``k`` hook
    points as the pass reaches it.

    Args:
        chosen: the layers to summarise, sorted.
        summarise: ``(layer, q [h, s, d], k [h_kv, s, d]) -> LayerSummary``.
        keep_qk, progress, stop: as :func:`long_context_summaries`.
        through_last_layer: run every layer (for logits); else the pass ends after the last
            chosen layer.
    """

    def __init__(
        self,
        chosen: list[int],
        summarise: Callable[[int, Tensor, Tensor], LayerSummary],
        *,
        keep_qk: bool,
        progress: Callable[[int, int], None] | None,
        stop: Callable[[], bool] | None,
        through_last_layer: bool,
    ) -> None:
        self.chosen, self.summarise = chosen, summarise
        self.keep_qk, self.progress, self.stop = keep_qk, progress, stop
        self.through_last_layer = through_last_layer
        self.summaries: dict[int, LayerSummary] = {}
        self.kept: dict[int, tuple[Tensor, Tensor]] = {}
        self._queries: dict[int, Tensor] = {}

    def run(self, model: Model, ids: Tensor) -> Tensor | None:
        """Run the pass on ``ids [1, s]``: its last hidden states ``[1, s, e]``, or ``None``
        when it ended after the last chosen layer.

        Raises:
            RunStopped: ``stop()`` turned true (asked before every layer and every block).
        """
        # Every layer's q asks stop(), so that a stopped pass ends at the next layer.
        asked = range(model.num_layers) if self.stop is not None else self.chosen
        hooks: dict[str, Callable[[Tensor], None]] = {model.hook_name("self_attn.q", i): self._take_q(i) for i in asked}
        hooks.update({model.hook_name("self_attn.k", i): self._take_k(i) for i in self.chosen})
        try:
            with model.hooks(hooks):
                run = model.run(ids, return_weights=False, logits=False)
        except _Summarised:
            return None
        return run.last_hidden_state

    def _take_q(self, layer: int) -> Callable[[Tensor], None]:
        def hook(q: Tensor) -> None:
            _check_stop(self.stop)
            if layer in self.chosen:
                self._queries[layer] = q.detach()[0]  # [h, s, d]

        return hook

    def _take_k(self, layer: int) -> Callable[[Tensor], None]:
        def hook(k: Tensor) -> None:
            q = self._queries.pop(layer)
            k = k.detach()[0]  # [h_kv, s, d]
            self.summaries[layer] = self.summarise(layer, q, k)
            if self.keep_qk:
                self.kept[layer] = (q, k)
            if self.progress is not None:
                self.progress(len(self.summaries), len(self.chosen))
            if len(self.summaries) == len(self.chosen) and not self.through_last_layer:
                raise _Summarised

        return hook


def _check_stop(stop: Callable[[], bool] | None) -> None:
    """Raise :class:`attnkit.models.RunStopped` when ``stop()`` is true."""
    if stop is not None and stop():
        from attnkit.models import RunStopped

        raise RunStopped("the long-context summaries were stopped")


def _summarizable(model: object, engine: str) -> Model:
    """``model``, checked by :func:`summarizable_model`, and ``engine`` checked to be one of
    :data:`SUMMARY_ENGINES`.

    Raises:
        TypeError: not a Model.
        ValueError: an encoder-decoder, or an unknown engine.
    """
    model = summarizable_model(model)
    _check_engine(engine)
    return model


def summarizable_model(model: object) -> Model:
    """``model``, checked to be what :func:`long_context_summaries` reads: an
    :class:`attnkit.models.Model` (its modules and hook points, which the
    :class:`attnkit.models.InspectableModel` protocol alone does not give) with one
    self-attention stack (:data:`attnkit.models.model.kinds.ONE_TEXT`).

    Raises:
        TypeError: not a Model.
        ModelKindError: an encoder-decoder (a ``ValueError``).
    """
    from attnkit.models.model import Model

    if not isinstance(model, Model):
        raise TypeError(f"model must be an attnkit.models.Model, got {type(model).__name__}")
    require_kind(model, ONE_TEXT, what="long-context summaries read one self-attention stack")
    return model


def _positions(logits_at: Sequence[int], s: int) -> list[int]:
    """The positions of ``logits_at`` as ints, checked to be within ``0 .. s - 1``.

    Raises:
        ValueError: a position out of range.
    """
    positions = [int(p) for p in logits_at]
    if any(not 0 <= p < s for p in positions):
        raise ValueError(f"logits_at must be positions in 0..{s - 1}, got {positions}")
    return positions


def _next_token_logits(model: Model, last_hidden_state: Tensor, positions: list[int]) -> Tensor:
    """Float next-token logits ``[n, v]`` at ``positions`` from the last hidden states
    ``[1, s, e]``: the vocabulary projection runs on those rows only.

    Raises:
        ValueError: an encoder, which has no next-token logits.
    """
    hidden = last_hidden_state[:, positions].to(next(model.module.parameters()).dtype)  # [1, n, e]
    with torch.no_grad():
        scores = model.module.logits(hidden)  # [1, n, v], or None for an encoder
    if scores is None:
        raise ValueError(f"{model.name} is an encoder without next-token logits: logits_at must be empty")
    return scores[0].float()


def _layer_list(layers: Sequence[int] | None, num_layers: int) -> list[int]:
    """Layer indices in ``0 .. num_layers - 1`` (negative ones from the end), sorted."""
    if layers is None:
        return list(range(num_layers))
    out = []
    for i in layers:
        if isinstance(i, bool) or not isinstance(i, int) or not -num_layers <= i < num_layers:
            raise ValueError(f"layers must be ints in {-num_layers}..{num_layers - 1}, got {list(layers)}")
        out.append(i % num_layers)
    if not out:
        raise ValueError("layers must name at least one layer, got []")
    return sorted(set(out))
