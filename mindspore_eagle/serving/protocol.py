"""The OpenAI request bodies the server accepts, parsed and checked before any work: ``BadRequest`` names the field.

Supported: ``model``, ``messages`` (chat) or ``prompt`` (completions: a string or a list of token ids),
``max_tokens`` / ``max_completion_tokens``, ``stop`` (string or up to 4 strings), ``temperature``, ``top_p``,
``top_k``, ``seed``, ``stream``, ``stream_options.include_usage``, ``n`` (1 only), ``user`` (ignored), and the
extension ``speculative``: ``false`` (plain decoding), ``true`` (the server's drafting) or an object with
``max_nodes`` (a smaller bound on the nodes a step verifies; clamped by the server's) and/or ``proposer`` (this
request's draft source: "eagle", "suffix" or "hybrid"; the head's sources need a server started with a head).
Refused with a message (never ignored silently): ``n > 1``, ``logprobs``, ``tools``, ``response_format``,
``best_of > 1``, ``echo``, penalties != 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..drafting import PROPOSERS
from ..verify import SamplingParams

MAX_STOP = 4
MAX_STOP_LEN = 256


class BadRequest(Exception):
    """A 4xx answer: ``status``, a message naming the problem and what to do, the offending ``param``."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status, self.kind = message, param, status, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


@dataclass(frozen=True)
class GenerationRequest:
    """A checked request: either chat ``messages`` or a completion ``prompt`` (text or ids)."""

    chat: bool
    messages: tuple[dict, ...] | None
    prompt: str | tuple[int, ...] | None
    max_tokens: int | None
    stop: tuple[str, ...]
    sampling: SamplingParams
    stream: bool
    include_usage: bool
    speculative: int | None  # None: the server's bound; 1: off; N: at most N nodes per step
    proposer: str | None = None  # this request's draft source; None: the server's


def _int(body: dict, key: str, lo: int, hi: int | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadRequest(f"'{key}' must be an integer, got {type(v).__name__}", key)
    if v < lo or (hi is not None and v > hi):
        raise BadRequest(f"'{key}'={v} is out of range: must be in [{lo}, {hi if hi is not None else 'inf'}]", key)
    return v


def _num(body: dict, key: str, lo: float, hi: float, default: float, lo_open: bool = False) -> float:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise BadRequest(f"'{key}' must be a finite number, got {v!r}", key)
    if v < lo or v > hi or (lo_open and v == lo):
        raise BadRequest(f"'{key}'={v} is out of range: must be in {'(' if lo_open else '['}{lo}, {hi}]", key)
    return float(v)


def _content(message: dict, i: int) -> str:
    c = message.get("content")
    if isinstance(c, str):
        return c
    if isinstance(c, list) and all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                                   for p in c):
        return "".join(p["text"] for p in c)
    raise BadRequest(f"messages[{i}].content must be a string or a list of text parts ({{'type': 'text', 'text': "
                     f"...}}); other content types are not supported", f"messages[{i}].content")


def parse(body, chat: bool, max_nodes: int) -> GenerationRequest:
    """``body`` (decoded JSON) -> ``GenerationRequest``, or ``BadRequest`` naming the first problem."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    for key, bad in (("n", lambda v: v != 1), ("best_of", lambda v: v != 1), ("logprobs", lambda v: bool(v)),
                     ("top_logprobs", lambda v: bool(v)), ("echo", lambda v: bool(v)), ("tools", lambda v: bool(v)),
                     ("functions", lambda v: bool(v)), ("response_format", lambda v: v not in ({"type": "text"},)),
                     ("frequency_penalty", lambda v: v != 0), ("presence_penalty", lambda v: v != 0),
                     ("logit_bias", lambda v: bool(v)), ("suffix", lambda v: bool(v))):
        if key in body and body[key] is not None and bad(body[key]):
            raise BadRequest(f"'{key}'={body[key]!r} is not supported by this server (drop it, or use its default)",
                             key)
    messages = prompt = None
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise BadRequest("'messages' must be a non-empty list of {'role', 'content'} objects", "messages")
        out = []
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
                raise BadRequest(f"messages[{i}] must be an object with 'role' one of system, user, assistant",
                                 f"messages[{i}].role")
            out.append({"role": m["role"], "content": _content(m, i)})
        messages = tuple(out)
    else:
        p = body.get("prompt")
        if isinstance(p, str):
            prompt = p
        elif isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            prompt = tuple(p)
        elif isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
            prompt = p[0]
        else:
            raise BadRequest("'prompt' must be a string or a non-empty list of token ids (one prompt per request)",
                             "prompt")
        if isinstance(prompt, str) and not prompt:
            raise BadRequest("'prompt' is empty: at least one token is required", "prompt")
    max_tokens = _int(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", 1)
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= MAX_STOP:
        stops = tuple(stop)
    else:
        raise BadRequest(f"'stop' must be a string or a list of at most {MAX_STOP} strings", "stop")
    if any(not s or len(s) > MAX_STOP_LEN for s in stops):
        raise BadRequest(f"'stop' strings must be non-empty and at most {MAX_STOP_LEN} characters", "stop")
    temperature = _num(body, "temperature", 0.0, 2.0, 1.0)
    top_p = _num(body, "top_p", 0.0, 1.0, 1.0, lo_open=True)
    top_k = _int(body, "top_k", 0) or 0
    seed = _int(body, "seed", 0, 2 ** 63 - 1) or 0
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be true or false", "stream")
    so = body.get("stream_options") or {}
    if not isinstance(so, dict):
        raise BadRequest("'stream_options' must be an object", "stream_options")
    spec = body.get("speculative", None)
    source = None
    if spec is None or spec is True:
        bound = None
    elif spec is False:
        bound = 1
    elif isinstance(spec, dict) and set(spec) <= {"max_nodes", "proposer"}:
        bound = _int(spec, "max_nodes", 1)
        bound = None if bound is None else min(bound, max_nodes)
        source = spec.get("proposer")
        if source is not None and source not in PROPOSERS:
            raise BadRequest(f"'speculative.proposer'={source!r}: must be one of {list(PROPOSERS)}", "speculative")
    else:
        raise BadRequest("'speculative' must be true, false or an object with \"max_nodes\": N and/or "
                         "\"proposer\": \"eagle\" | \"suffix\" | \"hybrid\"", "speculative")
    return GenerationRequest(chat, messages, prompt, max_tokens, stops,
                             SamplingParams(temperature, top_p, top_k, seed), stream,
                             bool(so.get("include_usage", False)), bound, source)


__all__ = ["BadRequest", "GenerationRequest", "parse"]
