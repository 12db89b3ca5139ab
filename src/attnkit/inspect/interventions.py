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
  heads and layers asked for at once (``"dest-src"``, positions × positions). The metric (:data:`METRICS`) is the logit difference between a target
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
from attnkit.inspect.methods import layer_indices

if TYPE_CHECKING:
    from attnkit.models import Model

# The activations of one batched pass may take about this many bytes; a grid whose batch
# would need more runs its layers in several passes.
BATCH_MEMORY = 2**30

# Where a patch acts: one head's z at every position; a component of one layer at one
# position; a component at one position in every layer asked for; one (destination, source)
# cell of the pattern in every head and layer asked for.
BY = ("head", "layer-position", "position", "dest-src")
# What a patch replaces, by the end of its hook name in a layer (attnkit.nn.hooks): the
# residual stream into the layer, between its blocks and out of it, the attention and
# feed-forward blocks' outputs, and each head's output before the output projection.
COMPONENTS = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "z", "q", "k", "v", "pattern")
# The components with a head dimension: patched by head (every position) or by position
# (every head at that query position; a pattern's row of that query).
PER_HEAD = ("z", "q", "k", "v", "pattern")
# The metrics named by a string: of causal models, the logit difference between the target
# and the wrong token and the target's log-probability at the last position; of encoders,
# the cosine of the sentence embedding to the clean text's.
METRICS = ("logit-diff", "log-p", "cosine")
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
            cell of the pattern patched in ``heads`` of every layer of ``layers``).
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
            encoder–decoder's ``"encoder 0"``, ``"decoder 0 self"``, ``"decoder 0 cross"``),
            else ``None``.
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
    the component of each of ``layers``; ``row`` is their row of the effects grid."""

    start: int
    layers: tuple[int, ...]
    variants: tuple[int, ...]
    row: int


def head_ablation(
    model: Model,
    text: str | Tensor | Sequence[int],
    *,
    target: str | None = None,
    mean_over: Sequence[str] | None = None,
    layers: Sequence[int] | None = None,
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
        prepend_bos: for a text, as :meth:`attnkit.models.Model.tokenize` takes it
            (``True``: a BOS first, as TransformerLens by default).

    Returns:
        :class:`InterventionEffects` of kind ``"ablation"``, by ``"head"``.

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
    if getattr(model, "encoder_decoder", False):
        return _encoder_decoder_ablation(model, _source_text(text), target, mean_over, layers)
    layer_list = layer_indices(model, layers)
    target_id = _target_id(model, target)
    encoded = model.tokenized(text, prepend_bos=prepend_bos)
    if mean_over is not None:
        replacements = _mean_z(model, mean_over, layer_list)
    else:
        # Each layer's own head dim: some families choose it (num_heads · head_dim != hidden size).
        replacements = {i: torch.zeros(model.num_heads, 1, model.module.self_attention(i).head_dim) for i in layer_list}
    unablated: list[Tensor] = []  # the output of the first (unaltered) row
    if model.causal:
        assert target is not None and target_id is not None  # a causal model's target is checked
        metric = f"change in log p({target!r}) at the last position"

        def measure(output: Tensor) -> Tensor:
            if not unablated:
                unablated.append(output[0])
            return torch.log_softmax(output, dim=-1)[:, target_id]
    else:
        metric = "change in the cosine of the sentence embedding to the unablated one (cos - 1)"

        def measure(output: Tensor) -> Tensor:
            embeddings = targets.sentence_embedding(output)  # [rows, e]
            return targets.cosine_to(embeddings, embeddings[0]) - 1.0

    heads = tuple(range(model.num_heads))
    branches = [_Branch(layer, (layer,), heads, row) for row, layer in enumerate(layer_list)]
    points = {layer: model.hook_name("self_attn.z", layer) for layer in layer_list}
    shape = (len(layer_list), len(heads))
    base, measured = _patched_passes(model, encoded.ids, branches, points, replacements, 1, measure, shape)
    if model.causal:
        assert target is not None and target_id is not None
        targets.warn_if_space_missing(model, target, target_id, unablated[0])
        measured = measured - base
    return InterventionEffects(
        model_name=model.name,
        kind="ablation",
        metric=metric,
        by="head",
        component="z",
        layers=layer_list,
        columns=[str(head) for head in heads],
        effects=measured.float(),
        texts={"text": _as_text(model, text)},
        tokens=list(encoded.tokens),
        target=target,
        wrong=None,
        replacement="zero" if mean_over is None else "mean",
        baseline=float(base) if model.causal else 0.0,
    )


def activation_patching(
    model: Model,
    clean: str | Tensor | Sequence[int],
    corrupt: str | Tensor | Sequence[int],
    *,
    by: str = "head",
    component: str | None = None,
    metric: str | MetricFunction | None = None,
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
            ``get_act_patch_attn_head_pattern_dest_src_pos`` for one head and layer).
        component: what is patched (:data:`COMPONENTS`); default ``"z"`` by head,
            ``"resid_pre"`` by position, ``"pattern"`` (the only one) by ``"dest-src"``. By head only the per-head ones
            (:data:`PER_HEAD`: ``k`` and ``v`` by key/value head); by position a per-head
            component is patched for every head at that (query) position.
        metric: ``"logit-diff"`` (causal default: ``logit(target) - logit(wrong)`` at the
            last position), ``"log-p"`` (``log p(target)`` there), ``"cosine"`` (encoders'
            default and only named metric: the cosine of the sentence embedding to the
            clean text's), or a function of the output of a batch (next-token logits at
            the last position ``[b, v]`` float32 for causal models, the last hidden states
            ``[b, s, e]`` float32 for encoders) that returns one number per row ``[b]``.
        target: the token the clean text should continue with (``"logit-diff"`` and
            ``"log-p"``), leading space included (``" Mary"``).
        wrong: the token the corrupted text continues with instead (``"logit-diff"``).
        layers: layer indices (negative from the end); default all.
        heads: the query heads whose pattern cell ``by="dest-src"`` patches (negative from
            the end); default all. Only with ``by="dest-src"``.
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
            ``heads`` without ``by="dest-src"``, no head or a head out of range.
        TypeError: a metric that is neither a name nor a function.
    """
    if getattr(model, "encoder_decoder", False):
        sources = (_source_text(clean), _source_text(corrupt))
        return _encoder_decoder_patching(model, sources, by, component, metric, (target, wrong), layers)
    component = _check_where(by, component)
    metric_name = _check_metric(model, metric, target, wrong)
    layer_list = layer_indices(model, layers)
    if not layer_list:
        raise ValueError("layers must name at least one layer, got none")
    head_list = _check_heads(model, by, heads)
    target_id, wrong_id = _token_ids(model, metric_name, target, wrong)
    clean_enc, corrupt_enc = _same_length_pair(model, clean, corrupt, prepend_bos)
    points = {layer: _hook_point(model, component, layer) for layer in layer_list}
    with torch.no_grad():
        clean_out, clean_cache = model.run_with_cache(clean_enc.ids, names_filter=list(points.values()))
        corrupt_out, corrupt_cache = model.run_with_cache(corrupt_enc.ids, names_filter=list(points.values()))
    clean_output, corrupt_output = _final_output(model, clean_out), _final_output(model, corrupt_out)
    words, measure = _measure(model, metric, metric_name, (target, wrong), (target_id, wrong_id), clean_output)
    with torch.no_grad():
        clean_value, corrupt_value = float(measure(clean_output)[0]), float(measure(corrupt_output)[0])
    if target is not None and target_id is not None:
        targets.warn_if_space_missing(model, target, target_id, clean_output[0])
    gap = clean_value - corrupt_value
    if abs(gap) < 1e-6:
        raise ValueError(
            f"the clean and corrupted texts give the same measure ({clean_value:.6g}); there is no difference to restore"
        )
    # The dimension of the activation that the variants index: heads of a per-head
    # component ([b, h, s, d], [b, h, s, s_k]), its query positions, or positions [b, s, e].
    dim = 1 if by == "head" or component not in PER_HEAD else 2
    replacements = {layer: clean_cache[name][0] for layer, name in points.items()}  # [h, s, d] or [s, e]
    corrupted = {layer: corrupt_cache[name][0] for layer, name in points.items()}
    count = next(iter(replacements.values())).shape[0] if by == "head" else clean_enc.ids.shape[1]  # h or h_kv
    replacements, branches, shape = _grid(by, layer_list, count, (replacements, corrupted), dim, head_list)
    cell_heads = None if head_list is None else torch.tensor(head_list)
    grid_args = (branches, points, replacements, dim, measure, shape)
    _, measured = _patched_passes(model, corrupt_enc.ids, *grid_args, fill=corrupt_value, cell_heads=cell_heads)
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
    )


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


def _same_length_pair(
    model: Model,
    clean: str | Tensor | Sequence[int],
    corrupt: str | Tensor | Sequence[int],
    prepend_bos: bool | None = None,
) -> tuple[Any, Any]:
    """The tokenizations of the clean and corrupted texts, which must have as many tokens."""
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
) -> tuple[dict[int, Tensor], list[_Branch], tuple[int, int]]:
    """``(replacements, branches, shape)`` of a patching grid from the clean and corrupted
    activations (layer → activation without its batch dimension); for ``by="dest-src"``
    the replacements are the patterns of ``heads`` alone ``[h_patched, s, s]``."""
    clean, corrupted = activations
    if heads is None:
        shape = (1 if by == "position" else len(layers), count)
        return clean, _changed_branches(by, layers, count, clean, corrupted, dim), shape
    # Each destination's row of the pattern, in the heads patched: [h_patched, s, s].
    clean = {layer: t[heads] for layer, t in clean.items()}
    corrupted = {layer: t[heads] for layer, t in corrupted.items()}
    return clean, _changed_cells(layers, count, clean, corrupted), (count, count)


def _encoder_decoder_ablation(
    model: Model, source: str, target: str | None, mean_over: Sequence[str] | None, layers: Sequence[int] | None
) -> InterventionEffects:
    """:func:`head_ablation` of an encoder–decoder, after checking what it takes."""
    from attnkit.inspect.encoder_decoder_ablation import encoder_decoder_head_ablation

    if target is None or mean_over is not None:
        raise ValueError(
            f"{model.name} is an encoder-decoder: give the target text its decoder predicts; "
            "it ablates heads to zero only (no mean_over)"
        )
    return InterventionEffects(**encoder_decoder_head_ablation(model, source, target, layers=layers))


def _encoder_decoder_patching(
    model: Model,
    sources: tuple[str, str],
    by: str,
    component: str | None,
    metric: str | MetricFunction | None,
    tokens: tuple[str | None, str | None],
    layers: Sequence[int] | None,
) -> InterventionEffects:
    """:func:`activation_patching` of an encoder–decoder (``sources``: clean and corrupted;
    ``tokens``: the target text and the wrong token), after checking what it takes."""
    from attnkit.inspect.encoder_decoder_ablation import encoder_decoder_activation_patching

    target, wrong = tokens
    if by != "head" or component not in (None, "z") or metric not in (None, "log-p") or target is None or wrong:
        raise ValueError(
            f"{model.name} is an encoder-decoder: it patches each head's z (by='head') and measures log p of "
            "the target text its decoder predicts (give target=, no wrong token)"
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


def _check_where(by: str, component: str | None) -> str:
    """The component to patch (its default for ``by``), after checking both."""
    if by not in BY:
        raise ValueError(f"by must be one of {', '.join(map(repr, BY))}, got {by!r}")
    if by == "dest-src":
        if component not in (None, "pattern"):
            raise ValueError(f"by='dest-src' patches cells of the pattern; it takes no component {component!r}")
        return "pattern"
    if component is None:
        return "z" if by == "head" else "resid_pre"
    if component not in COMPONENTS:
        raise ValueError(f"component must be one of {', '.join(map(repr, COMPONENTS))}, got {component!r}")
    if by == "head" and component not in PER_HEAD:
        raise ValueError(
            f"patching by head needs a per-head component ({', '.join(map(repr, PER_HEAD))}); "
            f"{component!r} is one vector per position: patch it by 'layer-position' or 'position'"
        )
    return component


def _check_metric(model: Model, metric: str | MetricFunction | None, target: str | None, wrong: str | None) -> str:
    """The metric's name (``"function"`` for a function), after checking that it fits the
    model and the tokens given."""
    if metric is None:
        metric = "logit-diff" if model.causal else "cosine"
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


def _token_ids(model: Model, metric: str, target: str | None, wrong: str | None) -> tuple[int | None, int | None]:
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
    metric: str | MetricFunction | None,
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
        assert target_id is not None and wrong_id is not None  # checked by _token_ids
        return f"logit difference {target!r} - {wrong!r}", lambda out: out[:, target_id] - out[:, wrong_id]
    if name == "log-p":
        assert target_id is not None  # checked by _token_ids
        return f"log p({target!r})", lambda out: torch.log_softmax(out, dim=-1)[:, target_id]
    if name == "cosine":
        reference = targets.sentence_embedding(clean_output)[0]
        return "cosine to the clean sentence embedding", lambda out: targets.cosine_to(
            targets.sentence_embedding(out), reference
        )
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


def _final_output(model: Model, out: Tensor) -> Tensor:
    """What a metric reads of a run: next-token logits at the last position ``[b, v]``
    (causal models, from logits ``[b, s, v]``) or the last hidden states ``[b, s, e]``
    (encoders), float32."""
    return out[:, -1].float() if model.causal else out.float()


def _hook_point(model: Model, component: str, layer: int) -> str:
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
        chains: dict[str, list[Callable[[Tensor], Tensor]]] = {}
        offset = 1  # row 0 is the unaltered run
        for branch in group:
            variants = torch.tensor(branch.variants)
            chains.setdefault(model.hook_name("resid_pre", branch.start), []).append(_branch(len(branch.variants)))
            rows_of = torch.arange(offset, offset + len(variants))
            for layer in branch.layers:
                patch = (
                    _patch(rows_of, variants, replacements[layer], dim)
                    if cell_heads is None
                    else _patch_cells(rows_of, cell_heads, branch.row, variants, replacements[layer])
                )
                chains.setdefault(points[layer], []).append(patch)
            offset += len(variants)
        with torch.no_grad():
            run = model.run_with_hooks(ids, hooks={name: _chained(fns) for name, fns in chains.items()}, logits=False)
            values = measure(_final_output_of_hidden(model, run.last_hidden_state)).double()  # [offset]
        base, offset = values[0].cpu(), 1
        for branch in group:
            grid[branch.row, list(branch.variants)] = values[offset : offset + len(branch.variants)].cpu()
            offset += len(branch.variants)
    return base, grid


def _final_output_of_hidden(model: Model, hidden: Tensor) -> Tensor:
    """:func:`_final_output` from the last hidden states ``[b, s, e]``: the head runs on the
    last position only (a batch of many rows saves the vocabulary projection of the rest)."""
    return targets.last_logits(model, hidden) if model.causal else hidden.float()


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


def _chained(fns: Sequence[Callable[[Tensor], Tensor]]) -> Callable[[Tensor], Tensor]:
    """The hooks of one point, applied in order."""

    def hook(x: Tensor) -> Tensor:
        for fn in fns:
            x = fn(x)
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
