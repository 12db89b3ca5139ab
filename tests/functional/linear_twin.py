"""The Triton kernels of ``attnkit.functional.linear_triton`` written again in PyTorch, step for
step: the same segments, the same chunks walked in the same order, the same running states and
the same formulas. Passed as ``backend=`` to ``fused_causal``, it checks the fused algorithm
(and its hand-written backward pass) against the float64 definition on any machine; the
kernels themselves are checked through Triton's interpreter.

Every function loops over the chunks of a segment, all segments and heads at once:
tensors ``[b, heads, n_seg, n_chunks, C, ...]`` after padding the sequence to whole segments.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _segments(x: Tensor, seg_len: int, chunk: int) -> Tensor:
    """``[b, n, s, f]`` → ``[b, n, n_seg, seg_len // chunk, chunk, f]``, zero-padded."""
    b, n, s, f = x.shape
    n_seg = -(-s // seg_len)
    x = F.pad(x, (0, 0, 0, n_seg * seg_len - s))
    return x.view(b, n, n_seg, seg_len // chunk, chunk, f)


def _group(x: Tensor, g: int) -> Tensor:
    """Key/value heads repeated for their query heads: ``[b, h_kv, ...]`` → ``[b, h, ...]``."""
    return x.repeat_interleave(g, 1)


def _unsegment(x: Tensor, s: int) -> Tensor:
    b, n, n_seg, n_c, c, f = x.shape
    return x.reshape(b, n, n_seg * n_c * c, f)[:, :, :s]


def _accumulator(dtype: torch.dtype) -> torch.dtype:
    """float32 like the kernels, float64 to check the algorithm exactly."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def segment_sums(fk: Tensor, v: Tensor, seg_len: int, chunk: int) -> tuple[Tensor, Tensor]:
    ct = _accumulator(fk.dtype)
    fk_c, v_c = _segments(fk, seg_len, chunk).to(ct), _segments(v, seg_len, chunk).to(ct)
    acc = fk.new_zeros(*fk_c.shape[:3], fk.shape[-1], v.shape[-1], dtype=ct)
    z = fk.new_zeros(*fk_c.shape[:3], fk.shape[-1], dtype=ct)
    for i in range(fk_c.shape[3]):
        acc = acc + fk_c[:, :, :, i].transpose(-1, -2) @ v_c[:, :, :, i]
        z = z + fk_c[:, :, :, i].sum(-2)
    return acc, z


def _normaliser(den: Tensor, eps: float | None, eps_rows: Tensor | None) -> Tensor:
    if eps_rows is not None:
        return den + eps_rows
    if eps is not None:
        return den + eps
    return torch.where(den > 0, den, torch.ones_like(den))


def forward(fq, fk, v, kv_before, z_before, eps, eps_rows, seg_len, chunk, out_dtype):
    b, h, s, m = fq.shape
    g = h // fk.shape[1]
    ct = _accumulator(fq.dtype)
    fq_c = _segments(fq, seg_len, chunk)
    fk_c, v_c = _group(_segments(fk, seg_len, chunk), g), _group(_segments(v, seg_len, chunk), g).to(fq.dtype)
    rows = None if eps_rows is None else _segments(eps_rows.unsqueeze(-1), seg_len, chunk)[..., 0]
    kv, z = _group(kv_before, g).to(ct), _group(z_before, g).to(ct)  # [b, h, n_seg, m, d_v], [.., m]
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=fq.device).tril()
    outs, dens = [], []
    for i in range(fq_c.shape[3]):
        q_i, k_i, v_i = fq_c[:, :, :, i], fk_c[:, :, :, i], v_c[:, :, :, i]
        scores = (q_i @ k_i.transpose(-1, -2)).to(ct).masked_fill(~causal, 0)  # [b, h, n_seg, C, C]
        num = (scores @ v_i.to(ct)) + q_i.to(ct) @ kv
        den = scores.sum(-1) + (q_i.to(ct) * z.unsqueeze(-2)).sum(-1)
        den = _normaliser(den, eps, None if rows is None else rows[:, :, :, i].to(ct))
        outs.append(num / den.unsqueeze(-1))
        dens.append(den)
        kv = kv + k_i.transpose(-1, -2).to(ct) @ v_i.to(ct)
        z = z + k_i.to(ct).sum(-2)
    out = _unsegment(torch.stack(outs, 3), s).to(out_dtype)
    den = _unsegment(torch.stack(dens, 3).unsqueeze(-1), s)[..., 0]
    return out, den


def _dnum_dden(do: Tensor, o: Tensor, den: Tensor) -> tuple[Tensor, Tensor]:
    return do / den.unsqueeze(-1), -(do * o).sum(-1) / den


def backward_sums(fq, dout, out, den, seg_len, chunk):
    ct = den.dtype
    fq_c = _segments(fq, seg_len, chunk).to(ct)
    do_c, o_c = _segments(dout, seg_len, chunk).to(ct), _segments(out, seg_len, chunk).to(ct)
    den_c = _segments(den.unsqueeze(-1), seg_len, chunk)[..., 0]
    den_c = torch.where(den_c == 0, torch.ones_like(den_c), den_c)  # padding
    acc = fq.new_zeros(*fq_c.shape[:3], fq.shape[-1], dout.shape[-1], dtype=ct)
    z = fq.new_zeros(*fq_c.shape[:3], fq.shape[-1], dtype=ct)
    for i in range(fq_c.shape[3]):
        dnum, dden = _dnum_dden(do_c[:, :, :, i], o_c[:, :, :, i], den_c[:, :, :, i])
        acc = acc + fq_c[:, :, :, i].transpose(-1, -2) @ dnum
        z = z + (fq_c[:, :, :, i] * dden.unsqueeze(-1)).sum(-2)
    return acc, z


def backward(fq, fk, v, dout, out, den, kv_before, z_before, dkv_after, dz_after, seg_len, chunk, grad_dtype):
    b, h, s, m = fq.shape
    g = h // fk.shape[1]
    ct = den.dtype
    fq_c = _segments(fq, seg_len, chunk).to(ct)
    fk_c, v_c = _group(_segments(fk, seg_len, chunk), g).to(ct), _group(_segments(v, seg_len, chunk), g).to(ct)
    do_c, o_c = _segments(dout, seg_len, chunk).to(ct), _segments(out, seg_len, chunk).to(ct)
    den_c = _segments(den.unsqueeze(-1), seg_len, chunk)[..., 0]
    den_c = torch.where(den_c == 0, torch.ones_like(den_c), den_c)  # padding
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=fq.device).tril()
    n_c = fq_c.shape[3]

    kv, z = _group(kv_before, g).to(ct), _group(z_before, g).to(ct)
    dfqs = []
    for i in range(n_c):
        q_i, k_i, v_i = fq_c[:, :, :, i], fk_c[:, :, :, i], v_c[:, :, :, i]
        dnum, dden = _dnum_dden(do_c[:, :, :, i], o_c[:, :, :, i], den_c[:, :, :, i])
        dscores = (dnum @ v_i.transpose(-1, -2) + dden.unsqueeze(-1)).masked_fill(~causal, 0)
        dfqs.append(dscores @ k_i + dnum @ kv.transpose(-1, -2) + dden.unsqueeze(-1) * z.unsqueeze(-2))
        kv = kv + k_i.transpose(-1, -2) @ v_i
        z = z + k_i.sum(-2)

    dkv, dz = dkv_after.to(ct), dz_after.to(ct)
    dfks, dvs = [None] * n_c, [None] * n_c
    for i in reversed(range(n_c)):
        q_i, k_i, v_i = fq_c[:, :, :, i], fk_c[:, :, :, i], v_c[:, :, :, i]
        dnum, dden = _dnum_dden(do_c[:, :, :, i], o_c[:, :, :, i], den_c[:, :, :, i])
        scores = (q_i @ k_i.transpose(-1, -2)).masked_fill(~causal, 0)
        dscores = (dnum @ v_i.transpose(-1, -2) + dden.unsqueeze(-1)).masked_fill(~causal, 0)
        dfks[i] = dscores.transpose(-1, -2) @ q_i + v_i @ dkv.transpose(-1, -2) + dz.unsqueeze(-2)
        dvs[i] = scores.transpose(-1, -2) @ dnum + k_i @ dkv
        dkv = dkv + q_i.transpose(-1, -2) @ dnum
        dz = dz + (q_i * dden.unsqueeze(-1)).sum(-2)

    def whole(parts):
        return _unsegment(torch.stack(parts, 3), s).to(grad_dtype)

    return whole(dfqs), whole(dfks), whole(dvs)
