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
from attnkit.cli.long_context import LONG_PAGE, MAP_SIDE
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
    """The status line of each estimate a plan says before anything runs."""
    for name in said:
        status.say(f"{name}: about {format_size(estimates[name])}, estimated before computing")


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
    from attnkit.viz.estimates import estimate_map_canvas, estimate_map_json, estimate_viewer_html

    causal = bool(model.causal)
    heads, rows = len(plan.heads), None if plan.rows is None else len(plan.rows)
    estimates = {}
    if "json" in plan.formats:
        for layer in plan.layers:
            estimates[f"the JSON of layer {layer}"] = estimate_map_json(plan.tokens, heads, causal=causal, rows=rows)
    if "png" in plan.formats:
        dpi, figsize = plan.figure.get("dpi"), plan.figure.get("figsize")
        canvas = estimate_map_canvas(plan.tokens, heads, dpi=dpi, figsize=figsize, rows=rows)
        estimates["the canvas of each PNG (pixels × 4 bytes, drawn before compression)"] = canvas
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
    check_sizes(
        plan.estimates,
        options.limit,
        advice="ask for fewer layers or heads (--layers, --heads), shorter texts, or other formats (--format)",
    )
    return plan


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
    """Each file of ``plan``, as the messages name it, and its estimated size in bytes (as
    if both texts were as long as the longer one)."""
    from attnkit.viz.estimates import estimate_map_json, estimate_viewer_html

    tokens = max(plan.source_tokens, plan.target_tokens)
    estimates = {}
    if "json" in plan.formats:
        for layer in plan.layers:
            estimates[f"the JSON of layer {layer}"] = estimate_map_json(tokens, len(plan.map_heads), causal=False)
    if "html" in plan.formats:
        page_heads = len(plan.heads or range(max(model.heads_per_kind.values())))
        page_layers = model.num_layers + 2 * model.num_decoder_layers
        estimates[f"the viewer page of {page_layers} maps × {counted(page_heads, 'head')}"] = estimate_viewer_html(
            tokens, page_layers, page_heads, causal=False
        )
    return estimates


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
        advice=f"The text is {len(labels)} tokens: ask for fewer layers or heads (--layers, --heads), a smaller --top",
    )
    return plan


def _estimate_long(plan: LongPlan, model: Any) -> dict[str, int]:
    """The long view page of ``plan`` (with html), as the messages name it, and its bound
    in bytes (:func:`attnkit.viz.viewer.long_view.estimate_long_html`: it grows with the
    heads and with ``s · --top``). The other files are not estimated: the head table has a
    row per head, the reduced maps at most ``MAP_SIDE²`` cells per layer, and the top keys
    ``heads · s · --top`` compressed integers."""
    if "html" not in plan.formats:
        return {}
    from attnkit.viz.viewer.long_view import estimate_long_html

    heads = len(plan.layers) * len(plan.heads or range(model.num_heads))
    bound = estimate_long_html(plan.labels, heads, top_k=plan.top, block=plan.block, model_name=model.name)
    return {f"the long view page of {counted(heads, 'head')} ({LONG_PAGE})": bound}
