"""Stacks of layers and the encoder–decoder Transformer of "Attention Is All You Need".

Shape letters: ``b`` batch, ``h`` heads, ``s_src`` source length, ``s_tgt`` target
length, ``s`` any sequence length, ``e`` model dim.

The modules take embedded sequences ``[b, s, e]`` (as ``torch.nn.Transformer`` does):
token embeddings and absolute positional encodings are the caller's, so that one stack
serves translation, toy tasks and checkpoints with their own embedding schemes.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, fields

import torch
from torch import Tensor, nn

from attnkit.deprecation import deprecated_aliases
from attnkit.functional.indices import select_indices
from attnkit.nn.hooked_attention import MultiHeadAttention
from attnkit.nn.hooks import HookedModule, HookPoint
from attnkit.nn.kv_cache import DecoderCache
from attnkit.nn.layers import DecoderLayer, EncoderLayer, LayerConfig, MaskLike
from attnkit.nn.norms import make_norm
from attnkit.nn.records import LayerOutput, LayerWeights, StackOutput, TransformerOutput
from attnkit.nn.weight_selection import WeightSelection

# Which layers: every layer (``True``), none (``False``), the indices of the layers
# (negative ones from the end) whose weights to compute, or a mapping of such indices to the
# part of each layer's weights to form (a WeightSelection: heads and query rows). A stack's
# ``return_weights`` and a model run's ``attention`` take it. Asking for a few layers keeps
# the others on the fused path, which never materialises the ``[b, h, s, s]`` weights.
LayerSelection = bool | Collection[int] | Mapping[int, WeightSelection]


def selected_layers(return_weights: LayerSelection, num_layers: int) -> frozenset[int] | None:
    """Deprecated (goes in attnkit 0.3): ``None`` for ``False``, else the set of
    :func:`attnkit.functional.indices.select_indices`, the one selector of layers.

    Raises:
        TypeError: an index that is not an int.
        ValueError: an index outside ``-num_layers .. num_layers - 1``.
    """
    warnings.warn(
        "attnkit.nn.selected_layers is deprecated: use attnkit.functional.indices.select_indices "
        "(return_weights=False selects no layer); selected_layers goes in attnkit 0.3",
        DeprecationWarning,
        stacklevel=2,
    )
    if return_weights is False:
        return None
    return frozenset(select_indices(return_weights, num_layers, "layer", context=f"the stack has {num_layers} layers"))


def layer_requests(return_weights: LayerSelection, num_layers: int) -> dict[int, bool | WeightSelection] | None:
    """What each layer of a stack is asked for: ``True`` (every head's weights) or the
    :class:`attnkit.nn.WeightSelection` that a mapping gives it, for the layers
    ``return_weights`` selects (:func:`attnkit.functional.indices.select_indices`); ``None``
    when no record is wanted (``False``: the stack returns a bare tensor).

    Raises:
        TypeError: a mapping's value that is not a ``WeightSelection``, or an index that is
            not an int.
        ValueError: an index outside ``-num_layers .. num_layers - 1``.
    """
    if return_weights is False:
        return None
    wanted = select_indices(return_weights, num_layers, "layer", context=f"the stack has {num_layers} layers")
    if not isinstance(return_weights, Mapping):
        return dict.fromkeys(wanted, True)
    asked: dict[int, bool | WeightSelection] = {}
    for layer, selection in return_weights.items():
        if not isinstance(selection, WeightSelection):
            raise TypeError(
                f"return_weights maps layers to an attnkit.nn.WeightSelection, got {type(selection).__name__} "
                f"for layer {layer}"
            )
        asked[layer % num_layers] = selection
    return asked


def shared_position_bias(layers: nn.ModuleList, x: Tensor, s_k: int) -> Tensor | None:
    """The score bias ``[1, h, s_q, s_k]`` of the positional encoding that every layer's
    self-attention shares, for the queries of ``x [b, s_q, e]`` and ``s_k`` keys: T5's
    relative position bias and ALiBi depend only on the two lengths, so a stack computes
    it once per forward pass and hands it to all its layers (as T5 itself does) instead
    of each layer computing it again. Gradients reach the shared table through every
    layer's use of the one tensor.

    Returns:
        The bias, contiguous (each layer's kernel reads it whole), or ``None`` when the
        layers share no encoding or it adds no bias (rotary).
    """
    encodings = [_self_attention(layer).positional for layer in layers]
    encoding = encodings[0]
    if encoding is None or encoding.takes_positions or any(other is not encoding for other in encodings):
        return None
    bias = encoding.score_bias(x.shape[1], s_k, device=x.device, dtype=x.dtype)
    return None if bias is None else bias.contiguous()  # [1, h, s_q, s_k]


def _run_stack(
    layers: nn.ModuleList,
    final_norm: nn.Module | None,
    final: HookPoint,
    x: Tensor,
    return_weights: LayerSelection,
    run_layer: Callable[[int, nn.Module, Tensor, bool | WeightSelection], Tensor | LayerOutput],
    start: int = 0,
) -> Tensor | StackOutput:
    """The loop of every stack: each layer in order from layer ``start`` (``x`` is the
    residual stream into it), then the final norm.
    ``run_layer(i, layer, x, weights)`` calls the layer (a module call, so that hooks
    registered on layers run) and returns its output, a record when ``weights`` (``True``
    or a :class:`attnkit.nn.WeightSelection`).

    Returns:
        ``[b, s, e]``, or a :class:`attnkit.nn.StackOutput` when ``return_weights`` asks
        for any record (``None`` in place of the layers not asked for).
    """
    wanted = layer_requests(return_weights, len(layers))
    weights: list[LayerWeights | None] = []
    for i, layer in enumerate(layers):
        if i < start:
            weights.append(None)
            continue
        out = run_layer(i, layer, x, False if wanted is None else wanted.get(i, False))
        record = out if isinstance(out, LayerOutput) else LayerOutput(out, None)
        x = record.output
        weights.append(record.weights)
    if final_norm is not None:
        x = final_norm(x)
    x = final(x)
    return x if wanted is None else StackOutput(x, weights)


def _self_attention(layer: nn.Module) -> MultiHeadAttention:
    assert isinstance(layer, (EncoderLayer, DecoderLayer))  # a stack holds only these
    return layer.self_attn


def _layer_list(layers: Iterable[nn.Module], kind: type[nn.Module]) -> nn.ModuleList:
    layer_list = nn.ModuleList(layers)
    if len(layer_list) == 0:
        raise ValueError(f"a stack needs at least one {kind.__name__}")
    for i, layer in enumerate(layer_list):
        if not isinstance(layer, kind):
            raise TypeError(f"layer {i} must be a {kind.__name__}, got {type(layer).__name__}")
    return layer_list


class Encoder(HookedModule):
    """A stack of :class:`attnkit.nn.EncoderLayer`, optionally followed by a final norm
    (needed after pre-norm layers).

    Args:
        layers: the layers, applied in order.
        final_norm: a norm applied to the last layer's output, or ``None``.

    Raises:
        ValueError: no layers.
        TypeError: a layer that is not an ``EncoderLayer``.
    """

    def __init__(self, layers: Iterable[EncoderLayer], *, final_norm: nn.Module | None = None) -> None:
        super().__init__()
        self.layers = _layer_list(layers, EncoderLayer)
        self.final_norm = final_norm
        self.final = HookPoint()  # the stack's output (attnkit.nn.hooks)

    def forward(
        self,
        x: Tensor,
        *,
        mask: MaskLike | None = None,
        positions: Tensor | None = None,
        return_weights: LayerSelection = False,
    ) -> Tensor | StackOutput:
        """Run every layer in order, then the final norm.

        Args:
            x: ``[b, s, e]``.
            mask: self-attention mask of every layer (``True`` = may attend), broadcastable
                to ``[b, h, s, s]``; source padding is ``[b, 1, 1, s]``.
            positions: token positions for a rotary encoding, ``[s]`` or ``[b, s]``.
            return_weights: also return the weights of every layer (``True``) or of the
                layers with these indices.

        Returns:
            ``[b, s, e]``, or a :class:`attnkit.nn.StackOutput` (``None`` in place of the
            layers not asked for).

        Raises:
            ValueError: a layer index out of range (and the layers' errors).
        """
        position_bias = shared_position_bias(self.layers, x, x.shape[1])  # [1, h, s, s] or None
        return _run_stack(
            self.layers,
            self.final_norm,
            self.final,
            x,
            return_weights,
            lambda i, layer, h, weights: layer(
                h, mask=mask, positions=positions, position_bias=position_bias, return_weights=weights
            ),
        )

    @classmethod
    def from_torch(cls, m: nn.TransformerEncoder) -> Encoder:
        """An equivalent stack with a copy of the weights of ``nn.TransformerEncoder``.

        Raises:
            TypeError: ``m`` is not an ``nn.TransformerEncoder``.
        """
        if not isinstance(m, nn.TransformerEncoder):
            raise TypeError(f"expected torch.nn.TransformerEncoder, got {type(m).__name__}")
        return cls([EncoderLayer.from_torch(layer) for layer in m.layers], final_norm=copy.deepcopy(m.norm))


@deprecated_aliases(new_cache="new_kv_cache", removed_in="0.3")
class Decoder(HookedModule):
    """A stack of :class:`attnkit.nn.DecoderLayer`, optionally followed by a final norm.

    Args:
        layers: the layers, applied in order; all with cross-attention or all without.
        final_norm: a norm applied to the last layer's output, or ``None``.

    Raises:
        ValueError: no layers, or a mix of layers with and without cross-attention.
        TypeError: a layer that is not a ``DecoderLayer``.
    """

    def __init__(self, layers: Iterable[DecoderLayer], *, final_norm: nn.Module | None = None) -> None:
        super().__init__()
        self.layers = _layer_list(layers, DecoderLayer)
        if len({layer.cross_attn is None for layer in self.layers}) > 1:
            raise ValueError("either every decoder layer has cross-attention or none has")
        self.final_norm = final_norm
        self.final = HookPoint()  # the stack's output (attnkit.nn.hooks)

    def new_kv_cache(self, *, capacity: int | None = None) -> DecoderCache:
        """An empty :class:`attnkit.nn.DecoderCache` for this stack, its self-attention
        caches preallocated for ``capacity`` positions when given (inference)."""
        return DecoderCache(len(self.layers), capacity=capacity)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        mask: MaskLike | None = None,
        memory_mask: MaskLike | None = None,
        causal: bool = True,
        positions: Tensor | None = None,
        kv_cache: DecoderCache | None = None,
        return_weights: LayerSelection = False,
        start_at_layer: int = 0,
    ) -> Tensor | StackOutput:
        """Run every layer in order, then the final norm.

        Args:
            x: ``[b, s, e]``; with a cache, only the tokens not yet decoded.
            memory: encoder output ``[b, s_src, e]`` (``None`` for decoder-only stacks).
            mask: self-attention mask (``True`` = may attend), broadcastable to
                ``[b, h, s, s_k]`` where ``s_k`` counts cached positions.
            memory_mask: cross-attention mask, broadcastable to ``[b, h, s, s_src]``.
            causal: causal self-attention (the default; a decoder must not see ahead).
            positions: token positions for a rotary encoding, ``[s]`` or ``[b, s]``.
            kv_cache: a :class:`attnkit.nn.DecoderCache` from :meth:`new_kv_cache`, updated in
                place.
            return_weights: also return the weights of every layer (``True``) or of the
                layers with these indices.
            start_at_layer: the first layer to run; ``x`` is then the residual stream
                into it (TransformerLens' ``start_at_layer``).

        Returns:
            ``[b, s, e]``, or a :class:`attnkit.nn.StackOutput` (``None`` in place of the
            layers not asked for).

        Raises:
            TypeError: a cache that is not a ``DecoderCache``.
            ValueError: a cache for another number of layers, a layer index out of range
                (and the layers' errors).
        """
        if kv_cache is not None:
            if not isinstance(kv_cache, DecoderCache):
                raise TypeError(f"cache must be an attnkit.nn.DecoderCache, got {type(kv_cache).__name__}")
            if len(kv_cache.self_attention) != len(self.layers):
                raise ValueError(
                    f"cache has {len(kv_cache.self_attention)} layers, this decoder has {len(self.layers)}; "
                    "make it with new_kv_cache()"
                )
        s_k = x.shape[1] + (0 if kv_cache is None else len(kv_cache))
        position_bias = shared_position_bias(self.layers, x, s_k)  # [1, h, s, s_k] or None
        return _run_stack(
            self.layers,
            self.final_norm,
            self.final,
            x,
            return_weights,
            lambda i, layer, h, weights: layer(
                h,
                memory,
                mask=mask,
                memory_mask=memory_mask,
                causal=causal,
                positions=positions,
                position_bias=position_bias,
                self_kv_cache=None if kv_cache is None else kv_cache.self_attention[i],
                cross_kv_cache=None if kv_cache is None else kv_cache.cross_attention[i],
                return_weights=weights,
            ),
            start=start_at_layer,
        )

    @classmethod
    def from_torch(cls, m: nn.TransformerDecoder) -> Decoder:
        """An equivalent stack with a copy of the weights of ``nn.TransformerDecoder``.

        Raises:
            TypeError: ``m`` is not an ``nn.TransformerDecoder``.
        """
        if not isinstance(m, nn.TransformerDecoder):
            raise TypeError(f"expected torch.nn.TransformerDecoder, got {type(m).__name__}")
        return cls([DecoderLayer.from_torch(layer) for layer in m.layers], final_norm=copy.deepcopy(m.norm))


@dataclass(frozen=True)
class TransformerConfig(LayerConfig):
    """What a :class:`Transformer` is built from: the :class:`attnkit.nn.LayerConfig` of
    every layer of both stacks, their depths and their final norms. Defaults are the
    paper's base model: ``e = 512``, 8 heads, 6 + 6 layers, feed-forward 2048, dropout
    0.1, ReLU, post-norm.

    Args:
        embed_dim, num_heads, ff_dim, and the keyword options of
            :class:`attnkit.nn.LayerConfig`: every layer's.
        num_encoder_layers: encoder depth.
        num_decoder_layers: decoder depth.
        final_norm: a norm after each stack; default ``norm_first`` (pre-norm needs one,
            the paper's post-norm has none; ``torch.nn.Transformer`` always has one).

    Raises:
        ValueError: a depth below 1 (and the errors of :class:`attnkit.nn.LayerConfig`).
        TypeError: kernel options the kernel does not take or needs.
    """

    embed_dim: int = 512
    num_heads: int = 8
    ff_dim: int = 2048
    _: KW_ONLY
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    final_norm: bool | None = None

    def __post_init__(self) -> None:
        if self.num_encoder_layers < 1 or self.num_decoder_layers < 1:
            raise ValueError(
                f"num_encoder_layers and num_decoder_layers must be >= 1, got {self.num_encoder_layers} and "
                f"{self.num_decoder_layers}"
            )
        super().__post_init__()


@deprecated_aliases(new_cache="new_kv_cache", removed_in="0.3")
class Transformer(HookedModule):
    """The encoder–decoder Transformer (the paper's base model by default).

    Args:
        config: the sizes and options, a :class:`TransformerConfig`.

    Raises:
        TypeError: a config that is not a ``TransformerConfig``.
    """

    def __init__(self, config: TransformerConfig = TransformerConfig()) -> None:  # noqa: B008 (frozen)
        super().__init__()
        if not isinstance(config, TransformerConfig):
            raise TypeError(f"config must be an attnkit.nn.TransformerConfig, got {type(config).__name__}")
        layer = config.layer()
        final_norm = config.norm_first if config.final_norm is None else config.final_norm

        def stack_norm() -> nn.Module | None:
            return make_norm(config.norm, config.embed_dim, config.norm_eps, bias=config.bias) if final_norm else None

        self.encoder = Encoder([EncoderLayer(layer) for _ in range(config.num_encoder_layers)], final_norm=stack_norm())
        self.decoder = Decoder([DecoderLayer(layer) for _ in range(config.num_decoder_layers)], final_norm=stack_norm())

    def encode(
        self, src: Tensor, *, src_mask: MaskLike | None = None, return_weights: bool = False
    ) -> Tensor | StackOutput:
        """Run the encoder.

        Args:
            src: embedded source ``[b, s_src, e]``.
            src_mask: encoder self-attention mask (``True`` = may attend), e.g. source
                padding ``[b, 1, 1, s_src]``.
            return_weights: also return the encoder layers' weights.

        Returns:
            The memory ``[b, s_src, e]``, or a :class:`attnkit.nn.StackOutput`.
        """
        return self.encoder(src, mask=src_mask, return_weights=return_weights)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        *,
        tgt_mask: MaskLike | None = None,
        memory_mask: MaskLike | None = None,
        causal: bool = True,
        kv_cache: DecoderCache | None = None,
        return_weights: bool = False,
    ) -> Tensor | StackOutput:
        """Run the decoder against an encoded source; with a cache, step by step.

        Args:
            tgt: embedded target ``[b, s_tgt, e]`` (only the new tokens with a cache).
            memory: :meth:`encode`'s output ``[b, s_src, e]``.
            tgt_mask: extra decoder self-attention mask, e.g. target padding.
            memory_mask: cross-attention mask, e.g. source padding ``[b, 1, 1, s_src]``.
            causal: causal decoder self-attention.
            kv_cache: from :meth:`new_kv_cache`.
            return_weights: also return the decoder layers' weights.

        Returns:
            ``[b, s_tgt, e]``, or a :class:`attnkit.nn.StackOutput`.
        """
        return self.decoder(
            tgt,
            memory,
            mask=tgt_mask,
            memory_mask=memory_mask,
            causal=causal,
            kv_cache=kv_cache,
            return_weights=return_weights,
        )

    def new_kv_cache(self) -> DecoderCache:
        """An empty cache for incremental :meth:`decode`."""
        return self.decoder.new_kv_cache()

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        *,
        src_mask: MaskLike | None = None,
        tgt_mask: MaskLike | None = None,
        memory_mask: MaskLike | None = None,
        causal: bool = True,
        return_weights: bool = False,
    ) -> Tensor | TransformerOutput:
        """Encode ``src`` and decode ``tgt`` against it (teacher forcing).

        Args:
            src: embedded source ``[b, s_src, e]``.
            tgt: embedded target ``[b, s_tgt, e]``.
            src_mask: encoder self-attention mask, broadcastable to ``[b, h, s_src, s_src]``.
            tgt_mask: decoder self-attention mask, broadcastable to ``[b, h, s_tgt, s_tgt]``,
                on top of the causal mask.
            memory_mask: cross-attention mask, broadcastable to ``[b, h, s_tgt, s_src]``;
                pass the source padding here too.
            causal: causal decoder self-attention.
            return_weights: also return every layer's weights.

        Returns:
            ``[b, s_tgt, e]``, or a :class:`attnkit.nn.TransformerOutput`.
        """
        # Records throughout (StackOutput with ``None`` weights when not asked for), one path.
        layers: LayerSelection = True if return_weights else []
        encoded = self.encoder(src, mask=src_mask, return_weights=layers)
        decoded = self.decoder(
            tgt, encoded.output, mask=tgt_mask, memory_mask=memory_mask, causal=causal, return_weights=layers
        )
        if return_weights:
            return TransformerOutput(decoded.output, encoded.weights, decoded.weights)
        return decoded.output

    @classmethod
    def from_torch(cls, m: nn.Transformer) -> Transformer:
        """An equivalent model with a copy of the weights of ``torch.nn.Transformer``.

        The result is batch-first; for ``batch_first=False`` transpose the inputs. Give the
        torch masks with :func:`attnkit.nn.mask_from_torch`; note that torch's decoder is
        only causal when given a causal ``tgt_mask``, while ``causal=True`` is the default
        here.

        Raises:
            TypeError: ``m`` is not an ``nn.Transformer``.
            ValueError: a layer activation other than ReLU or GELU.
        """
        if not isinstance(m, nn.Transformer):
            raise TypeError(f"expected torch.nn.Transformer, got {type(m).__name__}")
        encoder, decoder = Encoder.from_torch(m.encoder), Decoder.from_torch(m.decoder)
        first = encoder.layers[0]
        assert isinstance(first, EncoderLayer)  # Encoder.from_torch builds them
        layer = {f.name: getattr(first.config, f.name) for f in fields(LayerConfig)}
        config = TransformerConfig(
            **layer, num_encoder_layers=len(encoder.layers), num_decoder_layers=len(decoder.layers), final_norm=True
        )
        with torch.device("meta"):
            new = cls(config)
        # The converted stacks carry torch's whole configuration (sizes, activation, norms,
        # bias) along with the weights; they replace the freshly built ones.
        new.encoder, new.decoder = encoder, decoder
        return new
