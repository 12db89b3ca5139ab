"""Attention weights from any Hugging Face ``transformers`` model, without reloading it.

Models loaded with their default ``sdpa`` attention never materialise the weights, and
``output_attentions=True`` needs the slow ``eager`` path chosen at load time. Instead,
:func:`capture` registers an attention function of our own under the name
``"attnkit_capture"`` in ``transformers``' attention interface, switches the loaded model to
it for one forward pass, and switches it back. The function computes attention with
:func:`attnkit.attention` (grouped-query attention without copying keys and values, zeros
instead of NaN on fully masked padding rows) and hands the weights to the capture in
progress.

Shape letters: ``b`` batch, ``h`` query heads, ``h_kv`` key/value heads, ``s_q`` query
length, ``s_k`` key length, ``d`` head dim.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from attnkit.functional import attention

IMPLEMENTATION = "attnkit_capture"

# Weights recorded by the capture in progress, as (module, weights) in call order. A context
# variable rather than a global list, so that captures in different threads stay apart.
_RECORDER: contextvars.ContextVar[list[tuple[torch.nn.Module, Tensor]] | None] = contextvars.ContextVar(
    "attnkit_capture_recorder", default=None
)


@dataclass(frozen=True)
class CapturedAttention:
    """What one forward pass of a Hugging Face model attended to.

    Attributes:
        layers: post-softmax weights of each attention call, ``[b, h, s_q, s_k]`` each, in
            the order of the modules' ``layer_idx`` (in call order when the modules have no
            distinct ``layer_idx``, as in encoder-decoder models). Rows of padding queries
            that may attend to nothing are zeros.
        modules: the qualified name of the attention module behind each entry of ``layers``
            (``"model.layers.3.self_attn"``), to tell encoder, decoder and cross attention
            apart.
        outputs: what the model's forward returned (logits, hidden states, ...).
    """

    layers: list[Tensor]
    modules: list[str]
    outputs: Any = field(repr=False)

    def stack(self) -> Tensor:
        """All layers as one tensor ``[layers, b, h, s_q, s_k]``.

        Raises:
            ValueError: the layers' weights have different shapes (cross attention).
        """
        shapes = {tuple(w.shape) for w in self.layers}
        if len(shapes) != 1:
            raise ValueError(f"layers have different shapes {sorted(shapes)}; index CapturedAttention.layers instead")
        return torch.stack(self.layers)


def capture(hf_model: torch.nn.Module, **inputs: Any) -> CapturedAttention:
    """Run ``hf_model(**inputs)`` once and record the attention weights of every layer.

    The model keeps its weights and is not reloaded: its attention implementation is
    switched to ``"attnkit_capture"`` for this call and restored afterwards, even when the
    forward pass raises. Runs under ``torch.no_grad()``; dropout follows the model's
    train/eval mode as it would with ``sdpa``. Memory grows with
    ``layers * b * h * s_q * s_k``.

    Args:
        hf_model: a ``transformers.PreTrainedModel`` whose attention goes through the
            attention interface (LLaMA, Mistral, Qwen, BERT, GPT-2, ... in transformers 5).
        **inputs: the forward's arguments, e.g. the tokenizer's output
            (``input_ids``, ``attention_mask``).

    Returns:
        :class:`CapturedAttention` with the weights and the model's outputs.

    Raises:
        ImportError: ``transformers`` is not installed.
        TypeError: ``hf_model`` is not a ``transformers`` model.
        ValueError: the model does not route attention through the attention interface,
            or its attention needs an option plain attention lacks (logit soft-capping).
    """
    try:
        from transformers import PreTrainedModel
    except ImportError:
        raise ImportError("capturing attention needs transformers: pip install 'attnkit[models]'") from None

    if not isinstance(hf_model, PreTrainedModel):
        raise TypeError(f"hf_model must be a transformers PreTrainedModel, got {type(hf_model).__name__}")
    if not hf_model._can_set_attn_implementation():
        raise ValueError(
            f"{type(hf_model).__name__} does not route attention through transformers' AttentionInterface, "
            "so its weights cannot be captured; load it with attn_implementation='eager' and output_attentions=True"
        )
    _register()
    original = _implementation_tree(hf_model.config)
    recorded: list[tuple[torch.nn.Module, Tensor]] = []
    token = _RECORDER.set(recorded)
    try:
        hf_model.set_attn_implementation(IMPLEMENTATION)
        with torch.no_grad():
            outputs = hf_model(**inputs)
    finally:
        _RECORDER.reset(token)
        hf_model.set_attn_implementation(original)
    if not recorded:
        raise ValueError(f"{type(hf_model).__name__} ran no attention through the attention interface")
    names = {id(m): name for name, m in hf_model.named_modules()}
    indices = [getattr(m, "layer_idx", None) for m, _ in recorded]
    layer_of = [index for index in indices if index is not None]
    if len(layer_of) == len(indices) and len(set(layer_of)) == len(layer_of):
        recorded = [recorded[i] for i in sorted(range(len(recorded)), key=layer_of.__getitem__)]
    return CapturedAttention(
        layers=[w for _, w in recorded],
        modules=[names.get(id(m), type(m).__name__) for m, _ in recorded],
        outputs=outputs,
    )


def capture_attention_forward(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    is_causal: bool | None = None,
    position_bias: Tensor | None = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor]:
    """The attention function registered as ``"attnkit_capture"``: the same semantics as
    ``transformers``' ``sdpa_attention_forward``, computed by :func:`attnkit.attention`.

    Args:
        module: the calling attention module (``is_causal``, ``layer_idx``).
        query: ``[b, h, s_q, d]``.
        key: ``[b, h_kv, s_k, d]``, not repeated for grouped-query attention.
        value: ``[b, h_kv, s_k, d_v]``.
        attention_mask: ``None``, a bool mask ``[b|1, 1, s_q, s_k]`` (``True`` = may attend,
            built by ``sdpa_mask`` registered under the same name), or an additive float
            mask from models that build their own.
        scaling: score scale; ``1/sqrt(d)`` when ``None``.
        dropout: dropout probability on the weights (the model passes 0 in eval mode).
        is_causal: overrides ``module.is_causal`` as in ``sdpa``.
        position_bias: additive score bias ``[b|1, h, s_q, s_k]`` (T5-style models).

    Returns:
        ``(output [b, s_q, h, d_v], weights [b, h, s_q, s_k])``.

    Raises:
        ValueError: ``softcap`` was requested (``sdpa`` does not support it either).
    """
    if kwargs.get("softcap") is not None:
        raise ValueError("attnkit capture does not support attention logit soft-capping (softcap)")
    s_q, s_k = query.shape[2], key.shape[2]
    mask: Tensor | None = None
    bias = position_bias
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        mask = attention_mask
    elif attention_mask is not None:
        bias = attention_mask if bias is None else bias + attention_mask
    elif (is_causal if is_causal is not None else getattr(module, "is_causal", True)) and s_q > 1:
        # No mask means "rely on is_causal", which SDPA aligns top-left: with a prefilled
        # static cache the keys past s_q are empty slots that no query may see.
        mask = torch.ones(s_q, s_k, dtype=torch.bool, device=query.device).tril()  # [s_q, s_k]
    result = attention(query, key, value, mask=mask, bias=bias, scale=scaling, dropout_p=dropout, return_weights=True)
    weights = result.weights
    assert weights is not None  # asked for with return_weights=True
    recorder = _RECORDER.get()
    if recorder is not None:
        recorder.append((module, weights.detach()))
    return result.output.transpose(1, 2).contiguous(), weights  # [b, s_q, h, d_v], [b, h, s_q, s_k]


def _register() -> None:
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, capture_attention_forward)
    # Without a mask builder under the same name, transformers builds no mask at all for an
    # unknown implementation and padding is silently ignored.
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)


def _implementation_tree(config: Any) -> str | dict:
    """The attention implementation of a config and its sub-configs, in the form
    ``set_attn_implementation`` accepts, so that composite models are restored exactly."""
    subs = {key: getattr(config, key) for key in getattr(config, "sub_configs", {})}
    subs = {key: _implementation_tree(sub) for key, sub in subs.items() if sub is not None}
    if not subs:
        return config._attn_implementation
    return {"": config._attn_implementation, **subs}
