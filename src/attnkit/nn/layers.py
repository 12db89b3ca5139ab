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

import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.functional.masks import Mask
from attnkit.nn.attention import MultiHeadAttention
from attnkit.nn.feedforward import Activation, FeedForward
from attnkit.nn.kv_cache import KVCache
from attnkit.nn.norms import NormKind, make_norm
from attnkit.nn.positional import AttentionPositional
from attnkit.nn.records import LayerOutput, LayerWeights

MaskLike = Mask | Tensor


class _ResidualLayer(nn.Module):
    """The Add & Norm plumbing both layer kinds share."""

    norm_first: bool
    dropout: nn.Dropout

    def _sublayer_input(self, x: Tensor, norm: nn.Module) -> Tensor:
        """What the sublayer sees: ``norm(x)`` in pre-norm, ``x`` itself in post-norm."""
        return norm(x) if self.norm_first else x

    def _add_and_norm(self, x: Tensor, sublayer_out: Tensor, norm: nn.Module) -> Tensor:
        """The residual sum, normalised afterwards in post-norm."""
        y = x + self.dropout(sublayer_out)
        return y if self.norm_first else norm(y)


class EncoderLayer(_ResidualLayer):
    """Self-attention and feed-forward, each with Add & Norm (one of the paper's N = 6
    encoder layers; also a BERT layer).

    Args:
        embed_dim: model dim ``e``.
        num_heads: attention heads; must divide ``embed_dim``.
        ff_dim: hidden dim of the feed-forward block.
        num_kv_heads: key/value heads for grouped-query attention (default ``num_heads``).
        dropout: dropout on attention weights, feed-forward activations and each
            sublayer's output before the residual sum.
        activation: ``"relu"``, ``"gelu"`` or ``"swiglu"``.
        norm: ``"layer"`` (LayerNorm) or ``"rms"`` (RMSNorm).
        norm_eps: the norms' epsilon (BERT: 1e-12).
        norm_first: pre-norm instead of the paper's post-norm.
        bias: biases in projections, feed-forward and LayerNorm.
        positional: a rotary / ALiBi / relative-bias encoding for the self-attention.
        kernel: the attention kernel, see :class:`attnkit.nn.MultiHeadAttention`.

    Raises:
        ValueError: inconsistent sizes or unknown options (from the parts).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        ff_dim: int,
        *,
        num_kv_heads: int | None = None,
        dropout: float = 0.1,
        activation: Activation = "relu",
        norm: NormKind = "layer",
        norm_eps: float = 1e-5,
        norm_first: bool = False,
        bias: bool = True,
        positional: AttentionPositional | None = None,
        kernel: str = "dense",
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(
            embed_dim, num_heads, num_kv_heads=num_kv_heads, bias=bias, dropout=dropout,
            positional=positional, kernel=kernel,
        )
        self.self_attn_norm = make_norm(norm, embed_dim, norm_eps, bias=bias)
        self.ff = FeedForward(embed_dim, ff_dim, activation=activation, bias=bias, dropout=dropout)
        self.ff_norm = make_norm(norm, embed_dim, norm_eps, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        *,
        mask: MaskLike | None = None,
        positions: Tensor | None = None,
        return_weights: bool = False,
    ) -> Tensor | LayerOutput:
        """Self-attention, then feed-forward, each with Add & Norm.

        Args:
            x: ``[b, s, e]``.
            mask: self-attention mask (``True`` = may attend), a Mask or a bool tensor
                broadcastable to ``[b, h, s, s]``; key padding is ``[b, 1, 1, s]``.
            positions: token positions for a rotary encoding, ``[s]`` or ``[b, s]``.
            return_weights: also return the attention weights.

        Returns:
            ``[b, s, e]``, or a :class:`attnkit.nn.LayerOutput`.
        """
        attn = self.self_attn(
            self._sublayer_input(x, self.self_attn_norm), mask=mask, positions=positions,
            return_weights=return_weights,
        )
        attn_out = attn.output if return_weights else attn
        x = self._add_and_norm(x, attn_out, self.self_attn_norm)
        x = self._add_and_norm(x, self.ff(self._sublayer_input(x, self.ff_norm)), self.ff_norm)
        return LayerOutput(x, LayerWeights(attn.weights)) if return_weights else x

    @classmethod
    def from_torch(cls, m: nn.TransformerEncoderLayer) -> EncoderLayer:
        """An equivalent layer with a copy of the weights of ``nn.TransformerEncoderLayer``
        (batch-first regardless of ``m.batch_first``).

        Raises:
            TypeError: ``m`` is not an ``nn.TransformerEncoderLayer``.
            ValueError: its activation is neither ReLU nor GELU.
        """
        new = _from_torch_layer(cls, m, nn.TransformerEncoderLayer)
        new.self_attn_norm.load_state_dict(m.norm1.state_dict())
        new.ff_norm.load_state_dict(m.norm2.state_dict())
        return new.to(device=m.linear1.weight.device, dtype=m.linear1.weight.dtype)


class DecoderLayer(_ResidualLayer):
    """Masked self-attention, cross-attention to the encoder output, and feed-forward,
    each with Add & Norm. With ``cross_attention=False`` it is a decoder-only (GPT,
    LLaMA) block.

    Args:
        embed_dim: model dim ``e``.
        num_heads: attention heads; must divide ``embed_dim``.
        ff_dim: hidden dim of the feed-forward block.
        num_kv_heads: key/value heads for grouped-query attention (default ``num_heads``).
        cross_attention: include the cross-attention sublayer.
        dropout: as in :class:`EncoderLayer`.
        activation: ``"relu"``, ``"gelu"`` or ``"swiglu"``.
        norm: ``"layer"`` or ``"rms"``.
        norm_eps: the norms' epsilon.
        norm_first: pre-norm instead of post-norm.
        bias: biases in projections, feed-forward and LayerNorm.
        positional: a rotary / ALiBi / relative-bias encoding for the self-attention.
        kernel: the attention kernel, see :class:`attnkit.nn.MultiHeadAttention`.

    Raises:
        ValueError: inconsistent sizes or unknown options (from the parts).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        ff_dim: int,
        *,
        num_kv_heads: int | None = None,
        cross_attention: bool = True,
        dropout: float = 0.1,
        activation: Activation = "relu",
        norm: NormKind = "layer",
        norm_eps: float = 1e-5,
        norm_first: bool = False,
        bias: bool = True,
        positional: AttentionPositional | None = None,
        kernel: str = "dense",
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(
            embed_dim, num_heads, num_kv_heads=num_kv_heads, bias=bias, dropout=dropout,
            positional=positional, kernel=kernel,
        )
        self.self_attn_norm = make_norm(norm, embed_dim, norm_eps, bias=bias)
        self.cross_attn: MultiHeadAttention | None = None
        self.cross_attn_norm: nn.Module | None = None
        if cross_attention:
            self.cross_attn = MultiHeadAttention(
                embed_dim, num_heads, num_kv_heads=num_kv_heads, bias=bias, dropout=dropout, kernel=kernel
            )
            self.cross_attn_norm = make_norm(norm, embed_dim, norm_eps, bias=bias)
        self.ff = FeedForward(embed_dim, ff_dim, activation=activation, bias=bias, dropout=dropout)
        self.ff_norm = make_norm(norm, embed_dim, norm_eps, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        mask: MaskLike | None = None,
        memory_mask: MaskLike | None = None,
        causal: bool = True,
        positions: Tensor | None = None,
        self_cache: KVCache | None = None,
        cross_cache: KVCache | None = None,
        return_weights: bool = False,
    ) -> Tensor | LayerOutput:
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
            self_cache: KV cache of the self-attention.
            cross_cache: KV cache of the cross-attention (filled once from ``memory``).
            return_weights: also return the attention weights.

        Returns:
            ``[b, s, e]``, or a :class:`attnkit.nn.LayerOutput` whose weights have
            ``cross_attention`` set when the layer has one.

        Raises:
            ValueError: ``memory`` given to a layer without cross-attention or missing for
                one with it (and the errors of the attention modules).
        """
        if (memory is None) != (self.cross_attn is None):
            raise ValueError(
                "memory is required by a decoder layer with cross-attention and not accepted without one; "
                f"this layer has cross_attention={self.cross_attn is not None}, memory given: {memory is not None}"
            )
        attn = self.self_attn(
            self._sublayer_input(x, self.self_attn_norm), mask=mask, causal=causal, positions=positions,
            kv_cache=self_cache, return_weights=return_weights,
        )
        x = self._add_and_norm(x, attn.output if return_weights else attn, self.self_attn_norm)
        cross_weights = None
        if self.cross_attn is not None:
            cross = self.cross_attn(
                self._sublayer_input(x, self.cross_attn_norm), memory, mask=memory_mask, kv_cache=cross_cache,
                return_weights=return_weights,
            )
            x = self._add_and_norm(x, cross.output if return_weights else cross, self.cross_attn_norm)
            cross_weights = cross.weights if return_weights else None
        x = self._add_and_norm(x, self.ff(self._sublayer_input(x, self.ff_norm)), self.ff_norm)
        return LayerOutput(x, LayerWeights(attn.weights, cross_weights)) if return_weights else x

    @classmethod
    def from_torch(cls, m: nn.TransformerDecoderLayer) -> DecoderLayer:
        """An equivalent layer with a copy of the weights of ``nn.TransformerDecoderLayer``
        (batch-first regardless of ``m.batch_first``).

        Raises:
            TypeError: ``m`` is not an ``nn.TransformerDecoderLayer``.
            ValueError: its activation is neither ReLU nor GELU.
        """
        new = _from_torch_layer(cls, m, nn.TransformerDecoderLayer)
        new.cross_attn = MultiHeadAttention.from_torch(m.multihead_attn)
        new.self_attn_norm.load_state_dict(m.norm1.state_dict())
        new.cross_attn_norm.load_state_dict(m.norm2.state_dict())
        new.ff_norm.load_state_dict(m.norm3.state_dict())
        return new.to(device=m.linear1.weight.device, dtype=m.linear1.weight.dtype)


def _torch_activation(fn: object) -> Activation:
    """The name of a torch Transformer layer's activation."""
    if fn is F.relu or isinstance(fn, nn.ReLU):
        return "relu"
    if fn is F.gelu or (isinstance(fn, nn.GELU) and fn.approximate == "none"):
        return "gelu"
    raise ValueError(f"only ReLU and exact GELU activations can be converted, got {fn!r}")


def _from_torch_layer(cls: type, m: nn.Module, expected: type) -> _ResidualLayer:
    """A layer of ``cls`` sized like the torch layer ``m``, with its self-attention and
    feed-forward weights copied; the caller copies what only its kind has (norms, cross)."""
    if not isinstance(m, expected):
        raise TypeError(f"expected torch.nn.{expected.__name__}, got {type(m).__name__}")
    new = cls(
        m.self_attn.embed_dim, m.self_attn.num_heads, m.linear1.out_features, dropout=m.dropout.p,
        activation=_torch_activation(m.activation), norm_eps=m.norm1.eps, norm_first=m.norm_first,
        bias=m.linear1.bias is not None,
    )
    new.self_attn = MultiHeadAttention.from_torch(m.self_attn)
    new.ff.up_proj.load_state_dict(m.linear1.state_dict())
    new.ff.down_proj.load_state_dict(m.linear2.state_dict())
    return new
