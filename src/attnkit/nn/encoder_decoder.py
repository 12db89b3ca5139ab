"""Encoder–decoder language models (T5, BART, Marian and the paper's Transformer) over
token ids: embeddings, an :class:`attnkit.nn.Encoder`, an :class:`attnkit.nn.Decoder`
whose layers cross-attend to the encoder's output, and a head that turns the decoder's
output into next-token logits.

Shape letters: ``b`` batch, ``s_src`` source length, ``s_tgt`` target length (decoder
input), ``e`` model dim, ``v`` vocabulary size.

Such a model has three kinds of attention, all in the records it returns
(:class:`attnkit.nn.EncoderDecoderLMOutput`): the encoder's self-attention over the source, the
decoder's masked self-attention over the target so far, and the decoder's cross-attention
from each target position to every source token. Generation (:meth:`EncoderDecoderLM.stream`)
runs the encoder once, then one decoder step per token against a KV cache: the
self-attention cache grows by one position a step, the cross-attention cache holds the
source's keys and values, projected on the first step.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from attnkit.deprecation import deprecated_aliases
from attnkit.nn.dropout import Dropout
from attnkit.nn.hooked_attention import MultiHeadAttention
from attnkit.nn.hooks import HookPoint
from attnkit.nn.kv_cache import DecoderCache
from attnkit.nn.layers import DecoderLayer, EncoderLayer
from attnkit.nn.lm import check_decoding_options, decoding_loop, run_to_end
from attnkit.nn.positional import SinusoidalPositionalEncoding
from attnkit.nn.records import EncoderDecoderLMOutput, StackOutput
from attnkit.nn.text_module import TextModule, check_padding
from attnkit.nn.transformer import Decoder, Encoder, LayerSelection, Transformer, TransformerConfig


class SequenceEmbedding(nn.Module):
    """Token ids to vectors: ``norm(token(ids) · scale + position(start ..))``, with the
    position and the norm optional.

    Args:
        token: the token embedding ``[v, e]``; one module may serve several
            ``SequenceEmbedding`` s (an encoder–decoder's shared vocabulary).
        scale: multiplies the token vectors (``√e`` in the paper and in BART with
            ``scale_embedding``).
        position: an absolute positional encoding called as ``position(x, positions)``
            (:class:`attnkit.nn.LearnedPositionalEmbedding`,
            :class:`attnkit.nn.SinusoidalPositionalEncoding`), or ``None`` (relative
            positions inside attention, as T5).
        position_offset: added to every position before the lookup (BART's learned table
            starts at row 2).
        norm: a norm applied to the sum (BART's ``layernorm_embedding``), or ``None``.
        dropout: dropout on the result while training.

    Raises:
        ValueError: a negative ``position_offset``, a ``position_offset`` without a
            ``position``.
    """

    token: nn.Embedding

    def __init__(
        self,
        token: nn.Embedding,
        *,
        scale: float = 1.0,
        position: nn.Module | None = None,
        position_offset: int = 0,
        norm: nn.Module | None = None,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if position_offset < 0 or (position_offset and position is None):
            raise ValueError(
                f"position_offset must be >= 0 and needs a position encoding, got {position_offset} "
                f"with position={type(position).__name__ if position is not None else None}"
            )
        self.token = token
        self.scale = scale
        self.position = position
        self.position_offset = position_offset
        self.norm = norm
        self.dropout = Dropout(dropout)
        self.embed = HookPoint()  # the embeddings as they enter the stack (attnkit.nn.hooks)

    def forward(self, tokens: Tensor, start: int = 0) -> Tensor:
        """Embed ``tokens [b, s]`` at positions ``start .. start + s - 1``.

        Returns:
            ``[b, s, e]``.
        """
        x = self.token(tokens)  # [b, s, e]
        if self.scale != 1.0:
            x = x * self.scale
        if self.position is not None:
            positions = torch.arange(start, start + tokens.shape[1], device=tokens.device) + self.position_offset
            x = self.position(x, positions)
        if self.norm is not None:
            x = self.norm(x)
        return self.embed(self.dropout(x))

    def extra_repr(self) -> str:
        parts = [] if self.scale == 1.0 else [f"scale={self.scale:g}"]
        return ", ".join(parts + ([f"position_offset={self.position_offset}"] if self.position_offset else []))


class LMHead(nn.Module):
    """The decoder output to next-token logits: ``linear(x · input_scale)``.

    Args:
        embed_dim: ``e``.
        vocab_size: ``v``.
        input_scale: multiplies the input first (T5 with a tied head: ``e ** -0.5``).
        bias: a bias on the logits (BART's ``final_logits_bias``).
    """

    def __init__(self, embed_dim: int, vocab_size: int, *, input_scale: float = 1.0, bias: bool = False) -> None:
        super().__init__()
        self.input_scale = input_scale
        self.proj = nn.Linear(embed_dim, vocab_size, bias=bias)

    @property
    def weight(self) -> Tensor:
        """The ``[v, e]`` matrix (tied to the token embedding in most checkpoints)."""
        return self.proj.weight

    def forward(self, x: Tensor) -> Tensor:
        """``[..., e]`` → logits ``[..., v]``."""
        return self.proj(x * self.input_scale if self.input_scale != 1.0 else x)

    def extra_repr(self) -> str:
        return "" if self.input_scale == 1.0 else f"input_scale={self.input_scale:g}"


def source_padding_mask(source_mask: Tensor | None) -> Tensor | None:
    """A key-padding mask of the source ``[b, s_src]`` (``True`` = a real token) as the
    attention mask ``[b, 1, 1, s_src]`` of the encoder's self-attention and of the
    cross-attention.

    Raises:
        TypeError: a mask that is not boolean.
        ValueError: a mask that is not ``[b, s_src]``.
    """
    if source_mask is None:
        return None
    if source_mask.dtype != torch.bool:
        raise TypeError(f"source_mask must be a bool tensor (True = a real token), got {source_mask.dtype}")
    if source_mask.ndim != 2:
        raise ValueError(f"source_mask must be [b, s_src], got {list(source_mask.shape)}")
    return source_mask[:, None, None, :]  # [b, 1, 1, s_src]


@deprecated_aliases(new_cache="new_kv_cache", removed_in="0.3")
class EncoderDecoderLM(TextModule):
    """An encoder–decoder language model.

    Args:
        source_embedding: ids ``[b, s_src]`` → ``[b, s_src, e]`` (a
            :class:`SequenceEmbedding`), called as ``source_embedding(ids, start)``.
        target_embedding: the same for the decoder's input.
        encoder: the encoder stack.
        decoder: the decoder stack, every layer with cross-attention.
        head: decoder output ``[..., e]`` → logits ``[..., v]`` (an :class:`LMHead`).
        decoder_start_token_id: the id the decoder reads first, before any target token.

    Attributes:
        token_embedding: the source embedding's token table (shared with the target's in
            T5 checkpoints and in BART ones that tie their embeddings).

    Raises:
        ValueError: a decoder whose layers have no cross-attention, or stacks of different
            widths.
    """

    def __init__(
        self,
        *,
        source_embedding: SequenceEmbedding,
        target_embedding: SequenceEmbedding,
        encoder: Encoder,
        decoder: Decoder,
        head: nn.Module,
        decoder_start_token_id: int,
    ) -> None:
        super().__init__()
        first, first_encoder = decoder.layers[0], encoder.layers[0]
        assert isinstance(first, DecoderLayer) and isinstance(first_encoder, EncoderLayer)
        if first.cross_attn is None:
            raise ValueError("the decoder of an encoder-decoder model needs cross-attention in its layers")
        encoder_dim, decoder_dim = first_encoder.self_attn.embed_dim, first.self_attn.embed_dim
        if encoder_dim != decoder_dim:
            raise ValueError(f"encoder and decoder must have the same width, got {encoder_dim} and {decoder_dim}")
        self.source_embedding: SequenceEmbedding = source_embedding
        self.target_embedding: SequenceEmbedding = target_embedding
        self.encoder = encoder
        self.decoder = decoder
        self.head = head
        self.decoder_start_token_id = decoder_start_token_id

    @property
    def token_embedding(self) -> nn.Embedding:
        return self.source_embedding.token

    def new_kv_cache(self, *, capacity: int | None = None) -> DecoderCache:
        """An empty cache for :meth:`decode` step by step; with ``capacity``, the
        self-attention caches are preallocated for that many target positions."""
        return self.decoder.new_kv_cache(capacity=capacity)

    def last_hidden_state(
        self, tokens: Tensor, *, padding: Tensor | None = None, return_weights: LayerSelection = False
    ) -> Tensor | StackOutput:
        """The encoder's output over one text (:meth:`encode`): what a run over one text
        reads; :meth:`decode` runs the decoder.

        Args:
            tokens: source ids ``[b, s_src]``.
            padding: ``[b, s_src]`` bool, ``True`` on tokens and ``False`` on padding.
            return_weights: the encoder layers whose self-attention weights to return.

        Returns:
            ``[b, s_src, e]``, or a :class:`attnkit.nn.StackOutput`.

        Raises:
            TypeError, ValueError: as :meth:`encode`; padding of another shape.
        """
        if padding is not None:
            check_padding(padding, tokens)
        return self.encode(tokens, source_mask=padding, return_weights=return_weights)

    def logits(self, hidden: Tensor) -> None:
        """None: the encoder's states (:meth:`last_hidden_state`) have no head; the decoder's
        output goes through :attr:`head` (:meth:`forward`)."""
        return None

    def self_attention(self, layer: int) -> MultiHeadAttention:
        """The self-attention module of encoder layer ``layer``."""
        attention = self.encoder.layers[layer].self_attn
        assert isinstance(attention, MultiHeadAttention)
        return attention

    def encode(
        self, source: Tensor, *, source_mask: Tensor | None = None, return_weights: LayerSelection = False
    ) -> Tensor | StackOutput:
        """Run the encoder over the source.

        Args:
            source: token ids ``[b, s_src]``.
            source_mask: ``True`` for real tokens, ``False`` for padding, ``[b, s_src]``.
            return_weights: the encoder layers whose self-attention weights to return
                (``True`` for all).

        Returns:
            The memory ``[b, s_src, e]``, or a :class:`attnkit.nn.StackOutput`.

        Raises:
            TypeError: non-integer ids, a non-boolean mask.
            ValueError: ids not ``[b, s]``, a layer index out of range.
        """
        _check_ids(source, "source")
        return self.encoder(
            self.source_embedding(source), mask=source_padding_mask(source_mask), return_weights=return_weights
        )

    def decode(
        self,
        target: Tensor,
        memory: Tensor,
        *,
        source_mask: Tensor | None = None,
        kv_cache: DecoderCache | None = None,
        return_weights: LayerSelection = False,
    ) -> Tensor | StackOutput:
        """Run the decoder over target ids against the encoder's output.

        Args:
            target: decoder input ids ``[b, s_tgt]`` (the decoder start token first);
                with a cache, only the ids not decoded yet.
            memory: :meth:`encode`'s output ``[b, s_src, e]``.
            source_mask: the source's padding, as in :meth:`encode`.
            kv_cache: from :meth:`new_kv_cache`, updated in place; positions continue after the
                cached ones.
            return_weights: the decoder layers whose weights (self- and cross-attention)
                to return.

        Returns:
            The decoder output ``[b, s_tgt, e]`` (what :attr:`head` reads), or a
            :class:`attnkit.nn.StackOutput` whose layer weights have ``cross_attention``.

        Raises:
            TypeError, ValueError: as :meth:`encode`.
        """
        _check_ids(target, "target")
        start = 0 if kv_cache is None else len(kv_cache)
        return self.decoder(
            self.target_embedding(target, start),
            memory,
            memory_mask=source_padding_mask(source_mask),
            causal=True,
            kv_cache=kv_cache,
            return_weights=return_weights,
        )

    def forward(
        self,
        source: Tensor,
        target: Tensor,
        *,
        source_mask: Tensor | None = None,
        return_weights: LayerSelection = False,
    ) -> Tensor | EncoderDecoderLMOutput:
        """Next-token logits of every target position (teacher forcing).

        Args:
            source: ids ``[b, s_src]``.
            target: decoder input ids ``[b, s_tgt]``, starting with the decoder start token.
            source_mask: the source's padding ``[b, s_src]``.
            return_weights: the layers whose weights to return, in both stacks (``True``
                for all; indices beyond a stack's depth are refused).

        Returns:
            Logits ``[b, s_tgt, v]``, or a :class:`attnkit.nn.EncoderDecoderLMOutput` with the
            three kinds of attention.
        """
        layers: LayerSelection = [] if return_weights is False else return_weights
        encoded = self.encode(source, source_mask=source_mask, return_weights=layers)
        assert isinstance(encoded, StackOutput)  # a record whenever return_weights is a list
        decoded = self.decode(target, encoded.output, source_mask=source_mask, return_weights=layers)
        assert isinstance(decoded, StackOutput)
        logits = self.head(decoded.output)  # [b, s_tgt, v]
        if return_weights is False:
            return logits
        return EncoderDecoderLMOutput(logits, encoded.weights, decoded.weights)

    def stream(
        self,
        source: Tensor,
        max_new_tokens: int,
        *,
        source_mask: Tensor | None = None,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
        use_kv_cache: bool = True,
    ) -> Iterator[Tensor]:
        """The decoding loop: the encoder runs once, then each step feeds the previous
        token (the decoder start token first) to the decoder against its KV cache and
        yields the next token of every row; without the KV cache, each step runs the
        decoder over every target token so far. Each step opens its own ``inference_mode``
        (see :meth:`attnkit.nn.DecoderLM.stream`).

        Args:
            source: ids ``[b, s_src]``.
            max_new_tokens: ``n``, the number of steps.
            source_mask: the source's padding ``[b, s_src]``.
            temperature: ``0`` is greedy; above 0 samples from ``softmax(logits / t)``.
            top_k: when sampling, only from the ``top_k`` most likely tokens.
            top_p: when sampling, only from the nucleus (:func:`attnkit.nn.lm.pick_next_token`).
            generator: random generator for sampling.
            use_kv_cache: keep the decoder's keys and values between steps.

        Returns:
            An iterator of ``n`` token id tensors ``[b]``.

        Raises:
            ValueError: ``max_new_tokens < 0``, ``temperature < 0``, ``top_k < 1``, ``top_p``
                outside ``(0, 1]`` (at the call, before any step).
        """
        check_decoding_options(max_new_tokens, temperature, top_k, top_p)
        _check_ids(source, "source")
        return self._steps(source, source_mask, max_new_tokens, temperature, top_k, top_p, generator, use_kv_cache)

    def _steps(
        self,
        source: Tensor,
        source_mask: Tensor | None,
        max_new_tokens: int,
        temperature: float,
        top_k: int | None,
        top_p: float | None,
        generator: torch.Generator | None,
        use_kv_cache: bool = True,
    ) -> Iterator[Tensor]:
        if max_new_tokens == 0:
            return
        with torch.inference_mode():
            memory = self.encode(source, source_mask=source_mask)  # [b, s_src, e]
        assert isinstance(memory, Tensor)
        cache = self.new_kv_cache(capacity=max_new_tokens) if use_kv_cache else None
        start = torch.full((source.shape[0], 1), self.decoder_start_token_id, device=source.device)  # [b, 1]

        def next_logits(step_input: Tensor) -> Tensor:
            hidden = self.decode(step_input, memory, source_mask=source_mask, kv_cache=cache)  # [b, 1, e]
            assert isinstance(hidden, Tensor)
            return self.head(hidden[:, -1])  # [b, v]

        yield from decoding_loop(
            next_logits, start, max_new_tokens, temperature, top_k, generator, feed_all=not use_kv_cache, top_p=top_p
        )

    @torch.no_grad()
    def generate(
        self, source: Tensor, max_new_tokens: int, *, source_mask: Tensor | None = None, eos_token_id: int | None = None
    ) -> Tensor:
        """Greedy decoding (:meth:`stream`) in evaluation mode, restoring the mode after.

        Args:
            source: ids ``[b, s_src]``.
            max_new_tokens: ``n``, the most tokens to produce.
            source_mask: the source's padding ``[b, s_src]``.
            eos_token_id: a row that produced it keeps producing it; decoding stops once
                every row has.

        Returns:
            The produced ids ``[b, n']``, ``n' <= n``, without the decoder start token.
        """
        steps = self.stream(source, max_new_tokens, source_mask=source_mask)
        out = run_to_end(self, steps, rows=source.shape[0], device=source.device, eos_token_id=eos_token_id)
        return torch.cat(out, dim=1) if out else source.new_zeros(source.shape[0], 0)  # [b, n']


def _check_ids(ids: Tensor, what: str) -> None:
    if not isinstance(ids, Tensor) or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        got = ids.dtype if isinstance(ids, Tensor) else type(ids).__name__
        raise TypeError(f"{what} must be integer token ids, got {got}")
    if ids.ndim != 2:
        raise ValueError(f"{what} must be [b, s], got {list(ids.shape)}")


def paper_transformer(
    vocab_size: int,
    *,
    embed_dim: int,
    num_heads: int,
    num_encoder_layers: int,
    num_decoder_layers: int,
    ff_dim: int,
    dropout: float = 0.0,
    decoder_start_token_id: int = 0,
) -> EncoderDecoderLM:
    """The encoder–decoder of "Attention Is All You Need" over token ids, with fresh weights:
    one token matrix shared by source and target, its vectors (std ``1/√e``) multiplied by
    ``√e`` and added to the sinusoidal encoding; the post-norm stacks of
    :class:`attnkit.nn.Transformer` (LayerNorm, biases, ReLU, no final norm); an untied head
    with a bias. ``attnkit train`` trains it on its encoder–decoder tasks.

    Args:
        vocab_size: ``v``, shared by source and target.
        embed_dim: ``e``, even.
        num_heads: attention heads of every attention.
        num_encoder_layers: encoder depth.
        num_decoder_layers: decoder depth.
        ff_dim: feed-forward hidden dim.
        dropout: dropout on the embeddings and inside the layers.
        decoder_start_token_id: the id the decoder reads first.

    Raises:
        ValueError: inconsistent sizes (from :class:`attnkit.nn.Transformer` and
            :class:`attnkit.nn.SinusoidalPositionalEncoding`).
    """
    token = nn.Embedding(vocab_size, embed_dim)
    # Token entries of unit size once scaled, like the encoding's, so that neither drowns
    # the other (torch's default N(0, 1) times √e drowned the positions: reverse then
    # needed 1750 steps to reach 99% held-out exact match instead of 750).
    nn.init.normal_(token.weight, std=embed_dim**-0.5)
    stacks = Transformer(
        TransformerConfig(
            embed_dim,
            num_heads,
            ff_dim,
            num_encoder_layers=num_encoder_layers,
            num_decoder_layers=num_decoder_layers,
            dropout=dropout,
        )
    )

    def embedding() -> SequenceEmbedding:
        position = SinusoidalPositionalEncoding(embed_dim)
        return SequenceEmbedding(token, scale=math.sqrt(embed_dim), position=position, dropout=dropout)

    return EncoderDecoderLM(
        source_embedding=embedding(),
        target_embedding=embedding(),
        encoder=stacks.encoder,
        decoder=stacks.decoder,
        head=LMHead(embed_dim, vocab_size, bias=True),
        decoder_start_token_id=decoder_start_token_id,
    )
