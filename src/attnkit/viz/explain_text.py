"""Render an :class:`attnkit.inspect.explain.Explanation` as text for an 80-column terminal."""

from __future__ import annotations

import math

from attnkit.inspect.explain import Explanation, QueryStep
from attnkit.viz.terminal import fmt, fmt_compact, fmt_vector, format_table, table_width

WIDTH = 80
# Show "1×1 + 0×1 + …" for the dot products only while it stays short enough to read.
MAX_EXPANDED_DIM = 6


def render_explanation(expl: Explanation) -> str:
    inputs = expl.inputs
    n_k, d = inputs.k.shape
    kind = "scaled dot-product" if expl.score == "scaled_dot" else "dot-product (Luong, unscaled)"
    header = [
        f"Attention, step by step: {kind}{', causal' if expl.causal else ''}",
        f"{n_k} key tokens, d_k = {d}, scale = {_scale_text(expl)}",
        "",
        "Step 0. Q, K and V, one row per token",
        *_qkv_tables(expl),
    ]
    sections = ["\n".join(header)]
    sections += [_query_section(expl, step) for step in expl.steps]
    if len(expl.steps) > 1:
        sections.append(_weights_matrix(expl))
    sections.append("Summary of shapes\n" + format_table(["step", "operation", "shape"], expl.shapes, "<<<"))
    return "\n\n".join(sections) + "\n"


def _scale_text(expl: Explanation) -> str:
    d = expl.inputs.k.shape[1]
    return f"1/√{d} = {fmt(expl.scale)}" if expl.score == "scaled_dot" else "1 (no scaling)"


def _qkv_tables(expl: Explanation) -> list[str]:
    inputs = expl.inputs
    same_tokens = inputs.query_tokens == inputs.key_tokens
    if same_tokens:
        rows = [
            [
                tok,
                fmt_vector(inputs.q[i].tolist(), True),
                fmt_vector(inputs.k[i].tolist(), True),
                fmt_vector(inputs.v[i].tolist(), True),
            ]
            for i, tok in enumerate(inputs.key_tokens)
        ]
        table = format_table(["token", "Q", "K", "V"], rows, "<<<<")
        if table_width(table) <= WIDTH:
            return [table]
    tables = []
    for name, tokens, matrix in (
        ("Q", inputs.query_tokens, inputs.q),
        ("K", inputs.key_tokens, inputs.k),
        ("V", inputs.key_tokens, inputs.v),
    ):
        rows = [[tok, fmt_vector(matrix[i].tolist(), True)] for i, tok in enumerate(tokens)]
        tables.append(format_table(["token", name], rows, "<<"))
    return ["\n\n".join(tables)]


def _query_section(expl: Explanation, step: QueryStep) -> str:
    inputs = expl.inputs
    q_row = inputs.q[step.index].tolist()
    n_k, d = inputs.k.shape
    lines = [f'Query "{step.token}" (row {step.index}): q = {fmt_vector(q_row, True)}', ""]

    lines.append(f"Step 1. Scores q · kᵢ: (1 x {d}) × ({n_k} x {d})ᵀ → (1 x {n_k})")
    rows = []
    for j, tok in enumerate(inputs.key_tokens):
        terms = " + ".join(f"{fmt_compact(a)}×{fmt_compact(b)}" for a, b in zip(q_row, inputs.k[j].tolist()))
        rows.append([tok, terms, fmt(step.scores[j])])
    table = format_table(["key", "q · kᵢ", "score"], rows, "<<>")
    if d > MAX_EXPANDED_DIM or table_width(table) > WIDTH:
        table = format_table(["key", "score"], [[r[0], r[2]] for r in rows])
    lines += [table, ""]

    scale_title = (
        f"divide by √d_k = {fmt_compact(1 / expl.scale)}"
        if expl.score == "scaled_dot"
        else "none for dot scores (scale 1)"
    )
    lines.append(f"Step 2. Scale: {scale_title}")
    rows = [
        [tok, fmt(step.scores[j]), fmt(step.scaled[j]) if step.allowed[j] else "masked"]
        for j, tok in enumerate(inputs.key_tokens)
    ]
    lines += [format_table(["key", "score", "scaled"], rows), ""]

    lines.append("Step 3. Softmax: weightᵢ = exp(scaledᵢ) / Σ exp(scaled)")
    exps = [_exp(step, j) for j in range(n_k)]
    rows = [
        [tok, fmt(step.scaled[j]) if step.allowed[j] else "masked", fmt(exps[j]), fmt(step.weights[j])]
        for j, tok in enumerate(inputs.key_tokens)
    ]
    rows.append(["sum", "", fmt(sum(exps)), fmt(sum(step.weights))])
    lines += [format_table(["key", "scaled", "exp", "weight"], rows), ""]

    lines.append(
        f"Step 4. Weighted sum Σ weightᵢ × vᵢ: (1 x {n_k}) × ({n_k} x {inputs.v.shape[1]}) → (1 x {inputs.v.shape[1]})"
    )
    rows = []
    for j, tok in enumerate(inputs.key_tokens):
        v_row = inputs.v[j].tolist()
        rows.append(
            [tok, fmt(step.weights[j]), fmt_vector(v_row, True), fmt_vector([step.weights[j] * x for x in v_row])]
        )
    rows.append(["context", "", "", fmt_vector(step.context)])
    table = format_table(["key", "weight", "v", "weight × v"], rows, "<><<")
    if table_width(table) > WIDTH:
        table = format_table(["key", "weight", "weight × v"], [[r[0], r[1], r[3]] for r in rows], "<><")
    lines.append(table)
    return "\n".join(lines)


def _exp(step: QueryStep, j: int) -> float:
    return math.exp(step.scaled[j]) if step.allowed[j] else 0.0


def _weights_matrix(expl: Explanation) -> str:
    keys = expl.inputs.key_tokens
    rows = [[s.token] + [fmt(w) for w in s.weights] for s in expl.steps]
    table = format_table(["query \\ key", *keys], rows)
    return "Attention weights, all rows (each row sums to 1)\n" + table
