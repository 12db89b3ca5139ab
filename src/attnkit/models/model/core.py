"""What the parts of :class:`attnkit.models.Model` call of each other, declared once for the
type checker.

``Model`` (:mod:`attnkit.models.model.model`) is assembled from mixins that each do one job
and never import it: :mod:`~attnkit.models.model.running`,
:mod:`~attnkit.models.model.tokens`, :mod:`~attnkit.models.model.hooks`,
:mod:`~attnkit.models.model.generation`, :mod:`~attnkit.models.model.encoder_decoder`,
:mod:`~attnkit.models.model.lens`. The few methods one mixin calls of another (the checked
input, the one forward path, the layer and head selection) and the device the model holds
are declared on :class:`ModelCore`, so that every mixin is checked against the same
signatures. At run time it is ``object``: nothing is inherited from it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping, Sequence

    import torch
    from torch import Tensor

    from attnkit.models.model.runs import ForwardPass
    from attnkit.nn import LayerSelection, WeightSelection
    from attnkit.nn.hooks import Hooks, NameFilter

    class ModelCore:
        """The methods of :class:`attnkit.models.Model` its mixins call."""

        @property
        def device(self) -> torch.device: ...

        def prepare_input(
            self, text_or_ids: str | Tensor | Sequence[int], *, prepend_bos: bool | None = None
        ) -> tuple[Tensor, list[str], list[tuple[int, int]] | None]: ...

        def _selection(
            self, return_weights: LayerSelection, heads: Sequence[int] | None
        ) -> tuple[list[int], list[int]]: ...

        def _forward(
            self,
            ids: Tensor,
            *,
            layers: Collection[int] | Mapping[int, WeightSelection] = (),
            padding: Tensor | None = None,
            logits: bool = True,
            hooks: Hooks | None = None,
            names_filter: NameFilter = (),
            backward_hooks: Hooks | None = None,
            incl_bwd: bool = False,
            start_at_layer: int = 0,
            residual: Tensor | None = None,
            stop_at_layer: int | None = None,
        ) -> ForwardPass: ...

else:
    ModelCore = object
