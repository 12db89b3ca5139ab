"""``attnkit inspect``: attention in a real model, as in the tutorial's practical
example — between tokens or words, printed, drawn as a heatmap, saved as JSON, and as the
interactive viewer of every layer and head."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from attnkit.cli import CommandError
from attnkit.cli.common import (
    FORMATS,
    Status,
    add_figure_arguments,
    add_level_argument,
    add_model_argument,
    add_output_arguments,
    add_quiet_argument,
    add_size_argument,
    check_sizes,
    command_errors,
    figure_options,
    format_size,
    load_model,
    parse_formats,
    parse_size,
    prepare_out,
    print_written,
)
from attnkit.cli.long_context import add_long_arguments, run_inspect_long
from attnkit.inspect.names import ATTENTION_KINDS, EXAMPLE_TEXT, FLOW_MAX_TOKENS, METHODS, VIEWER_MODES
from attnkit.viz.terminal import counted

# ``attnkit inspect`` adds to the shared formats the viewer page, of every layer and head.
INSPECT_FORMATS = (*FORMATS, "html")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="show where each token attends in a real model",
        description=(
            "Run a real model on TEXT and show a layer's attention: the tokens, the keys "
            "each query token attends to most, a heatmap (query tokens as rows, key tokens as "
            "columns; values written in the cells of short texts, cells a causal model cannot "
            "attend to in grey), the weights as JSON, and with --format html one self-contained "
            "viewer page of every layer and head. Files estimated larger than --max-size are refused "
            "before anything runs. Status lines go to stderr (--quiet for none). "
            f'Defaults show the tutorial\'s example: "{EXAMPLE_TEXT}", SmolLM2, last layer, head 0. '
            "Models come from `attnkit models fetch NAME`."
        ),
    )
    parser.add_argument(
        "text", nargs="?", default=EXAMPLE_TEXT, metavar="TEXT", help=f'the text to run (default: "{EXAMPLE_TEXT}")'
    )
    add_model_argument(parser)
    add_chat_argument(parser)
    _add_map_arguments(parser)
    _add_encoder_decoder_arguments(parser)
    add_level_argument(parser)
    add_output_arguments(parser, default_formats="png,json", formats=INSPECT_FORMATS)
    add_size_argument(parser)
    add_figure_arguments(parser)
    add_quiet_argument(parser)
    add_long_arguments(parser, inspect=True)
    parser.set_defaults(func=run)


def add_chat_argument(parser: argparse.ArgumentParser) -> None:
    """``--chat``."""
    parser.add_argument(
        "--chat",
        action="store_true",
        help="read TEXT as a chat model reads it, in the model's chat template: TEXT is one user message, "
        'or a JSON list of messages such as \'[{"role": "user", "content": "Hi"}]\' (or a .json file of one); '
        "positions (--rows) count the template's tokens, and the html page shows each token's turn and role",
    )


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


def _add_map_arguments(parser: argparse.ArgumentParser) -> None:
    """``--layers``, ``--heads``, ``--top``, ``--method`` and ``--target``."""
    parser.add_argument(
        "--layers",
        "--layer",
        dest="layers",
        default=None,
        metavar="L[,L]|all",
        help="layers, from 0, negative from the end, comma-separated, or all: the printed maps, "
        "pictures and JSON show each (default: -1, the last); the html page shows these "
        "(default: all)",
    )
    parser.add_argument(
        "--heads",
        "--head",
        dest="heads",
        default=None,
        metavar="H[,H]|all",
        help="heads, from 0, comma-separated, or all; several heads are drawn as small multiples "
        "in one picture (default: 0; the html page: all)",
    )
    parser.add_argument(
        "--rows",
        default=None,
        metavar="A:B",
        help="the query tokens (rows) to show, from A up to B (from 0, negative from the end; "
        "either side may be left out: --rows=-64: is the last 64, 100 alone is token 100): only these "
        "rows of the heads asked for are formed, beside a plain forward pass, so that a long "
        "text's map fits in memory; with the raw weights between tokens, not with --format html "
        "(default: every token)",
    )
    parser.add_argument("--top", type=int, default=3, metavar="K", help="keys shown per query token (default: 3)")
    parser.add_argument(
        "--method",
        choices=METHODS,
        default="raw",
        help="what the maps show: raw attention weights; rollout or flow (every layer below merged, "
        f"heads merged; flow takes at most {FLOW_MAX_TOKENS} tokens); value (weights times the "
        "norm of what each key token sends through the head); grad (weights times the gradient "
        "of --target); with --format html, value and rollout are added to the page as "
        "colour modes beside the weights, in its Attention menu; flow and grad are not in the "
        "page, which shows the raw weights (default: raw)",
    )
    parser.add_argument(
        "--target",
        metavar="TOKEN|TEXT",
        help="for --method grad: the next token whose log-probability to explain, leading space "
        'included (" Paris"), or for an encoder a text whose sentence-embedding similarity to explain',
    )


def _add_encoder_decoder_arguments(parser: argparse.ArgumentParser) -> None:
    """``--decoder-text``, ``--attention`` and ``--max-new-tokens``."""
    encoder_decoder = parser.add_argument_group(
        "encoder-decoder models (T5, BART)",
        "TEXT is the source; the maps show one of the three kinds of attention, the decoder's with "
        "target tokens as rows (each the token its position produces) and, for cross-attention, "
        "source tokens as columns. --layers are then the decoder's layers (the encoder's for "
        "--attention encoder); the html page shows the three kinds, every layer of both stacks.",
    )
    encoder_decoder.add_argument(
        "--decoder-text",
        metavar="TEXT",
        help="the target the decoder reads (teacher forcing); without it the model generates the "
        "target greedily, and says so",
    )
    encoder_decoder.add_argument(
        "--attention",
        choices=ATTENTION_KINDS,
        default=None,
        help="encoder (self-attention over the source), decoder (masked self-attention over the "
        "target) or cross (target tokens attending to source tokens; the default)",
    )
    encoder_decoder.add_argument(
        "--max-new-tokens",
        type=int,
        default=32,
        metavar="N",
        help="the most tokens to generate without --decoder-text (default: 32)",
    )


def parse_layers(spec: str | None, num_layers: int) -> list[int] | None:
    """``--layers``: ``None`` when not given, else the layers as ``0 .. n-1``.

    Raises:
        CommandError: not a comma-separated list of layers or ``all``, or a layer out of range.
    """
    from attnkit.functional.indices import IndexOutOfRange
    from attnkit.inspect.maps import resolve_layer

    if spec is None:
        return None
    if spec.strip().lower() == "all":
        return list(range(num_layers))
    try:
        return list(dict.fromkeys(resolve_layer(int(part), num_layers) for part in spec.split(",")))
    except IndexOutOfRange as err:
        raise CommandError(str(err)) from None
    except ValueError:
        raise CommandError(f'--layers takes layers such as 29 or 0,5,-1 or "all", got {spec!r}') from None


def parse_heads(spec: str | None, num_heads: int) -> list[int] | None:
    """``--heads``: ``None`` when not given, else the heads as ``0 .. h-1``.

    Raises:
        CommandError: not a comma-separated list of heads or ``all``, or a head out of range.
    """
    from attnkit.inspect.maps import resolve_heads

    if spec is None:
        return None
    if spec.strip().lower() == "all":
        return list(range(num_heads))
    try:
        return list(dict.fromkeys(h for part in spec.split(",") for h in resolve_heads(part.strip(), num_heads)))
    except ValueError as err:
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


def run(args: argparse.Namespace) -> int:
    if args.long:
        if args.rows is not None or args.chat:
            raise CommandError("--rows and --chat are not for --long, which reads the text a window at a time")
        return run_inspect_long(
            args, lambda model: (parse_layers(args.layers, model.num_layers), parse_heads(args.heads, model.num_heads))
        )
    if args.file is not None or args.max_tokens is not None:
        raise CommandError("--file and --max-tokens go with --long")
    status = Status(args.quiet)
    formats = parse_formats(args.format, INSPECT_FORMATS)
    limit = parse_size(args.max_size)
    figure = figure_options(args)
    _check_options(args)
    out = prepare_out(args.out)
    # Every option is checked above, before PyTorch and the model load.
    model = load_model(args.model, args.device, revision=args.revision, dtype=args.dtype, status=status)
    if getattr(model, "encoder_decoder", False):
        if args.rows is not None or args.chat:
            raise CommandError(f"--rows and --chat are for models of one text; {model.name} is an encoder-decoder")
        return _run_encoder_decoder(args, model, status, formats, limit, figure, out)
    args = argparse.Namespace(**{**vars(args), "text": chat_text(model, args.text)}) if args.chat else args
    if args.decoder_text is not None or args.attention is not None:
        raise CommandError(
            f"--decoder-text and --attention are for encoder-decoder models (T5, BART); {model.name} is a "
            f"{model.family} model with one text and one self-attention"
        )
    try:
        tokens = len(model.tokenize(args.text).tokens)
    except ValueError as err:
        raise CommandError(str(err)) from None
    chosen = replace(_Chosen.of(args, model), rows=_row_range(args.rows, tokens))
    estimates = _check_map_sizes(args, model, formats, figure, limit, tokens, chosen)
    if chosen.page in estimates:
        status.say(f"{chosen.page}: about {format_size(estimates[chosen.page])}, estimated before computing")
    written = []
    with command_errors(f"cannot write to --out {args.out}"):
        # Everything is computed and checked (finite weights) before any file is written.
        maps = _maps(args, model, status, tokens, chosen)
        page = None
        if "html" in formats:
            from attnkit.viz.export import viewer_page

            with status.step(f"computing {chosen.page}"):
                modes = [args.method] if args.method in VIEWER_MODES else []
                page = viewer_page(
                    model, args.text, out, level=args.level, layers=chosen.layers, heads=chosen.heads, modes=modes
                )
        written += _write_maps(args, maps, status, formats, figure, out)
        if page is not None:
            from attnkit.viz.viewer import write_html

            with status.step(f"writing {chosen.page}"):
                written.append(write_html(*page))
    print_written(written, sizes=True)
    if "html" in formats and args.method not in ("raw", *VIEWER_MODES):
        print(
            f"note: the viewer page shows the raw attention weights, not --method {args.method}, "
            "which is in the terminal view above and the picture and JSON files"
        )
    return 0


def _check_options(args: argparse.Namespace) -> None:
    """The options that need no model: a text, ``--top``, and ``--target`` with ``--method grad``.

    Raises:
        CommandError: one of them is wrong.
    """
    if not args.text.strip():
        raise CommandError("the text is empty")
    if args.top < 1:
        raise CommandError(f"--top must be at least 1, got {args.top}")
    if args.method == "grad" and args.target is None:
        raise CommandError(
            '--method grad needs --target: the next token whose log-probability to explain (" Paris"), '
            "or for an encoder a text"
        )
    if args.method != "grad" and args.target is not None:
        raise CommandError(f"--target is only for --method grad, not --method {args.method}")
    if args.rows is not None:
        parse_rows(args.rows)
        if args.method != "raw" or args.level != "token" or "html" in parse_formats(args.format, INSPECT_FORMATS):
            raise CommandError(
                "--rows shows some rows of the raw weights between tokens: not with --method "
                f"{args.method}, --level {args.level} or --format html"
            )


@dataclass(frozen=True)
class _Chosen:
    """The layers and heads that ``attnkit inspect`` shows: ``--layers`` and ``--heads`` as
    given (``None`` when not), those of the printed maps and files, those of the page; the
    rows of the maps (``--rows``; ``None`` for every token)."""

    layers: list[int] | None
    heads: list[int] | None
    map_layers: list[int]
    map_heads: list[int]
    page_layers: list[int]
    page_heads: list[int]
    rows: range | None = None

    @classmethod
    def of(cls, args: argparse.Namespace, model: Any) -> _Chosen:
        """Read ``--layers`` and ``--heads`` for ``model``.

        Raises:
            CommandError: a layer or head that is not one, or out of range.
        """
        layers = parse_layers(args.layers, model.num_layers)
        heads = parse_heads(args.heads, model.num_heads)
        return cls(
            layers,
            heads,
            map_layers=layers or [model.num_layers - 1],
            map_heads=heads or [0],
            page_layers=layers or list(range(model.num_layers)),
            page_heads=heads or list(range(model.num_heads)),
        )

    @property
    def page(self) -> str:
        """The viewer page, in words."""
        return f"the viewer page of {counted(len(self.page_layers), 'layer')} × {counted(len(self.page_heads), 'head')}"


def _check_map_sizes(
    args: argparse.Namespace,
    model: Any,
    formats: list[str],
    figure: dict,
    limit: int | None,
    tokens: int,
    chosen: _Chosen,
) -> dict[str, int]:
    """Estimate every file's size before anything is computed, and refuse those over ``limit``.

    Returns:
        Each file, as the messages name it, and its estimated size in bytes.

    Raises:
        CommandError: a file over the limit (the message names each and what to ask instead).
    """
    from attnkit.inspect.maps import model_windows
    from attnkit.viz.export import estimate_map_canvas, estimate_map_json, estimate_viewer_html

    causal = bool(model.causal)
    heads = len(chosen.map_heads)
    rows = None if chosen.rows is None else len(chosen.rows)
    estimates = {}
    if "json" in formats:
        for layer in chosen.map_layers:
            estimates[f"the JSON of layer {layer}"] = estimate_map_json(tokens, heads, causal=causal, rows=rows)
    if "png" in formats:
        canvas = estimate_map_canvas(tokens, heads, dpi=figure.get("dpi"), figsize=figure.get("figsize"), rows=rows)
        estimates["the canvas of each PNG (pixels × 4 bytes, drawn before compression)"] = canvas
    if "html" in formats:
        # A value colour mode doubles the weights of the page; rollout adds one map per layer.
        page_heads = len(chosen.page_heads)
        mode_heads = {"value": page_heads, "rollout": 1}.get(args.method, 0)
        windows = model_windows(model)
        estimates[chosen.page] = estimate_viewer_html(
            tokens,
            len(chosen.page_layers),
            page_heads + mode_heads,
            causal=causal,
            windows=None if windows is None else [windows[layer] for layer in chosen.page_layers],
        )
    # --dpi and --figsize size pictures only.
    pictures = ", a lower --dpi or --figsize" if {"png", "svg"} & set(formats) else ""
    check_sizes(
        estimates,
        limit,
        advice=(
            f"The text is {tokens} tokens: ask for fewer layers, heads or rows (--layers, --heads, --rows), "
            f"a shorter text{pictures}, or other formats (--format)"
        ),
    )
    return estimates


def _maps(args: argparse.Namespace, model: Any, status: Status, tokens: int, chosen: _Chosen) -> list[Any]:
    """The map of each chosen layer, each checked to be finite.

    Raises:
        ValueError: a map with NaN or infinite weights (naming its layer).
    """
    from attnkit.inspect.methods import method_map
    from attnkit.viz.export import check_map_finite

    maps = []
    map_heads = chosen.map_heads
    for layer in chosen.map_layers:
        with status.step(f"running {model.name} on {tokens} tokens for layer {layer}"):
            amap = method_map(
                model,
                args.text,
                method=args.method,
                layer=layer,
                head=map_heads,  # only these heads' weights are formed
                level=args.level,
                target=args.target,
                rows=chosen.rows,
            )
        check_map_finite(amap)
        maps.append(amap)
    return maps


def _write_maps(
    args: argparse.Namespace, maps: list[Any], status: Status, formats: list[str], figure: dict, out: Path
) -> list[Path]:
    """Print each map and write its files (all formats but html).

    Returns:
        The files written.
    """
    from attnkit.viz.attention_text import render_map
    from attnkit.viz.export import write_map
    from attnkit.viz.terminal import terminal_safe

    written: list[Path] = []
    files = [f for f in formats if f != "html"]
    for amap in maps:
        print(terminal_safe(render_map(amap, top=args.top)), end="", flush=True)
        if files:
            with status.step(f"writing {', '.join(files)} of layer {amap.layer}"):
                written += write_map(amap, out, files, **figure)
    return written


def _run_encoder_decoder(
    args: argparse.Namespace,
    model: Any,
    status: Status,
    formats: list[str],
    limit: int | None,
    figure: dict,
    out: Path,
) -> int:
    """``attnkit inspect`` on an encoder–decoder: one run of the source and the target (given
    or generated), then the maps of one kind of attention and the viewer page of all three."""
    from attnkit.inspect.encoder_decoder import ENCODER_DECODER_METHODS, encoder_decoder_map
    from attnkit.viz.attention_text import render_map
    from attnkit.viz.export import write_encoder_decoder_viewer, write_map
    from attnkit.viz.terminal import terminal_safe

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
    map_layers = parse_layers(args.layers, depth) or [depth - 1]
    heads = _parse_stack_heads(args.heads, kind, model)
    map_heads = heads or [0]
    html = "html" in formats
    _check_encoder_decoder_sizes(model, formats, limit, max(s_src, s_tgt), map_layers, heads)
    # The html page shows every layer of both stacks; the other formats the chosen ones.
    encoder_layers: bool | list[int] = True if html else (map_layers if kind == "encoder" else [])
    decoder_layers: bool | list[int] = True if html else (map_layers if kind != "encoder" else [])
    what = "the given target" if args.decoder_text is not None else "a greedily generated target"
    written = []
    with command_errors(f"cannot write to --out {args.out}"):
        with status.step(f"running {model.name} on {s_src} source tokens and {what}"):
            run = model.run_encoder_decoder(
                args.text,
                args.decoder_text,
                encoder_layers=encoder_layers,
                decoder_layers=decoder_layers,
                heads=_heads_of_each_kind(heads, kind, model.heads_per_kind),
                max_new_tokens=new_tokens,
            )
        if run.generated:
            print(
                terminal_safe(
                    f"no --decoder-text: {model.name} generated the target greedily "
                    f"({len(run.target_tokens)} tokens): {run.target_text!r}"
                )
            )
        for layer in map_layers:
            amap = encoder_decoder_map(
                model, run, attention=kind, layer=layer, heads=map_heads, level=args.level, method=args.method
            )
            print(terminal_safe(render_map(amap, top=args.top)), end="", flush=True)
            files = [f for f in formats if f != "html"]
            if files:
                with status.step(f"writing {', '.join(files)} of layer {layer}"):
                    written += write_map(amap, out, files, **figure)
        if html:
            with status.step("writing the viewer page of the encoder, decoder and cross-attention"):
                written.append(write_encoder_decoder_viewer(model, run, out, level=args.level))
    print_written(written, sizes=True)
    return 0


def _target_budget(args: argparse.Namespace, model: Any) -> int:
    """The most target tokens to generate: ``--max-new-tokens``, capped (with a note) at the
    positions the model has, so that neither the KV cache nor the positions overflow.

    Raises:
        CommandError: ``--max-new-tokens`` below 1.
    """
    from attnkit.viz.terminal import terminal_safe

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


def _heads_of_each_kind(heads: list[int] | None, kind: str, counts: dict[str, int]) -> dict[str, list[int]] | None:
    """The heads a run keeps of each kind of attention: those of ``--heads`` (checked
    against ``kind``'s stack); the page's other kinds keep the ones their stack has, or all
    their heads when it has none of them."""
    if heads is None:
        return None
    out = {other: [h for h in heads if h < count] or list(range(count)) for other, count in counts.items()}
    return out | {kind: heads}


def _check_encoder_decoder_sizes(
    model: Any, formats: list[str], limit: int | None, tokens: int, map_layers: list[int], heads: list[int] | None
) -> None:
    """Estimate an encoder–decoder's files before anything is computed, and refuse those
    over ``limit`` (``tokens``: the longer of source and target).

    Raises:
        CommandError: a file over the limit.
    """
    from attnkit.viz.export import estimate_map_json, estimate_viewer_html

    estimates = {}
    if "json" in formats:
        for layer in map_layers:
            estimates[f"the JSON of layer {layer}"] = estimate_map_json(tokens, len(heads or [0]), causal=False)
    if "html" in formats:
        page_heads = len(heads or range(max(model.heads_per_kind.values())))
        page_layers = model.num_layers + 2 * model.num_decoder_layers
        estimates[f"the viewer page of {page_layers} maps × {counted(page_heads, 'head')}"] = estimate_viewer_html(
            tokens, page_layers, page_heads, causal=False
        )
    check_sizes(
        estimates,
        limit,
        advice="ask for fewer layers or heads (--layers, --heads), shorter texts, or other formats (--format)",
    )
