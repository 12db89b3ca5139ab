"""A decoder-only language model (GPT, LLaMA): token embedding, a stack of causal
decoder layers, and a head that predicts the next token.

Shape letters: ``b`` batch, ``s`` sequence length, ``n`` generated tokens, ``e`` model dim,
``v`` vocabulary size.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import KW_ONLY, dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from attnkit.deprecation import deprecated_aliases
from attnkit.functional.finite import check_finite
from attnkit.nn.dropout import Dropout
from attnkit.nn.feedforward import Activation
from attnkit.nn.hooked_attention import MultiHeadAttention
from attnkit.nn.hooks import HookPoint
from attnkit.nn.kv_cache import DecoderCache
from attnkit.nn.layers import DecoderLayer, LayerConfig, MaskLike
from attnkit.nn.norms import make_norm
from attnkit.nn.positional import (
    ALiBi,
    AttentionPositional,
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
)
from attnkit.nn.records import LMOutput, StackOutput
from attnkit.nn.text_module import TextModule, check_token_ids, padding_positions
from attnkit.nn.transformer import Decoder, LayerSelection

PositionalKind = Literal["learned", "sinusoidal", "rotary", "alibi", "none"]
POSITIONAL_KINDS: tuple[str, ...] = ("learned", "sinusoidal", "rotary", "alibi", "none")


@dataclass(frozen=True)
class DecoderLMConfig(LayerConfig):
    """What :class:`DecoderLM` is built from: the :class:`attnkit.nn.LayerConfig` of every
    layer (pre-norm GELU layers without dropout by default, GPT-2's), the vocabulary,
    the depth and the positional encoding.

    With ``positional="rotary", norm="rms", activation="swiglu", bias=False`` it is the
    LLaMA architecture.

    Args:
        embed_dim, num_heads, ff_dim, and the keyword options of
            :class:`attnkit.nn.LayerConfig`: every layer's (``dropout`` is also the
            embeddings'; ``bias`` never gives the head one).
        vocab_size: ``v``.
        num_layers: depth.
        positional: ``"learned"`` or ``"sinusoidal"`` (added to the token embeddings),
            ``"rotary"`` or ``"alibi"`` (inside attention, one module shared by every
            layer), or ``"none"``.
        max_length: positions of the ``"learned"`` table, or of the cosine/sine tables
            precomputed for ``"rotary"`` (which still encodes longer sequences).
        rope_theta: base of the rotary frequencies.
        tie_embeddings: the output head shares the token embedding matrix.

    Raises:
        ValueError: an unknown positional kind, ``vocab_size`` or ``num_layers`` below 1,
            ``embed_dim`` not divisible by ``num_heads`` (and the errors of
            :class:`attnkit.nn.LayerConfig`).
        TypeError: kernel options the kernel does not take or needs.
    """

    _: KW_ONLY
    dropout: float = 0.0
    activation: Activation = "gelu"
    norm_first: bool = True
    vocab_size: int
    num_layers: int
    positional: PositionalKind = "learned"
    max_length: int = 1024
    rope_theta: float = 10000.0
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        if self.positional not in POSITIONAL_KINDS:
            raise ValueError(f"positional must be one of {POSITIONAL_KINDS}, got {self.positional!r}")
        if self.vocab_size < 1 or self.num_layers < 1:
            raise ValueError(f"vocab_size and num_layers must be >= 1, got {self.vocab_size} and {self.num_layers}")
        if self.embed_dim % self.num_heads:
            raise ValueError(
                f"embed_dim must be divisible by num_heads, got embed_dim={self.embed_dim} and "
                f"num_heads={self.num_heads}"
            )
        super().__post_init__()


@deprecated_aliases(new_cache="new_kv_cache", removed_in="0.3")
class DecoderLM(TextModule):
    """A GPT-style language model over :class:`attnkit.nn.DecoderLayer` blocks without
    cross-attention.

    Architectures whose layers differ from one another or carry more options (Gemma's
    alternating windows, per-head norms, soft-capping) are assembled from built layers
    with :meth:`from_parts`.

    Args:
        config: the sizes and options, a :class:`DecoderLMConfig`.

    Raises:
        TypeError: a config that is not a ``DecoderLMConfig``.
    """

    def __init__(self, config: DecoderLMConfig) -> None:
        super().__init__()
        if not isinstance(config, DecoderLMConfig):
            raise TypeError(f"config must be an attnkit.nn.DecoderLMConfig, got {type(config).__name__}")
        e, h = config.embed_dim, config.num_heads
        position: LearnedPositionalEmbedding | SinusoidalPositionalEncoding | None = None
        in_attention: AttentionPositional | None = None
        if config.positional == "learned":
            position = LearnedPositionalEmbedding(config.max_length, e)
        elif config.positional == "sinusoidal":
            position = SinusoidalPositionalEncoding(e)
        elif config.positional == "rotary":
            in_attention = RotaryEmbedding(e // h, theta=config.rope_theta, max_positions=config.max_length)
        elif config.positional == "alibi":
            in_attention = ALiBi(h)
        layer = config.layer()
        layers = [DecoderLayer(layer, cross_attention=False, positional=in_attention) for _ in range(config.num_layers)]
        # Pre-norm leaves the residual stream unnormalised after the last layer.
        final_norm = make_norm(config.norm, e, config.norm_eps, bias=config.bias) if config.norm_first else None
        self._assemble(
            nn.Embedding(config.vocab_size, e),
            Decoder(layers, final_norm=final_norm),
            position=position,
            dropout=config.dropout,
            tie_embeddings=config.tie_embeddings,
            embedding_scale=None,
            logit_softcap=None,
        )

    @classmethod
    def from_parts(
        cls,
        token_embedding: nn.Embedding,
        layers: Iterable[DecoderLayer],
        *,
        final_norm: nn.Module | None = None,
        position: LearnedPositionalEmbedding | SinusoidalPositionalEncoding | None = None,
        dropout: float = 0.0,
        tie_embeddings: bool = True,
        embedding_scale: float | None = None,
        logit_softcap: float | None = None,
    ) -> DecoderLM:
        """A language model around built parts: layers that differ from one another (a
        sliding window on some, other rotary frequencies on others) or that carry options
        the constructor does not take.

        Args:
            token_embedding: ``[v, e]``.
            layers: decoder layers without cross-attention, applied in order.
            final_norm: the norm after the last layer (pre-norm stacks), or ``None``.
            position: an absolute encoding added to the embeddings, or ``None``.
            dropout: dropout on the embeddings.
            tie_embeddings: the output head shares the token embedding matrix.
            embedding_scale: multiplies the token embeddings (Gemma: ``√e``), rounded to
                their dtype first as Gemma does; ``None`` for none.
            logit_softcap: soft-cap the logits to ``c · tanh(logits / c)`` (Gemma 2's final
                logit soft-capping); ``None`` for none.

        Returns:
            The model.

        Raises:
            ValueError: no layers, layers with cross-attention, a non-positive
                ``embedding_scale`` or ``logit_softcap``.
            TypeError: a layer that is not a ``DecoderLayer``.
        """
        model = cls.__new__(cls)
        super(DecoderLM, model).__init__()
        decoder = Decoder(layers, final_norm=final_norm)
        if any(layer.cross_attn is not None for layer in decoder.layers):
            raise ValueError("a DecoderLM's layers have no cross-attention; build them with cross_attention=False")
        model._assemble(
            token_embedding,
            decoder,
            position=position,
            dropout=dropout,
            tie_embeddings=tie_embeddings,
            embedding_scale=embedding_scale,
            logit_softcap=logit_softcap,
        )
        return model

    def _assemble(
        self,
        token_embedding: nn.Embedding,
        decoder: Decoder,
        *,
        position: LearnedPositionalEmbedding | SinusoidalPositionalEncoding | None,
        dropout: float,
        tie_embeddings: bool,
        embedding_scale: float | None,
        logit_softcap: float | None,
    ) -> None:
        """Set the parts every constructor shares."""
        for name, value in (("embedding_scale", embedding_scale), ("logit_softcap", logit_softcap)):
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive, got {value}")
        self.vocab_size = token_embedding.num_embeddings
        self.token_embedding = token_embedding
        self.position = position
        self.dropout = Dropout(dropout)
        self.embed = HookPoint()  # what enters the first layer (attnkit.nn.hooks)
        self.decoder = decoder
        self.embedding_scale = embedding_scale
        self.logit_softcap = logit_softcap
        self.lm_head = nn.Linear(token_embedding.embedding_dim, self.vocab_size, bias=False)
        if tie_embeddings:
            self.lm_head.weight = self.token_embedding.weight

    def logits(self, hidden: Tensor) -> Tensor:
        """The head on hidden states (soft-capped when the model says so).

        Args:
            hidden: ``[..., e]``, what :meth:`last_hidden_state` returns.

        Returns:
            Next-token logits ``[..., v]``.
        """
        return soft_cap_logits(self.lm_head(hidden), self.logit_softcap)  # [..., v]

    def self_attention(self, layer: int) -> MultiHeadAttention:
        """The self-attention module of layer ``layer``."""
        attention = self.decoder.layers[layer].self_attn
        assert isinstance(attention, MultiHeadAttention)
        return attention

    def new_kv_cache(self, *, capacity: int | None = None) -> DecoderCache:
        """An empty cache for incremental decoding with :meth:`forward`; with
        ``capacity``, preallocated for that many positions (inference, see
        :class:`attnkit.nn.KVCache`)."""
        return self.decoder.new_kv_cache(capacity=capacity)

    def last_hidden_state(
        self,
        tokens: Tensor,
        *,
        mask: MaskLike | None = None,
        positions: Tensor | None = None,
        kv_cache: DecoderCache | None = None,
        return_weights: LayerSelection = False,
        padding: Tensor | None = None,
        start_at_layer: int = 0,
        residual: Tensor | None = None,
    ) -> Tensor | StackOutput:
        """The last layer's output (after the final norm): what the head turns into logits.

        Generation needs the logits of the last position only; calling the head on
        ``last_hidden_state(...)[:, -1]`` skips a ``[s, e] x [e, v]`` product.

        Args:
            tokens: integer token ids ``[b, s]``; with a cache, only the new ones.
            mask: extra self-attention mask on top of the causal one (``True`` = may
                attend), broadcastable to ``[b, h, s, s_k]`` with ``s_k`` counting cached
                tokens; e.g. padding ``[b, 1, 1, s_k]``.
            positions: token positions ``[s]`` or ``[b, s]`` (default: continuing after the
                cache), for absolute and rotary encodings.
            kv_cache: from :meth:`new_kv_cache`, updated in place.
            return_weights: also return the weights of every layer (``True``) or of the
                layers with these indices.
            padding: ``[b, s]`` bool, ``True`` on tokens and ``False`` on padding (on
                either side): padded keys are masked and each row's positions count its
                tokens only, so that a left-padded row gives its unpadded results; instead
                of ``mask`` and ``positions``, without a cache.
            start_at_layer: run from this layer on, on ``residual`` ``[b, s, e]`` (the
                stream into it) instead of the tokens' embeddings; ``tokens`` then give
                the shape (TransformerLens' ``start_at_layer``).
            residual: the stream into ``start_at_layer``, with it.

        Returns:
            ``[b, s, e]``, or a :class:`attnkit.nn.StackOutput`.

        Raises:
            TypeError: non-integer tokens.
            ValueError: tokens not ``[b, s]``, a layer index out of range, ``padding`` not
                ``[b, s]`` bool or given with ``mask``, ``positions`` or ``kv_cache``.
        """
        check_token_ids(tokens)
        if padding is not None:
            if mask is not None or positions is not None or kv_cache is not None:
                raise ValueError(
                    "padding sets the mask and the positions itself; give it without mask, positions or kv_cache"
                )
            mask, positions = padding_positions(padding, tokens)  # [b, 1, 1, s], [b, s]
        if residual is None:  # the stream from the tokens, into the first layer
            residual = self.embed(self.dropout(self._embedded(tokens, positions, kv_cache)))  # [b, s, e]
            start_at_layer = 0
        return self.decoder(
            residual,
            mask=mask,
            causal=True,
            positions=positions,
            kv_cache=kv_cache,
            return_weights=return_weights,
            start_at_layer=start_at_layer,
        )

    def _embedded(self, tokens: Tensor, positions: Tensor | None, kv_cache: DecoderCache | None) -> Tensor:
        """The token embeddings ``[b, s, e]`` of ids ``[b, s]``, scaled and with the absolute
        positional encoding added (positions continue after the cache unless given)."""
        x = self.token_embedding(tokens)  # [b, s, e]
        if self.embedding_scale is not None:
            x = x * torch.tensor(self.embedding_scale, dtype=x.dtype)
        if self.position is not None:
            past = 0 if kv_cache is None else len(kv_cache)
            start = torch.arange(past, past + tokens.shape[1], device=tokens.device)
            x = self.position(x, start if positions is None else positions)
        return x

    def forward(
        self,
        tokens: Tensor,
        *,
        mask: MaskLike | None = None,
        positions: Tensor | None = None,
        kv_cache: DecoderCache | None = None,
        return_weights: LayerSelection = False,
    ) -> Tensor | LMOutput:
        """Next-token logits at every position.

        Args:
            tokens: integer token ids ``[b, s]``; with a cache, only the new ones.
            mask: extra self-attention mask on top of the causal one (``True`` = may
                attend), broadcastable to ``[b, h, s, s_k]`` with ``s_k`` counting cached
                tokens; e.g. padding ``[b, 1, 1, s_k]``.
            positions: token positions ``[s]`` or ``[b, s]`` (default: continuing after the
                cache), for absolute and rotary encodings.
            kv_cache: from :meth:`new_kv_cache`, updated in place.
            return_weights: also return the weights of every layer (``True``) or of the
                layers with these indices (``None`` in place of the others).

        Returns:
            Logits ``[b, s, v]``, or a :class:`attnkit.nn.LMOutput`.

        Raises:
            TypeError: non-integer tokens.
            ValueError: tokens not ``[b, s]``, a layer index out of range.
        """
        # Always a record inside (no layer's weights when none are asked for): one path.
        decoded = self.last_hidden_state(
            tokens,
            mask=mask,
            positions=positions,
            kv_cache=kv_cache,
            return_weights=[] if return_weights is False else return_weights,
        )
        assert isinstance(decoded, StackOutput)  # weights asked for (none, maybe): a record
        logits = self.logits(decoded.output)  # [b, s, v]
        return logits if return_weights is False else LMOutput(logits, decoded.weights)

    @torch.no_grad()
    def generate(
        self,
        tokens: Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 0.0,
        top_k: int | None = None,
        eos_token_id: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Continue ``tokens`` with a KV cache (:meth:`stream`): one forward over the
        prompt, then one forward of one token per step. Runs in evaluation mode (no
        dropout) and restores the previous mode afterwards.

        Args:
            tokens: prompt ids ``[b, s]`` (all rows the same length).
            max_new_tokens: ``n``, the most tokens to add.
            temperature: ``0`` picks the most likely token (greedy); above 0 samples from
                ``softmax(logits / temperature)``.
            top_k: when sampling, only from the ``top_k`` most likely tokens.
            eos_token_id: a row that produced it keeps producing it; generation stops
                early once every row has.
            generator: random generator for sampling.

        Returns:
            ``[b, s + n']`` with ``n' <= n`` (fewer only when every row ended).

        Raises:
            ValueError: ``max_new_tokens < 0``, ``temperature < 0``, ``top_k < 1``.
        """
        steps = self.stream(tokens, max_new_tokens, temperature=temperature, top_k=top_k, generator=generator)
        produced = run_to_end(self, steps, rows=tokens.shape[0], device=tokens.device, eos_token_id=eos_token_id)
        return torch.cat([tokens, *produced], dim=1)  # [b, s + n']

    def stream(
        self,
        tokens: Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
        use_kv_cache: bool = True,
    ) -> Iterator[Tensor]:
        """The decoding loop: the next token of every row, one step at a time, computed as
        the iterator is consumed. The prompt runs once into a KV cache (the head on its
        last position only), then each step runs the previous step's token against the
        cache; without the KV cache, each step runs the whole sequence so far. Each step opens its own ``inference_mode``: a mode left open across a
        ``yield`` would leak into the caller's code between steps. The module's mode
        (training or evaluation) is the caller's.

        Args:
            tokens: prompt ids ``[b, s]`` (all rows the same length).
            max_new_tokens: ``n``, the number of steps.
            temperature: ``0`` picks the most likely token (greedy); above 0 samples from
                ``softmax(logits / temperature)``.
            top_k: when sampling, only from the ``top_k`` most likely tokens.
            top_p: when sampling, only from the nucleus (:func:`pick_next_token`).
            generator: random generator for sampling.
            use_kv_cache: keep the keys and values between steps.

        Returns:
            An iterator of ``n`` token id tensors ``[b]``.

        Raises:
            ValueError: ``max_new_tokens < 0``, ``temperature < 0``, ``top_k < 1``, ``top_p``
                outside ``(0, 1]`` (at the call, before any step).
        """
        check_decoding_options(max_new_tokens, temperature, top_k, top_p)
        return self._steps(tokens, max_new_tokens, temperature, top_k, top_p, generator, use_kv_cache)

    def _steps(
        self,
        tokens: Tensor,
        max_new_tokens: int,
        temperature: float,
        top_k: int | None,
        top_p: float | None,
        generator: torch.Generator | None,
        use_kv_cache: bool = True,
    ) -> Iterator[Tensor]:
        cache = self.new_kv_cache(capacity=tokens.shape[1] + max_new_tokens) if use_kv_cache else None

        def next_logits(step_input: Tensor) -> Tensor:
            # The head on the last position only: the others' logits are not needed.
            hidden = self.last_hidden_state(step_input, kv_cache=cache)  # [b, s, e]: no weights asked for
            assert isinstance(hidden, Tensor)
            return self.logits(hidden[:, -1])  # [b, v]

        yield from decoding_loop(
            next_logits, tokens, max_new_tokens, temperature, top_k, generator, feed_all=not use_kv_cache, top_p=top_p
        )


def decoding_loop(
    next_logits: Callable[[Tensor], Tensor],
    first_input: Tensor,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    generator: torch.Generator | None,
    *,
    feed_all: bool = False,
    top_p: float | None = None,
) -> Iterator[Tensor]:
    """The one decoding loop of every language model (:meth:`DecoderLM.stream`,
    :meth:`attnkit.nn.EncoderDecoderLM.stream`): each step feeds its input to
    ``next_logits`` (which runs the network against its KV cache), picks the next token of
    every row and feeds it to the next step. Each step opens its own ``inference_mode``: a
    mode left open across a ``yield`` would leak into the caller's code between steps.

    Args:
        next_logits: step input ids ``[b, s]`` → the next-token logits ``[b, v]``.
        first_input: the first step's ids ``[b, s]`` (a prompt, a decoder start token);
            every later step's is the token just picked, ``[b, 1]``.
        max_new_tokens: ``n``, the number of steps.
        temperature, top_k, generator: as :func:`pick_next_token` takes them.
        feed_all: every step's input is the first input and every token picked so far
            (for a ``next_logits`` without a KV cache).
        top_p: as :func:`pick_next_token` takes it.

    Returns:
        An iterator of ``n`` token id tensors ``[b]``, computed as it is consumed.
    """
    step_input = first_input  # [b, s], then [b, 1]
    for _ in range(max_new_tokens):
        with torch.inference_mode():
            next_token = pick_next_token(
                next_logits(step_input), temperature=temperature, top_k=top_k, top_p=top_p, generator=generator
            )  # [b]
        yield next_token
        step_input = (
            torch.cat([step_input, next_token[:, None]], dim=1) if feed_all else next_token[:, None]
        )  # [b, s'] or [b, 1]


def run_to_end(
    module: nn.Module, steps: Iterator[Tensor], *, rows: int, device: torch.device, eos_token_id: int | None
) -> list[Tensor]:
    """Consume a decoding loop in evaluation mode (no dropout), restoring the module's mode
    afterwards: what ``generate`` of every language model returns.

    Args:
        module: the network the steps run.
        steps: the decoding loop, token ids ``[b]`` per step.
        rows: ``b``.
        device: where the token ids are.
        eos_token_id: a row that produced it keeps producing it; the loop stops once every
            row has.

    Returns:
        Each step's tokens ``[b, 1]``, in order.
    """
    was_training = module.training
    module.eval()
    try:
        out = []
        finished = torch.zeros(rows, dtype=torch.bool, device=device)
        for next_token in steps:  # [b]
            if eos_token_id is not None:
                next_token = torch.where(finished, torch.full_like(next_token, eos_token_id), next_token)
                finished |= next_token == eos_token_id
            out.append(next_token[:, None])  # [b, 1]
            if finished.all():
                break
        return out
    finally:
        module.train(was_training)


def soft_cap_logits(logits: Tensor, softcap: float | None) -> Tensor:
    """A head's logits soft-capped to ``softcap · tanh(logits / softcap)`` (Gemma 2), or
    unchanged when ``softcap`` is ``None``.

    Args:
        logits: ``[..., v]``.
        softcap: the cap, positive, or ``None``.

    Returns:
        ``[..., v]``, within ``[-softcap, softcap]`` when capped.
    """
    if softcap is None:
        return logits
    return torch.tanh(logits / softcap) * softcap


def check_decoding_options(
    max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None = None
) -> None:
    """Raise ``ValueError`` for options no decoding loop can take, before any step runs.

    Raises:
        ValueError: ``max_new_tokens < 0``, ``temperature`` not a finite number ``>= 0``,
            ``top_k < 1``, ``top_p`` outside ``(0, 1]``.
    """
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise ValueError(f"top_p must be a probability mass in (0, 1], got {top_p!r}")


def pick_next_token(
    logits: Tensor,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Choose the next token from next-token logits.

    Args:
        logits: ``[b, v]``.
        temperature: ``0`` takes the most likely token (greedy, the first on ties); above 0
            samples from ``softmax(logits / temperature)``.
        top_k: when sampling, only from the ``top_k`` most likely tokens.
        top_p: when sampling, only from the nucleus: the most likely tokens whose
            probabilities (after ``temperature`` and ``top_k``) first add up to ``top_p``
            or more, renormalised. With ``top_k`` too, the nucleus is taken of the
            ``top_k`` tokens, as ``transformers`` does.
        generator: random generator for sampling.

    Returns:
        Token ids ``[b]``.

    Raises:
        ValueError: logits that are NaN or infinite (an overflowing model would otherwise
            give the same token over and over).
    """
    check_finite(logits, "the next-token logits")
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # [b, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        logits = logits.masked_fill(~nucleus(logits, top_p), float("-inf"))
    probs = torch.softmax(logits, dim=-1)  # [b, v]
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def nucleus(logits: Tensor, top_p: float) -> Tensor:
    """The nucleus of next-token logits: the fewest most likely tokens whose probabilities
    add up to ``top_p`` or more (the most likely token always).

    Args:
        logits: ``[b, v]``.
        top_p: the probability mass, in ``(0, 1]``.

    Returns:
        ``[b, v]`` bool, ``True`` on the tokens of the nucleus.
    """
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # [b, v]
    probs = sorted_logits.softmax(dim=-1)  # [b, v], most likely first
    mass_before = probs.cumsum(dim=-1) - probs  # [b, v]: the mass of the likelier tokens
    kept_sorted = mass_before < top_p  # [b, v]
    return kept_sorted.scatter(-1, order, kept_sorted)  # [b, v]
