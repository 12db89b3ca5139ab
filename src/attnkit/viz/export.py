"""Files of attention maps, viewer pages and head surveys: what ``attnkit inspect`` and
``attnkit heads`` write, available to any program.

- :func:`write_map`: one heatmap per head (PNG/SVG) and the weights as JSON.
- :func:`write_viewer`: the self-contained viewer page of every layer and head.
- :func:`write_survey`: one layers × heads picture per statistic, and the numbers as JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

from attnkit.inspect.maps import AttentionMap
from attnkit.inspect.survey import DESCRIPTIONS, HeadSurvey

PICTURE_FORMATS = ("png", "svg")


def file_stem(model_name: str) -> str:
    """A model name safe to use in file names: runs of characters other than letters,
    digits, ``.``, ``-`` and ``_`` become ``_`` (``"model"`` when nothing is left)."""
    return re.sub(r"[^\w.-]+", "_", model_name).strip("_") or "model"


def write_json(data: dict[str, Any], path: Path) -> Path:
    """Write ``data`` as UTF-8 JSON on one line, creating the folder.

    Returns:
        ``path``.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def write_map(amap: AttentionMap, out: Path, formats: Collection[str]) -> list[Path]:
    """Write the heatmap of each head (``png``/``svg``) and the weights (``json``) of one
    layer; other formats are left to their writers (:func:`write_viewer`).

    Args:
        amap: from :func:`attnkit.inspect.attention_map`.
        out: the folder to write to.
        formats: any of ``png``, ``svg``, ``json``.

    Returns:
        The paths written: ``MODEL_layerL_headH.png`` per head and format, and
        ``MODEL_layerL_headH.json`` (``all-heads`` for several heads); word maps add
        ``_words`` before the extension.

    Raises:
        ImportError: matplotlib is missing and a picture was asked for.
    """
    stem = f"{file_stem(amap.model)}_layer{amap.layer}"
    # Word maps get their own names, next to the token maps of the same text.
    suffix, unit = ("", "") if amap.words is None else ("_words", " word")
    written = []
    pictures = [f for f in formats if f in PICTURE_FORMATS]
    if pictures:
        from attnkit.viz.heatmap import draw_heatmap

        for position, head in enumerate(amap.heads):
            for fmt in pictures:
                written.append(draw_heatmap(
                    amap.weights[position], amap.labels, amap.labels, out / f"{stem}_head{head}{suffix}.{fmt}",
                    title=f"Layer {amap.layer}, head {head} — {amap.model}" + (" (words)" if suffix else ""),
                    xlabel=f"Key{unit} (attended to)", ylabel=f"Query{unit} (attending)",
                ))
    if "json" in formats:
        heads = f"head{amap.heads[0]}" if len(amap.heads) == 1 else "all-heads"
        written.append(write_json(amap.to_dict(), out / f"{stem}_{heads}{suffix}.json"))
    return written


def write_viewer(model: Any, text: str, out: Path, *, level: str = "token") -> Path:
    """Write the viewer page (``html``) of ``text``: every layer and head of ``model``, not
    only the ones printed, so that one file is enough to explore the whole model.

    Args:
        model: an :mod:`attnkit.models` model.
        text: the input.
        out: the folder to write to.
        level: ``"token"``, or ``"word"`` for the attention between the words of the text.

    Returns:
        The path written: ``MODEL_viewer.html``, or ``MODEL_viewer_words.html``.

    Raises:
        ValueError: the model refuses the text, or an unknown level.
        ImportError: the viewer's dependencies are missing.
    """
    from attnkit.viz.viewer import viewer_data_from_run, write_html

    run = model.run(text, attention=True)
    data = viewer_data_from_run(model, run, name=model.name, text=text, level=level)
    suffix = "_words" if level == "word" else ""
    return write_html(out / f"{file_stem(model.name)}_viewer{suffix}.html", data)


def write_survey(survey: HeadSurvey, out: Path, formats: Collection[str]) -> list[Path]:
    """Write one layers × heads picture per statistic (and for the token pair) and the JSON.

    Args:
        survey: from :func:`attnkit.inspect.survey_heads`.
        out: the folder to write to.
        formats: any of ``png``, ``svg``, ``json``.

    Returns:
        The paths written: ``MODEL_heads_STAT.png`` per statistic and picture format, and
        ``MODEL_heads.json``.

    Raises:
        ImportError: matplotlib is missing and a picture was asked for.
    """
    stem = f"{file_stem(survey.model)}_heads"
    written = []
    pictures = [f for f in formats if f in PICTURE_FORMATS]
    if pictures:
        from attnkit.viz.head_grid import draw_head_grid

        grids = [(name, values, DESCRIPTIONS[name]) for name, values in survey.statistics.items()]
        if survey.pair is not None:
            pair = survey.pair
            name = file_stem(f"{pair.source}-{pair.target}")
            grids.append((name, pair.mass, f"attention of {pair.source!r} on {pair.target!r}"))
        for name, values, label in grids:
            for fmt in pictures:
                written.append(draw_head_grid(
                    values, out / f"{stem}_{name}.{fmt}", title=f"{label} — {survey.model}", label=label,
                ))
    if "json" in formats:
        written.append(write_json(survey.to_dict(), out / f"{stem}.json"))
    return written
