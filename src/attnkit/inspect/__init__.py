"""Look inside attention: capture weights from Hugging Face models
(:func:`capture`), one layer's map of a real model (:func:`attention_map`) or many layers
to explore in the viewer, inline in Jupyter (:func:`view`), tokens as they read in the text
(:mod:`attnkit.inspect.tokens`), attention between words (:mod:`attnkit.inspect.words`),
per-head statistics (:mod:`attnkit.inspect.heads`), and step-by-step explanations
(:mod:`attnkit.inspect.explain`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnkit._lazy import lazy_names

if TYPE_CHECKING:
    from attnkit.inspect.capture import CapturedAttention, capture
    from attnkit.inspect.maps import AttentionMap, AttentionView, ReadableRun, attention_map, readable_run, view
    from attnkit.inspect.tokens import ReadableToken, readable_tokens
    from attnkit.inspect.words import Word, aggregate, word_groups

# Public name -> the module it comes from, imported on first use: the command line reads
# this package's names (attnkit.inspect.names) without waiting for PyTorch or transformers.
_LAZY = {
    **dict.fromkeys(("CapturedAttention", "capture"), "attnkit.inspect.capture"),
    **dict.fromkeys(
        ("AttentionMap", "AttentionView", "ReadableRun", "attention_map", "readable_run", "view"),
        "attnkit.inspect.maps",
    ),
    **dict.fromkeys(("ReadableToken", "readable_tokens"), "attnkit.inspect.tokens"),
    **dict.fromkeys(("Word", "aggregate", "word_groups"), "attnkit.inspect.words"),
}

__all__ = [
    "AttentionMap",
    "AttentionView",
    "CapturedAttention",
    "ReadableRun",
    "ReadableToken",
    "Word",
    "aggregate",
    "attention_map",
    "capture",
    "readable_run",
    "readable_tokens",
    "view",
    "word_groups",
]


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
