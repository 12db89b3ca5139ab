"""attnkit: attention, complete and correct — kernels, modules, real models, and the tools
to look inside them.

Start with :func:`attnkit.attention` and :mod:`attnkit.masks`.
"""

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

__version__ = "0.1.0"

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
