"""What every route of the app checks of a request before any work (the text; for ``POST
/api/attention`` also its layers, heads, tokens and the weights the response would hold,
against the :class:`attnkit.serve.limits.Limits`), and how a route queues its work and waits
for it while watching for the client to hang up."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException
from fastapi.concurrency import run_in_threadpool
from starlette.types import Receive

from attnkit.functional.indices import select_indices
from attnkit.serve.batching import QueueFull, Ticket
from attnkit.serve.bodies import AttentionRequest
from attnkit.serve.limits import Limits
from attnkit.serve.served import ServedModel
from attnkit.viz.terminal import counted


def http_error(status: int, detail: str) -> HTTPException:
    """The refusal of a request: answered with ``status`` and the JSON body ``{"detail": detail}``."""
    return HTTPException(status_code=status, detail=detail)


def check_text(text: str, max_chars: int, what: str = "the text") -> None:
    """Refuse a blank text, one over ``max_chars`` characters, or one with lone surrogates
    (which no tokenizer can encode).

    Raises:
        HTTPException: 422 naming what is wrong.
    """
    if not text.strip():
        raise HTTPException(422, f"{what} is empty: give some words to look at")
    if len(text) > max_chars:
        raise HTTPException(422, f"{what} is {len(text)} characters, more than this server's limit of {max_chars}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise HTTPException(422, f"{what} is not valid Unicode: a lone surrogate at character {err.start}") from None


async def wait_unless_gone(ticket: Ticket, receive: Receive) -> Any:
    """The ticket's result, or ``None`` if the client hangs up first (the ticket is then
    abandoned: it never runs if it had not started, and running work is asked to stop)."""
    result = asyncio.wrap_future(ticket.future)

    async def gone() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({result, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if result.done():
        return result.result()
    ticket.abandon()
    result.cancel()
    return None


async def run_queued(submit: Callable[[], Ticket], receive: Receive) -> Any:
    """Queue a request's work (``submit()`` queues it and returns its ticket) and wait for its
    result: ``None`` if the client hangs up first (:func:`wait_unless_gone`).

    Raises:
        HTTPException: 429 with ``Retry-After`` when the queue is full; 422 for a
            ``ValueError`` of the work.
    """
    try:
        ticket = submit()
    except QueueFull as full:
        raise HTTPException(429, str(full), headers={"Retry-After": str(full.retry_after)}) from None
    try:
        return await wait_unless_gone(ticket, receive)
    except ValueError as err:
        raise HTTPException(422, str(err)) from None


@dataclass(frozen=True)
class Admitted:
    """A request that passed every check, ready to join its model's batch."""

    served: ServedModel
    text: str
    layers: list[int]
    heads: list[int]
    tokens: int


def checked_indices(values: list[int] | None, count: int, what: str, model_name: str) -> list[int]:
    """Requested layer or head indices, checked, deduplicated and sorted (all when None)."""
    if values is None:
        return list(range(count))
    if not values:
        raise http_error(422, f"{what}s must not be an empty list; leave it out for all {count} {what}s")
    try:
        return select_indices(values, count, what, context=f"{model_name} has {count} {what}s", from_end=False)
    except (TypeError, ValueError) as err:
        raise http_error(422, str(err)) from None


async def admit(request: AttentionRequest, s: ServedModel, limits: Limits) -> Admitted:
    """Check a request for model ``s``: the text (blank, too long in characters, lone
    surrogates, too many tokens), the layers and heads, and the weights it would return.

    Raises:
        HTTPException: 422 naming what is wrong and, for too many weights, what would fit.
    """
    text = request.text
    check_text(text, limits.max_chars)
    if request.chat:
        text = await run_in_threadpool(_chat_text, s, text)
    asked = [s.model.num_layers - 1] if request.layers == "last" else request.layers
    layers = checked_indices(asked, s.model.num_layers, "layer", s.name)
    heads = checked_indices(request.heads, s.model.num_heads, "head", s.name)
    count = await count_tokens(text, s)
    weights = len(layers) * len(heads) * count * count
    if weights > limits.max_weights:
        per_layer = len(heads) * count * count
        raise http_error(
            422,
            f"{counted(len(layers), 'layer')} x {counted(len(heads), 'head')} x {count}^2 tokens is {weights} "
            f"weights, more than this server's limit of {limits.max_weights}: ask for at most "
            f"{counted(max(1, limits.max_weights // per_layer), 'layer')} or fewer heads",
        )
    return Admitted(s, text, layers, heads, count)


def _chat_text(s: ServedModel, text: str) -> str:
    """``chat``: the text in the model's chat template.

    Raises:
        HTTPException: 422 for a model without one (one line that says so), or messages
            that are not messages.
    """
    from attnkit.models.checkpoints.chat import no_template_message

    apply = getattr(s.model, "apply_chat_template", None)  # a stand-in model may have none
    if apply is None:
        raise http_error(422, no_template_message(s.name))
    try:
        return apply(text)
    except ValueError as err:
        raise http_error(422, str(err)) from None


async def count_tokens(text: str, s: ServedModel, what: str = "the text") -> int:
    """The number of tokens of ``text`` for model ``s``.

    Raises:
        HTTPException: 422 for a text the tokenizer refuses or one over the token limit.
    """
    try:
        count = len((await run_in_threadpool(s.model.tokenize, text)).tokens)
    except ValueError as err:
        message = str(err)
        # The model says "text is N tokens long": name which text when it is not the source.
        if what != "the text" and message.startswith("text is "):
            message = f"{what} is {message.removeprefix('text is ')}"
        raise http_error(422, message) from None
    if count > s.max_tokens:
        raise http_error(422, f"{what} is {count} tokens, more than the limit of {s.max_tokens} for {s.name}")
    return count


def check_mode_weights(modes: Sequence[str], admitted: Admitted, limits: Limits) -> None:
    """Refuse colour modes that would take the response over the server's weights: value as
    many as the weights, rollout one map per layer.

    Raises:
        HTTPException: 422 naming the weights and the limit.
    """
    maps = len(admitted.layers) * len(admitted.heads)
    total = maps * (1 + ("value" in modes)) + len(admitted.layers) * ("rollout" in modes)
    weights = total * admitted.tokens**2
    if modes and weights > limits.max_weights:
        raise http_error(
            422,
            f"with the colour modes {', '.join(modes)}, {total} maps x {admitted.tokens}^2 tokens is {weights} "
            f"weights, more than this server's limit of {limits.max_weights}: ask for fewer layers or heads, "
            "or no colour modes",
        )


def refuse_modes(request: AttentionRequest, s: ServedModel) -> None:
    """Refuse colour modes for an encoder-decoder: they are of one self-attention.

    Raises:
        HTTPException: 422 naming the model.
    """
    if request.modes:
        raise http_error(422, f"{s.name} is an encoder-decoder: colour modes (modes) are for one self-attention")


def stack_layers(
    asked: list[int] | str | None, encoder_depth: int, decoder_depth: int, name: str
) -> tuple[list[int], list[int], list[int]]:
    """``(layers, encoder_layers, decoder_layers)`` of a request's ``layers``: each stack
    the indices it has, and for ``"last"`` each stack's own last layer.

    Raises:
        HTTPException: 422 for an index no stack has.
    """
    if isinstance(asked, str):  # "last"
        encoder_layers, decoder_layers = [encoder_depth - 1], [decoder_depth - 1]
        return sorted({*encoder_layers, *decoder_layers}), encoder_layers, decoder_layers
    layers = checked_indices(asked, max(encoder_depth, decoder_depth), "layer", name)
    return layers, [i for i in layers if i < encoder_depth], [i for i in layers if i < decoder_depth]
