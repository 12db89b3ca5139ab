"""What one request may ask of the app (:func:`attnkit.serve.create_app`'s limits and their
defaults), and the most tokens an encoder-decoder writes for a request without a target."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

DEFAULT_MAX_TOKENS = 1024
# Weights in one response, layers x heads x tokens^2: 2^25 is about 67 MB of uint16 before
# compression, e.g. every layer and head of SmolLM2 on 350 tokens, or 32 maps of 1,024.
DEFAULT_MAX_WEIGHTS = 2**25
DEFAULT_MAX_CHARS = 50_000
DEFAULT_MAX_BODY_BYTES = 256 * 1024
# Requests waiting for one model, past which the server answers 429: about ten seconds of
# SmolLM2 work on two cores.
DEFAULT_MAX_QUEUE = 32
# The most tokens an encoder-decoder writes when a request gives no target.
GENERATED_TOKENS = 64


@dataclass(frozen=True)
class Limits:
    """What one request may ask of the app (see :func:`attnkit.serve.create_app`), each at least 1.

    Raises:
        ValueError: a limit below 1.
    """

    max_tokens: int
    max_weights: int
    max_chars: int
    max_body_bytes: int
    max_queue: int

    def __post_init__(self) -> None:
        for limit in dataclasses.fields(self):
            value = getattr(self, limit.name)
            if value < 1:
                raise ValueError(f"{limit.name} must be at least 1, got {value}")
