"""Files of attention maps, viewer pages and head surveys: what ``attnkit inspect`` and
``attnkit heads`` write, available to any program.

- :func:`write_map`: one heatmap per head (PNG/SVG) and the weights as JSON.
- :func:`write_viewer`: the self-contained viewer page of every layer and head.
- :func:`write_survey`: one layers × heads picture per statistic, and the numbers as JSON.

How large those files will be, before anything is computed, is said by
:mod:`attnkit.viz.estimates`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnkit.deprecation import moved_names
from attnkit.viz.attention_text import numbered
from attnkit.viz.files import write_text_atomic

if TYPE_CHECKING:
    # Imported where they are needed: writing one map reaches neither.
    from attnkit.inspect.detectors import HeadDetection
    from attnkit.inspect.interventions import InterventionEffects
    from attnkit.inspect.maps import AttentionMap
    from attnkit.inspect.survey import HeadSurvey
    from attnkit.viz.viewer.data import ViewerData

PICTURE_FORMATS = ("png", "svg")

# The size estimates, now in attnkit.viz.estimates: still importable from here until 0.3.
__getattr__ = moved_names(
    __name__,
    dict.fromkeys(
        (
            "estimate_map_json",
            "estimate_map_canvas",
            "estimate_viewer_html",
            "viewer_page_bytes",
            "JSON_BYTES_PER_WEIGHT",
            "JSON_BYTES_PER_TOKEN",
            "VIEWER_BYTES_FIT",
            "VIEWER_BYTES_PER_LAYER",
            "VIEWER_BYTES_PER_TOKEN",
        ),
        "attnkit.viz.estimates",
    ),
    removed_in="0.3",
)

# What each method's values are, on the colour bar of its map.
MAP_QUANTITIES = {
    "raw": "weight",
    "rollout": "rollout weight",
    "flow": "flow",
    "value": "‖α·f(x)‖",
    "grad": "α·∂/∂α",
}


def heads_tag(heads: Sequence[int]) -> str:
    """How file names name heads: ``head3``; ``heads0-8`` for a run of heads; ``heads0_3_5``."""
    if len(heads) == 1:
        return f"head{heads[0]}"
    if list(heads) == list(range(heads[0], heads[0] + len(heads))):
        return f"heads{heads[0]}-{heads[-1]}"
    return "heads" + "_".join(map(str, heads))


def file_stem(model_name: str) -> str:
    """A model name safe to use in file names: runs of characters other than letters,
    digits, ``.``, ``-`` and ``_`` become ``_`` (``"model"`` when nothing is left)."""
    return re.sub(r"[^\w.-]+", "_", model_name).strip("_") or "model"


def write_json(data: dict[str, Any], path: Path) -> Path:
    """Write ``data`` as UTF-8 JSON on one line, creating the folder; atomically (an
    older file of that name is replaced only by a complete one).

    Returns:
        ``path``.
    """
    return write_text_atomic(path, json.dumps(data, ensure_ascii=False) + "\n")


def _map_stem(amap: AttentionMap) -> str:
    """The files' name of a map without its suffix: model, attention kind, layer, heads
    (:func:`heads_tag`), method, and the rows of a map of some rows (``_rows100-163``)."""
    tag = heads_tag(amap.heads) if amap.heads else "all-heads"
    kind = "" if amap.attention == "self" else f"_{amap.attention}"
    stem = f"{file_stem(amap.model_name)}{kind}_layer{amap.layer}_{tag}"
    stem += "" if amap.method == "raw" else f"_{amap.method}"
    return stem if amap.rows is None else f"{stem}_rows{amap.rows.start}-{amap.rows.stop - 1}"


def write_map(
    amap: AttentionMap, out: Path, formats: Collection[str], *, dpi: float | None = None, **figure: Any
) -> list[Path]:
    """Write the heatmap (``png``/``svg``) and the weights (``json``) of one layer; other
    formats are left to their writers (:func:`write_viewer`). Several heads are drawn as
    small multiples in one picture (:func:`attnkit.viz.heatmap.plot_attention_heads`).

    Args:
        amap: from :func:`attnkit.inspect.attention_map`.
        out: the folder to write to.
        formats: any of ``png``, ``svg``, ``json``.
        dpi: dots per inch of PNG files (default: the drawing function's).
        **figure: options of the pictures: ``figsize``, ``cmap``, ``scale``.

    Returns:
        The paths written: ``MODEL_layerL_headH.png`` per format and
        ``MODEL_layerL_headH.json``, ``headsA-B`` for several heads
        (:func:`heads_tag`); word maps add ``_words`` before the extension, maps of an
        encoder–decoder its kind of attention after the model (``MODEL_cross_layerL_...``).

    Raises:
        ImportError: matplotlib is missing and a picture was asked for.
        ValueError: an unknown colour map or scale, or weights that are NaN or infinite
            (before anything is written).
    """
    check_map_finite(amap)
    stem = _map_stem(amap)
    # A map of some rows greys what their queries cannot see from their own positions.
    rows_at = {} if amap.rows is None else {"first_query": amap.rows.start}
    # Word maps get their own names, next to the token maps of the same text.
    suffix, unit = ("", "") if amap.words is None else ("_words", " word")
    written = []
    pictures = [f for f in formats if f in PICTURE_FORMATS]
    if pictures:
        from attnkit.viz.heatmap import draw_attention_heads, draw_heatmap

        xlabel, ylabel = _axis_labels(amap.attention, unit)
        what = (
            f"{amap.model_name}"
            + ("" if amap.attention == "self" else f" {amap.attention}")
            + ("" if amap.method == "raw" else f", {amap.method}")
            + (" (words)" if suffix else "")
        )
        saving: dict[str, Any] = {} if dpi is None else {"dpi": dpi}
        saving["label"] = MAP_QUANTITIES.get(amap.method, "weight")
        for fmt in pictures:
            path = out / f"{stem}{suffix}.{fmt}"
            if len(amap.heads) <= 1:
                name = f"head {amap.heads[0]}" if amap.heads else "all heads"
                written.append(
                    draw_heatmap(
                        amap.weights[0],
                        amap.row_labels,
                        amap.column_labels,
                        path,
                        title=f"Layer {amap.layer}, {name} — {what}",
                        causal=amap.causal,
                        **rows_at,
                        xlabel=xlabel,
                        ylabel=ylabel,
                        **saving,
                        **figure,
                    )
                )
            else:
                written.append(
                    draw_attention_heads(
                        amap.weights,
                        amap.row_labels,
                        amap.column_labels,
                        path,
                        heads=amap.heads,
                        title=f"Layer {amap.layer} — {what}",
                        causal=amap.causal,
                        **rows_at,
                        xlabel=xlabel,
                        ylabel=ylabel,
                        **saving,
                        **figure,
                    )
                )
    if "json" in formats:
        written.append(write_json(amap.to_dict(), out / f"{stem}{suffix}.json"))
    return written


def check_map_finite(amap: AttentionMap) -> None:
    """Refuse a map with a NaN or an infinity, naming the layer and its kind.

    Raises:
        ValueError: from :func:`attnkit.functional.finite.check_finite`.
    """
    from attnkit.functional.finite import check_finite

    kind = "" if amap.attention == "self" else f"{amap.attention} "
    method = "" if amap.method == "raw" else f" ({amap.method})"
    check_finite(amap.weights, f"the {kind}attention map{method} of layer {amap.layer} of {amap.model_name}")


def _axis_labels(attention: str, unit: str) -> tuple[str, str]:
    """``(x label, y label)`` of a heatmap of one kind of attention (``unit`` is ``""`` or
    ``" word"``)."""
    if attention == "cross":
        return f"Source{unit or ' token'} (attended to)", f"Target{unit or ' token'} (attending)"
    if attention == "decoder":
        return f"Decoder input{unit or ' token'} (attended to)", f"Target{unit or ' token'} (attending)"
    return f"Key{unit} (attended to)", f"Query{unit} (attending)"


def write_viewer(
    model: Any,
    text: str,
    out: Path,
    *,
    level: str = "token",
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    modes: Sequence[str] = (),
) -> Path:
    """Write the viewer page (``html``) of ``text``: by default every layer and head of
    ``model``, not only the ones printed, so that one file is enough to explore the whole
    model. :func:`viewer_page` then :func:`attnkit.viz.viewer.write_html`.

    Returns:
        The path written: ``MODEL_viewer.html``, or ``MODEL_viewer_words.html``.

    Raises:
        As :func:`viewer_page`.
    """
    from attnkit.viz.viewer import write_html

    return write_html(*viewer_page(model, text, out, level=level, layers=layers, heads=heads, modes=modes))


def viewer_page(
    model: Any,
    text: str,
    out: Path,
    *,
    level: str = "token",
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    modes: Sequence[str] = (),
    chat: bool = False,
) -> tuple[Path, ViewerData]:
    """The viewer page of ``text``, computed and checked but not written.

    Args:
        model: an :mod:`attnkit.models` model.
        text: the input.
        out: the folder it is for.
        level: ``"token"``, or ``"word"`` for the attention between the words of the text.
        layers: the layers to include (default: all).
        heads: the heads of each layer to include (default: all).
        modes: colour modes to add beside the weights, any of ``"value"`` and
            ``"rollout"`` (:func:`attnkit.viz.viewer.adapters.mode_sections`); the page's
            "Attention" menu switches between them.
        chat: read ``text`` in the model's chat template
            (:func:`attnkit.inspect.maps.chat_input`): the page shows each token's turn.

    Returns:
        ``(path, data)``: ``out/MODEL_viewer.html`` (``_viewer_words.html`` for words) and
        the page's data.

    Raises:
        ValueError: the model refuses the text, an unknown level, or weights that are NaN
            or infinite (naming the layer).
        ImportError: the viewer's dependencies are missing.
    """
    from dataclasses import replace

    from attnkit.functional.finite import check_finite
    from attnkit.inspect.maps import chat_input
    from attnkit.viz.viewer import viewer_data_from_run
    from attnkit.viz.viewer.adapters import mode_sections

    text = chat_input(model, text, chat)
    run = model.run(text, return_weights=True if layers is None else list(layers), heads=heads)
    for layer, weights in run.attentions.items():
        check_finite(weights, f"the attention weights of layer {layer} of {model.name}")
    data = viewer_data_from_run(model, run, name=model.name, text=text, level=level)
    if modes:
        own = data.sections["self"]
        extra = mode_sections(model, text, modes, layers=own.layers, heads=own.heads, level=level)
        data = replace(data, sections={**data.sections, **extra})
    suffix = "_words" if level == "word" else ""
    return out / f"{file_stem(model.name)}_viewer{suffix}.html", data


def write_encoder_decoder_viewer(model: Any, run: Any, out: Path, *, level: str = "token") -> Path:
    """Write the viewer page of an encoder–decoder run: its encoder, decoder and
    cross-attention sections, each with the layers and heads the run holds.

    Args:
        model: the encoder–decoder :class:`attnkit.models.Model`.
        run: its :class:`attnkit.models.model.encoder_decoder.EncoderDecoderRun`.
        out: the folder to write to.
        level: ``"token"``, or ``"word"`` for the attention between words on both sides.

    Returns:
        The path written: ``MODEL_viewer.html``, or ``MODEL_viewer_words.html``.

    Raises:
        ValueError: a run without any weights, or an unknown level.
        ImportError: the viewer's dependencies are missing.
    """
    from attnkit.viz.viewer import write_html
    from attnkit.viz.viewer.adapters import viewer_data_from_encoder_decoder

    data = viewer_data_from_encoder_decoder(model, run, level=level)
    suffix = "_words" if level == "word" else ""
    return write_html(out / f"{file_stem(model.name)}_viewer{suffix}.html", data)


def write_effects(
    effects: InterventionEffects, out: Path, formats: Collection[str], *, dpi: float | None = None, **figure: Any
) -> list[Path]:
    """Write the grid of ablation or patching effects (``png``/``svg``): layers × heads, or
    layers × positions with the tokens as column labels; and the numbers (``json``,
    ``effects[row][column]``).

    Args:
        effects: from :func:`attnkit.inspect.interventions.head_ablation` or
            :func:`~attnkit.inspect.interventions.activation_patching`.
        out: the folder to write to.
        formats: any of ``png``, ``svg``, ``json``.
        dpi: dots per inch of PNG files (default: the drawing function's).
        **figure: options of the pictures: ``figsize``, ``cmap`` (default ``RdBu``,
            centred on zero).

    Returns:
        The paths written: ``MODEL_ablation.png`` (or ``_mean-ablation``,
        ``_resample-ablation``, ``_patching``, ``_attribution-patching``; a grid of another
        component than each head's ``z`` adds the component and where,
        ``_patching_resid_pre_by-position``)
        per picture format, and the ``.json``.

    Raises:
        ImportError: matplotlib is missing and a picture was asked for.
        ValueError: effects that are NaN or infinite (before anything is written).
    """
    from attnkit.functional.finite import check_finite

    kind = f"{effects.replacement}-ablation" if effects.replacement in ("mean", "resample") else effects.kind
    kind = kind.replace(" ", "-")
    check_finite(effects.effects, f"the {kind} effects ({effects.metric}) of {effects.model_name}")
    stem = f"{file_stem(effects.model_name)}_{kind}"
    if effects.by != "head" or effects.component != "z":
        stem += f"_{effects.component}_by-{effects.by}"
    title = f"{kind} — {effects.model_name}"
    if effects.by != "head" or effects.component != "z":
        title = f"{effects.kind} {effects.component} by {effects.by} — {effects.model_name}"
    written = []
    for fmt in [f for f in formats if f in PICTURE_FORMATS]:
        from attnkit.viz.head_grid import draw_head_grid

        options = {"cmap": "RdBu", "symmetric": True, **figure}
        axes: dict[str, Any] = (
            ({} if effects.rows is None else {"rows": effects.rows, "columns": effects.columns, "xlabel": "head"})
            if effects.by == "head"
            else {
                "rows": effects.row_labels,
                "columns": numbered(effects.columns),
                "xlabel": "source position (clean token)" if effects.by == "dest-src" else "position (clean token)",
            }
        )
        written.append(
            draw_head_grid(
                effects.effects,
                out / f"{stem}.{fmt}",
                title=title,
                label=effects.metric,
                **axes,
                **({} if dpi is None else {"dpi": dpi}),
                **options,
            )
        )
    if "json" in formats:
        written.append(write_json(effects.to_dict(), out / f"{stem}.json"))
    return written


def write_survey(
    survey: HeadSurvey, out: Path, formats: Collection[str], *, dpi: float | None = None, **figure: Any
) -> list[Path]:
    """Write one layers × heads picture per statistic (and for the token pair) and the JSON.

    Args:
        survey: from :func:`attnkit.inspect.survey.survey_heads`.
        out: the folder to write to.
        formats: any of ``png``, ``svg``, ``json``.
        dpi: dots per inch of PNG files (default: the drawing function's).
        **figure: options of the pictures: ``figsize``, ``cmap``.

    Returns:
        The paths written: ``MODEL_heads_STAT.png`` per statistic and picture format, and
        ``MODEL_heads.json``.

    Raises:
        ImportError: matplotlib is missing and a picture was asked for.
        ValueError: a statistic that is NaN or infinite (before anything is written).
    """
    from attnkit.functional.finite import check_finite
    from attnkit.inspect.survey import ALL_DESCRIPTIONS

    for name, values in survey.statistics.items():
        check_finite(values, f"the head statistic {name!r} of {survey.model_name}")
    if survey.pair is not None:
        check_finite(survey.pair.mass, f"the attention of {survey.pair.source!r} on {survey.pair.target!r}")

    stem = f"{file_stem(survey.model_name)}_heads"
    written = []
    pictures = [f for f in formats if f in PICTURE_FORMATS]
    if pictures:
        from attnkit.viz.head_grid import draw_head_grid

        grids = [(name, values, ALL_DESCRIPTIONS[name]) for name, values in survey.statistics.items()]
        if survey.pair is not None:
            pair = survey.pair
            name = file_stem(f"{pair.source}-{pair.target}")
            grids.append((name, pair.mass, f"attention of {pair.source!r} on {pair.target!r}"))
        for name, values, label in grids:
            for fmt in pictures:
                written.append(
                    draw_head_grid(
                        values,
                        out / f"{stem}_{name}.{fmt}",
                        title=f"{label} — {survey.model_name}",
                        label=label,
                        **({} if dpi is None else {"dpi": dpi}),
                        **figure,
                    )
                )
    if "json" in formats:
        written.append(write_json(survey.to_dict(), out / f"{stem}.json"))
    return written


def write_detection(
    detection: HeadDetection, out: Path, formats: Collection[str], *, dpi: float | None = None, **figure: Any
) -> list[Path]:
    """Write a head detector's layers × heads grid (``png``/``svg``) and its scores
    (``json``, ``scores[row][column]``).

    Args:
        detection: from :func:`attnkit.inspect.detectors.detect_heads`.
        out: the folder to write to.
        formats: any of ``png``, ``svg``, ``json``.
        dpi: dots per inch of PNG files (default: the drawing function's).
        **figure: options of the picture: ``figsize``, ``cmap``.

    Returns:
        The paths written: ``MODEL_detect_DETECTOR.png`` per picture format, and the ``.json``.

    Raises:
        ImportError: matplotlib is missing and a picture was asked for.
    """
    stem = f"{file_stem(detection.model_name)}_detect_{detection.detector}"
    written = []
    pictures = [f for f in formats if f in PICTURE_FORMATS]
    if pictures:
        from attnkit.viz.head_grid import draw_head_grid

        label = f"{detection.detector} score"
        for fmt in pictures:
            written.append(
                draw_head_grid(
                    detection.scores,
                    out / f"{stem}.{fmt}",
                    title=f"{label} — {detection.model_name}",
                    label=label,
                    rows=[str(layer) for layer in detection.layers],
                    **({} if dpi is None else {"dpi": dpi}),
                    **figure,
                )
            )
    if "json" in formats:
        written.append(write_json(detection.to_dict(), out / f"{stem}.json"))
    return written
