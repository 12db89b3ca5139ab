"""Fused causal linear attention: the chunked algorithm as a few kernels per pass, forward and
backward, whatever the length (the ``"triton"`` engine of
:func:`attnkit.functional.linear_attention`).

On feature maps already applied, ``fq = φ(q) [b, h, s, m]``, ``fk = φ(k) [b, h_kv, s, m]``
and ``v [b, h_kv, s, d_v]`` with queries and keys aligned (query ``i`` sees keys ``<= i``)
and a starting state ``(kv₀ [b, h_kv, m, d_v], z₀ [b, h_kv, m])`` of earlier keys::

    num_i = Σ_{j<=i} (fq_i·fk_j) v_j + fq_i kv₀      den_i = Σ_{j<=i} fq_i·fk_j + fq_i·z₀
    out_i = num_i / den_i   (den_i + eps_i with eps; a zero output where den_i = 0 without)

The sequence is cut into chunks of ``chunk`` tokens, and the chunks into segments of
``seg_len`` tokens. Forward:

1. one kernel sums ``φ(k)ᵀ v`` and ``φ(k)`` over each segment, all segments in parallel;
2. an exclusive prefix sum over the segments (a few small PyTorch operations) gives the
   state before each segment, and the final state;
3. one kernel per segment and query head walks its chunks in order: inside a chunk the
   masked ``[chunk, chunk]`` scores, across chunks the running state in registers; it writes
   the output and the normaliser ``den``.

Backward, with ``dnum_i = dout_i / den_i`` and ``dden_i = −(dout_i·out_i) / den_i``::

    dfq_i = Σ_{j<=i} (dnum_i·v_j + dden_i) fk_j + kv_before dnum_i + dden_i z_before
    dfk_j = Σ_{i>=j} (dnum_i·v_j + dden_i) fq_i + dkv_after v_j + dz_after
    dv_j  = Σ_{i>=j} (fq_i·fk_j) dnum_i + dkv_afterᵀ fk_j

where ``dkv_after = Σ_{later i} fq_i dnum_iᵀ (+ the final state's gradient)``: one kernel sums
it per segment, a suffix sum over segments gives it before each segment, one kernel walks
each segment forward (``dfq``) then backward (``dfk``, ``dv``). Grouped query heads share
their key/value head's forward state; ``dfk`` and ``dv`` are written per query head and
summed over the group.

The kernels come from a *backend*, four functions with the signatures of
:mod:`attnkit.functional.linear_triton` (the default, imported on first use). Shape letters
as everywhere: ``n_seg`` segments.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch
from torch import Tensor

# Programs to keep a GPU busy: segments are cut so that segments × heads reach about this.
TARGET_PROGRAMS = 1024


def fused_chunk_size(dtype: torch.dtype) -> int:
    """Tokens per chunk unless the caller says otherwise: 64 for half-precision inputs
    (``[64, 64]`` bfloat16 tiles on tensor cores), 32 for float32, whose exact products run
    without tensor cores and would need most of a GPU's shared memory with tiles of 64."""
    return 64 if dtype in (torch.float16, torch.bfloat16) else 32


def segment_length(s: int, heads: int, chunk: int) -> int:
    """Tokens per segment: whole chunks, as long as ``segments × heads`` stays near
    :data:`TARGET_PROGRAMS` (longer segments, less state traffic; shorter, more parallel)."""
    chunks = max(1, -(-s // chunk))
    per_segment = max(1, (chunks * heads) // TARGET_PROGRAMS)
    return chunk * min(per_segment, chunks)


def fused_causal(
    fq: Tensor,
    fk: Tensor,
    v: Tensor,
    kv0: Tensor,
    z0: Tensor,
    *,
    eps: float | None,
    eps_rows: Tensor | None,
    chunk: int,
    out_dtype: torch.dtype,
    seg_len: int | None = None,
    backend: Any = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Causal linear attention on features, differentiable in every tensor input.

    Args:
        fq: ``[b, h, s, m]``; fk: ``[b, h_kv, s, m]``; v: ``[b, h_kv, s, d_v]``, one dtype.
        kv0: ``[b, h_kv, m, d_v]`` and z0: ``[b, h_kv, m]``, float32: the starting state.
        eps: added to every normaliser, or ``None`` (the exact ratio); eps_rows: ``[b, h, s]``
            float32, one value per query instead (then ``eps`` is ignored).
        chunk: tokens per chunk (a power of two, at least 16, for the Triton kernels).
        out_dtype: dtype of the output.
        seg_len: tokens per segment, a multiple of ``chunk``; default :func:`segment_length`.
        backend: the four kernels; default :mod:`attnkit.functional.linear_triton`.

    Returns:
        ``(out [b, h, s, d_v], kv [b, h_kv, m, d_v], z [b, h_kv, m])``: the output and the
        state after the last key (float32).
    """
    if chunk < 16 or chunk & (chunk - 1):
        raise ValueError(f"the fused kernels take chunk_size a power of two >= 16, got {chunk}")
    s = fq.shape[2]
    if seg_len is None:
        seg_len = segment_length(s, fq.shape[0] * fq.shape[1], chunk)
    if seg_len < 1 or seg_len % chunk:
        raise ValueError(f"seg_len must be a positive multiple of chunk={chunk}, got {seg_len}")
    if backend is None:
        from attnkit.functional import linear_triton as backend
    return _FusedCausal.apply(
        fq.contiguous(),
        fk.contiguous(),
        v.contiguous(),
        kv0.contiguous(),
        z0.contiguous(),
        eps,
        None if eps_rows is None else eps_rows.contiguous(),
        chunk,
        seg_len,
        out_dtype,
        backend,
    )


def _exclusive_prefix(sums: Tensor, start: Tensor) -> tuple[Tensor, Tensor]:
    """State before each segment (``start`` plus the earlier segments' sums, along dim 2) and
    after the last."""
    before = torch.cat([torch.zeros_like(sums[:, :, :1]), sums[:, :, :-1]], 2).cumsum(2)
    before = before + start.unsqueeze(2)
    return before, before[:, :, -1] + sums[:, :, -1]


def _exclusive_suffix(sums: Tensor, end: Tensor) -> tuple[Tensor, Tensor]:
    """What comes after each segment (the later segments' sums plus ``end``, along dim 2)
    and the total."""
    after, total = _exclusive_prefix(sums.flip(2), end)
    return after.flip(2), total


class _FusedCausal(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        fq: Tensor,
        fk: Tensor,
        v: Tensor,
        kv0: Tensor,
        z0: Tensor,
        eps: float | None,
        eps_rows: Tensor | None,
        chunk: int,
        seg_len: int,
        out_dtype: torch.dtype,
        backend: ModuleType,
    ) -> tuple[Tensor, Tensor, Tensor]:
        sums, z_sums = backend.segment_sums(fk, v, seg_len, chunk)  # [b, h_kv, n_seg, m, d_v], [.., m]
        kv_before, kv = _exclusive_prefix(sums, kv0.to(sums.dtype))
        z_before, z = _exclusive_prefix(z_sums, z0.to(sums.dtype))
        out, den = backend.forward(fq, fk, v, kv_before, z_before, eps, eps_rows, seg_len, chunk, out_dtype)
        ctx.save_for_backward(fq, fk, v, out, den, kv_before, z_before)
        ctx.chunk, ctx.seg_len, ctx.backend = chunk, seg_len, backend
        ctx.state_dtypes = (kv0.dtype, z0.dtype)
        return out, kv, z

    @staticmethod
    def backward(ctx: Any, dout: Tensor, dkv: Tensor, dz: Tensor) -> tuple[Tensor | None, ...]:
        fq, fk, v, out, den, kv_before, z_before = ctx.saved_tensors
        b, h, s, m = fq.shape
        h_kv, d_v = fk.shape[1], v.shape[-1]
        g = h // h_kv
        dout = dout.contiguous()
        sums, z_sums = ctx.backend.backward_sums(fq, dout, out, den, ctx.seg_len, ctx.chunk)  # per query head
        # The final state's gradient enters once per key/value head: through its first query head.
        seed_kv = sums.new_zeros(b, h_kv, g, m, d_v)
        seed_kv[:, :, 0] = dkv
        seed_z = sums.new_zeros(b, h_kv, g, m)
        seed_z[:, :, 0] = dz
        dkv_after, dkv0 = _exclusive_suffix(sums, seed_kv.view(b, h, m, d_v))
        dz_after, dz0 = _exclusive_suffix(z_sums, seed_z.view(b, h, m))
        # Grouped heads: per-query-head key gradients are summed in float32.
        grad_dtype = fq.dtype if g == 1 else sums.dtype
        dfq, dfk, dv = ctx.backend.backward(
            fq,
            fk,
            v,
            dout,
            out,
            den,
            kv_before,
            z_before,
            dkv_after.contiguous(),
            dz_after.contiguous(),
            ctx.seg_len,
            ctx.chunk,
            grad_dtype,
        )
        if g > 1:
            dfk = dfk.view(b, h_kv, g, s, m).sum(2).to(fk.dtype)
            dv = dv.view(b, h_kv, g, s, d_v).sum(2).to(v.dtype)
        dkv0 = dkv0.view(b, h_kv, g, m, d_v).sum(2).to(ctx.state_dtypes[0])
        dz0 = dz0.view(b, h_kv, g, m).sum(2).to(ctx.state_dtypes[1])
        return dfq, dfk, dv, dkv0, dz0, None, None, None, None, None, None
