"""Linear attention: replace ``softmax(q kᵀ)`` by a kernel ``φ(q) φ(k)ᵀ`` and reorder the
product, ``φ(Q) (φ(K)ᵀ V)``, so time and memory are O(s · m · d_v) instead of O(s²).

For query ``i``::

    out_i = Σ_j φ(q_i)·φ(k_j) v_j  /  Σ_j φ(q_i)·φ(k_j)

over all keys ``j`` (bidirectional) or ``j <= i + s_k - s_q`` (causal, bottom-right as
everywhere in attnkit). Feature maps ``φ``:

- ``"elu"``: ``elu(x) + 1`` (Katharopoulos et al., 2020);
- ``"relu"``: ``relu(x)``;
- ``"favor"``: FAVOR+ positive orthogonal random features (Choromanski et al., 2021),
  ``φ(x) = exp(ω x − |x|²/2) / sqrt(m)`` on ``x · d^(-1/4)``, whose dot products estimate
  ``exp(q·k / sqrt(d))`` — softmax attention, approximately;
- any callable ``[..., d] -> [..., m]`` with non-negative output.

The causal form is computed by chunks, as matrix products only: inside a chunk of
``chunk_size`` tokens the masked ``[C, C]`` products are explicit, across chunks a prefix sum
of the per-chunk states ``φ(K_c)ᵀ V_c`` (and ``Σ φ(K_c)``) carries the past; autograd
differentiates the same products, so the backward pass is matmul-bound too. On CUDA the
causal form runs as fused Triton kernels instead (:mod:`attnkit.functional.linear_fused`):
a few launches per pass, whatever the length, with a hand-written backward pass.
:func:`linear_attention_step` decodes one token at a time with a constant-size
:class:`LinearAttentionState`; ``linear_attention(..., state=, return_state=True)`` starts
from one and returns the state after its keys, so a prompt and the decoding that follows it
continue each other exactly.

Shape letters: ``b`` batch, ``h`` query heads, ``h_kv`` key/value heads (grouped queries
share one state per key/value head), ``s_q``/``s_k`` lengths, ``d`` head dim, ``d_v`` value
dim, ``m`` features, ``C`` chunk size, ``n_c`` chunks.
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.functional._validate import accepts_single_head
from attnkit.functional.linear_fused import fused_causal, fused_chunk_size

FeatureMap = Literal["elu", "relu", "favor"] | Callable[[Tensor], Tensor]
LinearEngine = Literal["auto", "eager", "compiled", "triton"]
_ENGINES = ("auto", "eager", "compiled", "triton")
# dtypes the Triton kernels take (half types are computed with bfloat16 products, fp32 sums).
_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_NAMED = ("elu", "relu", "favor")
# Tokens per segment of the causal scan on the CPU: the chunk-level prefix sums are taken a
# segment at a time, carrying the state across, so temporaries stay bounded (and in cache).
# GPUs take the whole sequence in one segment: fewer, larger kernels.
_CPU_SEGMENT = 8192
_compiled_core: Callable | None = None


def favor_projection(
    d: int,
    num_features: int | None = None,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """FAVOR+ projection ``ω`` ``[m, d]``: blocks of orthogonal rows (QR of a Gaussian),
    rescaled to the norms of Gaussian vectors, deterministic in ``seed``.

    Args:
        d: head dim.
        num_features: ``m``, default ``2 * d``.

    Raises:
        ValueError: ``d`` or ``num_features`` below 1.
    """
    m = 2 * d if num_features is None else num_features
    if d < 1 or m < 1:
        raise ValueError(f"d and num_features must be >= 1, got d={d}, num_features={m}")
    g = torch.Generator().manual_seed(seed)
    blocks = []
    for _ in range(-(-m // d)):
        gauss = torch.randn(d, d, generator=g, dtype=torch.float64)
        q_mat, _ = torch.linalg.qr(gauss)
        blocks.append(q_mat.T)
    omega = torch.cat(blocks)[:m]  # orthonormal rows, [m, d]
    norms = torch.randn(m, d, generator=g, dtype=torch.float64).norm(dim=1, keepdim=True)
    return (omega * norms).to(dtype=dtype, device=device)


def feature_map_fn(
    feature_map: FeatureMap,
    *,
    d: int,
    projection: Tensor | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> tuple[Callable[[Tensor, bool], tuple[Tensor, Tensor | None]], int]:
    """The feature map as ``phi(x, is_query) -> (features, log_shift)`` and its size ``m``.

    ``log_shift`` (FAVOR+ only) is the stabiliser taken out of the exponent: per row for
    queries (it cancels in the ratio), one per ``(b, head)`` for keys (it is common to every
    key, so it cancels too). ``None`` for the other maps.

    Raises:
        TypeError: an unknown name. ValueError: a projection that does not fit ``d``.
    """
    if callable(feature_map) and not isinstance(feature_map, str):
        fn = feature_map
        m = fn(torch.zeros(1, d, dtype=dtype, device=device)).shape[-1]
        return (lambda x, is_query: (fn(x), None)), m
    if feature_map == "elu":
        return (lambda x, is_query: (F.elu(x).add_(1), None)), d
    if feature_map == "relu":
        return (lambda x, is_query: (F.relu(x), None)), d
    if feature_map == "favor":
        omega = favor_projection(d, seed=seed, dtype=dtype, device=device) if projection is None else projection
        if omega.ndim != 2 or omega.shape[1] != d:
            raise ValueError(f"projection must be [num_features, d] = [m, {d}], got {list(omega.shape)}")
        omega = omega.to(dtype=dtype, device=device)
        m = omega.shape[0]

        def favor(x: Tensor, is_query: bool) -> tuple[Tensor, Tensor]:
            x = x * d**-0.25
            logits = x @ omega.T - 0.5 * x.square().sum(-1, keepdim=True)  # [..., s, m]
            if is_query:
                shift = logits.amax(-1, keepdim=True).detach()  # per row
            else:
                shift = (
                    logits.amax(dim=(-2, -1), keepdim=True).detach()
                    if logits.shape[-2]
                    else torch.zeros_like(logits[..., :1, :1])
                )
            return torch.exp(logits - shift) / math.sqrt(m), shift

        return favor, m
    raise TypeError(f'feature_map must be "elu", "relu", "favor" or a callable, got {feature_map!r}')


@accepts_single_head
def linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    feature_map: FeatureMap = "elu",
    causal: bool = False,
    projection: Tensor | None = None,
    seed: int = 0,
    chunk_size: int | None = None,
    eps: float | None = None,
    engine: LinearEngine = "auto",
    state: LinearAttentionState | None = None,
    return_state: bool = False,
) -> Tensor | tuple[Tensor, LinearAttentionState]:
    """Linear attention ``φ(q)(φ(K)ᵀV) / φ(q)·Σφ(K)`` in O(s · m · d_v).

    Every step is a matrix product (or a prefix sum over chunks), forward and backward, so on
    a GPU the causal form runs at the speed of its matmuls. Half-precision inputs
    (float16/bfloat16) are computed in float32 and the output is cast back: sums over long
    sequences neither overflow nor lose their small terms.

    Args:
        q: ``[b, h, s_q, d]`` (or ``[s_q, d]``).
        k: ``[b, h_kv, s_k, d]`` (or ``[s_k, d]``), ``h`` divisible by ``h_kv``.
        v: ``[b, h_kv, s_k, d_v]`` (or ``[s_k, d_v]``).
        feature_map: ``"elu"``, ``"relu"``, ``"favor"`` or a callable ``[..., d] -> [..., m]``.
        causal: query ``i`` sees keys ``<= i + s_k - s_q``.
        projection: FAVOR+ ``ω`` ``[m, d]`` (see :func:`favor_projection`); default: drawn
            from ``seed`` with ``m = 2d``. Pass your own to redraw features during training.
        seed: seed of the default FAVOR+ projection.
        chunk_size: tokens per chunk of the causal scan; default for the ``"triton"`` engine
            (which takes powers of two from 16) 64 in half precision and 32 in float32, else
            :func:`default_chunk_size` (64 on the CPU, 256 on GPUs).
        eps: ``None`` (default): the exact ratio, and a zero output for a query whose
            features meet no key (nothing visible, or all-zero ``relu`` features); a float:
            divide by ``normaliser + eps`` instead (the smoothing of Katharopoulos et al.),
            with ``eps`` in the units of the true normaliser, so the causal form stays causal.
        engine: ``"eager"`` (tensor operations as written), ``"compiled"`` (the same code under
            ``torch.compile``, which fuses the elementwise steps around the matmuls; the first
            call of a shape compiles), ``"triton"`` (the causal form as fused Triton kernels,
            forward and backward: CUDA tensors of float32, float16 or bfloat16, or any
            device under Triton's interpreter, ``TRITON_INTERPRET=1``), or ``"auto"``: triton
            for causal calls on CUDA (when Triton is installed, as it is with CUDA builds of
            PyTorch), compiled for the other GPU calls, eager on the CPU.
        state: keys absorbed before these (a :class:`LinearAttentionState` from
            :func:`linear_attention_state`, :func:`linear_attention_step` or an earlier
            ``return_state=True``): every query also sees them.
        return_state: also return the state after this call's keys, from which
            :func:`linear_attention_step` (or another call with ``state=``) continues.

    Returns:
        ``[b, h, s_q, d_v]`` (or ``[s_q, d_v]``); with ``return_state``, ``(output, state)``.

    Raises:
        TypeError, ValueError: bad tensors (as :func:`attnkit.attention`), an unknown feature
            map, a bad projection, ``chunk_size < 1``, an unknown engine, a state that does
            not fit the keys and values, the ``"triton"`` engine where it cannot run.
        ImportError: the ``"triton"`` engine without Triton installed.
    """
    if engine not in _ENGINES:
        raise ValueError(f"linear_attention runs on the engines {list(_ENGINES)}, got engine={engine!r}")
    d = q.shape[-1]
    phi, m = feature_map_fn(
        feature_map, d=d, projection=projection, seed=seed, dtype=compute_dtype(q.dtype), device=q.device
    )
    if state is not None:
        _check_state(state, k, v, m)
    chosen = _pick_engine(engine, q, causal)
    if chunk_size is None:
        chunk_size = fused_chunk_size(q.dtype) if chosen == "triton" else default_chunk_size(q.device)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an int >= 1, got {chunk_size!r}")
    start = (None, None, None) if state is None else (state.kv, state.z, state.log_shift)
    if chosen == "triton":
        out, kv, z, log_shift = _triton_core(q, k, v, phi, chunk_size, eps, *start)
    else:
        segment = _CPU_SEGMENT if q.device.type == "cpu" else max(q.shape[2], 1)
        core = _compiled_linear_core() if chosen == "compiled" else _linear_core
        out, kv, z, log_shift = core(q, k, v, phi, causal, chunk_size, eps, segment, *start)
    if not return_state:
        return out
    length = k.shape[2] + (0 if state is None else state.length)
    return out, LinearAttentionState(kv, z, log_shift, length)


def _pick_engine(engine: str, q: Tensor, causal: bool) -> str:
    """The engine that runs the call: ``engine`` itself, checked, or what ``"auto"`` picks."""
    if engine == "triton":
        if not causal:
            raise ValueError(
                "engine='triton' computes causal linear attention; bidirectional linear attention is two "
                "matrix products: use engine='eager' (or 'auto')"
            )
        if q.dtype not in _TRITON_DTYPES:
            raise ValueError(f"engine='triton' takes float32, float16 or bfloat16 tensors, got {q.dtype}")
        if q.device.type != "cuda" and not _interpreting():
            raise ValueError(
                f"engine='triton' runs on CUDA tensors (or on any device under Triton's interpreter, "
                f"TRITON_INTERPRET=1), got tensors on {q.device}"
            )
        if importlib.util.find_spec("triton") is None:
            raise ImportError("engine='triton' needs Triton: pip install triton (CUDA builds of PyTorch include it)")
        return engine
    if engine != "auto":
        return engine
    if causal and q.device.type == "cuda" and q.dtype in _TRITON_DTYPES and importlib.util.find_spec("triton"):
        return "triton"
    return "compiled" if q.device.type != "cpu" and hasattr(torch, "compile") else "eager"


def _interpreting() -> bool:
    """Whether Triton's interpreter runs kernels (on CPU tensors) instead of compiling them."""
    return os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on")


def _check_state(state: LinearAttentionState, k: Tensor, v: Tensor, m: int) -> None:
    want = [k.shape[0], k.shape[1], m, v.shape[-1]]
    if list(state.kv.shape) != want or list(state.z.shape) != want[:3]:
        raise ValueError(
            f"state must hold kv [b, h_kv, m, d_v] = {want} and z [b, h_kv, m] = {want[:3]} for these keys, values "
            f"and feature map, got kv {list(state.kv.shape)} and z {list(state.z.shape)}"
        )
    if state.kv.device != k.device:
        raise ValueError(f"state is on {state.kv.device} but k is on {k.device}")


def _compiled_linear_core() -> Callable:
    """:func:`_linear_core` under ``torch.compile`` (one per process, created on first use)."""
    global _compiled_core
    if _compiled_core is None:
        _compiled_core = torch.compile(_linear_core, dynamic=False)
    return _compiled_core


def _linear_core(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    phi: Callable,
    causal: bool,
    chunk_size: int,
    eps: float | None,
    segment: int,
    start_kv: Tensor | None,
    start_z: Tensor | None,
    start_shift: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Linear attention on validated 4-D inputs, computed in :func:`compute_dtype` and
    returned in q's dtype, with the state after the keys (kv, z, log_shift), from the state
    ``start_*`` before them (``None``: no earlier key)."""
    b, h, s_q, d = q.shape
    h_kv, s_k, d_v = k.shape[1], k.shape[2], v.shape[-1]
    g = h // h_kv
    ct = compute_dtype(q.dtype)
    q_c, k_c, v_c = q.to(ct), k.to(ct), v.to(ct)
    fq, q_shift = phi(q_c, True)  # [b, h, s_q, m]
    fk, k_shift = phi(k_c, False)  # [b, h_kv, s_k, m]
    fk, start_kv, start_z, log_shift = _continue_state(fk, k_shift, start_kv, start_z, start_shift)
    m = fq.shape[-1]
    fq = fq.view(b, h_kv, g, s_q, m)  # [b, h_kv, g, s_q, m]
    # Values with a column of ones: one product gives the numerator and the normaliser.
    v1 = torch.cat([v_c, v_c.new_ones(b, h_kv, s_k, 1)], dim=-1)  # [b, h_kv, s_k, d_v + 1]
    start = None  # [b, h_kv, m, d_v + 1]: the earlier keys' kv and z, side by side
    if start_kv is not None and start_z is not None:
        start = torch.cat([start_kv, start_z.unsqueeze(-1)], -1)
    if not causal:
        state = fk.transpose(-1, -2) @ v1  # [b, h_kv, m, d_v + 1]
        if start is not None:
            state = state + start
        out1 = fq @ state.unsqueeze(2)  # [b, h_kv, g, s_q, d_v + 1]
    else:
        out1, state = _causal(fq, fk, v1, s_q, s_k, chunk_size, segment, start)
    eps_t = _true_eps(eps, q_shift, log_shift, b, h_kv, g, s_q)
    out = _divide(out1[..., :d_v], out1[..., d_v:], eps_t).reshape(b, h, s_q, d_v).to(q.dtype)
    return out, state[..., :d_v], state[..., d_v], log_shift


def _continue_state(
    fk: Tensor, k_shift: Tensor | None, kv: Tensor | None, z: Tensor | None, log_shift: Tensor | None
) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor]:
    """Key features and a starting state in one scale: ``(fk, kv, z, log_shift)`` with
    ``log_shift [b, h_kv]`` common to both (FAVOR+ rescales the side with the smaller
    stabiliser; 0 for the other maps), ``kv`` and ``z`` in ``fk``'s dtype."""
    b, h_kv = fk.shape[:2]
    if kv is None or z is None or log_shift is None:  # no earlier key (a state has all three)
        return fk, None, None, fk.new_zeros(b, h_kv) if k_shift is None else k_shift.view(b, h_kv)
    kv, z, log_shift = kv.to(fk.dtype), z.to(fk.dtype), log_shift.to(fk.dtype)
    if k_shift is None:
        return fk, kv, z, log_shift
    k_shift = k_shift.view(b, h_kv)
    shift = torch.maximum(log_shift, k_shift)
    old_scale = torch.exp(log_shift - shift)  # [b, h_kv]
    fk = fk * torch.exp(k_shift - shift)[..., None, None]
    return fk, kv * old_scale[..., None, None], z * old_scale[..., None], shift


def _triton_core(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    phi: Callable,
    chunk_size: int,
    eps: float | None,
    start_kv: Tensor | None,
    start_z: Tensor | None,
    start_shift: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Causal linear attention by the fused kernels, as :func:`_linear_core`. The feature
    maps run before the kernels (in float32); half types enter the kernels as bfloat16
    features and values (the range of float32, so FAVOR+ features do not underflow)."""
    b, h, s_q, d = q.shape
    h_kv, s_k, d_v = k.shape[1], k.shape[2], v.shape[-1]
    g = h // h_kv
    ct = compute_dtype(q.dtype)
    kernel_dtype = torch.bfloat16 if q.dtype in (torch.float16, torch.bfloat16) else ct
    fq, q_shift = phi(q.to(ct), True)  # [b, h, s_q, m]
    fk, k_shift = phi(k.to(ct), False)  # [b, h_kv, s_k, m]
    fk, kv0, z0, log_shift = _continue_state(fk, k_shift, start_kv, start_z, start_shift)
    m = fq.shape[-1]
    if kv0 is None or z0 is None:
        kv0, z0 = fk.new_zeros(b, h_kv, m, d_v), fk.new_zeros(b, h_kv, m)
    offset = s_k - s_q
    if offset > 0:  # keys before the first query: every query sees them
        kv0 = kv0 + fk[:, :, :offset].transpose(-1, -2) @ v[:, :, :offset].to(ct)
        z0 = z0 + fk[:, :, :offset].sum(-2)
        fk, v = fk[:, :, offset:], v[:, :, offset:]
    elif offset < 0:  # queries before the first key: keys of zero features stand in
        fk, v = F.pad(fk, (0, 0, -offset, 0)), F.pad(v, (0, 0, -offset, 0))
    if s_q == 0:  # no query: the keys went into the state above
        return q.new_zeros(b, h, 0, d_v), kv0, z0, log_shift
    eps_t = _true_eps(eps, q_shift, log_shift, b, h_kv, g, s_q)
    out, kv, z = fused_causal(
        fq.to(kernel_dtype),
        fk.to(kernel_dtype),
        v.to(kernel_dtype),
        kv0,
        z0,
        eps=eps_t if not isinstance(eps_t, Tensor) else None,
        eps_rows=eps_t.reshape(b, h, s_q) if isinstance(eps_t, Tensor) else None,
        chunk=chunk_size,
        out_dtype=q.dtype,
    )
    return out, kv, z, log_shift


def default_chunk_size(device: torch.device) -> int:
    """Tokens per chunk of the causal scan: 64 on the CPU (small products that stay in cache),
    256 on GPUs (fewer, larger matrix products)."""
    return 64 if device.type == "cpu" else 256


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype linear attention computes in: float32 for half types, else ``dtype``."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _true_eps(
    eps: float | None, q_shift: Tensor | None, k_shift: Tensor | None, b: int, h_kv: int, g: int, s_q: int
) -> Tensor | float | None:
    """``eps`` in the units of the shifted features (FAVOR+ divides query features by
    ``exp(q_shift)`` and key features by ``exp(k_shift)``): ``eps · exp(-q_shift - k_shift)``,
    so that adding it equals adding ``eps`` to the true normaliser, whatever the shifts (and
    a future key, which may raise ``k_shift``, changes nothing before it)."""
    if eps is None or q_shift is None or k_shift is None:
        return eps
    log_eps = math.log(eps) if eps > 0 else float("-inf")
    q_shift = q_shift.view(b, h_kv, g, s_q, 1)
    k_shift = k_shift.view(b, h_kv, 1, 1, 1)
    return torch.exp((log_eps - q_shift - k_shift).clamp(max=torch.finfo(q_shift.dtype).max))


def _divide(num: Tensor, den: Tensor, eps: Tensor | float | None) -> Tensor:
    """``num / den``, or ``num / (den + eps)``. With non-negative features ``den == 0``
    forces ``num == 0``, so dividing by 1 there gives the zero output, NaN-free forward and
    backward."""
    if eps is not None:
        return num / (den + eps)
    return num / torch.where(den > 0, den, torch.ones_like(den))


def _causal(
    fq: Tensor, fk: Tensor, v1: Tensor, s_q: int, s_k: int, chunk: int, segment: int, start: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Causal ``[φ(q)·Σφ(k)v, φ(q)·Σφ(k)]`` by chunks: ``fq [b, h_kv, g, s_q, m]``,
    ``fk [b, h_kv, s_k, m]``, ``v1 [b, h_kv, s_k, e]`` (values and a ones column), from the
    state ``start [b, h_kv, m, e]`` of earlier keys (``None``: none), with the state after the
    last key; the chunk-level prefix sums are taken ``segment`` tokens at a time."""
    b, h_kv, g, _, m = fq.shape
    e = v1.shape[-1]
    offset = s_k - s_q
    state = fk.new_zeros(b, h_kv, m, e) if start is None else start
    if offset > 0:  # keys before the first query: every query sees them
        state = state + fk[:, :, :offset].transpose(-1, -2) @ v1[:, :, :offset]
        fk, v1 = fk[:, :, offset:], v1[:, :, offset:]
    blind = max(0, -offset)  # queries before the first key see only the earlier keys
    aligned = s_q - blind  # queries aligned one-to-one with the remaining keys
    if not blind:
        outs = []
    elif start is None:
        outs = [fq.new_zeros(b, h_kv, g, blind, e)]
    else:
        outs = [fq[:, :, :, :blind] @ state.unsqueeze(2)]
    fq = fq[:, :, :, blind:]
    for s0 in range(0, aligned, segment):
        s1 = min(aligned, s0 + segment)
        o, state = _causal_segment(fq[:, :, :, s0:s1], fk[:, :, s0:s1], v1[:, :, s0:s1], state, chunk)
        outs.append(o)
    if not outs:
        return fq.new_zeros(b, h_kv, g, 0, e), state
    return (torch.cat(outs, dim=3) if len(outs) != 1 else outs[0]), state


def _causal_segment(fq: Tensor, fk: Tensor, v1: Tensor, state: Tensor, chunk: int) -> tuple[Tensor, Tensor]:
    """One segment of aligned queries and keys, given the state of everything before it.
    The ``g`` query heads of a key/value head are folded into the rows of each chunk, so
    every product is a plain batched matmul (no broadcast copies)."""
    b, h_kv, g, n, m = fq.shape
    e = v1.shape[-1]
    c = min(chunk, n)
    n_c = -(-n // c)
    pad = n_c * c - n
    if pad:  # zero features: padded keys add nothing, padded queries are dropped
        fq, fk, v1 = F.pad(fq, (0, 0, 0, pad)), F.pad(fk, (0, 0, 0, pad)), F.pad(v1, (0, 0, 0, pad))
    fq_c = fq.view(b, h_kv, g, n_c, c, m).transpose(2, 3).reshape(b, h_kv, n_c, g * c, m)
    fk_c = fk.view(b, h_kv, n_c, c, m)
    v_c = v1.view(b, h_kv, n_c, c, e)
    states = fk_c.transpose(-1, -2) @ v_c  # [b, h_kv, n_c, m, e]
    # State before each chunk: what came before the segment plus the earlier chunks.
    # (In place where autograd allows: none of these ops saves its output for backward.)
    before = torch.cumsum(states, 2).sub_(states).add_(state.unsqueeze(2))  # [b, h_kv, n_c, m, e]
    scores = fq_c @ fk_c.transpose(-1, -2)  # [b, h_kv, n_c, g*c, c]
    future = ~torch.ones(c, c, dtype=torch.bool, device=fq.device).tril().repeat(g, 1)  # [g*c, c]
    scores.masked_fill_(future, 0)  # (matmul saves its inputs, not its output)
    out = (fq_c @ before).add_(scores @ v_c)  # [b, h_kv, n_c, g*c, e]
    out = out.view(b, h_kv, n_c, g, c, e).transpose(2, 3).reshape(b, h_kv, g, n_c * c, e)[:, :, :, :n]
    return out, state + states.sum(2)


# ---------------------------------------------------------------------------------------
# Recurrent decoding: one token at a time with a constant-size state.
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LinearAttentionState:
    """Everything causal linear attention needs to know about the past, whatever its length.

    Attributes:
        kv: ``Σ_j φ(k_j) v_jᵀ``, ``[b, h_kv, m, d_v]``.
        z: ``Σ_j φ(k_j)``, ``[b, h_kv, m]``.
        log_shift: ``[b, h_kv]``: ``kv`` and ``z`` are stored divided by
            ``exp(log_shift)`` (FAVOR+ keeps its exponentials in range this way; 0 for the
            other maps).
        length: how many keys it has absorbed.
    """

    kv: Tensor
    z: Tensor
    log_shift: Tensor
    length: int = 0

    @staticmethod
    def empty(
        b: int,
        h_kv: int,
        m: int,
        d_v: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> LinearAttentionState:
        """A state that has seen no key."""
        return LinearAttentionState(
            torch.zeros(b, h_kv, m, d_v, dtype=dtype, device=device),
            torch.zeros(b, h_kv, m, dtype=dtype, device=device),
            torch.zeros(b, h_kv, dtype=dtype, device=device),
            0,
        )

    def absorb(self, fk: Tensor, v: Tensor, log_shift: Tensor | None) -> LinearAttentionState:
        """The state after keys with features ``fk [b, h_kv, n, m]`` (already divided by
        ``exp(log_shift [b, h_kv, 1, 1])``) and values ``v [b, h_kv, n, d_v]``."""
        if log_shift is None:
            return LinearAttentionState(
                self.kv + fk.transpose(-1, -2) @ v, self.z + fk.sum(-2), self.log_shift, self.length + fk.shape[-2]
            )
        new_shift = torch.maximum(self.log_shift, log_shift.view(self.log_shift.shape))
        old_scale = torch.exp(self.log_shift - new_shift)  # [b, h_kv]
        new_scale = torch.exp(log_shift.view(self.log_shift.shape) - new_shift)
        fk = fk * new_scale[..., None, None]
        kv = self.kv * old_scale[..., None, None] + fk.transpose(-1, -2) @ v
        z = self.z * old_scale[..., None] + fk.sum(-2)
        return LinearAttentionState(kv, z, new_shift, self.length + fk.shape[-2])


def linear_attention_state(
    k: Tensor,
    v: Tensor,
    *,
    feature_map: FeatureMap = "elu",
    projection: Tensor | None = None,
    seed: int = 0,
    state: LinearAttentionState | None = None,
) -> LinearAttentionState:
    """Absorb keys ``[b, h_kv, s, d]`` and values ``[b, h_kv, s, d_v]`` (a prompt) into a
    state, starting from ``state`` or from nothing."""
    b, h_kv, _, d = k.shape
    ct = compute_dtype(k.dtype)
    phi, m = feature_map_fn(feature_map, d=d, projection=projection, seed=seed, dtype=ct, device=k.device)
    if state is None:
        state = LinearAttentionState.empty(b, h_kv, m, v.shape[-1], dtype=ct, device=k.device)
    fk, shift = phi(k.to(ct), False)
    return state.absorb(fk, v.to(ct), shift)


def linear_attention_step(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    state: LinearAttentionState | None = None,
    *,
    feature_map: FeatureMap = "elu",
    projection: Tensor | None = None,
    seed: int = 0,
    eps: float | None = None,
) -> tuple[Tensor, LinearAttentionState]:
    """Decode one token: absorb its key and value, then attend with its query.

    Equals the last row of ``linear_attention(..., causal=True)`` over every token so far,
    in O(m · d_v) time and memory whatever the length.

    Args:
        q: ``[b, h, 1, d]``; k: ``[b, h_kv, 1, d]``; v: ``[b, h_kv, 1, d_v]``.
        state: the state after the previous tokens (``None``: the first token).

    Returns:
        ``(out [b, h, 1, d_v], new state)``.

    Raises:
        ValueError: not one token, or shapes that do not fit the state.
    """
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4 or q.shape[2] != 1 or k.shape[2] != 1 or v.shape[2] != 1:
        raise ValueError(
            f"linear_attention_step takes one token: q [b, h, 1, d], k [b, h_kv, 1, d], v [b, h_kv, 1, d_v], "
            f"got q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}"
        )
    b, h, _, d = q.shape
    h_kv = k.shape[1]
    if h % h_kv:
        raise ValueError(f"query heads must be a multiple of key/value heads, got h={h} and h_kv={h_kv}")
    state = linear_attention_state(k, v, feature_map=feature_map, projection=projection, seed=seed, state=state)
    if state.kv.shape[:2] != (b, h_kv):
        raise ValueError(f"state is for [b, h_kv] = {list(state.kv.shape[:2])}, got {[b, h_kv]}")
    ct = state.kv.dtype
    phi, _ = feature_map_fn(feature_map, d=d, projection=projection, seed=seed, dtype=ct, device=q.device)
    fq, q_shift = phi(q.to(ct), True)  # [b, h, 1, m]
    fq = fq.view(b, h_kv, h // h_kv, 1, -1)
    num = fq @ state.kv.unsqueeze(2)  # [b, h_kv, g, 1, d_v]
    den = fq @ state.z[:, :, None, :, None]  # [b, h_kv, g, 1, 1]
    eps_t = _true_eps(eps, q_shift, state.log_shift, b, h_kv, h // h_kv, 1)
    return _divide(num, den, eps_t).reshape(b, h, 1, -1).to(q.dtype), state
