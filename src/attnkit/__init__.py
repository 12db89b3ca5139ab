"""attnkit: attention, complete and correct — kernels, modules, real models, and the tools
to look inside them.

Start with :func:`attnkit.attention` and :mod:`attnkit.masks`.

The names below are imported on first use, so that ``import attnkit`` (and the ``attnkit``
command's start, and its argument errors) does not wait for PyTorch.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from attnkit._lazy import lazy_names

__version__ = "0.1.0"

if TYPE_CHECKING:
    from attnkit import masks
    from attnkit.functional import (
        AttentionResult,
        LinearAttentionState,
        attention,
        linear_attention,
        linear_attention_step,
        local_attention,
        sparse_attention,
        tiled_attention,
        weights_on_demand,
    )

# Public name -> the module it comes from.
_LAZY = {
    "masks": "attnkit.masks",
    **{
        name: "attnkit.functional"
        for name in (
            "AttentionResult",
            "LinearAttentionState",
            "attention",
            "linear_attention",
            "linear_attention_step",
            "local_attention",
            "sparse_attention",
            "tiled_attention",
            "weights_on_demand",
        )
    },
}

__all__ = [
    "AttentionResult",
    "LinearAttentionState",
    "__version__",
    "attention",
    "linear_attention",
    "linear_attention_step",
    "local_attention",
    "masks",
    "sparse_attention",
    "tiled_attention",
    "weights_on_demand",
]


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())


def _register_notebook_display() -> None:
    """Inside IPython (Jupyter), show attention maps and views as the interactive viewer
    (:mod:`attnkit.viz.notebook`, imported on the first display). Registered by class name,
    so that nothing is imported now."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        return
    formatter = shell.display_formatter.formatters["text/html"]
    for class_name in ("AttentionMap", "AttentionView"):
        formatter.for_type_by_name("attnkit.inspect.maps", class_name, _notebook_html)


def _notebook_html(shown: Any) -> str:
    from attnkit.viz.notebook import notebook_html_of

    return notebook_html_of(shown)


_register_notebook_display()
