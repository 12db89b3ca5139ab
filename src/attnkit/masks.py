"""``attnkit.masks``: composable attention masks (``True`` = may attend).

The implementation lives in :mod:`attnkit.functional.masks`; this module is its public name.
"""

from attnkit.functional.masks import (
    INDEX_MAX,
    Mask,
    Span,
    causal,
    document,
    fixed,
    from_dense,
    from_hf_padding,
    from_torch_mha,
    full,
    global_tokens,
    index_grid,
    padding,
    random,
    sliding_window,
    strided,
    to_block_mask,
    to_sdpa,
    to_torch_mha,
)

__all__ = [
    "INDEX_MAX",
    "Mask",
    "Span",
    "causal",
    "document",
    "fixed",
    "from_dense",
    "from_hf_padding",
    "from_torch_mha",
    "full",
    "global_tokens",
    "index_grid",
    "padding",
    "random",
    "sliding_window",
    "strided",
    "to_block_mask",
    "to_sdpa",
    "to_torch_mha",
]
