"""Pure tensor functions: masks, scores, softmax and attention kernels. No modules, no I/O."""

from attnkit.functional import masks, scores
from attnkit.functional.attention import attention, reference_attention
from attnkit.functional.kernels import KERNELS, get_kernel
from attnkit.functional.linear import (
    LinearAttentionState,
    favor_projection,
    linear_attention,
    linear_attention_state,
    linear_attention_step,
)
from attnkit.functional.local import local_attention
from attnkit.functional.records import AttentionResult
from attnkit.functional.softmax import masked_softmax
from attnkit.functional.sparse import (
    bigbird_pattern,
    block_random,
    fixed_pattern,
    longformer_pattern,
    sparse_attention,
    strided_pattern,
)
from attnkit.functional.tiled import tiled_attention
from attnkit.functional.weights_on_demand import iter_weights_on_demand, weights_on_demand

__all__ = [
    "KERNELS",
    "AttentionResult",
    "LinearAttentionState",
    "attention",
    "bigbird_pattern",
    "block_random",
    "favor_projection",
    "fixed_pattern",
    "get_kernel",
    "iter_weights_on_demand",
    "linear_attention",
    "linear_attention_state",
    "linear_attention_step",
    "local_attention",
    "longformer_pattern",
    "masked_softmax",
    "masks",
    "reference_attention",
    "scores",
    "sparse_attention",
    "strided_pattern",
    "tiled_attention",
    "weights_on_demand",
]
