"""GPT-NeoX checkpoints (Pythia and friends) on :class:`attnkit.nn.DecoderLM`.

A GPT-NeoX block is a pre-norm :class:`attnkit.nn.DecoderLayer` with LayerNorm, biases
everywhere and exact GELU whose attention and feed-forward run in parallel
(``use_parallel_residual``: ``x + attn(ln1(x)) + mlp(ln2(x))``), and whose rotary encoding
turns only the first ``rotary_pct`` of each head (partial rotary). The query, key and
value projections are one matrix whose rows are grouped by head (``[h, 3, d]``: each
head's query, key and value rows in turn); it is split at load:

===============================================  ==============================================
Hugging Face                                     attnkit
===============================================  ==============================================
``gpt_neox.embed_in``                            ``token_embedding``
``gpt_neox.layers.N.input_layernorm``            ``decoder.layers.N.self_attn_norm``
``gpt_neox.layers.N.attention.query_key_value``  ``decoder.layers.N.self_attn.{q,k,v}_proj``
``gpt_neox.layers.N.attention.dense``            ``decoder.layers.N.self_attn.out_proj``
``gpt_neox.layers.N.post_attention_layernorm``   ``decoder.layers.N.ff_norm``
``gpt_neox.layers.N.mlp.dense_h_to_4h``          ``decoder.layers.N.ff.up_proj``
``gpt_neox.layers.N.mlp.dense_4h_to_h``          ``decoder.layers.N.ff.down_proj``
``gpt_neox.final_layer_norm``                    ``decoder.final_norm``
``embed_out``                                    ``lm_head``
===============================================  ==============================================
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from torch import Tensor

from attnkit.models.checkpoints.config_reader import ConfigReader
from attnkit.models.families.decoder import DecoderConfig, decoder_family, rename_decoder_tensors

_LAYER_KEYS = {
    "input_layernorm": "self_attn_norm",
    "attention.dense": "self_attn.out_proj",
    "post_attention_layernorm": "ff_norm",
    "mlp.dense_h_to_4h": "ff.up_proj",
    "mlp.dense_4h_to_h": "ff.down_proj",
}
_LAYER_KEY = re.compile(r"gpt_neox\.layers\.(\d+)\.(.+)\.(weight|bias)")
# Buffers that old checkpoints saved with the weights: causal masks and frequencies.
_BUFFER_KEY = re.compile(r"gpt_neox\.layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)")
_OUTER_KEYS = {
    "gpt_neox.embed_in.weight": "token_embedding.weight",
    "gpt_neox.final_layer_norm.weight": "decoder.final_norm.weight",
    "gpt_neox.final_layer_norm.bias": "decoder.final_norm.bias",
}
_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh"}
# transformers 4's names of the rotary fields.
_OLDER_NAMES = {"rope_theta": "rotary_emb_base", "partial_rotary_factor": "rotary_pct"}


def read_config(config: dict[str, Any], *, path: Path = Path("config.json")) -> DecoderConfig:
    """Read a Hugging Face ``GPTNeoXConfig`` dict (``rotary_pct`` and ``rotary_emb_base`` of
    transformers 4, or ``rope_parameters`` of 5).

    Raises:
        CheckpointError: a missing or out-of-range size, or a feature attnkit does not
            implement (rotary scaling other than linear and dynamic, an activation other
            than GELU); the message names the field.
    """
    read = ConfigReader(config, path, aliases=_OLDER_NAMES)
    hidden, vocab, layers = read.size("hidden_size"), read.size("vocab_size"), read.size("num_hidden_layers")
    heads, _, head_dim = read.heads(hidden)
    rope, partial = read.rope(head_dim=head_dim)
    bias = read.flag("attention_bias", True)
    return DecoderConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=head_dim,
        intermediate_size=read.size("intermediate_size"),
        max_length=read.context_length(rope, 2048),
        tie_embeddings=read.flag("tie_word_embeddings", False),
        eos_token_ids=read.eos(vocab),
        activation=read.choice("hidden_act", _ACTIVATIONS, "gelu"),
        norm="layer",
        norm_eps=read.number("layer_norm_eps", 1e-5, high=1.0),
        positional="rotary",
        rotary_dim=int(head_dim * partial),
        ropes=(rope,) * layers,
        windows=(None,) * layers,
        qkv_bias=bias,
        out_bias=bias,
        mlp_bias=True,
        parallel=read.flag("use_parallel_residual", True),
    )


def state_dict_from_hf(tensors: dict[str, Tensor], config: DecoderConfig) -> tuple[dict[str, Tensor], list[str]]:
    """Rename (and split) a Hugging Face GPT-NeoX state dict to :class:`attnkit.nn.DecoderLM`
    keys.

    Returns:
        ``(state, unknown)``: the renamed tensors, and the checkpoint keys with no place in
        the model (saved buffers are dropped, not unknown).
    """
    h, d = config.num_heads, config.head_dim

    def rename(key: str, value: Tensor) -> dict[str, Tensor] | None:
        match = _LAYER_KEY.fullmatch(key)
        if match is None:
            outer = _OUTER_KEYS.get(key)
            return None if outer is None else {outer: value}
        layer, name, kind = match.groups()
        if name == "attention.query_key_value" and value.shape[0] == 3 * h * d:
            grouped = value.reshape(h, 3, d, *value.shape[1:])  # rows grouped by head: [h, 3, d, (e)]
            return {
                f"decoder.layers.{layer}.self_attn.{proj}.{kind}": grouped[:, i].reshape(h * d, *value.shape[1:])
                for i, proj in enumerate(("q_proj", "k_proj", "v_proj"))
            }
        if name in _LAYER_KEYS:
            return {f"decoder.layers.{layer}.{_LAYER_KEYS[name]}.{kind}": value}
        return None

    return rename_decoder_tensors(
        tensors, config, rename, head_keys=("embed_out.weight", "lm_head.weight"), dropped=_BUFFER_KEY
    )


FAMILY = decoder_family(
    name="gpt_neox",
    model_type="gpt_neox",
    read_config=read_config,
    state_dict_from_hf=state_dict_from_hf,
    summary="parallel attention and MLP, partial rotary (rotary_pct), LayerNorm and biases, fused grouped qkv",
)
