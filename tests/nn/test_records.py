"""``forward`` and ``forward_record`` of the attention module and the layers: one argument
list (written on ``forward_record``), the tensor or the record."""

from __future__ import annotations

import inspect
import typing

import pytest
import torch
from torch import nn

from attnkit.nn import AttentionConfig, DecoderLayer, EncoderLayer, LayerConfig, MultiHeadAttention
from attnkit.nn.records import LayerOutput, MultiHeadOutput
from tests.nn.helpers import assert_close


def _modules() -> list[tuple[nn.Module, type, dict]]:
    """Each module, its record type and the arguments of a call on ``[1, 3, 8]``."""
    torch.manual_seed(0)
    config = LayerConfig(8, 2, 16, dropout=0.0)
    return [
        (MultiHeadAttention(AttentionConfig(8, 2)), MultiHeadOutput, {"causal": True}),
        (EncoderLayer(config), LayerOutput, {}),
        (DecoderLayer(config, cross_attention=False), LayerOutput, {"causal": True}),
    ]


@pytest.mark.parametrize(("module", "record_type", "kwargs"), _modules())
def test_forward_takes_exactly_the_arguments_of_forward_record(module, record_type, kwargs):
    forward, forward_record = inspect.signature(module.forward), inspect.signature(module.forward_record)
    assert forward.parameters == forward_record.parameters
    assert forward.return_annotation == f"Tensor | {record_type.__name__}"
    hints = typing.get_type_hints(type(module).forward)
    assert hints["return"] == torch.Tensor | record_type
    # Named after the class that writes forward_record (MultiHeadAttention inherits Attention's).
    defining = next(c for c in type(module).__mro__ if "forward_record" in vars(c))
    assert type(module).forward.__qualname__ == f"{defining.__name__}.forward"
    assert "return_weights" in (type(module).forward.__doc__ or "")


@pytest.mark.parametrize(("module", "record_type", "kwargs"), _modules())
def test_forward_returns_the_record_s_output_or_with_weights_the_record(module, record_type, kwargs):
    x = torch.randn(1, 3, 8)
    record = module.forward_record(x, **kwargs)
    assert isinstance(record, record_type) and record.weights is None
    plain = module(x, **kwargs)
    assert isinstance(plain, torch.Tensor)
    assert_close(plain, record.output)
    with_weights = module(x, return_weights=True, **kwargs)
    assert isinstance(with_weights, record_type) and with_weights.weights is not None
    assert_close(with_weights.output, record.output)


def test_forward_checks_its_arguments_as_forward_record_does():
    layer = DecoderLayer(LayerConfig(8, 2, 16), cross_attention=False)
    with pytest.raises(TypeError, match="unexpected keyword argument 'memory_mask_'"):
        layer(torch.randn(1, 3, 8), memory_mask_=None)
    with pytest.raises(ValueError, match="memory is required by a decoder layer with cross-attention"):
        layer(torch.randn(1, 3, 8), torch.randn(1, 2, 8))
