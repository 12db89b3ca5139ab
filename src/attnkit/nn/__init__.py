"""``attnkit.nn``: attention modules and Transformers, thin layers over
:mod:`attnkit.functional`.

Layout is batch-first, ``[b, s, e]`` for token sequences and ``[b, h, s, d]`` inside
attention; masks say ``True`` = may attend. Modules never store attention weights: pass
``return_weights=True`` to get a typed record (:mod:`attnkit.nn.records`).

- Attention: :class:`MultiHeadAttention` (self/cross, GQA, KV cache, hook points) built
  from an :class:`AttentionConfig` (:class:`Attention`: the same layer without hook points), :class:`MultiHeadLatentAttention` (DeepSeek's MLA, a cache of
  latents) from a :class:`LatentAttentionConfig`,
  :class:`AdditiveAttention`, :class:`LuongAttention`.
- Positional encodings: :class:`SinusoidalPositionalEncoding`,
  :class:`LearnedPositionalEmbedding`, :class:`RotaryEmbedding`, :class:`ALiBi`,
  :class:`RelativePositionBias`.
- Building blocks: :class:`RMSNorm`, :class:`FeedForward`, :class:`MixtureOfExperts`
  (a :class:`Router` from a :class:`RouterConfig`, experts, shared experts), :class:`KVCache`,
  :func:`pack_projections` (one matrix product for q/k/v and for SwiGLU's gate/up in
  a decoding step).
- Transformers: :class:`EncoderLayer`, :class:`DecoderLayer` (from a :class:`LayerConfig`),
  :class:`Encoder`, :class:`Decoder`, :class:`Transformer` (a :class:`TransformerConfig`),
  :class:`DecoderLM` (a :class:`DecoderLMConfig`), :class:`EncoderDecoderLM` (over token
  ids, with :class:`SequenceEmbedding` and :class:`LMHead`; :func:`paper_transformer`
  builds the paper's). Each config is a frozen dataclass checked when it is made.
- Hooks: :class:`HookPoint` (named points inside every module above where hooks read or
  replace activations), :class:`HookedModule` (``hook_names``, ``hooks``,
  ``run_with_cache``), :class:`ActivationCache`; see :mod:`attnkit.nn.hooks`.
"""

from attnkit.functional.kernels import KERNELS
from attnkit.nn.activation_cache import ActivationCache
from attnkit.nn.attention import Attention, AttentionConfig
from attnkit.nn.encoder_decoder import (
    EncoderDecoderLM,
    LMHead,
    SequenceEmbedding,
    paper_transformer,
    source_padding_mask,
)
from attnkit.nn.feedforward import FeedForward
from attnkit.nn.hooked_attention import MultiHeadAttention
from attnkit.nn.hooks import HookedModule, HookPoint
from attnkit.nn.kv_cache import DecoderCache, KVCache
from attnkit.nn.latent_attention import LatentAttentionConfig, MultiHeadLatentAttention
from attnkit.nn.layers import DecoderLayer, EncoderLayer, LayerConfig
from attnkit.nn.lm import DecoderLM, DecoderLMConfig, pick_next_token
from attnkit.nn.moe import MixtureOfExperts, Router, RouterConfig, ablate_experts
from attnkit.nn.norms import LayerNorm, RMSNorm, make_norm
from attnkit.nn.packing import PackedLinears, pack_projections
from attnkit.nn.positional import (
    ALiBi,
    AttentionPositional,
    LearnedPositionalEmbedding,
    RelativePositionBias,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    alibi_slopes,
    relative_position_bucket,
)
from attnkit.nn.records import (
    AttentionContext,
    EncoderDecoderLMOutput,
    LayerOutput,
    LayerWeights,
    LMOutput,
    MultiHeadOutput,
    StackOutput,
    TransformerOutput,
)
from attnkit.nn.rnn_attention import AdditiveAttention, AttentionScore, LuongAttention
from attnkit.nn.torch_compat import mask_from_torch
from attnkit.nn.transformer import (
    Decoder,
    Encoder,
    LayerSelection,
    Transformer,
    TransformerConfig,
    selected_layers,
)
from attnkit.nn.weight_selection import WeightSelection

__all__ = [
    "KERNELS",
    "ALiBi",
    "ActivationCache",
    "AdditiveAttention",
    "Attention",
    "AttentionConfig",
    "AttentionContext",
    "AttentionPositional",
    "AttentionScore",
    "Decoder",
    "DecoderCache",
    "DecoderLM",
    "DecoderLMConfig",
    "DecoderLayer",
    "Encoder",
    "EncoderDecoderLM",
    "EncoderDecoderLMOutput",
    "EncoderLayer",
    "FeedForward",
    "HookPoint",
    "HookedModule",
    "KVCache",
    "LMHead",
    "LMOutput",
    "LatentAttentionConfig",
    "LayerConfig",
    "LayerNorm",
    "LayerOutput",
    "LayerSelection",
    "LayerWeights",
    "LearnedPositionalEmbedding",
    "LuongAttention",
    "MixtureOfExperts",
    "MultiHeadAttention",
    "MultiHeadLatentAttention",
    "MultiHeadOutput",
    "PackedLinears",
    "RMSNorm",
    "RelativePositionBias",
    "RotaryEmbedding",
    "Router",
    "RouterConfig",
    "SequenceEmbedding",
    "SinusoidalPositionalEncoding",
    "StackOutput",
    "Transformer",
    "TransformerConfig",
    "TransformerOutput",
    "WeightSelection",
    "ablate_experts",
    "alibi_slopes",
    "make_norm",
    "mask_from_torch",
    "pack_projections",
    "paper_transformer",
    "pick_next_token",
    "relative_position_bucket",
    "selected_layers",
    "source_padding_mask",
]
