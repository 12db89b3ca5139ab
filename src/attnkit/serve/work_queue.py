"""One model's long-context requests, queued and run one at a time on their own thread.

A long-context request runs for seconds to a minute. It waits here, not on a worker thread
of the server: a waiting request holds no thread, so that however many wait, the server's
other routes (``GET /api/info``) answer at once. As the batcher's
(:mod:`attnkit.serve.batching`), the queue is bounded: past ``max_queue`` waiting requests,
:meth:`WorkQueue.submit` raises :class:`attnkit.serve.batching.QueueFull` with a retry delay
(the server's 429). A request whose client has gone is cancelled and never runs; one whose
client goes while it runs is asked to stop (its work is handed a ``stop()`` that turns true).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attnkit.serve.batching import QueueFull, Ticket, moving_average


@dataclass
class QueuedWork(Ticket):
    """One request's work, waiting for or run by the queue's thread.

    Attributes:
        work: ``stop -> result``; ``stop()`` turns true when the client has gone, and the
            work may then end early by raising.
    """

    work: Callable[[Callable[[], bool]], Any]


class WorkQueue:
    """Runs one model's long-context work on one thread, one request at a time.

    Args:
        max_queue: the most requests waiting (not counting the one running).
        name: the thread's name.

    Attributes:
        running: the request being run, if any (for tests and monitoring).
    """

    def __init__(self, *, max_queue: int, name: str) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be at least 1, got {max_queue}")
        self.max_queue = max_queue
        self._queue: deque[QueuedWork] = deque()
        self._ready = threading.Condition()
        self._seconds_each = 0.0
        self.running: QueuedWork | None = None
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def waiting(self) -> int:
        """Requests waiting to run (cancelled ones no longer count)."""
        with self._ready:
            return sum(not task.future.cancelled() for task in self._queue)

    def submit(self, work: Callable[[Callable[[], bool]], Any]) -> QueuedWork:
        """Queue ``work`` (``stop -> result``).

        Raises:
            QueueFull: ``max_queue`` requests are already waiting.
        """
        task = QueuedWork(work)
        with self._ready:
            self._queue = deque(waiting for waiting in self._queue if not waiting.future.cancelled())
            if len(self._queue) >= self.max_queue:
                raise QueueFull.estimated(len(self._queue), self._seconds_each)
            self._queue.append(task)
            self._ready.notify()
        return task

    def _next(self) -> QueuedWork:
        """Wait for a request that its client still waits for, and mark it running."""
        while True:
            with self._ready:
                while not self._queue:
                    self._ready.wait()
                task = self._queue.popleft()
            if task.future.set_running_or_notify_cancel():
                return task

    def _serve(self) -> None:
        while True:
            task = self.running = self._next()
            started = time.perf_counter()
            try:
                result = task.work(task.abandoned.is_set)
            except Exception as err:  # noqa: BLE001 - handed to the request, which reports it
                task.future.set_exception(err)
            else:
                task.future.set_result(result)
            self.running = None
            self._seconds_each = moving_average(self._seconds_each, time.perf_counter() - started)
