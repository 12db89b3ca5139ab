"""The attention weights a run of a real model hands back, by layer.

Shape letters: ``h_sel`` selected heads, ``s_q`` query tokens, ``s_k`` key tokens.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor


class LayerAttentions(dict[int, Tensor]):
    """Layer index → attention weights, for the layers a run asked for. Negative indices
    count from the model's last layer, as in ``run(return_weights=[-1])``: ``attentions[-1]``
    is the last layer's map.

    Args:
        maps: layer index (``0 .. num_layers - 1``) → weights.
        num_layers: the model's depth.
    """

    def __init__(self, maps: dict[int, Tensor], num_layers: int) -> None:
        super().__init__(maps)
        self.num_layers = num_layers

    def _layer(self, layer: Any) -> Any:
        if isinstance(layer, int) and not isinstance(layer, bool) and -self.num_layers <= layer < 0:
            return layer + self.num_layers
        return layer

    def __getitem__(self, layer: int) -> Tensor:
        key = self._layer(layer)
        if not super().__contains__(key):
            raise KeyError(f"layer {layer} was not asked for; this run has the weights of layers {sorted(self)}")
        return super().__getitem__(key)

    def __contains__(self, layer: object) -> bool:
        return super().__contains__(self._layer(layer))

    def get(self, layer: int, default: Tensor | None = None) -> Tensor | None:  # type: ignore[override]
        return super().get(self._layer(layer), default)
