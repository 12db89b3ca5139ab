"""The Batcher on its own: batches by layers and heads, the queue bound, cancellation, and
gathering the clients of the last batch before starting the next."""

from __future__ import annotations

import threading
import time

import pytest

from attnkit.serve.batching import Batcher, QueueFull


class Recorder:
    """A model that records each pass's texts and waits ``seconds`` in it (after the gate)."""

    causal = True

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds
        self.gate = threading.Event()
        self.gate.set()
        self.passes: list[list[str]] = []

    def _pass(self, texts: list[str]) -> list[str]:
        self.passes.append(list(texts))
        assert self.gate.wait(30)
        time.sleep(self.seconds)
        return [f"run of {t}" for t in texts]

    def run(self, text, *, return_weights, heads):
        if text == "bad":
            raise ValueError("bad text")
        return self._pass([text])[0]

    def run_batch(self, texts, *, return_weights, heads, logits, stop):
        assert logits is False
        if "bad" in texts:
            raise ValueError("one bad text" if len(texts) > 1 else "bad text")
        runs = self._pass(texts)
        if stop():
            raise RuntimeError("stopped")
        return runs


def _wait_started(model: Recorder, count: int) -> None:
    deadline = time.monotonic() + 20
    while len(model.passes) < count:
        assert time.monotonic() < deadline
        time.sleep(0.005)


def test_only_requests_for_the_same_layers_and_heads_share_a_pass():
    model = Recorder()
    model.gate.clear()
    batcher = Batcher(model, max_queue=10)
    first = batcher.submit("first", [0], [0], 1)
    _wait_started(model, 1)
    jobs = [batcher.submit(t, layers, [0], 1) for t, layers in (("a", [0]), ("b", [1]), ("c", [0]))]
    model.gate.set()
    assert [job.future.result(10) for job in [first, *jobs]] == ["run of first", "run of a", "run of b", "run of c"]
    assert model.passes == [["first"], ["a", "c"], ["b"]]


def test_a_bad_text_fails_alone():
    model = Recorder()
    model.gate.clear()
    batcher = Batcher(model, max_queue=10)
    batcher.submit("first", [0], [0], 1)
    _wait_started(model, 1)
    good, bad = batcher.submit("good", [0], [0], 1), batcher.submit("bad", [0], [0], 1)
    model.gate.set()
    assert good.future.result(10) == "run of good"
    with pytest.raises(ValueError, match="bad text"):
        bad.future.result(10)


def test_the_queue_is_bounded_and_cancelled_requests_leave_it():
    model = Recorder()
    model.gate.clear()
    batcher = Batcher(model, max_queue=2)
    batcher.submit("first", [0], [0], 1)
    _wait_started(model, 1)
    a, _ = batcher.submit("a", [0], [0], 1), batcher.submit("b", [0], [0], 1)
    with pytest.raises(QueueFull, match="2 requests are waiting") as full:
        batcher.submit("c", [0], [0], 1)
    assert full.value.retry_after >= 1
    assert a.future.cancel() and batcher.waiting() == 1
    batcher.submit("c", [0], [0], 1)
    model.gate.set()
    _wait_started(model, 2)
    assert model.passes[1] == ["b", "c"]


@pytest.mark.slow
def test_after_a_batch_the_next_waits_for_the_same_clients():
    """Clients answered together come back some milliseconds apart: the first of them
    does not run alone while the others queue behind it."""
    model = Recorder(seconds=1.0)
    model.gate.clear()
    batcher = Batcher(model, max_queue=10)
    batcher.submit("first", [0], [0], 1)
    _wait_started(model, 1)
    round_one = [batcher.submit(t, [0], [0], 1) for t in ("a", "b", "c")]
    model.gate.set()
    for job in round_one:
        job.future.result(30)
    again = [batcher.submit("a2", [0], [0], 1)]
    time.sleep(0.05)  # well inside the wait, half of the 1 s pass
    again += [batcher.submit(t, [0], [0], 1) for t in ("b2", "c2")]
    for job in again:
        job.future.result(30)
    assert model.passes[-1] == ["a2", "b2", "c2"]


def test_a_batch_waits_for_a_request_being_read():
    model = Recorder()
    batcher = Batcher(model, max_queue=10)
    with batcher.arriving():  # a request the server is still checking
        first = batcher.submit("a", [0], [0], 1)
        second = batcher.submit("b", [0], [0], 1)
    assert (first.future.result(10), second.future.result(10)) == ("run of a", "run of b")
    assert model.passes == [["a", "b"]]


def test_a_pass_whose_clients_have_all_gone_stops():
    model = Recorder()
    model.gate.clear()
    batcher = Batcher(model, max_queue=10)
    gone, stays = batcher.submit("gone", [0], [0], 1), None
    _wait_started(model, 1)
    gone.abandon()  # while its pass runs
    stays = batcher.submit("stays", [0], [0], 1)
    model.gate.set()
    with pytest.raises(RuntimeError, match="stopped"):
        gone.future.result(10)
    assert stays.future.result(10) == "run of stays"
