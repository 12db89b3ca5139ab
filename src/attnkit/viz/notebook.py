"""Attention maps in a Jupyter notebook: the interactive viewer inline, without a server.

``import attnkit`` inside IPython registers :func:`notebook_html_of` as the HTML display of
:class:`attnkit.inspect.AttentionMap` and of what :func:`attnkit.inspect.view` returns, so
that displaying one shows the viewer; this module is imported on the first display.
"""

from __future__ import annotations

import html
import uuid
from collections.abc import Mapping, Sequence

from torch import Tensor

from attnkit.deprecation import renamed_keywords
from attnkit.inspect.maps import AttentionMap, AttentionView
from attnkit.models.checkpoints.chat import Turn
from attnkit.viz.viewer import ViewerData, render_html
from attnkit.viz.viewer.adapters import chat_turns


def notebook_html_of(shown: AttentionMap | AttentionView) -> str:
    """The interactive viewer of one map (head, model and matrix views), or of every layer
    and head of a :func:`attnkit.inspect.view`, as a notebook displays it
    (:func:`notebook_html`).

    Raises:
        TypeError: neither an ``AttentionMap`` nor an ``AttentionView``.
    """
    if isinstance(shown, AttentionMap):
        return notebook_html(
            shown.model_name,
            shown.labels,
            {shown.layer: shown.weights},
            causal=shown.causal,
            heads=shown.heads,
            text=shown.text,
            # A window of tokens has no exact meaning between words.
            windows={shown.layer: shown.window} if shown.words is None and shown.layer_windows else None,
            turns=chat_turns(shown.text, shown.words) if shown.rows is None else None,
        )
    if isinstance(shown, AttentionView):
        return notebook_html(
            shown.model_name,
            shown.run.labels,
            shown.run.attentions,
            causal=shown.causal,
            heads=shown.heads,
            text=shown.run.text,
            turns=chat_turns(shown.run.text, shown.run.words),
        )
    raise TypeError(f"expected an AttentionMap or an AttentionView, got {type(shown).__name__}")


# The notebook frame's first height, before the page reports its own: the controls, plus a
# row per token up to the height at which the viewer scrolls inside itself.
FRAME_CHROME_PX = 300
FRAME_ROW_PX = 20
FRAME_MAX_PX = 900

# Sets the frame's height to what the page inside reports (viewer.js posts
# {attnkitHeight} to its parent): the frame fits its content instead of a fixed size.
_FRAME_SIZER = (
    "<script>(function () {{ const frame = document.getElementById('{id}'); "
    "window.addEventListener('message', function (e) {{ "
    "if (frame && e.source === frame.contentWindow && e.data && typeof e.data.attnkitHeight === 'number') "
    "frame.style.height = Math.ceil(e.data.attnkitHeight) + 'px'; }}); }})();</script>"
)


@renamed_keywords(model="model_name", removed_in="0.3")
def notebook_html(
    model_name: str,
    labels: Sequence[str],
    attentions: Mapping[int, Tensor],
    *,
    causal: bool,
    heads: Sequence[int],
    text: str,
    height: int | None = None,
    windows: Mapping[int, int | None] | None = None,
    turns: Sequence[Turn] | None = None,
) -> str:
    """The self-contained viewer page (:func:`attnkit.viz.viewer.render_html`) in an
    ``<iframe srcdoc>``, the form notebooks display inline, sized to its content.

    The page keeps its own content-security policy and runs in a sandbox that allows its
    script and nothing else; escaping it into one attribute keeps it whole inside the
    notebook's HTML. The page reports its height to the notebook, and a small script next
    to the frame sets the frame to it; where a notebook runs no scripts, the frame keeps
    its first height.

    Args:
        model_name: the model's name.
        labels: one label per row and column of the maps.
        attentions: layer → ``[h, n, n]`` or ``[1, h, n, n]`` weights.
        causal: whether the model is causal.
        heads: the heads the ``h`` rows stand for.
        text: the input text.
        height: the frame's first height in CSS pixels (default: from the number of
            labels, at most :data:`FRAME_MAX_PX`).
        windows: layer → sliding window of a local layer (``None``: global), for a model
            with local layers: the viewer greys the cells outside the window.
        turns: the turns of a conversation in a chat template, over the labels.

    Returns:
        An ``<iframe>`` element and the ``<script>`` that sizes it.

    Raises:
        ImportError: the viewer's dependencies are missing.
    """
    data = ViewerData.from_run(
        model_name, labels, attentions, causal=causal, heads=heads, text=text, windows=windows, turns=turns
    )
    page = html.escape(render_html(data), quote=True)
    if height is None:
        height = min(FRAME_CHROME_PX + FRAME_ROW_PX * len(labels), FRAME_MAX_PX)
    frame_id = f"attnkit-{uuid.uuid4().hex}"
    return (
        f'<iframe id="{frame_id}" srcdoc="{page}" sandbox="allow-scripts" '
        f'title="attnkit attention viewer: {html.escape(model_name)}" '
        f'style="width: 100%; height: {int(height)}px; border: 0"></iframe>' + _FRAME_SIZER.format(id=frame_id)
    )
