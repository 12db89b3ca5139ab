"""``attnkit inspect``: one layer's attention in a real model, as in the notes' practical
example — between tokens or words, printed, drawn as a heatmap, saved as JSON, and as the
interactive viewer of every layer and head."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from attnkit.cli import CommandError
from attnkit.inspect.maps import EXAMPLE_TEXT, LEVELS, AttentionMap, attention_map

# Files that show the chosen layer and heads (``attnkit heads`` writes these too) ...
FORMATS = ("png", "svg", "json")
# ... and those ``attnkit inspect`` adds: the viewer page, of every layer and head.
INSPECT_FORMATS = (*FORMATS, "html")
DEFAULT_MODEL = "smollm2"
DEFAULT_OUT = "attnkit-out"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="show where each token attends in a real model",
        description=(
            "Run a real model on TEXT and show one layer's attention: the tokens, the keys "
            "each query token attends to most, a heatmap in the notes' style (Blues, values "
            "annotated, query tokens as rows, key tokens as columns), the weights as JSON, and "
            "with --format html one self-contained viewer page of every layer and head. "
            f'Defaults reproduce the notes\' example: "{EXAMPLE_TEXT}", SmolLM2, last layer, head 0. '
            "Models come from `attnkit models fetch NAME`."
        ),
    )
    parser.add_argument("text", nargs="?", default=EXAMPLE_TEXT, metavar="TEXT",
                        help=f'the text to run (default: "{EXAMPLE_TEXT}")')
    add_model_argument(parser)
    parser.add_argument("--layer", type=int, default=-1, metavar="L",
                        help="layer, from 0; negative counts from the end (default: -1, the last)")
    parser.add_argument("--head", default="0", metavar="H|all", help='head, from 0, or "all" (default: 0)')
    parser.add_argument("--top", type=int, default=3, metavar="K", help="keys shown per query token (default: 3)")
    add_level_argument(parser)
    add_output_arguments(parser, default_formats="png,json", formats=INSPECT_FORMATS)
    parser.set_defaults(func=run)


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL, metavar="smollm2|minilm|PATH",
                        help="a fetched model, or a local folder with config.json and safetensors "
                             f"(default: {DEFAULT_MODEL})")


LEVEL_HELP = (
    "attention between tokens, or between the words of the text (whitespace and punctuation units; "
    "a word attends to another with the sum over the other's tokens, averaged over its own tokens) "
    "(default: token)"
)


def add_level_argument(parser: argparse.ArgumentParser, *, help: str = LEVEL_HELP) -> None:
    parser.add_argument("--level", choices=LEVELS, default="token", help=help)


def add_output_arguments(
    parser: argparse.ArgumentParser, *, default_formats: str, formats: tuple[str, ...] = FORMATS
) -> None:
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR", help=f"where to write files (default: {DEFAULT_OUT}/)")
    parser.add_argument("--format", default=default_formats, metavar="FMT[,FMT]",
                        help=f"files to write, any of {','.join(formats)} (default: {default_formats})")


def parse_formats(text: str, allowed: tuple[str, ...] = FORMATS) -> list[str]:
    """``"png,json"`` as ``["png", "json"]``.

    Args:
        text: the ``--format`` value.
        allowed: the formats the command writes.

    Raises:
        CommandError: an unknown or missing format.
    """
    formats = [f.strip().lower() for f in text.split(",") if f.strip()]
    unknown = [f for f in formats if f not in allowed]
    if unknown or not formats:
        raise CommandError(f"--format takes a comma-separated list of {', '.join(allowed)}, got {text!r}")
    return list(dict.fromkeys(formats))


def load_model(name: str) -> Any:
    """``attnkit.models.load(name)`` with its errors as command errors.

    Raises:
        CommandError: the model is unknown, not fetched (the message says how to fetch
            it), corrupt, or its dependencies are missing.
    """
    try:
        from attnkit import models

        return models.load(name)
    except (OSError, ValueError, ImportError) as err:
        raise CommandError(str(err)) from None


def file_stem(model_name: str) -> str:
    """A model name safe to use in file names."""
    return re.sub(r"[^\w.-]+", "_", model_name).strip("_") or "model"


def write_json(data: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def write_map(amap: AttentionMap, out: Path, formats: list[str]) -> list[Path]:
    """Write the heatmap of each head (``png``/``svg``) and the weights (``json``); other
    formats are left to their writers (:func:`write_viewer`).

    Returns:
        The paths written.
    """
    stem = f"{file_stem(amap.model)}_layer{amap.layer}"
    # Word maps get their own names, next to the token maps of the same text.
    suffix, unit = ("", "") if amap.words is None else ("_words", " word")
    written = []
    pictures = [f for f in formats if f in ("png", "svg")]
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


def run(args: argparse.Namespace) -> int:
    from attnkit.viz.attention_text import render_map

    formats = parse_formats(args.format, INSPECT_FORMATS)
    if not args.text.strip():
        raise CommandError("the text is empty")
    if args.top < 1:
        raise CommandError(f"--top must be at least 1, got {args.top}")
    model = load_model(args.model)
    try:
        amap = attention_map(model, args.text, layer=args.layer, head=args.head, level=args.level)
        print(render_map(amap, top=args.top), end="", flush=True)
        written = write_map(amap, Path(args.out), formats)
        if "html" in formats:
            written.append(write_viewer(model, args.text, Path(args.out), level=args.level))
    except (ValueError, ImportError) as err:
        raise CommandError(str(err)) from None
    print()
    for path in written:
        print(f"wrote {path}")
    return 0
