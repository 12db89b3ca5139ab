"""Pure tensor functions: masks, scores, softmax and attention kernels. No modules, no I/O."""

from attnkit.functional import masks, scores
from attnkit.functional.attention import attention, reference_attention
from attnkit.functional.records import AttentionResult
from attnkit.functional.softmax import masked_softmax

__all__ = ["AttentionResult", "attention", "masked_softmax", "masks", "reference_attention", "scores"]
