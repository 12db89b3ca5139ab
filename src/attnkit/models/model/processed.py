"""TransformerLens' processed weights of a pre-norm language model, computed from the raw
ones (:mod:`attnkit.models.model.lens`) for those who multiply weights by hand: the norms'
weights (and LayerNorm's biases) folded into the weights that read the normalised stream,
the weights writing to the stream and the unembedding centred, the value biases folded into
the output bias. The model itself, its activations, the logit lens and logit attribution are
unchanged: this is a separate set of tensors.

The steps, in TransformerLens' order, and the norms they apply to:

``fold_ln``
    Every norm in front of a projection (each layer's two, the final one) becomes a
    normalisation without weight: ``norm(x) @ W + b = pre(x) @ W' + b'`` with ``W' = w ⊙ W``
    (the norm's weight ``w``, ``1 + w`` in Gemma), ``b' = b + β @ W`` (LayerNorm's bias
    ``β``; RMSNorm has none), where ``pre(x)`` is ``(x - mean(x)) / scale`` for LayerNorm
    (TransformerLens' ``LNPre``) and ``x / scale`` for RMSNorm (``RMSPre``), ``scale`` what
    the norm's ``scale`` hook point records. After LayerNorm the reading weights are also
    centred over the model dim (``pre(x)`` has mean zero, so this changes nothing).
``center_writing_weights``
    LayerNorm only (every reader of the stream removes its mean): ``W_E``, ``W_pos``,
    ``W_O``, ``b_O``, ``W_out`` and ``b_out`` less their mean over the model dim. Every
    stream, and each block's output, then has mean zero: they are the originals less their
    mean. Skipped for RMSNorm, which does not remove it (as TransformerLens does).
``center_unembed``
    ``W_U`` and ``b_U`` less their mean over the vocabulary: each position's logits less
    their mean, the same log-probabilities (not so after a final soft-capping, Gemma 2's,
    which is not shift-invariant).
``fold_value_biases``
    ``b_O' = b_O + Σ_h b_V[h] @ W_O[h]`` and ``b_V' = 0``: every pattern row sums to one, so
    a value bias adds the same vector at every position.

Shape letters: ``L`` layers, ``h`` query heads, ``h_kv`` key/value heads, ``e`` model dim,
``d`` head dim, ``f`` feed-forward hidden dim, ``v`` vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor, nn

from attnkit.nn import DecoderLM, LayerNorm, RMSNorm
from attnkit.nn.text_module import TextModule


class _RawWeights(Protocol):
    """What processing reads of a model (:class:`attnkit.models.model.lens.LensMixin`):
    these attributes, and the raw weights by the names of :data:`WEIGHT_NAMES`."""

    name: str
    family: str
    module: TextModule
    num_heads: int


# The weights and biases of a ProcessedWeights, TransformerLens' names.
WEIGHT_NAMES = (
    "W_E", "W_pos", "W_Q", "W_K", "W_V", "W_O", "W_in", "W_gate", "W_out", "W_U",
    "b_Q", "b_K", "b_V", "b_O", "b_in", "b_out", "b_U",
)  # fmt: skip


@dataclass(frozen=True)
class ProcessedWeights:
    """A model's weights as TransformerLens processes them (:func:`processed_weights`), with
    the raw weights' names and shapes (:mod:`attnkit.models.model.lens`).

    Attributes:
        W_E, W_pos, W_Q, W_K, W_V, W_O, W_in, W_gate, W_out, W_U: ``W_pos`` and ``W_gate``
            ``None`` where the family has none.
        b_Q, b_K, b_V, b_O, b_in, b_out, b_U: the biases (zeros where the family has none).
        applied: the steps applied, in order (a step asked for that does not apply to the
            model's norm is left out: ``center_writing_weights`` after RMSNorm).
        norm: how the stream is normalised before the folded weights read it:
            ``"layer_pre"`` (``(x - mean(x)) / scale``) or ``"rms_pre"`` (``x / scale``)
            with ``fold_ln``, ``None`` without (the model's norms, weights included).
    """

    W_E: Tensor  # noqa: N815 (TransformerLens' names)
    W_pos: Tensor | None  # noqa: N815
    W_Q: Tensor  # noqa: N815
    W_K: Tensor  # noqa: N815
    W_V: Tensor  # noqa: N815
    W_O: Tensor  # noqa: N815
    W_in: Tensor  # noqa: N815
    W_gate: Tensor | None  # noqa: N815
    W_out: Tensor  # noqa: N815
    W_U: Tensor  # noqa: N815
    b_Q: Tensor  # noqa: N815
    b_K: Tensor  # noqa: N815
    b_V: Tensor  # noqa: N815
    b_O: Tensor  # noqa: N815
    b_in: Tensor  # noqa: N815
    b_out: Tensor  # noqa: N815
    b_U: Tensor  # noqa: N815
    applied: tuple[str, ...]
    norm: str | None


@dataclass(frozen=True)
class _Norms:
    """The norms of a pre-norm stack: ``(weight [L, e], bias [L, e] or None)`` before each
    layer's attention and feed-forward, the final one's ``(weight [e], bias [e] or None)``,
    and whether they are LayerNorms."""

    attention: tuple[Tensor, Tensor | None]
    feed_forward: tuple[Tensor, Tensor | None]
    final: tuple[Tensor, Tensor | None]
    layer_norm: bool


def processed_weights(
    model: _RawWeights,
    *,
    fold_ln: bool = True,
    center_writing_weights: bool = True,
    center_unembed: bool = True,
    fold_value_biases: bool = True,
) -> ProcessedWeights:
    """The weights of ``model`` processed as TransformerLens' ``from_pretrained`` does by
    default (each step can be turned off; the module docstring defines them). Computed in
    float32 (float64 for a float64 model) and returned in the weights' dtype.

    Raises:
        ValueError: a model that is not a pre-norm decoder with attnkit's LayerNorm or
            RMSNorm (post-norm BERT, a bridged model), that has no language-model head,
            latent attention or a mixture of experts (no per-layer matrices), or a
            LayerNorm bias to fold into a gated feed-forward (no gate bias to hold it).
    """
    dtype = next(model.module.parameters()).dtype
    work = torch.float64 if dtype == torch.float64 else torch.float32
    norms = _pre_norms(model, work)
    raw = {name: getattr(model, name) for name in WEIGHT_NAMES}
    w = {name: t.to(work) for name, t in raw.items() if t is not None}  # W_pos, W_gate may be absent
    applied = []
    if fold_ln:
        _fold_norms(w, norms)
        applied.append("fold_ln")
    if center_writing_weights and norms.layer_norm:
        for name in ("W_E", "W_pos", "W_O", "b_O", "W_out", "b_out"):
            if name in w:
                w[name] = w[name] - w[name].mean(-1, keepdim=True)
        applied.append("center_writing_weights")
    if center_unembed:
        w["W_U"] = w["W_U"] - w["W_U"].mean(-1, keepdim=True)
        w["b_U"] = w["b_U"] - w["b_U"].mean()
        applied.append("center_unembed")
    if fold_value_biases:
        value_bias = w["b_V"].repeat_interleave(model.num_heads // w["b_V"].shape[1], dim=1)  # [L, h, d]
        w["b_O"] = w["b_O"] + torch.einsum("lhd,lhde->le", value_bias, w["W_O"])
        w["b_V"] = torch.zeros_like(w["b_V"])
        applied.append("fold_value_biases")
    done = {name: w[name].to(dtype) if name in w else None for name in WEIGHT_NAMES}
    norm = ("layer_pre" if norms.layer_norm else "rms_pre") if fold_ln else None
    return ProcessedWeights(**done, applied=tuple(applied), norm=norm)  # type: ignore[arg-type]


def _fold_norms(w: dict[str, Tensor], norms: _Norms) -> None:
    """``fold_ln`` on the working copies ``w``, in place."""
    for names, (weight, bias) in (
        (("Q", "K", "V"), norms.attention),
        (("in", "gate"), norms.feed_forward),
    ):
        for suffix in names:
            if f"W_{suffix}" not in w:
                continue
            matrix = w[f"W_{suffix}"]  # [L, heads, e, d] or [L, e, f]
            per_head = matrix.ndim == 4
            scale = weight[:, None, :, None] if per_head else weight[:, :, None]
            if bias is not None:
                if suffix == "gate":
                    raise ValueError(
                        "a LayerNorm bias before a gated feed-forward cannot be folded: the gate projection has no "
                        "bias to take it"
                    )
                spread = bias[:, None, :, None] if per_head else bias[:, :, None]
                w[f"b_{suffix}"] = w[f"b_{suffix}"] + (matrix * spread).sum(-2)
            folded = matrix * scale
            w[f"W_{suffix}"] = folded - folded.mean(-2, keepdim=True) if norms.layer_norm else folded
    weight, bias = norms.final
    unembedding = w["W_U"]  # [e, v]
    if bias is not None:
        w["b_U"] = w["b_U"] + bias @ unembedding
    folded = unembedding * weight[:, None]
    w["W_U"] = folded - folded.mean(0, keepdim=True) if norms.layer_norm else folded


def _pre_norms(model: _RawWeights, dtype: torch.dtype) -> _Norms:
    """The norms of ``model``'s pre-norm stack, as tensors of ``dtype``.

    Raises:
        ValueError: not a pre-norm :class:`attnkit.nn.DecoderLM` with attnkit's norms.
    """
    module = model.module
    layers = list(module.decoder.layers) if isinstance(module, DecoderLM) else []
    final = module.decoder.final_norm if isinstance(module, DecoderLM) else None
    norms = [final] + [n for layer in layers for n in (layer.self_attn_norm, layer.ff_norm)]
    kinds: set[type] = {type(n) for n in norms}
    known: set[type] = {LayerNorm, RMSNorm}
    if not layers or not all(layer.norm_first for layer in layers) or len(kinds) != 1 or kinds - known:
        raise ValueError(
            f"processed weights need a pre-norm decoder whose norms are all LayerNorm or all RMSNorm, as "
            f"TransformerLens folds them; {model.name} ({model.family}) is not one"
        )

    def parts(norm: nn.Module | None) -> tuple[Tensor, Tensor | None]:
        assert isinstance(norm, (LayerNorm, RMSNorm))
        weight = norm.weight.detach().to(dtype)
        if getattr(norm, "plus_one", False):
            weight = 1.0 + weight
        bias = getattr(norm, "bias", None)
        return weight, None if bias is None else bias.detach().to(dtype)

    def stacked(which: str) -> tuple[Tensor, Tensor | None]:
        pairs = [parts(getattr(layer, which)) for layer in layers]
        biases = [b for _, b in pairs if b is not None]
        return torch.stack([wt for wt, _ in pairs]), torch.stack(biases) if len(biases) == len(pairs) else None

    return _Norms(stacked("self_attn_norm"), stacked("ff_norm"), parts(final), layer_norm=LayerNorm in kinds)
