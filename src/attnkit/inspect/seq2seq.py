"""The three kinds of attention of an encoder–decoder (T5, BART, the toy models of
``attnkit train``) as :class:`~attnkit.inspect.maps.AttentionMap` s: the encoder's
self-attention over the source, the decoder's masked self-attention over the target, and
the cross-attention from each target token (rows) to every source token (columns).

Shape letters: ``h`` heads, ``s_src`` source tokens, ``s_tgt`` target tokens, ``e`` model
dim.

Rows of decoder maps are the target tokens, each the token its position produces; the
columns of the decoder's self-attention are what each position reads: the decoder start
token, then the target but its last token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from attnkit.inspect.maps import LEVELS, AttentionMap, readable_sequence
from attnkit.inspect.tokens import ReadableToken
from attnkit.models.encoder_decoder import ATTENTION_KINDS, Seq2SeqRun, network
from attnkit.nn import MultiHeadAttention

# What the maps of an encoder–decoder may show: the weights, or value-weighted
# cross-attention ‖α_ij · f(x_j)‖ with x the encoder's output.
SEQ2SEQ_METHODS = ("raw", "value")


def value_weighted_cross(model: Any, run: Seq2SeqRun, layer: int) -> Tensor:
    """Value-weighted cross-attention (Kobayashi et al., 2020) of one decoder layer:
    ``‖α_ij · f_h(x_j)‖`` with ``x`` the encoder's output and ``f_h(x) = x W_V^h W_O^h`` what
    source token ``j`` sends through head ``h``.

    Args:
        model: an encoder–decoder :class:`attnkit.models.Model`.
        run: its run, with the cross-attention of ``layer`` (every head).
        layer: a decoder layer, ``0 .. L-1``.

    Returns:
        ``[h, s_tgt, s_src]`` float32, for the heads of ``run.heads``.

    Raises:
        KeyError: the run has no cross-attention of ``layer``.
    """
    attn = network(model).decoder.layers[layer].cross_attn
    assert isinstance(attn, MultiHeadAttention)  # every decoder layer of an encoder-decoder has one
    h, d = attn.num_heads, attn.head_dim
    memory = run.encoder_hidden_states[0].to(attn.v_proj.weight)  # [s_src, e]
    with torch.no_grad():
        v = attn.v_proj(memory).double().view(-1, attn.num_kv_heads, d).transpose(0, 1)  # [h_kv, s_src, d]
    v = v.repeat_interleave(h // v.shape[0], dim=0)[run.heads]  # [h_sel, s_src, d]
    w_o = attn.out_proj.weight.double().view(-1, h, d).permute(1, 2, 0)[run.heads]  # [h_sel, d, e]
    norms = (v @ w_o).norm(dim=-1)  # [h_sel, s_src]
    alpha = run.cross_attentions[layer][0].double()  # [h_sel, s_tgt, s_src]
    return (alpha * norms[:, None, :]).float()


def seq2seq_map(
    model: Any,
    run: Seq2SeqRun,
    *,
    attention: str = "cross",
    layer: int = -1,
    heads: Sequence[int] | None = None,
    level: str = "token",
    method: str = "raw",
) -> AttentionMap:
    """One layer's map of one kind of attention of an encoder–decoder run.

    Args:
        model: the :class:`attnkit.models.Model` that ran.
        run: from :meth:`attnkit.models.Model.run_seq2seq`, with that layer's weights.
        attention: ``"encoder"``, ``"decoder"`` or ``"cross"``.
        layer: an encoder layer for ``"encoder"``, a decoder layer otherwise (negative
            from the end).
        heads: heads among ``run.heads`` (default all of them).
        level: ``"token"``, or ``"word"`` for the attention between words, on both sides.
        method: ``"raw"``, or ``"value"`` (value-weighted, cross-attention only).

    Returns:
        :class:`~attnkit.inspect.maps.AttentionMap`; a cross map's ``text`` is the target
        (rows) and its ``key_text`` the source (columns).

    Raises:
        ValueError: an unknown kind, level or method, ``"value"`` with another kind than
            cross-attention, a layer or head the run does not hold.
    """
    if attention not in ATTENTION_KINDS:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION_KINDS)}, got {attention!r}")
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
    if method not in SEQ2SEQ_METHODS:
        raise ValueError(f"an encoder-decoder's maps show {' or '.join(SEQ2SEQ_METHODS)}, got method={method!r}")
    if method == "value" and attention != "cross":
        raise ValueError("value-weighted maps of an encoder-decoder are computed for cross-attention only")
    maps = run.attentions(attention)
    depth = maps.num_layers
    index = layer + depth if -depth <= layer < 0 else layer
    if index not in maps:
        raise ValueError(
            f"layer {layer} of the {attention} attention was not computed; this run has layers {sorted(maps)} "
            f"of 0..{depth - 1}"
        )
    positions = list(range(len(run.heads))) if heads is None else [run.heads.index(h) for h in heads]
    weights = (value_weighted_cross(model, run, index) if method == "value" else maps[index][0])[positions]
    source_text, source = readable_sequence(
        model, run.source_tokens, run.source_ids, run.source_offsets, run.source_text
    )
    target_text, target = readable_sequence(
        model,
        run.target_tokens,
        run.target_ids,
        run.target_offsets,
        run.target_text if run.target_offsets is not None else None,
    )
    rows_text, rows, row_tokens = (source_text, source, run.source_tokens)
    columns: tuple[str, list[ReadableToken], list[str]] | None = None
    if attention == "cross":
        rows_text, rows, row_tokens = target_text, target, run.target_tokens
        columns = (source_text, source, run.source_tokens)
    elif attention == "decoder":
        rows_text, rows, row_tokens = target_text, target, run.target_tokens
        start = ReadableToken(run.decoder_input_tokens[0], run.decoder_input_tokens[0], None, special=True)
        columns = (target_text, [start, *target[:-1]], run.decoder_input_tokens)
    amap = AttentionMap(
        model=model.name,
        text=rows_text,
        tokens=list(row_tokens),
        labels=[t.label for t in rows],
        layer=index,
        num_layers=depth,
        heads=[run.heads[p] for p in positions],
        weights=weights,
        readable=rows,
        causal=attention == "decoder",
        method=method,
        attention=attention,
        key_text=None if columns is None else columns[0],
        key_tokens=None if columns is None else list(columns[2]),
        key_labels=None if columns is None else [t.label for t in columns[1]],
        key_readable=None if columns is None else columns[1],
    )
    return amap.by_words() if level == "word" else amap
