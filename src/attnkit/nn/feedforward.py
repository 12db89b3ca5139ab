"""The position-wise feed-forward block of a Transformer layer.

Shape letters: ``e`` model dim, ``f`` hidden (feed-forward) dim; ``...`` any leading dims.

- ``"relu"``, ``"gelu"`` and ``"gelu_tanh"``: ``down(dropout(act(up(x))))`` — the paper's
  FFN(x) = max(0, x W₁ + b₁) W₂ + b₂, BERT's GELU variant (exact, erf-based GELU) and
  GPT-2's (GELU's tanh approximation, ``gelu_new``).
- Gated, ``down(dropout(act(gate(x)) * up(x)))`` (Shazeer, 2020): ``"swiglu"`` (SiLU, as in
  LLaMA), ``"geglu"`` (exact GELU) and ``"geglu_tanh"`` (tanh-approximated GELU, Gemma).

Projection names (``up_proj``, ``gate_proj``, ``down_proj``) follow LLaMA checkpoints so
that weights map over one to one.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Literal

import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.nn.dropout import Dropout
from attnkit.nn.hooks import HookPoint
from attnkit.nn.packing import PackedLinears

Activation = Literal["relu", "gelu", "gelu_tanh", "swiglu", "geglu", "geglu_tanh"]
ACTIVATIONS: tuple[str, ...] = ("relu", "gelu", "gelu_tanh", "swiglu", "geglu", "geglu_tanh")
# The nonlinearity of each activation; the gated ones multiply it with the up projection.
_NONLINEARITY: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": partial(F.gelu, approximate="tanh"),
    "swiglu": F.silu,
    "geglu": F.gelu,
    "geglu_tanh": partial(F.gelu, approximate="tanh"),
}
GATED_ACTIVATIONS = frozenset({"swiglu", "geglu", "geglu_tanh"})


class FeedForward(nn.Module):
    """Two (or, gated, three) linear maps with a nonlinearity between them.

    Args:
        embed_dim: model dim ``e`` (input and output).
        hidden_dim: hidden dim ``f`` (the paper's d_ff = 2048 for e = 512).
        activation: one of :data:`ACTIVATIONS` (see the module docstring).
        bias: give the linear maps a bias.
        dropout: dropout on the hidden activations.

    Raises:
        ValueError: non-positive dims, an unknown activation, ``dropout`` outside ``[0, 1)``.
    """

    def __init__(
        self,
        embed_dim: int,
        hidden_dim: int,
        *,
        activation: Activation = "relu",
        bias: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if embed_dim < 1 or hidden_dim < 1:
            raise ValueError(f"embed_dim and hidden_dim must be >= 1, got {embed_dim} and {hidden_dim}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.activation = activation
        self._nonlinearity = _NONLINEARITY[activation]
        self.up_proj = nn.Linear(embed_dim, hidden_dim, bias=bias)
        # Only gated variants have a third matrix; the others must not carry an unused one.
        gated = activation in GATED_ACTIVATIONS
        self.gate_proj = nn.Linear(embed_dim, hidden_dim, bias=bias) if gated else None
        self.down_proj = nn.Linear(hidden_dim, embed_dim, bias=bias)
        self.dropout = Dropout(dropout)
        self._packed: PackedLinears | None = None
        self.pre = HookPoint()  # hidden pre-activation, the gate's when gated (attnkit.nn.hooks)
        self.post = HookPoint()  # hidden activation

    @property
    def packable(self) -> bool:
        """Whether :meth:`pack_projections` applies: a gated block."""
        return self.gate_proj is not None

    def pack_projections(self) -> None:
        """Store the gate and up weights as one matrix, so that inference without
        gradients runs one matrix product for both (see :mod:`attnkit.nn.packing`).
        Parameters, ``state_dict`` and results stay the same.

        Raises:
            ValueError: an ungated activation (one up projection: nothing to pack).
        """
        if not self.packable:
            raise ValueError(
                f"only gated blocks ({', '.join(sorted(GATED_ACTIVATIONS))}) have projections to pack, "
                f"this one is {self.activation!r}"
            )
        assert self.gate_proj is not None  # a gated block has one
        self._packed = PackedLinears([self.gate_proj, self.up_proj])

    def forward(self, x: Tensor) -> Tensor:
        """Apply the block to every position independently.

        Args:
            x: ``[..., e]``.

        Returns:
            ``[..., e]``.
        """
        up: Tensor | None = None
        if self._packed is not None and self._packed.usable(x):
            pre, up = self._packed(x).chunk(2, dim=-1)  # [..., f] each: gate, up
        elif self.gate_proj is not None:
            pre, up = self.gate_proj(x), self.up_proj(x)  # [..., f] each
        else:
            pre = self.up_proj(x)  # [..., f]
        pre = self.pre(pre)
        hidden = self._nonlinearity(pre) if up is None else self._nonlinearity(pre) * up  # [..., f]
        return self.down_proj(self.dropout(self.post(hidden)))  # [..., e]
