"""One layer's attention map on a text, from an :mod:`attnkit.models` model: the classic
first look inside a model ("The cat sat on the mat.", last layer, head 0) as a library call,
between tokens or between words, with labels as the tokens read in the text.

Shape letters: ``h`` selected heads, ``s`` tokens, ``n`` tokens or words.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from torch import Tensor

from attnkit.deprecation import deprecated_aliases
from attnkit.functional.indices import normalize_index, normalize_indices
from attnkit.inspect.names import LEVELS
from attnkit.inspect.tokens import ReadableToken, decode_tokens, readable_tokens, special_token_ids, token_scheme
from attnkit.inspect.words import Word, aggregate, word_groups

if TYPE_CHECKING:
    from attnkit.models import Model, ModelRun


@deprecated_aliases(model="model_name", removed_in="0.3")
@dataclass(frozen=True)
class AttentionMap:
    """The attention of some heads of one layer on one text, between tokens or words.

    Attributes:
        model_name: the model's name.
        text: the input text.
        tokens: the tokenizer's token strings (``"Ġcat"``, ``"[CLS]"``).
        labels: the rows' and columns' labels, as they read in the text: one per token
            (``"cat"``, ``"배(1/3)"``) or, for a word map, one per word (``"고파서"``).
        layer: the layer, counted from 0.
        num_layers: how many layers the model has.
        heads: the heads, counted from 0.
        weights: ``[h, n, n]`` float32, queries as rows and keys as columns; ``n`` is the
            number of tokens, or of words for a word map.
        readable: each token as it reads in the text
            (:class:`~attnkit.inspect.tokens.ReadableToken`).
        words: for a word map, the groups of tokens the rows and columns stand for;
            ``None`` for a token map.
        causal: whether the model is causal (the viewer greys out the masked cells).
        method: what the values are (:data:`attnkit.inspect.methods.METHODS`):
            ``"raw"`` attention weights, or ``"rollout"``, ``"flow"`` (one map merging the
            heads: ``heads`` is empty and ``weights`` ``[1, n, n]``), ``"value"``, ``"grad"``.
        attention: which attention: ``"self"`` (a model with one text), or of an
            encoder–decoder ``"encoder"``, ``"decoder"`` or ``"cross"``
            (:data:`attnkit.models.model.names.ATTENTION_KINDS`).
        key_text: the text of the columns when they are another sequence than the rows
            (cross-attention: the source; ``text`` is then the target); ``None`` when the
            columns are the rows' tokens.
        key_tokens: the columns' token strings, with ``key_text``.
        key_labels: the columns' labels (tokens, or words of a word map), with ``key_text``.
        key_readable: the columns' readable tokens, with ``key_text``.
        key_words: for a word map with its own columns, their word groups.
        layer_windows: the model's sliding window of every layer (``None`` for a global
            layer), for a model with local layers (Gemma 2 and 3, Mistral, ...); ``None``
            for a model without them (:func:`model_windows`).
        rows: for a map of some query positions (``rows=``, ``--rows``), their ``range``:
            ``weights`` is then ``[h, n_r, n]``, its rows labelled by :attr:`row_labels`
            and its columns by ``labels`` (every token); ``None`` when every token is a row.

    With ``key_text``, ``weights`` is ``[h, n, m]`` with ``m`` columns.

    In Jupyter, the map shows as the interactive viewer (:mod:`attnkit.viz.notebook`).
    """

    model_name: str
    text: str
    tokens: list[str]
    labels: list[str]
    layer: int
    num_layers: int
    heads: list[int]
    weights: Tensor
    readable: list[ReadableToken] = field(default_factory=list)
    words: list[Word] | None = None
    causal: bool = False
    method: str = "raw"
    attention: str = "self"
    key_text: str | None = None
    key_tokens: list[str] | None = None
    key_labels: list[str] | None = None
    key_readable: list[ReadableToken] | None = None
    key_words: list[Word] | None = None
    layer_windows: tuple[int | None, ...] | None = None
    rows: range | None = None

    @property
    def row_labels(self) -> list[str]:
        """The labels of the rows: those of :attr:`rows`, or every label."""
        return self.labels if self.rows is None else self.labels[self.rows.start : self.rows.stop]

    @property
    def first_row(self) -> int:
        """The position of the first row's query (0 unless the map holds some rows)."""
        return 0 if self.rows is None else self.rows.start

    @property
    def window(self) -> int | None:
        """This layer's sliding window (query ``i`` attends to keys ``j`` with
        ``i - j < window``), ``None`` for a global layer."""
        return None if self.layer_windows is None else self.layer_windows[self.layer]

    @property
    def layer_kind(self) -> str:
        """``"local (W)"`` or ``"global"`` for a model with local layers, else ``""``."""
        if self.layer_windows is None:
            return ""
        return "global" if self.window is None else f"local ({self.window})"

    @property
    def column_labels(self) -> list[str]:
        """The labels of the columns: :attr:`key_labels`, or the rows' own."""
        return self.labels if self.key_labels is None else self.key_labels

    @property
    def level(self) -> str:
        """``"word"`` for a word map, ``"token"`` for a token map."""
        return "token" if self.words is None else "word"

    def by_words(self, groups: Sequence[Word] | None = None, key_groups: Sequence[Word] | None = None) -> AttentionMap:
        """This token map as a word map (:func:`attnkit.inspect.words.aggregate`), on both
        sides when the columns are another sequence.

        Args:
            groups: the token groups of the rows (default: the words of the text,
                :func:`attnkit.inspect.words.word_groups`).
            key_groups: those of the columns, when they are another sequence (default: the
                words of :attr:`key_text`).

        Returns:
            An :class:`AttentionMap` with ``words`` set and ``weights`` ``[h, w, w_k]``.

        Raises:
            ValueError: already a word map, no readable tokens to group, or groups that do
                not hold every token exactly once.
        """
        if self.words is not None:
            raise ValueError("this map is already between words")
        if self.rows is not None:
            raise ValueError(f"a map of some rows ({self.rows.start}..{self.rows.stop - 1}) stays between tokens")
        groups = list(groups if groups is not None else _words_of(self.text, self.readable, len(self.tokens)))
        if self.key_text is None:
            weights = aggregate(self.weights, groups)  # [h, w, w]
            return replace(self, labels=[g.label for g in groups], weights=weights, words=groups)
        key_tokens = self.key_tokens or []
        if key_groups is None:
            key_groups = _words_of(self.key_text, self.key_readable or [], len(key_tokens))
        key_groups = list(key_groups)
        return replace(
            self,
            labels=[g.label for g in groups],
            weights=aggregate(self.weights, groups, key_groups),  # [h, w, w_k]
            words=groups,
            key_labels=[g.label for g in key_groups],
            key_words=key_groups,
        )

    def to_dict(self, digits: int = 6) -> dict[str, Any]:
        """A JSON-ready dict; weights rounded to ``digits`` decimals and nested as
        ``weights[head][query][key]``, in the order of ``heads``.

        ``tokens`` are the tokenizer's strings and ``token_info`` what each stands for
        (``text``, ``span``, ``partial``, ...: :meth:`ReadableToken.to_dict`); ``labels``
        name the rows and columns of ``weights``: tokens, or for ``level`` ``"word"`` the
        ``words`` (``text``, ``span``, ``tokens`` — their token indices). An encoder–decoder's
        map adds ``attention`` (``"encoder"``, ``"decoder"``, ``"cross"``), and one whose
        columns are another sequence (cross-attention: rows the target, columns the source)
        adds ``key_text``, ``key_tokens``, ``key_token_info``, ``key_labels`` (and
        ``key_words``) for the columns. A map of some rows adds ``rows``: ``[start, stop]``
        of the query positions of ``weights[head]``, whose columns are every token.
        """
        data = {
            "model": self.model_name,
            "text": self.text,
            "level": self.level,
            "tokens": self.tokens,
            "token_info": [t.to_dict() for t in self.readable],
            "labels": self.labels,
            "layer": self.layer,
            "num_layers": self.num_layers,
            "method": self.method,
            "heads": self.heads,
            "weights": [[[round(w, digits) for w in row] for row in head] for head in self.weights.tolist()],
        }
        if self.words is not None:
            data["words"] = [w.to_dict() for w in self.words]
        if self.rows is not None:
            data["rows"] = [self.rows.start, self.rows.stop]
        if self.attention != "self":
            data["attention"] = self.attention
        if self.key_text is not None:
            data |= {
                "key_text": self.key_text,
                "key_tokens": self.key_tokens,
                "key_token_info": [t.to_dict() for t in self.key_readable or []],
                "key_labels": self.key_labels,
            }
            if self.key_words is not None:
                data["key_words"] = [w.to_dict() for w in self.key_words]
        return data


def _words_of(text: str, readable: Sequence[ReadableToken], count: int) -> list[Word]:
    """The word groups of ``count`` tokens of ``text``.

    Raises:
        ValueError: tokens without readable forms to group.
    """
    if len(readable) != count:
        raise ValueError("this map has no readable tokens to group into words; pass the groups")
    return word_groups(text, readable)


@dataclass(frozen=True)
class ReadableRun:
    """A model run's attention with readable labels, between tokens or words.

    Attributes:
        text: the text that ran (rebuilt from the tokens when the run had only ids).
        tokens: each token as it reads (:class:`~attnkit.inspect.tokens.ReadableToken`).
        words: the word groups for ``level`` ``"word"``, else ``None``.
        labels: one label per row and column of the maps: tokens or words.
        attentions: layer → ``[1, h, n, n]`` weights, ``n`` tokens or words.
    """

    text: str
    tokens: list[ReadableToken]
    words: list[Word] | None
    labels: list[str]
    attentions: dict[int, Tensor]


@deprecated_aliases(model="model_name", removed_in="0.3")
@dataclass(frozen=True)
class AttentionView:
    """The attention of many layers and heads on one text, with readable labels: what
    :func:`view` returns, shown inline in Jupyter as the interactive viewer.

    Attributes:
        model_name: the model's name.
        causal: whether the model is causal.
        heads: the heads, counted from 0, in the order of dimension 1 of every map.
        run: the labels and maps (:class:`ReadableRun`), between tokens or words.
    """

    model_name: str
    causal: bool
    heads: list[int]
    run: ReadableRun


def resolve_layer(layer: int, num_layers: int) -> int:
    """A layer index, negative ones counted from the end (``-1`` = last), as ``0 .. n-1``.

    Raises:
        ValueError: outside ``-n .. n-1``; the message gives the valid range.
    """
    return normalize_index(layer, num_layers, "layer", context=f"this model has {num_layers} layers")


def resolve_heads(head: int | str | Sequence[int] | None, num_heads: int) -> list[int]:
    """The heads that ``head`` names: one index (negative from the end), several, or
    ``"all"``/``None``.

    Raises:
        ValueError: an index outside ``-h .. h-1`` or a string other than ``"all"``.
    """
    if head is None or head == "all":
        return list(range(num_heads))
    if isinstance(head, Sequence) and not isinstance(head, str):
        return normalize_indices(head, num_heads, "head", context=f"this model has {num_heads} heads per layer")
    if isinstance(head, str):
        try:
            head = int(head)
        except ValueError:
            raise ValueError(f'head must be a number or "all", got {head!r}') from None
    return [normalize_index(head, num_heads, "head", context=f"this model has {num_heads} heads per layer")]


def token_labels(text: str, tokens: Sequence[str], offsets: Sequence[tuple[int, int]]) -> list[str]:
    """How each token reads in the text (:attr:`ReadableToken.label`): its span, stripped of
    surrounding spaces, a token holding part of a character marked ``(k/n)``.

    Special tokens (an empty span, like ``[CLS]``) keep their token string, and tokens made
    only of white space are shown as ``␣`` or ``\\n``.

    Args:
        text: the tokenized text.
        tokens: the token strings.
        offsets: each token's ``(start, end)`` character span in ``text``.

    Returns:
        One label per token.
    """
    return [t.label for t in readable_tokens(text, tokens, offsets)]


def readable_sequence(
    model: Any,
    tokens: Sequence[str],
    ids: Tensor | None,
    offsets: Sequence[tuple[int, int]] | None,
    text: str | None,
) -> tuple[str, list[ReadableToken]]:
    """The text of a token sequence and its readable tokens.

    Args:
        model_name: the model whose tokenizer made the tokens (its special tokens and how its
            tokens spell text); a stand-in without a tokenizer has plain-text tokens.
        tokens: the token strings.
        ids: their ids ``[1, s]`` (to tell special tokens), or ``None``.
        offsets: each token's character span in ``text``, or ``None``.
        text: the text they came from; without it (or without offsets) it is rebuilt from
            the token strings (:func:`attnkit.inspect.tokens.decode_tokens`).

    Returns:
        ``(text, readable tokens)``.
    """
    # Read through getattr, so that stand-ins without a tokenizer or ids work too: their
    # tokens are then plain text, special where they stand for no text.
    backend = getattr(getattr(model, "tokenizer", None), "backend", None)
    special_ids = special_token_ids(backend)
    special = None if ids is None else [i in special_ids for i in ids.reshape(-1).tolist()]
    if text is None or offsets is None:
        text, spans = decode_tokens(tokens, scheme=token_scheme(backend), special=special)
        return text, readable_tokens(text, tokens, spans, special=special)
    return text, readable_tokens(text, tokens, offsets, special=special)


def readable_run(model: Model, run: ModelRun, text: str | None = None, *, level: str = "token") -> ReadableRun:
    """A run's attention with labels people can read, between tokens or words.

    Args:
        model_name: the model that ran (its tokenizer tells special tokens and how tokens spell
            text).
        run: its :class:`attnkit.models.ModelRun` (``tokens``, ``offsets``, ``attentions``
            and ``ids`` are read).
        text: the text that ran; without it (or without the run's offsets) the text is
            rebuilt from the token strings (:func:`attnkit.inspect.tokens.decode_tokens`).
        level: ``"token"``, or ``"word"`` to aggregate the maps into word maps.

    Returns:
        :class:`ReadableRun`.

    Raises:
        ValueError: an unknown ``level``.
    """
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
    text, tokens = readable_sequence(model, run.tokens, getattr(run, "ids", None), run.offsets, text)
    if level == "token":
        return ReadableRun(text, tokens, None, [t.label for t in tokens], dict(run.attentions))
    words = word_groups(text, tokens)
    attentions = {layer: aggregate(w, words) for layer, w in run.attentions.items()}  # [1, h, w, w]
    return ReadableRun(text, tokens, words, [w.label for w in words], attentions)


def sequence_labels(
    model: Any,
    tokens: Sequence[str],
    ids: Tensor | None,
    offsets: Sequence[tuple[int, int]] | None,
    text: str | None,
    *,
    level: str = "token",
) -> list[str]:
    """One readable label per token of a sequence, for views that keep every token (the long
    view): ``"animal"``, not ``"Ġanimal"``.

    Args:
        model: the model whose tokenizer made the tokens (see :func:`readable_sequence`).
        tokens: the ``s`` token strings.
        ids: their ids ``[1, s]`` or ``[s]``, or ``None``.
        offsets: each token's character span in ``text``, or ``None``.
        text: the text they came from, or ``None`` to rebuild it from the tokens.
        level: ``"token"``: each token as it reads (:attr:`ReadableToken.label`);
            ``"word"``: each token labelled by the whole word it belongs to.

    Returns:
        ``s`` labels.

    Raises:
        ValueError: an unknown ``level``.
    """
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
    text, readable = readable_sequence(model, tokens, ids, offsets, text)
    if level == "token":
        return [t.label for t in readable]
    labels = [""] * len(readable)
    for word in word_groups(text, readable):
        for i in word.token_indices:
            labels[i] = word.label
    return labels


def model_windows(model: Any) -> tuple[int | None, ...] | None:
    """Each layer's sliding window of a model with local layers (``None`` for a global
    layer), from its config's ``windows``; ``None`` for a model without local layers.

    Args:
        model: any model; only ``model.config.windows`` is read, when it exists.

    Returns:
        One window or ``None`` per layer, or ``None`` when no layer has a window.
    """
    windows = getattr(getattr(model, "config", None), "windows", None)
    if not windows or all(w is None for w in windows):
        return None
    return tuple(None if w is None else int(w) for w in windows)


def chat_input(model: Model, text: str | Sequence[Mapping[str, str]], chat: bool) -> str:
    """``chat=``: ``text`` as it is, or with ``chat=True`` the conversation in ``model``'s chat
    template (:meth:`attnkit.models.Model.apply_chat_template`; ``text`` one user message,
    or a list or JSON list of ``{"role", "content"}``).

    Raises:
        ValueError: with ``chat``, a model without a chat template, or messages that are not
            messages.
    """
    if chat:
        return model.apply_chat_template(text)
    if not isinstance(text, str):
        raise TypeError(f"text must be a str (messages need chat=True), got {type(text).__name__}")
    return text


def attention_map(
    model: Model,
    text: str | Sequence[Mapping[str, str]],
    *,
    layer: int = -1,
    head: int | str | Sequence[int] | None = 0,
    level: str = "token",
    rows: range | slice | None = None,
    chat: bool = False,
) -> AttentionMap:
    """Run ``model`` on ``text`` and keep the attention of one layer: only the heads (and
    rows) asked for are formed.

    Args:
        model: an :mod:`attnkit.models` model.
        text: the input.
        layer: the layer; negative counts from the end (default: the last).
        head: a head index, several, or ``"all"``/``None`` for every head of the layer.
        level: ``"token"``, or ``"word"`` for the attention between the words of the text
            (:meth:`AttentionMap.by_words`).
        rows: the query positions to keep (a ``range``, or a ``slice`` of the tokens:
            ``slice(-64, None)`` the last 64), as :meth:`attnkit.models.Model.run` takes
            them; default every token. A map of some rows stays between tokens.
        chat: read ``text`` in the model's chat template (:func:`chat_input`): positions
            count the template's tokens, and the viewer shows each token's turn.

    Returns:
        :class:`AttentionMap`.

    Raises:
        ValueError: an empty text, a text longer than the model's context, a layer, head
            or row out of range (the message gives the valid range), an unknown level, or
            rows with ``level="word"``; with ``chat``, a model without a chat template.
    """
    text = chat_input(model, text, chat)
    if not text.strip():
        raise ValueError("the text is empty")
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
    if rows is not None and level != "token":
        raise ValueError(f"a map of some rows (rows={rows!r}) is between tokens, not at level {level!r}")
    layer = resolve_layer(layer, model.num_layers)
    heads = resolve_heads(head, model.num_heads)
    run = model.run(text, return_weights=[layer], heads=heads, logits=False, rows=rows)
    weights = run.attentions[layer][0].float()  # [h, n_r, s]
    readable = readable_run(model, run, text)
    amap = AttentionMap(
        model_name=model.name,
        causal=bool(model.causal),
        text=text,
        tokens=list(run.tokens),
        labels=readable.labels,
        layer=layer,
        num_layers=model.num_layers,
        heads=list(run.heads),
        weights=weights,
        readable=readable.tokens,
        layer_windows=model_windows(model),
        rows=None if len(run.rows) == len(run.tokens) else run.rows,
    )
    return amap.by_words() if level == "word" else amap


def view(
    model: Model,
    text: str | Sequence[Mapping[str, str]],
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    level: str = "token",
    chat: bool = False,
) -> AttentionView:
    """Run ``model`` on ``text`` and keep the attention of many layers and heads, to explore
    in the interactive viewer — in Jupyter, just display the result.

    Args:
        model: an :mod:`attnkit.models` model.
        text: the input.
        layers: layer indices, negative ones from the end (default: all).
        heads: head indices, negative ones from the end (default: all).
        level: ``"token"``, or ``"word"`` for the attention between the words of the text.
        chat: read ``text`` in the model's chat template (:func:`chat_input`): the viewer
            shows each token's turn and role.

    Returns:
        :class:`AttentionView`.

    Raises:
        ValueError: an empty text, a text longer than the model's context, a layer or head
            out of range, or an unknown level; with ``chat``, a model without a chat template.
    """
    text = chat_input(model, text, chat)
    if not text.strip():
        raise ValueError("the text is empty")
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
    layer_list = True if layers is None else [resolve_layer(layer, model.num_layers) for layer in layers]
    head_list = None if heads is None else [h for head in heads for h in resolve_heads(head, model.num_heads)]
    run = model.run(text, return_weights=layer_list, heads=head_list)
    return AttentionView(model.name, bool(model.causal), list(run.heads), readable_run(model, run, text, level=level))
