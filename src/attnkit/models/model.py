"""The :class:`Model` that runs a checkpoint on attnkit modules (:func:`attnkit.models.load`
makes one): its input checks and its single runs. Its other jobs are mixins, each in its
own module over a small protocol: several inputs at once (:mod:`attnkit.models.batch`),
the hook API (:mod:`attnkit.models.hooks`), generation (:mod:`attnkit.models.generation`),
an encoder–decoder's source-and-target runs (:mod:`attnkit.models.encoder_decoder`) and
TransformerLens-style weights (:mod:`attnkit.models.lens`).

Shape letters: ``s`` number of tokens, ``h`` query heads, ``h_sel`` selected heads,
``e`` model dim, ``v`` vocabulary size.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor

from attnkit.deprecation import deprecated_aliases, renamed_keywords
from attnkit.functional.indices import normalize_indices, select_indices
from attnkit.models.attentions import LayerAttentions
from attnkit.models.batch import BatchMixin, pad_rows
from attnkit.models.encoder_decoder import EncoderDecoderMixin
from attnkit.models.family import ModelConfig, ModelFamily
from attnkit.models.generation import GenerationMixin
from attnkit.models.hooks import HooksMixin
from attnkit.models.lens import LensMixin
from attnkit.models.memory import check_run_memory
from attnkit.models.runs import ForwardPass, HookedRun, ModelRun, RunStopped, self_attention_weights
from attnkit.models.tokenizer import TokenizedText, Tokenizer
from attnkit.nn import LayerSelection, StackOutput
from attnkit.nn.hooks import HookFn, NameFilter
from attnkit.nn.text_module import TextModule

__all__ = ["HookedRun", "Model", "ModelRun", "RunStopped"]


@deprecated_aliases(
    architecture="model_family",
    run_seq2seq="run_encoder_decoder",
    run_seq2seq_batch="run_encoder_decoder_batch",
    removed_in="0.3",
)
class Model(BatchMixin, HooksMixin, GenerationMixin, EncoderDecoderMixin, LensMixin):
    """A real checkpoint on attnkit modules, with its tokenizer. Get one with :func:`load`.

    Attributes:
        name: ``"smollm2"``, ``"minilm"``, or the folder name of a local checkpoint.
        family: ``"llama"`` (causal decoder) or ``"bert"`` (bidirectional encoder): the
            :attr:`attnkit.models.family.ModelFamily.name` of ``model_family``.
        model_family: the :class:`attnkit.models.family.ModelFamily` it was loaded with.
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
            its encoder, :meth:`run_encoder_decoder` a source and a target with the three kinds of
            attention, and generation translates a source.
        num_decoder_layers: the decoder's depth (encoder–decoders; 0 otherwise).
        module: the network, in evaluation mode: an :class:`attnkit.nn.DecoderLM`,
            :class:`attnkit.nn.EncoderDecoderLM` or :class:`attnkit.models.bert.BertModel`,
            each an :class:`attnkit.nn.text_module.TextModule`, whose methods every run
            calls.
        tokenizer: the :class:`attnkit.models.Tokenizer`.
    """

    def __init__(
        self,
        *,
        name: str,
        model_family: ModelFamily,
        path: Path,
        config: ModelConfig,
        module: TextModule,
        tokenizer: Tokenizer,
    ) -> None:
        self.name = name
        self.model_family = model_family
        self.family = model_family.name
        self.path = path
        self.config = config
        self.module = module
        self.tokenizer = tokenizer
        self.num_layers = config.num_layers
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.max_length = config.max_length
        self.causal = model_family.causal
        self.encoder_decoder = model_family.encoder_decoder
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
        self._check_vocabulary(encoded.ids)
        return encoded

    @renamed_keywords(cache="names_filter", removed_in="0.3")
    def run(
        self,
        text_or_ids: str | Tensor | Sequence[int],
        *,
        return_weights: LayerSelection = True,
        heads: Sequence[int] | None = None,
        logits: bool = True,
        names_filter: NameFilter = (),
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
            names_filter: the activations to return in :attr:`ModelRun.cache`: names
                (:meth:`hook_names`), a predicate on names, or ``None`` for every one.

        Returns:
            A :class:`ModelRun`.

        Raises:
            TypeError: ids that are not integers.
            ValueError: an empty or too long input, ids outside the vocabulary, a layer or
                head out of range, weights that would exceed :data:`ATTENTION_MEMORY_LIMIT`
                bytes, or an unknown name in ``names_filter`` (the message lists the names).
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
            names_filter=names_filter,
            logits=logits,
            on=f"{s} tokens",
            advice="ask for fewer layers (--layers), fewer cached activations or a shorter text",
        )
        select_heads = head_list != list(range(self.num_heads))
        # no_grad rather than inference_mode: the returned tensors stay ordinary tensors
        # that callers may use in any mode.
        with torch.no_grad():
            forward = self._forward(ids, layers=layers, logits=logits, names_filter=names_filter)
            attentions = {}
            for i in layers:
                weights = self_attention_weights(forward.out, i)  # [1, h, s, s]
                if select_heads:
                    weights = weights[:, head_list]  # [1, h_sel, s, s]
                attentions[i] = weights.float()
        return ModelRun(
            ids=ids,
            tokens=tokens,
            offsets=offsets,
            logits=None if forward.logits is None else forward.logits.float(),
            last_hidden_state=forward.out.output.float(),  # [1, s, e]
            attentions=LayerAttentions(attentions, self.num_layers),
            heads=head_list,
            cache=forward.cache,
        )

    def _forward(
        self,
        ids: Tensor,
        *,
        layers: Collection[int] = (),
        padding: Tensor | None = None,
        logits: bool = True,
        hooks: Mapping[str, HookFn] | None = None,
        names_filter: NameFilter = (),
    ) -> ForwardPass:
        """The one forward path of :meth:`run`, :meth:`run_batch` and :meth:`run_with_hooks`:
        ids ``[b, s]`` through the network's hook points, in the caller's autograd mode.

        Args:
            ids: token ids ``[b, s]``, checked, on any device (moved to the model's).
            layers: the layers whose weights to return.
            padding: ``None``, or ``[b, s]`` bool ``True`` on tokens and ``False`` on
                padding (on either side), which no token attends to.
            logits: compute the next-token logits (where the network has a head).
            hooks: name → function, applied after those of enclosing :meth:`hooks` blocks.
            names_filter: the activations to keep, as :meth:`run` takes them.

        Returns:
            A :class:`attnkit.models.runs.ForwardPass`.
        """
        with self.module.hook_session(hooks, names_filter=names_filter) as kept:
            out = self.module.last_hidden_state(
                ids.to(self.device),
                padding=None if padding is None else padding.to(self.device),
                return_weights=list(layers),
            )
            assert isinstance(out, StackOutput)  # a record whenever return_weights is a list
            scores = self.module.logits(out.output) if logits else None  # [b, s, v], or None
        return ForwardPass(out, scores, kept)

    def _selection(self, return_weights: LayerSelection, heads: Sequence[int] | None) -> tuple[list[int], list[int]]:
        """The layers whose weights a run returns and the heads it keeps, checked."""
        head_list = normalize_indices(
            heads, self.num_heads, "head", context=f"{self.name} has {self.num_heads} heads per layer"
        )
        return self._layers(return_weights), head_list

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
        return pad_rows(rows, max(len(row) for row in rows), padding_side)

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
        self._check_vocabulary(ids)
        ids = ids.long().cpu()
        return ids, [self.tokenizer.id_to_token(i) for i in ids[0].tolist()], None

    def _check_vocabulary(self, ids: Tensor) -> None:
        """Refuse ids outside the embedding's rows: on a GPU such an id is a device-side
        assert, not an error."""
        vocab = self.config.vocab_size
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise ValueError(f"token ids must be in [0, {vocab}), got [{int(ids.min())}, {int(ids.max())}]")

    def _check_length(self, n: int) -> None:
        if n > self.max_length:
            raise ValueError(f"text is {n} tokens long; {self.name} reads at most {self.max_length} tokens")

    def _layers(self, selection: LayerSelection) -> list[int]:
        return select_indices(selection, self.num_layers, "layer", context=f"{self.name} has {self.num_layers} layers")
