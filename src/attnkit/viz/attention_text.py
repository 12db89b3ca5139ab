"""Terminal views of real models' attention: where each token of a map attends
(``attnkit inspect``) and per-head statistics (``attnkit heads``), within 100 columns."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from attnkit.viz.terminal import counted, display_width, format_table

if TYPE_CHECKING:
    from attnkit.inspect.detectors import HeadDetection

    # Imported where they are needed: printing one map reaches none of them.
    from attnkit.inspect.interventions import InterventionEffects
    from attnkit.inspect.maps import AttentionMap
    from attnkit.inspect.survey import HeadSurvey

# Every line fits in this many columns.
WIDTH = 100

# Longer tables show their first and last rows and say how many were left out.
MAX_ROWS = 50
# Of a shortened table, the rows shown from the end.
TAIL_ROWS = 10
# At most this many tokens (or words) are listed above the tables.
MAX_LISTED = 100

# How the maps of an encoder-decoder name their kind of attention.
ATTENTION_NAMES = {
    "encoder": "encoder self-attention",
    "decoder": "decoder self-attention",
    "cross": "cross-attention (target → source)",
}

# Labels longer than this are cut with "…" so that rows stay within 100 columns.
MAX_LABEL = 14

# The compact role grid of `attnkit heads`: a head gets the first letter whose statistic
# reaches its threshold. Most heads of a language model park most of their attention on the
# first token, so that role comes last and needs a majority.
ROLES = (
    ("I", "induction", 0.3),
    ("P", "previous", 0.3),
    ("S", "self", 0.3),
    ("F", "first", 0.5),
)


def short(label: str) -> str:
    """``label`` cut to :data:`MAX_LABEL` display columns (wide characters count two)."""
    if display_width(label) <= MAX_LABEL:
        return label
    while display_width(label) > MAX_LABEL - 1:
        label = label[:-1]
    return label + "…"


def numbered(labels: Sequence[str]) -> list[str]:
    """Labels made unambiguous: a label that occurs more than once gets its
    occurrence number as a subscript (``the₁``, ``the₂``)."""
    counts = Counter(labels)
    seen: Counter[str] = Counter()
    out = []
    for label in labels:
        seen[label] += 1
        out.append(label + _subscript(seen[label]) if counts[label] > 1 else label)
    return out


def render_map(amap: AttentionMap, *, top: int = 3, max_rows: int = MAX_ROWS) -> str:
    """The tokens (or words) as they read in the text and, for each head, the keys each
    query attends to most.

    Args:
        amap: the map to show, between tokens or words.
        top: keys shown per query (those with weight 0, hidden by a causal mask, never are).
        max_rows: a longer table shows its first and last rows (the last
            :data:`TAIL_ROWS`) and a line saying which were left out; so does the list of
            tokens above the tables past :data:`MAX_LISTED`.

    Returns:
        Text ending in a newline, within :data:`WIDTH` columns.
    """
    n = len(amap.row_labels)
    first = amap.first_row
    maps = map_names(amap)
    heads = maps[0] if len(maps) == 1 else f"heads {amap.heads[0]}..{amap.heads[-1]}"
    size = f"{len(amap.tokens)} tokens" if amap.words is None else f"{n} words ({len(amap.tokens)} tokens)"
    if amap.rows is not None:
        size += f", query rows {first}..{first + n - 1}"
    method = "" if amap.method == "raw" else f" · {amap.method}"
    kind = "" if amap.attention == "self" else f" · {ATTENTION_NAMES[amap.attention]}"
    cross = amap.attention == "cross" and amap.key_tokens is not None
    if cross and amap.key_tokens is not None:
        size = f"{len(amap.key_tokens)} source × {len(amap.tokens)} target tokens"
        if amap.words is not None and amap.key_words is not None:
            size = f"{len(amap.key_words)} source × {n} target words"
    layer = f"layer {amap.layer} (0..{amap.num_layers - 1})" + (f", {amap.layer_kind}" if amap.layer_kind else "")
    lines = [f"{amap.model_name} · {layer} · {heads}{kind}{method} · {size}"]
    token_labels = [t.label for t in amap.readable] if amap.readable else list(amap.labels)
    if cross:
        source_labels = [t.label for t in amap.key_readable] if amap.key_readable else list(amap.column_labels)
        lines += wrap_items("source: ", _listed(source_labels))
        lines += wrap_items("target: ", _listed(token_labels))
    else:
        if amap.words is not None:
            lines += wrap_items("words: ", _listed([f"{w.label} ({len(w.token_indices)})" for w in amap.words]))
        lines += wrap_items("tokens: ", _listed(token_labels))
    every = [short(label) for label in numbered(amap.labels)]
    labels = every[first : first + n]
    key_labels = every if amap.key_labels is None else [short(label) for label in numbered(amap.key_labels)]
    # Between tokens a query and its keys are tokens; between words they are words.
    keys_of, query, keys = ("keys", "query", "keys") if amap.words is None else ("words", "query word", "key words")
    if cross:
        unit = "tokens" if amap.words is None else "words"
        keys_of, query, keys = f"source {unit}", f"target {unit[:-1]}", f"source {unit}"
    value = "weight" if amap.method == "raw" else amap.method
    # Weights and shares of a token lie in [0, 1]; norms and gradients have any scale.
    number = ".2f" if amap.method in ("raw", "rollout", "flow") else ".3g"
    m = len(key_labels)
    for position, name in enumerate(maps):
        weights = amap.weights[position]  # [n, m]
        shown = shown_rows(n, max_rows)
        values, indices = weights[shown].topk(min(top, m), dim=-1)  # [rows, top]
        rows = []
        for i, row_values, row_indices in zip(shown, values.tolist(), indices.tolist()):
            cells = [f"{key_labels[k]} {v:{number}}" for v, k in zip(row_values, row_indices) if v > 0]
            rows.append([str(first + i), labels[i], "  ".join(cells)])
        lines += ["", f"Layer {amap.layer}, {name}: the {keys_of} each {query} attends to most"]
        table = format_table(["#", query, f"top {top} {keys} ({value})"], rows, align="><<").splitlines()
        if len(shown) < n:
            head_rows = max_rows - TAIL_ROWS
            left_out = n - len(shown)
            note = (
                f"… {left_out} {query} rows left out ({first + head_rows}..{first + n - TAIL_ROWS - 1}); "
                "the JSON file (--format json) has every row"
            )
            table.insert(2 + head_rows, note)
        lines += table
    return "\n".join(lines) + "\n"


def render_effects(effects: InterventionEffects, *, top: int = 5) -> str:
    """Head ablation or patching effects as text: what was measured, the heads (or layers
    and positions) with the largest effects, and the grid of values, its columns split into
    blocks that fit :data:`WIDTH` columns.

    Args:
        effects: from :func:`attnkit.inspect.interventions.head_ablation` or
            :func:`~attnkit.inspect.interventions.activation_patching`.
        top: cells listed.

    Returns:
        Text ending in a newline.
    """
    from attnkit.inspect.heads import rank_heads

    by_head = effects.by == "head"
    if isinstance(effects.baseline, dict):  # patching
        where = _patched_where(effects)
        what = f"{effects.kind} {where} of {effects.texts['clean']!r} into {effects.texts['corrupt']!r}"
        baseline = f"; clean {effects.baseline['clean']:.4f}, corrupted {effects.baseline['corrupt']:.4f}"
    else:
        what = f"{effects.replacement} ablation of each head on {effects.texts['text']!r}"
        baseline = "" if effects.target is None else f"; unablated log p({effects.target!r}) = {effects.baseline:.4f}"
    lines = [f"{effects.model_name} · {what}", f"measure: {effects.metric}{baseline}", ""]
    # Ablation: the heads whose removal lowers the measure most; patching: those that restore most.
    order = rank_heads(effects.effects, top=top, descending=effects.kind != "ablation")
    rows = effects.row_labels
    if by_head:
        listed = [[rows[row], f"{column}", f"{value:+.4f}"] for row, column, value in order]
        lines += format_table(["layer", "head", "effect"], listed, align=">>>").splitlines()
    elif effects.by == "dest-src":
        listed = [
            [f"{row}", short(rows[row]), f"{column}", short(effects.columns[column]), f"{value:+.4f}"]
            for row, column, value in order
        ]
        header = ["destination", "token", "source", "token", "effect"]
        lines += format_table(header, listed, align="><><>").splitlines()
    else:
        listed = [
            [rows[row], f"{column}", short(effects.columns[column]), f"{value:+.4f}"] for row, column, value in order
        ]
        rows_are = {"layer-position": "layer", "head-position": "head"}.get(effects.by, "layers")
        header = [rows_are, "position", "token", "effect"]
        lines += format_table(header, listed, align=">><>").splitlines()
    grid_name = (
        "layers × heads"
        if by_head
        else "layers × positions"
        if effects.by == "layer-position"
        else "destinations × sources"
        if effects.by == "dest-src"
        else "heads × positions"
        if effects.by == "head-position"
        else f"positions, layers {rows[0]} patched together"
    )
    lines += ["", f"{grid_name} ({effects.metric}):"]
    columns = effects.columns if by_head else [short(label) for label in numbered(effects.columns)]
    if effects.by == "dest-src":
        rows = [short(label) for label in numbered(rows)]
    row_header = {"position": "layers", "dest-src": "destination", "head-position": "head"}.get(effects.by, "layer")
    lines += _grid_blocks(row_header, rows, columns, effects.effects.tolist())
    return "\n".join(lines) + "\n"


def _patched_where(effects: InterventionEffects) -> str:
    """What each cell of a patching grid patched, in words."""
    from attnkit.inspect.interventions import layer_span

    return (
        ("each head" if effects.component == "z" else f"each head's {effects.component}")
        if effects.by == "head"
        else f"{effects.component} at each layer and position"
        if effects.by == "layer-position"
        else f"each (destination, source) cell of the pattern (heads {layer_span(effects.heads or [])} of "
        f"layers {layer_span(effects.layers)} together)"
        if effects.by == "dest-src"
        else f"each head's {effects.component} at each position"
        if effects.by == "head-position"
        else f"{effects.component} at each position (layers {effects.row_labels[0]} together)"
    )


def _grid_blocks(
    row_header: str, rows: Sequence[str], columns: Sequence[str], values: Sequence[Sequence[float]]
) -> list[str]:
    """A rows × columns table of signed values, as as many tables of consecutive columns as
    it takes to keep each line within :data:`WIDTH` columns."""
    cells = [[f"{v:+.3f}" for v in row] for row in values]
    label_width = max(display_width(row_header), *(display_width(r) for r in rows))
    lines: list[str] = []
    start = 0
    while start < len(columns):
        width, end = label_width, start
        while end < len(columns):
            column_width = max(display_width(columns[end]), *(display_width(row[end]) for row in cells))
            if end > start and width + 2 + column_width > WIDTH:
                break
            width, end = width + 2 + column_width, end + 1
        if lines:
            lines.append("")
        header = [row_header, *columns[start:end]]
        table = [[row, *cells[i][start:end]] for i, row in enumerate(rows)]
        lines += format_table(header, table, align=">" * len(header)).splitlines()
        start = end
    return lines


def map_names(amap: AttentionMap) -> list[str]:
    """What each map of ``amap`` shows: ``head 3``, or for the methods that merge the heads
    (rollout, flow) ``all heads``."""
    return [f"head {head}" for head in amap.heads] or ["all heads"]


def shown_rows(n: int, max_rows: int = MAX_ROWS) -> list[int]:
    """The rows of an ``n``-row table that are printed: all of them up to ``max_rows``, else
    the first ``max_rows - TAIL_ROWS`` and the last :data:`TAIL_ROWS`."""
    if n <= max_rows:
        return list(range(n))
    return [*range(max_rows - TAIL_ROWS), *range(n - TAIL_ROWS, n)]


def _listed(items: Sequence[str]) -> list[str]:
    """At most :data:`MAX_LISTED` items, the last saying how many more there are."""
    if len(items) <= MAX_LISTED:
        return list(items)
    return [*items[:MAX_LISTED], f"… {len(items) - MAX_LISTED} more"]


def wrap_items(prefix: str, items: Sequence[str], width: int = WIDTH) -> list[str]:
    """``prefix`` and the items separated by `` | ``, wrapped into lines of at most
    ``width`` display columns (wide characters count two), continuation lines indented.

    Returns:
        The lines, at least one.
    """
    indent = " " * display_width(prefix)
    lines, line = [], prefix
    for k, item in enumerate(items):
        piece = item if k == 0 else " | " + item
        if k and display_width(line + piece) > width:
            lines.append(line + " |")
            line = indent + item
        else:
            line += piece
    return [*lines, line]


def render_survey(survey: HeadSurvey, *, top: int = 5, stat: str | None = None) -> str:
    """Per-head statistics as text: the top heads of each statistic, the ``--from``/``--to``
    ranking when asked, and a layers × heads grid — of roles, or of one statistic's values.

    Args:
        survey: what :func:`attnkit.inspect.survey.survey_heads` returned.
        top: heads listed per statistic.
        stat: a name of :data:`attnkit.inspect.survey.DESCRIPTIONS` to print as a grid of
            numbers instead of the role grid.

    Returns:
        Text ending in a newline.

    Raises:
        ValueError: an unknown ``stat``.
    """
    from attnkit.inspect.heads import rank_heads
    from attnkit.inspect.survey import ALL_DESCRIPTIONS

    if stat is not None and stat not in survey.statistics:
        raise ValueError(f"unknown statistic {stat!r}; choose from {', '.join(survey.statistics)}")
    sizes = f"{counted(survey.num_layers, 'layer')} × {counted(survey.num_heads, 'head')}"
    head = f"{survey.model_name} · {sizes} · {counted(survey.texts, 'text')}, {counted(survey.tokens, 'token')}"
    if survey.attention != "self":
        pairs = counted(survey.texts, "source/target pair")
        rows_of = "source" if survey.attention == "encoder" else "target"
        head = (
            f"{survey.model_name} · {ATTENTION_NAMES[survey.attention]} · {sizes} · {pairs}, "
            f"{counted(survey.tokens, rows_of + ' token')}"
        )
    elif "induction" in survey.statistics:  # a note says why it is missing
        head += f" · induction on {survey.induction_period} random tokens × 2 (seed {survey.induction_seed})"
    lines = [head, "", f"Top {top} heads per statistic (L layer, H head)"]
    rows = []
    for name, values in survey.statistics.items():
        best = "  ".join(f"L{layer}H{head} {value:.2f}" for layer, head, value in rank_heads(values, top=top))
        rows.append([name, f"{values.mean():.2f}", best])
    lines.append(format_table(["statistic", "mean", "highest"], rows, align="<><"))
    width = max(map(len, survey.statistics))
    lines += [f"  {name:<{width}}  {ALL_DESCRIPTIONS[name]}" for name in survey.statistics]
    if survey.pair is not None:
        pair = survey.pair
        texts = counted(pair.texts, "text")
        intro = f"How much {pair.source!r} attends to {pair.target!r} (" + ("words, " if pair.level == "word" else "")
        tail = f"all-head mean {pair.mass.mean():.2f}, even spread would give {pair.uniform:.2f})"
        line = f"{intro}{texts}; {tail}"
        # Long words (wide Hangul counts two columns) push the line past the width: break it.
        lines += ["", line] if display_width(line) <= WIDTH else ["", f"{intro}{texts};", f"  {tail}"]
        ranked = rank_heads(pair.mass, top=max(top, 10))
        lines.append(
            format_table(
                ["rank", "layer", "head", "weight"],
                [[str(r), str(layer), str(head), f"{value:.2f}"] for r, (layer, head, value) in enumerate(ranked, 1)],
            )
        )
    lines.append("")
    lines += [f"note: {note}" for note in survey.notes]
    # Without the induction score (a short context) the other roles still show.
    if stat is None and not all(name in survey.statistics for _, name, _ in ROLES if name != "induction"):
        # Roles need every statistic of self-attention; cross-attention shows its alignment
        # (or entropy) instead.
        stat = "alignment" if "alignment" in survey.statistics else "entropy"
    lines += _value_grid(survey, stat) if stat is not None else _role_grid(survey)
    return "\n".join(lines) + "\n"


def head_roles(survey: HeadSurvey) -> list[list[str]]:
    """One letter per head from :data:`ROLES`, ``"·"`` when none applies: ``[layer][head]``."""
    grid = []
    for layer in range(survey.num_layers):
        row = []
        for head in range(survey.num_heads):
            letters = [
                letter
                for letter, name, threshold in ROLES
                if name in survey.statistics and survey.statistics[name][layer, head] >= threshold
            ]
            row.append(letters[0] if letters else "·")
        grid.append(row)
    return grid


def _role_grid(survey: HeadSurvey) -> list[str]:
    legend = ", ".join(f"{letter} {name} ≥ {threshold}" for letter, name, threshold in ROLES)
    lines = [f"Head roles ({legend}; · none)"]
    rows = [[str(layer), *row] for layer, row in enumerate(head_roles(survey))]
    lines.append(format_table(["layer", *map(str, range(survey.num_heads))], rows, align=">" * (survey.num_heads + 1)))
    return lines


def _value_grid(survey: HeadSurvey, stat: str) -> list[str]:
    from attnkit.inspect.survey import ALL_DESCRIPTIONS

    values = survey.statistics[stat]
    rows = [[str(layer), *(f"{v:.2f}" for v in row)] for layer, row in enumerate(values.tolist())]
    return [
        f"{stat}: {ALL_DESCRIPTIONS[stat]}, layers × heads",
        format_table(["layer", *map(str, range(survey.num_heads))], rows, align=">" * (survey.num_heads + 1)),
    ]


def _subscript(n: int) -> str:
    return str(n).translate(str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉"))


def render_detection(detection: HeadDetection, *, top: int = 5) -> str:
    """Head detector scores as text: the detector, the heads that follow its pattern most,
    and the layers × heads grid.

    Args:
        detection: from :func:`attnkit.inspect.detectors.detect_heads`.
        top: heads listed.

    Returns:
        Text ending in a newline.
    """
    lines = [
        f"{detection.model_name} · {detection.detector} detector on {detection.text!r}",
        "score: the share of each head's attention that falls on the pattern (0 to 1)",
        "",
    ]
    listed = [[str(layer), str(head), f"{score:.4f}"] for layer, head, score in detection.top(top)]
    lines += format_table(["layer", "head", "score"], listed, align=">>>").splitlines()
    lines += ["", "layers × heads:"]
    rows = [str(layer) for layer in detection.layers]
    lines += _grid_blocks("layer", rows, detection.columns, detection.scores.tolist())
    return "\n".join(lines) + "\n"
