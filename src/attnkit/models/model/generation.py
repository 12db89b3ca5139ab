"""Generation by a :class:`attnkit.models.Model`: a causal decoder continues a prompt, an
encoder–decoder produces the target of a source, token by token with a KV cache, streamed
as the caller consumes it; a mixin over the attributes listed on :class:`GenerationMixin`,
so that it never imports :mod:`attnkit.models.model`. The decoding loops themselves are the
networks' (:meth:`attnkit.nn.DecoderLM.stream`, :meth:`attnkit.nn.EncoderDecoderLM.stream`).
"""

from __future__ import annotations

import contextvars
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.models.checkpoints.memory import check_fits, kv_cache_bytes
from attnkit.models.checkpoints.tokenizer import Tokenizer
from attnkit.models.families.family import ModelConfig
from attnkit.models.model.core import ModelCore
from attnkit.models.model.kinds import GENERATES, require_kind
from attnkit.nn import pack_projections
from attnkit.nn.lm import check_decoding_options
from attnkit.nn.text_module import DecodingModule, TextModule


@dataclass(frozen=True)
class GeneratedPiece:
    """What :meth:`LensMixin.generate_stream` yields: token ids and the text they complete.

    Attributes:
        ids: the tokens generated since the last piece (usually one).
        text: their text.
    """

    ids: list[int]
    text: str


@dataclass(frozen=True)
class Sampling:
    """How a generation picks each token: the options of
    :meth:`GenerationMixin.generate_ids` that :func:`attnkit.nn.lm.pick_next_token` reads,
    and the seed of its generator."""

    temperature: float
    top_k: int | None
    top_p: float | None
    seed: int | None


class GenerationMixin(ModelCore):
    """Generation over the attributes below.

    Attributes (what the mixin reads of its class):
        name, family: for messages.
        module: the network (an :class:`attnkit.nn.DecoderLM` or
            :class:`attnkit.nn.EncoderDecoderLM` for the models that generate).
        config: its :class:`attnkit.models.families.family.ModelConfig` (the head dim).
        tokenizer: the :class:`attnkit.models.Tokenizer` (end-of-sequence ids, text).
        causal, encoder_decoder: which kind of model, and so whether it generates.
        max_length, num_layers, num_decoder_layers, num_heads, num_kv_heads: sizes.
    """

    name: str
    family: str
    module: TextModule
    config: ModelConfig
    tokenizer: Tokenizer
    causal: bool
    encoder_decoder: bool
    max_length: int
    num_layers: int
    num_decoder_layers: int
    num_heads: int
    num_kv_heads: int
    _packed: bool

    def generate_ids(
        self,
        prompt: str | Tensor | Sequence[int],
        *,
        max_new_tokens: int = 32,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        use_kv_cache: bool = True,
        stop_at_eos: bool = True,
        eos_token_id: int | Sequence[int] | None = None,
        prepend_bos: bool | None = None,
    ) -> Iterator[int]:
        """Continue a prompt token by token with a KV cache (causal decoders), or produce
        the target of a source (encoder–decoders: the prompt is the source).

        The prompt runs once (its logits computed for the last position only; an
        encoder–decoder's encoder reads it once), then each step runs one token against
        the cache. Generation stops after ``max_new_tokens``, at an end-of-sequence token
        (not yielded; unless ``stop_at_eos=False``), or when the context is full. The hooks
        active at this call act on every step (see :mod:`attnkit.nn.hooks` for what a point
        sees with a KV cache).

        Args:
            prompt: a text, or token ids ``[s]`` / ``[1, s]``.
            max_new_tokens: the most tokens to produce.
            temperature: ``0`` is greedy (the most likely token); above 0 samples from
                ``softmax(logits / temperature)``.
            top_k: when sampling, only from the ``top_k`` most likely tokens.
            top_p: when sampling, only from the nucleus: the most likely tokens whose
                probabilities first add up to ``top_p`` or more, renormalised (with
                ``top_k`` too, the nucleus of the ``top_k`` tokens).
            seed: seed of the sampling generator, for reproducible samples.
            use_kv_cache: ``False`` runs every step over the whole sequence so far, without
                a KV cache (TransformerLens' ``use_past_kv_cache=False``): the same tokens,
                more work.
            stop_at_eos: ``False`` keeps producing after an end-of-sequence token (yielded
                as any other) up to ``max_new_tokens``.
            eos_token_id: the token or tokens that end the generation, instead of the
                checkpoint's (``model.tokenizer.eos_token_ids``); unread with
                ``stop_at_eos=False``, as in TransformerLens.
            prepend_bos: for a text, as :meth:`tokenize` takes it (``True`` puts the BOS
                token first, as TransformerLens does); ids are taken as they are.

        Returns:
            An iterator of token ids, computed as it is consumed.

        Raises:
            ValueError: an encoder-only model, an empty or too long prompt, ``max_new_tokens < 0``,
                a ``temperature`` that is not a finite number ``>= 0``, ``top_k < 1``,
                ``top_p`` outside ``(0, 1]``, an ``eos_token_id`` outside the vocabulary
                (at the call, before any token).
        """
        require_kind(self, GENERATES, what="it cannot generate text")
        check_decoding_options(max_new_tokens, temperature, top_k, top_p)
        stop_ids = self._stop_ids(stop_at_eos, eos_token_id)
        ids, _, _ = self.prepare_input(prompt, prepend_bos=prepend_bos)
        if not self._packed:
            # One matrix product for q/k/v and for SwiGLU's gate/up: the same results, fewer
            # calls per decoding step (attnkit.nn.packing). Done on the first generation
            # rather than at load, where copying 280 MB of weights would slow down every
            # command that only runs a text once.
            pack_projections(self.module)
            self._packed = True
        # Every step runs in the context of this call: the hooks active here act on the
        # whole generation, however late the caller consumes it.
        context = contextvars.copy_context()
        # A decoder-only model's prompt and continuation share the context; an
        # encoder-decoder's target has the whole context to itself.
        room = self.max_length - (0 if self.encoder_decoder else ids.shape[1])
        self._check_generation_memory(ids.shape[1], min(max_new_tokens, room))
        sampling = Sampling(temperature, top_k, top_p, seed)
        return self._generate(context, ids, min(max_new_tokens, room), sampling, use_kv_cache, stop_ids)

    def _stop_ids(self, stop_at_eos: bool, eos_token_id: int | Sequence[int] | None) -> frozenset[int]:
        """The ids that end a generation: none without ``stop_at_eos``, the checkpoint's
        unless ``eos_token_id`` names others.

        Raises:
            ValueError: an ``eos_token_id`` that is not token ids of the vocabulary.
        """
        if not stop_at_eos:
            return frozenset()
        if eos_token_id is None:
            return self.tokenizer.eos_token_ids
        given = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        vocab_size = self.config.vocab_size
        if not given or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab_size for i in given):
            raise ValueError(
                f"eos_token_id must be a token id or a list of token ids in [0, {vocab_size}), got {eos_token_id!r}"
            )
        return frozenset(given)

    def _check_generation_memory(self, prompt: int, budget: int) -> None:
        """Refuse a generation whose KV cache (every layer's keys and values over the
        prompt and ``budget`` new tokens) would not fit on the model's device."""
        head_dim = getattr(self.config, "head_dim", None) or self.config.hidden_size // self.num_heads
        layers = self.num_layers + self.num_decoder_layers
        itemsize = next(self.module.parameters()).dtype.itemsize
        check_fits(
            kv_cache_bytes(layers, self.num_kv_heads, head_dim, prompt + budget, itemsize),
            self.device,
            what=f"the KV cache of {self.name} for {prompt} prompt and {budget} new tokens",
            advice="ask for fewer new tokens (--max-new-tokens) or a shorter prompt",
        )

    def _generate(
        self,
        context: contextvars.Context,
        ids: Tensor,
        budget: int,
        sampling: Sampling,
        use_kv_cache: bool,
        stop_ids: frozenset[int],
    ) -> Iterator[int]:
        generator = None
        if sampling.temperature > 0 and sampling.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(sampling.seed)
        # A causal family's network continues the prompt; an encoder-decoder's translates it.
        assert isinstance(self.module, DecodingModule)
        steps = self.module.stream(
            ids.to(self.device),
            budget,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            generator=generator,
            use_kv_cache=use_kv_cache,
        )
        while (token := context.run(next, steps, None)) is not None:  # [1]
            if token.numel() != 1:
                raise ValueError(
                    f"generate continues one text, so each step must give 1 token; a hook changed the batch to "
                    f"{token.numel()} rows"
                )
            token_id = int(token)
            if token_id in stop_ids:
                return
            yield token_id

    def generate(
        self,
        prompt: str | Tensor | Sequence[int],
        *,
        max_new_tokens: int = 32,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        include_prompt: bool = False,
        use_kv_cache: bool = True,
        stop_at_eos: bool = True,
        eos_token_id: int | Sequence[int] | None = None,
        prepend_bos: bool | None = None,
    ) -> Iterator[str]:
        """Continue a prompt (a causal decoder) or produce the target of a source (an
        encoder–decoder), streaming the text as it is produced.

        Args:
            prompt: the text to continue or the source (as is; no chat template is
                applied), or its token ids.
            max_new_tokens: the most tokens to produce.
            temperature: ``0`` is greedy; above 0 samples.
            top_k: when sampling, only from the ``top_k`` most likely tokens.
            top_p: when sampling, only from the nucleus (:meth:`generate_ids`).
            seed: seed of the sampling generator.
            include_prompt: the prompt's text comes first (the source's, for an
                encoder–decoder; a text as given, without the BOS ``prepend_bos`` adds),
                so that the pieces join to the prompt and its continuation, as
                TransformerLens' ``generate`` returns them.
            use_kv_cache, stop_at_eos, eos_token_id, prepend_bos: as :meth:`generate_ids`
                takes them; with ``stop_at_eos=False`` an end-of-sequence token's text
                (SmolLM2's ``<|im_end|>``) is part of the continuation.

        Returns:
            An iterator of text pieces that join to the continuation (after the prompt
            with ``include_prompt``).

        Raises:
            ValueError: as :meth:`generate_ids`, raised at the call, before any token.
        """
        ids = self.generate_ids(
            prompt,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            use_kv_cache=use_kv_cache,
            stop_at_eos=stop_at_eos,
            eos_token_id=eos_token_id,
            prepend_bos=prepend_bos,
        )
        pieces = self.tokenizer.stream(ids)
        if not include_prompt:
            return pieces
        text = prompt if isinstance(prompt, str) else self.tokenizer.decode(self.prepare_input(prompt)[0][0])
        return itertools.chain([text], pieces)

    def generate_stream(
        self,
        prompt: str | Tensor | Sequence[int],
        *,
        max_new_tokens: int = 32,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        use_kv_cache: bool = True,
        stop_at_eos: bool = True,
        eos_token_id: int | Sequence[int] | None = None,
        prepend_bos: bool | None = None,
    ) -> Iterator[GeneratedPiece]:
        """Generate as :meth:`attnkit.models.Model.generate_ids` does, yielding each
        token's id with the text it completes as soon as it is decoded (TransformerLens'
        ``generate_stream``).

        A byte-level tokenizer may spell one character over several tokens: their ids come
        together, in one piece, once the character is whole.

        Args:
            prompt, max_new_tokens, temperature, top_k, top_p, seed, use_kv_cache,
                stop_at_eos, eos_token_id, prepend_bos: as
                :meth:`attnkit.models.Model.generate_ids` takes them.

        Returns:
            An iterator of :class:`GeneratedPiece`; their ``ids`` join to the generated ids
            and their ``text`` to the generated text.

        Raises:
            ValueError: as :meth:`attnkit.models.Model.generate_ids`, at the call.
        """
        ids = self.generate_ids(
            prompt,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            use_kv_cache=use_kv_cache,
            stop_at_eos=stop_at_eos,
            eos_token_id=eos_token_id,
            prepend_bos=prepend_bos,
        )
        return self._pieces(ids)

    def _pieces(self, ids: Iterator[int]) -> Iterator[GeneratedPiece]:
        produced: list[int] = []

        def recorded() -> Iterator[int]:
            for token_id in ids:
                produced.append(token_id)
                yield token_id

        released = 0
        for text in self.tokenizer.stream(recorded()):
            yield GeneratedPiece(ids=produced[released:], text=text)
            released = len(produced)
