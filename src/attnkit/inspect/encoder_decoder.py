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

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnkit.inspect import heads as H
from attnkit.inspect.maps import LEVELS, AttentionMap, readable_sequence
from attnkit.inspect.survey import HeadSurvey
from attnkit.inspect.tokens import ReadableToken
from attnkit.models.model.encoder_decoder import ATTENTION_KINDS, EncoderDecoderRun, network
from attnkit.nn import MultiHeadAttention

# What the maps of an encoder–decoder may show: the weights, or value-weighted
# cross-attention ‖α_ij · f(x_j)‖ with x the encoder's output.
ENCODER_DECODER_METHODS = ("raw", "value")


def value_weighted_cross(model: Any, run: EncoderDecoderRun, layer: int) -> Tensor:
    """Value-weighted cross-attention (Kobayashi et al., 2020) of one decoder layer:
    ``‖α_ij · f_h(x_j)‖`` with ``x`` the encoder's output and ``f_h(x) = x W_V^h W_O^h`` what
    source token ``j`` sends through head ``h``.

    Args:
        model: an encoder–decoder :class:`attnkit.models.Model`.
        run: its run, with the cross-attention of ``layer`` (every head).
        layer: a decoder layer, ``0 .. L-1``.

    Returns:
        ``[h, s_tgt, s_src]`` float32, for the heads of ``run.heads["cross"]``.

    Raises:
        KeyError: the run has no cross-attention of ``layer``.
    """
    attn = network(model).decoder.layers[layer].cross_attn
    assert isinstance(attn, MultiHeadAttention)  # every decoder layer of an encoder-decoder has one
    h, d = attn.num_heads, attn.head_dim
    memory = run.encoder_last_hidden_state[0].to(attn.v_proj.weight)  # [s_src, e]
    with torch.no_grad():
        v = attn.v_proj(memory).double().view(-1, attn.num_kv_heads, d).transpose(0, 1)  # [h_kv, s_src, d]
    heads = run.heads["cross"]
    v = v.repeat_interleave(h // v.shape[0], dim=0)[heads]  # [h_sel, s_src, d]
    w_o = attn.out_proj.weight.double().view(-1, h, d).permute(1, 2, 0)[heads]  # [h_sel, d, e]
    norms = (v @ w_o).norm(dim=-1)  # [h_sel, s_src]
    alpha = run.cross_attentions[layer][0].double()  # [h_sel, s_tgt, s_src]
    return (alpha * norms[:, None, :]).float()


def encoder_decoder_map(
    model: Any,
    run: EncoderDecoderRun,
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
        run: from :meth:`attnkit.models.Model.run_encoder_decoder`, with that layer's weights.
        attention: ``"encoder"``, ``"decoder"`` or ``"cross"``.
        layer: an encoder layer for ``"encoder"``, a decoder layer otherwise (negative
            from the end).
        heads: heads among ``run.heads[attention]`` (default all of them).
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
    if method not in ENCODER_DECODER_METHODS:
        raise ValueError(f"encoder-decoder maps show {' or '.join(ENCODER_DECODER_METHODS)}, got method={method!r}")
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
    held = run.heads[attention]
    missing = [h for h in heads or () if h not in held]
    if missing:
        raise ValueError(f"head {missing[0]} of the {attention} attention was not computed; this run has heads {held}")
    positions = list(range(len(held))) if heads is None else [held.index(h) for h in heads]
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
        model_name=model.name,
        text=rows_text,
        tokens=list(row_tokens),
        labels=[t.label for t in rows],
        layer=index,
        num_layers=depth,
        heads=[held[p] for p in positions],
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


# Statistics of cross-attention heads (rows attend to another sequence: distances, the
# previous token and the token itself mean nothing there).
CROSS_STATISTICS = ("entropy", "first", "last")
# The alignments `attnkit heads --align` knows by name: source word i aligned with target
# word i (copy), or with the mirror word (reverse).
NAMED_ALIGNMENTS = ("diagonal", "anti-diagonal")

Alignment = list[tuple[int, int]]


def read_alignments(spec: str, count: int) -> list[Alignment | str]:
    """The word alignments of ``count`` source/target pairs.

    Args:
        spec: ``"diagonal"`` or ``"anti-diagonal"`` (the same for every pair, sized to
            each pair's words), or a file in the Pharaoh format of word aligners
            (fast_align, eflomal): one line per pair, ``i-j`` pairs of a source word index
            and a target word index, from 0, separated by spaces (``0-0 1-2 2-1``).
        count: the number of pairs.

    Returns:
        Per pair, the ``(source word, target word)`` links, or the name.

    Raises:
        ValueError: a file with another number of lines, or a link that is not ``i-j``.
        OSError: an unreadable file.
    """
    if spec in NAMED_ALIGNMENTS:
        return [spec] * count
    lines = Path(spec).read_text(encoding="utf-8").splitlines()
    lines = lines[:count] if len(lines) > count and not any(line.strip() for line in lines[count:]) else lines
    if len(lines) != count:
        raise ValueError(f"--align {spec} has {len(lines)} lines for {count} source/target pairs; give one per pair")
    out: list[Alignment | str] = []
    for number, line in enumerate(lines, 1):
        links = []
        for link in line.split():
            parts = link.split("-")
            if len(parts) != 2 or not all(p.isdigit() for p in parts):
                raise ValueError(
                    f"--align {spec}, line {number}: links are source-target word indices like 0-1, got {link!r}"
                )
            links.append((int(parts[0]), int(parts[1])))
        out.append(links)
    return out


def alignment_hits(
    cross: Tensor, source_words: int, target_words: int, alignment: Alignment | str
) -> tuple[Tensor, int]:
    """How many aligned target words each head attends to most on an aligned source word.

    Args:
        cross: word-level cross-attention ``[layers, heads, w_tgt, w_src]`` between the
            words of the texts (their special tokens left out).
        source_words: ``w_src``.
        target_words: ``w_tgt``.
        alignment: ``(source word, target word)`` links, or a name of
            :data:`NAMED_ALIGNMENTS`.

    Returns:
        ``(hits [layers, heads], aligned target words)``.

    Raises:
        ValueError: a link outside the words, an unknown name.
    """
    if isinstance(alignment, str):
        if alignment not in NAMED_ALIGNMENTS:
            raise ValueError(f"alignment names are {', '.join(NAMED_ALIGNMENTS)}, got {alignment!r}")
        n = min(source_words, target_words)
        reverse = alignment == "anti-diagonal"
        alignment = [(source_words - 1 - i if reverse else i, i) for i in range(n)]
    aligned: dict[int, set[int]] = {}
    for src, tgt in alignment:
        if not (0 <= src < source_words and 0 <= tgt < target_words):
            raise ValueError(
                f"alignment link {src}-{tgt} is outside the {source_words} source and {target_words} target words"
            )
        aligned.setdefault(tgt, set()).add(src)
    top = cross.argmax(-1)  # [layers, heads, w_tgt]
    hits = torch.zeros(cross.shape[:2])
    for tgt, sources in aligned.items():
        hits += torch.isin(top[..., tgt], torch.tensor(sorted(sources))).float()
    return hits, len(aligned)


def survey_encoder_decoder(
    model: Any,
    pairs: Sequence[tuple[str, str | None]],
    *,
    attention: str = "cross",
    alignments: Sequence[Alignment | str] | None = None,
    max_new_tokens: int = 32,
) -> HeadSurvey:
    """Per-head statistics of one kind of attention of an encoder–decoder over
    source/target pairs (a target ``None`` is generated greedily).

    Self-attention (``"encoder"``, ``"decoder"``) has the statistics of
    :mod:`attnkit.inspect.heads`; cross-attention the entropy, the mass on the first source
    token and on the last (the end-of-sequence token most sources end with), and with
    ``alignments`` the alignment score: the fraction of aligned target words whose
    most-attended source word is an aligned one, words being those of the texts
    (:func:`attnkit.inspect.words.word_groups`, special tokens left out).

    Args:
        model: an encoder–decoder :class:`attnkit.models.Model`.
        pairs: ``(source, target)`` texts.
        attention: ``"encoder"``, ``"decoder"`` or ``"cross"``.
        alignments: one per pair (:func:`read_alignments`), cross-attention only.
        max_new_tokens: the most tokens of a generated target.

    Returns:
        :class:`attnkit.inspect.survey.HeadSurvey` with ``attention`` set; its layers are
        the encoder's for ``"encoder"``, the decoder's otherwise.

    Raises:
        ValueError: no pairs, an unknown kind, alignments with another kind or another
            number of pairs, texts the model refuses.
    """
    if not pairs:
        raise ValueError("give at least one source text")
    if attention not in ATTENTION_KINDS:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION_KINDS)}, got {attention!r}")
    if alignments is not None and (attention != "cross" or len(alignments) != len(pairs)):
        raise ValueError(
            f"alignments go with cross-attention, one per source/target pair; got {len(alignments)} for "
            f"{len(pairs)} pairs and attention={attention!r}"
        )
    encoder = attention == "encoder"
    totals: dict[str, Tensor] = {}
    hits, aligned, tokens = None, 0, 0
    for number, (source, target) in enumerate(pairs):
        run = model.run_encoder_decoder(
            source, target, encoder_layers=encoder, decoder_layers=not encoder, max_new_tokens=max_new_tokens
        )
        maps = run.attentions(attention)
        weights = torch.cat([maps[layer] for layer in sorted(maps)]).float()  # [layers, heads, s_q, s_k]
        tokens += weights.shape[-2]
        if attention == "cross":
            statistics = {
                "entropy": -(torch.special.xlogy(weights, weights).sum(-1) / math.log(2)).mean(-1),
                "first": weights[..., 0].mean(-1),
                "last": weights[..., -1].mean(-1),
            }
        else:
            statistics = H.head_statistics(weights)
        for name, values in statistics.items():
            totals[name] = values if name not in totals else totals[name] + values
        if alignments is not None:
            words = encoder_decoder_map(model, run, attention="cross", layer=0, level="word")
            keep_rows = [i for i, w in enumerate(words.words or []) if w.span is not None]
            keep_cols = [i for i, w in enumerate(words.key_words or []) if w.span is not None]
            cross = torch.stack(
                [encoder_decoder_map(model, run, layer=layer, level="word").weights for layer in sorted(maps)]
            )[..., keep_rows, :][..., keep_cols]  # [layers, heads, w_tgt, w_src]
            found, count = alignment_hits(cross, len(keep_cols), len(keep_rows), alignments[number])
            hits = found if hits is None else hits + found
            aligned += count
    statistics = {name: total / len(pairs) for name, total in totals.items()}
    if hits is not None:
        if aligned == 0:
            raise ValueError("the alignments link no target word; nothing to score")
        statistics["alignment"] = hits / aligned
    depth = model.num_layers if encoder else model.num_decoder_layers
    return HeadSurvey(
        model_name=model.name,
        num_layers=depth,
        num_heads=model.heads_per_kind[attention],
        texts=len(pairs),
        tokens=tokens,
        statistics=statistics,
        induction_period=0,
        induction_seed=0,
        attention=attention,
    )
