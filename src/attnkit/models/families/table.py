"""The model families :func:`attnkit.models.load` knows, by the ``model_type`` of
``config.json``: the one table a new family file is added to."""

from __future__ import annotations

from attnkit.models.checkpoints.errors import short_repr
from attnkit.models.families import (
    bart,
    bert,
    deepseek_v3,
    gemma2,
    gemma3,
    gpt2,
    gpt_neox,
    llama,
    mistral,
    mixtral,
    phi3,
    qwen2,
    qwen2_moe,
    qwen3,
    qwen3_moe,
    t5,
    trained,
)
from attnkit.models.families.family import ModelFamily

FAMILIES: dict[str, ModelFamily] = {
    family.model_type: family
    for family in (
        llama.FAMILY,
        bert.FAMILY,
        gpt2.FAMILY,
        gpt_neox.FAMILY,
        qwen2.FAMILY,
        qwen3.FAMILY,
        mistral.FAMILY,
        gemma2.FAMILY,
        gemma3.FAMILY,
        phi3.FAMILY,
        mixtral.FAMILY,
        qwen2_moe.FAMILY,
        qwen3_moe.FAMILY,
        deepseek_v3.FAMILY,
        t5.FAMILY,
        bart.FAMILY,
        trained.FAMILY,
    )
}

# The architectures the test suite checks through the bridge (attnkit.models.families.bridge) against transformers, with what
# their blocks add (``attnkit models families``); any other causal language model of
# transformers is tried at load.
TESTED_BRIDGES: dict[str, str] = {
    "olmo": "clipped q/k/v projections, non-parametric LayerNorm",
    "olmo2": "per-head query/key RMSNorm, norms after attention and MLP",
    "granite": "scaled embeddings, attention, residuals and logits",
    "granitemoe": "Granite's scalings, mixture of experts",
    "cohere": "parallel attention and MLP, query/key LayerNorm, scaled logits",
    "cohere2": "sliding window on some layers, no rotary on the others",
    "stablelm": "partial rotary, per-head query/key LayerNorm",
    "starcoder2": "sliding window, biases, GELU MLP",
    "phi": "partial rotary, parallel attention and MLP",
    "gpt_bigcode": "multi-query attention, learned positions",
    "exaone4": "sliding window on some layers, query/key RMSNorm, norms after blocks",
    "glm4": "partial rotary (interleaved), norms after blocks",
    "smollm3": "no rotary on every fourth layer",
    "nemotron": "partial rotary, LayerNorm1P, squared-ReLU MLP",
}


def unsupported_model_type(model_type: object, why: str = "") -> str:
    """The message for a ``config.json`` whose ``model_type`` no family loads (and, with
    ``why``, that the bridge refuses): what is supported, and what reads any
    ``transformers`` model instead."""
    return (
        f"model_type {short_repr(model_type)} is not supported{why}; attnkit loads {', '.join(FAMILIES)} checkpoints "
        "on its own modules, and the causal language models of transformers (when installed) through the bridge "
        "(`attnkit models families` shows both). Any other transformers model: capture its attention with "
        "attnkit.inspect.capture"
    )
