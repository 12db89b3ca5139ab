"""Gemma 2 and Gemma 3 (text) checkpoints on :class:`attnkit.nn.DecoderLM`.

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

Gemma 3's text model (``model_type`` ``gemma3_text``) is the same block with a per-head
``(1 + w)`` RMSNorm on queries and keys, no soft-capping unless configured, five local
layers per global one, and other rotary frequencies on local layers
(``rope_parameters["sliding_attention"]``, or ``rope_local_base_freq``) than on global ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor

from attnkit.models.checkpoints.config_reader import ConfigReader, Rope
from attnkit.models.families.decoder import DecoderConfig, decoder_family
from attnkit.models.families.llama import LAYER_KEYS, rename_llama_layout

_LAYER_KEYS = LAYER_KEYS | {
    "post_attention_layernorm": "self_attn_out_norm",
    "pre_feedforward_layernorm": "ff_norm",
    "post_feedforward_layernorm": "ff_out_norm",
}
_GEMMA3_LAYER_KEYS = _LAYER_KEYS | {"self_attn.q_norm": "self_attn.q_norm", "self_attn.k_norm": "self_attn.k_norm"}
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
    return _gemma_config(read, ropes=(rope,) * read.size("num_hidden_layers"), qk_norm=False)


def read_gemma3_config(config: dict[str, Any], *, path: Path = Path("config.json")) -> DecoderConfig:
    """Read a Hugging Face ``Gemma3TextConfig`` dict (transformers 4 or 5 layout).

    Raises:
        CheckpointError: as :func:`read_config`.
    """
    read = ConfigReader(config, path)
    layers = read.size("num_hidden_layers")
    _, _, head_dim = read.heads(read.size("hidden_size"))
    windows = read.windows(layers, sliding_by_default=False)
    global_rope, _ = read.rope(head_dim=head_dim, layer_type="full_attention")
    if "rope_local_base_freq" in config:  # transformers 4: default rotary with its own base
        local_rope = Rope(read.number("rope_local_base_freq", 10000.0, low=1.0))
    else:
        local_rope, _ = read.rope(head_dim=head_dim, layer_type="sliding_attention")
    ropes = tuple(global_rope if window is None else local_rope for window in windows)
    return _gemma_config(read, ropes=ropes, qk_norm=True)


def _gemma_config(read: ConfigReader, *, ropes: tuple[Rope, ...], qk_norm: bool) -> DecoderConfig:
    """What Gemma 2 and 3 read alike."""
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
    """Rename a Hugging Face Gemma 2 or Gemma 3 (text) state dict to
    :class:`attnkit.nn.DecoderLM` keys.

    Returns:
        ``(state, unknown)``: the renamed tensors, and the checkpoint keys with no place.
    """
    return rename_llama_layout(tensors, config, _GEMMA3_LAYER_KEYS if config.qk_norm else _LAYER_KEYS)


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

GEMMA3_TEXT = decoder_family(
    name="gemma3_text",
    model_type="gemma3_text",
    read_config=read_gemma3_config,
    state_dict_from_hf=state_dict_from_hf,
    summary=(
        "Gemma 2's block with a per-head (1 + w) RMSNorm on queries and keys, five local layers per global one, "
        "other rotary frequencies on local layers"
    ),
)
