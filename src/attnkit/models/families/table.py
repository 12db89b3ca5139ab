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


def unsupported_model_type(model_type: object) -> str:
    """The message for a ``config.json`` whose ``model_type`` no family loads: what is
    supported, and what reads any ``transformers`` model instead."""
    return (
        f"model_type {short_repr(model_type)} is not supported; attnkit loads {', '.join(FAMILIES)} checkpoints "
        "(`attnkit models families` shows what each adds). Any other transformers model: capture its "
        "attention with attnkit.inspect.capture"
    )


def families_table() -> list[tuple[str, str, str]]:
    """``(model_type, kind, what it adds)`` of every family, in the table's order."""
    return [(family.model_type, _kind(family), family.summary) for family in FAMILIES.values()]


def _kind(family: ModelFamily) -> str:
    """``decoder``, ``encoder`` or ``encoder-decoder``."""
    if family.encoder_decoder:
        return "encoder-decoder"
    return "decoder" if family.causal else "encoder"
