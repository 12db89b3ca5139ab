"""The block call of the blockwise engine: exact attention of one batch of query blocks
against one batch of key blocks, forward and backward, returning the log-sum-exp so that
partial results over different key blocks merge exactly (the online softmax of
FlashAttention). Every memory-bounded kernel (tiled, local, sparse, and ring attention in
:mod:`attnkit.distributed`) is a schedule of calls to :func:`block_forward`,
:func:`block_backward` and :func:`merge`.

Shape letters: ``n`` independent problems (batch × heads × blocks, flattened or not), ``m``
query rows, ``l`` keys, ``d`` head dim, ``d_v`` value dim. All tensors are 4-D
``[n0, n1, rows, dim]``; ``bias`` is an additive float tensor broadcastable to
``[n0, n1, m, l]`` whose ``-inf`` entries mask pairs out.

Two block ops compute the same thing (:data:`BlockOp`; ``"auto"`` takes the fused one
where it applies):

- **fused**: on CPU, PyTorch's flash-attention kernel
  (``aten::_scaled_dot_product_flash_attention_for_cpu`` and its backward), which never
  materialises the ``[m, l]`` scores and already returns the log-sum-exp. These ops are
  private to torch: they are used only when this torch has them with the expected
  arguments (:func:`private_op`), and the eager op serves otherwise;
- **eager**: plain tensor operations, for every other device, for ``d != d_v``, and for the
  gradient of ``bias``; callers keep ``m * l`` small.

A row with no allowed key gets a zero output and ``lse = -inf``; its gradients are zero.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

BlockOp = Literal["auto", "fused", "eager"]

_FUSED_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_NEG_INF = float("-inf")


# The arguments attnkit passes to torch's private CPU flash-attention ops, by name.
FUSED_FORWARD_ARGS = ("query", "key", "value", "dropout_p", "is_causal", "attn_mask", "scale")
FUSED_BACKWARD_ARGS = (
    "grad_out",
    "query",
    "key",
    "value",
    "out",
    "logsumexp",
    "dropout_p",
    "is_causal",
    "attn_mask",
    "scale",
)


def private_op(name: str, expected_args: tuple[str, ...]):
    """torch's private op ``aten::name`` when this torch has it with exactly the arguments
    attnkit passes, else ``None``: private ops may change or vanish between releases, and the
    eager op then computes the same thing."""
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        return None
    try:
        args = tuple(argument.name for argument in packet.default._schema.arguments)
    except (AttributeError, RuntimeError):
        return None
    return packet if args == expected_args else None


_FUSED_FORWARD = private_op("_scaled_dot_product_flash_attention_for_cpu", FUSED_FORWARD_ARGS)
_FUSED_BACKWARD = private_op("_scaled_dot_product_flash_attention_for_cpu_backward", FUSED_BACKWARD_ARGS)


def use_fused(q: Tensor, v: Tensor, op: BlockOp = "auto") -> bool:
    """Whether the fused CPU op serves these inputs when ``op`` is asked for.

    Raises:
        ValueError: ``op="fused"`` for inputs it cannot take.
    """
    if op == "eager":
        return False
    ok = (
        _FUSED_FORWARD is not None
        and _FUSED_BACKWARD is not None
        and q.device.type == "cpu"
        and q.shape[-1] == v.shape[-1]
        and q.dtype in _FUSED_DTYPES
    )
    if op == "fused" and not ok:
        raise ValueError(
            f"the fused block op needs CPU tensors with d == d_v, got {q.device} d={q.shape[-1]} d_v={v.shape[-1]}"
        )
    return ok


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of log-sum-exp values for inputs of ``dtype`` (float32 for half types)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def block_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    scale: float,
    op: BlockOp = "auto",
    alive: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``softmax(q kᵀ · scale + bias) v`` and its log-sum-exp.

    Args:
        q: ``[n0, n1, m, d]``; k: ``[n0, n1, l, d]``; v: ``[n0, n1, l, d_v]``.
        bias: ``None`` or a float tensor broadcastable to ``[n0, n1, m, l]`` in q's dtype.
        alive: optional bool ``[.., m]`` broadcastable to ``[n0, n1, m]``: rows with at least
            one finite bias entry, when the caller knows it more cheaply than from ``bias``.

    Returns:
        ``(out [n0, n1, m, d_v], lse [n0, n1, m])``; ``NaN`` in both on every row whose
        query holds a NaN or that may attend to a key holding one, so that merging partial
        results can never turn a NaN into a number (a NaN value reaches, as in the
        reference, the output column it is in).
    """
    # One sum finds the rare call with a NaN (it makes the sum NaN; so may inf - inf, which
    # only costs the closer look): about 0.4% of a block call, where per-row tests cost 4%.
    if bool(torch.isnan(q.sum() + k.sum())):
        q_nan, k_nan = q.isnan().any(-1), k.isnan().any(-1)  # [n0, n1, m], [n0, n1, l]
        if bool(q_nan.any() | k_nan.any()):
            return _forward_with_nan(q, k, v, bias, scale, op, q_nan, k_nan)
    return _forward(q, k, v, bias, scale, op, alive)


def _forward_with_nan(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    scale: float,
    op: BlockOp,
    q_nan: Tensor,
    k_nan: Tensor,
) -> tuple[Tensor, Tensor]:
    """:func:`block_forward` on queries or keys holding NaN. The kernels disagree on them
    (the fused one reports a row whose every score is NaN as a finite zero, and a NaN score
    plus a masking ``-inf`` spreads the NaN to rows that may not attend to it), so the NaN
    rows are decided here: the NaN vectors are zeroed for the kernel, and the rows that
    meet one where the mask allows it are set to NaN after."""
    zero = torch.zeros((), dtype=q.dtype, device=q.device)
    q, k = torch.where(q_nan.unsqueeze(-1), zero, q), torch.where(k_nan.unsqueeze(-1), zero, k)
    out, lse = _forward(q, k, v, bias, scale, op)
    meets_nan = q_nan.unsqueeze(-1) | k_nan.unsqueeze(-2)  # [n0, n1, m, l]
    if bias is not None:
        meets_nan = meets_nan & (bias > _NEG_INF)
    nan_rows = meets_nan.any(-1)  # [n0, n1, m]
    out = out.masked_fill(nan_rows.unsqueeze(-1), float("nan"))
    return out, lse.masked_fill(nan_rows, float("nan"))


def _forward(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, scale: float, op: BlockOp, alive: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    if use_fused(q, v, op):
        out, lse = _FUSED_FORWARD(q, k, v, 0.0, False, attn_mask=bias, scale=scale)
        if bias is not None:
            # The fused kernel reports lse = 0 on rows with nothing allowed; make it -inf.
            if alive is None:
                alive = (bias > _NEG_INF).any(-1)  # [.., m]
            lse = torch.where(alive, lse, torch.full((), _NEG_INF, dtype=lse.dtype, device=lse.device))
        return out, lse
    return _eager_forward(q, k, v, bias, scale)


def block_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    bias: Tensor | None,
    scale: float,
    *,
    need_dbias: bool = False,
    op: BlockOp = "auto",
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Gradients of one block call, given the rows' *final* ``out`` and ``lse``.

    Because the weights are recomputed as ``exp(score - lse)`` with the rows' global
    log-sum-exp, and ``D = rowsum(dout * out)`` uses the global output, the gradients of
    every key block of a row can be computed separately and summed (FlashAttention-2).

    Returns:
        ``(dq, dk, dv, dbias)``, where ``dbias`` is the score gradient ``[n0, n1, m, l]``
        when ``need_dbias`` and ``None`` otherwise.
    """
    # exp(score - (+inf)) = 0: rows that attended to nothing get no gradient (NaN rows keep
    # their NaN, which reaches the gradients as in the reference).
    lse = torch.where(lse == _NEG_INF, torch.full((), float("inf"), dtype=lse.dtype, device=lse.device), lse)
    if not need_dbias and use_fused(q, v, op):
        dq, dk, dv = _FUSED_BACKWARD(dout, q, k, v, out, lse, 0.0, False, attn_mask=bias, scale=scale)
        return dq, dk, dv, None
    return _eager_backward(dout, q, k, v, out, lse, bias, scale, need_dbias)


def merge(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> tuple[Tensor, Tensor]:
    """Combine two partial results over disjoint key sets of the same rows."""
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    w_a = torch.exp(lse_a - safe).unsqueeze(-1).to(out_a.dtype)
    w_b = torch.exp(lse_b - safe).unsqueeze(-1).to(out_b.dtype)
    return out_a * w_a + out_b * w_b, lse


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _scores(q: Tensor, k: Tensor, bias: Tensor | None, scale: float) -> Tensor:
    ct = _compute_dtype(q.dtype)
    scores = (q.to(ct) * scale) @ k.to(ct).transpose(-1, -2)  # [n0, n1, m, l]
    if bias is not None:
        scores.add_(bias.to(ct))
    return scores


def _eager_forward(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, scale: float) -> tuple[Tensor, Tensor]:
    ct = _compute_dtype(q.dtype)
    scores = _scores(q, k, bias, scale)  # [n0, n1, m, l]
    row_max = scores.amax(-1, keepdim=True) if scores.shape[-1] else scores.new_full((*scores.shape[:-1], 1), _NEG_INF)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    probs = scores.sub_(row_max).exp_()  # unnormalised, in place
    total = probs.sum(-1, keepdim=True)
    safe_total = torch.where(total > 0, total, torch.ones_like(total))
    out = (probs @ v.to(ct)) / safe_total  # [n0, n1, m, d_v]
    lse = torch.where(total > 0, row_max + torch.log(safe_total), torch.full_like(total, _NEG_INF))
    return out.to(q.dtype), lse.squeeze(-1).to(lse_dtype(q.dtype))


def _eager_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    bias: Tensor | None,
    scale: float,
    need_dbias: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    ct = _compute_dtype(q.dtype)
    dout_c, v_c, k_c = dout.to(ct), v.to(ct), k.to(ct)
    probs = _scores(q, k, bias, scale).sub_(lse.to(ct).unsqueeze(-1)).exp_()  # [n0, n1, m, l]
    dv = probs.transpose(-1, -2) @ dout_c  # [n0, n1, l, d_v]
    dprobs = dout_c @ v_c.transpose(-1, -2)  # [n0, n1, m, l]
    delta = (dout_c * out.to(ct)).sum(-1, keepdim=True)  # [n0, n1, m, 1]
    dscores = probs.mul_(dprobs.sub_(delta))  # [n0, n1, m, l]
    dq = (dscores @ k_c) * scale
    dk = dscores.transpose(-1, -2) @ (q.to(ct) * scale)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), (dscores if need_dbias else None)
