"""Attention heatmaps: query tokens as rows, key tokens as columns, Blues by default, values
annotated on short inputs.

The ``plot_*`` functions return a matplotlib :class:`~matplotlib.figure.Figure` and take an
``ax=`` to draw into one panel of a figure of your own; the ``draw_*`` functions save a file
whose format follows the suffix (``.png``, ``.svg``).

Long inputs stay readable: above :data:`MAX_CELLS` rows or columns the map is reduced by
block maximum (a strong weight is never averaged away), at most :data:`MAX_TICKS` tick
labels are drawn on each axis (with their positions), and the colour scale defaults to a
square root, which keeps small weights visible. Cells a causal model cannot attend to are
drawn grey, not as zeros.

matplotlib is an optional dependency (``pip install 'attnkit[viz]'``), imported only when a
picture is drawn. Figures are made without pyplot, so nothing here changes the backend of a
notebook or script.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from attnkit.inspect.names import SCALES
from attnkit.viz.files import atomic_path
from attnkit.viz.fonts import font_context, plain_text

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# Above this many tokens the numbers no longer fit in the cells.
MAX_ANNOTATED_TOKENS = 24
# Above this many rows or columns a map is reduced by block maximum.
MAX_CELLS = 512
# The cells of a map converted for drawing at a time (float32: 64 MiB), beside the map.
DRAWN_CHUNK_CELLS = 2**24
# At most this many tick labels per axis.
MAX_TICKS = 40
# The colour maps: weights (0 up), and signed values (diverging, white at zero).
WEIGHT_CMAP = "Blues"
SIGNED_CMAP = "RdBu"
# The log scale starts this far below the largest weight.
LOG_RANGE = 1e-4
# The colour of cells a causal model cannot attend to.
MASKED_COLOUR = "#d9d9d9"
# Dots per inch of saved pictures unless asked otherwise.
DEFAULT_DPI = 120
# The largest default figure, in inches (width, height).
MAX_FIGSIZE = (16.0, 14.0)
# The largest canvas a raster picture is drawn on (width × height pixels × 4 bytes): a
# 16 × 14 inch map at 120 dpi needs 13 MB; 2000 dpi would need 3.6 GB.
MAX_CANVAS_BYTES = 500 * 10**6
_VECTOR_SUFFIXES = (".svg", ".pdf", ".eps", ".ps")
# Matplotlib's own warning for each glyph a font lacks; font_context already warned once.
_MISSING_GLYPH = r"Glyph \d+ .*missing from font"


def _import_matplotlib() -> None:
    """Import ``matplotlib`` (not pyplot), or say which extra to install.

    Raises:
        ImportError: matplotlib is missing.
    """
    try:
        import matplotlib
    except ImportError:
        raise ImportError("drawing pictures needs matplotlib: pip install 'attnkit[viz]'") from None
    # Keep text as text in SVG files: searchable, editable, and any script renders.
    matplotlib.rcParams["svg.fonttype"] = "none"


def require_matplotlib() -> Any:
    """Import ``matplotlib.pyplot``, or say which extra to install.

    Raises:
        ImportError: matplotlib is missing.
    """
    _import_matplotlib()
    import matplotlib.pyplot as plt

    return plt


def check_figure_size(figsize: tuple[float, float], dpi: float | None = None) -> None:
    """Check a figure size (inches) and, for a raster picture, its dots per inch and the
    canvas they make.

    Raises:
        ValueError: a size or dpi that is not a finite number above 0, or a canvas over
            :data:`MAX_CANVAS_BYTES` (the message gives its size).
    """
    width, height = figsize
    if not all(isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in (width, height)):
        raise ValueError(f"figsize must be two finite numbers of inches above 0, got {figsize!r}")
    if dpi is None:
        return
    if not (isinstance(dpi, (int, float)) and math.isfinite(dpi) and dpi > 0):
        raise ValueError(f"dpi must be a finite number above 0, got {dpi!r}")
    needed = canvas_bytes(figsize, dpi)
    if needed > MAX_CANVAS_BYTES:
        raise ValueError(
            f"a {width:g} × {height:g} inch picture at {dpi:g} dpi is drawn on a canvas of about "
            f"{needed / 1e9:.1f} GB, over the {MAX_CANVAS_BYTES / 1e9:.1f} GB limit; lower the dpi or the figure size"
        )


def canvas_bytes(figsize: tuple[float, float], dpi: float) -> int:
    """The memory of the RGBA canvas a raster picture of ``figsize`` inches at ``dpi`` is
    drawn on (4 bytes a pixel); the PNG file is smaller."""
    return 4 * math.ceil(figsize[0] * dpi) * math.ceil(figsize[1] * dpi)


def heads_grid_shape(count: int) -> tuple[int, int]:
    """``(columns, rows)`` of the panels of ``count`` heads in :func:`plot_attention_heads`."""
    cols = math.ceil(math.sqrt(count))
    return cols, math.ceil(count / cols)


def heads_figsize(count: int) -> tuple[float, float]:
    """The default figure size (inches) of :func:`plot_attention_heads` for ``count`` heads:
    about 3 inches per panel, at most 24 inches a side."""
    cols, rows = heads_grid_shape(count)
    return min(1.5 + 3.2 * cols, 24.0), min(1.0 + 3.0 * rows, 24.0)


def new_figure(figsize: tuple[float, float]) -> Figure:
    """A figure outside pyplot's list of open figures (nothing to close, no backend chosen,
    and pyplot, a good part of matplotlib's import time, not imported).

    Raises:
        ImportError: matplotlib is missing.
        ValueError: a size that is not two finite numbers above 0.
    """
    check_figure_size(figsize)
    _import_matplotlib()
    from matplotlib.figure import Figure

    return Figure(figsize=figsize)


def lay_out_once(fig: Figure) -> None:
    """Fit the figure's labels inside it (matplotlib's tight layout), once: the figure then
    keeps these positions, and saving it draws it once rather than laying it out again
    first.
    """
    import matplotlib

    fig.tight_layout()
    # tight_layout leaves a placeholder layout engine, for which savefig draws the whole
    # figure once without output before drawing it for real; no engine at all (whatever
    # the user's settings would choose) saves that draw.
    with matplotlib.rc_context({"figure.autolayout": False, "figure.constrained_layout.use": False}):
        fig.set_layout_engine(None)


def save_figure(fig: Figure, path: str | Path, *, dpi: float = DEFAULT_DPI) -> Path:
    """Save ``fig`` to ``path`` (parent folders are created); the format follows the suffix.

    Returns:
        The path written.

    Raises:
        ValueError: for a raster format, a dpi that is not a finite number above 0 or a
            canvas over :data:`MAX_CANVAS_BYTES`, checked before anything is drawn.
    """
    import matplotlib

    path = Path(path)
    if path.suffix.lower() not in _VECTOR_SUFFIXES:
        check_figure_size(tuple(fig.get_size_inches()), dpi)
    # Text stays text in SVG files: searchable, editable, and any script renders.
    with warnings.catch_warnings(), matplotlib.rc_context({"svg.fonttype": "none"}), atomic_path(path) as temporary:
        warnings.filterwarnings("ignore", message=_MISSING_GLYPH)
        fig.savefig(temporary, dpi=dpi, format=path.suffix.lstrip(".").lower() or None)
    return path


def causal_mask(s_q: int, s_k: int, first_query: int | None = None) -> Tensor:
    """Where a causal query may attend, aligned bottom-right as in :func:`attnkit.attention`:
    query ``i`` sees keys ``≤ i + s_k − s_q``; or, for the rows of queries at positions
    ``first_query, first_query + 1, ...`` (a map of some rows), keys ``≤ first_query + i``.

    Returns:
        ``[s_q, s_k]`` bool, ``True`` = may attend.
    """
    return torch.ones(s_q, s_k, dtype=torch.bool).tril(s_k - s_q if first_query is None else first_query)


def drawn_values(
    weights: Tensor, factor_q: int, factor_k: int, *, causal: bool, first_query: int | None = None
) -> tuple[np.ndarray, bool]:
    """The cells a map ``[s_q, s_k]`` is drawn with: float32, NaN where a causal query
    cannot attend (:func:`causal_mask`), reduced by :func:`block_max` when a factor is above
    1; and whether the map has negative values (then reduced by largest magnitude).

    A few hundred rows at a time: beside the map and the result, the memory drawing takes
    stays at about :data:`DRAWN_CHUNK_CELLS` cells, whatever the map's size.

    Returns:
        ``(values [ceil(s_q / factor_q), ceil(s_k / factor_k)], signed)``.
    """
    s_q, s_k = weights.shape
    weights = weights.detach()
    step = max(1, factor_q) * max(1, DRAWN_CHUNK_CELLS // max(1, factor_q * s_k))  # whole blocks of rows
    starts = range(0, s_q, step)
    allowed_from = s_k - s_q if first_query is None else first_query  # query i sees keys <= i + this

    def chunk(start: int) -> np.ndarray:
        values = weights[start : start + step].to(torch.float32).cpu().numpy().copy()
        if causal:
            rows = np.arange(start, start + values.shape[0])[:, None]
            values[np.arange(s_k)[None, :] > rows + allowed_from] = np.nan
        return values

    signed = False
    for start in starts:
        values = chunk(start)
        if np.isfinite(values).any() and np.nanmin(values) < 0:
            signed = True
            break
    if factor_q == factor_k == 1:
        return np.concatenate([chunk(start) for start in starts]) if s_q else chunk(0), signed
    return np.concatenate([block_max(chunk(start), factor_q, factor_k, signed=signed) for start in starts]), signed


def block_max(values: np.ndarray, factor_q: int, factor_k: int, *, signed: bool = False) -> np.ndarray:
    """``values`` reduced by the maximum over blocks of ``factor_q × factor_k`` cells (the last
    blocks may be smaller). NaN cells are ignored; a block of NaN only stays NaN.

    Args:
        values: ``[s_q, s_k]``.
        factor_q: rows per block.
        factor_k: columns per block.
        signed: keep the value of largest magnitude, with its sign, instead.

    Returns:
        ``[ceil(s_q / factor_q), ceil(s_k / factor_k)]``.
    """
    s_q, s_k = values.shape
    rows, cols = math.ceil(s_q / factor_q), math.ceil(s_k / factor_k)
    padded = np.full((rows * factor_q, cols * factor_k), np.nan, dtype=values.dtype)
    padded[:s_q, :s_k] = values
    blocks = padded.reshape(rows, factor_q, cols, factor_k)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN blocks: masked everywhere
        if not signed:
            return np.nanmax(blocks, axis=(1, 3))
        high, low = np.nanmax(blocks, axis=(1, 3)), np.nanmin(blocks, axis=(1, 3))
        return np.where(np.abs(low) > np.abs(high), low, high)


def thinned_ticks(count: int, max_ticks: int = MAX_TICKS) -> list[int]:
    """At most ``max_ticks`` evenly spaced positions out of ``0 .. count-1``, always
    starting at 0."""
    step = max(1, math.ceil(count / max_ticks))
    return list(range(0, count, step))


def default_figsize(s_q: int, s_k: int) -> tuple[float, float]:
    """A figure size (inches) that gives short inputs room for their labels and keeps long
    ones within :data:`MAX_FIGSIZE`."""
    cols, rows = min(s_k, MAX_TICKS), min(s_q, MAX_TICKS)
    return min(4 + 0.45 * cols, MAX_FIGSIZE[0]), min(3 + 0.4 * rows, MAX_FIGSIZE[1])


def signed_norm(vmax: float) -> Any:
    """The matplotlib norm of a signed map: linear from ``-vmax`` to ``vmax``, zero in the
    middle of a diverging colour map."""
    from matplotlib import colors

    vmax = max(vmax, 1e-12)
    return colors.Normalize(vmin=-vmax, vmax=vmax)


def colour_norm(scale: str, vmax: float) -> Any:
    """The matplotlib norm of a colour scale from 0 to ``vmax``.

    Raises:
        ValueError: an unknown scale.
    """
    from matplotlib import colors

    vmax = max(vmax, 1e-12)
    if scale == "linear":
        return colors.Normalize(vmin=0.0, vmax=vmax)
    if scale == "sqrt":
        return colors.PowerNorm(gamma=0.5, vmin=0.0, vmax=vmax)
    if scale == "log":
        return colors.LogNorm(vmin=vmax * LOG_RANGE, vmax=vmax, clip=True)
    raise ValueError(f"scale must be one of {', '.join(SCALES)}, got {scale!r}")


def plot_attention(
    weights: Tensor,
    query_labels: Sequence[str],
    key_labels: Sequence[str],
    *,
    ax: Axes | None = None,
    title: str = "Attention",
    xlabel: str = "Key (attended to)",
    ylabel: str = "Query (attending)",
    annotate: bool | None = None,
    scale: str | None = None,
    cmap: str | None = None,
    causal: bool = False,
    first_query: int | None = None,
    figsize: tuple[float, float] | None = None,
    colorbar: bool = True,
    max_cells: int = MAX_CELLS,
    vmax: float | None = None,
    label: str = "weight",
) -> Figure:
    """Draw one attention map. A map with negative values (gradient-weighted attention)
    is drawn on a diverging colour map centred on zero, linearly from ``-m`` to ``m``.

    Args:
        weights: ``[s_q, s_k]`` post-softmax weights.
        query_labels: ``s_q`` row labels.
        key_labels: ``s_k`` column labels.
        ax: the axes to draw into (default: a new figure).
        title: the axes' title.
        xlabel: the key axis' label.
        ylabel: the query axis' label.
        annotate: write each value in its cell; default when both sides have at most
            :data:`MAX_ANNOTATED_TOKENS` tokens (never on a reduced map).
        scale: ``"linear"``, ``"sqrt"`` or ``"log"``; default linear for annotated maps,
            square root otherwise.
        cmap: a matplotlib colour map name (default: :data:`WEIGHT_CMAP`, or
            :data:`SIGNED_CMAP` for a map with negative values).
        causal: grey out the cells a causal query cannot attend to (:func:`causal_mask`).
        first_query: for a map of some query rows, the position of the first one (the
            causal cells are then those of its own position); default: the rows are the
            last ``s_q`` positions.
        figsize: the new figure's size in inches (default :func:`default_figsize`); ignored
            with ``ax``.
        colorbar: draw the colour scale beside the map.
        max_cells: above this many rows or columns the map is reduced by block maximum
            (by largest magnitude for a signed map).
        vmax: the top of the colour scale (default: the map's largest weight, or its
            largest magnitude for a signed map).
        label: what the values are, on the colour bar (``"weight"``, ``"‖α·f(x)‖"``,
            ``"α·∂/∂α"``).

    Labels in any script are drawn with a font that has their glyphs
    (:func:`attnkit.viz.fonts.font_context`, which warns when none is installed), and keep
    it when the figure is saved later.

    Returns:
        The figure drawn into.

    Raises:
        ValueError: the labels do not match the weights' shape, or an unknown scale.
        ImportError: matplotlib is missing.
    """
    s_q, s_k = _check_map(weights, query_labels, key_labels)
    if max_cells < 1:
        raise ValueError(f"max_cells must be at least 1, got {max_cells}")
    factor_q, factor_k = math.ceil(s_q / max_cells), math.ceil(s_k / max_cells)
    reduced = factor_q > 1 or factor_k > 1
    values, signed = drawn_values(weights, factor_q, factor_k, causal=causal, first_query=first_query)
    small = max(s_q, s_k) <= MAX_ANNOTATED_TOKENS
    annotate = small and not reduced if annotate is None else annotate and not reduced
    scale = ("linear" if annotate or signed else "sqrt") if scale is None else scale
    if vmax is None:
        magnitudes = np.abs(values) if signed else values
        vmax = float(np.nanmax(magnitudes)) if np.isfinite(values).any() else 0.0
    norm = signed_norm(vmax) if signed else colour_norm(scale, vmax)
    colours = colour_map(cmap or (SIGNED_CMAP if signed else WEIGHT_CMAP))

    row_ticks, col_ticks = thinned_ticks(s_q), thinned_ticks(s_k)
    row_labels = _tick_labels(query_labels, row_ticks, s_q)
    col_labels = _tick_labels(key_labels, col_ticks, s_k)
    with font_context([title, xlabel, ylabel, *row_labels, *col_labels]) as choice:
        families = list(choice.families)
        created = ax is None
        fig = new_figure(figsize or default_figsize(s_q, s_k)) if ax is None else root_figure(ax)
        ax = fig.add_subplot() if ax is None else ax
        # In token coordinates whatever the reduction: cell (i, j) spans i-0.5 .. i+0.5.
        image = ax.imshow(
            np.ma.masked_invalid(values),
            cmap=colours,
            norm=norm,
            aspect="auto",
            interpolation="nearest",
            extent=(-0.5, s_k - 0.5, s_q - 0.5, -0.5),
        )
        if colorbar:
            bar = fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
            bar_label = f"{label} (centred on 0)" if signed else f"{label} ({scale} scale)"
            bar.set_label(plain_text(bar_label), fontsize=8)
        ax.set_xticks(
            col_ticks,
            labels=[plain_text(t) for t in col_labels],
            rotation=45,
            ha="right",
            rotation_mode="anchor",
            fontfamily=families,
        )
        ax.set_yticks(row_ticks, labels=[plain_text(t) for t in row_labels], fontfamily=families)
        ax.set_xlabel(plain_text(xlabel), fontfamily=families)
        ax.set_ylabel(plain_text(ylabel), fontfamily=families)
        ax.set_title(plain_text(title), fontfamily=families)
        if annotate:
            _annotate(ax, values, norm)
        if created:
            lay_out_once(fig)
    return fig


def plot_attention_heads(
    weights: Tensor,
    query_labels: Sequence[str],
    key_labels: Sequence[str],
    *,
    heads: Sequence[int] | None = None,
    title: str = "Attention",
    xlabel: str = "Key (attended to)",
    ylabel: str = "Query (attending)",
    scale: str | None = None,
    cmap: str | None = None,
    causal: bool = False,
    first_query: int | None = None,
    figsize: tuple[float, float] | None = None,
    max_cells: int = MAX_CELLS,
    label: str = "weight",
) -> Figure:
    """Draw the maps of several heads as small multiples in one figure: one panel per head,
    one shared colour scale, labels on the outer panels only.

    Args:
        weights: ``[h, s_q, s_k]``.
        query_labels: ``s_q`` row labels.
        key_labels: ``s_k`` column labels.
        heads: the head number of each panel's title (default ``0 .. h-1``).
        title: the figure's title.
        xlabel: the key axis' label (bottom row).
        ylabel: the query axis' label (left column).
        scale: ``"linear"``, ``"sqrt"`` or ``"log"`` (default: square root; signed maps
            are linear and centred on zero, as in :func:`plot_attention`).
        cmap: a matplotlib colour map name (default as in :func:`plot_attention`).
        causal: grey out the cells a causal query cannot attend to.
        first_query: as :func:`plot_attention` takes it.
        figsize: the figure's size in inches (default: about 3 inches per panel).
        max_cells: above this many rows or columns each map is reduced by block maximum.
        label: what the values are, on the colour bar.

    Returns:
        The figure.

    Raises:
        ValueError: ``weights`` is not ``[h, s_q, s_k]``, labels or heads that do not match it.
        ImportError: matplotlib is missing.
    """
    if weights.ndim != 3:
        raise ValueError(f"weights must be [h, s_q, s_k], got shape {list(weights.shape)}")
    count = weights.shape[0]
    heads = list(range(count)) if heads is None else list(heads)
    if len(heads) != count:
        raise ValueError(f"weights hold {count} heads but got {len(heads)} head numbers")
    _check_map(weights[0], query_labels, key_labels)
    cols, rows = heads_grid_shape(count)
    # Every panel on one scale, so that heads compare: the largest weight of any head.
    signed = bool(weights.numel() and float(weights.detach().float().min()) < 0)
    top = float(weights.detach().float().abs().max()) if weights.numel() else 0.0
    scale = ("linear" if signed else "sqrt") if scale is None else scale
    colour_norm(scale, top)  # an unknown scale fails before anything is drawn
    fig = new_figure(figsize or heads_figsize(count))
    fig.suptitle(plain_text(title))
    grid = fig.subplots(rows, cols, squeeze=False)
    for index, ax in enumerate(grid.flat):
        if index >= count:
            ax.set_axis_off()
            continue
        row, col = divmod(index, cols)
        plot_attention(
            weights[index],
            query_labels,
            key_labels,
            ax=ax,
            title=f"head {heads[index]}",
            xlabel=xlabel if row == rows - 1 else "",
            ylabel=ylabel if col == 0 else "",
            annotate=False,
            scale=scale,
            cmap=cmap,
            causal=causal,
            first_query=first_query,
            colorbar=False,
            max_cells=max_cells,
            vmax=top,
            label=label,
        )
        if row != rows - 1 and index + cols < count:
            ax.set_xticklabels([])
        if col != 0:
            ax.set_yticklabels([])
        ax.tick_params(labelsize=6)
    bar_label = f"{label} (centred on 0)" if signed else f"{label} ({scale} scale)"
    fig.colorbar(grid.flat[0].images[0], ax=list(grid.flat), fraction=0.02, pad=0.02, label=plain_text(bar_label))
    return fig


def draw_heatmap(
    weights: Tensor,
    query_labels: Sequence[str],
    key_labels: Sequence[str],
    path: str | Path,
    *,
    dpi: float = DEFAULT_DPI,
    **options: Any,
) -> Path:
    """Draw one attention map (:func:`plot_attention`) and save it; the format follows the
    suffix (``.png``, ``.svg``).

    Args:
        weights: ``[s_q, s_k]`` post-softmax weights.
        query_labels: ``s_q`` row labels.
        key_labels: ``s_k`` column labels.
        path: where to write.
        dpi: dots per inch.
        **options: :func:`plot_attention`'s keyword arguments (``title``, ``scale``,
            ``cmap``, ``causal``, ``figsize``, ...).

    Returns:
        The path written.

    Raises:
        ValueError: the labels do not match the weights' shape, or an unknown option value.
    """
    return save_figure(plot_attention(weights, query_labels, key_labels, **options), path, dpi=dpi)


def draw_attention_heads(
    weights: Tensor,
    query_labels: Sequence[str],
    key_labels: Sequence[str],
    path: str | Path,
    *,
    dpi: float = DEFAULT_DPI,
    **options: Any,
) -> Path:
    """Draw several heads as small multiples (:func:`plot_attention_heads`) and save them.

    Args:
        weights: ``[h, s_q, s_k]``.
        query_labels: ``s_q`` row labels.
        key_labels: ``s_k`` column labels.
        path: where to write; the format follows the suffix.
        dpi: dots per inch.
        **options: :func:`plot_attention_heads`'s keyword arguments.

    Returns:
        The path written.
    """
    return save_figure(plot_attention_heads(weights, query_labels, key_labels, **options), path, dpi=dpi)


def root_figure(ax: Axes) -> Figure:
    """The figure that holds ``ax``, through any subfigures."""
    from matplotlib.figure import Figure

    figure: Any = ax.figure
    while not isinstance(figure, Figure):
        figure = figure.figure
    return figure


def _check_map(weights: Tensor, query_labels: Sequence[str], key_labels: Sequence[str]) -> tuple[int, int]:
    if weights.ndim != 2:
        raise ValueError(f"weights must be [s_q, s_k], got shape {list(weights.shape)}")
    s_q, s_k = weights.shape
    if len(query_labels) != s_q or len(key_labels) != s_k:
        raise ValueError(
            f"weights are [{s_q}, {s_k}] but got {len(query_labels)} query and {len(key_labels)} key labels"
        )
    return s_q, s_k


def _tick_labels(labels: Sequence[str], ticks: list[int], count: int) -> list[str]:
    """The labels at ``ticks``; with their positions when some labels are left out."""
    if len(ticks) == count:
        return [labels[i] for i in ticks]
    return [f"{labels[i]} · {i}" for i in ticks]


def colour_map(name: str) -> Any:
    """The colour map ``name`` with masked cells grey.

    Raises:
        ValueError: an unknown colour map.
    """
    import matplotlib

    try:
        colours = matplotlib.colormaps[name]
    except KeyError:
        raise ValueError(
            f"unknown colour map {name!r}; any of matplotlib's works, e.g. Blues, viridis, magma"
        ) from None
    return colours.with_extremes(bad=MASKED_COLOUR)


def _annotate(ax: Axes, values: np.ndarray, norm: Any) -> None:
    """Each finite value in its cell, white on dark cells."""
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            value = values[i, j]
            if not np.isfinite(value):
                continue
            colour = "white" if norm(value) > 0.5 else "black"
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", color=colour, fontsize=8)
