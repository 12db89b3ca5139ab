"""attnkit: attention, complete and correct — kernels, modules, real models, and the tools
to look inside them.

Start with :func:`attnkit.attention` and :mod:`attnkit.masks`.
"""

from attnkit import masks
from attnkit.functional import AttentionResult, attention

__version__ = "0.1.0"

__all__ = ["AttentionResult", "__version__", "attention", "masks"]
