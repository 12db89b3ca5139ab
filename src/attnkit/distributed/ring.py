"""Ring attention: exact attention over a sequence sharded across the ranks of a process group.

Each rank holds the queries, keys and values of its shard of the sequence
(:mod:`attnkit.distributed.layout`). The key/value shards travel around the ring of ranks:
at step ``t`` rank ``r`` attends with its queries to the keys and values of rank
``r - t`` while, at the same time, it sends those keys and values on to rank ``r + 1`` and
receives the next ones from rank ``r - 1`` (point-to-point ``isend``/``irecv``, posted before
the compute so that the transfer overlaps it). In the forward pass a shard travels in
pieces: a piece is sent on, and the matching piece of the next shard received, while the
rank computes on it, so a rank holds about one shard in transit besides its own. After
``n`` steps every query has seen every key; the ``n`` partial results are merged exactly
through their log-sum-exp.

Each step is one call of the tiled kernel (:mod:`attnkit.functional.tiled`) on the pair
(local queries, visiting keys) with the absolute positions of both, so any
:class:`~attnkit.masks.Mask` works and the kernel's block test skips every block of the
pair where the mask allows nothing; a step whose whole pair is empty (later keys under a
causal mask, another document, outside a window) computes nothing.

The backward pass (a custom ``autograd.Function``) runs the ring again: the keys and values
travel as in the forward pass, each rank adds its queries' contribution to the key and value
gradients of the visiting shard, and those gradient accumulators travel one hop behind the
keys, arriving home after the last step. The query gradient stays local.

Shape letters: ``b`` batch, ``h`` query heads, ``h_kv`` key/value heads, ``s_local`` this
rank's shard length, ``d``/``d_v`` head dims, ``n`` world size.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from attnkit.distributed.agreement import Setting, agree, code_float, float_code, text_code
from attnkit.distributed.layout import LAYOUTS, Layout, check_layout, check_lengths, shard_positions
from attnkit.functional import masks as masks_mod
from attnkit.functional.blockwise import lse_dtype, merge
from attnkit.functional.recompute import recomputed_attention
from attnkit.functional.records import AttentionResult
from attnkit.functional.scores import resolve_scale
from attnkit.functional.tiled import EMPTY, TiledPlan, make_plan, plan_backward, plan_forward

# Tags that keep the two streams between a pair of ranks apart (keys/values and their
# gradient accumulators have the same shapes).
_TAG_KV = 17
_TAG_GRAD = 18
# Pieces in which a key/value shard travels in the forward pass: a rank holds the shard it
# computes on plus the pieces of the next one received so far, about one shard in transit.
_TRANSFER_PIECES = 8
# Query blocks per tiled call: bounds the partial output that each call allocates before it
# is merged, so that a rank's working memory beyond its shards stays small.
_QUERY_BLOCKS_PER_CALL = 2


@dataclass
class RingTimings:
    """Seconds spent by one rank in ring attention, summed over calls; pass one to
    :func:`ring_attention` to have it filled.

    Attributes:
        compute: in the local block kernels.
        wait: blocked on point-to-point transfers that the compute did not hide.
        steps: ring steps run; ``skipped``: of those, steps whose block pair the mask left
            empty.
    """

    compute: float = 0.0
    wait: float = 0.0
    steps: int = 0
    skipped: int = 0

    @property
    def wait_share(self) -> float:
        """``wait / (compute + wait)``; 0 before any step."""
        total = self.compute + self.wait
        return self.wait / total if total > 0 else 0.0


@dataclass
class _Ring:
    """Who is where on the ring, and what each step computes (built once per call)."""

    group: dist.ProcessGroup | None
    rank: int
    world: int
    peers: list[int]  # global rank of each group rank, for point-to-point calls
    lengths: list[int]  # shard length of each group rank
    positions: list[Tensor]  # [s_local] absolute positions of each group rank's shard
    pattern: masks_mod.Mask | None
    scale: float
    block_size: tuple[int, int]
    timings: RingTimings | None

    def source(self, step: int) -> int:
        """The group rank whose keys and values this rank holds at ``step``."""
        return (self.rank - step) % self.world

    def plans(self, q: Tensor, k: Tensor, v: Tensor, kv_pos: Tensor) -> list[tuple[int, int, TiledPlan]]:
        """Tiled plans of this rank's queries against keys at positions ``kv_pos``, one per
        chunk of ``_QUERY_BLOCKS_PER_CALL`` query blocks, as ``(r0, r1, plan)``; chunks whose
        every block the mask leaves empty are left out (none: nothing to compute)."""
        s_local = q.shape[2]
        if k.shape[2] == 0:
            return []
        chunks = []
        rows = _QUERY_BLOCKS_PER_CALL * self.block_size[0]
        for r0 in range(0, s_local, rows):
            r1 = min(s_local, r0 + rows)
            plan = make_plan(
                q[:, :, r0:r1],
                k,
                v,
                mask=self.pattern,
                bias=None,
                causal=False,
                scale=self.scale,
                block_size=self.block_size,
                q_pos=self.positions[self.rank][r0:r1],
                kv_pos=kv_pos,
            )
            if not bool((plan.status == EMPTY).all()):
                chunks.append((r0, r1, plan))
        return chunks

    def exchange(self, send: list[Tensor], recv: list[Tensor], tag: int) -> list[dist.Work]:
        """Post ``send`` to the next rank and ``recv`` from the previous one; returns the
        requests to wait on."""
        nxt, prev = self.peers[(self.rank + 1) % self.world], self.peers[(self.rank - 1) % self.world]
        ops = [dist.P2POp(dist.isend, t, nxt, self.group, tag) for t in send]
        ops += [dist.P2POp(dist.irecv, t, prev, self.group, tag) for t in recv]
        return dist.batch_isend_irecv(ops)

    def wait(self, requests: list[dist.Work]) -> None:
        start = time.perf_counter()
        for request in requests:
            request.wait()
        if self.timings is not None:
            self.timings.wait += time.perf_counter() - start

    def timed(self, start: float) -> None:
        if self.timings is not None:
            self.timings.compute += time.perf_counter() - start


def ring_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    mask: masks_mod.Mask | None = None,
    scale: float | None = None,
    group: dist.ProcessGroup | None = None,
    layout: Layout = "contiguous",
    return_lse: bool = False,
    block_size: int | tuple[int, int] = (256, 128),
    timings: RingTimings | None = None,
) -> Tensor | AttentionResult:
    """Exact self-attention over a sequence whose shards are spread over the ranks of
    ``group``; each rank passes its own shard and gets its shard of the output.

    Every rank of the group must call it with shards cut by the same ``layout`` (see
    :func:`attnkit.distributed.shard`), the same ``b``, heads and head dims, and the same
    options. The result equals :func:`attnkit.attention` on the whole sequence, restricted
    to this rank's positions; it is differentiable in ``q``, ``k`` and ``v``.

    Args:
        q: this rank's queries ``[b, h, s_local, d]``.
        k: this rank's keys ``[b, h_kv, s_local, d]`` (``h`` divisible by ``h_kv``).
        v: this rank's values ``[b, h_kv, s_local, d_v]``.
        causal: query at position ``i`` attends to keys ``<= i`` (positions are those of the
            whole sequence).
        mask: an :class:`attnkit.masks.Mask` over the whole sequence's positions; pairs of
            shards where it allows nothing are skipped. Masks defined for one size
            (``from_dense``) are not accepted: they would hold the whole ``[s, s]`` matrix.
        scale: score scale, default ``1/sqrt(d)``.
        group: the process group (default: the whole world).
        layout: ``"contiguous"`` or ``"zigzag"`` (balances causal work across ranks).
        return_lse: return an :class:`~attnkit.functional.AttentionResult` with ``lse``
            ``[b, h, s_local]`` (``-inf`` on rows that may attend to nothing).
        block_size: ``(block_q, block_k)`` of the tiled kernel each step runs.
        timings: a :class:`RingTimings` to which this call adds its compute and wait times.

    Returns:
        ``[b, h, s_local, d_v]`` (zeros on rows that may attend to nothing), or an
        ``AttentionResult``.

    Raises:
        TypeError: non-tensor or non-float inputs, differing dtypes, a mask that is not a
            ``Mask``.
        ValueError: shapes that do not fit together, an unknown layout, a sized mask, shard
            lengths that the layout does not produce; on every rank alike, a rank that
            refused its arguments or ranks that differ in shapes, dtype or options (the ranks
            compare them in one small all-gather before any data moves).
        RuntimeError: torch.distributed is not initialised.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "torch.distributed is not initialised: start the script with torchrun and call "
            "attnkit.distributed.init() (or torch.distributed.init_process_group) first"
        )
    needs_grad = torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in (q, k, v))
    try:
        _check_arguments(q, k, v, mask, scale, layout)
    except (TypeError, ValueError):
        if dist.get_world_size(group) > 1:
            agree("ring attention", None, group, _SETTING_COUNT)  # the other ranks stop too
        raise
    lengths = [q.shape[2]]
    if dist.get_world_size(group) > 1:
        every = agree(
            "ring attention", _settings(q, k, v, causal, mask, scale, layout, needs_grad), group, _SETTING_COUNT
        )
        lengths = [values[0] for values in every]
    ring = _make_ring(q, lengths, mask, causal, scale, group, layout, block_size, timings)
    # [b, h, s_local, d_v], [b, h, s_local]; differentiable when needs_grad (the same on every rank)
    out, lse = recomputed_attention(_ring_forward, _ring_backward, ring, q, k, v)
    return AttentionResult(out, None, lse) if return_lse else out


def _check_arguments(
    q: Tensor, k: Tensor, v: Tensor, mask: masks_mod.Mask | None, scale: float | None, layout: Layout
) -> None:
    """This rank's own checks, before the ranks compare their arguments."""
    _check_inputs(q, k, v)
    check_layout(layout)
    if mask is not None and not isinstance(mask, masks_mod.Mask):
        raise TypeError(f"mask must be an attnkit.masks.Mask over the whole sequence, got {type(mask).__name__}")
    if mask is not None and mask.shape is not None:
        raise ValueError(
            f"mask {mask.name} is defined for one size {mask.shape}; ring attention needs a mask that is a "
            "function of positions (causal, sliding_window, document, ...)"
        )
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        raise TypeError(f"scale must be a finite number or None, got {scale!r}")


_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
# How many settings _settings gives (a rank that refused its own arguments has none to count).
_SETTING_COUNT = 13


def _settings(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    causal: bool,
    mask: masks_mod.Mask | None,
    scale: float | None,
    layout: Layout,
    needs_grad: bool,
) -> list[Setting]:
    """What every rank must pass alike, and its shard length (gathered in the same call, but
    checked apart: lengths differ by design). The mask is compared by its name, which spells
    out its parameters."""
    b, h, s_local, d = q.shape
    dtype = _DTYPES.index(q.dtype) if q.dtype in _DTYPES else len(_DTYPES)
    settings = [
        Setting("shard length", s_local, same=False),
        Setting("batch size", b),
        Setting("number of query heads", h),
        Setting("number of key/value heads", k.shape[1]),
        Setting("head dim", d),
        Setting("value head dim", v.shape[-1]),
        Setting("dtype", dtype, lambda i: str(_DTYPES[i]) if i < len(_DTYPES) else "another dtype"),
        Setting("device type", text_code(q.device.type), None),
        Setting("causal", int(bool(causal)), _show_bool),
        Setting("layout", LAYOUTS.index(layout), lambda i: repr(LAYOUTS[i])),
        Setting("mask", -1 if mask is None else text_code(mask.name), None),
        Setting("scale", float_code(math.nan if scale is None else float(scale)), _show_scale),
        Setting("need for gradients (q, k or v requiring grad under grad mode)", int(needs_grad), _show_bool),
    ]
    assert len(settings) == _SETTING_COUNT
    return settings


def _show_bool(value: int) -> str:
    return str(bool(value))


def _show_scale(code: int) -> str:
    scale = code_float(code)
    return "the default" if math.isnan(scale) else repr(scale)


def _check_inputs(q: Tensor, k: Tensor, v: Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
        if t.ndim != 4:
            raise ValueError(f"{name} must be [b, heads, s_local, dim], got shape {list(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must have the same dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on the same device, got q {q.device}, k {k.device}, v {v.device}")
    shapes = f"q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}"
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        raise ValueError(f"q, k and v must have the same batch size, got {shapes}")
    if not (q.shape[2] == k.shape[2] == v.shape[2]):
        raise ValueError(f"q, k and v must be shards of one sequence (same s_local), got {shapes}")
    if k.shape[1] != v.shape[1] or k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(f"k and v must have h_kv heads with h divisible by h_kv, got {shapes}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must have the same head dim, got {shapes}")


def _make_ring(
    q: Tensor,
    lengths: list[int],
    mask: masks_mod.Mask | None,
    causal: bool,
    scale: float | None,
    group: dist.ProcessGroup | None,
    layout: Layout,
    block_size: int | tuple[int, int],
    timings: RingTimings | None,
) -> _Ring:
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    seq_len = check_lengths(lengths, layout)
    pattern = mask
    if causal:
        pattern = masks_mod.causal() if mask is None else masks_mod.causal() & mask
    return _Ring(
        group=group,
        rank=rank,
        world=world,
        peers=[r if group is None else dist.get_global_rank(group, r) for r in range(world)],
        lengths=lengths,
        positions=[shard_positions(seq_len, r, world, layout, device=q.device) for r in range(world)],
        pattern=pattern,
        scale=resolve_scale(scale, q.shape[-1]),
        block_size=(block_size, block_size) if isinstance(block_size, int) else (block_size[0], block_size[1]),
        timings=timings,
    )


def _empty_like_shard(t: Tensor, length: int) -> Tensor:
    """An uninitialised ``[b, heads, length, dim]`` buffer like ``t``."""
    return t.new_empty(t.shape[0], t.shape[1], length, t.shape[3])


def _pieces(length: int) -> list[tuple[int, int]]:
    """The ``[a, b)`` ranges of the ``_TRANSFER_PIECES`` near-equal pieces in which a shard
    of ``length`` positions travels (empty pieces left out)."""
    base, extra = divmod(length, _TRANSFER_PIECES)
    ranges, start = [], 0
    for i in range(_TRANSFER_PIECES):
        size = base + (1 if i < extra else 0)
        if size:
            ranges.append((start, start + size))
            start += size
    return ranges


def _ring_forward(ring: _Ring, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """The forward ring. The visiting shards travel in pieces: while a rank computes on
    piece ``j`` of the shard it holds, it sends that piece on and receives piece ``j`` of
    the next shard, so about one shard (not two) is in transit at a time."""
    b, h, s_local, _ = q.shape
    out = q.new_zeros(b, h, s_local, v.shape[-1])  # [b, h, s_local, d_v]
    lse = torch.full((b, h, s_local), float("-inf"), dtype=lse_dtype(q.dtype), device=q.device)
    # The pieces of the shard held, in order: (positions, k [b, h_kv, piece, d], v [b, h_kv, piece, d_v]).
    held = deque((ring.positions[ring.rank][a:b_], k[:, :, a:b_], v[:, :, a:b_]) for a, b_ in _pieces(k.shape[2]))
    for step in range(ring.world):
        last = step + 1 == ring.world
        src_next = ring.source(step + 1)
        arriving = [] if last else _pieces(ring.lengths[src_next])
        received: deque[tuple[Tensor, Tensor, Tensor]] = deque()
        computed = False
        for j in range(max(len(held), len(arriving))):
            piece = held.popleft() if held else None
            requests: list[dist.Work] = []
            send: list[Tensor] = []
            if not last:
                send = [] if piece is None else [piece[1].contiguous(), piece[2].contiguous()]
                recv = []
                if j < len(arriving):
                    a, b_ = arriving[j]
                    recv = [_empty_like_shard(k, b_ - a), _empty_like_shard(v, b_ - a)]
                    received.append((ring.positions[src_next][a:b_], recv[0], recv[1]))
                requests = ring.exchange(send, recv, _TAG_KV)
            if piece is not None:
                start = time.perf_counter()
                kv_pos, k_piece, v_piece = piece
                for r0, r1, plan in ring.plans(q, k_piece, v_piece, kv_pos):
                    o, l_ = plan_forward(plan, q[:, :, r0:r1], k_piece, v_piece, None)  # [b, h, r1 - r0, d_v]
                    out[:, :, r0:r1], lse[:, :, r0:r1] = merge(out[:, :, r0:r1], lse[:, :, r0:r1], o, l_)
                    computed = True
                ring.timed(start)
            ring.wait(requests)
            del piece, requests, send  # sent and computed: its memory goes before the next piece arrives
        held = received
        if ring.timings is not None:
            ring.timings.steps += 1
            ring.timings.skipped += int(not computed)
    return out, lse


def _ring_backward(
    ring: _Ring, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    dq = torch.zeros_like(q)
    k_cur, v_cur = k.contiguous(), v.contiguous()
    grad_requests: list[dist.Work] = []
    dk_recv, dv_recv = k.new_empty(0), v.new_empty(0)  # accumulators arriving from the previous rank
    for step in range(ring.world):
        src = ring.source(step)
        kv_requests: list[dist.Work] = []
        if step + 1 < ring.world:
            length = ring.lengths[ring.source(step + 1)]
            k_next, v_next = _empty_like_shard(k_cur, length), _empty_like_shard(v_cur, length)
            kv_requests = ring.exchange([k_cur, v_cur], [k_next, v_next], _TAG_KV)
        start = time.perf_counter()
        dk_acc, dv_acc = torch.zeros_like(k_cur), torch.zeros_like(v_cur)
        for r0, r1, plan in ring.plans(q, k_cur, v_cur, ring.positions[src]):
            dq_part, dk_part, dv_part, _ = plan_backward(
                plan, dout[:, :, r0:r1], q[:, :, r0:r1], k_cur, v_cur, None, out[:, :, r0:r1], lse[:, :, r0:r1], False
            )
            dq[:, :, r0:r1] += dq_part
            dk_acc += dk_part
            dv_acc += dv_part
        ring.timed(start)
        if step > 0:  # add what the previous ranks accumulated for this shard
            ring.wait(grad_requests)
            dk_acc += dk_recv
            dv_acc += dv_recv
        if ring.world > 1:  # pass the accumulators on; the next shard's arrive from behind
            length = ring.lengths[(src - 1) % ring.world]
            dk_recv, dv_recv = _empty_like_shard(k_cur, length), _empty_like_shard(v_cur, length)
            grad_requests = ring.exchange([dk_acc, dv_acc], [dk_recv, dv_recv], _TAG_GRAD)
        if kv_requests:
            ring.wait(kv_requests)
            k_cur, v_cur = k_next, v_next
    if ring.world == 1:
        return dq, dk_acc, dv_acc
    ring.wait(grad_requests)  # this rank's own shard, home after a full turn
    return dq, dk_recv, dv_recv


def ring_kernel(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    mask: masks_mod.Mask | None = None,
    bias: Tensor | None = None,
    **options,
) -> Tensor:
    """:func:`ring_attention` as the ``"ring"`` kernel of
    :func:`attnkit.functional.get_kernel`, for a ``MultiHeadAttention`` built with
    ``AttentionConfig(..., kernel="ring")``: the module's input ``x`` is this rank's shard
    ``[b, s_local, e]``; pass the shard's absolute positions
    (:func:`attnkit.distributed.shard_positions`) as ``positions`` when the module has a
    rotary encoding.

    Raises:
        ValueError: a score bias (ALiBi, relative positions), which would be built for the
            shard's length, not the sequence's.
    """
    if bias is not None:
        raise ValueError(
            "ring attention takes no score bias (ALiBi, relative-position bias); use a rotary encoding or none"
        )
    out = ring_attention(q, k, v, causal=causal, mask=mask, **options)
    assert isinstance(out, Tensor), "the ring kernel's options must not ask for return_lse"
    return out
