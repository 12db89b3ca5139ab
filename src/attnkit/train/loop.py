"""Training a small Transformer on a toy task: the loop, checkpoints and resuming; at the
end, the evaluation on held-out examples (:mod:`attnkit.train.evaluation`) and the report
(:mod:`attnkit.train.report`). The configuration is :mod:`attnkit.train.config`.

Shape letters: ``b`` batch, ``s_out`` target length, ``v`` vocabulary size, ``L`` layers,
``h`` heads.

The loop is AdamW with a linear warm-up followed by a cosine decay to zero, optional label
smoothing, and gradient clipping. Everything random comes from the seed: the weights from
``torch.manual_seed(seed)``, the training examples from their own generator, the held-out
examples from another. A checkpoint stores every piece of state that the next step
depends on (weights, optimizer moments, schedule, both RNG states, the loss history), so a
run that is stopped and resumed computes exactly the same numbers as one that is not.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.train.checkpoint import (
    CHECKPOINT_NAME,
    load_checkpoint,
    remove_stale_temporaries,
    save_checkpoint,
)
from attnkit.train.config import DEFAULT_THREADS, MAX_STEPS, TASK_DEFAULTS, TrainConfig
from attnkit.train.devices import resolve_device
from attnkit.train.evaluation import (
    Evaluation,
    Model,
    alignment_fractions,
    alignment_report,
    evaluate,
    held_out_generator,
    inspect_attention,
)
from attnkit.train.export import write_model_folder
from attnkit.train.folder_lock import folder_lock
from attnkit.train.model import EncoderDecoderTransformer, build_model
from attnkit.train.report import METRICS_NAME, draw_example, metrics_json, run_metrics
from attnkit.train.state_checks import check_model, check_state
from attnkit.train.tasks import Task
from attnkit.viz.files import write_text_atomic

# Names of the pieces this module was split into, kept importable from here.
__all__ = [
    "DEFAULT_THREADS",
    "MAX_STEPS",
    "METRICS_NAME",
    "TASK_DEFAULTS",
    "Evaluation",
    "Replicas",
    "RunResult",
    "TrainConfig",
    "alignment_fractions",
    "alignment_report",
    "check_resumable",
    "evaluate",
    "held_out_generator",
    "lr_factor",
    "prepare_output_dir",
    "resolve_device",
    "run",
    "saved_config",
]

CHECKPOINT_FORMAT = 1
# The loss curve in metrics.json has about this many points, each a mean over its steps.
LOSS_CURVE_POINTS = 100


@dataclass(frozen=True)
class RunResult:
    """What :func:`run` did.

    Attributes:
        config: the run's config.
        step: the optimizer steps done so far.
        finished: all ``config.steps`` are done and the run was evaluated.
        metrics: the content of ``metrics.json`` when finished, else ``None``.
        files: the files written, checkpoint first.
    """

    config: TrainConfig
    step: int
    finished: bool
    metrics: dict[str, Any] | None
    files: list[Path]


def _identity(model: torch.nn.Module) -> torch.nn.Module:
    return model


def _nothing(*_: Any) -> None:
    return None


@dataclass(frozen=True)
class Replicas:
    """The data-parallel copies of one run, one per process (default: a single process).

    Every replica draws the same global batch of ``config.batch_size`` examples from the
    same generator and computes on its own rows of it (:meth:`rows`); ``wrap`` (e.g.
    ``DistributedDataParallel``) makes backward average the gradients over the replicas, so
    each replica takes the optimizer step of the whole batch and the run (loss curve and
    checkpoints) does not depend on the number of replicas. Replica 0 writes the files.
    ``attnkit.distributed.ddp_replicas`` builds one over ``torch.distributed``.

    Attributes:
        rank: this replica's index; ``world_size``: how many there are.
        wrap: wraps the model for the forward and backward passes.
        all_reduce_sum: sums a tensor over the replicas, in place.
        barrier: returns once every replica has called it.
    """

    rank: int = 0
    world_size: int = 1
    wrap: Callable[[torch.nn.Module], torch.nn.Module] = _identity
    all_reduce_sum: Callable[[Tensor], None] = _nothing
    barrier: Callable[[], None] = _nothing

    def rows(self, batch_size: int) -> slice:
        """This replica's rows of a global batch: the first ``batch_size % world_size``
        replicas take one row more."""
        base, extra = divmod(batch_size, self.world_size)
        start = self.rank * base + min(self.rank, extra)
        return slice(start, start + base + (1 if self.rank < extra else 0))

    @property
    def writes_files(self) -> bool:
        """Whether this replica writes checkpoints, metrics and pictures (replica 0)."""
        return self.rank == 0


def lr_factor(step: int, *, warmup: int, steps: int) -> float:
    """The learning rate of step ``step`` (0-based) as a fraction of the peak: linear
    warm-up over ``warmup`` steps, then a cosine decay that reaches 0 after ``steps``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def prepare_output_dir(path: str | Path) -> Path:
    """Create ``path`` if needed and check that files can be written into it.

    Raises:
        ValueError: it cannot be created or written to.
    """
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        raise ValueError(f"cannot write to output directory {path}: {err.strerror or err}") from None
    return path


def saved_config(out_dir: str | Path) -> TrainConfig:
    """The config of the run whose checkpoint is in ``out_dir``.

    Raises:
        ValueError: no checkpoint there, or not one of ours.
    """
    return TrainConfig.from_dict(_load_run_checkpoint(Path(out_dir))["config"])


def _load_run_checkpoint(out_dir: Path) -> dict[str, Any]:
    path = out_dir / CHECKPOINT_NAME
    try:
        state = load_checkpoint(path)
    except FileNotFoundError:
        raise ValueError(f"nothing to resume: no {CHECKPOINT_NAME} in {out_dir}") from None
    if state.get("format") != CHECKPOINT_FORMAT or not isinstance(state.get("config"), dict):
        raise ValueError(f"{path} is not an attnkit training checkpoint (format {CHECKPOINT_FORMAT})")
    try:
        config = TrainConfig.from_dict(state["config"])
        config.validate()
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    expected: dict[str, type | tuple[type, ...]] = {
        "step": int,
        "model": dict,
        "optimizer": dict,
        "scheduler": dict,
        "rng": dict,
        "losses": Tensor,
        "accuracies": Tensor,
        "seconds": (int, float),
    }
    for key, kind in expected.items():
        if isinstance(state.get(key), bool) or not isinstance(state.get(key), kind):
            raise ValueError(f"{path} is not a usable checkpoint: field {key!r} is missing or of the wrong type")
    step = state["step"]
    if not 0 <= step <= config.steps:
        raise ValueError(f"{path} is not a usable checkpoint: step {step} is outside 0..{config.steps}")
    for key in ("losses", "accuracies"):
        if state[key].shape != (step,) or not state[key].is_floating_point():
            raise ValueError(
                f"{path} is not a usable checkpoint: {key} must be {step} floats, got "
                f"{state[key].dtype} {list(state[key].shape)}"
            )
    rng = state["rng"]
    if not all(isinstance(rng.get(k), Tensor) and rng[k].dtype == torch.uint8 for k in ("torch", "data")):
        raise ValueError(f"{path} is not a usable checkpoint: field 'rng' must hold the generator states")
    return state


def check_resumable(saved: TrainConfig, asked: TrainConfig) -> None:
    """A run can resume from a checkpoint only with the same training config.

    Raises:
        ValueError: the configs differ in a field outside
            :attr:`TrainConfig.RESUMABLE_CHANGES`; the message lists each difference.
    """
    differences = [
        f"{f.name}: checkpoint {getattr(saved, f.name)!r}, asked {getattr(asked, f.name)!r}"
        for f in dataclasses.fields(TrainConfig)
        if f.name not in TrainConfig.RESUMABLE_CHANGES and getattr(saved, f.name) != getattr(asked, f.name)
    ]
    if differences:
        raise ValueError(
            "the checkpoint was trained with another config (" + "; ".join(differences) + "); resume with the "
            "checkpoint's options, or train into a new output directory"
        )


def build_for_config(config: TrainConfig, task: Task) -> Model:
    """The run's model, freshly initialised from ``torch.manual_seed(config.seed)``."""
    torch.manual_seed(config.seed)
    return build_model(
        task.vocab_size,
        decoder_only=task.decoder_only,
        d_model=config.d_model,
        heads=config.heads,
        layers=config.layers,
        ff=config.ff,
        dropout=config.dropout,
    )


def run(
    config: TrainConfig,
    out_dir: str | Path,
    *,
    resume: bool = False,
    stop_after: int | None = None,
    progress: bool = True,
    threads: int | None = DEFAULT_THREADS,
    replicas: Replicas | None = None,
) -> RunResult:
    """Train (or continue training), evaluate on held-out examples and write the results.

    Writes ``checkpoint.pt`` every ``config.checkpoint_every`` steps and at the end; when
    every step is done, also ``metrics.json``, an attention heatmap of one held-out
    example (``cross_attention.png``, or ``self_attention.png`` for decoder-only tasks) and,
    for the encoder–decoder tasks, the model folder that :func:`attnkit.models.load` reads
    (``config.json``, ``model.safetensors``, ``tokenizer.json``:
    :func:`attnkit.train.export.write_model_folder`).

    Args:
        config: the run.
        out_dir: where to write; created if needed.
        resume: continue from the checkpoint in ``out_dir``, which must have been written
            with the same config (up to :attr:`TrainConfig.RESUMABLE_CHANGES`).
        stop_after: stop (with a checkpoint) once this many steps are done, as if the run
            had been killed there; continue later with ``resume=True``.
        progress: show a tqdm progress bar.
        threads: CPU threads of torch during the run (restored afterwards), as
            ``attnkit train --threads``; ``None`` leaves torch's setting. One thread is the
            default: these small models run several times faster on one thread than on
            many (docs/training.md).
        replicas: train data-parallel over these processes (:class:`Replicas`); every
            replica calls ``run`` with the same arguments; only replica 0 writes files,
            shows progress and evaluates (the others return without metrics).

    Returns:
        A :class:`RunResult`.

    Raises:
        ValueError: invalid options, an output directory that cannot be written or that
            another run is writing into, a checkpoint already there without ``resume``, or
            none (or an incompatible, corrupt or crafted one) with it.
        OSError: the output directory stopped being writable during the run; the message
            says where training stopped and that the previous checkpoint is intact.
        ImportError: tqdm or matplotlib missing.
    """
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    threads_before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        with contextlib.ExitStack() as held:
            return _run(
                config, out_dir, resume=resume, stop_after=stop_after, progress=progress, replicas=replicas, held=held
            )
    finally:
        torch.set_num_threads(threads_before)


def _run(
    config: TrainConfig,
    out_dir: str | Path,
    *,
    resume: bool,
    stop_after: int | None,
    progress: bool,
    replicas: Replicas | None,
    held: contextlib.ExitStack,
) -> RunResult:
    """:func:`run`; what must stay held until it returns (the output folder's lock) goes
    on ``held``."""
    task = config.validate()
    device = resolve_device(config.device)
    replicas = Replicas() if replicas is None else replicas
    if stop_after is not None and stop_after < 1:
        raise ValueError(f"stop_after must be >= 1, got {stop_after}")
    if config.batch_size < replicas.world_size:
        raise ValueError(
            f"batch_size must be >= the number of processes, got {config.batch_size} for "
            f"{replicas.world_size} processes"
        )
    out = prepare_output_dir(out_dir)
    state = _open_output(out, config, resume=resume, replicas=replicas, held=held)
    replicas.barrier()  # every replica has read (or looked for) the checkpoint before one is written
    checkpoint_path = out / CHECKPOINT_NAME
    if state is not None:
        with torch.device("meta"):
            expected = build_for_config(config, task).state_dict()
        try:
            check_model(state["model"], expected)
        except ValueError as err:
            raise ValueError(f"{checkpoint_path} is not a usable checkpoint: {err}"[:500]) from None
    model = build_for_config(config, task).to(device)
    trainer = _Trainer(config, task, model, device, replicas)
    if state is not None:
        _restore(trainer, state, checkpoint_path)
    last = config.steps if stop_after is None else min(stop_after, config.steps)
    trainer.train_until(last, checkpoint_path, progress=progress and replicas.writes_files)
    if trainer.step < config.steps:
        return RunResult(config, trainer.step, False, None, [checkpoint_path])
    if not replicas.writes_files:
        return RunResult(config, trainer.step, True, None, [checkpoint_path])
    return _evaluate_and_report(config, task, trainer, out, device)


def _open_output(
    out: Path, config: TrainConfig, *, resume: bool, replicas: Replicas, held: contextlib.ExitStack
) -> dict[str, Any] | None:
    """Take the output folder (its lock on ``held``, for the replica that writes) and read
    the checkpoint to resume from.

    Returns:
        The checkpoint's state with ``resume``, else ``None``.

    Raises:
        ValueError: another run holds the folder; a checkpoint there without ``resume``, or
            none (or one of another configuration) with it.
    """
    if replicas.writes_files:
        held.enter_context(folder_lock(out))  # before looking for a checkpoint: one run at a time
        remove_stale_temporaries(out / CHECKPOINT_NAME)
    if resume:
        state = _load_run_checkpoint(out)
        check_resumable(TrainConfig.from_dict(state["config"]), config)
        return state
    if (out / CHECKPOINT_NAME).exists():
        raise ValueError(f"{out} already holds a {CHECKPOINT_NAME}; resume it, or train into a new output directory")
    return None


def _restore(trainer: _Trainer, state: dict[str, Any], checkpoint_path: Path) -> None:
    """Give ``trainer`` the optimizer, schedule, RNG and loss state of a checkpoint.

    Raises:
        ValueError: a state that does not fit this run's model and optimizer.
    """
    try:
        parameter_shapes = [p.shape for group in trainer.optimizer.param_groups for p in group["params"]]
        check_state(state, trainer.state(), parameter_shapes)
    except ValueError as err:
        raise ValueError(f"{checkpoint_path} is not a usable checkpoint: {err}"[:500]) from None
    try:
        trainer.load_state(state)
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as err:
        raise ValueError(f"{checkpoint_path} does not fit this run's model and optimizer: {err}"[:500]) from None


def _evaluate_and_report(
    config: TrainConfig, task: Task, trainer: _Trainer, out: Path, device: torch.device
) -> RunResult:
    """After the last step: evaluate, draw the example heatmap, write ``metrics.json`` and
    (encoder–decoders) the model folder.

    Raises:
        OSError: the heatmap, the metrics or the model folder cannot be written (the
            checkpoint is intact).
    """
    checkpoint_path = out / CHECKPOINT_NAME
    curve = trainer.loss_curve()
    if curve and not math.isfinite(curve[-1]["loss"]):
        # A model whose weights went to NaN has nothing to evaluate or draw: its next-token
        # logits are refused as not finite. metrics.json says that it diverged.
        return _report_divergence(config, task, trainer, out, device)
    eval_start = time.perf_counter()
    evaluation = evaluate(trainer.model, task, size=config.eval_size, seed=config.seed, device=device)
    maps, fractions = inspect_attention(trainer.model, task, evaluation, device)
    alignment = alignment_report(task, fractions)
    try:
        heatmap = draw_example(task, maps, evaluation, alignment, out)
    except OSError as err:
        raise OSError(
            f"cannot write the heatmap into {out}: {err.strerror or err}; the training itself is saved in "
            f"{checkpoint_path}"
        ) from err
    eval_seconds = time.perf_counter() - eval_start
    metrics = run_metrics(
        config,
        task,
        trainer.model,
        trainer.loss_curve(),
        trainer.step,
        trainer.seconds,
        evaluation,
        alignment,
        heatmap,
        eval_seconds,
        device,
    )
    metrics_path = out / METRICS_NAME
    try:
        write_text_atomic(metrics_path, metrics_json(metrics))
    except OSError as err:
        raise OSError(
            f"cannot write {metrics_path}: {err.strerror or err}; the training itself is saved in {checkpoint_path}"
        ) from err
    files = [checkpoint_path, metrics_path, heatmap]
    if isinstance(trainer.model, EncoderDecoderTransformer):
        try:
            files += write_model_folder(trainer.model, config, task, out)
        except OSError as err:
            raise OSError(
                f"cannot write the model folder into {out}: {err.strerror or err}; the training itself is saved in "
                f"{checkpoint_path}"
            ) from err
    return RunResult(config, trainer.step, True, metrics, files)


def _report_divergence(
    config: TrainConfig, task: Task, trainer: _Trainer, out: Path, device: torch.device
) -> RunResult:
    """Write ``metrics.json`` of a run whose loss stopped being finite, without an
    evaluation or a heatmap.

    Raises:
        OSError: the metrics cannot be written (the checkpoint is intact).
    """
    checkpoint_path = out / CHECKPOINT_NAME
    metrics = run_metrics(
        config, task, trainer.model, trainer.loss_curve(), trainer.step, trainer.seconds, None, None, None, 0.0, device
    )
    metrics_path = out / METRICS_NAME
    try:
        write_text_atomic(metrics_path, metrics_json(metrics))
    except OSError as err:
        raise OSError(
            f"cannot write {metrics_path}: {err.strerror or err}; the training itself is saved in {checkpoint_path}"
        ) from err
    return RunResult(config, trainer.step, True, metrics, [checkpoint_path, metrics_path])


class _Trainer:
    """The mutable state of a run: model, optimizer, schedule, RNGs and loss history."""

    def __init__(self, config: TrainConfig, task: Task, model: Model, device: torch.device, replicas: Replicas) -> None:
        self.config = config
        self.task = task
        self.model = model
        self.device = device
        self.replicas = replicas
        self.replica_model = replicas.wrap(model)  # forward and backward go through it
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=config.lr, betas=(0.9, 0.98), weight_decay=config.weight_decay
        )

        # A function, not a callable object: LambdaLR's state_dict would pickle an
        # object's attributes, and a checkpoint must hold plain data only.
        def factor(step: int) -> float:
            return lr_factor(step, warmup=config.warmup, steps=config.steps)

        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, factor)
        self.data = torch.Generator().manual_seed(config.seed)
        self.step = 0
        # Per-step records stay on the device: reading them every step would wait for
        # the GPU each time.
        self.losses = torch.zeros(config.steps, device=device)
        self.accuracies = torch.zeros(config.steps, device=device)
        self.seconds = 0.0

    def state(self) -> dict[str, Any]:
        """Everything the next step depends on, as plain data."""
        rng = {"torch": torch.get_rng_state(), "data": self.data.get_state()}
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        return {
            "format": CHECKPOINT_FORMAT,
            "config": self.config.to_dict(),
            "step": self.step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng,
            "losses": self.losses[: self.step].cpu(),
            "accuracies": self.accuracies[: self.step].cpu(),
            "seconds": self.seconds,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state` (read back from a checkpoint)."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.data.set_state(state["rng"]["data"])
        torch.set_rng_state(state["rng"]["torch"])
        if self.device.type == "cuda" and "cuda" in state["rng"]:
            torch.cuda.set_rng_state(state["rng"]["cuda"], self.device)
        self.step = int(state["step"])
        self.losses[: self.step] = state["losses"].to(self.device)
        self.accuracies[: self.step] = state["accuracies"].to(self.device)
        self.seconds = float(state["seconds"])

    def train_step(self) -> None:
        """One optimizer step on a fresh global batch; records its loss and token accuracy.

        Each replica computes on its rows of the batch; its loss is its rows' summed token
        losses over the batch's token count, times the replica count, so that the gradient
        that the replicas average is the whole batch's mean-loss gradient."""
        batch = self.task.sample(self.config.batch_size, self.data).to(self.device)
        rows = self.replicas.rows(self.config.batch_size)
        inputs, targets = batch.inputs[rows], batch.targets[rows]
        tokens = batch.targets.numel()
        logits = self.replica_model(inputs, targets)  # [b_replica, s_out, v]
        loss_sum = F.cross_entropy(
            logits.flatten(0, 1), targets.flatten(), label_smoothing=self.config.label_smoothing, reduction="sum"
        )
        self.optimizer.zero_grad(set_to_none=True)
        (loss_sum * (self.replicas.world_size / tokens)).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.clip)
        self.optimizer.step()
        self.scheduler.step()
        totals = torch.stack([loss_sum.detach(), (logits.detach().argmax(-1) == targets).sum().to(loss_sum.dtype)])
        self.replicas.all_reduce_sum(totals)
        self.losses[self.step] = totals[0] / tokens
        self.accuracies[self.step] = totals[1] / tokens
        self.step += 1

    def train_until(self, last: int, checkpoint_path: Path, *, progress: bool) -> None:
        """Train up to step ``last``, with checkpoints on the way and at the end."""
        if self.step >= last:
            return
        bar = _progress_bar(total=self.config.steps, initial=self.step, desc=self.task.name, disable=not progress)
        self.model.train()
        started = time.perf_counter()
        try:
            while self.step < last:
                self.train_step()
                if self.step % 10 == 0 or self.step == last:
                    recent = slice(max(0, self.step - 10), self.step)
                    bar.set_postfix(
                        loss=f"{self.losses[recent].mean().item():.4f}",
                        acc=f"{self.accuracies[recent].mean().item():.3f}",
                        refresh=False,
                    )
                bar.update(1)
                if (self.step % self.config.checkpoint_every == 0 or self.step == last) and self.replicas.writes_files:
                    self.seconds += time.perf_counter() - started
                    started = time.perf_counter()
                    try:
                        save_checkpoint(self.state(), checkpoint_path)
                    except OSError as err:
                        kept = (
                            f"the previous checkpoint in {checkpoint_path.parent} is intact; "
                            if checkpoint_path.exists()
                            else ""
                        )
                        raise OSError(
                            f"cannot write the checkpoint {checkpoint_path} at step {self.step}: "
                            f"{err.strerror or err}; {kept}training stopped"
                        ) from err
        finally:
            bar.close()
        self.replicas.barrier()  # the last checkpoint is on disk before any replica returns

    def loss_curve(self) -> list[dict[str, float]]:
        """Mean loss and token accuracy over consecutive spans of steps."""
        span = max(1, self.step // LOSS_CURVE_POINTS)
        losses, accuracies = self.losses[: self.step].cpu(), self.accuracies[: self.step].cpu()
        return [
            {
                "step": min(start + span, self.step),
                "loss": round(losses[start : start + span].mean().item(), 6),
                "token_accuracy": round(accuracies[start : start + span].mean().item(), 6),
            }
            for start in range(0, self.step, span)
        ]


def _progress_bar(**kwargs: Any):
    try:
        from tqdm.auto import tqdm
    except ImportError:
        raise ImportError("the training progress bar needs tqdm: pip install 'attnkit[train]'") from None
    return tqdm(unit="step", dynamic_ncols=True, **kwargs)
