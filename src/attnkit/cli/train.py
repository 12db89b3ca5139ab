"""``attnkit train``: train a small Transformer on a toy task and see what its attention
learned."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from attnkit.cli import CommandError
from attnkit.cli.launch import add_nproc_argument, check_nproc, check_world_size, launched_by_torchrun, relaunch
from attnkit.train.config import DEFAULT_THREADS, TASK_DEFAULTS, TASK_NAMES, TrainConfig

# Options that map one to one onto TrainConfig fields. Their argparse default is None so
# that, with --resume, only the options actually typed are compared with the checkpoint.
_DEFAULTS = TrainConfig(task="reverse")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train a small Transformer on a toy task (copy, reverse, sort, addition)",
        description=(
            "Train a small Transformer from scratch on a toy task generated on the fly, evaluate it on "
            "held-out examples (exact match of greedy decoding) and write DIR/metrics.json, DIR/checkpoint.pt "
            "and the attention heatmap of one held-out example. copy/reverse/sort use an encoder-decoder and "
            "draw its cross-attention; addition uses a decoder-only model and draws its self-attention. For "
            "copy and reverse, the fraction of each head's attention on the diagonal / anti-diagonal is reported. "
            "An encoder-decoder's DIR also gets config.json, model.safetensors and tokenizer.json: a model folder "
            "that attnkit inspect, heads and serve take as --model DIR."
        ),
    )
    parser.add_argument("--task", choices=list(TASK_NAMES), help="the toy task (required unless --resume)")
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory (created if needed)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run whose checkpoint is in DIR; options not given are taken from it",
    )
    _add_size_arguments(parser)
    _add_training_arguments(parser)
    parser.set_defaults(func=run_command)


def _add_size_arguments(parser: argparse.ArgumentParser) -> None:
    """The task's and the model's sizes."""
    data = parser.add_argument_group("task size")
    _option(data, "--length", int, "input length of copy/reverse/sort")
    _option(data, "--symbols", int, "distinct symbols of copy/reverse/sort")
    _option(data, "--digits", int, "digits per operand of addition")
    model = parser.add_argument_group("model")
    _option(model, "--layers", int, "encoder layers and as many decoder layers (decoder layers for addition)")
    _option(model, "--d-model", int, "model dim")
    _option(model, "--heads", int, "attention heads (must divide --d-model)")
    _option(model, "--ff", int, "feed-forward hidden dim")
    _option(model, "--dropout", float, "dropout rate")


def _add_training_arguments(parser: argparse.ArgumentParser) -> None:
    """The optimisation, its checkpoints and where it runs."""
    training = parser.add_argument_group("training")
    _option(training, "--steps", int, "optimizer steps")
    _option(training, "--batch-size", int, "examples per step")
    _option(training, "--lr", float, "peak learning rate (AdamW)")
    _option(training, "--warmup", int, "linear warm-up steps before the cosine decay")
    _option(training, "--weight-decay", float, "AdamW weight decay")
    _option(training, "--label-smoothing", float, "label smoothing of the loss")
    _option(training, "--clip", float, "gradient-norm clipping")
    _option(training, "--seed", int, "seed of the weights and of the training and held-out examples")
    _option(training, "--eval-size", int, "held-out examples in the final evaluation")
    _option(training, "--checkpoint-every", int, "steps between checkpoints")
    _option(training, "--device", str, 'torch device, e.g. "cpu", "cuda"')
    training.add_argument(
        "--stop-after",
        type=int,
        metavar="STEP",
        help="stop with a checkpoint after this step (continue later with --resume)",
    )
    training.add_argument(
        "--threads",
        type=int,
        default=DEFAULT_THREADS,
        help=f"CPU threads of torch (default: {DEFAULT_THREADS}; see docs/training.md for the measurements)",
    )
    training.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_nproc_argument(
        training,
        help="train data-parallel on N processes of this machine (launches torchrun; each "
        "takes its share of every batch, the loss curve stays that of one process); "
        "see docs/distributed.md for several machines",
    )


def _option(group: argparse._ArgumentGroup, flag: str, kind: type, text: str) -> None:
    field = flag[2:].replace("-", "_")
    default = f"{getattr(_DEFAULTS, field)}"
    for task, options in TASK_DEFAULTS.items():
        if field in options:
            default += f"; {options[field]} for {task}"
    group.add_argument(flag, type=kind, default=None, help=f"{text} (default: {default})")


def _given_options(args: argparse.Namespace) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    return {name: value for name, value in vars(args).items() if name in names and value is not None}


def run_command(args: argparse.Namespace) -> int:
    if args.threads < 1:
        raise CommandError(f"--threads must be >= 1, got {args.threads}")
    check_nproc(args)
    if launched_by_torchrun():
        return _train(args, distributed=True)
    if args.nproc is not None:
        return _launch(args)
    return _train(args, distributed=False)


def _config(args: argparse.Namespace) -> TrainConfig:
    from attnkit.train.loop import saved_config

    given = _given_options(args)
    if args.resume:
        return dataclasses.replace(saved_config(args.out), **given)
    if args.task is None:
        raise CommandError("--task is required (unless --resume continues a run)")
    return TrainConfig.for_task(**given)


def _launch(args: argparse.Namespace) -> int:
    """Start ``args.nproc`` copies of this command under torchrun on this machine."""
    try:
        config = _config(args)
        config.validate()
    except ValueError as err:
        raise CommandError(str(err)) from None
    if config.batch_size < args.nproc:
        raise CommandError(
            f"--batch-size ({config.batch_size}) must be >= --nproc ({args.nproc}): every process "
            "takes a share of each batch"
        )
    return relaunch(args, threads=args.threads)


def _train(args: argparse.Namespace, *, distributed: bool) -> int:
    try:
        config = _config(args)
        task = config.validate()
        if distributed:
            from attnkit import distributed as dist_train

            info = dist_train.init(device=None if config.device.startswith("cuda") else "cpu")
            check_world_size(args, info.world_size)
            talk = info.is_main
        else:
            talk = True
        kind = "decoder-only" if task.decoder_only else "encoder-decoder"
        layers = f"{config.layers}" if task.decoder_only else f"{config.layers}+{config.layers}"
        where = f"{info.world_size} processes ({info.backend})" if distributed else config.device
        if talk:
            print(
                f"{config.task}: {kind}, {layers} layers, d_model {config.d_model}, {config.heads} heads, ff "
                f"{config.ff}; {config.steps} steps of {config.batch_size} on {where} "
                f"({args.threads} thread{'s' if args.threads > 1 else ''}{' each' if distributed else ''})"
            )
        if distributed:
            result = dist_train.train(
                config,
                args.out,
                info,
                resume=args.resume,
                stop_after=args.stop_after,
                progress=not args.no_progress,
                threads=args.threads,
            )
            dist_train.leave()
        else:
            from attnkit.train.loop import run

            result = run(
                config,
                args.out,
                resume=args.resume,
                stop_after=args.stop_after,
                progress=not args.no_progress,
                threads=args.threads,
            )
    except (ValueError, ImportError, OSError) as err:
        raise CommandError(str(err)) from None
    if not talk:
        return 0
    if not result.finished:
        print(f"stopped after step {result.step} of {config.steps}; checkpoint: {result.files[0]}")
        print(f"continue with: attnkit train --out {args.out} --resume")
        return 0
    assert result.metrics is not None  # a finished run has them
    _print_summary(result.metrics)
    for path in result.files:
        print(f"wrote {path}")
    return 0


def _print_summary(metrics: dict[str, Any]) -> None:
    held_out = metrics["held_out"]
    train = metrics["train"]
    print(f"parameters: {metrics['model']['parameters']:,}")
    print(
        f"training loss: {train['first_loss']:.4f} → {train['final_loss']:.4f} in {metrics['steps']} steps, "
        f"{metrics['time']['train_seconds']:.1f} s"
    )
    if metrics["diverged"]:
        print("the training loss stopped being finite (diverged): lower --lr; nothing was evaluated")
        return
    print(
        f"held-out exact match: {held_out['exact_match']:.2%} of {held_out['examples']} "
        f"(token accuracy {held_out['token_accuracy']:.2%})"
    )
    example = metrics["example"]
    print(f"example: {' '.join(example['input'])}  →  {' '.join(example['prediction'])}")
    alignment = metrics.get("alignment")
    if alignment:
        print(f"{alignment['pattern']} alignment (fraction of query positions whose most-attended input lies on it):")
        for layer, fractions in enumerate(alignment["fractions"]):
            heads = "  ".join(f"head {h}: {f:.2f}" for h, f in enumerate(fractions))
            print(f"  layer {layer}: {heads}")
        best = alignment["best"]
        print(f"best head: layer {best['layer']}, head {best['head']} ({best['fraction']:.2%})")
