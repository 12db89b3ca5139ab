"""Memory for the large activations a forward pass keeps (the ``scores``, ``pattern`` and
``result`` an activation cache records), mapped in one system call rather than page by page.

A cache of every attention pattern is large: SmolLM2 at 1,024 tokens keeps 2.3 GB of scores
and patterns and 0.6 GB of per-head results, all fresh memory. On Linux each 4 KiB page of
fresh memory costs a page fault when it is first written, and in a virtual machine the
faults cost more than the writing: filling 60 tensors of 38 MB took 1.9 s of system time
page by page and 1.2 s when each tensor was first populated with
``madvise(MADV_POPULATE_WRITE)`` (Linux 5.14 and later), one thread, on the machine the
benchmarks ran on; in that cache of SmolLM2, 2.6 s and 2.3 s. :func:`empty_large` is
:func:`torch.empty` followed by that call; where it does not apply (another device,
another system, an older kernel, a small tensor) it is :func:`torch.empty` alone. The
memory is PyTorch's own, freed as any tensor's.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

# Tensors smaller than this are left to fault in page by page: little to save.
MIN_BYTES = 2**22
# madvise advice that populates (prefaults, writable) a range: Linux 5.14's MADV_POPULATE_WRITE.
_MADV_POPULATE_WRITE = 23
_PAGE = 4096


def empty_large(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> Tensor:
    """An uninitialised contiguous tensor, its memory mapped in at once where that is cheaper.

    Args:
        shape: the tensor's shape.
        dtype: its dtype.
        device: its device; only CPU tensors of at least :data:`MIN_BYTES` bytes on Linux
            are populated.

    Returns:
        A tensor of ``shape``, its values undefined, as :func:`torch.empty` returns it.
    """
    tensor = torch.empty(tuple(shape), dtype=dtype, device=device)
    nbytes = tensor.numel() * tensor.element_size()
    if device.type == "cpu" and nbytes >= MIN_BYTES and _state.populate:
        start = -(-tensor.data_ptr() // _PAGE) * _PAGE  # the whole pages inside the tensor
        stop = (tensor.data_ptr() + nbytes) // _PAGE * _PAGE
        if _madvise()(start, stop - start, _MADV_POPULATE_WRITE) != 0:
            _state.populate = False  # a kernel without the advice: pages fault in as written
    return tensor


class _State:
    """Whether to populate: on Linux, until the kernel refuses the advice once."""

    populate = sys.platform.startswith("linux")


_state = _State()


@functools.cache
def _madvise() -> Callable[[int, int, int], int]:
    """libc's ``madvise(address, length, advice)``."""
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise
