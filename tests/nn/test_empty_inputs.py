"""MultiHeadAttention on empty inputs: batch 0, length 0 and an empty context give empty
(or, for a context with no keys, all-masked) results rather than reshape errors."""

from __future__ import annotations

import pytest
import torch

from attnkit.nn import AttentionConfig, MultiHeadAttention


@pytest.mark.parametrize("num_kv_heads", [None, 2])
@pytest.mark.parametrize("return_weights", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(0, 5, 16), (2, 0, 16), (0, 0, 16)])
def test_batch_or_length_zero(shape, causal, return_weights, num_kv_heads):
    module = MultiHeadAttention(AttentionConfig(16, 4, num_kv_heads=num_kv_heads))
    out = module(torch.randn(*shape), causal=causal, return_weights=return_weights)
    b, s, _ = shape
    if return_weights:
        assert out.output.shape == shape and out.weights.shape == (b, 4, s, s)
    else:
        assert out.shape == shape


@pytest.mark.parametrize("return_weights", [False, True])
def test_an_empty_context_attends_to_nothing(return_weights):
    """A query with no key to attend to gets zeros from attention, so the module's output
    is the output projection's bias, and its weights are an empty row."""
    module = MultiHeadAttention(AttentionConfig(16, 4))
    out = module(torch.randn(2, 3, 16), torch.randn(2, 0, 16), return_weights=return_weights)
    output = out.output if return_weights else out
    torch.testing.assert_close(output, module.out_proj.bias.expand(2, 3, 16))
    if return_weights:
        assert out.weights.shape == (2, 4, 3, 0)
