"""What each head, layer and position does, by intervening on it: head ablation and
activation patching.

- **ablation** (:func:`head_ablation`): ``z`` of head ``(layer, head)`` (its output before
  the output projection, the hook point ``self_attn.z`` of layer ``i``) set to zero at
  every position, or to its mean over reference texts; the effect is the change in the
  log-probability of a target token at the last position (causal models), or in the cosine
  between the sentence embedding and the unablated one (encoders: ``cos - 1``). Negative
  means the head helped.
- **patching** (:func:`activation_patching`): a clean and a corrupted text of the same
  token length; one activation of the clean run is patched into the corrupted run, and the
  effect is the fraction of the clean-vs-corrupted difference of a metric it restores,
  ``(patched - corrupted) / (clean - corrupted)``: 0 is the corrupted run, 1 the clean one.
  What is patched is a component of :data:`COMPONENTS` (the residual stream into, inside or
  out of a layer, a block's output, or each head's ``z``, ``q``, ``k``, ``v`` or ``pattern``:
  :data:`PER_HEAD`), and where, ``by`` (:data:`BY`): one head's per-head component at every
  position (``"head"``, layers × heads; key/value heads for ``k`` and ``v``), the
  component of one layer at one position (``"layer-position"``, layers × positions), or
  the component at one position in every layer asked for at once (``"position"``, one row
  of positions), or one cell of the pattern, destination (query) by source (key), in the
  heads and layers asked for at once (``"dest-src"``, positions × positions), or one head's
  per-head component at one position (``"head-position"``, the heads of every layer ×
  positions). The metric (:data:`METRICS`) is the logit difference between a target
  and a wrong token at the last position, the target's log-probability, or any function
  of the output (causal models); the cosine to the clean sentence embedding (encoders).

Every variant of a layer (each head, or each position) runs in one batch that branches off
the unaltered run at that layer (a hook on ``resid_pre`` appends one copy of the residual
stream per variant), and all the layers' batches share one forward pass, so a whole grid
costs about ``variants * (layers + 1) / 2`` passes of one text instead of
``variants * layers``. A patch that would write the value already there (the positions
before the first differing token of a causal model: the two runs are equal there) is not
run: its effect is 0.

Shape letters: ``L`` layers, ``h`` heads, ``s`` tokens, ``d`` head dim, ``e`` model dim,
``v`` vocabulary, ``b`` rows of a batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from attnkit.deprecation import deprecated_aliases
from attnkit.functional.finite import check_finite
from attnkit.inspect import targets
from attnkit.inspect.maps import token_labels
from attnkit.inspect.metrics import Metric, MetricInput
from attnkit.inspect.names import BY as BY
from attnkit.inspect.names import COMPONENTS as COMPONENTS
from attnkit.inspect.names import METRICS as METRICS
from attnkit.inspect.names import PER_HEAD as PER_HEAD
from attnkit.models.model.kinds import ONE_TEXT, SOURCE_AND_TARGET, for_kind

if TYPE_CHECKING:
    from attnkit.models import Model

# The activations of one batched pass may take about this many bytes; a grid whose batch
# would need more runs its layers in several passes.
BATCH_MEMORY = 2**30

# A metric given as a function: of next-token logits at the last position ``[b, v]``
# (causal models) or of the last hidden states ``[b, s, e]`` (encoders), one number per row.
MetricFunction = Callable[[Tensor], Tensor]

_HOOK_POINTS = {name: f"self_attn.{name}" for name in PER_HEAD}


@deprecated_aliases(model="model_name", removed_in="0.3")
@dataclass(frozen=True)
class InterventionEffects:
    """The effect of intervening on each head, or on each layer and position.

    Attributes:
        model_name: the model's name.
        kind: ``"ablation"`` or ``"patching"``.
        metric: what ``effects`` measure, in words.
        by: where each intervention acts (:data:`BY`): ``"head"`` (rows are layers, columns
            heads), ``"layer-position"`` (rows layers, columns positions) or ``"position"``
            (one row, the layers of ``layers`` patched together; columns positions) or
            ``"dest-src"`` (rows destination positions, columns source positions: one
            cell of the pattern patched in ``heads`` of every layer of ``layers``) or
            ``"head-position"`` (rows the heads of every layer, :attr:`rows` ``"L3H2"``;
            columns positions).
        component: what was replaced (:data:`COMPONENTS`): ``"z"`` for heads.
        layers: the layers, in the order of the rows of ``effects`` (with ``by="position"``,
            the layers of its one row).
        columns: the label of each column: the head's number, or the token of the clean
            text (or of the text) as it reads.
        effects: ``[rows, columns]`` float32.
        texts: the text (``{"text": ...}``), or ``{"clean": ..., "corrupt": ...}``.
        tokens: the token strings of the text (of the clean text when patching).
        target: the target token (causal models, when the metric has one), else ``None``.
        wrong: the wrong token of a logit difference, else ``None``.
        replacement: ``"zero"`` or ``"mean"`` (ablation), ``"clean"`` (patching).
        baseline: the measure without intervention: the target's log-probability (causal
            ablation); for patching ``{"clean": ..., "corrupt": ...}`` of the metric.
        heads: the heads patched together (``by="dest-src"``), else ``None``.
        rows: the label of each row where rows are not layers of one stack (an
            encoder–decoder's ``"encoder 0"``, ``"decoder 0 self"``, ``"decoder 0 cross"``,
            or by ``"head-position"`` each layer's heads ``"L3H2"``), else ``None``.
    """

    model_name: str
    kind: str
    metric: str
    by: str
    component: str
    layers: list[int]
    columns: list[str]
    effects: Tensor
    texts: dict[str, str]
    tokens: list[str]
    target: str | None
    wrong: str | None
    replacement: str
    baseline: float | dict[str, float]
    heads: list[int] | None = None
    rows: list[str] | None = None

    @property
    def row_labels(self) -> list[str]:
        """The label of each row: its layer, or for ``by="position"`` the layers patched
        together (``"0-29"``, ``"3,7"``), for ``by="dest-src"`` the destination tokens, or
        :attr:`rows` where given."""
        if self.rows is not None:
            return list(self.rows)
        if self.by == "dest-src":
            return list(self.columns)
        if self.by == "position":
            return [layer_span(self.layers)]
        return [str(layer) for layer in self.layers]

    @property
    def axes(self) -> tuple[str, str]:
        """What the rows and the columns of :attr:`effects` are: ``("layer", "head")``,
        ``("layer", "position")``, ``("layers", "position")`` (by position: the layers
        patched together), ``("destination", "source")`` (positions) or, where rows are
        attention modules, ``("attention", "head")``; by ``"head-position"``, ``("head",
        "position")`` (rows ``"L3H2"``: layer 3's head 2)."""
        if self.by == "head-position":
            return ("head", "position")
        if self.rows is not None:
            return ("attention", "head")
        return {
            "head": ("layer", "head"),
            "layer-position": ("layer", "position"),
            "position": ("layers", "position"),
            "dest-src": ("destination", "source"),
        }[self.by]

    def to_dict(self, digits: int = 6) -> dict[str, Any]:
        """A JSON-ready dict; ``effects[row][column]``: rows are the layers of ``layers``
        in order (one row for ``by="position"``), columns those of ``columns``."""
        baseline = (
            {k: round(v, digits) for k, v in self.baseline.items()}
            if isinstance(self.baseline, dict)
            else round(self.baseline, digits)
        )
        return {
            "model": self.model_name,
            "kind": self.kind,
            "metric": self.metric,
            "by": self.by,
            "component": self.component,
            **({"heads": self.heads} if self.heads is not None else {}),
            **({"rows": self.rows} if self.rows is not None else {}),
            **self.texts,
            "tokens": self.tokens,
            "target": self.target,
            "wrong": self.wrong,
            "replacement": self.replacement,
            "baseline": baseline,
            "layers": self.layers,
            "axes": list(self.axes),
            "columns": self.columns,
            "effects": [[round(v, digits) for v in row] for row in self.effects.tolist()],
        }


def layer_span(layers: Sequence[int]) -> str:
    """Layers as a short label: ``"0-29"`` when consecutive, else ``"3,7,9"``."""
    if len(layers) > 1 and list(layers) == list(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}-{layers[-1]}"
    return ",".join(map(str, layers))


@dataclass(frozen=True)
class _Branch:
    """Rows that branch off the unaltered run at the ``resid_pre`` of layer ``start``, one
    per variant (a head or a position), and have ``variants[j]`` replaced in row ``j`` at
    the component of each of ``layers`` (in ``head`` alone where given: the variants are
    then positions); ``row`` is their row of the effects grid."""

    start: int
    layers: tuple[int, ...]
    variants: tuple[int, ...]
    row: int
    head: int | None = None


def head_ablation(
    model: Model,
    text: str | Tensor | Sequence[int],
    *,
    target: str | None = None,
    mean_over: Sequence[str] | None = None,
    layers: Sequence[int] | None = None,
    metric: Metric | None = None,
    resample_from: Sequence[str] | None = None,
    prepend_bos: bool | None = None,
) -> InterventionEffects:
    """Ablate every head of some layers, one at a time, and measure the change.

    Args:
        model: an :mod:`attnkit.models` model.
        text: the input: a text, or token ids ``[s]`` / ``[1, s]``.
        target: the token whose log-probability after ``text`` is measured (causal models:
            a single token, leading space included, ``" Paris"``); encoders take none.
        mean_over: replace each head's ``z`` by its mean over every position of these
            texts instead of zero (e.g. ``[text]`` itself, or a reference set).
        layers: layer indices (negative from the end); default all.
        metric: what is measured instead of ``log p(target)`` (causal models): a
            :class:`attnkit.inspect.metrics.Metric` of the logits of every position (and the
            activations it reads); the effect is its change.
        resample_from: replace each head's ``z`` by its value on each of these texts (of
            as many tokens as ``text``) in turn, instead of zero: the effect is the mean over
            them (resampling ablation).
        prepend_bos: for a text, as :meth:`attnkit.models.Model.tokenize` takes it
            (``True``: a BOS first, as TransformerLens by default).

    Returns:
        :class:`InterventionEffects` of kind ``"ablation"``, by ``"head"``; its
        ``replacement`` is ``"zero"``, ``"mean"`` or ``"resample"``.

    An encoder–decoder (T5, BART) takes ``text`` as its source and ``target`` as the text
    its decoder reads and predicts: every head of its encoder, decoder self- and
    cross-attention is zeroed in turn and the change in the target's log-probability is
    measured (:func:`attnkit.inspect.encoder_decoder_ablation.encoder_decoder_head_ablation`).

    Raises:
        ValueError: the model refuses a text, a missing or unneeded target, a target that
            is not a single token (the message says how it tokenises), an empty
            ``mean_over``, a layer out of range, ``mean_over`` or no target with an
            encoder-decoder.
    """
    ablate = for_kind(
        model,
        {ONE_TEXT: _one_text_head_ablation, SOURCE_AND_TARGET: _encoder_decoder_head_ablation},
        what="head ablation",
    )
    return ablate(
        model,
        text,
        target=target,
        mean_over=mean_over,
        layers=layers,
        metric=metric,
        resample_from=resample_from,
        prepend_bos=prepend_bos,
    )


def _one_text_head_ablation(
    model: Model,
    text: str | Tensor | Sequence[int],
    *,
    target: str | None,
    mean_over: Sequence[str] | None,
    layers: Sequence[int] | None,
    metric: Metric | None,
    resample_from: Sequence[str] | None,
    prepend_bos: bool | None,
) -> InterventionEffects:
    """:func:`head_ablation` of a model of one text (a causal decoder or an encoder)."""
    target_id = _ablation_target_id(model, target, metric, mean_over is not None and resample_from is not None)
    layer_list = model.layer_indices(layers)
    encoded = model.tokenized(text, prepend_bos=prepend_bos)
    replacement_sets = _ablation_replacements(model, layer_list, mean_over, resample_from, encoded.ids.shape[1])
    unablated: list[Tensor] = []  # the output of the first (unaltered) row
    measure: Callable[[Tensor], Tensor] = _unused_measure
    if metric is not None:
        words = f"change in {metric.name}"
    elif model.causal:
        assert target is not None and target_id is not None  # a causal model's target is checked
        words = f"change in log p({target!r}) at the last position"

        def measure(output: Tensor) -> Tensor:
            if not unablated:
                unablated.append(output[0])
            return torch.log_softmax(output, dim=-1)[:, target_id]
    else:
        words = "change in the cosine of the sentence embedding to the unablated one (cos - 1)"

        def measure(output: Tensor) -> Tensor:
            embeddings = targets.sentence_embedding(output)  # [rows, e]
            return targets.cosine_to(embeddings, embeddings[0]) - 1.0

    heads = tuple(range(model.num_heads))
    branches = [_Branch(layer, (layer,), heads, row) for row, layer in enumerate(layer_list)]
    points = {layer: model.hook_name("self_attn.z", layer) for layer in layer_list}
    shape = (len(layer_list), len(heads))
    grids = [
        _patched_passes(model, encoded.ids, branches, points, replacements, 1, measure, shape, metric=metric)
        for replacements in replacement_sets
    ]
    base, measured = grids[0][0], torch.stack([grid for _, grid in grids]).mean(0)
    if model.causal and metric is None:
        assert target is not None and target_id is not None
        targets.warn_if_space_missing(model, target, target_id, unablated[0])
    if model.causal:  # a Metric is of a causal model's logits too
        measured = measured - base
    return InterventionEffects(
        model_name=model.name,
        kind="ablation",
        metric=words,
        by="head",
        component="z",
        layers=layer_list,
        columns=[str(head) for head in heads],
        effects=measured.float(),
        texts={"text": _as_text(model, text)},
        tokens=list(encoded.tokens),
        target=target,
        wrong=None,
        replacement="mean" if mean_over is not None else "resample" if resample_from is not None else "zero",
        baseline=float(base) if model.causal else 0.0,
    )


def activation_patching(
    model: Model,
    clean: str | Tensor | Sequence[int],
    corrupt: str | Tensor | Sequence[int],
    *,
    by: str = "head",
    component: str | None = None,
    metric: str | MetricFunction | Metric | None = None,
    target: str | None = None,
    wrong: str | None = None,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    prepend_bos: bool | None = None,
) -> InterventionEffects:
    """Patch activations of the clean run into the corrupted run, one head, one position or
    one cell of the pattern at a time, and measure the fraction of the clean-vs-corrupted difference restored:
    ``(patched - corrupted) / (clean - corrupted)``.

    An encoder–decoder (T5, BART) takes ``clean`` and ``corrupt`` as sources and ``target``
    as the text its decoder predicts: each head's ``z`` (encoder self-, decoder self- and
    cross-attention) is patched and ``log p(target)`` measured
    (:func:`attnkit.inspect.encoder_decoder_ablation.encoder_decoder_activation_patching`).

    Args:
        model: an :mod:`attnkit.models` model (a causal decoder, a bidirectional encoder or
            an encoder–decoder).
        clean: the clean text (or its token ids ``[s]`` / ``[1, s]``).
        corrupt: the corrupted text (or ids), of the same number of tokens.
        by: where each patch acts (:data:`BY`): ``"head"``, one head's ``z`` at every
            position (a layers × heads grid); ``"layer-position"``, the component of one
            layer at one position (layers × positions); ``"position"``, the component at
            one position in every layer of ``layers`` at once (one row of positions);
            ``"dest-src"``, the pattern's weight of one destination (query) position on
            one source (key) position, in ``heads`` of every layer of ``layers`` at once
            (destinations × sources; TransformerLens'
            ``get_act_patch_attn_head_pattern_dest_src_pos`` for one head and layer);
            ``"head-position"``, one head's per-head component at one position (the heads
            of every layer × positions; ``get_act_patch_attn_head_out_by_pos``).
        component: what is patched (:data:`COMPONENTS`); default ``"z"`` by head,
            ``"resid_pre"`` by position, ``"pattern"`` (the only one) by ``"dest-src"``. By head only the per-head ones
            (:data:`PER_HEAD`: ``k`` and ``v`` by key/value head); by position a per-head
            component is patched for every head at that (query) position.
        metric: ``"logit-diff"`` (causal default: ``logit(target) - logit(wrong)`` at the
            last position), ``"log-p"`` (``log p(target)`` there), ``"cosine"`` (encoders'
            default and only named metric: the cosine of the sentence embedding to the
            clean text's), or a function of the output of a batch (next-token logits at
            the last position ``[b, v]`` float32 for causal models, the last hidden states
            ``[b, s, e]`` float32 for encoders) that returns one number per row ``[b]``, or
            a :class:`attnkit.inspect.metrics.Metric` of the logits of every position (and
            the activations it reads; causal models).
        target: the token the clean text should continue with (``"logit-diff"`` and
            ``"log-p"``), leading space included (``" Mary"``).
        wrong: the token the corrupted text continues with instead (``"logit-diff"``).
        layers: layer indices (negative from the end); default all.
        heads: the query heads whose pattern cell ``by="dest-src"`` patches (negative from
            the end); default all. Only with ``by="dest-src"`` (so never on an encoder–decoder).
        prepend_bos: for texts, as :meth:`attnkit.models.Model.tokenize` takes it.

    Returns:
        :class:`InterventionEffects` of kind ``"patching"``.

    Raises:
        ValueError: texts of different token lengths (the message shows both
            tokenisations), an unknown ``by``, component or metric, ``by="head"`` with
            another component than ``z``, a component the model's layers do not have,
            missing or unneeded target/wrong tokens, tokens that are not single tokens,
            texts the metric does not tell apart, a metric function that does not return
            one number per row, no layer or a layer out of range, an encoder-decoder
            asked for more than each head's ``z`` by head, or without a target text,
            ``heads`` without ``by="dest-src"`` (an encoder-decoder's too), no head or a
            head out of range.
        TypeError: a metric that is neither a name nor a function.
    """
    patch = for_kind(
        model, {ONE_TEXT: _one_text_patching, SOURCE_AND_TARGET: _encoder_decoder_patching}, what="activation patching"
    )
    return patch(
        model,
        clean,
        corrupt,
        by=by,
        component=component,
        metric=metric,
        target=target,
        wrong=wrong,
        layers=layers,
        heads=heads,
        prepend_bos=prepend_bos,
    )


def _one_text_patching(
    model: Model,
    clean: str | Tensor | Sequence[int],
    corrupt: str | Tensor | Sequence[int],
    *,
    by: str,
    component: str | None,
    metric: str | MetricFunction | Metric | None,
    target: str | None,
    wrong: str | None,
    layers: Sequence[int] | None,
    heads: Sequence[int] | None,
    prepend_bos: bool | None,
) -> InterventionEffects:
    """:func:`activation_patching` of a model of one text (a causal decoder or an encoder)."""
    component = check_where(by, component)
    metric_name = check_metric(model, metric, target, wrong)
    layer_list = model.layer_indices(layers)
    if not layer_list:
        raise ValueError("layers must name at least one layer, got none")
    head_list = _check_heads(model, by, heads)
    target_id, wrong_id = token_ids(model, metric_name, target, wrong)
    clean_enc, corrupt_enc = same_length_pair(model, clean, corrupt, prepend_bos)
    points = {layer: hook_point(model, component, layer) for layer in layer_list}
    reads = list(metric.reads) if isinstance(metric, Metric) else []
    with torch.no_grad():
        clean_out, clean_cache = model.run_with_cache(clean_enc.ids, names_filter=[*points.values(), *reads])
        corrupt_out, corrupt_cache = model.run_with_cache(corrupt_enc.ids, names_filter=[*points.values(), *reads])
    clean_output = _final_output(model, clean_out)
    words, measure = _measure(model, metric, metric_name, (target, wrong), (target_id, wrong_id), clean_output)
    runs = ((clean_out, clean_enc.ids, clean_cache), (corrupt_out, corrupt_enc.ids, corrupt_cache))
    clean_value, corrupt_value = _clean_and_corrupted_values(model, metric, measure, runs)
    if target is not None and target_id is not None:
        targets.warn_if_space_missing(model, target, target_id, clean_output[0])
    gap = clean_value - corrupt_value
    # The dimension of the activation that the variants index: heads of a per-head
    # component ([b, h, s, d], [b, h, s, s_k]), its query positions, or positions [b, s, e].
    dim = 1 if by == "head" or component not in PER_HEAD else 2
    replacements = {layer: clean_cache[name][0] for layer, name in points.items()}  # [h, s, d] or [s, e]
    corrupted = {layer: corrupt_cache[name][0] for layer, name in points.items()}
    count = next(iter(replacements.values())).shape[0] if by == "head" else clean_enc.ids.shape[1]  # h or h_kv
    replacements, branches, shape, rows = _grid(by, layer_list, count, (replacements, corrupted), dim, head_list)
    grid_args = (branches, points, replacements, dim, measure, shape)
    _, measured = _patched_passes(
        model,
        corrupt_enc.ids,
        *grid_args,
        fill=corrupt_value,
        cell_heads=None if head_list is None else torch.tensor(head_list),
        metric=metric if isinstance(metric, Metric) else None,
    )
    return InterventionEffects(
        model_name=model.name,
        kind="patching",
        metric=f"fraction of the {words} restored",
        by=by,
        component=component,
        layers=layer_list,
        columns=([str(head) for head in range(count)] if by == "head" else _labels(model, clean, clean_enc)),
        effects=((measured - corrupt_value) / gap).float(),
        texts={"clean": _as_text(model, clean), "corrupt": _as_text(model, corrupt)},
        tokens=list(clean_enc.tokens),
        target=target,
        wrong=wrong,
        replacement="clean",
        baseline={"clean": clean_value, "corrupt": corrupt_value},
        heads=head_list,
        rows=rows,
    )


def _clean_and_corrupted_values(
    model: Model,
    metric: str | MetricFunction | Metric | None,
    measure: Callable[[Tensor], Tensor],
    runs: tuple[tuple[Tensor, Tensor, Any], tuple[Tensor, Tensor, Any]],
) -> tuple[float, float]:
    """The measure of the clean and the corrupted run, from each run's ``(output, ids,
    cache)``: by ``metric`` where it is a :class:`Metric`, else by ``measure``.

    Raises:
        ValueError: the two are equal: there is no difference to restore.
    """
    reads = metric.reads if isinstance(metric, Metric) else ()
    with torch.no_grad():
        clean_value, corrupt_value = (
            float(metric(MetricInput(out.float(), ids, {name: cache[name] for name in reads}))[0])
            if isinstance(metric, Metric)
            else float(measure(_final_output(model, out))[0])
            for out, ids, cache in runs
        )
    if abs(clean_value - corrupt_value) < 1e-6:
        raise ValueError(
            f"the clean and corrupted texts give the same measure ({clean_value:.6g}); there is no difference to restore"
        )
    return clean_value, corrupt_value


def _head_position_branches(
    layers: list[int], positions: int, clean: dict[int, Tensor], corrupted: dict[int, Tensor]
) -> tuple[list[_Branch], tuple[int, int], list[str]]:
    """``(branches, shape, row labels)`` of a ``by="head-position"`` grid: one row per head
    of each layer (``"L3H2"``), each with the positions whose clean activation of that head
    differs from the corrupted one. ``clean`` and ``corrupted``: layer → ``[h, s, ...]``."""
    heads = next(iter(clean.values())).shape[0]  # h, or h_kv for k and v
    branches = []
    for index, layer in enumerate(layers):
        for head in range(heads):
            changed = tuple(
                p for p in range(positions) if not torch.equal(clean[layer][head, p], corrupted[layer][head, p])
            )
            if changed:
                branches.append(_Branch(layer, (layer,), changed, index * heads + head, head))
    labels = [f"L{layer}H{head}" for layer in layers for head in range(heads)]
    return branches, (len(layers) * heads, positions), labels


def _source_text(text: str | Tensor | Sequence[int]) -> str:
    """An encoder–decoder's source, which these analyses take as a text.

    Raises:
        ValueError: ids.
    """
    if not isinstance(text, str):
        raise ValueError("an encoder–decoder's ablation and patching take texts, not token ids")
    return text


def _as_text(model: Model, text_or_ids: str | Tensor | Sequence[int]) -> str:
    """A record's text: the text, or the text of the ids."""
    if isinstance(text_or_ids, str):
        return text_or_ids
    text = model.to_string(model.prepare_input(text_or_ids)[0][0])
    assert isinstance(text, str)  # the ids of one text
    return text


def _labels(model: Model, text: str | Tensor | Sequence[int], encoded: Any) -> list[str]:
    """How each token reads: in the text, or each id decoded on its own."""
    if isinstance(text, str):
        return token_labels(text, encoded.tokens, encoded.offsets)
    return model.to_str_tokens(encoded.ids)


def same_length_pair(
    model: Model,
    clean: str | Tensor | Sequence[int],
    corrupt: str | Tensor | Sequence[int],
    prepend_bos: bool | None = None,
) -> tuple[Any, Any]:
    """The tokenizations of the clean and corrupted texts (or ids), which must have as many
    tokens."""
    clean_enc = model.tokenized(clean, prepend_bos=prepend_bos)
    corrupt_enc = model.tokenized(corrupt, prepend_bos=prepend_bos)
    if clean_enc.ids.shape != corrupt_enc.ids.shape:
        raise ValueError(
            f"clean and corrupted texts must have the same number of tokens, got {clean_enc.ids.shape[1]} "
            f"({_spelled(clean_enc.tokens)}) and {corrupt_enc.ids.shape[1]} ({_spelled(corrupt_enc.tokens)})"
        )
    return clean_enc, corrupt_enc


def _grid(
    by: str,
    layers: list[int],
    count: int,
    activations: tuple[dict[int, Tensor], dict[int, Tensor]],
    dim: int,
    heads: list[int] | None,
) -> tuple[dict[int, Tensor], list[_Branch], tuple[int, int], list[str] | None]:
    """``(replacements, branches, shape, row labels)`` of a patching grid from the clean and
    corrupted activations (layer → activation without its batch dimension); for
    ``by="dest-src"`` the replacements are the patterns of ``heads`` alone
    ``[h_patched, s, s]``; row labels only by ``"head-position"``."""
    clean, corrupted = activations
    if by == "head-position":
        return clean, *_head_position_branches(layers, count, clean, corrupted)
    if heads is None:
        shape = (1 if by == "position" else len(layers), count)
        return clean, _changed_branches(by, layers, count, clean, corrupted, dim), shape, None
    # Each destination's row of the pattern, in the heads patched: [h_patched, s, s].
    clean = {layer: t[heads] for layer, t in clean.items()}
    corrupted = {layer: t[heads] for layer, t in corrupted.items()}
    return clean, _changed_cells(layers, count, clean, corrupted), (count, count), None


def _encoder_decoder_head_ablation(
    model: Model,
    text: str | Tensor | Sequence[int],
    *,
    target: str | None,
    mean_over: Sequence[str] | None,
    layers: Sequence[int] | None,
    metric: Metric | None,
    resample_from: Sequence[str] | None,
    prepend_bos: bool | None,
) -> InterventionEffects:
    """:func:`head_ablation` of an encoder–decoder (``text``: its source), after checking
    what it takes (``prepend_bos`` is a text's alone)."""
    from attnkit.inspect.encoder_decoder_ablation import encoder_decoder_head_ablation

    if metric is not None or resample_from is not None:
        raise ValueError(f"{model.name} is an encoder-decoder: it ablates heads to zero and measures log p(target)")
    source = _source_text(text)
    if target is None or mean_over is not None:
        raise ValueError(
            f"{model.name} is an encoder-decoder: give the target text its decoder predicts; "
            "it ablates heads to zero only (no mean_over)"
        )
    return InterventionEffects(**encoder_decoder_head_ablation(model, source, target, layers=layers))


def _encoder_decoder_patching(
    model: Model,
    clean: str | Tensor | Sequence[int],
    corrupt: str | Tensor | Sequence[int],
    *,
    by: str,
    component: str | None,
    metric: str | MetricFunction | Metric | None,
    target: str | None,
    wrong: str | None,
    layers: Sequence[int] | None,
    heads: Sequence[int] | None,
    prepend_bos: bool | None,
) -> InterventionEffects:
    """:func:`activation_patching` of an encoder–decoder (``clean`` and ``corrupt``: its
    sources; ``target``: the text its decoder predicts), after checking what it takes
    (``heads`` is ``by="dest-src"``'s, which it has not, so it refuses them; ``prepend_bos``
    is a text's and does not apply)."""
    from attnkit.inspect.encoder_decoder_ablation import encoder_decoder_activation_patching

    sources = (_source_text(clean), _source_text(corrupt))
    if by != "head" or component not in (None, "z") or metric not in (None, "log-p") or target is None or wrong:
        raise ValueError(
            f"{model.name} is an encoder-decoder: it patches each head's z (by='head') and measures log p of "
            "the target text its decoder predicts (give target=, no wrong token)"
        )
    if heads is not None:
        raise ValueError(
            f"{model.name} is an encoder-decoder: it patches every head in turn (by='head') and takes no heads "
            f"(they choose the heads of by='dest-src'), got heads={list(heads)}"
        )
    return InterventionEffects(**encoder_decoder_activation_patching(model, *sources, target, layers=layers))


def _check_heads(model: Model, by: str, heads: Sequence[int] | None) -> list[int] | None:
    """The heads a ``by="dest-src"`` patch acts on (every head by default), ``None`` for the
    other ``by``, which take no heads."""
    if by != "dest-src":
        if heads is not None:
            raise ValueError(f"heads choose the heads of by='dest-src'; by={by!r} takes none, got heads={list(heads)}")
        return None
    count = model.num_heads
    chosen = list(range(count)) if heads is None else list(heads)
    if not chosen:
        raise ValueError("heads must name at least one head, got none")
    wrong = [head for head in chosen if not -count <= head < count]
    if wrong:
        raise ValueError(f"{model.name} has heads 0..{count - 1} (or -{count}..-1), got {wrong}")
    return sorted({head % count for head in chosen})


def _changed_cells(
    layers: list[int], positions: int, clean: dict[int, Tensor], corrupted: dict[int, Tensor]
) -> list[_Branch]:
    """The rows of a ``by="dest-src"`` grid: one branch per destination, branching off at the
    first layer patched, with the sources whose pattern cell differs between the clean and
    corrupted runs in a head and layer patched. ``clean`` and ``corrupted``: layer → the
    pattern of the heads patched ``[h_patched, s, s]``."""
    branches = []
    for dest in range(positions):
        changed = tuple(
            src
            for src in range(positions)
            if any(not torch.equal(clean[i][:, dest, src], corrupted[i][:, dest, src]) for i in layers)
        )
        if changed:
            branches.append(_Branch(layers[0], tuple(layers), changed, dest))
    return branches


def _changed_branches(
    by: str, layers: list[int], count: int, clean: dict[int, Tensor], corrupted: dict[int, Tensor], dim: int
) -> list[_Branch]:
    """The rows to run: one branch per layer (a row of the grid) or, by position, one for
    every layer at once; each with the variants (of ``count``) whose clean activations
    differ from the corrupted ones in a layer it patches (the others would change nothing).
    ``clean`` and ``corrupted``: layer → activation without its batch dimension."""
    if by == "position":
        groups = [(layers[0], tuple(layers), 0)]
    else:
        groups = [(layer, (layer,), row) for row, layer in enumerate(layers)]
    branches = []
    for start, patched, row in groups:
        changed = tuple(
            j
            for j in range(count)
            if any(not torch.equal(clean[i].select(dim - 1, j), corrupted[i].select(dim - 1, j)) for i in patched)
        )
        if changed:
            branches.append(_Branch(start, patched, changed, row))
    return branches


def check_where(by: str, component: str | None) -> str:
    """The component to patch (its default for ``by``), after checking both."""
    if by not in BY:
        raise ValueError(f"by must be one of {', '.join(map(repr, BY))}, got {by!r}")
    if by == "dest-src":
        if component not in (None, "pattern"):
            raise ValueError(f"by='dest-src' patches cells of the pattern; it takes no component {component!r}")
        return "pattern"
    if component is None:
        return "z" if by in ("head", "head-position") else "resid_pre"
    if component not in COMPONENTS:
        raise ValueError(f"component must be one of {', '.join(map(repr, COMPONENTS))}, got {component!r}")
    if by in ("head", "head-position") and component not in PER_HEAD:
        raise ValueError(
            f"patching by head needs a per-head component ({', '.join(map(repr, PER_HEAD))}); "
            f"{component!r} is one vector per position: patch it by 'layer-position' or 'position'"
        )
    return component


def check_metric(
    model: Model, metric: str | MetricFunction | Metric | None, target: str | None, wrong: str | None
) -> str:
    """The metric's name (``"function"`` for a function), after checking that it fits the
    model and the tokens given."""
    if metric is None:
        metric = "logit-diff" if model.causal else "cosine"
    if isinstance(metric, Metric):
        given = [name for name, value in (("target", target), ("wrong", wrong)) if value is not None]
        if given:
            raise ValueError(f"a Metric names its own tokens and takes no {' or '.join(given)} token")
        if not model.causal:
            raise ValueError(
                f"{model.name} is a bidirectional encoder without next-token logits; a Metric reads logits: give "
                "'cosine' or a function of the last hidden states"
            )
        return "metric"
    if callable(metric):
        given = [name for name, value in (("target", target), ("wrong", wrong)) if value is not None]
        if given:
            raise ValueError(f"a metric function measures the output itself and takes no {' or '.join(given)} token")
        return "function"
    if not isinstance(metric, str):
        raise TypeError(f"metric must be one of {', '.join(map(repr, METRICS))} or a function, got {metric!r}")
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(map(repr, METRICS))} or a function, got {metric!r}")
    if not model.causal:
        _refuse_tokens_for_encoders(model, target=target, wrong=wrong)
        if metric != "cosine":
            raise ValueError(
                f"{model.name} is a bidirectional encoder without next-token logits; its metric is 'cosine' (to the "
                f"clean sentence embedding) or a function of the last hidden states, got {metric!r}"
            )
        return metric
    if metric == "cosine":
        raise ValueError(
            f"{model.name} is causal: its metrics are 'logit-diff', 'log-p' or a function of the next-token logits; "
            "'cosine' is the sentence-embedding metric of encoders"
        )
    if metric == "log-p" and wrong is not None:
        raise ValueError("the metric 'log-p' measures the target alone and takes no wrong token")
    return metric


def token_ids(model: Model, metric: str, target: str | None, wrong: str | None) -> tuple[int | None, int | None]:
    """The ids of the target and wrong tokens the metric needs (``None`` for the others)."""
    if metric == "logit-diff":
        if target is None or wrong is None:
            raise ValueError(
                f"{model.name} is causal: give the target token (the clean text's continuation) and the wrong token "
                "(the corrupted text's); patching measures their logit difference (or use the metric 'log-p' with a "
                "target alone)"
            )
        return targets.single_token(model, target, what="target"), targets.single_token(model, wrong, what="wrong")
    if metric == "log-p":
        if target is None:
            raise ValueError("the metric 'log-p' measures the log-probability of a target token: give the target")
        return targets.single_token(model, target, what="target"), None
    return None, None


def _measure(
    model: Model,
    metric: str | MetricFunction | Metric | None,
    name: str,
    tokens: tuple[str | None, str | None],
    ids: tuple[int | None, int | None],
    clean_output: Tensor,
) -> tuple[str, Callable[[Tensor], Tensor]]:
    """The metric in words, and as a function of a batch's output (:func:`_final_output`)
    to one number per row ``[b]``; ``tokens`` and ``ids`` are the target's and the wrong
    token's."""
    (target, wrong), (target_id, wrong_id) = tokens, ids
    if name == "logit-diff":
        assert target_id is not None and wrong_id is not None  # checked by token_ids
        return f"logit difference {target!r} - {wrong!r}", lambda out: out[:, target_id] - out[:, wrong_id]
    if name == "log-p":
        assert target_id is not None  # checked by token_ids
        return f"log p({target!r})", lambda out: torch.log_softmax(out, dim=-1)[:, target_id]
    if name == "cosine":
        reference = targets.sentence_embedding(clean_output)[0]
        return "cosine to the clean sentence embedding", lambda out: targets.cosine_to(
            targets.sentence_embedding(out), reference
        )
    if isinstance(metric, Metric):
        return metric.name, _unused_measure
    assert callable(metric)
    function = metric

    def measure(out: Tensor) -> Tensor:
        values = function(out)
        if not isinstance(values, Tensor) or values.shape != (out.shape[0],):
            got = list(values.shape) if isinstance(values, Tensor) else type(values).__name__
            raise ValueError(f"a metric function must return one number per row, a tensor [{out.shape[0]}], got {got}")
        check_finite(values.float(), "the metric function's result")
        return values.float()

    label = getattr(function, "__name__", "")
    return ("metric" if not label or label == "<lambda>" else f"metric {label}"), measure


def _unused_measure(out: Tensor) -> Tensor:
    """The measure of a :class:`Metric`'s grid, which :func:`measure_rows` measures instead."""
    raise AssertionError("a Metric is measured by measure_rows")


def _final_output(model: Model, out: Tensor) -> Tensor:
    """What a metric reads of a run: next-token logits at the last position ``[b, v]``
    (causal models, from logits ``[b, s, v]``) or the last hidden states ``[b, s, e]``
    (encoders), float32."""
    return out[:, -1].float() if model.causal else out.float()


def hook_point(model: Model, component: str, layer: int) -> str:
    """The hook name of ``component`` in ``layer``, or an error that lists the layer's."""
    try:
        return model.hook_name(_HOOK_POINTS.get(component, component), layer)
    except ValueError:
        prefix = model.hook_name("resid_pre", layer).removesuffix("resid_pre")
        present = [c for c in COMPONENTS if prefix + _HOOK_POINTS.get(c, c) in model.hook_names()]
        raise ValueError(
            f"the layers of {model.name} have no {component!r} (layer {layer} has {', '.join(present)})"
        ) from None


def _patched_passes(
    model: Model,
    ids: Tensor,
    branches: Sequence[_Branch],
    points: dict[int, str],
    replacements: dict[int, Tensor],
    dim: int,
    measure: Callable[[Tensor], Tensor],
    shape: tuple[int, int],
    *,
    fill: float = 0.0,
    cell_heads: Tensor | None = None,
    metric: Metric | None = None,
) -> tuple[Tensor, Tensor]:
    """Run ``ids`` unaltered and with the variants of each branch patched in, and measure
    each run.

    Args:
        model_name: the model.
        ids: ``[1, s]``.
        branches: the rows to run; a grid row may have no branch (nothing to patch there).
        points: layer → the hook name of the component patched.
        replacements: layer → the values patched in, without the batch dimension; variant
            ``j`` is index ``j`` of dimension ``dim - 1`` (``[h, s or 1, d]`` by head).
        dim: the variants' dimension in the activation.
        measure: output of every row (the unaltered one first) → ``[b]``.
        shape: ``(rows, variants)`` of the grid.
        fill: the measure of the grid's cells that no branch runs.
        cell_heads: for a ``by="dest-src"`` grid, the heads patched: each variant is then
            the source position of a cell of the pattern whose destination is its branch's
            row, and ``replacements`` are the patterns of these heads ``[h_patched, s, s]``.
        metric: measures each row instead of ``measure``, from the logits of every
            position, the ids and the activations it reads.

    Returns:
        ``(measure of the unaltered run, shape measures)``, ``fill`` where nothing ran.
    """
    grid = torch.full(shape, fill, dtype=torch.float64)
    row_bytes = ids.shape[1] * max(model.config.hidden_size, model.config.intermediate_size) * 4 * 4
    rows_per_pass = max(1, BATCH_MEMORY // row_bytes - 1)
    passes: list[list[_Branch]] = []
    for branch in branches:
        if passes and sum(len(b.variants) for b in passes[-1]) + len(branch.variants) <= rows_per_pass:
            passes[-1].append(branch)
        else:
            passes.append([branch])
    base = torch.zeros(())
    for group in passes or [[]]:
        chains: dict[str, list[Callable[[Tensor], Tensor | None]]] = {}
        offset = 1  # row 0 is the unaltered run
        for branch in group:
            variants = torch.tensor(branch.variants)
            chains.setdefault(model.hook_name("resid_pre", branch.start), []).append(_branch(len(branch.variants)))
            rows_of = torch.arange(offset, offset + len(variants))
            for layer in branch.layers:
                patch = (
                    _patch_cells(rows_of, cell_heads, branch.row, variants, replacements[layer])
                    if cell_heads is not None
                    else _patch_head(rows_of, branch.head, variants, replacements[layer])
                    if branch.head is not None
                    else _patch(rows_of, variants, replacements[layer], dim)
                )
                chains.setdefault(points[layer], []).append(patch)
            offset += len(variants)
        kept: dict[str, Tensor] = {}
        for name in metric.reads if metric is not None else ():
            chains.setdefault(name, []).append(_keep(kept, name))
        with torch.no_grad():
            run = model.run_with_hooks(ids, hooks={name: _chained(fns) for name, fns in chains.items()}, logits=False)
            values = (
                measure(_final_output_of_hidden(model, run.last_hidden_state))
                if metric is None
                else measure_rows(model, metric, run.last_hidden_state, ids, kept)
            ).double()  # [offset]
        base, offset = values[0].cpu(), 1
        for branch in group:
            grid[branch.row, list(branch.variants)] = values[offset : offset + len(branch.variants)].cpu()
            offset += len(branch.variants)
    return base, grid


def _final_output_of_hidden(model: Model, hidden: Tensor) -> Tensor:
    """:func:`_final_output` from the last hidden states ``[b, s, e]``: the head runs on the
    last position only (a batch of many rows saves the vocabulary projection of the rest)."""
    return targets.last_logits(model, hidden) if model.causal else hidden.float()


# The logits a metric of every position reads are formed for this many bytes of rows at a time.
LOGITS_MEMORY = 2**28


def measure_rows(model: Model, metric: Metric, hidden: Tensor, ids: Tensor, kept: dict[str, Tensor]) -> Tensor:
    """``[b]``: ``metric`` of each row of a batch from its last hidden states ``[b, s, e]``, the
    ids ``[1, s]`` every row read and the activations it reads (``[b or fewer, ...]``: rows
    that branched off after a point are the unaltered row 0 there), a few rows' logits at a
    time.

    Raises:
        ValueError: a model without a language-model head.
    """
    rows, positions = hidden.shape[:2]
    cache = {name: _all_rows(x, rows) for name, x in kept.items()}
    chunk = max(1, LOGITS_MEMORY // (positions * model.config.vocab_size * 4))
    values = []
    for start in range(0, rows, chunk):
        logits = model.module.logits(hidden[start : start + chunk])  # [c, s, v]
        if logits is None:
            raise ValueError(f"{model.name} ({model.family}) has no language-model head: no logits to measure")
        part = {name: x[start : start + chunk] for name, x in cache.items()}
        count = logits.shape[0]
        values.append(metric(MetricInput(logits.float(), ids.expand(count, -1), part)))
    return torch.cat(values)


def _all_rows(x: Tensor, rows: int) -> Tensor:
    """An activation of a batched pass with every row: rows that branch off after its point
    hold the unaltered row 0 there."""
    return x if x.shape[0] == rows else torch.cat([x, x[:1].expand(rows - x.shape[0], *x.shape[1:])])


def _keep(kept: dict[str, Tensor], name: str) -> Callable[[Tensor], None]:
    """A hook that keeps its activation in ``kept[name]``."""

    def hook(x: Tensor) -> None:
        kept[name] = x

    return hook


def _branch(n: int) -> Callable[[Tensor], Tensor]:
    """A ``resid_pre`` hook appending ``n`` copies of the unaltered run (row 0): ``[b, s, e]``
    → ``[b + n, s, e]``."""
    return lambda x: torch.cat([x, x[:1].expand(n, -1, -1)])


def _patch(rows: Tensor, variants: Tensor, replacement: Tensor, dim: int) -> Callable[[Tensor], Tensor]:
    """A hook that gives row ``rows[j]`` the replacement of variant ``variants[j]`` (index
    ``variants[j]`` of dimension ``dim`` of the activation, ``dim - 1`` of ``replacement``)."""
    chosen = replacement.movedim(dim - 1, 0)[variants]  # [n, ...]: each row's variant first

    def hook(x: Tensor) -> Tensor:
        x = x.clone()
        x.movedim(dim, 1)[rows.to(x.device), variants.to(x.device)] = chosen.to(x)
        return x

    return hook


def _patch_head(rows: Tensor, head: int, positions: Tensor, replacement: Tensor) -> Callable[[Tensor], Tensor]:
    """A per-head hook that gives row ``rows[j]`` the replacement of head ``head`` at
    position ``positions[j]``; ``replacement``: ``[h, s, d or s_k]``."""
    chosen = replacement[head, positions]  # [n, d or s_k]

    def hook(x: Tensor) -> Tensor:
        x = x.clone()
        x[rows.to(x.device), head, positions.to(x.device)] = chosen.to(x)
        return x

    return hook


def _patch_cells(
    rows: Tensor, heads: Tensor, dest: int, sources: Tensor, replacement: Tensor
) -> Callable[[Tensor], Tensor]:
    """A ``pattern`` hook that gives row ``rows[j]`` the clean weight of destination ``dest``
    on source ``sources[j]`` in each of ``heads``; ``replacement``: the clean pattern of these
    heads ``[h_patched, s, s]``."""
    chosen = replacement[:, dest, sources].T  # [n, h_patched]: each row's cell, by head

    def hook(x: Tensor) -> Tensor:
        x = x.clone()
        at = (rows.to(x.device)[:, None], heads.to(x.device)[None, :], dest, sources.to(x.device)[:, None])
        x[at] = chosen.to(x)
        return x

    return hook


def _chained(fns: Sequence[Callable[[Tensor], Tensor | None]]) -> Callable[[Tensor], Tensor]:
    """The hooks of one point, applied in order (one that returns ``None`` only reads)."""

    def hook(x: Tensor) -> Tensor:
        for fn in fns:
            out = fn(x)
            x = x if out is None else out
        return x

    return hook


def _mean_z(model: Model, texts: Sequence[str], layers: list[int]) -> dict[int, Tensor]:
    """Each head's ``z`` averaged over every position of ``texts``: layer → ``[h, 1, d]``."""
    if not texts:
        raise ValueError("mean ablation needs at least one reference text")
    totals: dict[int, Tensor] = {}
    count = 0
    for text in texts:
        run = model.run(text, return_weights=False, names_filter=[model.hook_name("self_attn.z", i) for i in layers])
        for i in layers:
            z = run.cache[model.hook_name("self_attn.z", i)][0].double().sum(1, keepdim=True)  # [h, 1, d]
            totals[i] = z if i not in totals else totals[i] + z
        count += run.ids.shape[1]
    return {i: (total / count).float() for i, total in totals.items()}


def _ablation_target_id(model: Model, target: str | None, metric: Metric | None, mean_and_resample: bool) -> int | None:
    """The id of an ablation's target token, ``None`` where a Metric measures instead, after
    checking that the options fit together."""
    if mean_and_resample:
        raise ValueError("give mean_over (mean ablation) or resample_from (resampling ablation), not both")
    if metric is not None:
        check_metric(model, metric, target, None)
        return None
    return _target_id(model, target)


def _ablation_replacements(
    model: Model,
    layers: list[int],
    mean_over: Sequence[str] | None,
    resample_from: Sequence[str] | None,
    length: int,
) -> list[dict[int, Tensor]]:
    """The values each head's ``z`` takes in turn, layer → ``[h, 1 or s, d]``: zero, its mean
    over ``mean_over``, or its value on each text of ``resample_from``."""
    if mean_over is not None:
        return [_mean_z(model, mean_over, layers)]
    if resample_from is not None:
        return _resampled_z(model, resample_from, layers, length)
    # Each layer's own head dim: some families choose it (num_heads · head_dim != hidden size).
    return [{i: torch.zeros(model.num_heads, 1, model.module.self_attention(i).head_dim) for i in layers}]


def _resampled_z(model: Model, texts: Sequence[str], layers: list[int], length: int) -> list[dict[int, Tensor]]:
    """Each head's ``z`` on each of ``texts``: one dict layer → ``[h, s, d]`` per text.

    Raises:
        ValueError: no text, or a text of another token count than ``length``.
    """
    if not texts:
        raise ValueError("resampling ablation needs at least one reference text")
    names = [model.hook_name("self_attn.z", i) for i in layers]
    sets = []
    for text in texts:
        encoded = model.tokenize(text)
        if encoded.ids.shape[1] != length:
            raise ValueError(
                f"resampling ablation takes reference texts of as many tokens as the text ({length}), got "
                f"{encoded.ids.shape[1]} ({_spelled(encoded.tokens)})"
            )
        with torch.no_grad():
            _, cache = model.run_with_cache(encoded.ids, names_filter=names)
        sets.append({i: cache[name][0] for i, name in zip(layers, names)})
    return sets


def _target_id(model: Model, target: str | None) -> int | None:
    """The id of the ablation target: required by causal models, refused by encoders."""
    _refuse_tokens_for_encoders(model, target=target)
    if not model.causal:
        return None
    if target is None:
        raise ValueError(f"{model.name} is causal: give the target token whose log-probability to measure")
    return targets.single_token(model, target, what="target")


def _refuse_tokens_for_encoders(model: Model, **tokens: str | None) -> None:
    given = [name for name, value in tokens.items() if value is not None]
    if not model.causal and given:
        raise ValueError(
            f"{model.name} is a bidirectional encoder without next-token logits; it measures the sentence "
            f"embedding and takes no {' or '.join(given)} token"
        )


def _spelled(tokens: Sequence[str]) -> str:
    return " ".join(repr(t) for t in tokens)
