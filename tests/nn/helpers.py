"""Shared helpers of the attnkit.nn tests: torch-module gradients mapped onto our parameter
names, and random inputs."""

from __future__ import annotations

import torch
from torch import Tensor, nn

ATOL = 1e-5
RTOL = 1e-5


def assert_close(actual: Tensor, expected: Tensor) -> None:
    """The parity tolerance of issue 3: within 1e-5 in float32."""
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=RTOL)


def torch_mha_grads(m: nn.MultiheadAttention, prefix: str = "") -> dict[str, Tensor]:
    """Gradients of a ``torch.nn.MultiheadAttention`` under our ``MultiHeadAttention``'s names."""
    if m.in_proj_weight is not None:
        weights = m.in_proj_weight.grad.chunk(3)
    else:
        weights = (m.q_proj_weight.grad, m.k_proj_weight.grad, m.v_proj_weight.grad)
    grads = {f"{prefix}{p}_proj.weight": w for p, w in zip("qkv", weights)}
    grads[f"{prefix}out_proj.weight"] = m.out_proj.weight.grad
    if m.in_proj_bias is not None:
        grads.update({f"{prefix}{p}_proj.bias": b for p, b in zip("qkv", m.in_proj_bias.grad.chunk(3))})
        grads[f"{prefix}out_proj.bias"] = m.out_proj.bias.grad
    return grads


def _module_grads(m: nn.Module, prefix: str) -> dict[str, Tensor]:
    return {f"{prefix}{name}": p.grad for name, p in m.named_parameters()}


def torch_transformer_grads(m: nn.Transformer) -> dict[str, Tensor]:
    """Gradients of a ``torch.nn.Transformer`` under our ``Transformer``'s names."""
    grads: dict[str, Tensor] = {}
    for i, layer in enumerate(m.encoder.layers):
        p = f"encoder.layers.{i}."
        grads.update(torch_mha_grads(layer.self_attn, p + "self_attn."))
        grads.update(_module_grads(layer.linear1, p + "ff.up_proj."))
        grads.update(_module_grads(layer.linear2, p + "ff.down_proj."))
        grads.update(_module_grads(layer.norm1, p + "self_attn_norm."))
        grads.update(_module_grads(layer.norm2, p + "ff_norm."))
    for i, layer in enumerate(m.decoder.layers):
        p = f"decoder.layers.{i}."
        grads.update(torch_mha_grads(layer.self_attn, p + "self_attn."))
        grads.update(torch_mha_grads(layer.multihead_attn, p + "cross_attn."))
        grads.update(_module_grads(layer.linear1, p + "ff.up_proj."))
        grads.update(_module_grads(layer.linear2, p + "ff.down_proj."))
        grads.update(_module_grads(layer.norm1, p + "self_attn_norm."))
        grads.update(_module_grads(layer.norm2, p + "cross_attn_norm."))
        grads.update(_module_grads(layer.norm3, p + "ff_norm."))
    grads.update(_module_grads(m.encoder.norm, "encoder.final_norm."))
    grads.update(_module_grads(m.decoder.norm, "decoder.final_norm."))
    return grads


def assert_grads_match(ours: nn.Module, expected: dict[str, Tensor]) -> None:
    """Every parameter of ``ours`` has the gradient ``expected`` names for it."""
    names = {name for name, _ in ours.named_parameters()}
    assert names == set(expected), f"parameter names differ: {sorted(names ^ set(expected))}"
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], atol=ATOL, rtol=RTOL, msg=lambda m, n=name: f"{n}: {m}")


def padding_blocked(lengths: list[int], s: int) -> Tensor:
    """torch's ``key_padding_mask`` ``[b, s]``: ``True`` = padding."""
    return torch.arange(s)[None, :] >= torch.tensor(lengths)[:, None]


def random_blocked(s_q: int, s_k: int, generator: torch.Generator) -> Tensor:
    """A random torch ``attn_mask`` ``[s_q, s_k]`` (``True`` = blocked) where every query
    keeps key 0, so that no row is fully masked (torch gives NaN there, attnkit zeros)."""
    blocked = torch.rand(s_q, s_k, generator=generator) < 0.4
    blocked[:, 0] = False
    return blocked
