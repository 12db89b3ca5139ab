"""The :class:`Model` users hold: a checkpoint's network and tokenizer, run on texts.

:mod:`~.model` defines :class:`Model` and its runs on one input; each mixin adds one job:
:mod:`~.running` (:meth:`Model.run_batch`), :mod:`~.hooks` (hooks and the activation cache),
:mod:`~.generation`, :mod:`~.encoder_decoder` (a source and a target through the three
kinds of attention) and :mod:`~.lens` (TransformerLens' weights, logit lens and
attribution). :mod:`~.runs` and :mod:`~.attentions` are the records a run hands back.

The mixins never import :mod:`~.model`: they call the few methods :mod:`~.core` declares.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnkit._lazy import lazy_names

if TYPE_CHECKING:
    from attnkit.models.model.model import Model
    from attnkit.models.model.runs import ModelRun, RunStopped

# Imported on first use, so that the records of :mod:`~.runs` import without the Model.
_LAZY = {
    "Model": "attnkit.models.model.model",
    **dict.fromkeys(("ModelRun", "RunStopped"), "attnkit.models.model.runs"),
}

__all__ = ["Model", "ModelRun", "RunStopped"]

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
