"""One model's requests, queued and run in batches on one thread.

The server hands every accepted request to its model's :class:`Batcher`. One thread runs
the model, always the same one, because PyTorch's per-thread state (its OpenMP team,
allocator caches) then stays warm: on a busy two-core machine a SmolLM2 request took 3 s
when each ran on whichever worker thread was free, 0.3 s on its own thread. Whenever that
thread is free it takes every waiting request that asks for the same layers and heads
(up to a budget of tokens) and runs them in one forward pass
(:meth:`attnkit.models.Model.run_batch`), so that throughput grows with the load instead
of each request waiting for all those before it.

The queue is bounded: past ``max_queue`` waiting requests, :meth:`Batcher.submit` raises
:class:`QueueFull` with a retry delay (the server's 429). A request whose client has gone is
cancelled and never runs.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

# Padded tokens in one batch: the memory of one batch stays that of one long request.
DEFAULT_BATCH_TOKENS = 1024
# Before it starts a batch the thread waits, briefly, for requests that are sure to come:
# those the server is reading and checking (see Batcher.arriving), and under load (the last
# batch had several texts) as many as the last batch had (the same clients, back with their
# next requests), for at most GATHER_SHARE of the last batch's time (at least GATHER_MIN_S):
# half a pass is worth waiting for a text that would otherwise need a pass of its own.
# Clients answered together send their next requests some tens of milliseconds apart;
# without the wait the first would run alone and the others wait for it, batch after batch.
# A lone request on an idle server starts at once.
GATHER_SHARE = 0.5
GATHER_MIN_S = 0.005


class QueueFull(RuntimeError):
    """The model's queue is full; try again after :attr:`retry_after` seconds.

    Attributes:
        retry_after: whole seconds, at least 1: the estimated time to work off the queue.
    """

    def __init__(self, waiting: int, retry_after: int) -> None:
        self.retry_after = retry_after
        super().__init__(
            f"the server is busy: {waiting} requests are waiting for this model; try again in {retry_after} s"
        )

    @classmethod
    def estimated(cls, waiting: int, seconds_each: float) -> QueueFull:
        """The error for ``waiting`` requests of about ``seconds_each`` seconds each."""
        return cls(waiting, max(1, math.ceil(waiting * seconds_each)))


def moving_average(average: float, seconds: float) -> float:
    """The running estimate of a request's time after one more took ``seconds`` (the first
    sets it)."""
    return seconds if not average else 0.8 * average + 0.2 * seconds


@dataclass
class Ticket:
    """A request waiting for, or being run by, a model's thread.

    Attributes:
        future: its result, or the error it raised; cancelled if the client goes before it
            runs.
        abandoned: set when the client has gone (see :meth:`abandon`).
    """

    future: Future = field(default_factory=Future, kw_only=True)
    abandoned: threading.Event = field(default_factory=threading.Event, kw_only=True)

    def abandon(self) -> None:
        """The client has gone: a waiting request never runs, and a running one is asked
        to stop (:attr:`abandoned`)."""
        self.abandoned.set()
        self.future.cancel()


@dataclass
class Job(Ticket):
    """One request for the weights of a text, waiting for, or being run by, the model; a
    pass whose every job is abandoned stops at its next layer.

    Attributes:
        text: the text.
        layers: the layers whose weights it wants.
        heads: the heads it wants.
        tokens: its length in the model's tokens.
    """

    text: str
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    tokens: int


class Batcher:
    """Runs the requests for one model on one thread, several texts per forward pass.

    Args:
        model: has ``run(text, return_weights=layers, heads=heads)``; and, for batches,
            ``run_batch(texts, return_weights=layers, heads=heads, logits=False, stop=stop)``
            returning one run per text and raising when ``stop()`` turns true (as
            :meth:`attnkit.models.Model.run_batch`); without it, each request runs alone. ``causal`` says whether
            texts of different lengths may share a batch (padded at the end).
        max_queue: the most requests waiting (not counting those running).
        batch_tokens: the most padded tokens (texts x longest) in one batch.
        name: the thread's name.
    """

    def __init__(
        self, model: Any, *, max_queue: int, batch_tokens: int = DEFAULT_BATCH_TOKENS, name: str = "attnkit-model"
    ) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be at least 1, got {max_queue}")
        self.model = model
        self.max_queue = max_queue
        self.batch_tokens = batch_tokens
        self.batches: list[int] = []  # size of every batch run, for tests and benchmarks
        self._queue: deque[Job] = deque()
        self._ready = threading.Condition()
        self._seconds_per_text = 0.0
        self._last_batch_seconds = 0.0
        self._arriving = 0
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def waiting(self) -> int:
        """Requests waiting to run (cancelled ones no longer count)."""
        with self._ready:
            return sum(not job.future.cancelled() for job in self._queue)

    @contextmanager
    def arriving(self) -> Iterator[None]:
        """Mark a request the server is reading and checking, to be submitted at the end of
        the block (or refused): a batch about to start waits for it, briefly."""
        with self._ready:
            self._arriving += 1
        try:
            yield
        finally:
            with self._ready:
                self._arriving -= 1
                self._ready.notify()

    def submit(self, text: str, layers: Sequence[int], heads: Sequence[int], tokens: int) -> Job:
        """Queue a request.

        Raises:
            QueueFull: ``max_queue`` requests are already waiting.
        """
        job = Job(text, tuple(layers), tuple(heads), tokens)
        with self._ready:
            self._drop_cancelled()
            if len(self._queue) >= self.max_queue:
                raise QueueFull.estimated(len(self._queue), self._seconds_per_text)
            self._queue.append(job)
            self._ready.notify()
        return job

    def _drop_cancelled(self) -> None:
        self._queue = deque(job for job in self._queue if not job.future.cancelled())

    def _next_batch(self) -> list[Job]:
        """Wait for a request; take it and every waiting one that can share its pass."""
        with self._ready:
            while True:
                self._drop_cancelled()
                if not self._queue:
                    self._ready.wait()
                    continue
                expected = self.batches[-1] if self.batches and self.batches[-1] > 1 else 0
                if expected or self._arriving:
                    deadline = time.monotonic() + max(GATHER_MIN_S, GATHER_SHARE * self._last_batch_seconds)
                    while (len(self._queue) < expected or self._arriving) and (left := deadline - time.monotonic()) > 0:
                        self._ready.wait(left)
                    self._drop_cancelled()
                if self._queue:
                    break
            first = self._queue.popleft()
            batch = [first]
            longest = first.tokens
            rest: deque[Job] = deque()
            for job in self._queue:
                fits = (job.layers, job.heads) == (first.layers, first.heads) and (
                    getattr(self.model, "causal", False) or job.tokens == first.tokens
                )
                padded = (len(batch) + 1) * max(longest, job.tokens)
                if fits and padded <= self.batch_tokens and hasattr(self.model, "run_batch"):
                    batch.append(job)
                    longest = max(longest, job.tokens)
                else:
                    rest.append(job)
            self._queue = rest
        # A job cancelled from here on has lost its client while running: it runs anyway.
        return [job for job in batch if job.future.set_running_or_notify_cancel()]

    def _serve(self) -> None:
        while True:
            batch = self._next_batch()
            if not batch:
                continue
            started = time.perf_counter()
            self.batches.append(len(batch))
            if hasattr(self.model, "run_batch"):
                self._run_together(batch)
            else:
                self._run_alone(batch[0])
            self._last_batch_seconds = time.perf_counter() - started
            self._seconds_per_text = moving_average(self._seconds_per_text, self._last_batch_seconds / len(batch))

    def _run_together(self, batch: list[Job]) -> None:
        """One pass for the batch; stopped once every client has gone."""

        def everyone_gone() -> bool:
            return all(job.abandoned.is_set() for job in batch)

        first = batch[0]
        try:
            runs = self.model.run_batch(
                [job.text for job in batch],
                return_weights=list(first.layers),
                heads=list(first.heads),
                logits=False,
                stop=everyone_gone,
            )
        except Exception as err:  # noqa: BLE001 - handed to the requests, which report it
            if everyone_gone() or len(batch) == 1:
                for job in batch:
                    job.future.set_exception(err)
            else:  # one bad text: each runs alone and gets its own answer
                for job in batch:
                    self._run_alone(job)
        else:
            for job, run in zip(batch, runs):
                job.future.set_result(run)

    def _run_alone(self, job: Job) -> None:
        try:
            run = self.model.run(job.text, return_weights=list(job.layers), heads=list(job.heads))
        except Exception as err:  # noqa: BLE001 - handed to the request, which reports it
            job.future.set_exception(err)
        else:
            job.future.set_result(run)
