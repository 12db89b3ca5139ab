"""What several commands share: the ``--model``, ``--device``, ``--level``, ``--out``,
``--format``, ``--quiet`` and figure arguments, status lines on stderr, file sizes,
loading a model with its errors as command errors, and the end of a command that writes
files (its errors as command errors, then the ``wrote`` lines).

This module imports no PyTorch: ``attnkit`` checks a model's name before it loads anything.
"""

from __future__ import annotations

import argparse
import difflib
import gc
import math
import re
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from attnkit.inspect.names import LEVELS, SCALES
from attnkit.models.checkpoints.registry import MODELS
from attnkit.models.model.names import DTYPE_NAMES


class CommandError(Exception):
    """A user-facing error: printed as ``attnkit: error: ...`` with exit status 2."""


# The largest file a command writes unless --max-size says otherwise.
DEFAULT_MAX_SIZE = "20MB"
_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9}
# The largest --max-size taken as a number (larger ones would overflow; "none" lifts it).
MAX_SIZE_LIMIT = 10**15

# Files that show the chosen layer and heads, or a survey's statistics.
FORMATS = ("png", "svg", "json")
DEFAULT_MODEL = "smollm2"
DEFAULT_OUT = "attnkit-out"

LEVEL_HELP = (
    "attention between tokens, or between the words of the text (whitespace and punctuation units; "
    "a word attends to another with the sum over the other's tokens, averaged over its own tokens) "
    "(default: token)"
)

MODEL_HELP = (
    "a fetched model, a local folder with config.json and safetensors, or a Hugging Face name ORG/NAME "
    "(from the Hugging Face cache, downloaded when online); a fetched name wins over a folder, a folder over "
    "a Hugging Face name"
)


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    """``--model NAME|PATH|ORG/NAME``, ``--revision``, ``--dtype`` and ``--device``."""
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, metavar="NAME|PATH|ORG/NAME", help=f"{MODEL_HELP} (default: {DEFAULT_MODEL})"
    )
    add_model_source_arguments(parser)
    add_device_argument(parser)


def add_model_source_arguments(parser: argparse.ArgumentParser) -> None:
    """``--revision REV`` (of a Hugging Face name) and ``--dtype``."""
    parser.add_argument(
        "--revision",
        default=None,
        metavar="REV",
        help="the branch, tag or commit of a Hugging Face --model (default: main)",
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", *DTYPE_NAMES),
        help="the weights' dtype: auto is float32 on the CPU and the checkpoint's own on a GPU; maps and "
        "statistics are float32 whatever it is (default: auto)",
    )


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    """``--device cpu|cuda|cuda:N|mps``."""
    parser.add_argument(
        "--device",
        default="cpu",
        metavar="DEVICE",
        help='where the model runs: a torch device such as "cpu", "cuda", "cuda:1" (default: cpu)',
    )


def add_quiet_argument(parser: argparse.ArgumentParser) -> None:
    """``--quiet``: no status lines on stderr."""
    parser.add_argument("-q", "--quiet", action="store_true", help="no status or progress lines on stderr")


def check_model_name(name: str) -> None:
    """Fail fast, before anything loads, on a ``--model`` that is neither a known name nor
    an existing path, suggesting the closest known name.

    Raises:
        CommandError: an unknown name.
    """
    from attnkit.models.checkpoints.hub import is_hub_name

    if name in MODELS or Path(name).expanduser().exists() or is_hub_name(name):
        return
    close = difflib.get_close_matches(name.lower(), MODELS, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise CommandError(
        f"--model {name!r} is neither a known model ({', '.join(MODELS)}), a folder, nor a Hugging Face "
        f"name ORG/NAME{hint}"
    )


def model_names_in(argv: Sequence[str]) -> list[str]:
    """The values of every ``--model NAME`` / ``--model=NAME`` in a command line."""
    names = []
    for i, arg in enumerate(argv):
        if arg == "--model" and i + 1 < len(argv):
            names.append(argv[i + 1])
        elif arg.startswith("--model="):
            names.append(arg.split("=", 1)[1])
    return names


class Status:
    """Status lines on stderr (``attnkit: loading smollm2 …``), or nothing when quiet.

    Attributes:
        quiet: print nothing.
    """

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet

    def say(self, message: str) -> None:
        """One status line."""
        if not self.quiet:
            print(f"attnkit: {message}", file=sys.stderr, flush=True)

    @contextmanager
    def step(self, message: str) -> Iterator[None]:
        """Say ``message …`` before a step and how long it took after it."""
        self.say(f"{message} …")
        start = time.perf_counter()
        yield
        self.say(f"  done in {time.perf_counter() - start:.1f} s")


def parse_size(text: str) -> int | None:
    """A size such as ``20MB``, ``1.5GB``, ``500kB`` or ``1000000`` in bytes (decimal units);
    ``none`` for no limit.

    Raises:
        CommandError: anything else.
    """
    if text.strip().lower() == "none":
        return None
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?[bB]?)\s*", text)
    if not match or match.group(2).upper() not in _SIZE_UNITS:
        raise CommandError(f'--max-size takes a size such as 20MB, 500kB, 2GB or "none", got {text!r}')
    size = float(match.group(1)) * _SIZE_UNITS[match.group(2).upper()]
    if not size <= MAX_SIZE_LIMIT:
        raise CommandError(f'--max-size must be at most 1 PB (or "none" for no limit), got {text[:40]!r}')
    return int(size)


def format_size(size: float) -> str:
    """Bytes as ``812 kB``, ``3.4 MB``, ``1.2 GB``."""
    for unit, factor in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if size >= factor:
            return f"{size / factor:.1f} {unit}"
    return f"{int(size)} B"


def check_sizes(estimates: dict[str, int], limit: int | None, *, advice: str) -> None:
    """Refuse to write files whose estimated size is over ``limit`` bytes.

    Args:
        estimates: each file to write (as the message names it) and its estimated size in bytes.
        limit: the largest size allowed, ``None`` for no limit.
        advice: what to ask for instead, said after the estimates.

    Raises:
        CommandError: some estimate is over the limit; the message lists those files.
    """
    if limit is None:
        return
    over = {path: size for path, size in estimates.items() if size > limit}
    if over:
        files = "; ".join(f"{path} would be about {format_size(size)}" for path, size in over.items())
        raise CommandError(
            f"{files}, over the {format_size(limit)} limit per file, so nothing was written. {advice}, "
            "or raise the limit with --max-size (e.g. --max-size 2GB, or --max-size none)"
        )


def add_size_argument(parser: argparse.ArgumentParser) -> None:
    """``--max-size SIZE``."""
    parser.add_argument(
        "--max-size",
        default=DEFAULT_MAX_SIZE,
        metavar="SIZE",
        help="refuse to write a file estimated larger than this, before computing it "
        f'(e.g. 500kB, 2GB, or "none"; default: {DEFAULT_MAX_SIZE})',
    )


def add_figure_arguments(parser: argparse.ArgumentParser, *, scale: bool = True) -> None:
    """``--dpi``, ``--figsize``, ``--cmap`` and (for attention maps) ``--scale`` for PNG and
    SVG pictures."""
    figures = parser.add_argument_group("pictures (png, svg)")
    figures.add_argument(
        "--dpi",
        type=_dpi,
        default=None,
        metavar="N",
        help="dots per inch of PNG files (default: 120 for maps, 100 for head grids)",
    )
    figures.add_argument(
        "--figsize",
        type=_figsize,
        default=None,
        metavar="W,H",
        help="figure size in inches, e.g. 8,6 (default: from the number of tokens)",
    )
    figures.add_argument(
        "--cmap",
        default=None,
        metavar="NAME",
        help="a matplotlib colour map, e.g. Blues, viridis, magma (default: Blues for weights, "
        "RdBu centred on zero for signed values: ablation, patching, gradients)",
    )
    if scale:
        figures.add_argument(
            "--scale",
            choices=SCALES,
            default=None,
            help="colour scale of the weights (default: linear up to 24 tokens, sqrt above)",
        )


def figure_options(args: argparse.Namespace) -> dict[str, Any]:
    """The figure arguments as keyword arguments of :mod:`attnkit.viz` drawing functions,
    without those left at their defaults."""
    options: dict[str, Any] = {} if args.cmap is None else {"cmap": args.cmap}
    if args.dpi is not None:
        options["dpi"] = args.dpi
    if args.figsize is not None:
        options["figsize"] = args.figsize
    if getattr(args, "scale", None) is not None:
        options["scale"] = args.scale
    return options


# Bounds of --dpi and --figsize, checked when the arguments are read; the canvas they make
# together is estimated with the other outputs (--max-size).
MAX_DPI = 10_000.0
MAX_FIGSIZE_INCHES = 1_000.0


def _dpi(text: str) -> float:
    try:
        dpi = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of dots per inch such as 150, got {text!r}") from None
    if not (math.isfinite(dpi) and 0 < dpi <= MAX_DPI):
        raise argparse.ArgumentTypeError(f"must be a number above 0 and at most {MAX_DPI:g}, got {text!r}")
    return dpi


def _figsize(text: str) -> tuple[float, float]:
    try:
        width, height = (float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected W,H in inches such as 8,6, got {text!r}") from None
    if not all(math.isfinite(x) and 0 < x <= MAX_FIGSIZE_INCHES for x in (width, height)):
        raise argparse.ArgumentTypeError(
            f"width and height must be numbers above 0 and at most {MAX_FIGSIZE_INCHES:g} inches, got {text!r}"
        )
    return width, height


def add_level_argument(parser: argparse.ArgumentParser, *, help: str = LEVEL_HELP) -> None:
    """``--level token|word``."""
    parser.add_argument("--level", choices=LEVELS, default="token", help=help)


def add_output_arguments(
    parser: argparse.ArgumentParser, *, default_formats: str, formats: tuple[str, ...] = FORMATS
) -> None:
    """``--out DIR`` and ``--format FMT[,FMT]``."""
    parser.add_argument(
        "--out", default=DEFAULT_OUT, metavar="DIR", help=f"where to write files (default: {DEFAULT_OUT}/)"
    )
    parser.add_argument(
        "--format",
        default=default_formats,
        metavar="FMT[,FMT]",
        help=f"files to write, any of {','.join(formats)} (default: {default_formats})",
    )


def prepare_out(out: str) -> Path:
    """The ``--out`` folder, created and checked to be writable before any work is done.

    Raises:
        CommandError: it cannot be created or written to.
    """
    path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        raise CommandError(f"cannot write to --out {out}: {err.strerror or err}") from None
    return path


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


class _StartUp:
    """Whether the command paused the garbage collector for its start-up."""

    collection_paused = False


def pause_collection() -> None:
    """Pause the garbage collector for a command's start-up, until :func:`resume_collection`.

    Importing PyTorch and building and loading a model create millions of objects and no
    garbage worth collecting; the collector's full passes over them took about a second of
    ``attnkit inspect`` (more than its drawing).
    """
    if gc.isenabled():
        gc.disable()
        _StartUp.collection_paused = True


def resume_collection() -> None:
    """End a start-up that :func:`pause_collection` began: every object alive now is frozen
    (it lives as long as the command, and later passes of the collector skip it) and
    collection resumes. Nothing happens if the collector was not paused."""
    if _StartUp.collection_paused:
        gc.freeze()
        gc.enable()
        _StartUp.collection_paused = False


def load_model(
    name: str,
    device: str = "cpu",
    *,
    revision: str | None = None,
    dtype: str = "auto",
    status: Status | None = None,
) -> Any:
    """``attnkit.models.load(name, revision=revision, dtype=dtype, device=device)`` with its
    errors as command errors.

    Args:
        name: a known model's name, a folder, or a Hugging Face name.
        device: a torch device name.
        revision: the revision of a Hugging Face name.
        dtype: ``auto``, ``float32``, ``bfloat16`` or ``float16``.
        status: where to say what is loading (default: nowhere).

    Raises:
        CommandError: the model is unknown, not fetched (the message says how to fetch
            it), corrupt, its dependencies are missing, or an unavailable device.
    """
    shown = f"{name}@{revision}" if revision else name
    with (status or Status(quiet=True)).step(f"loading {shown} on {device}"):
        try:
            import torch

            from attnkit import models

            try:
                target = torch.device(device)
            except RuntimeError:
                raise ValueError(f'--device takes a torch device such as "cpu" or "cuda:0", got {device!r}') from None
            if target.type == "cuda" and not torch.cuda.is_available():
                raise ValueError(f"--device {device}: no CUDA device is available here (torch {torch.__version__})")
            model = models.load(name, revision=revision, dtype=dtype, device=target)
        except (OSError, ValueError, TypeError, ImportError, RuntimeError) as err:
            raise CommandError(str(err)) from None
    resume_collection()
    return model


def load_model_of(args: argparse.Namespace, status: Status | None = None) -> Any:
    """The model a command's ``--model``, ``--device``, ``--revision`` and ``--dtype`` name
    (:func:`load_model`): every command loads its model through here, so that none of
    those options is ignored.

    Raises:
        CommandError: as :func:`load_model`.
    """
    return load_model(args.model, args.device, revision=args.revision, dtype=args.dtype, status=status)


@contextmanager
def command_errors(cannot: str) -> Iterator[None]:
    """Run a command's work with its errors as command errors: a ``ValueError`` or
    ``ImportError`` says itself, an ``OSError`` says ``cannot`` and why.

    Args:
        cannot: what an ``OSError`` means here, e.g. ``"cannot write to --out DIR"``.

    Raises:
        CommandError: in place of those errors.
    """
    try:
        yield
    except (ValueError, ImportError) as err:
        raise CommandError(str(err)) from None
    except OSError as err:
        raise CommandError(f"{cannot}: {err.strerror or err}") from None


def print_written(paths: Sequence[Path], *, sizes: bool = False) -> None:
    """A blank line, then ``wrote PATH`` for each file a command wrote (with its size when
    ``sizes``)."""
    print()
    for path in paths:
        print(f"wrote {path} ({format_size(path.stat().st_size)})" if sizes else f"wrote {path}")
