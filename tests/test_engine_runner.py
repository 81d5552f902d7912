"""The server's engine runner shuts down by draining: requests in flight at SIGTERM run on until the drain deadline,
then are cancelled and their streams end with a 503 shutdown error naming what happened; the engine keeps no
request. A stand-in engine (one token per request per step, cancels at the next step, as ``BatchEngine`` does)
makes the timing deterministic; the server test drives the real engine through SIGTERM."""

import asyncio
import itertools
import time

from mindspore_eagle.serving.batch import Event
from mindspore_eagle.serving.runner import SHUTDOWN_STATUS, EngineRunner, StreamItem
from mindspore_eagle.serving.server import failure_body


class Req:
    def __init__(self, rid, max_new_tokens):
        self.id, self.max_new_tokens, self.tokens, self.finished = rid, max_new_tokens, [], False


class OneTokenEngine:
    """Each step: a cancelled request ends "cancelled", every other running request gets one token."""

    def __init__(self, step_s=0.002):
        self.running, self.cancelled, self.step_s, self._ids = [], set(), step_s, itertools.count()

    def submit(self, max_new_tokens, **_):
        req = Req(f"r{next(self._ids)}", max_new_tokens)
        self.running.append(req)
        return req

    def cancel(self, rid):
        self.cancelled.add(rid)

    def has_work(self):
        return bool(self.running)

    def step(self):
        time.sleep(self.step_s)
        events = []
        for req in list(self.running):
            if req.id in self.cancelled:
                events.append(self._finish(req, "cancelled"))
                continue
            req.tokens.append(7)
            done = len(req.tokens) >= req.max_new_tokens
            events.append(Event(req, (7,), "max_new_tokens" if done else None))
            if done:
                self.running.remove(req)
                req.finished = True
        return events

    def _finish(self, req, reason):
        self.running.remove(req)
        req.finished = True
        return Event(req, (), reason)


async def _drain_and_read(max_new_tokens: int, drain_s: float) -> list[StreamItem]:
    engine = OneTokenEngine()
    runner = EngineRunner(engine)
    runner.start()
    stream = runner.submit(asyncio.get_running_loop(), max_new_tokens=max_new_tokens)
    await asyncio.sleep(0.05)  # a few steps in flight
    runner.drain(drain_s)
    items, deadline = [], time.monotonic() + drain_s + 10
    while (not items or items[-1].finish_reason is None) and time.monotonic() < deadline:
        items.append(await asyncio.wait_for(stream.queue.get(), timeout=30))
    await asyncio.get_running_loop().run_in_executor(None, runner.shutdown)
    assert items[-1].finish_reason is not None, f"still streaming {drain_s + 10:g} s after the drain began"
    assert not engine.running and runner.open_streams == 0
    # what the server's "engine stopped" line reports
    assert runner.cancelled_at_shutdown == (items[-1].finish_reason == "cancelled")
    return items


def test_a_request_that_ends_within_the_drain_finishes_normally():
    items = asyncio.run(_drain_and_read(max_new_tokens=200, drain_s=30.0))
    assert items[-1].finish_reason == "max_new_tokens" and items[-1].error is None
    assert sum(len(i.tokens) for i in items) == 200


def test_a_request_still_running_at_the_drain_deadline_ends_with_a_503_shutdown_error():
    t0 = time.monotonic()
    items = asyncio.run(_drain_and_read(max_new_tokens=10**9, drain_s=0.3))
    assert time.monotonic() - t0 < 10
    last = items[-1]
    assert last.finish_reason == "cancelled" and last.status == SHUTDOWN_STATUS
    generated = sum(len(i.tokens) for i in items)
    assert generated > 0 and f"after {generated} generated tokens" in last.error
    body = failure_body(last)["error"]
    assert body["type"] == "service_unavailable_error" and "shutting down" in body["message"]
    assert "--shutdown-timeout" in body["message"]


def test_a_failed_step_still_answers_500_with_its_error():
    body = failure_body(StreamItem((), "error", "ValueError: boom"))
    assert body["error"]["type"] == "server_error" and "boom" in body["error"]["message"]
