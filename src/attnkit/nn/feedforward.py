"""The position-wise feed-forward block of a Transformer layer.

Shape letters: ``e`` model dim, ``f`` hidden (feed-forward) dim; ``...`` any leading dims.

- ``"relu"`` and ``"gelu"``: ``down(dropout(act(up(x))))`` — the paper's FFN(x) =
  max(0, x W₁ + b₁) W₂ + b₂ and BERT's GELU variant (exact, erf-based GELU).
- ``"swiglu"``: ``down(dropout(silu(gate(x)) * up(x)))`` (Shazeer, 2020), as in LLaMA.

Projection names (``up_proj``, ``gate_proj``, ``down_proj``) follow LLaMA checkpoints so
that weights map over one to one.
"""

from __future__ import annotations

from typing import Literal

import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.nn.packing import PackedLinears

Activation = Literal["relu", "gelu", "swiglu"]
ACTIVATIONS: tuple[str, ...] = ("relu", "gelu", "swiglu")


class FeedForward(nn.Module):
    """Two (or, gated, three) linear maps with a nonlinearity between them.

    Args:
        embed_dim: model dim ``e`` (input and output).
        hidden_dim: hidden dim ``f`` (the paper's d_ff = 2048 for e = 512).
        activation: ``"relu"``, ``"gelu"`` or ``"swiglu"``.
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
        self.up_proj = nn.Linear(embed_dim, hidden_dim, bias=bias)
        # Only the gated variant has a third matrix; the others must not carry an unused one.
        self.gate_proj = nn.Linear(embed_dim, hidden_dim, bias=bias) if activation == "swiglu" else None
        self.down_proj = nn.Linear(hidden_dim, embed_dim, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self._packed: PackedLinears | None = None

    @property
    def packable(self) -> bool:
        """Whether :meth:`pack_projections` applies: a gated (SwiGLU) block."""
        return self.gate_proj is not None

    def pack_projections(self) -> None:
        """Store SwiGLU's gate and up weights as one matrix, so that inference without
        gradients runs one matrix product for both (see :mod:`attnkit.nn.packing`).
        Parameters, ``state_dict`` and results stay the same.

        Raises:
            ValueError: an ungated activation (one up projection: nothing to pack).
        """
        if not self.packable:
            raise ValueError(f"only the gated (swiglu) block has projections to pack, this one is {self.activation!r}")
        self._packed = PackedLinears([self.gate_proj, self.up_proj])

    def forward(self, x: Tensor) -> Tensor:
        """Apply the block to every position independently.

        Args:
            x: ``[..., e]``.

        Returns:
            ``[..., e]``.
        """
        if self._packed is not None and self._packed.usable():
            gate, up = self._packed(x).chunk(2, dim=-1)  # [..., f] each
            hidden = F.silu(gate) * up
        else:
            up = self.up_proj(x)  # [..., f]
            if self.activation == "relu":
                hidden = F.relu(up)
            elif self.activation == "gelu":
                hidden = F.gelu(up)
            else:
                hidden = F.silu(self.gate_proj(x)) * up
        return self.down_proj(self.dropout(hidden))  # [..., e]
