"""LLaMA-family checkpoints (SmolLM2, Llama 2 and 3, and friends) on
:class:`attnkit.nn.DecoderLM`.

A LLaMA block is exactly a pre-norm :class:`attnkit.nn.DecoderLayer` with RMSNorm, rotary
positions in the half-split layout, grouped-query attention, SwiGLU and no biases; the
head shares the token embedding when ``tie_word_embeddings`` is set. Rotary scaling of
type ``linear``, ``llama3`` (Llama 3.1 and later) and ``dynamic`` is read from
``rope_parameters`` (or transformers 4's ``rope_scaling``); ``attention_bias`` and
``mlp_bias`` give the projections biases. Only the key names differ from Hugging Face's
``LlamaForCausalLM``:

=====================================================  ==========================================
Hugging Face                                           attnkit
=====================================================  ==========================================
``model.embed_tokens``                                 ``token_embedding``
``model.layers.N.input_layernorm``                     ``decoder.layers.N.self_attn_norm``
``model.layers.N.self_attn.{q,k,v}_proj``              ``decoder.layers.N.self_attn.{q,k,v}_proj``
``model.layers.N.self_attn.o_proj``                    ``decoder.layers.N.self_attn.out_proj``
``model.layers.N.post_attention_layernorm``            ``decoder.layers.N.ff_norm``
``model.layers.N.mlp.{gate,up,down}_proj``             ``decoder.layers.N.ff.{gate,up,down}_proj``
``model.norm``                                         ``decoder.final_norm``
``lm_head`` (absent when tied)                         ``lm_head``
=====================================================  ==========================================
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from torch import Tensor

from attnkit.models.checkpoints.config_reader import ConfigReader
from attnkit.models.families.decoder import DecoderConfig, decoder_family, rename_decoder_tensors

# Hugging Face's names → attnkit's, inside layer N (``model.layers.N.``).
LAYER_KEYS = {
    "input_layernorm": "self_attn_norm",
    "self_attn.q_proj": "self_attn.q_proj",
    "self_attn.k_proj": "self_attn.k_proj",
    "self_attn.v_proj": "self_attn.v_proj",
    "self_attn.o_proj": "self_attn.out_proj",
    "post_attention_layernorm": "ff_norm",
    "mlp.gate_proj": "ff.gate_proj",
    "mlp.up_proj": "ff.up_proj",
    "mlp.down_proj": "ff.down_proj",
}
_LAYER_KEY = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|bias|e_score_correction_bias)")
_OUTER_KEYS = {"model.embed_tokens.weight": "token_embedding.weight", "model.norm.weight": "decoder.final_norm.weight"}
# Rotary frequencies that some checkpoints saved: recomputed from the configuration.
_FREQUENCIES_KEY = re.compile(r".*rotary_emb\.inv_freq")


def read_config(config: dict[str, Any], *, path: Path = Path("config.json")) -> DecoderConfig:
    """Read a Hugging Face ``LlamaConfig`` dict (transformers 4 or 5 layout).

    Args:
        config: the parsed ``config.json``.
        path: its file, named in errors.

    Raises:
        CheckpointError: a missing size, one that is not an integer within
            :data:`attnkit.models.checkpoints.config_reader.CONFIG_LIMITS`, or a feature attnkit does
            not implement (rotary scaling other than linear, llama3 and dynamic, an
            activation other than SiLU); the message names the field.
    """
    return llama_like_config(ConfigReader(config, path))


def llama_like_config(read: ConfigReader, **options: Any) -> DecoderConfig:
    """The :class:`attnkit.models.families.decoder.DecoderConfig` of a LLaMA block as the
    ``config.json`` describes it (sizes, rotary, biases, windows), with ``options`` set on
    top: what the families built on LLaMA's layout (Qwen, Mistral, Phi 3) add.

    Raises:
        CheckpointError: as :func:`read_config`.
    """
    hidden = read.size("hidden_size")
    vocab = read.size("vocab_size")
    layers = read.size("num_hidden_layers")
    heads, kv_heads, head_dim = read.heads(hidden)
    rope, partial = read.rope(head_dim=head_dim)
    bias = read.flag("attention_bias", False)
    fields: dict[str, Any] = {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "num_layers": layers,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate_size": read.size("intermediate_size"),
        "max_length": read.context_length(rope, 2048),
        "tie_embeddings": read.flag("tie_word_embeddings", False),
        "eos_token_ids": read.eos(vocab),
        "activation": read.choice("hidden_act", {"silu": "swiglu"}, "silu"),
        "norm": "rms",
        "norm_eps": read.number("rms_norm_eps", 1e-6, high=1.0),
        "positional": "rotary",
        "rotary_dim": int(head_dim * partial),
        "ropes": (rope,) * layers,
        "windows": read.windows(layers, sliding_by_default=False),
        "qkv_bias": bias,
        "out_bias": bias,
        "mlp_bias": read.flag("mlp_bias", False),
    }
    return DecoderConfig(**(fields | options))


def state_dict_from_hf(tensors: dict[str, Tensor], config: DecoderConfig) -> tuple[dict[str, Tensor], list[str]]:
    """Rename a Hugging Face LLaMA-layout state dict to :class:`attnkit.nn.DecoderLM` keys.

    Args:
        tensors: the checkpoint's tensors.
        config: its configuration.

    Returns:
        ``(state, unknown)``: the renamed tensors, and the checkpoint keys with no place in
        the model. With tied embeddings the head gets the embedding matrix.
    """
    return rename_llama_layout(tensors, config, LAYER_KEYS)


def rename_llama_layout(
    tensors: dict[str, Tensor], config: DecoderConfig, layer_keys: dict[str, str]
) -> tuple[dict[str, Tensor], list[str]]:
    """Rename ``model.embed_tokens``, ``model.layers.N.<layer_keys>``, ``model.norm`` and
    ``lm_head`` to :class:`attnkit.nn.DecoderLM` keys (the layout of LLaMA and of the
    families that copied it).

    Returns:
        ``(state, unknown)`` as :func:`state_dict_from_hf`.
    """

    def rename(key: str, value: Tensor) -> dict[str, Tensor] | None:
        match = _LAYER_KEY.fullmatch(key)
        if match and match.group(2) in layer_keys:
            return {f"decoder.layers.{match.group(1)}.{layer_keys[match.group(2)]}.{match.group(3)}": value}
        outer = _OUTER_KEYS.get(key)
        return None if outer is None else {outer: value}

    return rename_decoder_tensors(tensors, config, rename, dropped=_FREQUENCIES_KEY)


FAMILY = decoder_family(
    name="llama",
    model_type="llama",
    read_config=read_config,
    state_dict_from_hf=state_dict_from_hf,
    summary="RMSNorm, rotary (linear, llama3 and dynamic scaling), grouped-query attention, SwiGLU",
)
