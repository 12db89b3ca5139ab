"""Head ablation and activation patching on encoder–decoders (T5, BART): every head of the
encoder's self-attention, the decoder's self-attention and its cross-attention set to zero
(:func:`encoder_decoder_head_ablation`), or given its output on a clean source in a run on a
corrupted one (:func:`encoder_decoder_activation_patching`), one head at a time, measured on the
decoder's logits.

The measure is the log-probability of the whole target (teacher-forced, the sum over its
tokens of ``log p(token)``). The effect of an ablated head is the change it makes,
negative where the head helped; that of a patched head, the fraction of the clean-vs-
corrupted difference it restores, ``(patched - corrupted) / (clean - corrupted)``. The three kinds of heads are the rows of one grid (``"encoder 0"``,
``"decoder 0 self"``, ``"decoder 0 cross"``, ...); each stack's head count is read from its
own attention modules, and the cells past a row's head count are NaN.

Shape letters: ``h`` heads, ``s`` tokens, ``d`` head dim, ``v`` vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from attnkit.models.model.kinds import SOURCE_AND_TARGET, require_kind

if TYPE_CHECKING:
    from attnkit.models import Model

# The attention modules of an encoder–decoder's layers, by row label suffix.
_KINDS = (("encoder", "self_attn", ""), ("decoder", "self_attn", " self"), ("decoder", "cross_attn", " cross"))


def encoder_decoder_head_ablation(
    model: Model, source: str, target: str, *, layers: Sequence[int] | None = None
) -> dict[str, Any]:
    """Zero each head's ``z`` (its output before the output projection) of an
    encoder–decoder, one head at a time, and measure the change in the target's
    log-probability.

    Args:
        model: an encoder–decoder :mod:`attnkit.models` model.
        source: the encoder's input text.
        target: the text the decoder reads and predicts (teacher-forced).
        layers: the layers of each stack to ablate (negative from the end of each stack);
            default all.

    Returns:
        The fields of an :class:`attnkit.inspect.interventions.InterventionEffects` (which
        :func:`attnkit.inspect.interventions.head_ablation` returns) of kind
        ``"ablation"``, by ``"head"``: rows the attention modules, columns heads;
        ``baseline`` the unablated ``log p(target)``.

    Raises:
        ValueError: a model that is not an encoder–decoder, texts it refuses, a layer out of
            range in a stack.
    """
    require_kind(model, SOURCE_AND_TARGET, what="encoder-decoder head ablation ablates the heads of three attentions")
    unablated = model.run_encoder_decoder(source, target, encoder_layers=False, decoder_layers=False)
    source_ids, target_ids = unablated.source_ids, unablated.target_ids  # [1, s_src], [1, s_tgt]
    base = _target_log_p(unablated.logits, target_ids)
    rows = _rows(model, layers)
    width = max(heads for _, _, heads in rows)
    effects = _per_head_effects(
        model, rows, source_ids, target_ids, lambda _name, head: _zero_head(head), lambda log_p: log_p - base
    )
    return dict(
        model_name=model.name,
        kind="ablation",
        metric="change in log p(target) of the decoder",
        by="head",
        component="z",
        layers=sorted({int(label.split()[1]) for label, _, _ in rows}),
        columns=[str(head) for head in range(width)],
        effects=effects.float(),
        texts={"text": source, "target": target},
        tokens=list(model.prepare_input(source)[1]),
        target=target,
        wrong=None,
        replacement="zero",
        baseline=base,
        rows=[label for label, _, _ in rows],
    )


def _chosen(layers: Sequence[int] | None, depth: int, stack: str) -> list[int]:
    """The layers of a stack of ``depth`` layers, from 0."""
    if layers is None:
        return list(range(depth))
    wrong = [layer for layer in layers if not -depth <= layer < depth]
    if wrong:
        raise ValueError(f"the {stack} has layers 0..{depth - 1} (or -{depth}..-1), got {wrong}")
    return sorted({layer % depth for layer in layers})


def _zero_head(head: int) -> Callable[[Tensor], Tensor]:
    """A ``z`` hook ``[b, h, s, d]`` that zeroes one head."""

    def hook(z: Tensor) -> Tensor:
        z = z.clone()
        z[:, head] = 0.0
        return z

    return hook


def _target_log_p(logits: Tensor, target_ids: Tensor) -> float:
    """``sum_i log p(target_i)`` of teacher-forced logits ``[1, s_tgt, v]``."""
    log_p = torch.log_softmax(logits[0].double(), dim=-1)  # [s_tgt, v]
    return float(log_p.gather(1, target_ids[0].to(log_p.device)[:, None]).sum())


def encoder_decoder_activation_patching(
    model: Model, clean: str, corrupt: str, target: str, *, layers: Sequence[int] | None = None
) -> dict[str, Any]:
    """Patch each head's ``z`` of the run on the clean source into the run on the corrupted
    one, one head at a time, and measure the fraction of the target's log-probability
    difference restored.

    Args:
        model: an encoder–decoder :mod:`attnkit.models` model.
        clean: the clean source text.
        corrupt: the corrupted source text, of the same number of tokens.
        target: the text the decoder reads and predicts after both (teacher-forced).
        layers: the layers of each stack (negative from the end of each stack); default all.

    Returns:
        The fields of an :class:`attnkit.inspect.interventions.InterventionEffects` (which
        :func:`attnkit.inspect.interventions.activation_patching` returns) of kind
        ``"patching"``, by ``"head"``: rows the attention modules, columns heads;
        ``baseline`` the clean and corrupted ``log p(target)``.

    Raises:
        ValueError: a model that is not an encoder–decoder, sources of different token
            lengths, sources the measure does not tell apart, a layer out of range.
    """
    require_kind(model, SOURCE_AND_TARGET, what="encoder-decoder activation patching patches a source's run")
    rows = _rows(model, layers)
    kept: dict[str, Tensor] = {}

    def keep(name: str) -> Callable[[Tensor], None]:
        return lambda z: kept.__setitem__(name, z.detach().clone())

    with model.hooks({name: keep(name) for _, name, _ in rows}):
        clean_run = model.run_encoder_decoder(clean, target, encoder_layers=False, decoder_layers=False)
    corrupt_run = model.run_encoder_decoder(corrupt, target, encoder_layers=False, decoder_layers=False)
    if clean_run.source_ids.shape != corrupt_run.source_ids.shape:
        raise ValueError(
            f"clean and corrupted sources must have the same number of tokens, got {clean_run.source_ids.shape[1]} "
            f"and {corrupt_run.source_ids.shape[1]}"
        )
    target_ids = clean_run.target_ids
    clean_value = _target_log_p(clean_run.logits, target_ids)
    corrupt_value = _target_log_p(corrupt_run.logits, target_ids)
    gap = clean_value - corrupt_value
    if abs(gap) < 1e-6:
        raise ValueError(f"the clean and corrupted sources give the same log p(target) ({clean_value:.6g})")
    width = max(heads for _, _, heads in rows)
    effects = _per_head_effects(
        model,
        rows,
        corrupt_run.source_ids,
        target_ids,
        lambda name, head: _head_from(head, kept[name]),
        lambda log_p: (log_p - corrupt_value) / gap,
    )
    return dict(
        model_name=model.name,
        kind="patching",
        metric="fraction of log p(target) of the decoder restored",
        by="head",
        component="z",
        layers=sorted({int(label.split()[1]) for label, _, _ in rows}),
        columns=[str(head) for head in range(width)],
        effects=effects.float(),
        texts={"clean": clean, "corrupt": corrupt, "target": target},
        tokens=list(model.prepare_input(clean)[1]),
        target=target,
        wrong=None,
        replacement="clean",
        baseline={"clean": clean_value, "corrupt": corrupt_value},
        rows=[label for label, _, _ in rows],
    )


def _per_head_effects(
    model: Model,
    rows: list[tuple[str, str, int]],
    source_ids: Tensor,
    target_ids: Tensor,
    hook_of: Callable[[str, int], Callable[[Tensor], Tensor]],
    effect_of: Callable[[float], float],
) -> Tensor:
    """``[rows, most heads]`` float64: for each head of each row's hook point, the target's
    teacher-forced log-probability with ``hook_of(point, head)`` on that point, mapped by
    ``effect_of``; NaN past a row's own head count (stacks may differ)."""
    width = max(heads for _, _, heads in rows)
    effects = torch.full((len(rows), width), float("nan"), dtype=torch.float64)
    for row, (_, name, heads) in enumerate(rows):
        for head in range(heads):
            with model.hooks({name: hook_of(name, head)}):
                run = model.run_encoder_decoder(source_ids, target_ids, encoder_layers=False, decoder_layers=False)
            effects[row, head] = effect_of(_target_log_p(run.logits, target_ids))
    return effects


def _rows(model: Model, layers: Sequence[int] | None) -> list[tuple[str, str, int]]:
    """``(label, z hook name, heads)`` of every attention module of the chosen layers: the
    encoder's self-attention, then the decoder's self- and cross-attention; each module's
    own head count."""
    rows = []
    for stack_name, attention, suffix in _KINDS:
        stack = getattr(model.module, stack_name).layers
        for layer in _chosen(layers, len(stack), stack_name):
            heads = getattr(stack[layer], attention).num_heads
            rows.append((f"{stack_name} {layer}{suffix}", f"{stack_name}.layers.{layer}.{attention}.z", heads))
    return rows


def _head_from(head: int, clean: Tensor) -> Callable[[Tensor], Tensor]:
    """A ``z`` hook ``[b, h, s, d]`` that takes one head from ``clean``."""

    def hook(z: Tensor) -> Tensor:
        z = z.clone()
        z[:, head] = clean[:, head].to(z)
        return z

    return hook
