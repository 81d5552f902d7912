"""``mindspore-eagle serve``: an OpenAI-compatible HTTP server over the continuous-batching engine.

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions`` (streaming by SSE with ``stream: true``, ending
with ``data: [DONE]``), ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus text). Every response
carries ``usage`` and the extension ``speculative`` (steps, drafted, accepted, tau) of its request.

What the server guarantees:
  * bad input -> 4xx with an OpenAI-style error body naming the field, before anything is queued
    (``protocol.parse``; a prompt that cannot fit a slot -> 400; body over ``max_body_bytes`` -> 413);
  * overload -> 429 once ``max_queued`` requests wait (the engine's bounded queue);
  * a client that disconnects (streaming or not) cancels its request: the slot is free at the next step;
  * stop strings end the request on the server (the engine stops at the next step), the text cut before them;
  * shutdown (SIGTERM / Ctrl-C) drains: requests in flight run on for ``serve --shutdown-timeout`` seconds, then
    are cancelled and answered 503 (a stream ends with an error event); new requests meanwhile get 503; then the
    engine thread stops with every slot free; nothing hangs.
Binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from ..errors import CacheCapacityError, ConfigError, TokenizerError
from .batch import BatchEngine, QueueFullError
from .protocol import BadRequest, GenerationRequest, parse
from .runner import SHUTDOWN_STATUS, EngineRunner, Stream, StreamItem

FINISH = {"eos": "stop", "stop": "stop", "max_new_tokens": "length", "cache_full": "length"}


@dataclass(frozen=True)
class ServerConfig:
    model_name: str  # what /v1/models lists and requests must name (or omit)
    max_tokens_default: int = 256
    max_body_bytes: int = 1 << 20


class Metrics:
    """Prometheus counters (vLLM's names where they exist) in the server's own registry."""

    def __init__(self, engine: BatchEngine):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        r = self.registry = CollectorRegistry()
        self.requests = Counter("mse_requests", "finished requests by finish reason", ["finish_reason"], registry=r)
        self.prompt_tokens = Counter("mse_prompt_tokens", "prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter("mse_generation_tokens", "tokens generated", registry=r)
        self.drafts = Counter("mse_spec_decode_num_drafts", "request-steps that verified at least one draft",
                              registry=r)
        self.draft_tokens = Counter("mse_spec_decode_num_draft_tokens", "draft tokens verified", registry=r)
        self.accepted_tokens = Counter("mse_spec_decode_num_accepted_tokens", "draft tokens accepted", registry=r)
        self.head_growths = Counter("mse_spec_decode_num_head_growths",
                                    "request-steps whose candidates include the EAGLE-3 head's", registry=r)
        self.steps = Counter("mse_engine_steps", "batched forward steps", registry=r)
        self.step_seconds = Histogram("mse_engine_step_seconds", "seconds per engine step", registry=r,
                                      buckets=(0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5))
        self.rejected = Counter("mse_rejected_requests", "requests refused before queueing, by status", ["status"],
                                registry=r)
        Gauge("mse_num_requests_running", "requests holding a slot", registry=r).set_function(
            lambda: len(engine.running))
        Gauge("mse_num_requests_waiting", "requests queued for a slot", registry=r).set_function(
            lambda: engine.num_waiting)
        Gauge("mse_free_slots", "slots free", registry=r).set_function(lambda: len(engine.free_slots))
        Gauge("mse_max_seqs", "slots in total", registry=r).set_function(lambda: engine.max_seqs)

    def on_step(self, events, seconds: float) -> None:
        self.steps.inc()
        self.step_seconds.observe(seconds)
        for ev in events:
            self.generation_tokens.inc(len(ev.tokens))
            if ev.finish_reason is not None:
                self.requests.labels(ev.finish_reason).inc()

    def on_finish(self, stats) -> None:
        if stats.drafted:
            self.drafts.inc(stats.draft_steps)
            self.draft_tokens.inc(stats.drafted)
            self.accepted_tokens.inc(stats.accepted)
        self.head_growths.inc(stats.head_growths)


class TextStream:
    """Incremental detokenization with stop strings: ``feed(tokens)`` -> new text safe to send (never half a
    character, never a prefix of a stop string that may still complete), ``stopped`` once a stop string appeared."""

    def __init__(self, tokenizer, eos: frozenset, stops: tuple[str, ...]):
        self.tok, self.eos, self.stops = tokenizer, eos, stops
        self.ids: list[int] = []
        self.sent = 0
        self.text = ""
        self.stopped = False

    def feed(self, tokens, final: bool = False) -> str:
        self.ids += [t for t in tokens if t not in self.eos]
        text = self.tok.decode(self.ids)
        if text.endswith("\ufffd") and not final:  # an incomplete UTF-8 sequence: wait for the next token
            text = text[:-1]
        for s in self.stops:
            k = text.find(s)
            if k >= 0:
                text, self.stopped, final = text[:k], True, True
        hold = 0
        if not final:  # keep back a tail that could be the start of a stop string
            for s in self.stops:
                for n in range(min(len(s) - 1, len(text)), 0, -1):
                    if text.endswith(s[:n]):
                        hold = max(hold, n)
                        break
        upto = max(self.sent, len(text) - hold)
        out = text[self.sent:upto]
        self.sent = upto
        self.text = text[:upto]
        return out


def failure_body(item: StreamItem) -> dict:
    """The OpenAI-style error body of a request that ended with ``item.error``: a shutdown cancellation (503) or a
    failed step (500)."""
    if item.status == SHUTDOWN_STATUS:
        return {"error": {"message": item.error, "type": "service_unavailable_error", "param": None, "code": None}}
    return {"error": {"message": f"generation failed: {item.error}", "type": "server_error", "param": None,
                      "code": None}}


def create_app(engine: BatchEngine, tokenizer, eos, config: ServerConfig):
    """The FastAPI application over ``engine`` (its runner thread starts with the app, stops with it)."""
    from contextlib import asynccontextmanager

    metrics = Metrics(engine)
    runner = EngineRunner(engine, metrics.on_step)
    eos = frozenset(int(e) for e in eos)

    @asynccontextmanager
    async def lifespan(app):
        runner.start()
        yield
        await asyncio.get_running_loop().run_in_executor(None, runner.shutdown)
        print(f"engine stopped: {runner.cancelled_at_shutdown} request(s) in flight cancelled, {len(engine.free_slots)}/"
              f"{engine.max_seqs} slots free", file=sys.stderr, flush=True)

    app = FastAPI(title="mindspore-eagle", lifespan=lifespan)
    app.state.runner, app.state.engine, app.state.metrics = runner, engine, metrics

    def error(exc: BadRequest) -> JSONResponse:
        metrics.rejected.labels(str(exc.status)).inc()
        return JSONResponse(exc.body(), status_code=exc.status)

    async def read_body(request: Request):
        raw = await request.body()
        if len(raw) > config.max_body_bytes:
            raise BadRequest(f"request body of {len(raw)} bytes exceeds the limit of {config.max_body_bytes}", None,
                             413)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadRequest(f"request body is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise BadRequest(f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") \
                from None

    def prompt_ids(req: GenerationRequest) -> list[int]:
        try:
            if req.chat:
                return tokenizer.encode_chat(list(req.messages))
            if isinstance(req.prompt, str):
                return tokenizer.encode(req.prompt)
            return list(req.prompt)
        except TokenizerError as exc:
            raise BadRequest(f"the prompt cannot be tokenized: {exc}", "messages" if req.chat else "prompt") from None

    def start(body, chat: bool, loop) -> tuple[GenerationRequest, Stream, TextStream]:
        req = parse(body, chat, engine.max_nodes)
        if runner.draining:
            raise BadRequest("the server is shutting down and takes no new requests; send it to another server or "
                             "after the restart", None, SHUTDOWN_STATUS, "service_unavailable_error")
        model = body.get("model")
        if model is not None and model != config.model_name:
            raise BadRequest(f"model {model!r} is not served here; this server serves {config.model_name!r} "
                             "(GET /v1/models)", "model", 404, "not_found_error")
        ids = prompt_ids(req)
        room = engine.slot_len - len(ids)
        max_tokens = req.max_tokens if req.max_tokens is not None else config.max_tokens_default
        if room < 1:
            raise BadRequest(f"the prompt has {len(ids)} tokens; this server's context is {engine.slot_len} tokens "
                             f"(prompt + completion): shorten the prompt", "messages" if chat else "prompt")
        try:
            stream = runner.submit(loop, prompt=ids, max_new_tokens=max_tokens, eos=tuple(eos),
                                   sampling=req.sampling, max_nodes=req.speculative, proposer=req.proposer)
        except QueueFullError as exc:
            raise BadRequest(str(exc), None, 429, "rate_limit_error") from None
        except (ConfigError, CacheCapacityError) as exc:
            raise BadRequest(str(exc)) from None
        metrics.prompt_tokens.inc(len(ids))
        return req, stream, TextStream(tokenizer, eos, req.stop)

    def usage(stream: Stream) -> dict:
        r = stream.request
        return {"prompt_tokens": len(r.prompt), "completion_tokens": len(r.tokens),
                "total_tokens": len(r.prompt) + len(r.tokens)}

    def spec_stats(stream: Stream) -> dict:
        s = stream.request.stats
        return {"steps": s.steps, "drafted": s.drafted, "accepted": s.accepted,
                "tau": round(s.tau, 4) if s.steps else None, "head_growths": s.head_growths}

    async def finish(stream: Stream, text: TextStream) -> str:
        """Cancel the request if it is still running; record its statistics; the OpenAI finish reason."""
        r = stream.request
        if not r.finished:
            runner.cancel(r.id)
        metrics.on_finish(r.stats)
        if text.stopped:
            return "stop"
        return FINISH.get(r.finish_reason or "", "stop")

    async def generate(request: Request, chat: bool):
        loop = asyncio.get_running_loop()
        try:
            body = await read_body(request)
            req, stream, text = start(body, chat, loop)
        except BadRequest as exc:
            return error(exc)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"

        def choice(delta_text: str, reason, streaming: bool) -> dict:
            if chat:
                key = "delta" if streaming else "message"
                content = {"role": "assistant", "content": delta_text} if not streaming else {"content": delta_text}
                return {"index": 0, key: content, "finish_reason": reason, "logprobs": None}
            return {"index": 0, "text": delta_text, "finish_reason": reason, "logprobs": None}

        if not req.stream:
            try:
                reason, err = await collect(stream, text, request)
            except asyncio.CancelledError:
                runner.cancel(stream.request.id)
                raise
            if reason is None:  # the client went away
                await finish(stream, text)
                return JSONResponse({"error": {"message": "client disconnected", "type": "cancelled"}}, 499)
            if err is not None:
                return JSONResponse(failure_body(err), err.status)
            final = await finish(stream, text)
            return JSONResponse({"id": rid, "object": obj, "created": created, "model": config.model_name,
                                 "choices": [choice(text.text, final, False)], "usage": usage(stream),
                                 "speculative": spec_stats(stream)})

        chunk_obj = "chat.completion.chunk" if chat else "text_completion"

        async def events():
            def sse(payload: dict) -> str:
                return "data: " + json.dumps(payload, ensure_ascii=False) + "\n\n"

            base = {"id": rid, "object": chunk_obj, "created": created, "model": config.model_name}
            done = False
            try:
                if chat:
                    yield sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                    "finish_reason": None, "logprobs": None}]})
                while True:
                    item = await stream.queue.get()
                    if item.error is not None:
                        yield sse(failure_body(item))
                        break
                    delta = text.feed(item.tokens, final=item.finish_reason is not None)
                    if delta:
                        yield sse({**base, "choices": [choice(delta, None, True)]})
                    if item.finish_reason is not None or text.stopped:
                        final = await finish(stream, text)
                        last = {**base, "choices": [choice("", final, True)], "speculative": spec_stats(stream)}
                        if req.include_usage:
                            last["usage"] = usage(stream)
                        yield sse(last)
                        break
                yield "data: [DONE]\n\n"
                done = True
            finally:
                if not done:  # the client disconnected (the generator was closed) or an error above
                    runner.cancel(stream.request.id)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Request-Id": rid})

    async def collect(stream: Stream, text: TextStream, request: Request):
        """Wait for the whole answer: (finish reason, None), ("error", the failed item), or (None, None) if the client
        disconnected first."""
        while True:
            try:
                item = await asyncio.wait_for(stream.queue.get(), timeout=0.25)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    runner.cancel(stream.request.id)
                    return None, None
                continue
            if item.error is not None:
                return "error", item
            text.feed(item.tokens, final=item.finish_reason is not None)
            if item.finish_reason is not None or text.stopped:
                return item.finish_reason or "stop", None

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, False)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": config.model_name, "object": "model", "created": 0,
                                            "owned_by": "mindspore-eagle",
                                            "max_model_len": engine.slot_len}]}

    @app.get("/health")
    async def health():
        return {"status": "ok", "running": len(engine.running), "waiting": engine.num_waiting,
                "free_slots": len(engine.free_slots), "max_seqs": engine.max_seqs, "steps": engine.steps,
                "open_streams": runner.open_streams, "engine_errors": runner.errors}

    @app.get("/metrics")
    async def metrics_text():
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return PlainTextResponse(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


__all__ = ["Metrics", "ServerConfig", "TextStream", "create_app"]
