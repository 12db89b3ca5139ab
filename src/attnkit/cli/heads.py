"""``attnkit heads``: what each head of a real model does — per-head statistics over one or
many texts, as a table, layers × heads pictures and JSON."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnkit.cli import CommandError
from attnkit.cli.common import (
    Status,
    add_figure_arguments,
    add_level_argument,
    add_model_argument,
    add_output_arguments,
    add_quiet_argument,
    command_errors,
    figure_options,
    format_size,
    load_model_of,
    parse_formats,
    prepare_out,
    print_written,
)
from attnkit.cli.launch import add_nproc_argument, check_nproc, check_world_size, launched_by_torchrun, relaunch
from attnkit.cli.long_context import LONG_ONLY_STATISTICS, LONG_STATISTICS, add_long_arguments, run_heads_long
from attnkit.inspect.names import ATTENTION_KINDS, CROSS_STATISTICS, DETECTORS, INDUCTION_PERIOD, STATISTICS
from attnkit.models.model.kinds import ONE_TEXT, SOURCE_AND_TARGET, for_kind, require_kind
from attnkit.viz.terminal import counted


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "heads",
        help="per-head statistics of a real model",
        description=(
            "Per-head statistics of a real model over one text or a file of texts (one per "
            "line): entropy, mean attention distance, mass on the previous token, on the "
            "first token (attention sink) and on the token itself, averaged over the texts, "
            f"and an induction score on {INDUCTION_PERIOD} random tokens repeated twice. "
            "With --from and --to, ranks the heads by how much one token attends to another "
            "(e.g. --from it --to animal), or one word to another with --level word. Prints the top heads and a layers × heads grid, "
            "and writes one layers × heads picture per statistic and the numbers as JSON."
        ),
    )
    parser.add_argument("text", nargs="?", metavar="TEXT", help="the text to run")
    parser.add_argument(
        "--file",
        metavar="FILE",
        help="texts to run, one per line (blank lines skipped); with --long, one long text read from its start, "
        "as far as the tokens the run can take",
    )
    add_model_argument(parser)
    _add_token_pair_arguments(parser)
    parser.add_argument("--top", type=int, default=5, metavar="N", help="heads listed per statistic (default: 5)")
    parser.add_argument(
        "--stat",
        choices=list(dict.fromkeys([*STATISTICS, *CROSS_STATISTICS, *LONG_STATISTICS])),
        metavar="NAME",
        help=f"print this statistic's layers × heads values instead of the role grid: {', '.join(STATISTICS)}; "
        f"of cross-attention: entropy, first, {', '.join(CROSS_STATISTICS)}; of a long text (--long): "
        f"{', '.join(LONG_STATISTICS)} (sink, window and retrieval imply --long; retrieval runs a "
        "needle-in-a-haystack probe and needs no text)",
    )
    add_long_arguments(parser, inspect=False)
    _add_ablation_arguments(parser)
    parser.add_argument(
        "--detect",
        choices=DETECTORS,
        help="instead of statistics, score every head on TEXT against a detection pattern: the share of its "
        "attention on the previous token, on earlier occurrences of the same token (duplicate-token), or on "
        "the tokens after them (induction); a layers × heads grid, PNG and JSON with scores[layer][head]",
    )
    _add_encoder_decoder_arguments(parser)
    add_output_arguments(parser, default_formats="png,json")
    add_figure_arguments(parser, scale=False)
    add_quiet_argument(parser)
    add_nproc_argument(
        parser,
        help="survey the --file texts with N processes of this machine (launches torchrun; "
        "each runs its share of the texts, rank 0 prints and writes the same table as "
        "one process)",
    )
    parser.set_defaults(func=run)


def _add_token_pair_arguments(parser: argparse.ArgumentParser) -> None:
    """``--from``, ``--to`` and ``--level``."""
    parser.add_argument(
        "--from",
        dest="source",
        metavar="TOKEN",
        help="the attending token (or word, with --level word), matched with the text it stands for, ignoring case",
    )
    parser.add_argument("--to", dest="target", metavar="TOKEN", help="the attended token (or word)")
    add_level_argument(
        parser,
        help="--from and --to name tokens, or words of the text, whose attention is the "
        "sum over the key word's tokens averaged over the query word's (default: token)",
    )


def _add_ablation_arguments(parser: argparse.ArgumentParser) -> None:
    """``--ablate``, ``--mean``, ``--resample`` and ``--target``."""
    ablation = parser.add_argument_group("head ablation")
    ablation.add_argument(
        "--ablate",
        action="store_true",
        help="instead of statistics, ablate each head in turn (its output z set to zero) and report "
        "the change in log p(--target) at the last position (causal models) or in the "
        "sentence-embedding cosine to the unablated text (encoders): a layers × heads grid, "
        "PNG and JSON with effects[layer][head]",
    )
    ablation.add_argument(
        "--mean",
        action="store_true",
        help="with --ablate, replace z by its mean over the positions of the --file texts "
        "(default: of TEXT) instead of zero",
    )
    ablation.add_argument(
        "--resample",
        action="store_true",
        help="with --ablate and --file, replace z by its value on each --file text in turn (each as many tokens "
        "as TEXT) and report the mean change: resampling ablation",
    )
    ablation.add_argument(
        "--target",
        dest="ablate_target",
        metavar="TOKEN",
        help="with --ablate on a causal model, the next token to measure, leading space included "
        '(" Paris"); it must be a single token',
    )


def _add_encoder_decoder_arguments(parser: argparse.ArgumentParser) -> None:
    """``--decoder-text``, ``--attention`` and ``--align``."""
    encoder_decoder = parser.add_argument_group(
        "encoder-decoder models (T5, BART)",
        "TEXT (or each line of --file) is a source; a line may give its target after a tab "
        "(SOURCE<TAB>TARGET), else the model generates it greedily. Statistics are those of one "
        "kind of attention; cross-attention has entropy, mass on the first and the last source "
        "token, and with --align the alignment score.",
    )
    encoder_decoder.add_argument("--decoder-text", metavar="TEXT", help="the target of TEXT (default: generated)")
    encoder_decoder.add_argument(
        "--attention",
        choices=ATTENTION_KINDS,
        default=None,
        help="encoder, decoder or cross (the default) attention",
    )
    encoder_decoder.add_argument(
        "--align",
        metavar="FILE|diagonal|anti-diagonal",
        help="score each cross-attention head by the fraction of target words whose most-attended "
        "source word is aligned with it: a word alignment file (one line per source/target pair, "
        "links SOURCE-TARGET of word indices from 0, as fast_align writes: 0-0 1-2 2-1), or "
        "diagonal (word i with word i, a copy) or anti-diagonal (the reverse task)",
    )


# The most --file bytes read: far more texts than a survey on this machine gets through.
MAX_FILE_BYTES = 64 * 10**6


def read_texts(text: str | None, file: str | None) -> list[str]:
    """The texts to survey: TEXT, or the non-blank lines of FILE (:func:`read_numbered_texts`)."""
    return [line for _, line in read_numbered_texts(text, file)]


def read_numbered_texts(text: str | None, file: str | None) -> list[tuple[int, str]]:
    """The texts to survey with their line numbers: ``[(1, TEXT)]``, or the non-blank lines
    of FILE, numbered from 1 as in the file.

    Raises:
        CommandError: both or neither given, an unreadable file, one over
            :data:`MAX_FILE_BYTES`, or no text in it.
    """
    if (text is None) == (file is None):
        raise CommandError("give either a TEXT or --file FILE")
    if text is not None:
        if not text.strip():
            raise CommandError("the text is empty")
        return [(1, text)]
    assert file is not None
    try:
        with open(file, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)  # never more: --file may be a device or a pipe
        if len(data) > MAX_FILE_BYTES:
            raise CommandError(
                f"--file {file} is larger than {format_size(MAX_FILE_BYTES)}; give fewer texts at a time"
            )
        lines = data.decode("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise CommandError(f"cannot read --file {file}: {err}") from None
    texts = [(number, line) for number, line in enumerate(lines, 1) if line.strip()]
    if not texts:
        raise CommandError(f"--file {file} has no text")
    return texts


def _check_lines(model: Any, file: str, numbered: list[tuple[int, str]]) -> None:
    """Refuse a line of ``--file`` that the model cannot read (no token, too long), by its
    line number, before any survey starts.

    Raises:
        CommandError: ``--file FILE, line N: why``.
    """
    for number, line in numbered:
        try:
            model.tokenize(line)
        except ValueError as err:
            raise CommandError(f"--file {file}, line {number}: {err}") from None


def run(args: argparse.Namespace) -> int:
    if args.long or args.stat in LONG_ONLY_STATISTICS:
        return run_heads_long(args)
    if args.max_tokens is not None:
        raise CommandError("--max-tokens goes with --long")
    check_nproc(args)
    distributed = launched_by_torchrun()
    if (args.nproc is not None or distributed) and (args.ablate or args.file is None):
        raise CommandError(
            "--nproc (and torchrun) split the texts of --file across processes; give --file, without --ablate"
        )
    if args.ablate and args.detect is not None:
        raise CommandError("--ablate and --detect are two different analyses: give one")
    if args.ablate:
        return run_ablation(args)
    if args.detect is not None:
        return run_detection(args)
    if args.mean or args.resample or args.ablate_target is not None:
        raise CommandError("--mean and --target go with --ablate, as does --resample")
    formats, numbered = _survey_formats_and_texts(args)
    texts = [line for _, line in numbered]
    figure = figure_options(args)
    if args.nproc is not None and not distributed:
        return relaunch(args)
    # Every option is checked above, before PyTorch and the model load.
    survey_fn, talks = _survey_function(args, distributed)
    status = Status(args.quiet or not talks)
    out = prepare_out(args.out)
    model = load_model_of(args, status)
    if args.file is not None:
        _check_lines(model, args.file, numbered)
    job = _SurveyJob(texts, status, formats, figure, out, survey_fn, talks, distributed)
    survey = for_kind(
        model, {ONE_TEXT: _run_one_text_survey, SOURCE_AND_TARGET: _run_encoder_decoder_survey}, what="attnkit heads"
    )
    return survey(args, model, job)


@dataclass(frozen=True)
class _SurveyJob:
    """What a head survey was given before its model loaded: the texts, where and how to
    write, and the survey of this process (or of its process group under torchrun)."""

    texts: list[str]
    status: Status
    formats: list[str]
    figure: dict
    out: Path
    survey_fn: Callable[..., Any]
    talks: bool
    distributed: bool


def _run_one_text_survey(args: argparse.Namespace, model: Any, job: _SurveyJob) -> int:
    """``attnkit heads`` on a model of one text: every layer's and head's statistics over
    the texts, in this process or split across a process group."""
    from attnkit.viz.attention_text import render_survey
    from attnkit.viz.export import write_survey
    from attnkit.viz.terminal import terminal_safe

    if args.decoder_text is not None or args.attention is not None or args.align is not None:
        raise CommandError(
            f"--decoder-text, --attention and --align are for encoder-decoder models (T5, BART); {model.name} is a "
            f"{model.family} model"
        )
    with command_errors(f"cannot write to --out {args.out}"):
        sizes = f"{counted(model.num_layers, 'layer')} × {counted(model.num_heads, 'head')}"
        with job.status.step(f"surveying {sizes} of {model.name} on {counted(len(job.texts), 'text')}"):
            survey = job.survey_fn(model, job.texts, source=args.source, target=args.target, level=args.level)
        if job.distributed:
            from attnkit.distributed import leave

            leave()
        if not job.talks:
            return 0
        print(terminal_safe(render_survey(survey, top=args.top, stat=args.stat)), end="", flush=True)
        with job.status.step(f"writing {', '.join(job.formats)}"):
            written = write_survey(survey, job.out, job.formats, **job.figure)
    print_written(written)
    return 0


def _survey_formats_and_texts(args: argparse.Namespace) -> tuple[list[str], list[tuple[int, str]]]:
    """Check the options of a statistics survey (``--stat alignment`` with ``--align``,
    ``--top``, ``--from`` with ``--to``) and read what it needs: the output formats and
    the numbered texts (:func:`read_numbered_texts`).

    Raises:
        CommandError: an option that does not fit, or texts that cannot be read.
    """
    if args.stat == "alignment" and args.align is None:
        raise CommandError(
            "--stat alignment needs --align FILE: the score compares cross-attention with the word alignments given"
        )
    formats = parse_formats(args.format)
    numbered = read_numbered_texts(args.text, args.file)
    if args.top < 1:
        raise CommandError(f"--top must be at least 1, got {args.top}")
    if (args.source is None) != (args.target is None):
        raise CommandError("--from and --to go together: the token that attends and the token attended to")
    return formats, numbered


def _survey_function(args: argparse.Namespace, distributed: bool) -> tuple[Callable[..., Any], bool]:
    """The survey to run and whether this process prints and writes: the one-process
    survey, or under torchrun the process group's (joined here), of which rank 0 talks."""
    if not distributed:
        from attnkit.inspect.survey import survey_heads

        return survey_heads, True
    from attnkit import distributed as dist_survey

    info = dist_survey.init(device=None if args.device.startswith("cuda") else "cpu")
    check_world_size(args, info.world_size)
    if args.device.startswith("cuda"):
        args.device = str(info.device)
    return dist_survey.survey_heads, info.is_main


def run_ablation(args: argparse.Namespace) -> int:
    """``heads TEXT --ablate [--mean [--file FILE] | --resample --file FILE] [--target TOKEN]``."""
    if args.text is None or not args.text.strip():
        raise CommandError("--ablate needs the TEXT to run")
    if args.source is not None or args.stat is not None:
        raise CommandError("--ablate does not take --from, --to or --stat")
    if args.file is not None and not (args.mean or args.resample):
        raise CommandError(
            "--file gives the reference texts of --mean or --resample; with --ablate alone, give only TEXT"
        )
    if args.resample and (args.mean or args.file is None):
        raise CommandError("--resample takes the texts of --file (each as many tokens as TEXT), without --mean")
    if args.top < 1:
        raise CommandError(f"--top must be at least 1, got {args.top}")
    formats = parse_formats(args.format)
    reference = read_texts(None, args.file) if args.file is not None else [args.text]
    figure = figure_options(args)
    status = Status(args.quiet)
    out = prepare_out(args.out)
    # Every option is checked above, before PyTorch and the model load.
    from attnkit.inspect.interventions import head_ablation
    from attnkit.viz.attention_text import render_effects
    from attnkit.viz.export import write_effects
    from attnkit.viz.terminal import terminal_safe

    model = load_model_of(args, status)
    ablation_target = for_kind(
        model,
        {ONE_TEXT: _one_text_ablation_target, SOURCE_AND_TARGET: _encoder_decoder_ablation_target},
        what="--ablate",
    )
    target = ablation_target(args, model)
    with command_errors(f"cannot write to --out {args.out}"):
        with status.step(f"ablating the heads of {model.name}"):
            effects = head_ablation(
                model,
                args.text,
                target=target,
                mean_over=reference if args.mean else None,
                resample_from=reference if args.resample else None,
            )
        print(terminal_safe(render_effects(effects, top=args.top)), end="", flush=True)
        with status.step(f"writing {', '.join(formats)}"):
            written = write_effects(effects, out, formats, **figure)
    print_written(written)
    return 0


def _one_text_ablation_target(args: argparse.Namespace, model: Any) -> str | None:
    """What ``--ablate`` measures on a model of one text: ``--target`` (none: the model's default)."""
    if args.decoder_text is not None:
        raise CommandError(f"--decoder-text is for encoder-decoder models (T5, BART); {model.name} is not one")
    return args.ablate_target


def _encoder_decoder_ablation_target(args: argparse.Namespace, model: Any) -> str:
    """What ``--ablate`` measures on an encoder–decoder: log p of the ``--decoder-text``."""
    if args.decoder_text is None or args.ablate_target is not None or args.mean or args.resample:
        raise CommandError(
            f"{model.name} is an encoder-decoder: --ablate measures log p of the --decoder-text TARGET given "
            "the source TEXT (no --target, no --mean)"
        )
    return str(args.decoder_text)


def run_detection(args: argparse.Namespace) -> int:
    """``heads TEXT --detect previous-token|duplicate-token|induction``."""
    if args.text is None or not args.text.strip():
        raise CommandError("--detect needs the TEXT to run")
    if args.file is not None or args.source is not None or args.stat is not None or args.mean:
        raise CommandError("--detect takes TEXT alone, without --file, --from, --to, --stat or --mean")
    if args.top < 1:
        raise CommandError(f"--top must be at least 1, got {args.top}")
    formats = parse_formats(args.format)
    figure = figure_options(args)
    status = Status(args.quiet)
    out = prepare_out(args.out)
    # Every option is checked above, before PyTorch and the model load.
    from attnkit.inspect.detectors import detect_heads
    from attnkit.viz.attention_text import render_detection
    from attnkit.viz.export import write_detection
    from attnkit.viz.terminal import terminal_safe

    model = load_model_of(args, status)
    with command_errors(f"cannot write to --out {args.out}"):
        require_kind(model, ONE_TEXT, what="--detect reads one stack's self-attention")
        with status.step(f"scoring {model.num_layers} layers × {model.num_heads} heads of {model.name}"):
            detection = detect_heads(model, args.text, args.detect)
        print(terminal_safe(render_detection(detection, top=args.top)), end="", flush=True)
        with status.step(f"writing {', '.join(formats)}"):
            written = write_detection(detection, out, formats, **figure)
    print_written(written)
    return 0


def _run_encoder_decoder_survey(args: argparse.Namespace, model: Any, job: _SurveyJob) -> int:
    """``attnkit heads`` on an encoder–decoder: one kind of attention over source/target
    pairs, in one process, with the alignment score when ``--align`` is given."""
    from attnkit.inspect.encoder_decoder import read_alignments, survey_encoder_decoder
    from attnkit.viz.attention_text import render_survey
    from attnkit.viz.export import write_survey
    from attnkit.viz.terminal import terminal_safe

    if job.distributed or args.source is not None:
        raise CommandError("an encoder-decoder's heads are surveyed in one process, without --from and --to")
    texts, status, formats, figure, out = job.texts, job.status, job.formats, job.figure, job.out
    kind = args.attention or "cross"
    if args.decoder_text is not None and args.file is not None:
        raise CommandError("--decoder-text goes with TEXT; with --file, give each target after a tab")
    pairs: list[tuple[str, str | None]] = []
    for text in texts:
        source, tab, target = text.partition("\t")
        pairs.append((source, target if tab else args.decoder_text))
    if args.align is not None and kind != "cross":
        raise CommandError(f"--align scores cross-attention heads; got --attention {kind}")
    with command_errors("cannot read or write"):
        alignments = None if args.align is None else read_alignments(args.align, len(pairs))
        depth = model.num_layers if kind == "encoder" else model.num_decoder_layers
        sizes = f"{counted(depth, 'layer')} × {counted(model.heads_per_kind[kind], 'head')}"
        with status.step(f"surveying the {kind} attention of {sizes} on {counted(len(pairs), 'source')}"):
            survey = survey_encoder_decoder(model, pairs, attention=kind, alignments=alignments)
        print(terminal_safe(render_survey(survey, top=args.top, stat=args.stat)), end="", flush=True)
        with status.step(f"writing {', '.join(formats)}"):
            written = write_survey(survey, out, formats, **figure)
    print_written(written)
    return 0
