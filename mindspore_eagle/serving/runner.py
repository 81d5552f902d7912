"""``EngineRunner``: the one thread that steps a ``BatchEngine``, and per-request streams for asyncio handlers.

Why a thread: a step is one blocking teacher forward (tens of milliseconds); the HTTP handlers must keep
accepting, streaming and noticing disconnects meanwhile. The runner owns ``engine.step``; handlers only call
``submit`` / ``cancel`` (thread-safe in the engine) and read their ``Stream``. Events are handed to the event loop
with ``call_soon_threadsafe``, so a stream's queue is only touched by the loop.

A step that raises (a bug, never bad input: that is refused at ``submit``) fails every running request with the
error instead of hanging them, and the runner keeps serving the others that come after.

Shutdown drains: ``drain(seconds)`` (called from the SIGTERM handler, so it only stores a deadline) lets the requests
in flight run on; at the deadline the runner cancels those still open and ends their streams with a shutdown error
(``SHUTDOWN_STATUS``), which the server answers 503 -- never a half answer presented as complete, never the
anonymous 500 a web server gives a handler it had to kill.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import Callable

from .batch import BatchEngine, Request


SHUTDOWN_STATUS = 503  # the HTTP status of a request the drain deadline cancelled


@dataclass(frozen=True)
class StreamItem:
    tokens: tuple[int, ...]
    finish_reason: str | None  # set on the last item
    error: str | None = None
    status: int = 500  # the HTTP status of ``error``: 500 a failed step, SHUTDOWN_STATUS a shutdown cancellation


class Stream:
    """What one handler reads: the request and an asyncio queue of ``StreamItem``s, the last with a finish reason."""

    def __init__(self, request: Request, loop: asyncio.AbstractEventLoop):
        self.request = request
        self.loop = loop
        self.queue: asyncio.Queue[StreamItem] = asyncio.Queue()

    def push(self, item: StreamItem) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


class EngineRunner:
    """Steps ``engine`` on a daemon thread while it has work; ``on_step(events, seconds)`` observes every step."""

    def __init__(self, engine: BatchEngine, on_step: Callable[[list, float], None] | None = None):
        self.engine = engine
        self.on_step = on_step
        self._streams: dict[str, Stream] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._drain_deadline: float | None = None  # time.monotonic() at which a shutdown cancels what is open
        self._drain_seconds = 0.0
        self._shutdown_ids: set[str] = set()
        self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)
        self.errors = 0

    def start(self) -> None:
        self._thread.start()

    def drain(self, seconds: float) -> None:
        """Shut down gracefully: requests in flight may run ``seconds`` more, then are cancelled with a shutdown
        error. Safe in a signal handler: it only stores the deadline (the loop looks at it every step or 50 ms)."""
        if self._drain_deadline is None:
            self._drain_seconds = seconds
            self._drain_deadline = time.monotonic() + seconds

    @property
    def draining(self) -> bool:
        return self._drain_deadline is not None

    @property
    def cancelled_at_shutdown(self) -> int:
        """Requests the shutdown cancelled: at the drain deadline or, still open, in ``shutdown``."""
        with self._lock:
            return len(self._shutdown_ids)

    def submit(self, loop: asyncio.AbstractEventLoop, **kwargs) -> Stream:
        """``engine.submit(**kwargs)`` (its typed errors propagate) and a stream of the request's tokens."""
        with self._lock:
            req = self.engine.submit(**kwargs)
            stream = Stream(req, loop)
            self._streams[req.id] = stream
        self._wake.set()
        return stream

    def cancel(self, request_id: str) -> None:
        self.engine.cancel(request_id)
        self._wake.set()

    @property
    def open_streams(self) -> int:
        with self._lock:
            return len(self._streams)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Cancel everything in flight (with the shutdown error), let the engine free the slots, and stop the
        thread."""
        self._cancel_for_shutdown()
        self._stop = True
        self._wake.set()
        self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            if self._drain_deadline is not None and time.monotonic() >= self._drain_deadline:
                self._cancel_for_shutdown()
            if not self.engine.has_work():
                if self._stop:
                    return
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            t0 = time.perf_counter()
            try:
                events = self.engine.step()
            except Exception as exc:  # a bug: fail the requests in flight, keep serving
                self.errors += 1
                self._fail_running(f"{type(exc).__name__}: {exc}")
                continue
            seconds = time.perf_counter() - t0
            for ev in events:
                with self._lock:
                    stream = self._streams.get(ev.request.id)
                    if ev.finish_reason is not None:
                        self._streams.pop(ev.request.id, None)
                if stream is None:
                    continue
                if ev.finish_reason == "cancelled" and ev.request.id in self._shutdown_ids:
                    stream.push(StreamItem(ev.tokens, ev.finish_reason, self._shutdown_message(ev.request),
                                           SHUTDOWN_STATUS))
                else:
                    stream.push(StreamItem(ev.tokens, ev.finish_reason))
            if self.on_step is not None:
                self.on_step(events, seconds)

    def _cancel_for_shutdown(self) -> None:
        with self._lock:
            ids = [rid for rid in self._streams if rid not in self._shutdown_ids]
            self._shutdown_ids.update(ids)
        for rid in ids:
            self.engine.cancel(rid)

    def _shutdown_message(self, req: Request) -> str:
        return (f"the server is shutting down: the request was cancelled after {len(req.tokens)} generated tokens, "
                f"{self._drain_seconds:g} s after the shutdown began (serve --shutdown-timeout); send it again to "
                "another server or after the restart")

    def _fail_running(self, message: str) -> None:
        for req in list(self.engine.running):
            self.engine._finish(req, "error")
            with self._lock:
                stream = self._streams.pop(req.id, None)
            if stream is not None:
                stream.push(StreamItem((), "error", message))


__all__ = ["EngineRunner", "Stream", "StreamItem"]
