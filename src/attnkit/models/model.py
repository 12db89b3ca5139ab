"""``load`` a checkpoint onto attnkit modules, and the :class:`Model` that runs it.

Shape letters: ``s`` number of tokens, ``h`` query heads, ``h_sel`` selected heads,
``e`` model dim, ``v`` vocabulary size.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from attnkit.functional.indices import normalize_indices, select_indices
from attnkit.models.attentions import LayerAttentions
from attnkit.models.encoder_decoder import (
    HeadSelection,
    Seq2SeqRun,
    attention_head_counts,
    network,
    run_seq2seq,
    run_seq2seq_batch,
)
from attnkit.models.family import ModelConfig, ModelFamily
from attnkit.models.lens import LensMixin
from attnkit.models.memory import check_fits, check_run_memory, kv_cache_bytes
from attnkit.models.tokenizer import TokenizedText, Tokenizer
from attnkit.nn import (
    ActivationCache,
    DecoderLayer,
    DecoderLM,
    EncoderDecoderLM,
    EncoderLayer,
    HookedModule,
    LayerSelection,
    StackOutput,
    pack_projections,
)
from attnkit.nn.hooks import HookFn, HookPoint, NameFilter


@dataclass(frozen=True)
class ModelRun:
    """What one forward pass of :meth:`Model.run` produced.

    Attributes:
        ids: token ids ``[1, s]``.
        tokens: the ``s`` token strings (see :class:`attnkit.models.TokenizedText`).
        offsets: each token's ``(start, end)`` character span in the text; ``None`` when
            the run was given ids rather than text.
        logits: next-token logits ``[1, s, v]`` (LLaMA), or ``None`` (BERT, or a run
            without them).
        hidden_states: the last layer's output ``[1, s, e]`` (after the final norm for
            LLaMA, what the head reads).
        attentions: layer index → weights ``[1, h_sel, s, s]`` float32 of the selected
            heads, for the layers asked for; rows are queries, columns keys. A
            :class:`LayerAttentions`: ``attentions[-1]`` is the last layer's.
        heads: the selected head indices, in the order of dimension 1 of every map.
        cache: the activations asked for with ``cache=``, by name
            (:mod:`attnkit.nn.hooks`), batch dimension 1, in the model's dtype.
    """

    ids: Tensor
    tokens: list[str]
    offsets: list[tuple[int, int]] | None
    logits: Tensor | None
    hidden_states: Tensor
    attentions: dict[int, Tensor]
    heads: list[int]
    cache: dict[str, Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class HookedRun:
    """What :meth:`Model.run_with_hooks` produced.

    Attributes:
        hidden_states: the last hidden states ``[b, s, e]`` (after the final norm for
            LLaMA).
        cache: the activations asked for, by name.
        logits: next-token logits ``[b, s, v]`` (LLaMA), or ``None`` (BERT).
    """

    hidden_states: Tensor
    cache: ActivationCache
    logits: Tensor | None


class RunStopped(RuntimeError):
    """A :meth:`Model.run_batch` pass ended early because its ``stop`` said so."""


class Model(LensMixin):
    """A real checkpoint on attnkit modules, with its tokenizer. Get one with :func:`load`.

    Attributes:
        name: ``"smollm2"``, ``"minilm"``, or the folder name of a local checkpoint.
        family: ``"llama"`` (causal decoder) or ``"bert"`` (bidirectional encoder): the
            :attr:`attnkit.models.family.ModelFamily.name` of ``architecture``.
        architecture: the :class:`attnkit.models.family.ModelFamily` that runs it.
        path: the checkpoint folder.
        config: the family's config (:class:`attnkit.models.llama.LlamaConfig` or
            :class:`attnkit.models.bert.BertConfig`).
        num_layers: depth.
        num_heads: query heads per layer (an encoder–decoder's encoder; each stack's in
            :attr:`heads_per_kind`).
        num_kv_heads: key/value heads per layer (fewer than ``num_heads`` with GQA).
        max_length: the most tokens one text may have (the model's context).
        causal: whether a token attends only to itself and earlier tokens.
        encoder_decoder: an encoder–decoder (T5, BART): :meth:`run` reads one text with
            its encoder, :meth:`run_seq2seq` a source and a target with the three kinds of
            attention, and generation translates a source.
        num_decoder_layers: the decoder's depth (encoder–decoders; 0 otherwise).
        module: the network, an :class:`attnkit.nn.DecoderLM` or
            :class:`attnkit.models.bert.BertModel`, in evaluation mode.
        tokenizer: the :class:`attnkit.models.Tokenizer`.
    """

    def __init__(
        self,
        *,
        name: str,
        architecture: ModelFamily,
        path: Path,
        config: ModelConfig,
        module: HookedModule,
        tokenizer: Tokenizer,
    ) -> None:
        self.name = name
        self.architecture = architecture
        self.family = architecture.name
        self.path = path
        self.config = config
        self.module = module
        self.tokenizer = tokenizer
        self.num_layers = config.num_layers
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.max_length = config.max_length
        self.causal = architecture.causal
        self.encoder_decoder = architecture.encoder_decoder
        self.num_decoder_layers = getattr(config, "num_decoder_layers", 0) if self.encoder_decoder else 0
        self._packed = False

    def __repr__(self) -> str:
        return (
            f"Model({self.name!r}, family={self.family!r}, layers={self.num_layers}, heads={self.num_heads}, "
            f"kv_heads={self.num_kv_heads}, max_length={self.max_length})"
        )

    @property
    def device(self) -> torch.device:
        """Where the weights are."""
        return next(self.module.parameters()).device

    def tokenize(self, text: str) -> TokenizedText:
        """Split a text into the model's tokens (with ``[CLS]``/``[SEP]`` for BERT).

        Args:
            text: a non-empty string.

        Returns:
            A :class:`attnkit.models.TokenizedText` with ids ``[1, s]``.

        Raises:
            TypeError: ``text`` is not a string.
            ValueError: an empty text, or one longer than :attr:`max_length` tokens.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        encoded = self.tokenizer.encode(text)
        if not text or all(encoded.special):
            raise ValueError(f"text is empty: {self.name} needs at least one token, got {text!r}")
        self._check_length(len(encoded))
        return encoded

    def run(
        self,
        text_or_ids: str | Tensor | Sequence[int],
        *,
        return_weights: LayerSelection = True,
        heads: Sequence[int] | None = None,
        logits: bool = True,
        cache: NameFilter = (),
    ) -> ModelRun:
        """One forward pass: logits (LLaMA) or hidden states, and attention weights.

        Layers whose weights are not asked for run on the fused kernel, which never
        materialises the ``[h, s, s]`` weights. Hooks of enclosing :meth:`hooks` blocks
        act on the run (:mod:`attnkit.nn.hooks`).

        Args:
            text_or_ids: a text, or token ids ``[s]`` / ``[1, s]``.
            return_weights: ``True`` for every layer's weights, ``False`` for none, or a list
                of layer indices (negative ones count from the end: ``-1`` is the last layer),
                as the ``return_weights`` of the :mod:`attnkit.nn` stacks.
            heads: the heads to keep (negative ones count from the end); default all.
            logits: compute the next-token logits (LLaMA); ``False`` skips the vocabulary
                projection when only attention is wanted, and the run's ``logits`` is
                ``None``.
            cache: the activations to return in :attr:`ModelRun.cache`: names
                (:meth:`hook_names`), a predicate on names, or ``None`` for every one.

        Returns:
            A :class:`ModelRun`.

        Raises:
            TypeError: ids that are not integers.
            ValueError: an empty or too long input, ids outside the vocabulary, a layer or
                head out of range, weights that would exceed :data:`ATTENTION_MEMORY_LIMIT`
                bytes, or an unknown name in ``cache`` (the message lists the names).
            MemoryEstimateError: the weights, cached activations and logits asked for
                would exceed the memory available (:mod:`attnkit.models.memory`).
        """
        ids, tokens, offsets = self.prepare_input(text_or_ids)
        layers, head_list = self._selection(return_weights, heads)
        s = ids.shape[1]
        check_run_memory(
            self,
            [(1, s)],
            weight_layers=len(layers),
            cache=cache,
            logits=logits,
            on=f"{s} tokens",
            advice="ask for fewer layers (--layers), fewer cached activations or a shorter text",
        )
        select_heads = head_list != list(range(self.num_heads))
        # no_grad rather than inference_mode: the returned tensors stay ordinary tensors
        # that callers may use in any mode.
        with torch.no_grad(), self.module.hook_session(cache=cache) as kept:
            out = self.architecture.hidden_states(self.module, ids.to(self.device), layers, None)
            hidden = out.output  # [1, s, e]
            all_weights = {i: _self_attention_of(out, i) for i in layers}  # [1, h, s, s] each
            scores = self.architecture.logits(self.module, hidden) if logits else None  # [1, s, v], or None
            attentions = {}
            for i, weights in all_weights.items():
                if select_heads:
                    weights = weights[:, head_list]  # [1, h_sel, s, s]
                attentions[i] = weights.float()
        return ModelRun(
            ids=ids,
            tokens=tokens,
            offsets=offsets,
            logits=None if scores is None else scores.float(),
            hidden_states=hidden.float(),
            attentions=LayerAttentions(attentions, self.num_layers),
            heads=head_list,
            cache=kept,
        )

    @property
    def heads_per_kind(self) -> dict[str, int]:
        """Heads per layer of each kind of attention: ``{"self": num_heads}`` for a model
        of one text; ``{"encoder", "decoder", "cross"}`` for an encoder–decoder, whose
        stacks may differ (BART's ``encoder_attention_heads`` and
        ``decoder_attention_heads``; :attr:`num_heads` is the encoder's)."""
        if not self.encoder_decoder:
            return {"self": self.num_heads}
        return attention_head_counts(network(self))

    def run_seq2seq(
        self,
        source: str | Tensor | Sequence[int],
        target: str | Tensor | Sequence[int] | None = None,
        *,
        encoder_layers: LayerSelection = True,
        decoder_layers: LayerSelection = True,
        heads: HeadSelection = None,
        max_new_tokens: int = 32,
    ) -> Seq2SeqRun:
        """A source and a target through an encoder–decoder, with its three kinds of
        attention: the encoder's self-attention, the decoder's masked self-attention and
        the decoder's cross-attention to the source (:mod:`attnkit.models.encoder_decoder`).

        Without a target the model produces one first, greedily (the encoder once, the
        decoder with its KV cache) until its end-of-sequence token or ``max_new_tokens``;
        the maps are then those it computed while producing it.

        Args:
            source: a text, or token ids ``[s]`` / ``[1, s]``.
            target: a text or ids (tokenized with the model's special tokens, e.g. T5's
                closing ``</s>``), or ``None`` to generate it.
            encoder_layers: the encoder layers whose weights to return (``True`` for all,
                indices, negative from the end).
            decoder_layers: the decoder layers whose self- and cross-attention weights to
                return.
            heads: the heads to keep: one list for every kind of attention, or a mapping
                kind (``"encoder"``, ``"decoder"``, ``"cross"``) → list, for stacks with
                different head counts (:attr:`heads_per_kind`); default all.
            max_new_tokens: the most tokens to generate when no target is given.

        Returns:
            A :class:`attnkit.models.encoder_decoder.Seq2SeqRun`.

        Raises:
            ValueError: a model that is not an encoder–decoder, an empty or too long text,
                a layer or head out of range, weights over :data:`ATTENTION_MEMORY_LIMIT`.
            TypeError: ids that are not integers.
        """
        return run_seq2seq(
            self,
            source,
            target,
            encoder_layers=encoder_layers,
            decoder_layers=decoder_layers,
            heads=heads,
            max_new_tokens=max_new_tokens,
        )

    def run_seq2seq_batch(
        self,
        sources: Sequence[str | Tensor | Sequence[int]],
        targets: Sequence[str | Tensor | Sequence[int] | None] | None = None,
        *,
        encoder_layers: LayerSelection = True,
        decoder_layers: LayerSelection = True,
        heads: HeadSelection = None,
        max_new_tokens: int = 32,
    ) -> list[Seq2SeqRun]:
        """:meth:`run_seq2seq` on several source/target pairs in one pass: the sources
        padded at the end and masked (a source mask), the decoder inputs padded at the end
        (a decoder position never reads later ones, so the padding changes nothing before
        it). Each run is cropped to its own tokens and equals :meth:`run_seq2seq` of its
        pair up to float rounding.

        Args:
            sources: texts or token ids.
            targets: one target (text, ids, or ``None`` to generate it greedily) per
                source; ``None`` generates every target.
            encoder_layers, decoder_layers, heads, max_new_tokens: as :meth:`run_seq2seq`.

        Returns:
            One :class:`attnkit.models.encoder_decoder.Seq2SeqRun` per pair, in order.

        Raises:
            ValueError: no sources, another number of targets, or what
                :meth:`run_seq2seq` refuses for any pair (the memory limit counts the
                padded batch).
            TypeError: ids that are not integers.
        """
        return run_seq2seq_batch(
            self,
            sources,
            targets,
            encoder_layers=encoder_layers,
            decoder_layers=decoder_layers,
            heads=heads,
            max_new_tokens=max_new_tokens,
        )

    def run_batch(
        self,
        inputs: Sequence[str | Tensor | Sequence[int]],
        *,
        return_weights: LayerSelection = True,
        heads: Sequence[int] | None = None,
        logits: bool = True,
        stop: Callable[[], bool] | None = None,
        cache: NameFilter = (),
        padding_side: Literal["right", "left"] = "right",
    ) -> list[ModelRun]:
        """:meth:`run` on several inputs at once, in as few forward passes as possible.

        A causal model runs every input in one pass, shorter ones padded at the end (a
        token never attends to later ones, so the padding changes nothing before it) or,
        with ``padding_side="left"``, at the start, masked and with each row's positions
        counted from its first token. A bidirectional model runs the inputs of each length
        together. Each run equals :meth:`run` of its input up to float rounding (matrix
        products of another batch size may sum in another order). Hooks of enclosing
        :meth:`hooks` blocks see the padded batch.

        Args:
            inputs: texts or token ids, as :meth:`run` takes them.
            return_weights: the layers whose weights to return, as in :meth:`run`.
            heads: the heads to keep, as in :meth:`run`.
            logits: compute the next-token logits (LLaMA); ``False`` skips the vocabulary
                projection (a sixth of SmolLM2's work) when only attention is wanted, and
                every run's ``logits`` is ``None``.
            stop: asked before every layer; when it returns ``True`` the pass ends with
                :class:`RunStopped` (a server stops the work of clients that have gone).
            cache: the activations to return in each run's :attr:`ModelRun.cache`, as
                :meth:`run` takes them: each run's own row, without the padding.
            padding_side: where a causal model pads shorter inputs, ``"right"`` or
                ``"left"``.

        Returns:
            One :class:`ModelRun` per input, in order.

        Raises:
            TypeError, ValueError: as :meth:`run`, for any input (before any runs); the
                memory limit counts the padded batch.
            RunStopped: ``stop`` returned ``True``.
        """
        if padding_side not in ("right", "left"):
            raise ValueError(f'padding_side must be "right" or "left", got {padding_side!r}')
        prepared = [self.prepare_input(item) for item in inputs]
        layers, head_list = self._selection(return_weights, heads)
        lengths = [ids.shape[1] for ids, _, _ in prepared]
        groups: dict[int, list[int]] = {}
        for i, n in enumerate(lengths):
            groups.setdefault(0 if self.causal else n, []).append(i)
        padded = [(len(group), max(lengths[i] for i in group)) for group in groups.values()]
        check_run_memory(
            self,
            padded,
            weight_layers=len(layers),
            cache=cache,
            logits=logits,
            on=f"{len(prepared)} inputs",
            advice="run fewer at once",
        )
        runs: list[ModelRun | None] = [None] * len(prepared)
        points = self.module.hook_points() if cache != () else {}
        with torch.no_grad(), self._stopped_by(stop):
            for group, (_, s) in zip(groups.values(), padded):
                ids, padding = _padded([prepared[i][0][0] for i in group], s, padding_side)  # [b, s] x 2
                # Padding at the end is unseen by a causal model's tokens: no mask needed.
                needs_mask = padding_side == "left" and not bool(padding.all())
                with self.module.hook_session(cache=cache) as kept:
                    out = self.architecture.hidden_states(
                        self.module, ids.to(self.device), layers, padding.to(self.device) if needs_mask else None
                    )
                scores = self.architecture.logits(self.module, out.output) if logits else None  # [b, s, v], or None
                for row, i in enumerate(group):
                    n = lengths[i]
                    own = slice(s - n, s) if padding_side == "left" else slice(0, n)
                    rows = _BatchRows(out, scores, _rows_of(kept, points, row, own), row, own)
                    runs[i] = self._run_of_row(prepared[i], rows, layers, head_list)
        return [run for run in runs if run is not None]

    def _selection(self, return_weights: LayerSelection, heads: Sequence[int] | None) -> tuple[list[int], list[int]]:
        """The layers whose weights a run returns and the heads it keeps, checked."""
        head_list = normalize_indices(
            heads, self.num_heads, "head", context=f"{self.name} has {self.num_heads} heads per layer"
        )
        return self._layers(return_weights), head_list

    @contextlib.contextmanager
    def _stopped_by(self, stop: Callable[[], bool] | None) -> Iterator[None]:
        """Ask ``stop`` before every layer while the block runs, and end the pass with
        :class:`RunStopped` when it returns ``True``."""
        if stop is None:
            yield
            return

        def check(_module: nn.Module, _args: Any) -> None:
            if stop():
                raise RunStopped("the run was stopped")

        # Asked through each layer's self-attention norm, a module call in every layer
        # (before the attention in pre-norm layers, after it in post-norm ones).
        layers = [m for m in self.module.modules() if isinstance(m, (EncoderLayer, DecoderLayer))]
        handles = [layer.self_attn_norm.register_forward_pre_hook(check) for layer in layers]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _run_of_row(
        self,
        prepared: tuple[Tensor, list[str], list[tuple[int, int]] | None],
        rows: _BatchRows,
        layers: list[int],
        head_list: list[int],
    ) -> ModelRun:
        """The :class:`ModelRun` of one input of a batch: its row, without the padding."""
        own_ids, tokens, offsets = prepared
        row, own = rows.row, rows.own
        hidden = rows.out.output  # [b, s, e]
        weights = {
            layer: _self_attention_of(rows.out, layer)[row : row + 1, head_list, own, own].float() for layer in layers
        }  # [1, h_sel, n, n] each
        return ModelRun(
            ids=own_ids,
            tokens=tokens,
            offsets=offsets,
            logits=None if rows.scores is None else rows.scores[row : row + 1, own].float().clone(),  # [1, n, v]
            hidden_states=hidden[row : row + 1, own].float().clone(),  # [1, n, e]
            attentions=LayerAttentions(weights, self.num_layers),
            heads=head_list,
            cache=rows.cache,
        )

    def hook_names(self) -> list[str]:
        """Every activation a hook or a cache can name, in module order
        (:mod:`attnkit.nn.hooks`): ``decoder.layers.{i}.self_attn.pattern`` (LLaMA),
        ``encoder.layers.{i}.self_attn.pattern`` (BERT), ..."""
        return self.module.hook_names()

    def hook_name(self, name: str, layer: int | None = None) -> str:
        """The full name of a point given by the end of its name and its layer:
        ``hook_name("self_attn.z", 3)`` (:meth:`attnkit.nn.HookedModule.hook_name`).

        Raises:
            ValueError: no point or several match.
        """
        return self.module.hook_name(name, layer)

    @contextlib.contextmanager
    def hooks(self, hooks: Mapping[str, HookFn]) -> Iterator[Model]:
        """Install functions that read or replace activations in every run of this model
        inside the ``with`` block (in this thread): :meth:`run`, :meth:`run_batch`,
        :meth:`run_with_hooks` and every step of :meth:`generate_ids` started inside it.

        >>> def no_head_3(z, hook):                 # [b, h, s, d]
        ...     z = z.clone(); z[:, 3] = 0; return z
        >>> with model.hooks({"decoder.layers.5.self_attn.z": no_head_3}):
        ...     run = model.run("The cat sat on the mat.")

        Args:
            hooks: name (:meth:`hook_names`) → function of ``(activation, hook)`` (or of
                the activation alone) that returns ``None`` (reads only) or the tensor to
                use instead. Nested blocks apply the outer block's hooks first.

        Yields:
            This model.

        Raises:
            ValueError: an unknown name (the message lists the names).
            TypeError: a value that is not callable.
        """
        with self.module.hooks(hooks):
            yield self

    def run_with_hooks(
        self,
        ids: Tensor,
        *,
        hooks: Mapping[str, HookFn] | None = None,
        cache: NameFilter = (),
        attention_mask: Tensor | None = None,
        logits: bool = True,
    ) -> HookedRun:
        """A forward pass of a batch of ids through the hook points, in the caller's
        autograd mode (gradients flow when they are enabled): the building block of
        ablation, patching and gradient-based attributions.

        Args:
            ids: integer token ids ``[b, s]``, on any device (moved to the model's).
            hooks: name → function, applied after those of enclosing :meth:`hooks` blocks.
            cache: the activations to return, as :meth:`run` takes them.
            attention_mask: ``[b, s]``, ``True`` (or 1) on tokens and ``False`` (0) on
                padding, on either side (:meth:`to_tokens` makes both); padding is never
                attended to, and a causal model counts each row's positions from its first
                token, so that a left-padded row gives its unpadded results.
            logits: compute the logits (LLaMA) at every position; ``False`` leaves them
                ``None`` (a batch that needs a few positions' logits saves the vocabulary
                projection).

        Returns:
            :class:`HookedRun` with the last hidden states ``[b', s, e]`` and logits
            ``[b', s, v]`` (``b'`` is ``b`` unless a hook changed the batch size).

        Raises:
            ValueError: ids not ``[b, s]``, too long, outside the vocabulary, an attention
                mask of another shape, or an unknown hook or cache name.
        """
        if not isinstance(ids, Tensor) or ids.ndim != 2 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
            got = f"{ids.dtype} {list(ids.shape)}" if isinstance(ids, Tensor) else type(ids).__name__
            raise ValueError(f"ids must be an integer tensor [b, s], got {got}")
        padding = None
        if attention_mask is not None:
            if not isinstance(attention_mask, Tensor) or attention_mask.shape != ids.shape:
                mask_got = (
                    list(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
                )
                raise ValueError(f"attention_mask must be [b, s] = {list(ids.shape)} like the ids, got {mask_got}")
            padding = attention_mask.to(self.device).bool()  # [b, s]
        for row in ids:
            self.prepare_input(row)
        b, s = ids.shape
        check_run_memory(
            self,
            [(b, s)],
            weight_layers=0,
            cache=cache,
            logits=logits,
            on=f"{b} × {s} tokens",
            advice="cache fewer activations (names=), fewer or shorter texts",
        )
        with self.module.hook_session(hooks, cache=cache) as kept:
            hidden = self.architecture.hidden_states(self.module, ids.to(self.device), (), padding).output  # [b, s, e]
            scores = self.architecture.logits(self.module, hidden) if logits else None  # [b, s, v], or None
        return HookedRun(hidden, kept, scores)

    def run_with_cache(
        self,
        inputs: str | Sequence[str] | Tensor | Sequence[int],
        *,
        names: NameFilter = None,
        attention_mask: Tensor | None = None,
    ) -> tuple[Tensor, ActivationCache]:
        """A forward pass that keeps activations, as TransformerLens' ``run_with_cache``.

        Args:
            inputs: a text, token ids ``[s]`` or ``[b, s]``, or several texts (padded on
                the right by :meth:`to_tokens`, and masked).
            names: which activations: every one (``None``), names (:meth:`hook_names`), or
                a predicate on names.
            attention_mask: for ids ``[b, s]`` padded on either side, ``[b, s]`` ``True``
                on tokens (:meth:`to_tokens` returns it), as :meth:`run_with_hooks` takes
                it.

        Returns:
            ``(logits [b, s, v], cache)`` for LLaMA, ``(hidden states [b, s, e], cache)``
            for BERT, in the model's dtype; the cache is an
            :class:`attnkit.nn.ActivationCache` (``cache["pattern", 3]`` looks a name up
            by its end and layer).

        Raises:
            TypeError, ValueError: inputs :meth:`run` or :meth:`to_tokens` refuse, an
                unknown name.
        """
        mask = None
        if attention_mask is not None and not (isinstance(inputs, Tensor) and inputs.ndim == 2):
            raise ValueError(
                "attention_mask goes with ids [b, s]; texts are padded and masked by run_with_cache itself"
            )
        if isinstance(inputs, str):
            ids = self.prepare_input(inputs)[0]  # [1, s]
        elif isinstance(inputs, Sequence) and inputs and all(isinstance(t, str) for t in inputs):
            ids, mask = self.to_tokens(list(inputs))  # type: ignore[arg-type]
        elif isinstance(inputs, Tensor) and inputs.ndim == 2:
            ids, mask = inputs, attention_mask
        else:
            ids = self.prepare_input(inputs)[0]  # type: ignore[arg-type]
        with torch.no_grad():
            run = self.run_with_hooks(ids, cache=names, attention_mask=mask)
        return (run.hidden_states if run.logits is None else run.logits), run.cache

    def to_tokens(
        self, texts: str | Sequence[str], *, padding_side: Literal["right", "left"] = "right"
    ) -> tuple[Tensor, Tensor]:
        """Token ids of one text or several, padded to one length.

        Args:
            texts: a text or a list of texts.
            padding_side: where shorter texts are padded (with id 0).

        Returns:
            ``(ids [b, s], attention_mask [b, s])``, the mask ``True`` on tokens and
            ``False`` on padding: what :meth:`run_with_hooks` takes.

        Raises:
            TypeError, ValueError: what :meth:`tokenize` refuses, an empty list, an
                unknown ``padding_side``.
        """
        if padding_side not in ("right", "left"):
            raise ValueError(f'padding_side must be "right" or "left", got {padding_side!r}')
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts:
            raise ValueError("to_tokens needs at least one text, got an empty list")
        rows = [self.tokenize(text).ids[0] for text in texts]
        return _padded(rows, max(len(row) for row in rows), padding_side)

    def to_single_token(self, token: str, *, what: str = "token") -> int:
        """The id of the one token that spells ``token``.

        Args:
            token: the token's text, leading space included where the word follows a space
                (``" Paris"``).
            what: what the token is, for the message (``"target"``, ``"wrong"``).

        Returns:
            The token id.

        Raises:
            ValueError: ``token`` is empty or is not exactly one token; the message says how
                it tokenises.
        """
        if not isinstance(token, str) or not token:
            raise ValueError(f"the {what} must be a non-empty string, got {token!r}")
        encoded = self.tokenizer.encode(token)
        pieces = [
            (i, t) for i, t, special in zip(encoded.ids[0].tolist(), encoded.tokens, encoded.special) if not special
        ]
        if len(pieces) != 1:
            spelled = " + ".join(repr(t) for _, t in pieces) or "no token"
            hint = (
                ""
                if token.startswith(" ")
                else f"; a word after a space is its own token with the space: {' ' + token!r}"
            )
            raise ValueError(
                f"the {what} {token!r} must be a single token of {self.name}, but it tokenises as {spelled} "
                f"({len(pieces)} tokens){hint}"
            )
        return pieces[0][0]

    def generate_ids(
        self,
        prompt: str | Tensor | Sequence[int],
        *,
        max_new_tokens: int = 32,
        temperature: float = 0.0,
        top_k: int | None = None,
        seed: int | None = None,
    ) -> Iterator[int]:
        """Continue a prompt token by token with a KV cache (causal decoders), or produce
        the target of a source (encoder–decoders: the prompt is the source).

        The prompt runs once (its logits computed for the last position only; an
        encoder–decoder's encoder reads it once), then each step runs one token against
        the cache. Generation stops after ``max_new_tokens``, at an end-of-sequence token
        (not yielded), or when the context is full. The hooks active at this call act on
        every step (see :mod:`attnkit.nn.hooks` for what a point sees with a KV cache).

        Args:
            prompt: a text, or token ids ``[s]`` / ``[1, s]``.
            max_new_tokens: the most tokens to produce.
            temperature: ``0`` is greedy (the most likely token); above 0 samples from
                ``softmax(logits / temperature)``.
            top_k: when sampling, only from the ``top_k`` most likely tokens.
            seed: seed of the sampling generator, for reproducible samples.

        Returns:
            An iterator of token ids, computed as it is consumed.

        Raises:
            ValueError: a BERT model, an empty or too long prompt, ``max_new_tokens < 0``,
                a ``temperature`` that is not a finite number ``>= 0``, ``top_k < 1``
                (at the call, before any token).
        """
        if not self.causal and not self.encoder_decoder:
            raise ValueError(f"{self.name} is a bidirectional encoder ({self.family}); it cannot generate text")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        ids, _, _ = self.prepare_input(prompt)
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
        return self._generate(context, ids, min(max_new_tokens, room), temperature, top_k, seed)

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
        temperature: float,
        top_k: int | None,
        seed: int | None,
    ) -> Iterator[int]:
        generator = None
        if temperature > 0 and seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(seed)
        # A causal family's network continues the prompt; an encoder-decoder's translates it.
        assert isinstance(self.module, (DecoderLM, EncoderDecoderLM))
        steps = self.module.stream(
            ids.to(self.device), budget, temperature=temperature, top_k=top_k, generator=generator
        )
        while (token := context.run(next, steps, None)) is not None:  # [1]
            if token.numel() != 1:
                raise ValueError(
                    f"generate continues one text, so each step must give 1 token; a hook changed the batch to "
                    f"{token.numel()} rows"
                )
            token_id = int(token)
            if token_id in self.tokenizer.eos_token_ids:
                return
            yield token_id

    def generate(
        self,
        prompt: str,
        *,
        max_new_tokens: int = 32,
        temperature: float = 0.0,
        top_k: int | None = None,
        seed: int | None = None,
    ) -> Iterator[str]:
        """Continue a prompt, streaming the text as it is produced (LLaMA only).

        Args:
            prompt: the text to continue (as is; no chat template is applied).
            max_new_tokens: the most tokens to produce.
            temperature: ``0`` is greedy; above 0 samples.
            top_k: when sampling, only from the ``top_k`` most likely tokens.
            seed: seed of the sampling generator.

        Returns:
            An iterator of text pieces that join to the continuation.

        Raises:
            ValueError: as :meth:`generate_ids`, raised at the call, before any token.
        """
        ids = self.generate_ids(prompt, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, seed=seed)
        return self.tokenizer.stream(ids)

    def prepare_input(
        self, text_or_ids: str | Tensor | Sequence[int]
    ) -> tuple[Tensor, list[str], list[tuple[int, int]] | None]:
        """The model's input for a text or for token ids, validated: what every run, batch
        and generation (of this model and of an encoder-decoder's source and target) reads.

        Args:
            text_or_ids: a text, or token ids ``[s]`` / ``[1, s]`` (a tensor or a sequence).

        Returns:
            ``(ids [1, s], tokens, offsets)``: ``offsets`` are the tokens' character spans
            in a text, ``None`` for ids.

        Raises:
            TypeError: ids that are not integers.
            ValueError: ids of another shape, none at all, outside the vocabulary, or more
                tokens than the model reads.
        """
        if isinstance(text_or_ids, str):
            encoded = self.tokenize(text_or_ids)
            return encoded.ids, encoded.tokens, encoded.offsets
        if not isinstance(text_or_ids, Tensor) and len(text_or_ids) == 0:
            raise ValueError(f"no input: {self.name} needs a text, a list of texts or token ids, got an empty list")
        ids = text_or_ids if isinstance(text_or_ids, Tensor) else torch.tensor(list(text_or_ids))
        if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.is_complex():
            raise TypeError(f"token ids must be integers, got dtype {ids.dtype}")
        if ids.ndim == 1:
            ids = ids.unsqueeze(0)
        if ids.ndim != 2 or ids.shape[0] != 1:
            raise ValueError(f"token ids must be [s] or [1, s], got {list(ids.shape)}")
        if ids.shape[1] == 0:
            raise ValueError(f"no token ids: {self.name} needs at least one token")
        self._check_length(ids.shape[1])
        vocab = self.config.vocab_size
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise ValueError(f"token ids must be in [0, {vocab}), got [{int(ids.min())}, {int(ids.max())}]")
        ids = ids.long().cpu()
        return ids, [self.tokenizer.id_to_token(i) for i in ids[0].tolist()], None

    def _check_length(self, n: int) -> None:
        if n > self.max_length:
            raise ValueError(f"text is {n} tokens long; {self.name} reads at most {self.max_length} tokens")

    def _layers(self, selection: LayerSelection) -> list[int]:
        return select_indices(selection, self.num_layers, "layer", context=f"{self.name} has {self.num_layers} layers")


@dataclass(frozen=True)
class _BatchRows:
    """Where one input's results lie in a batch's: the family's output, the logits (or
    ``None``), the input's own cache, its row and its positions (without the padding)."""

    out: StackOutput
    scores: Tensor | None
    cache: ActivationCache
    row: int
    own: slice


def _self_attention_of(out: StackOutput, layer: int) -> Tensor:
    """The self-attention weights of ``layer`` in a family's result, which were asked for."""
    weights = out.weights[layer]
    assert weights is not None, f"layer {layer}'s weights were asked for and not returned"
    return weights.self_attention


def _rows_of(cache: ActivationCache, points: Mapping[str, HookPoint], row: int, own: slice) -> ActivationCache:
    """One row of a batch's cache, its positions cut to ``own`` (the padding of a shorter
    input removed), as copies."""
    out = ActivationCache(cache.model)
    for name, activation in cache.items():
        index: list[slice] = [slice(row, row + 1)] + [slice(None)] * (activation.ndim - 1)
        for dim in points[name].positions:
            index[dim] = own
        out[name] = activation[tuple(index)].clone()
    return out


def _padded(rows: Sequence[Tensor], length: int, side: str) -> tuple[Tensor, Tensor]:
    """Token id rows ``[n_i]`` padded to ``length`` on ``side`` with id 0: ``(ids [b, s],
    padding [b, s])``, the padding ``True`` on tokens."""
    ids = torch.zeros(len(rows), length, dtype=torch.long)  # [b, s]
    padding = torch.zeros(len(rows), length, dtype=torch.bool)  # [b, s]
    for row, tokens in enumerate(rows):
        own = slice(length - len(tokens), length) if side == "left" else slice(0, len(tokens))
        ids[row, own] = tokens
        padding[row, own] = True
    return ids, padding
