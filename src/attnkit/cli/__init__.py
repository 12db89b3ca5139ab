"""The ``attnkit`` command: parses arguments and calls the library. Each subcommand lives in
its own module with ``add_parser(subparsers)`` that registers it and sets ``func``."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings
from typing import TextIO

from attnkit import __version__
from attnkit.cli.common import CommandError, pause_collection, resume_collection

__all__ = ["CommandError", "build_parser", "main"]

# Subcommand modules, in the order `attnkit --help` lists them.
COMMAND_MODULES = [
    "attnkit.cli.explain",
    "attnkit.cli.pe",
    "attnkit.cli.train",
    "attnkit.cli.inspect",
    "attnkit.cli.heads",
    "attnkit.cli.patch",
    "attnkit.cli.generate",
    "attnkit.cli.models",
    "attnkit.cli.serve",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnkit",
        description="Attention, computed, explained and inspected.",
    )
    parser.add_argument("--version", action="version", version=f"attnkit {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command that ``argv`` (default: the process's arguments) names.

    Returns:
        The exit status: 0, 2 for a command error, 130 when interrupted.
    """
    as_process = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    if "torch" not in sys.modules:
        # A command's work comes in short bursts on small inputs: PyTorch's worker threads
        # then wait for the next burst asleep instead of spinning, which on a machine busy
        # with other work took the processor from the thread doing the work (OpenMP reads
        # this when PyTorch loads; a value the user set is kept).
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # Warnings read as the command's own lines, without a source line (a missing font).
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        try:
            from attnkit.cli.common import check_model_name, model_names_in

            # Before the parser imports the subcommands (and PyTorch): a mistyped name fails at once.
            for name in model_names_in(argv):
                check_model_name(name)
            parser = build_parser()
            args = parser.parse_args(argv)
            args.argv = argv  # the command line as typed, for commands that relaunch themselves (--nproc)
            if not getattr(args, "func", None):
                parser.print_help()
                return 2
            if as_process and getattr(args, "model", None) is not None:
                # Until the model is loaded (cli.common.load_model resumes it); only in a
                # process of its own, whose objects no other program shares.
                pause_collection()
            return int(args.func(args) or 0)
        except CommandError as err:
            from attnkit.viz.terminal import terminal_safe

            print(f"attnkit: error: {terminal_safe(str(err))}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("attnkit: interrupted", file=sys.stderr)
            return 130
        except BrokenPipeError:
            return 0
        finally:
            resume_collection()


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    from attnkit.viz.terminal import terminal_safe

    print(f"attnkit: warning: {terminal_safe(str(message))}", file=file or sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
