"""What every route of the app checks of a text before any work, and how a route queues its
work and waits for it while watching for the client to hang up."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import HTTPException
from starlette.types import Receive

from attnkit.serve.batching import QueueFull, Ticket


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
