"""Dropout that costs nothing when it changes nothing.

Shape letters: ``...`` any dims.

A decoder layer applies dropout to every sublayer's output; at inference (evaluation mode,
or a probability of 0, as in every pretrained checkpoint) each of those calls returns its
input, yet going through ``nn.Module``'s call machinery costs more than some of the
tensor operations around it, once per sublayer and per decoding step.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


class Dropout(nn.Dropout):
    """``torch.nn.Dropout`` (same parameters, same results), called directly: its input comes
    back untouched, without a call to torch, in evaluation mode or with ``p = 0``. Like an
    :class:`attnkit.nn.HookPoint` it skips ``nn.Module``'s hook machinery; it has nothing to
    hook.

    Args:
        p: the probability of zeroing an element while training.
    """

    def forward(self, x: Tensor) -> Tensor:
        """``x [...]`` with dropout while training, else ``x`` itself."""
        if self.training and self.p > 0:
            return F.dropout(x, self.p, training=True, inplace=self.inplace)
        return x

    __call__ = forward
