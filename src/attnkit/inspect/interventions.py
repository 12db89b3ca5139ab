"""What each head does, by intervening on it: head ablation and activation patching.

Both replace one head's output ``z`` (before the output projection, the hook point
``self_attn.z`` of layer ``i``) at every position and measure the model's output:

- **ablation** (:func:`head_ablation`): ``z`` of head ``(layer, head)`` set to zero, or to
  its mean over reference texts; the effect is the change in the log-probability of a
  target token at the last position (causal models), or in the cosine between the sentence
  embedding and the unablated one (encoders: ``cos - 1``). Negative means the head helped.
- **patching** (:func:`activation_patching`): a clean and a corrupted text of the same
  token length; the clean ``z`` of one head is patched into the corrupted run. The effect
  is the fraction of the clean-vs-corrupted difference it restores: of the logit
  difference between a target and a wrong token (causal), or of the cosine to the clean
  sentence embedding (encoders). 1 means the head alone carries the difference.

Every head of a layer runs in one batch that branches off the unaltered run at that layer
(a hook on ``resid_pre`` appends one copy of the residual stream per head), and all the
layers' batches share one forward pass, so a whole grid costs about
``heads * (layers + 1) / 2`` passes of one text instead of ``heads * layers``.

Shape letters: ``L`` layers, ``h`` heads, ``s`` tokens, ``d`` head dim, ``e`` model dim.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from attnkit.inspect import targets
from attnkit.inspect.methods import layer_indices

if TYPE_CHECKING:
    from attnkit.models import Model

# The activations of one batched pass may take about this many bytes; a grid whose batch
# would need more runs its layers in several passes.
BATCH_MEMORY = 2**30


@dataclass(frozen=True)
class HeadEffects:
    """The effect of intervening on each head.

    Attributes:
        model: the model's name.
        kind: ``"ablation"`` or ``"patching"``.
        metric: what ``effects`` measure, in words.
        layers: the layers, in the order of the rows of ``effects``.
        effects: ``[len(layers), h]`` float32.
        texts: the text (``{"text": ...}``), or ``{"clean": ..., "corrupt": ...}``.
        tokens: the token strings of the text (of the clean text when patching).
        target: the target token (causal models), else ``None``.
        wrong: the wrong token of patching (causal models), else ``None``.
        replacement: ``"zero"`` or ``"mean"`` (ablation), ``"clean"`` (patching).
        baseline: the measure without intervention: the target's log-probability (causal
            ablation); for patching ``{"clean": ..., "corrupt": ...}`` of the logit
            difference or the cosine to the clean embedding.
    """

    model: str
    kind: str
    metric: str
    layers: list[int]
    effects: Tensor
    texts: dict[str, str]
    tokens: list[str]
    target: str | None
    wrong: str | None
    replacement: str
    baseline: float | dict[str, float]

    def to_dict(self, digits: int = 6) -> dict[str, Any]:
        """A JSON-ready dict; ``effects[row][head]`` for the layers of ``layers``, in order."""
        baseline = (
            {k: round(v, digits) for k, v in self.baseline.items()}
            if isinstance(self.baseline, dict)
            else round(self.baseline, digits)
        )
        return {
            "model": self.model,
            "kind": self.kind,
            "metric": self.metric,
            **self.texts,
            "tokens": self.tokens,
            "target": self.target,
            "wrong": self.wrong,
            "replacement": self.replacement,
            "baseline": baseline,
            "layers": self.layers,
            "effects": [[round(v, digits) for v in row] for row in self.effects.tolist()],
        }


def head_ablation(
    model: Model,
    text: str,
    *,
    target: str | None = None,
    mean_over: Sequence[str] | None = None,
    layers: Sequence[int] | None = None,
) -> HeadEffects:
    """Ablate every head of some layers, one at a time, and measure the change.

    Args:
        model: an :mod:`attnkit.models` model.
        text: the input.
        target: the token whose log-probability after ``text`` is measured (causal models:
            a single token, leading space included, ``" Paris"``); encoders take none.
        mean_over: replace each head's ``z`` by its mean over every position of these
            texts instead of zero (e.g. ``[text]`` itself, or a reference set).
        layers: layer indices (negative from the end); default all.

    Returns:
        :class:`HeadEffects` of kind ``"ablation"``.

    Raises:
        ValueError: the model refuses a text, a missing or unneeded target, a target that
            is not a single token (the message says how it tokenises), an empty
            ``mean_over``, a layer out of range.
    """
    layer_list = layer_indices(model, layers)
    target_id = _target_id(model, target)
    encoded = model.tokenize(text)
    if mean_over is not None:
        replacements = _mean_z(model, mean_over, layer_list)
    else:
        # Each layer's own head dim: some families choose it (num_heads · head_dim != hidden size).
        replacements = {
            i: torch.zeros(model.num_heads, 1, model.architecture.self_attention(model.module, i).head_dim)
            for i in layer_list
        }
    unaltered_logits: list[Tensor] = []  # [v], of the first (unaltered) row
    if model.causal:
        metric = f"change in log p({target!r}) at the last position"

        def measure(hidden: Tensor) -> Tensor:
            logits = targets.last_logits(model, hidden)  # [rows, v]
            if not unaltered_logits:
                unaltered_logits.append(logits[0])
            return torch.log_softmax(logits, dim=-1)[:, target_id]
    else:
        metric = "change in the cosine of the sentence embedding to the unablated one (cos - 1)"

        def measure(hidden: Tensor) -> Tensor:
            embeddings = targets.sentence_embedding(hidden)  # [rows, e]
            return targets.cosine_to(embeddings, embeddings[0]) - 1.0

    base, effects = _per_head_passes(model, encoded.ids, layer_list, replacements, measure)
    if model.causal:
        assert target is not None and target_id is not None  # a causal model's target is checked
        targets.warn_if_space_missing(model, target, target_id, unaltered_logits[0])
        effects = effects - base
    return HeadEffects(
        model=model.name,
        kind="ablation",
        metric=metric,
        layers=layer_list,
        effects=effects.float(),
        texts={"text": text},
        tokens=list(encoded.tokens),
        target=target,
        wrong=None,
        replacement="zero" if mean_over is None else "mean",
        baseline=float(base) if model.causal else 0.0,
    )


def activation_patching(
    model: Model,
    clean: str,
    corrupt: str,
    *,
    target: str | None = None,
    wrong: str | None = None,
    layers: Sequence[int] | None = None,
) -> HeadEffects:
    """Patch each head's clean ``z`` into the corrupted run, one head at a time, and
    measure the fraction of the clean-vs-corrupted difference restored.

    Args:
        model: an :mod:`attnkit.models` model.
        clean: the clean text.
        corrupt: the corrupted text, of the same number of tokens.
        target: the token the clean text should continue with (causal models).
        wrong: the token the corrupted text continues with instead (causal models).
        layers: layer indices (negative from the end); default all.

    Returns:
        :class:`HeadEffects` of kind ``"patching"``.

    Raises:
        ValueError: texts of different token lengths (the message shows both
            tokenisations), missing or unneeded target/wrong tokens, tokens that are not
            single tokens, equal texts, a layer out of range.
    """
    layer_list = layer_indices(model, layers)
    target_id, wrong_id = _target_and_wrong_ids(model, target, wrong)
    clean_enc, corrupt_enc = model.tokenize(clean), model.tokenize(corrupt)
    if clean_enc.ids.shape != corrupt_enc.ids.shape:
        raise ValueError(
            f"clean and corrupted texts must have the same number of tokens, got {clean_enc.ids.shape[1]} "
            f"({_spelled(clean_enc.tokens)}) and {corrupt_enc.ids.shape[1]} ({_spelled(corrupt_enc.tokens)})"
        )
    with torch.no_grad():
        clean_run = model.run_with_hooks(
            clean_enc.ids, cache=[model.hook_name("self_attn.z", i) for i in layer_list], logits=False
        )
    replacements = {i: clean_run.cache["self_attn.z", i][0] for i in layer_list}  # [h, s, d] each
    if model.causal:
        metric = f"fraction of the logit difference {target!r} - {wrong!r} restored"

        def measure(hidden: Tensor) -> Tensor:
            logits = targets.last_logits(model, hidden)  # [rows, v]
            return logits[:, target_id] - logits[:, wrong_id]
    else:
        metric = "fraction of the cosine to the clean sentence embedding restored"
        clean_embedding = targets.sentence_embedding(clean_run.hidden_states)[0]

        def measure(hidden: Tensor) -> Tensor:
            return targets.cosine_to(targets.sentence_embedding(hidden), clean_embedding)

    with torch.no_grad():
        clean_value = float(measure(clean_run.hidden_states))
        if model.causal:
            assert target is not None and target_id is not None  # a causal model's target is checked
            clean_logits = targets.last_logits(model, clean_run.hidden_states)[0]  # [v]
            targets.warn_if_space_missing(model, target, target_id, clean_logits)
    corrupt_value, patched = _per_head_passes(model, corrupt_enc.ids, layer_list, replacements, measure)
    gap = clean_value - float(corrupt_value)
    if abs(gap) < 1e-6:
        raise ValueError(
            f"the clean and corrupted texts give the same measure ({clean_value:.6g}); there is no difference to restore"
        )
    return HeadEffects(
        model=model.name,
        kind="patching",
        metric=metric,
        layers=layer_list,
        effects=((patched - corrupt_value) / gap).float(),
        texts={"clean": clean, "corrupt": corrupt},
        tokens=list(clean_enc.tokens),
        target=target,
        wrong=wrong,
        replacement="clean",
        baseline={"clean": clean_value, "corrupt": float(corrupt_value)},
    )


def _per_head_passes(
    model: Model,
    ids: Tensor,
    layers: list[int],
    replacements: dict[int, Tensor],
    measure: Callable[[Tensor], Tensor],
) -> tuple[Tensor, Tensor]:
    """Run ``ids`` once unaltered and once per head of ``layers`` with that head's ``z``
    replaced by ``replacements[layer][head]``; measure each run.

    Returns:
        ``(measure of the unaltered run, [len(layers), h] measures of the altered runs)``.
    """
    h = model.num_heads
    s = ids.shape[1]
    row_bytes = s * max(model.config.hidden_size, model.config.intermediate_size) * 4 * 4
    layers_per_pass = max(1, (BATCH_MEMORY // row_bytes - 1) // h)
    base, rows = None, []
    for start in range(0, len(layers), layers_per_pass):
        hooks: dict[str, Callable[[Tensor], Tensor]] = {}
        for layer in layers[start : start + layers_per_pass]:
            hooks[model.hook_name("resid_pre", layer)] = _branch(h)
            hooks[model.hook_name("self_attn.z", layer)] = _replace_head_per_row(replacements[layer])
        with torch.no_grad():
            values = measure(model.run_with_hooks(ids, hooks=hooks, logits=False).hidden_states)  # [1 + h * layers]
        base = values[0]
        rows.append(values[1:].view(-1, h))
    return base.cpu(), torch.cat(rows).cpu()


def _branch(h: int) -> Callable[[Tensor], Tensor]:
    """A ``resid_pre`` hook appending ``h`` copies of the unaltered run (row 0): ``[b, s, e]``
    → ``[b + h, s, e]``."""
    return lambda x: torch.cat([x, x[:1].expand(h, -1, -1)])


def _replace_head_per_row(replacement: Tensor) -> Callable[[Tensor], Tensor]:
    """A ``z`` hook that gives the ``j``-th of the last ``h`` rows head ``j``'s replacement
    (``replacement [h, s or 1, d]``)."""

    def hook(z: Tensor) -> Tensor:  # [b, h, s, d]
        h = z.shape[1]
        z = z.clone()
        heads = torch.arange(h, device=z.device)
        z[z.shape[0] - h + heads, heads] = replacement.to(z)  # [h, s, d]
        return z

    return hook


def _mean_z(model: Model, texts: Sequence[str], layers: list[int]) -> dict[int, Tensor]:
    """Each head's ``z`` averaged over every position of ``texts``: layer → ``[h, 1, d]``."""
    if not texts:
        raise ValueError("mean ablation needs at least one reference text")
    totals: dict[int, Tensor] = {}
    count = 0
    for text in texts:
        run = model.run(text, attention=False, cache=[model.hook_name("self_attn.z", i) for i in layers])
        for i in layers:
            z = run.cache[model.hook_name("self_attn.z", i)][0].double().sum(1, keepdim=True)  # [h, 1, d]
            totals[i] = z if i not in totals else totals[i] + z
        count += run.ids.shape[1]
    return {i: (total / count).float() for i, total in totals.items()}


def _target_id(model: Model, target: str | None) -> int | None:
    """The id of the ablation target: required by causal models, refused by encoders."""
    _refuse_tokens_for_encoders(model, target=target)
    if not model.causal:
        return None
    if target is None:
        raise ValueError(f"{model.name} is causal: give the target token whose log-probability to measure")
    return targets.single_token(model, target, what="target")


def _target_and_wrong_ids(model: Model, target: str | None, wrong: str | None) -> tuple[int | None, int | None]:
    """The ids of the patching target and wrong tokens: required by causal models, refused
    by encoders."""
    _refuse_tokens_for_encoders(model, target=target, wrong=wrong)
    if not model.causal:
        return None, None
    if target is None or wrong is None:
        raise ValueError(
            f"{model.name} is causal: give the target token (the clean text's continuation) and the wrong token "
            "(the corrupted text's); patching measures their logit difference"
        )
    return targets.single_token(model, target, what="target"), targets.single_token(model, wrong, what="wrong")


def _refuse_tokens_for_encoders(model: Model, **tokens: str | None) -> None:
    given = [name for name, value in tokens.items() if value is not None]
    if not model.causal and given:
        raise ValueError(
            f"{model.name} is a bidirectional encoder without next-token logits; it measures the sentence "
            f"embedding and takes no {' or '.join(given)} token"
        )


def _spelled(tokens: Sequence[str]) -> str:
    return " ".join(repr(t) for t in tokens)
