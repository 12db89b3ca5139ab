"""The autograd function that local and ring attention share (attnkit.functional.recompute):
the backward it is given runs on the saved inputs, output and log-sum-exp."""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.functional.recompute import recomputed_attention


def _dense(scale: float, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    scores = q @ k.transpose(-1, -2) * scale  # [b, h, s_q, s_k]
    return torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1)


def _dense_backward(
    scale: float, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    assert dout.is_contiguous()
    weights = torch.exp(q @ k.transpose(-1, -2) * scale - lse.unsqueeze(-1))  # [b, h, s_q, s_k]
    dv = weights.transpose(-1, -2) @ dout
    ds = weights * (dout @ v.transpose(-1, -2) - (dout * out).sum(-1, keepdim=True)) * scale
    return ds @ k, ds.transpose(-1, -2) @ q, dv


def test_gradients_come_from_the_given_backward_and_match_autograd():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    dout = torch.randn(1, 2, 4, 5, dtype=torch.float64).transpose(-1, -2)  # not contiguous
    out, lse = recomputed_attention(_dense, _dense_backward, 0.5, q, k, v)
    assert not lse.requires_grad
    got = torch.autograd.grad(out, (q, k, v), dout)
    expected_out, _ = _dense(0.5, q, k, v)
    expected = torch.autograd.grad(expected_out, (q, k, v), dout)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)


def test_without_a_gradient_to_record_the_forward_runs_alone():
    q, k, v = (torch.randn(1, 1, 3, 2, requires_grad=True) for _ in range(3))
    with torch.no_grad():
        out, lse = recomputed_attention(_dense, _dense_backward, 1.0, q, k, v)
    assert out.grad_fn is None and lse.grad_fn is None
    out, _ = recomputed_attention(_dense, _dense_backward, 1.0, *(t.detach() for t in (q, k, v)))
    assert out.grad_fn is None
