"""Gemma 2 checkpoints on :class:`attnkit.nn.DecoderLM`.

A Gemma 2 block is a LLaMA block (same tensor names for the projections) with:

- RMSNorms that scale by ``1 + weight``, in float32 (``norm="rms_plus_one"``), and four of
  them per layer: before and after attention, before and after the feed-forward
  (``pre_feedforward_layernorm`` is attnkit's ``ff_norm``; the two after are
  ``self_attn_out_norm`` and ``ff_out_norm``);
- GeGLU with GELU's tanh approximation;
- token embeddings multiplied by ``√hidden_size``;
- the score scale ``query_pre_attn_scalar ** -0.5`` and an explicit ``head_dim``;
- attention logit soft-capping (``attn_logit_softcapping``) and final logit soft-capping
  (``final_logit_softcapping``);
- a sliding window on the layers ``layer_types`` marks ``"sliding_attention"`` (every
  other layer), through :mod:`attnkit.masks`.

Gemma 3 (:mod:`attnkit.models.families.gemma3`) is this block with a few changes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor

from attnkit.models.checkpoints.config_reader import ConfigReader, Rope
from attnkit.models.families.decoder import DecoderConfig, decoder_family
from attnkit.models.families.llama import LAYER_KEYS, rename_llama_layout

GEMMA2_LAYER_KEYS = LAYER_KEYS | {
    "post_attention_layernorm": "self_attn_out_norm",
    "pre_feedforward_layernorm": "ff_norm",
    "post_feedforward_layernorm": "ff_out_norm",
}
_ACTIVATIONS = {"gelu_pytorch_tanh": "geglu_tanh", "gelu_new": "geglu_tanh", "gelu_fast": "geglu_tanh", "gelu": "geglu"}


def read_config(config: dict[str, Any], *, path: Path = Path("config.json")) -> DecoderConfig:
    """Read a Hugging Face ``Gemma2Config`` dict.

    Raises:
        CheckpointError: a missing or out-of-range size, or a feature attnkit does not
            implement (bidirectional attention, an activation other than GELU, rotary
            scaling other than linear, llama3 and dynamic); the message names the field.
    """
    read = ConfigReader(config, path)
    _, _, head_dim = read.heads(read.size("hidden_size"))
    rope, _ = read.rope(head_dim=head_dim)
    return gemma_config(read, ropes=(rope,) * read.size("num_hidden_layers"), qk_norm=False)


def gemma_config(read: ConfigReader, *, ropes: tuple[Rope, ...], qk_norm: bool) -> DecoderConfig:
    """What Gemma 2 and 3 read alike, given the rotary encoding of each layer and whether
    queries and keys have a per-head norm."""
    read.no_flags("use_bidirectional_attention", "attention_bias")
    hidden, vocab, layers = read.size("hidden_size"), read.size("vocab_size"), read.size("num_hidden_layers")
    heads, kv_heads, head_dim = read.heads(hidden)
    activation_key = "hidden_activation" if read.config.get("hidden_activation") is not None else "hidden_act"
    return DecoderConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=read.size("intermediate_size"),
        max_length=read.size("max_position_embeddings", 8192),
        tie_embeddings=read.flag("tie_word_embeddings", True),
        eos_token_ids=read.eos(vocab),
        activation=read.choice(activation_key, _ACTIVATIONS, "gelu_pytorch_tanh"),
        norm="rms_plus_one",
        norm_eps=read.number("rms_norm_eps", 1e-6, high=1.0),
        positional="rotary",
        rotary_dim=head_dim,
        ropes=ropes,
        windows=read.windows(layers, sliding_by_default=False),
        qk_norm=qk_norm,
        output_norms=True,
        attention_scale=read.number("query_pre_attn_scalar", head_dim) ** -0.5,
        attention_softcap=read.optional_number("attn_logit_softcapping"),
        logit_softcap=read.optional_number("final_logit_softcapping"),
        embedding_scale=hidden**0.5,
    )


def state_dict_from_hf(tensors: dict[str, Tensor], config: DecoderConfig) -> tuple[dict[str, Tensor], list[str]]:
    """Rename a Hugging Face Gemma 2 state dict to :class:`attnkit.nn.DecoderLM` keys.

    Returns:
        ``(state, unknown)``: the renamed tensors, and the checkpoint keys with no place.
    """
    return rename_llama_layout(tensors, config, GEMMA2_LAYER_KEYS)


FAMILY = decoder_family(
    name="gemma2",
    model_type="gemma2",
    read_config=read_config,
    state_dict_from_hf=state_dict_from_hf,
    summary=(
        "(1 + w) RMSNorms before and after each sublayer, GeGLU, scaled embeddings, query_pre_attn_scalar, "
        "attention and final logit soft-capping, sliding window on alternate layers"
    ),
)
