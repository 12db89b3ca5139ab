"""Build :class:`~attnkit.viz.viewer.ViewerData` from what models hand back: a run of an
``attnkit.models`` model, or the weight records of ``attnkit.nn`` stacks
(:class:`attnkit.nn.LMOutput`, :class:`attnkit.nn.TransformerOutput`).

The model is only read through the attributes named here, so anything that has them (a
test double, a model of another family) works.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from attnkit.deprecation import renamed_keywords
from attnkit.inspect.maps import LEVELS, model_windows, readable_run
from attnkit.inspect.names import VIEWER_MODES
from attnkit.inspect.words import Word
from attnkit.models.checkpoints.chat import ChatText, Turn
from attnkit.nn.records import LayerWeights, LMOutput, TransformerOutput
from attnkit.viz.viewer.data import Section, ViewerData


def model_name(model: Any) -> str:
    """A model's display name: its ``name`` attribute, else its ``family``, else its class."""
    return str(getattr(model, "name", None) or getattr(model, "family", None) or type(model).__name__)


def layer_windows(model: Any) -> dict[int, int | None] | None:
    """Layer index → sliding window (``None`` for a global layer) of a model with local
    layers, ``None`` for a model without them (:func:`attnkit.inspect.maps.model_windows`)."""
    windows = model_windows(model)
    return None if windows is None else dict(enumerate(windows))


def viewer_data_from_run(
    model: Any, run: Any, *, name: str | None = None, text: str = "", level: str = "token"
) -> ViewerData:
    """Viewer data from one ``attnkit.models`` run with attention, between tokens or words.

    Args:
        model: the model that ran; its ``causal`` attribute tells decoder from encoder, and
            its tokenizer (when it has one) how tokens spell text.
        run: its ``ModelRun``: ``tokens`` (``s`` strings), ``offsets`` (each token's
            character span, or ``None`` for a run on ids), ``attentions`` (layer → ``[1, h, s, s]``) and ``heads`` (the
            head indices the ``h`` rows stand for, or ``None`` for all).
        name: the model's display name (default :func:`model_name`).
        text: the text that ran; when given (and the run has offsets), tokens are shown as
            they read in it (``"cat"`` rather than ``"Ġcat"``, as ``attnkit inspect``
            labels them); otherwise they are decoded from the token strings
            (:func:`attnkit.inspect.maps.readable_run`).
        level: ``"token"``, or ``"word"`` for the attention between the words of the text
            (rows and columns are words; a row still sums to 1).

    Returns:
        Data of kind ``"causal"`` or ``"bidirectional"``; between tokens, a model's local
        layers carry their sliding windows (:func:`layer_windows`).

    Raises:
        ValueError: the run has no attention (it ran with ``return_weights=False``), an unknown
            ``level``, or see :meth:`ViewerData.from_run`.
    """
    if not run.attentions:
        raise ValueError("the run has no attention weights: run the model with return_weights=True or a list of layers")
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
    heads = getattr(run, "heads", None)
    readable = readable_run(model, run, text or None, level=level)
    return ViewerData.from_run(
        name or model_name(model),
        readable.labels,
        readable.attentions,
        causal=bool(model.causal),
        heads=None if heads is None else list(heads),
        text=text,
        level=level,
        windows=layer_windows(model) if level == "token" else None,
        word_starts=_word_starts(readable) if level == "token" else None,
        turns=chat_turns(text, readable.words),
    )


def chat_turns(text: str, words: Sequence[Word] | None = None) -> tuple[Turn, ...] | None:
    """The turns of a conversation in a chat template
    (:meth:`attnkit.models.Model.apply_chat_template`) over its tokens, or over ``words``
    (a word map's); ``None`` for a plain text."""
    if not isinstance(text, ChatText):
        return None
    return text.turns if words is None else text.turns_over([word.token_indices for word in words])


def _word_starts(readable: Any) -> list[bool]:
    """Whether each token of a :class:`attnkit.inspect.maps.ReadableRun` starts a word of
    its text (:func:`attnkit.inspect.words.word_groups`)."""
    from attnkit.inspect.words import word_groups

    starts = [False] * len(readable.tokens)
    for word in word_groups(readable.text, readable.tokens):
        starts[word.token_indices[0]] = True
    return starts


def viewer_data_from_encoder_decoder(
    model: Any, run: Any, *, name: str | None = None, level: str = "token"
) -> ViewerData:
    """Viewer data of an encoder–decoder run: its encoder, decoder and cross-attention
    sections, each with the layers and heads the run holds, between tokens or words.

    Args:
        model: the encoder–decoder :class:`attnkit.models.Model`.
        run: its :class:`attnkit.models.model.encoder_decoder.EncoderDecoderRun`.
        name: the model's display name (default :func:`model_name`).
        level: ``"token"``, or ``"word"`` for the attention between words on both sides.

    Returns:
        Data of kind ``"encoder-decoder"``: target tokens as the rows of the decoder and
        cross sections, source tokens as the columns of the cross section; the source as
        ``text``, the target as ``target_text``, and whether the model generated it.

    Raises:
        ValueError: a run without any weights, or an unknown level.
    """
    from attnkit.inspect.encoder_decoder import encoder_decoder_map

    sections: dict[str, dict[int, Tensor]] = {}
    labels: dict[str, tuple[list[str], list[str]]] = {}
    for kind in ("encoder", "decoder", "cross"):
        for layer in sorted(run.attentions(kind)):
            amap = encoder_decoder_map(model, run, attention=kind, layer=layer, level=level)
            sections.setdefault(kind, {})[layer] = amap.weights  # [h, n, m]
            labels[kind] = (amap.labels, amap.column_labels)
    if not sections:
        raise ValueError("the run has no attention weights: ask for some encoder or decoder layers")
    source = labels["encoder"][0] if "encoder" in labels else labels["cross"][1] if "cross" in labels else []
    target = next((labels[kind][0] for kind in ("cross", "decoder") if kind in labels), [])
    return ViewerData.encoder_decoder(
        name or model_name(model),
        source,
        target,
        encoder=sections.get("encoder"),
        decoder=sections.get("decoder"),
        cross=sections.get("cross"),
        heads=run.heads,
        text=run.source_text,
        decoder_key_tokens=labels["decoder"][1] if "decoder" in labels else None,
        level=level,
        target_text=run.target_text,
        generated=run.generated,
    )


def mode_sections(
    model: Any, text: str, modes: Sequence[str], *, layers: Sequence[int], heads: Sequence[int], level: str = "token"
) -> dict[str, Section]:
    """Colour modes of a viewer page (:data:`attnkit.inspect.names.VIEWER_MODES`) for an
    ``attnkit.models`` model, to add beside its ``"self"`` section.

    Args:
        model: the model.
        text: the text.
        modes: any of ``"value"`` (value-weighted attention, each map scaled to a largest
            value of 1) and ``"rollout"`` (attention rollout up to each layer, heads merged
            into one map shown as head 0).
        layers: the page's layers.
        heads: the page's heads (for ``"value"``).
        level: ``"token"`` or ``"word"``, as the page.

    Returns:
        Mode name → :class:`Section`.

    Raises:
        ValueError: an unknown mode, or what the methods raise.
    """
    from attnkit.inspect import methods
    from attnkit.inspect.words import aggregate

    unknown = [mode for mode in modes if mode not in VIEWER_MODES]
    if unknown:
        raise ValueError(f"viewer colour modes are {', '.join(VIEWER_MODES)}, got {unknown}")
    run = model.run(text, return_weights=list(layers), heads=list(heads))
    readable = readable_run(model, run, text, level=level)

    def between(maps: Tensor) -> Tensor:  # [..., s, s] → [..., n, n]
        return maps if readable.words is None else aggregate(maps, readable.words)

    sections = {}
    if "value" in modes:
        value = methods.value_weighted(model, text, layers=layers)
        maps = {layer: between(value.heads[layer][list(heads)]) for layer in layers}  # [h, n, n]
        maps = {layer: m / m.amax(dim=(-2, -1), keepdim=True).clamp_min(1e-12) for layer, m in maps.items()}
        sections["value"] = Section.from_layers(
            readable.labels,
            readable.labels,
            maps,
            heads=heads,
            causal=bool(model.causal),
            windows=layer_windows(model) if readable.words is None else None,
        )
    if "rollout" in modes:
        rollout = methods.rollout(model, text)  # [L, s, s]
        maps = {layer: between(rollout[layer][None]) for layer in layers}  # [1, n, n]
        sections["rollout"] = Section.from_layers(
            readable.labels, readable.labels, maps, heads=[0], causal=bool(model.causal)
        )
    return sections


def _by_layer(weights: Sequence[LayerWeights | None], index: int, cross: bool) -> dict[int, Tensor]:
    """Layer → ``[h, s_q, s_k]`` of batch entry ``index`` from a list of layer records
    (``None`` for a layer that kept no weights)."""
    out = {}
    for layer, record in enumerate(weights):
        if record is None:
            continue
        w = record.cross_attention if cross else record.self_attention
        if w is not None:
            out[layer] = w[index]  # [h, s_q, s_k]
    return out


@renamed_keywords(model="model_name", removed_in="0.3")
def viewer_data_from_lm_output(
    model_name: str, tokens: Sequence[str], output: LMOutput, *, index: int = 0, text: str = ""
) -> ViewerData:
    """Viewer data from :class:`attnkit.nn.DecoderLM` called with ``return_weights=True``.

    Args:
        model_name: the display name.
        tokens: the ``s`` token strings of batch entry ``index``.
        output: the model's :class:`attnkit.nn.LMOutput`.
        index: which batch entry to show.
        text: the input text.

    Returns:
        Data of kind ``"causal"``.
    """
    return ViewerData.from_run(
        model_name, tokens, _by_layer(output.weights, index, cross=False), causal=True, text=text
    )


@renamed_keywords(model="model_name", removed_in="0.3")
def viewer_data_from_transformer_output(
    model_name: str,
    source_tokens: Sequence[str],
    target_tokens: Sequence[str],
    output: TransformerOutput,
    *,
    index: int = 0,
    text: str = "",
) -> ViewerData:
    """Viewer data from an encoder–decoder :class:`attnkit.nn.Transformer` called with
    ``return_weights=True`` (as the sequence-to-sequence models of ``attnkit train`` are).

    Args:
        model_name: the display name.
        source_tokens: the encoder's ``s_src`` token strings.
        target_tokens: the decoder's ``s_tgt`` token strings (what it read, e.g. ``<s>``
            followed by the target without its last token).
        output: the :class:`attnkit.nn.TransformerOutput`.
        index: which batch entry to show.
        text: the input text.

    Returns:
        Data of kind ``"encoder-decoder"`` with encoder, decoder and cross sections.
    """
    return ViewerData.encoder_decoder(
        model_name,
        source_tokens,
        target_tokens,
        encoder=_by_layer(output.encoder_weights, index, cross=False),
        decoder=_by_layer(output.decoder_weights, index, cross=False),
        cross=_by_layer(output.decoder_weights, index, cross=True),
        text=text,
    )
