"""Triton kernels of the fused causal linear attention (:mod:`attnkit.functional.linear_fused`).

Four kernels, each a grid of ``(segment, head)`` programs that walk their segment's chunks in
order with the running state in registers (fp32), every product a ``tl.dot`` with fp32
accumulation:

- :func:`segment_sums`: ``Σ φ(k)ᵀ v`` and ``Σ φ(k)`` over each segment (per key/value head);
- :func:`forward`: each chunk's output ``(scores ∘ causal) v + φ(q) state`` divided by its
  normaliser (``+ eps``, or exact), and the normaliser, kept for the backward pass;
- :func:`backward_sums`: ``Σ φ(q)ᵀ dnum`` and ``Σ φ(q) dden`` over each segment (per query
  head), the reverse-direction state of the backward pass;
- :func:`backward`: ``dφ(q)`` walking forward, ``dφ(k)`` and ``dv`` walking backward, per
  query head (the caller sums the query heads of a group).

Triton is imported here only: this module is loaded when the ``"triton"`` engine runs.
Under Triton's interpreter (``TRITON_INTERPRET=1`` set before this module is imported) the
same kernels run on CPU tensors, slowly.

Layouts: ``fq [b·h, s, m]``, ``fk [b·h_kv, s, m]``, ``v [b·h_kv, s, d_v]``, contiguous;
segment states ``[b·h(_kv), n_seg, m, d_v]`` and ``[b·h(_kv), n_seg, m]`` in fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

# Normaliser modes of the forward kernel.
EXACT, EPS_SCALAR, EPS_ROWS = 0, 1, 2


def _pad(n: int) -> int:
    """Block size of a dimension: a power of two, at least 16 (the smallest ``tl.dot``)."""
    return max(16, triton.next_power_of_2(n))


def launch_options(dtype: torch.dtype) -> dict[str, int]:
    """Warps per program and loads in flight per loop (``num_warps``, ``num_stages``) of every
    kernel: two stages for float32 tiles (twice the bytes; three stages of them overflow
    shared memory in the backward kernel), Triton's three otherwise; Triton's four warps.
    ``benchmarks/tune_linear_kernel.py`` measures the alternatives on a GPU."""
    return {"num_warps": 4, "num_stages": 2 if dtype == torch.float32 else 3}


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 products as three TF32 products each (``tf32x3``, close to fp32 accuracy on tensor
    cores: Triton's exact ``ieee`` products compile to kilobytes of stack per thread), or one
    where PyTorch itself allows TF32 for matmuls; other dtypes: Triton's default, which does
    not apply to them."""
    return "tf32x3" if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32 else "tf32"


# Lengths and head counts change from call to call: compiled once for all of them (Triton
# would otherwise compile again for each of their divisibilities by 16).
_RUNTIME = ("s", "seg_len", "n_seg", "h", "g")


@triton.jit(do_not_specialize=_RUNTIME[:3])
def _segment_sums_kernel(
    FK, V, S, Z, s, seg_len, m, d_v, n_seg, C: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr
):
    seg = tl.program_id(0)
    bh = tl.program_id(1)
    rows = tl.arange(0, C)
    fm = tl.arange(0, BM)
    fd = tl.arange(0, BD)
    in_m = fm < m
    in_d = fd < d_v
    acc = tl.zeros((BM, BD), dtype=tl.float32)
    z = tl.zeros((BM,), dtype=tl.float32)
    k_base = FK + bh.to(tl.int64) * s * m
    v_base = V + bh.to(tl.int64) * s * d_v
    for i in range(0, seg_len // C):
        t = seg * seg_len + i * C + rows
        in_t = t < s
        fk = tl.load(k_base + t[:, None] * m + fm[None, :], mask=in_t[:, None] & in_m[None, :], other=0.0)
        vv = tl.load(v_base + t[:, None] * d_v + fd[None, :], mask=in_t[:, None] & in_d[None, :], other=0.0)
        acc += tl.dot(tl.trans(fk), vv.to(fk.dtype), input_precision=PREC)
        z += tl.sum(fk.to(tl.float32), 0)
    at = bh.to(tl.int64) * n_seg + seg
    tl.store(S + at * m * d_v + fm[:, None] * d_v + fd[None, :], acc, mask=in_m[:, None] & in_d[None, :])
    tl.store(Z + at * m + fm, z, mask=in_m)


@triton.jit(do_not_specialize=_RUNTIME)
def _forward_kernel(
    FQ,
    FK,
    V,
    KVB,
    ZB,
    EPS,
    OUT,
    DEN,
    eps,
    s,
    seg_len,
    m,
    d_v,
    n_seg,
    h,
    g,
    EPS_MODE: tl.constexpr,
    C: tl.constexpr,
    BM: tl.constexpr,
    BD: tl.constexpr,
    PREC: tl.constexpr,
):
    seg = tl.program_id(0)
    bh = tl.program_id(1)
    bkv = (bh // h) * (h // g) + (bh % h) // g  # the key/value head of query head bh
    rows = tl.arange(0, C)
    fm = tl.arange(0, BM)
    fd = tl.arange(0, BD)
    in_m = fm < m
    in_d = fd < d_v
    causal = rows[:, None] >= rows[None, :]
    at = bkv.to(tl.int64) * n_seg + seg
    kv = tl.load(KVB + at * m * d_v + fm[:, None] * d_v + fd[None, :], mask=in_m[:, None] & in_d[None, :], other=0.0)
    z = tl.load(ZB + at * m + fm, mask=in_m, other=0.0)
    q_base = FQ + bh.to(tl.int64) * s * m
    k_base = FK + bkv.to(tl.int64) * s * m
    v_base = V + bkv.to(tl.int64) * s * d_v
    o_base = OUT + bh.to(tl.int64) * s * d_v
    r_base = bh.to(tl.int64) * s
    for i in range(0, seg_len // C):
        t = seg * seg_len + i * C + rows
        in_t = t < s
        fq = tl.load(q_base + t[:, None] * m + fm[None, :], mask=in_t[:, None] & in_m[None, :], other=0.0)
        fk = tl.load(k_base + t[:, None] * m + fm[None, :], mask=in_t[:, None] & in_m[None, :], other=0.0)
        vv = tl.load(v_base + t[:, None] * d_v + fd[None, :], mask=in_t[:, None] & in_d[None, :], other=0.0)
        vv = vv.to(fq.dtype)
        scores = tl.where(causal, tl.dot(fq, tl.trans(fk), input_precision=PREC), 0.0)  # [C, C]
        num = tl.dot(scores.to(fq.dtype), vv, input_precision=PREC)
        num += tl.dot(fq, kv.to(fq.dtype), input_precision=PREC)  # [C, d_v]
        den = tl.sum(scores, 1) + tl.sum(fq.to(tl.float32) * z[None, :], 1)  # [C]
        if EPS_MODE == 0:
            den = tl.where(den > 0, den, 1.0)  # no key seen: zero numerator, zero output
        elif EPS_MODE == 1:
            den = den + eps
        else:
            den = den + tl.load(EPS + r_base + t, mask=in_t, other=1.0)
        tl.store(o_base + t[:, None] * d_v + fd[None, :], num / den[:, None], mask=in_t[:, None] & in_d[None, :])
        tl.store(DEN + r_base + t, den, mask=in_t)
        kv += tl.dot(tl.trans(fk), vv, input_precision=PREC)
        z += tl.sum(fk.to(tl.float32), 0)


@triton.jit(do_not_specialize=_RUNTIME[:3])
def _backward_sums_kernel(
    FQ,
    DO,
    OUT,
    DEN,
    R,
    RZ,
    s,
    seg_len,
    m,
    d_v,
    n_seg,
    C: tl.constexpr,
    BM: tl.constexpr,
    BD: tl.constexpr,
    PREC: tl.constexpr,
):
    seg = tl.program_id(0)
    bh = tl.program_id(1)
    rows = tl.arange(0, C)
    fm = tl.arange(0, BM)
    fd = tl.arange(0, BD)
    in_m = fm < m
    in_d = fd < d_v
    acc = tl.zeros((BM, BD), dtype=tl.float32)
    rz = tl.zeros((BM,), dtype=tl.float32)
    q_base = FQ + bh.to(tl.int64) * s * m
    o_base = bh.to(tl.int64) * s * d_v
    r_base = bh.to(tl.int64) * s
    for i in range(0, seg_len // C):
        t = seg * seg_len + i * C + rows
        in_t = t < s
        in_td = in_t[:, None] & in_d[None, :]
        fq = tl.load(q_base + t[:, None] * m + fm[None, :], mask=in_t[:, None] & in_m[None, :], other=0.0)
        do = tl.load(DO + o_base + t[:, None] * d_v + fd[None, :], mask=in_td, other=0.0).to(tl.float32)
        o = tl.load(OUT + o_base + t[:, None] * d_v + fd[None, :], mask=in_td, other=0.0).to(tl.float32)
        den = tl.load(DEN + r_base + t, mask=in_t, other=1.0)
        dnum = do / den[:, None]
        dden = -tl.sum(do * o, 1) / den
        acc += tl.dot(tl.trans(fq), dnum.to(fq.dtype), input_precision=PREC)
        rz += tl.sum(fq.to(tl.float32) * dden[:, None], 0)
    at = bh.to(tl.int64) * n_seg + seg
    tl.store(R + at * m * d_v + fm[:, None] * d_v + fd[None, :], acc, mask=in_m[:, None] & in_d[None, :])
    tl.store(RZ + at * m + fm, rz, mask=in_m)


# Longer than 60 lines on purpose: one Triton program whose two walks (forward for dφ(q),
# backward for dφ(k) and dv) share the offsets, masks and bases set up once at its start;
# jit helpers would each take a dozen of them, and the walks read best side by side.
@triton.jit(do_not_specialize=_RUNTIME)
def _backward_kernel(
    FQ,
    FK,
    V,
    DO,
    OUT,
    DEN,
    KVB,
    ZB,
    DKVA,
    DZA,
    DFQ,
    DFK,
    DV,
    s,
    seg_len,
    m,
    d_v,
    n_seg,
    h,
    g,
    C: tl.constexpr,
    BM: tl.constexpr,
    BD: tl.constexpr,
    PREC: tl.constexpr,
):
    seg = tl.program_id(0)
    bh = tl.program_id(1)
    bkv = (bh // h) * (h // g) + (bh % h) // g
    rows = tl.arange(0, C)
    fm = tl.arange(0, BM)
    fd = tl.arange(0, BD)
    in_m = fm < m
    in_d = fd < d_v
    in_md = in_m[:, None] & in_d[None, :]
    causal = rows[:, None] >= rows[None, :]
    q_base = FQ + bh.to(tl.int64) * s * m
    k_base = FK + bkv.to(tl.int64) * s * m
    v_base = V + bkv.to(tl.int64) * s * d_v
    o_base = bh.to(tl.int64) * s * d_v
    r_base = bh.to(tl.int64) * s
    n_chunks = seg_len // C

    # Forward walk: dφ(q) needs the state of the keys before each chunk.
    at = bkv.to(tl.int64) * n_seg + seg
    kv = tl.load(KVB + at * m * d_v + fm[:, None] * d_v + fd[None, :], mask=in_md, other=0.0)
    z = tl.load(ZB + at * m + fm, mask=in_m, other=0.0)
    for i in range(0, n_chunks):
        t = seg * seg_len + i * C + rows
        in_t = t < s
        in_tm = in_t[:, None] & in_m[None, :]
        in_td = in_t[:, None] & in_d[None, :]
        fk = tl.load(k_base + t[:, None] * m + fm[None, :], mask=in_tm, other=0.0)
        vv = tl.load(v_base + t[:, None] * d_v + fd[None, :], mask=in_td, other=0.0).to(fk.dtype)
        do = tl.load(DO + o_base + t[:, None] * d_v + fd[None, :], mask=in_td, other=0.0).to(tl.float32)
        o = tl.load(OUT + o_base + t[:, None] * d_v + fd[None, :], mask=in_td, other=0.0).to(tl.float32)
        den = tl.load(DEN + r_base + t, mask=in_t, other=1.0)
        dnum = (do / den[:, None]).to(fk.dtype)
        dden = -tl.sum(do * o, 1) / den
        dscores = tl.dot(dnum, tl.trans(vv), input_precision=PREC) + dden[:, None]
        dscores = tl.where(causal, dscores, 0.0)  # [C, C]
        dfq = tl.dot(dscores.to(fk.dtype), fk, input_precision=PREC)
        dfq += tl.dot(dnum, tl.trans(kv.to(fk.dtype)), input_precision=PREC)
        dfq += dden[:, None] * z[None, :]  # [C, m]
        tl.store(DFQ + r_base * m + t[:, None] * m + fm[None, :], dfq, mask=in_tm)
        kv += tl.dot(tl.trans(fk), vv, input_precision=PREC)
        z += tl.sum(fk.to(tl.float32), 0)

    # Backward walk: dφ(k) and dv need what the queries after each chunk asked of it.
    at = bh.to(tl.int64) * n_seg + seg
    dkv = tl.load(DKVA + at * m * d_v + fm[:, None] * d_v + fd[None, :], mask=in_md, other=0.0)
    dz = tl.load(DZA + at * m + fm, mask=in_m, other=0.0)
    for i in range(0, n_chunks):
        t = seg * seg_len + (n_chunks - 1 - i) * C + rows
        in_t = t < s
        in_tm = in_t[:, None] & in_m[None, :]
        in_td = in_t[:, None] & in_d[None, :]
        fq = tl.load(q_base + t[:, None] * m + fm[None, :], mask=in_tm, other=0.0)
        fk = tl.load(k_base + t[:, None] * m + fm[None, :], mask=in_tm, other=0.0)
        vv = tl.load(v_base + t[:, None] * d_v + fd[None, :], mask=in_td, other=0.0).to(fq.dtype)
        do = tl.load(DO + o_base + t[:, None] * d_v + fd[None, :], mask=in_td, other=0.0).to(tl.float32)
        o = tl.load(OUT + o_base + t[:, None] * d_v + fd[None, :], mask=in_td, other=0.0).to(tl.float32)
        den = tl.load(DEN + r_base + t, mask=in_t, other=1.0)
        dnum = (do / den[:, None]).to(fq.dtype)
        dden = -tl.sum(do * o, 1) / den
        scores = tl.where(causal, tl.dot(fq, tl.trans(fk), input_precision=PREC), 0.0)
        dscores = tl.where(causal, tl.dot(dnum, tl.trans(vv), input_precision=PREC) + dden[:, None], 0.0)
        dfk = tl.dot(tl.trans(dscores.to(fq.dtype)), fq, input_precision=PREC)
        dfk += tl.dot(vv, tl.trans(dkv.to(fq.dtype)), input_precision=PREC)
        dfk += dz[None, :]  # [C, m]
        dv = tl.dot(tl.trans(scores.to(fq.dtype)), dnum, input_precision=PREC)
        dv += tl.dot(fk, dkv.to(fq.dtype), input_precision=PREC)  # [C, d_v]
        tl.store(DFK + r_base * m + t[:, None] * m + fm[None, :], dfk, mask=in_tm)
        tl.store(DV + o_base + t[:, None] * d_v + fd[None, :], dv, mask=in_td)
        dkv += tl.dot(tl.trans(fq), dnum, input_precision=PREC)
        dz += tl.sum(fq.to(tl.float32) * dden[:, None], 0)


def segment_sums(fk: Tensor, v: Tensor, seg_len: int, chunk: int) -> tuple[Tensor, Tensor]:
    """``(Σ φ(k)ᵀ v, Σ φ(k))`` per segment: ``[b, h_kv, n_seg, m, d_v]``, ``[b, h_kv, n_seg, m]``."""
    b, h_kv, s, m = fk.shape
    d_v = v.shape[-1]
    n_seg = -(-s // seg_len)
    sums = fk.new_empty(b, h_kv, n_seg, m, d_v, dtype=torch.float32)
    z = fk.new_empty(b, h_kv, n_seg, m, dtype=torch.float32)
    _segment_sums_kernel[(n_seg, b * h_kv)](
        fk,
        v,
        sums,
        z,
        s,
        seg_len,
        m,
        d_v,
        n_seg,
        C=chunk,
        BM=_pad(m),
        BD=_pad(d_v),
        PREC=dot_precision(fk.dtype),
        **launch_options(fk.dtype),
    )
    return sums, z


def forward(
    fq: Tensor,
    fk: Tensor,
    v: Tensor,
    kv_before: Tensor,
    z_before: Tensor,
    eps: float | None,
    eps_rows: Tensor | None,
    seg_len: int,
    chunk: int,
    out_dtype: torch.dtype,
) -> tuple[Tensor, Tensor]:
    """The output ``[b, h, s, d_v]`` (in ``out_dtype``) and its normaliser ``[b, h, s]`` (fp32),
    from the state before each segment."""
    b, h, s, m = fq.shape
    h_kv, d_v = fk.shape[1], v.shape[-1]
    n_seg = kv_before.shape[2]
    out = fq.new_empty(b, h, s, d_v, dtype=out_dtype)
    den = fq.new_empty(b, h, s, dtype=torch.float32)
    mode = EXACT if eps is None and eps_rows is None else EPS_SCALAR if eps_rows is None else EPS_ROWS
    _forward_kernel[(n_seg, b * h)](
        fq,
        fk,
        v,
        kv_before,
        z_before,
        den if eps_rows is None else eps_rows,
        out,
        den,
        0.0 if eps is None else float(eps),
        s,
        seg_len,
        m,
        d_v,
        n_seg,
        h,
        h // h_kv,
        EPS_MODE=mode,
        C=chunk,
        BM=_pad(m),
        BD=_pad(d_v),
        PREC=dot_precision(fq.dtype),
        **launch_options(fq.dtype),
    )
    return out, den


def backward_sums(
    fq: Tensor, dout: Tensor, out: Tensor, den: Tensor, seg_len: int, chunk: int
) -> tuple[Tensor, Tensor]:
    """``(Σ φ(q)ᵀ dnum, Σ φ(q) dden)`` per segment and query head: ``[b, h, n_seg, m, d_v]``,
    ``[b, h, n_seg, m]``."""
    b, h, s, m = fq.shape
    d_v = out.shape[-1]
    n_seg = -(-s // seg_len)
    sums = fq.new_empty(b, h, n_seg, m, d_v, dtype=torch.float32)
    z = fq.new_empty(b, h, n_seg, m, dtype=torch.float32)
    _backward_sums_kernel[(n_seg, b * h)](
        fq,
        dout,
        out,
        den,
        sums,
        z,
        s,
        seg_len,
        m,
        d_v,
        n_seg,
        C=chunk,
        BM=_pad(m),
        BD=_pad(d_v),
        PREC=dot_precision(fq.dtype),
        **launch_options(fq.dtype),
    )
    return sums, z


def backward(
    fq: Tensor,
    fk: Tensor,
    v: Tensor,
    dout: Tensor,
    out: Tensor,
    den: Tensor,
    kv_before: Tensor,
    z_before: Tensor,
    dkv_after: Tensor,
    dz_after: Tensor,
    seg_len: int,
    chunk: int,
    grad_dtype: torch.dtype,
) -> tuple[Tensor, Tensor, Tensor]:
    """``dφ(q) [b, h, s, m]`` and, per query head, ``dφ(k) [b, h, s, m]`` and ``dv [b, h, s, d_v]``
    (in ``grad_dtype``)."""
    b, h, s, m = fq.shape
    h_kv, d_v = fk.shape[1], v.shape[-1]
    n_seg = kv_before.shape[2]
    dfq = fq.new_empty(b, h, s, m, dtype=grad_dtype)
    dfk = fq.new_empty(b, h, s, m, dtype=grad_dtype)
    dv = fq.new_empty(b, h, s, d_v, dtype=grad_dtype)
    _backward_kernel[(n_seg, b * h)](
        fq,
        fk,
        v,
        dout,
        out,
        den,
        kv_before,
        z_before,
        dkv_after,
        dz_after,
        dfq,
        dfk,
        dv,
        s,
        seg_len,
        m,
        d_v,
        n_seg,
        h,
        h // h_kv,
        C=chunk,
        BM=_pad(m),
        BD=_pad(d_v),
        PREC=dot_precision(fq.dtype),
        **launch_options(fq.dtype),
    )
    return dfq, dfk, dv
