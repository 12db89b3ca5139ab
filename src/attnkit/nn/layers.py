"""Transformer layers: self-attention (and cross-attention) plus a feed-forward block,
each wrapped in a residual connection with normalisation ("Add & Norm").

Shape letters: ``b`` batch, ``h`` heads, ``s`` sequence length, ``s_src`` encoder (memory)
length, ``e`` model dim.

Two placements of the norm:

- **post-norm** (the paper, BERT): ``x = norm(x + dropout(sublayer(x)))``;
- **pre-norm** (GPT-2, LLaMA; ``norm_first=True``): ``x = x + dropout(sublayer(norm(x)))``,
  which keeps an identity path from input to output and trains deep stacks without warm-up
  tricks. A pre-norm stack needs a final norm after its last layer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field, fields
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.functional.kernels import KERNEL_SPECS, resolve_kernel_name
from attnkit.functional.masks import Mask
from attnkit.nn.attention import AttentionConfig, state_dict_from_torch_attention
from attnkit.nn.dropout import Dropout
from attnkit.nn.feedforward import ACTIVATIONS, Activation, FeedForward
from attnkit.nn.hooked_attention import MultiHeadAttention
from attnkit.nn.hooks import HookPoint
from attnkit.nn.kv_cache import KVCache
from attnkit.nn.norms import NORM_KINDS, NormKind, make_norm
from attnkit.nn.positional import AttentionPositional
from attnkit.nn.records import LayerOutput, LayerWeights, MultiHeadOutput, forward_of_record
from attnkit.nn.weight_selection import WeightSelection

MaskLike = Mask | Tensor
_Layer = TypeVar("_Layer", "EncoderLayer", "DecoderLayer")


@dataclass(frozen=True)
class LayerConfig:
    """What an :class:`EncoderLayer` or :class:`DecoderLayer` is built from, checked when
    the config is made. The defaults are the paper's post-norm layer.

    Args:
        embed_dim: model dim ``e``.
        num_heads: attention heads; must divide ``embed_dim``.
        ff_dim: hidden dim of the feed-forward block.
        num_kv_heads: key/value heads for grouped-query attention (default ``num_heads``).
        head_dim: the size of each head (default ``embed_dim / num_heads``).
        dropout: dropout on attention weights, feed-forward activations and each
            sublayer's output before the residual sum.
        activation: a name in :data:`attnkit.nn.feedforward.ACTIVATIONS`.
        norm: a name in :data:`attnkit.nn.norms.NORM_KINDS` (``"layer"``: LayerNorm,
            ``"rms"``: RMSNorm).
        norm_eps: the norms' epsilon (BERT: 1e-12).
        norm_first: pre-norm instead of the paper's post-norm.
        bias: biases in projections, feed-forward and LayerNorm.
        kernel: the attention kernel, see :class:`attnkit.nn.AttentionConfig`.
        kernel_options: its options, checked here (e.g. ``{"window": 256}`` for
            ``"local"``).
        attention_dropout: dropout on the attention weights; default ``dropout`` with the
            ``"auto"`` kernel, and 0 with the kernels that never materialise the weights
            (which refuse a value above 0).
        parallel: attention and feed-forward both read the layer's input and add to it,
            ``x + attn(norm(x)) + ff(ff_norm(x))`` (GPT-J, GPT-NeoX); pre-norm layers
            without cross-attention only.
        output_norms: also normalise each sublayer's output before the residual sum
            (``self_attn_out_norm``, ``ff_out_norm``; Gemma 2's pre- and post-norms).

    Raises:
        ValueError: inconsistent sizes, an unknown activation, norm or kernel, an
            ``attention_dropout`` above 0 for a kernel without weights, ``parallel`` with
            post-norm.
        TypeError: kernel options the kernel does not take or needs.
    """

    embed_dim: int
    num_heads: int
    ff_dim: int
    _: KW_ONLY
    num_kv_heads: int | None = None
    head_dim: int | None = None
    dropout: float = 0.1
    activation: Activation = "relu"
    norm: NormKind = "layer"
    norm_eps: float = 1e-5
    norm_first: bool = False
    bias: bool = True
    kernel: str = "auto"
    kernel_options: Mapping[str, Any] = field(default_factory=dict)
    attention_dropout: float | None = None
    parallel: bool = False
    output_norms: bool = False

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.norm not in NORM_KINDS:
            raise ValueError(f"norm must be one of {NORM_KINDS}, got {self.norm!r}")
        if self.parallel and not self.norm_first:
            raise ValueError(
                "parallel attention and feed-forward need a pre-norm layer without cross-attention, got norm_first=False"
            )
        self.attention()  # checks the sizes, the kernel and its options

    def layer(self) -> LayerConfig:
        """The options of one layer alone: this config, as a plain :class:`LayerConfig`
        (for a stack's config, :class:`attnkit.nn.TransformerConfig` or
        :class:`attnkit.nn.DecoderLMConfig`, the config of each of its layers)."""
        return LayerConfig(**{f.name: getattr(self, f.name) for f in fields(LayerConfig)})

    def attention(self) -> AttentionConfig:
        """The config of the attention modules a layer builds when it is not given them."""
        kernel = resolve_kernel_name(self.kernel)
        return AttentionConfig(
            self.embed_dim,
            self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            bias=self.bias,
            dropout=_attention_dropout(kernel, self.dropout, self.attention_dropout),
            kernel=kernel,
            kernel_options=self.kernel_options,
        )


class _ResidualLayer(nn.Module):
    """What both layer kinds are: self-attention, optional cross-attention and a
    feed-forward block, each with Add & Norm, and the hook points of the residual stream.
    :class:`EncoderLayer` and :class:`DecoderLayer` only say which inputs they take.

    Args:
        config: the layer's :class:`LayerConfig`.
        self_attn: the self-attention module.
        cross_attn: the cross-attention module, or ``None`` for a layer without one.
        ff: the feed-forward module (``[b, s, e]`` → ``[b, s, e]``), or ``None`` for a
            :class:`attnkit.nn.FeedForward` made from the config.

    Raises:
        ValueError: ``parallel`` with cross-attention, an attention module of another
            ``embed_dim``.
        TypeError: an attention module that is not a ``MultiHeadAttention``.
    """

    def __init__(
        self,
        config: LayerConfig,
        self_attn: MultiHeadAttention,
        cross_attn: MultiHeadAttention | None,
        ff: nn.Module | None = None,
    ):
        super().__init__()
        if config.parallel and cross_attn is not None:
            raise ValueError(
                "parallel attention and feed-forward need a pre-norm layer without cross-attention, got a "
                "cross-attention (build the layer with cross_attention=False)"
            )
        self.config = config
        self.norm_first = config.norm_first
        self.parallel = config.parallel
        e = config.embed_dim

        def norm() -> nn.Module:
            return make_norm(config.norm, e, config.norm_eps, bias=config.bias)

        # Hook points of the residual stream (attnkit.nn.hooks), registered in forward order;
        # a parallel layer has no stream between its sublayers.
        self.resid_pre = HookPoint()
        self.self_attn = _built_attention("self_attn", self_attn, e)
        self.self_attn_norm = norm()
        self.self_attn_out_norm = norm() if config.output_norms else None
        self.attn_out = HookPoint()
        self.resid_mid = None if config.parallel else HookPoint()
        self.cross_attn: MultiHeadAttention | None = None
        self.cross_attn_norm: nn.Module | None = None
        self.cross_attn_out: HookPoint | None = None
        self.resid_mid_cross: HookPoint | None = None
        if cross_attn is not None:
            self.cross_attn = _built_attention("cross_attn", cross_attn, e)
            self.cross_attn_norm = norm()
            self.cross_attn_out, self.resid_mid_cross = HookPoint(), HookPoint()
        self.ff = (
            FeedForward(e, config.ff_dim, activation=config.activation, bias=config.bias, dropout=config.dropout)
            if ff is None
            else ff
        )
        self.ff_norm = norm()
        self.ff_out_norm = norm() if config.output_norms else None
        self.mlp_out, self.resid_post = HookPoint(), HookPoint()
        self.dropout = Dropout(config.dropout)

    def _sublayer_input(self, x: Tensor, norm: nn.Module) -> Tensor:
        """What the sublayer sees: ``norm(x)`` in pre-norm, ``x`` itself in post-norm."""
        return norm(x) if self.norm_first else x

    def _add_and_norm(self, x: Tensor, sublayer_out: Tensor, norm: nn.Module) -> Tensor:
        """The residual sum, normalised afterwards in post-norm."""
        y = x + self.dropout(sublayer_out)
        return y if self.norm_first else norm(y)

    def _run(
        self,
        x: Tensor,
        memory: Tensor | None,
        *,
        mask: MaskLike | None,
        memory_mask: MaskLike | None,
        causal: bool,
        positions: Tensor | None,
        position_bias: Tensor | None,
        self_kv_cache: KVCache | None,
        cross_kv_cache: KVCache | None,
        return_weights: bool | WeightSelection,
    ) -> LayerOutput:
        """The one path both layer kinds run through (see :meth:`DecoderLayer.forward`)."""
        x = self.resid_pre(x)
        attn = _attention_record(
            self.self_attn(
                self._sublayer_input(x, self.self_attn_norm),
                mask=mask,
                causal=causal,
                positions=positions,
                kv_cache=self_kv_cache,
                position_bias=position_bias,
                return_weights=return_weights,
            )
        )
        attn_out = self.attn_out(_normed(self.self_attn_out_norm, attn.output))  # [b, s, e]
        if self.resid_mid is None:  # parallel: both sublayers read the layer's input
            ff_out = self.mlp_out(_normed(self.ff_out_norm, self.ff(self.ff_norm(x))))  # [b, s, e]
            x = self.resid_post(x + self.dropout(attn_out) + self.dropout(ff_out))
            return LayerOutput(x, LayerWeights(_asked_weights(attn)) if return_weights else None)
        x = self.resid_mid(self._add_and_norm(x, attn_out, self.self_attn_norm))
        cross_weights = None
        if self.cross_attn is not None:
            assert self.cross_attn_norm is not None and memory is not None
            assert self.cross_attn_out is not None and self.resid_mid_cross is not None
            cross = _attention_record(
                self.cross_attn(
                    self._sublayer_input(x, self.cross_attn_norm),
                    memory,
                    mask=memory_mask,
                    kv_cache=cross_kv_cache,
                    return_weights=return_weights.cross()
                    if isinstance(return_weights, WeightSelection)
                    else return_weights,
                )
            )
            x = self.resid_mid_cross(self._add_and_norm(x, self.cross_attn_out(cross.output), self.cross_attn_norm))
            cross_weights = cross.weights
        ff_out = self.mlp_out(_normed(self.ff_out_norm, self.ff(self._sublayer_input(x, self.ff_norm))))  # [b, s, e]
        x = self.resid_post(self._add_and_norm(x, ff_out, self.ff_norm))
        return LayerOutput(x, LayerWeights(_asked_weights(attn), cross_weights) if return_weights else None)


class EncoderLayer(_ResidualLayer):
    """Self-attention and feed-forward, each with Add & Norm (one of the paper's N = 6
    encoder layers; also a BERT layer).

    Args:
        config: the sizes and options, a :class:`LayerConfig`.
        positional: a rotary / ALiBi / relative-bias encoding for the self-attention.
        self_attn: a built self-attention module, used instead of one made from
            ``config.attention()`` and ``positional`` (unscaled scores, explicit head dims:
            see :class:`attnkit.nn.AttentionConfig`); its ``embed_dim`` must be the
            config's.

    Raises:
        ValueError: a ``self_attn`` of another ``embed_dim``.
        TypeError: a config that is not a ``LayerConfig``, a ``self_attn`` that is not a
            ``MultiHeadAttention``.
    """

    def __init__(
        self,
        config: LayerConfig,
        *,
        positional: AttentionPositional | None = None,
        self_attn: MultiHeadAttention | None = None,
    ) -> None:
        config = _layer_config(config)
        if self_attn is None:
            self_attn = MultiHeadAttention(config.attention(), positional=positional)
        super().__init__(config, self_attn, None)

    def forward_record(
        self,
        x: Tensor,
        *,
        mask: MaskLike | None = None,
        positions: Tensor | None = None,
        position_bias: Tensor | None = None,
        return_weights: bool | WeightSelection = False,
    ) -> LayerOutput:
        """Self-attention, then feed-forward, each with Add & Norm.

        Args:
            x: ``[b, s, e]``.
            mask: self-attention mask (``True`` = may attend), a Mask or a bool tensor
                broadcastable to ``[b, h, s, s]``; key padding is ``[b, 1, 1, s]``.
            positions: token positions for a rotary encoding, ``[s]`` or ``[b, s]``.
            position_bias: the self-attention's positional score bias ``[1, h, s, s]``,
                computed once by a stack for all its layers (see
                :meth:`attnkit.nn.MultiHeadAttention.forward`); ``None``: computed here.
            return_weights: also return the attention weights; a
                :class:`attnkit.nn.WeightSelection` those of its heads and rows alone
                (its ``cross_heads`` for the cross-attention).

        Returns:
            ``forward``: ``[b, s, e]``, or with ``return_weights`` a
            :class:`attnkit.nn.LayerOutput`. ``forward_record``: always the record (weights
            ``None`` unless asked for).
        """
        return self._run(
            x,
            None,
            mask=mask,
            memory_mask=None,
            causal=False,
            positions=positions,
            position_bias=position_bias,
            self_kv_cache=None,
            cross_kv_cache=None,
            return_weights=return_weights,
        )

    forward = forward_of_record(forward_record)

    @classmethod
    def from_torch(cls, m: nn.TransformerEncoderLayer) -> EncoderLayer:
        """An equivalent layer with a copy of the weights of ``nn.TransformerEncoderLayer``
        (batch-first regardless of ``m.batch_first``).

        Raises:
            TypeError: ``m`` is not an ``nn.TransformerEncoderLayer``.
            ValueError: its activation is neither ReLU nor GELU.
        """
        return _from_torch_layer(cls, m, nn.TransformerEncoderLayer, {"self_attn_norm": "norm1", "ff_norm": "norm2"})


class DecoderLayer(_ResidualLayer):
    """Masked self-attention, cross-attention to the encoder output, and feed-forward,
    each with Add & Norm. With ``cross_attention=False`` it is a decoder-only (GPT,
    LLaMA) block.

    Args:
        config: the sizes and options, a :class:`LayerConfig`.
        cross_attention: include the cross-attention sublayer.
        positional: a rotary / ALiBi / relative-bias encoding for the self-attention.
        self_attn: a built self-attention module, used instead of one made from
            ``config.attention()`` and ``positional`` (for per-head norms, soft-capping,
            windows, explicit head dims: see :class:`attnkit.nn.AttentionConfig`); its
            ``embed_dim`` must be the config's.
        cross_attn: a built cross-attention module, used instead of one made from
            ``config.attention()`` (T5's unscaled scores and explicit head dims); needs
            ``cross_attention=True`` and the config's ``embed_dim``.
        ff: a built feed-forward module (``[b, s, e]`` → ``[b, s, e]``), used instead of
            the :class:`attnkit.nn.FeedForward` of the config: a mixture of experts
            (:class:`attnkit.nn.MixtureOfExperts`), or a dense block of another hidden size.

    Raises:
        ValueError: ``config.parallel`` with cross-attention, ``cross_attn`` without it,
            an attention module of another ``embed_dim``.
        TypeError: a config that is not a ``LayerConfig``, a ``self_attn`` or
            ``cross_attn`` that is not a ``MultiHeadAttention``.
    """

    def __init__(
        self,
        config: LayerConfig,
        *,
        cross_attention: bool = True,
        positional: AttentionPositional | None = None,
        self_attn: MultiHeadAttention | None = None,
        cross_attn: MultiHeadAttention | None = None,
        ff: nn.Module | None = None,
    ) -> None:
        if cross_attn is not None and not cross_attention:
            raise ValueError("cross_attn was given to a layer built with cross_attention=False")
        config = _layer_config(config)
        if self_attn is None:
            self_attn = MultiHeadAttention(config.attention(), positional=positional)
        if cross_attention and cross_attn is None:
            cross_attn = MultiHeadAttention(config.attention())
        super().__init__(config, self_attn, cross_attn, ff)

    def forward_record(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        mask: MaskLike | None = None,
        memory_mask: MaskLike | None = None,
        causal: bool = True,
        positions: Tensor | None = None,
        position_bias: Tensor | None = None,
        self_kv_cache: KVCache | None = None,
        cross_kv_cache: KVCache | None = None,
        return_weights: bool | WeightSelection = False,
    ) -> LayerOutput:
        """Masked self-attention, cross-attention to ``memory`` (if the layer has it), then
        feed-forward, each with Add & Norm.

        Args:
            x: ``[b, s, e]`` (the new tokens only, when decoding with a cache).
            memory: encoder output ``[b, s_src, e]``; required with cross-attention, and
                must be ``None`` without.
            mask: self-attention mask (``True`` = may attend), broadcastable to
                ``[b, h, s, s_k]``.
            memory_mask: cross-attention mask, broadcastable to ``[b, h, s, s_src]``
                (source padding: ``[b, 1, 1, s_src]``).
            causal: apply the causal mask in self-attention (bottom-right aligned).
            positions: token positions for a rotary encoding, ``[s]`` or ``[b, s]``.
            position_bias: the self-attention's positional score bias ``[1, h, s, s_k]``,
                computed once by a stack for all its layers (see
                :meth:`attnkit.nn.MultiHeadAttention.forward`); ``None``: computed here.
            self_kv_cache: KV cache of the self-attention.
            cross_kv_cache: KV cache of the cross-attention (filled once from ``memory``).
            return_weights: also return the attention weights; a
                :class:`attnkit.nn.WeightSelection` those of its heads and rows alone
                (its ``cross_heads`` for the cross-attention).

        Returns:
            ``forward``: ``[b, s, e]``, or with ``return_weights`` a
            :class:`attnkit.nn.LayerOutput` whose weights have ``cross_attention`` set when
            the layer has one. ``forward_record``: always the record (weights ``None``
            unless asked for), the one path the layer runs through.

        Raises:
            ValueError: ``memory`` given to a layer without cross-attention or missing for
                one with it (and the errors of the attention modules).
        """
        if (memory is None) != (self.cross_attn is None):
            raise ValueError(
                "memory is required by a decoder layer with cross-attention and not accepted without one; "
                f"this layer has cross_attention={self.cross_attn is not None}, memory given: {memory is not None}"
            )
        return self._run(
            x,
            memory,
            mask=mask,
            memory_mask=memory_mask,
            causal=causal,
            positions=positions,
            position_bias=position_bias,
            self_kv_cache=self_kv_cache,
            cross_kv_cache=cross_kv_cache,
            return_weights=return_weights,
        )

    forward = forward_of_record(forward_record)

    @classmethod
    def from_torch(cls, m: nn.TransformerDecoderLayer) -> DecoderLayer:
        """An equivalent layer with a copy of the weights of ``nn.TransformerDecoderLayer``
        (batch-first regardless of ``m.batch_first``).

        Raises:
            TypeError: ``m`` is not an ``nn.TransformerDecoderLayer``.
            ValueError: its activation is neither ReLU nor GELU.
        """
        return _from_torch_layer(
            cls,
            m,
            nn.TransformerDecoderLayer,
            {"self_attn_norm": "norm1", "cross_attn_norm": "norm2", "ff_norm": "norm3"},
            cross_attention="multihead_attn",
        )


def _layer_config(config: LayerConfig) -> LayerConfig:
    """``config``, checked to be a :class:`LayerConfig`.

    Raises:
        TypeError: another kind of value.
    """
    if not isinstance(config, LayerConfig):
        raise TypeError(f"config must be an attnkit.nn.LayerConfig, got {type(config).__name__}")
    return config


def _built_attention(name: str, module: MultiHeadAttention, embed_dim: int) -> MultiHeadAttention:
    """A layer's attention module given built: a ``MultiHeadAttention`` of the layer's dim.

    Raises:
        TypeError: another kind of module.
        ValueError: another ``embed_dim``.
    """
    if not isinstance(module, MultiHeadAttention):
        raise TypeError(f"{name} must be an attnkit.nn.MultiHeadAttention, got {type(module).__name__}")
    if module.embed_dim != embed_dim:
        raise ValueError(f"{name} has embed_dim={module.embed_dim}, the layer has embed_dim={embed_dim}")
    return module


def _asked_weights(record: MultiHeadOutput) -> Tensor:
    """The weights of an attention call that asked for them."""
    assert record.weights is not None, "an attention module asked for its weights returned none"
    return record.weights


def _normed(norm: nn.Module | None, x: Tensor) -> Tensor:
    """``norm(x)``, or ``x`` when there is no norm."""
    return x if norm is None else norm(x)


def _attention_record(out: Tensor | MultiHeadOutput) -> MultiHeadOutput:
    """An attention module's result as a record. Layers call the module (not its
    ``forward_record``) so that hooks registered on it run."""
    return out if isinstance(out, MultiHeadOutput) else MultiHeadOutput(out, None)


def _attention_dropout(kernel: str, dropout: float, attention_dropout: float | None) -> float:
    """The dropout of a layer's attention weights (see :class:`LayerConfig`).

    Raises:
        ValueError: an ``attention_dropout`` above 0 for a kernel without weights.
    """
    full = KERNEL_SPECS[kernel].full
    if attention_dropout is None:
        return dropout if full else 0.0
    if attention_dropout > 0 and not full:
        raise ValueError(
            f"kernel {kernel!r} never materialises the attention weights and has no dropout on them; "
            f"got attention_dropout={attention_dropout} (use kernel='auto', or attention_dropout=0)"
        )
    return attention_dropout


def _torch_activation(fn: object) -> Activation:
    """The name of a torch Transformer layer's activation."""
    if fn is F.relu or isinstance(fn, nn.ReLU):
        return "relu"
    if fn is F.gelu or (isinstance(fn, nn.GELU) and fn.approximate == "none"):
        return "gelu"
    raise ValueError(f"only ReLU and exact GELU activations can be converted, got {fn!r}")


def _from_torch_layer(
    cls: type[_Layer],
    m: nn.TransformerEncoderLayer | nn.TransformerDecoderLayer,
    expected: type,
    norms: dict[str, str],
    *,
    cross_attention: str | None = None,
) -> _Layer:
    """A layer of ``cls`` sized like the torch layer ``m``, holding copies of its weights in
    their dtype and on their device.

    Args:
        cls: :class:`EncoderLayer` or :class:`DecoderLayer`.
        m: the torch layer.
        expected: the torch class ``m`` must be.
        norms: our norm's name → the name of the torch norm it copies.
        cross_attention: the name of the torch layer's cross-attention, if it has one.
    """
    if not isinstance(m, expected):
        raise TypeError(f"expected torch.nn.{expected.__name__}, got {type(m).__name__}")
    # Built without storage, then given copies of the source's tensors.
    config = LayerConfig(
        m.self_attn.embed_dim,
        m.self_attn.num_heads,
        m.linear1.out_features,
        dropout=m.dropout.p,
        activation=_torch_activation(m.activation),
        norm_eps=m.norm1.eps,
        norm_first=m.norm_first,
        bias=m.linear1.bias is not None,
    )
    with torch.device("meta"):
        new = cls(config)
    state = _prefixed("self_attn", state_dict_from_torch_attention(m.self_attn))
    if cross_attention is not None:
        state.update(_prefixed("cross_attn", state_dict_from_torch_attention(getattr(m, cross_attention))))
    for ours, theirs in (("ff.up_proj", "linear1"), ("ff.down_proj", "linear2"), *norms.items()):
        copies = {key: t.detach().clone() for key, t in getattr(m, theirs).state_dict().items()}
        state.update(_prefixed(ours, copies))
    new.load_state_dict(state, strict=True, assign=True)
    return new


def _prefixed(prefix: str, state: dict[str, Tensor]) -> dict[str, Tensor]:
    return {f"{prefix}.{key}": t for key, t in state.items()}
