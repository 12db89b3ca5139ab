"""What ``attnkit inspect`` will do, decided before anything runs: one plan per mode, each a
typed record of the layers, heads, rows and formats it computes and writes and the one
estimate of every file it will write, refused over ``--max-size`` before the model runs.

- :func:`plan_maps`: a model of one text (the printed maps, pictures, JSON and viewer page).
- :func:`plan_encoder_decoder`: an encoder–decoder (one kind of attention, the page of all three).
- :func:`plan_long`: ``--long`` (the head table, top keys, block-reduced maps, long view page).

The readers of ``--layers``, ``--heads`` and ``--rows`` against the model are here too.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from attnkit.cli import CommandError
from attnkit.cli.common import Status, check_sizes, command_errors, format_size
from attnkit.cli.long_context import LONG_PAGE, LONG_TABLE, LONG_TOP_KEYS, MAP_SIDE
from attnkit.viz.terminal import counted, terminal_safe


@dataclass(frozen=True)
class InspectOptions:
    """The options of ``attnkit inspect`` read before the model loads: the formats, the
    ``--max-size`` limit (``None``: none), the pictures' options, the output folder, the
    status lines, and the colour modes a viewer page adds beside the weights (``--method``
    where the page has it)."""

    formats: list[str]
    limit: int | None
    figure: dict[str, Any]
    out: Path
    status: Status
    page_modes: list[str] = field(default_factory=list)


def parse_layers(spec: str | None, num_layers: int) -> list[int] | None:
    """``--layers``: ``None`` when not given, else the layers as ``0 .. n-1``, each once, in
    the order given.

    Raises:
        CommandError: not a comma-separated list of layers or ``all``, or a layer out of range.
    """
    if spec is None:
        return None
    if spec.strip().lower() == "all":
        return list(range(num_layers))
    try:
        asked = [int(part) for part in spec.split(",")]
    except ValueError:
        raise CommandError(f'--layers takes layers such as 29 or 0,5,-1 or "all", got {spec!r}') from None
    return _selected(asked, num_layers, "layer", f"this model has {num_layers} layers")


def parse_heads(spec: str | None, num_heads: int) -> list[int] | None:
    """``--heads``: ``None`` when not given, else the heads as ``0 .. h-1``, each once, in
    the order given (``all`` among them stands for every head).

    Raises:
        CommandError: not a comma-separated list of heads or ``all``, or a head out of range.
    """
    if spec is None:
        return None
    if spec.strip().lower() == "all":
        return list(range(num_heads))
    asked: list[int] = []
    for part in (part.strip() for part in spec.split(",")):
        try:
            asked += range(num_heads) if part == "all" else [int(part)]
        except ValueError:
            raise CommandError(f'head must be a number or "all", got {part!r}') from None
    return _selected(asked, num_heads, "head", f"this model has {num_heads} heads per layer")


def _selected(asked: list[int], count: int, what: str, context: str) -> list[int]:
    """``asked`` through the library's one selector, in the order given; an index out of
    range as a :class:`CommandError`."""
    from attnkit.functional.indices import IndexOutOfRange, select_indices

    try:
        return select_indices(asked, count, what, context=context, in_given_order=True)
    except IndexOutOfRange as err:
        raise CommandError(str(err)) from None


def parse_rows(spec: str | None) -> slice | None:
    """``--rows``: ``None`` when not given, else the rows as a slice of the tokens.

    Raises:
        CommandError: not ``A:B`` (either side may be left out) or one position ``A``.
    """
    if spec is None:
        return None
    start, colon, stop = spec.strip().partition(":")
    try:
        if not colon:
            first = int(start)
            return slice(first, first + 1 if first != -1 else None)
        return slice(int(start) if start.strip() else None, int(stop) if stop.strip() else None)
    except ValueError:
        raise CommandError(f"--rows takes the query tokens as A:B, A: or :B (or one token A), got {spec!r}") from None


def _row_range(spec: str | None, tokens: int) -> range | None:
    """``--rows`` for a text of ``tokens`` tokens, ``None`` for every row.

    Raises:
        CommandError: rows outside the text.
    """
    from attnkit.functional.indices import normalize_rows

    rows = parse_rows(spec)
    if rows is None:
        return None
    try:
        return normalize_rows(rows, tokens, context=f"the text has {tokens} tokens")
    except ValueError as err:
        raise CommandError(f"--rows {spec}: {err}") from None


def chat_text(model: Any, text: str) -> Any:
    """``--chat``: ``text`` (a message, a JSON list of messages, or a ``.json`` file of one)
    in the model's chat template (:meth:`attnkit.models.Model.apply_chat_template`).

    Raises:
        CommandError: a model without a chat template (one line that says so), or messages
            that are not messages.
    """
    path = Path(text)
    if text.endswith(".json") and path.is_file():
        with command_errors(f"cannot read the messages of {text}"):
            text = path.read_text(encoding="utf-8")
    try:
        return model.apply_chat_template(text)
    except ValueError as err:
        raise CommandError(str(err)) from None


def say_estimates(estimates: dict[str, int], said: tuple[str, ...], status: Status) -> None:
    """The status line of each estimate a plan says before anything runs: in every mode,
    those of the files that gather the whole run (the viewer pages, and ``--long``'s head
    table and top keys), not those written per layer."""
    for name in said:
        status.say(f"{name}: about {format_size(estimates[name])}, estimated before computing")


# How the estimates of pictures are named.
PNG_CANVAS = "the canvas of each PNG (pixels × 4 bytes, drawn before compression)"
SVG_FILE = "each SVG"


def picture_estimates(formats: list[str], tokens: int, heads: int, **picture: Any) -> dict[str, int]:
    """The estimates of the pictures ``formats`` asks for, of ``heads`` maps of ``tokens``
    columns (``picture``: ``rows``, ``dpi``, ``figsize``): a PNG's canvas
    (:func:`attnkit.viz.estimates.estimate_map_canvas`: it is drawn whole before it is
    compressed) and an SVG's bound (:func:`attnkit.viz.estimates.estimate_map_svg`)."""
    from attnkit.viz.estimates import estimate_map_canvas, estimate_map_svg

    estimates = {}
    if "png" in formats:
        estimates[PNG_CANVAS] = estimate_map_canvas(tokens, heads, **picture)
    if "svg" in formats:
        estimates[SVG_FILE] = estimate_map_svg(tokens, heads, **picture)
    return estimates


@dataclass(frozen=True)
class ViewerPagePlan:
    """The viewer page of a model of one text: ``--layers`` and ``--heads`` as given (``None``
    for every one), how many of each the page shows, and its colour modes."""

    layers: list[int] | None
    heads: list[int] | None
    layer_count: int
    head_count: int
    modes: list[str]

    @property
    def name(self) -> str:
        """The page, in words."""
        return f"the viewer page of {counted(self.layer_count, 'layer')} × {counted(self.head_count, 'head')}"


@dataclass(frozen=True)
class MapsPlan:
    """``attnkit inspect`` on a model of one text: the text as the model reads it and its
    length, the maps' layers, heads and rows (``None``: every token), what they show
    (``--method``, ``--level``, ``--target``) and the keys printed per query (``--top``),
    the formats and pictures' options, the viewer page (``None`` without html), and the
    estimate of each file (``said``: those said before anything runs)."""

    text: str
    tokens: int
    layers: list[int]
    heads: list[int]
    rows: range | None
    method: str
    level: str
    target: str | None
    top: int
    formats: list[str]
    figure: dict[str, Any]
    page: ViewerPagePlan | None
    estimates: dict[str, int] = field(default_factory=dict)
    said: tuple[str, ...] = ()


def plan_maps(args: argparse.Namespace, options: InspectOptions, model: Any) -> MapsPlan:
    """Read ``--chat``, ``--layers``, ``--heads`` and ``--rows`` against ``model``, and
    estimate every file.

    Raises:
        CommandError: an option for another kind of model, a text the model refuses, a layer,
            head or row out of range, or a file estimated over ``--max-size``.
    """
    text = chat_text(model, args.text) if args.chat else args.text
    if args.decoder_text is not None or args.attention is not None:
        raise CommandError(
            f"--decoder-text and --attention are for encoder-decoder models (T5, BART); {model.name} is a "
            f"{model.family} model with one text and one self-attention"
        )
    try:
        tokens = len(model.tokenize(text).tokens)
    except ValueError as err:
        raise CommandError(str(err)) from None
    layers = parse_layers(args.layers, model.num_layers)
    heads = parse_heads(args.heads, model.num_heads)
    page = None
    if "html" in options.formats:
        page_layers, page_heads = len(layers or range(model.num_layers)), len(heads or range(model.num_heads))
        page = ViewerPagePlan(layers, heads, page_layers, page_heads, options.page_modes)
    plan = MapsPlan(
        text,
        tokens,
        layers or [model.num_layers - 1],
        heads or [0],
        _row_range(args.rows, tokens),
        method=args.method,
        level=args.level,
        target=args.target,
        top=args.top,
        formats=options.formats,
        figure=options.figure,
        page=page,
    )
    plan = replace(plan, estimates=_estimate_maps(plan, model))
    pictures = ", a lower --dpi or --figsize" if {"png", "svg"} & set(plan.formats) else ""  # they size pictures only
    check_sizes(
        plan.estimates,
        options.limit,
        advice=(
            f"The text is {tokens} tokens: ask for fewer layers, heads or rows (--layers, --heads, --rows), "
            f"a shorter text{pictures}, or other formats (--format)"
        ),
    )
    return replace(plan, said=() if page is None else (page.name,))


def _estimate_maps(plan: MapsPlan, model: Any) -> dict[str, int]:
    """Each file of ``plan``, as the messages name it, and its estimated size in bytes."""
    from attnkit.inspect.maps import model_windows
    from attnkit.viz.estimates import estimate_map_json, estimate_viewer_html

    causal = bool(model.causal)
    heads, rows = len(plan.heads), None if plan.rows is None else len(plan.rows)
    estimates = {}
    if "json" in plan.formats:
        for layer in plan.layers:
            estimates[f"the JSON of layer {layer}"] = estimate_map_json(plan.tokens, heads, causal=causal, rows=rows)
    dpi, figsize = plan.figure.get("dpi"), plan.figure.get("figsize")
    estimates |= picture_estimates(plan.formats, plan.tokens, heads, dpi=dpi, figsize=figsize, rows=rows)
    if plan.page is not None:
        # A value colour mode doubles the weights of the page; rollout adds one map per layer.
        mode_heads = sum({"value": plan.page.head_count, "rollout": 1}[mode] for mode in plan.page.modes)
        windows = model_windows(model)
        page_layers = plan.page.layers or range(model.num_layers)
        estimates[plan.page.name] = estimate_viewer_html(
            plan.tokens,
            plan.page.layer_count,
            plan.page.head_count + mode_heads,
            causal=causal,
            windows=None if windows is None else [windows[layer] for layer in page_layers],
        )
    return estimates


@dataclass(frozen=True)
class EncoderDecoderPlan:
    """``attnkit inspect`` on an encoder–decoder: the source and the target
    (``--decoder-text``; ``None``: generated), their tokens (the target's: given, or the most
    to generate), the most tokens to generate without a given target, the kind of attention
    the maps show, their layers, ``--heads`` as given (``None``: not given), what they show
    (``--method``, ``--level``) and the keys printed per query (``--top``), the formats and
    pictures' options, and the estimate of each file."""

    source: str
    target: str | None
    source_tokens: int
    target_tokens: int
    new_tokens: int
    kind: str
    layers: list[int]
    heads: list[int] | None
    method: str
    level: str
    top: int
    formats: list[str]
    figure: dict[str, Any]
    estimates: dict[str, int] = field(default_factory=dict)
    said: tuple[str, ...] = ()

    @property
    def map_heads(self) -> list[int]:
        """The heads of each map: ``--heads``, or head 0."""
        return self.heads or [0]

    def stack_layers(self, stack: str) -> bool | list[int]:
        """The layers of ``stack`` (``"encoder"`` or ``"decoder"``) the run keeps: every one
        for the html page (``True``), else the maps' when they are of that stack."""
        if "html" in self.formats:
            return True
        return self.layers if (self.kind == "encoder") == (stack == "encoder") else []


def plan_encoder_decoder(args: argparse.Namespace, options: InspectOptions, model: Any) -> EncoderDecoderPlan:
    """Read ``--attention``, ``--method``, ``--max-new-tokens``, ``--layers`` and ``--heads``
    against an encoder–decoder, and estimate every file.

    Raises:
        CommandError: an option for models of one text, a method that kind of attention does
            not have, a text the model refuses, a layer or head out of range, or a file
            estimated over ``--max-size``.
    """
    from attnkit.inspect.encoder_decoder import ENCODER_DECODER_METHODS

    if args.rows is not None or args.chat:
        raise CommandError(f"--rows and --chat are for models of one text; {model.name} is an encoder-decoder")
    kind = args.attention or "cross"
    if args.method not in ENCODER_DECODER_METHODS or (args.method == "value" and kind != "cross"):
        raise CommandError(
            f"--method {args.method} is not available for an encoder-decoder's {kind} attention; "
            "it shows raw weights, and value-weighted cross-attention (--attention cross --method value)"
        )
    new_tokens = _target_budget(args, model)
    try:
        s_src = len(model.tokenize(args.text))
        s_tgt = new_tokens if args.decoder_text is None else len(model.tokenize(args.decoder_text))
    except ValueError as err:
        raise CommandError(str(err)) from None
    depth = model.num_layers if kind == "encoder" else model.num_decoder_layers
    layers = parse_layers(args.layers, depth) or [depth - 1]
    heads = _parse_stack_heads(args.heads, kind, model)
    plan = EncoderDecoderPlan(
        args.text,
        args.decoder_text,
        s_src,
        s_tgt,
        new_tokens,
        kind,
        layers,
        heads,
        method=args.method,
        level=args.level,
        top=args.top,
        formats=options.formats,
        figure=options.figure,
    )
    plan = replace(plan, estimates=_estimate_encoder_decoder(plan, model))
    pictures = ", a lower --dpi or --figsize" if {"png", "svg"} & set(plan.formats) else ""  # they size pictures only
    generated = "" if args.decoder_text is not None else ", a lower --max-new-tokens"
    check_sizes(
        plan.estimates,
        options.limit,
        advice=(
            f"The source is {s_src} tokens and the target {s_tgt}: ask for fewer layers or heads (--layers, "
            f"--heads), shorter texts{generated}{pictures}, or other formats (--format)"
        ),
    )
    return replace(plan, said=(_encoder_decoder_page(plan, model)[0],) if "html" in plan.formats else ())


def _target_budget(args: argparse.Namespace, model: Any) -> int:
    """The most target tokens to generate: ``--max-new-tokens``, capped (with a note) at the
    positions the model has, so that neither the KV cache nor the positions overflow.

    Raises:
        CommandError: ``--max-new-tokens`` below 1.
    """
    if args.max_new_tokens < 1:
        raise CommandError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")

    if args.decoder_text is not None or args.max_new_tokens <= model.max_length:
        return int(args.max_new_tokens)
    print(
        terminal_safe(
            f"note: --max-new-tokens {args.max_new_tokens} is more than {model.name} has positions for: "
            f"the target stops at {model.max_length} tokens if no end token comes first"
        )
    )
    return int(model.max_length)


def _parse_stack_heads(spec: str | None, kind: str, model: Any) -> list[int] | None:
    """``--heads`` checked against the heads of ``kind``'s stack (an encoder–decoder's
    stacks may have different head counts: BART).

    Raises:
        CommandError: a head that stack does not have (the message gives every kind's count).
    """
    counts, name = model.heads_per_kind, model.name
    try:
        return parse_heads(spec, counts[kind])
    except CommandError:
        each = ", ".join(f"{other} {count}" for other, count in counts.items())
        raise CommandError(
            f"--heads {spec}: the {kind} attention of {name} has {counts[kind]} heads per layer "
            f"(heads per kind: {each}); --attention picks the kind"
        ) from None


def _estimate_encoder_decoder(plan: EncoderDecoderPlan, model: Any) -> dict[str, int]:
    """Each file of ``plan``, as the messages name it, and its estimated size in bytes: the
    maps at their own rows and columns (target tokens as the rows of the decoder's and the
    cross-attention's, source tokens as the columns of the encoder's and the
    cross-attention's), the page at the size of each of its three sections."""
    from attnkit.viz.estimates import estimate_encoder_decoder_html, estimate_map_json

    s_src, s_tgt = plan.source_tokens, plan.target_tokens
    # The map's rows and columns, and the columns' own tokens when they are another text.
    rows, columns, key_tokens = {
        "encoder": (s_src, s_src, None),
        "decoder": (s_tgt, s_tgt, s_tgt),  # its keys are the decoder's inputs
        "cross": (s_tgt, s_src, s_src),
    }[plan.kind]
    heads = len(plan.map_heads)
    estimates = {}
    if "json" in plan.formats:
        for layer in plan.layers:
            estimates[f"the JSON of layer {layer}"] = estimate_map_json(
                rows, heads, causal=plan.kind == "decoder", key_tokens=key_tokens
            )
    dpi, figsize = plan.figure.get("dpi"), plan.figure.get("figsize")
    estimates |= picture_estimates(plan.formats, columns, heads, dpi=dpi, figsize=figsize, rows=rows)
    if "html" in plan.formats:
        name, kept = _encoder_decoder_page(plan, model)
        estimates[name] = estimate_encoder_decoder_html(
            s_src, s_tgt, encoder_layers=model.num_layers, decoder_layers=model.num_decoder_layers, heads=kept
        )
    return estimates


def _encoder_decoder_page(plan: EncoderDecoderPlan, model: Any) -> tuple[str, dict[str, int]]:
    """The viewer page of an encoder–decoder, in words, and the heads of each kind it holds
    (every layer of both stacks)."""
    chosen = heads_of_each_kind(plan.heads, plan.kind, model.heads_per_kind)
    kept = dict(model.heads_per_kind) if chosen is None else {kind: len(each) for kind, each in chosen.items()}
    page_layers = model.num_layers + 2 * model.num_decoder_layers
    return f"the viewer page of {page_layers} maps × {counted(max(kept.values()), 'head')}", kept


def heads_of_each_kind(heads: list[int] | None, kind: str, counts: dict[str, int]) -> dict[str, list[int]] | None:
    """The heads an encoder–decoder's run keeps of each kind of attention (``None``: all):
    those of ``--heads`` (checked against ``kind``'s stack); the page's other kinds keep the
    ones their stack has, or all their heads when it has none of them."""
    if heads is None:
        return None
    out = {other: [h for h in heads if h < count] or list(range(count)) for other, count in counts.items()}
    return out | {kind: heads}


@dataclass(frozen=True)
class LongPlan:
    """``attnkit inspect --long``: the ids ``[s]`` and their labels (tokens, or words with
    ``--level word``), the layers summarised, ``--heads`` (``None``: all), the keys kept per
    query (``--top``), the first tokens counted as the sink, the distance counted as near
    (``--window``), the tokens per side of a block of the reduced maps, the formats, and the
    estimate of each file."""

    ids: Any
    labels: list[str]
    layers: list[int]
    heads: list[int] | None
    top: int
    sink_tokens: int
    window: int
    block: int
    formats: list[str]
    estimates: dict[str, int] = field(default_factory=dict)
    said: tuple[str, ...] = ()


def plan_long(args: argparse.Namespace, options: InspectOptions, model: Any) -> LongPlan:
    """Read TEXT or the start of ``--file``, ``--layers`` and ``--heads`` against ``model``,
    and estimate every file.

    Raises:
        CommandError: a text the model refuses, a layer or head out of range, or a file
            estimated over ``--max-size``.
    """
    from attnkit.cli.long_text import long_token_ids
    from attnkit.inspect.maps import sequence_labels

    ids = long_token_ids(model, args.text, args.file, args.max_tokens)
    layers = parse_layers(args.layers, model.num_layers)
    heads = parse_heads(args.heads, model.num_heads)
    _, raw_tokens, _ = model.prepare_input(ids)
    labels = sequence_labels(model, raw_tokens, ids, None, None, level=args.level)
    block = max(1, math.ceil(ids.numel() / MAP_SIDE))
    plan = LongPlan(
        ids,
        labels,
        layers or list(range(model.num_layers)),
        heads,
        top=args.top,
        sink_tokens=args.sink_tokens,
        window=args.window,
        block=block,
        formats=options.formats,
    )
    plan = replace(plan, estimates=_estimate_long(plan, model))
    check_sizes(
        plan.estimates,
        options.limit,
        advice=(
            f"The text is {len(labels)} tokens: ask for fewer layers or heads (--layers, --heads), a smaller "
            "--top, fewer tokens (--max-tokens), or other formats (--format)"
        ),
    )
    # The files of the whole run are said; the pictures, one per layer, are not.
    return replace(plan, said=tuple(name for name in plan.estimates if name not in (PNG_CANVAS, SVG_FILE)))


def _estimate_long(plan: LongPlan, model: Any) -> dict[str, int]:
    """Each file of ``plan``, as the messages name it, and its bound in bytes
    (:mod:`attnkit.viz.estimates`): with json the head table (a row per head) and the top
    keys (``heads · s · --top`` keys and weights), with html the long view page (it grows
    with the heads and with ``s · --top``), with png or svg each layer's block-reduced map
    (at most ``MAP_SIDE`` blocks a side)."""
    from attnkit.viz.estimates import (
        estimate_long_html,
        estimate_long_table_json,
        estimate_long_top_npz,
    )

    s = len(plan.labels)
    heads = {layer: plan.heads or list(range(model.num_heads)) for layer in plan.layers}
    count = sum(len(chosen) for chosen in heads.values())
    estimates = {}
    if "json" in plan.formats:
        table = estimate_long_table_json(heads, tokens=s, block=plan.block, model_name=model.name)
        estimates[f"the head table of {counted(count, 'head')} ({LONG_TABLE})"] = table
        estimates[f"the top keys of {counted(count, 'head')} ({LONG_TOP_KEYS})"] = estimate_long_top_npz(
            heads, tokens=s, top_k=plan.top
        )
    if "html" in plan.formats:
        bound = estimate_long_html(plan.labels, count, top_k=plan.top, block=plan.block, model_name=model.name)
        estimates[f"the long view page of {counted(count, 'head')} ({LONG_PAGE})"] = bound
    return estimates | picture_estimates(plan.formats, math.ceil(s / plan.block), 1)
