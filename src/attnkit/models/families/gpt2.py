"""GPT-2 checkpoints on :class:`attnkit.nn.DecoderLM`.

A GPT-2 block is a pre-norm :class:`attnkit.nn.DecoderLayer` with LayerNorm (with biases),
biases on every projection, GELU's tanh approximation (``gelu_new``) and learned absolute
positions added to the token embeddings; the head shares the token embedding. Hugging
Face stores GPT-2's projections as ``Conv1D`` weights ``[in, out]`` (the transpose of a
``Linear``'s) and its query, key and value projections as one ``c_attn`` matrix; they are
transposed and split at load:

==================================  ==============================================
Hugging Face (``transformer.`` optional)  attnkit
==================================  ==============================================
``wte``                             ``token_embedding``
``wpe``                             ``position``
``h.N.ln_1``                        ``decoder.layers.N.self_attn_norm``
``h.N.attn.c_attn``                 ``decoder.layers.N.self_attn.{q,k,v}_proj``
``h.N.attn.c_proj``                 ``decoder.layers.N.self_attn.out_proj``
``h.N.ln_2``                        ``decoder.layers.N.ff_norm``
``h.N.mlp.c_fc``                    ``decoder.layers.N.ff.up_proj``
``h.N.mlp.c_proj``                  ``decoder.layers.N.ff.down_proj``
``ln_f``                            ``decoder.final_norm``
==================================  ==============================================
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from torch import Tensor

from attnkit.models.checkpoints.config_reader import ConfigReader, Rope
from attnkit.models.families.decoder import DecoderConfig, decoder_family, rename_decoder_tensors

# Conv1D weights [in, out], transposed into Linear weights [out, in].
_CONV_KEYS = {"attn.c_proj": "self_attn.out_proj", "mlp.c_fc": "ff.up_proj", "mlp.c_proj": "ff.down_proj"}
_NORM_KEYS = {"ln_1": "self_attn_norm", "ln_2": "ff_norm"}
_LAYER_KEY = re.compile(r"h\.(\d+)\.(.+)\.(weight|bias)")
# The causal-mask buffers that old checkpoints saved with the weights.
_BUFFER_KEY = re.compile(r"(transformer\.)?h\.\d+\.attn\.(bias|masked_bias)")
_OUTER_KEYS = {
    "wte.weight": "token_embedding.weight",
    "wpe.weight": "position.weight",
    "ln_f.weight": "decoder.final_norm.weight",
    "ln_f.bias": "decoder.final_norm.bias",
}
_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh", "gelu": "gelu"}


def read_config(config: dict[str, Any], *, path: Path = Path("config.json")) -> DecoderConfig:
    """Read a Hugging Face ``GPT2Config`` dict.

    Raises:
        CheckpointError: a missing or out-of-range size, or a feature attnkit does not
            implement (``scale_attn_by_inverse_layer_idx``, cross-attention, an activation
            other than GELU); the message names the field.
    """
    read = ConfigReader(config, path)
    read.no_flags("scale_attn_by_inverse_layer_idx", "add_cross_attention")
    if not read.flag("scale_attn_weights", True):
        raise read.refuse("scale_attn_weights", "unscaled attention scores are not supported")
    hidden, heads, vocab = read.size("n_embd"), read.size("n_head"), read.size("vocab_size")
    if hidden % heads:
        raise read.refuse("n_head", f"n_embd={hidden} is not a multiple of {heads} heads")
    layers = read.size("n_layer")
    return DecoderConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=hidden // heads,
        intermediate_size=read.size("n_inner", 4 * hidden),
        max_length=read.size("n_positions", 1024, maximum=2**17),
        tie_embeddings=read.flag("tie_word_embeddings", True),
        eos_token_ids=read.eos(vocab),
        activation=read.choice("activation_function", _ACTIVATIONS, "gelu_new"),
        norm="layer",
        norm_eps=read.number("layer_norm_epsilon", 1e-5, high=1.0),
        positional="learned",
        rotary_dim=hidden // heads,
        ropes=(Rope(10000.0),) * layers,
        windows=(None,) * layers,
        qkv_bias=True,
        out_bias=True,
        mlp_bias=True,
    )


def state_dict_from_hf(tensors: dict[str, Tensor], config: DecoderConfig) -> tuple[dict[str, Tensor], list[str]]:
    """Rename (and transpose, and split) a Hugging Face GPT-2 state dict, with or without
    the ``transformer.`` prefix, to :class:`attnkit.nn.DecoderLM` keys.

    Returns:
        ``(state, unknown)``: the renamed tensors, and the checkpoint keys with no place in
        the model (saved causal-mask buffers are dropped, not unknown).
    """
    e = config.hidden_size

    def rename(key: str, value: Tensor) -> dict[str, Tensor] | None:
        bare = key.removeprefix("transformer.")
        match = _LAYER_KEY.fullmatch(bare)
        if match is None:
            outer = _OUTER_KEYS.get(bare)
            return None if outer is None else {outer: value}
        layer, name, kind = match.groups()
        prefix = f"decoder.layers.{layer}."
        if name == "attn.c_attn" and value.shape[-1] == 3 * e:
            pieces = value.split(e, dim=-1)  # [e, e] weights, or [e] biases, each
            return {
                f"{prefix}self_attn.{proj}.{kind}": piece.t() if kind == "weight" else piece
                for proj, piece in zip(("q_proj", "k_proj", "v_proj"), pieces)
            }
        if name in _CONV_KEYS:
            return {f"{prefix}{_CONV_KEYS[name]}.{kind}": value.t() if kind == "weight" else value}
        if name in _NORM_KEYS:
            return {f"{prefix}{_NORM_KEYS[name]}.{kind}": value}
        return None

    return rename_decoder_tensors(tensors, config, rename, dropped=_BUFFER_KEY)


FAMILY = decoder_family(
    name="gpt2",
    model_type="gpt2",
    read_config=read_config,
    state_dict_from_hf=state_dict_from_hf,
    summary="learned positions, LayerNorm with biases, biases everywhere, tanh-GELU, Conv1D weights",
)
