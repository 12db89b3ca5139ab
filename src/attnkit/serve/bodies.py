"""The bodies of ``attnkit serve``'s JSON API, as pydantic models: what ``POST
/api/attention`` takes, and what it and ``GET /api/info`` answer (the OpenAPI schema at
``/openapi.json`` is built from them; the format is documented in ``docs/viewer.md``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr


class AttentionRequest(BaseModel):
    """Body of ``POST /api/attention``."""

    model_config = ConfigDict(extra="forbid")

    text: StrictStr = Field(description="Not blank; at most max_chars characters and max_tokens tokens.")
    model: StrictStr | None = Field(None, description="A name from GET /api/info (default: the server's first model).")
    layers: list[StrictInt] | Literal["last"] | None = Field(
        None,
        description='Layer indices, from 0, or "last": the last layer (an encoder-decoder: the last layer of each '
        "stack, encoder and decoder). Default: all.",
    )
    heads: list[StrictInt] | None = Field(None, description="Head indices, from 0 (default: all).")
    level: Literal["token", "word"] = Field(
        "token",
        description='"token", or "word" for the attention between the words of the text: rows and columns are '
        "words, a word's row the average of its tokens' rows, summed over each key word's tokens.",
    )
    modes: list[Literal["value", "rollout"]] = Field(
        [],
        description='Colour modes added beside the weights, as sections of their own: "value" (value-weighted '
        'attention, each map scaled to its largest value) and "rollout" (attention rollout up to each layer, '
        "heads merged, shown as head 0); their weights count towards max_weights. Refused for encoder-decoders.",
    )
    chat: StrictBool = Field(
        False,
        description="Read text as the chat model reads it, in its chat template (see chat_template in GET "
        '/api/info): one user message, or a JSON list of messages [{"role": ..., "content": ...}]. Positions count '
        "the template's tokens, and each self section carries the turns. Refused for a model without a template.",
    )
    decoder_text: StrictStr | None = Field(
        None,
        description="An encoder-decoder's target, the decoder's text (text is then its source). Absent, null or "
        "blank: the model writes the target itself by greedy decoding, and the response says so (generated). "
        "Refused for other models.",
    )


class ErrorBody(BaseModel):
    """Body of every 4xx response."""

    detail: str = Field(description="What was wrong with the request, in words.")


class ServedModelBody(BaseModel):
    name: str = Field(description='The value for "model" in a request.')
    family: str
    kind: str = Field(description='"causal", "bidirectional" or "encoder-decoder".')
    layers: int = Field(description="Number of layers (an encoder-decoder's encoder layers); indices 0 .. layers - 1.")
    decoder_layers: int = Field(
        0, description="An encoder-decoder's decoder layers (0 for other models); indices 0 .. decoder_layers - 1."
    )
    heads: int = Field(
        description="Query heads per layer; valid indices are 0 .. heads - 1 (an encoder-decoder: its encoder's)."
    )
    decoder_heads: int = Field(
        0, description="An encoder-decoder's heads per decoder layer, self- and cross-attention (0 for other models)."
    )
    max_tokens: int = Field(description="Longest text accepted for this model, in its tokens.")
    max_long_tokens: int = Field(
        0, description="Longest text of the long-context routes (/api/long/...), in its tokens (0: none)."
    )
    windows: list[int | None] | None = Field(
        None,
        description="Each layer's sliding window (null for a global layer) of a model with local layers; "
        "null for a model without them.",
    )
    chat_template: bool = Field(False, description='Whether the model has a chat template ("chat" in a request).')


class InfoBody(BaseModel):
    """Body of ``GET /api/info``."""

    version: str
    models: list[ServedModelBody]
    default_model: str
    max_chars: int
    max_weights: int = Field(description="Most weights (layers x heads x tokens^2) in one response.")
    max_body_bytes: int


class WeightsBody(BaseModel):
    shape: list[int] = Field(description="[layers, heads, s_q, s_k]")
    dtype: str = Field(description='"uint16"')
    byteorder: str = Field(description='"little"')
    scale: float = Field(description="weight = stored integer * scale (1 / 65535)")
    compression: str = Field(description='"zlib"')
    encoding: str = Field(description='"base64"')
    data: list[str] = Field(description="One string per layer: [heads, s_q, s_k] row-major.")


class SectionBody(BaseModel):
    causal: bool
    query_tokens: list[str]
    key_tokens: list[str]
    layers: list[int]
    heads: list[int]
    weights: WeightsBody


class ViewerDataBody(BaseModel):
    """Body of a successful ``POST /api/attention``: the viewer's data (``docs/viewer.md``)."""

    format: str = Field(description='"attnkit-viewer"')
    version: int
    model: str
    kind: str = Field(description='"causal", "bidirectional" or "encoder-decoder"')
    text: str = Field(description="The text (an encoder-decoder's source).")
    sections: dict[str, SectionBody] = Field(description='"self", or "encoder", "decoder" and "cross"')
    target_text: str | None = Field(None, description="An encoder-decoder's target (absent for other models).")
    generated: bool | None = Field(
        None, description="An encoder-decoder's target was written by the model (greedy decoding), none being given."
    )
