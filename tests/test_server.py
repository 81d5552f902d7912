"""The OpenAI-compatible server, as a real process on 127.0.0.1, driven by the ``openai`` client and raw HTTP:
answers equal to the batch-1 engine's for the same prompt (streaming or not, chat or completion, alone or 8 at
once), stop strings, bad input answered 4xx with a clear body while the server keeps serving, overload answered
429, an abort storm and max_tokens=1 at high parallelism leave every slot free, metrics count speculation, and
SIGTERM shuts it down cleanly."""

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from mindspore_eagle.engine import SpeculativeEngine

MAX_SEQS = 4
MAX_QUEUED = 8
DRAIN_S = 120  # the SIGTERM test's request must end within the drain on the slowest machine, under a loaded suite
PROMPTS = ["What is the capital of France?",
           "Copy this list exactly: apples, bananas, cherries, dates, elderberries, figs, grapes.",
           "Write a Python function that returns the n-th Fibonacci number.",
           "Name three colours.",
           "Explain photosynthesis to a child.",
           "Give me a haiku about autumn.",
           "What is 12 times 7?",
           "List the days of the week."]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(port, path, body=None, raw: bytes | None = None, timeout=60):
    """(status, decoded JSON or text) of a GET (body None) or POST to the server."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        text, status = e.read().decode(), e.code
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tests.helpers import default_model_or_skip

    default_model_or_skip()
    port = _free_port()
    log = tmp_path_factory.mktemp("server") / "serve.log"
    f = open(log, "w")
    proc = subprocess.Popen([sys.executable, "-m", "mindspore_eagle.app.cli", "serve", "--port", str(port),
                             "--max-seqs", str(MAX_SEQS), "--max-cache-len", "384", "--buckets", "1,4,16,64",
                             "--max-queued", str(MAX_QUEUED), "--model-name", "smol",
                             "--shutdown-timeout", str(DRAIN_S)],
                            stdout=f, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {log.read_text()[-3000:]}")
        try:
            if http(port, "/health", timeout=2)[0] == 200:
                break
        except OSError:
            time.sleep(1)
    else:
        proc.kill()
        raise AssertionError(f"server did not start: {log.read_text()[-3000:]}")
    yield port, proc, log
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    f.close()


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=f"http://127.0.0.1:{server[0]}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def expected(default_teacher):
    """prompt -> the batch-1 engine's greedy answer text (what `mindspore-eagle generate` prints)."""
    teacher, tok = default_teacher
    eng = SpeculativeEngine(teacher)
    eos = set(tok.eos_token_ids) | set(teacher.cfg.eos_token_ids)
    out = {}
    for p in PROMPTS:
        g = eng.generate(tok.encode_chat([{"role": "user", "content": p}]), 32, sorted(eos))
        out[p] = tok.decode([t for t in g.tokens if t not in eos])
    return out


def wait_idle(port, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        h = http(port, "/health")[1]
        if h["running"] == 0 and h["waiting"] == 0 and h["free_slots"] == MAX_SEQS:
            return h
        time.sleep(0.2)
    raise AssertionError(f"slots not free: {http(port, '/health')[1]}")


def chat(client, prompt, **kw):
    return client.chat.completions.create(model="smol", messages=[{"role": "user", "content": prompt}],
                                          max_tokens=32, temperature=0, **kw)


def test_chat_answer_equals_the_engines_and_reports_usage_and_speculation(client, expected, server):
    r = chat(client, PROMPTS[1])
    assert r.choices[0].message.content == expected[PROMPTS[1]]
    assert r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 10
    spec = r.model_extra["speculative"]
    assert spec["steps"] >= 1 and spec["accepted"] <= spec["drafted"]
    assert 0 <= spec["head_growths"] <= spec["steps"]  # the default drafting is hybrid: the head may grow
    assert r.choices[0].finish_reason in ("stop", "length")
    wait_idle(server[0])


def test_a_request_may_choose_its_draft_source(client, expected, server):
    """``"speculative": {"proposer": ...}``: the suffix index alone never grows the head; every source gives the
    engine's greedy answer."""
    for source in ("suffix", "eagle", "hybrid"):
        r = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": PROMPTS[0]}],
                                           max_tokens=32, temperature=0,
                                           extra_body={"speculative": {"proposer": source}})
        assert r.choices[0].message.content == expected[PROMPTS[0]], source
        spec = r.model_extra["speculative"]
        assert spec["steps"] >= 1
        if source == "suffix":
            assert spec["head_growths"] == 0
    wait_idle(server[0])


def test_streamed_chat_equals_the_non_streamed_answer(client, expected):
    chunks = list(chat(client, PROMPTS[2], stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected[PROMPTS[2]]
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_completion_with_a_stop_string_ends_before_it(client, default_teacher):
    r = client.completions.create(model="smol", prompt="1, 2, 3, 4, 5,", max_tokens=24, temperature=0)
    full = r.choices[0].text
    assert " 7" in full, full  # the teacher counts on
    r2 = client.completions.create(model="smol", prompt="1, 2, 3, 4, 5,", max_tokens=24, temperature=0, stop=[" 7"])
    assert r2.choices[0].text == full[:full.index(" 7")] and r2.choices[0].finish_reason == "stop"


def test_eight_concurrent_requests_each_equal_their_batch1_answer(client, expected, server):
    async def run():
        import openai

        ac = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server[0]}/v1", api_key="unused", max_retries=0,
                                timeout=300)
        rs = await asyncio.gather(*[ac.chat.completions.create(
            model="smol", messages=[{"role": "user", "content": p}], max_tokens=32, temperature=0,
            stream=i % 2 == 1) for i, p in enumerate(PROMPTS)])
        out = []
        for i, r in enumerate(rs):
            if i % 2:
                out.append("".join([c.choices[0].delta.content or "" async for c in r if c.choices]))
            else:
                out.append(r.choices[0].message.content)
        await ac.close()
        return out

    got = asyncio.run(run())
    assert got == [expected[p] for p in PROMPTS]
    wait_idle(server[0])


@pytest.mark.parametrize("body, status, needle", [
    (b"{bad json", 400, "not valid JSON"),
    (b"\xff\xfe{}", 400, "not valid UTF-8"),
    ({"messages": "hi"}, 400, "'messages'"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "role"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 2}, 400, "'n'"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": True}, 400, "logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": -0.5}, 400, "temperature"),
    ({"messages": [{"role": "user", "content": "x"}], "model": "gpt-9"}, 404, "not served here"),
    ({"messages": [{"role": "user", "content": "word " * 600}]}, 400, "context is 384 tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "speculative": "maybe"}, 400, "speculative"),
    ({"messages": [{"role": "user", "content": "x"}], "speculative": {"proposer": "medusa"}}, 400,
     "must be one of ['eagle', 'suffix', 'hybrid']"),
], ids=["json", "utf8", "messages-type", "role", "negative-max-tokens", "max-tokens-type", "n", "logprobs",
        "temperature", "unknown-model", "too-long", "speculative", "proposer"])
def test_bad_input_gets_a_4xx_naming_the_problem(server, body, status, needle):
    port = server[0]
    code, answer = http(port, "/v1/chat/completions", raw=body if isinstance(body, bytes) else None,
                        body=None if isinstance(body, bytes) else body)
    assert code == status, answer
    assert needle in answer["error"]["message"], answer
    assert http(port, "/health")[0] == 200


def test_an_oversized_body_is_refused_with_413(server):
    code, answer = http(server[0], "/v1/completions", raw=b'{"prompt": "' + b"a" * (1 << 20) + b'"}')
    assert code == 413 and "exceeds the limit" in answer["error"]["message"]


def test_max_tokens_1_at_high_parallelism_does_not_hang(server):
    async def run():
        import httpx

        async with httpx.AsyncClient(timeout=120) as c:
            rs = await asyncio.gather(*[c.post(f"http://127.0.0.1:{server[0]}/v1/completions",
                                               json={"prompt": f"Number {i}:", "max_tokens": 1, "temperature": 0})
                                        for i in range(32)])
        return [r.status_code for r in rs]

    codes = asyncio.run(run())
    assert set(codes) <= {200, 429} and codes.count(200) >= MAX_SEQS + MAX_QUEUED - 4, codes
    assert 429 in codes  # 32 at once overflow 4 slots + 8 queued: the rest are told to retry
    wait_idle(server[0])


def test_an_abort_storm_frees_every_slot(server):
    async def run():
        import httpx

        async def one(i):
            try:
                async with httpx.AsyncClient(timeout=1.0) as c:
                    async with c.stream("POST", f"http://127.0.0.1:{server[0]}/v1/chat/completions",
                                        json={"messages": [{"role": "user", "content": f"Tell a long story {i}"}],
                                              "max_tokens": 300, "stream": i % 2 == 0}) as r:
                        async for _ in r.aiter_bytes():
                            pass
            except (httpx.TimeoutException, httpx.RemoteProtocolError):
                pass

        await asyncio.gather(*[one(i) for i in range(12)])

    asyncio.run(run())
    h = wait_idle(server[0], timeout=120)
    assert h["engine_errors"] == 0
    metrics = http(server[0], "/metrics")[1]
    assert 'mse_requests_total{finish_reason="cancelled"}' in metrics
    r = http(server[0], "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPTS[0]}],
                                                  "max_tokens": 8, "temperature": 0})
    assert r[0] == 200  # still serving


def test_models_health_and_speculation_metrics(server):
    port = server[0]
    code, models = http(port, "/v1/models")
    assert code == 200 and models["data"][0]["id"] == "smol"
    http(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPTS[1]}], "max_tokens": 32,
                                        "temperature": 0})
    metrics = http(port, "/metrics")[1]
    values = dict(line.rsplit(" ", 1) for line in metrics.splitlines() if line and not line.startswith("#"))
    for name in ("mse_spec_decode_num_draft_tokens_total", "mse_spec_decode_num_accepted_tokens_total",
                 "mse_spec_decode_num_head_growths_total", "mse_generation_tokens_total", "mse_free_slots"):
        assert name in values
    assert float(values["mse_spec_decode_num_draft_tokens_total"]) > 0  # the copy prompt drafted from its suffix index


def test_sigterm_drains_the_request_in_flight_and_exits(server):
    port, proc, log = server
    status = {}

    def long_request():
        try:
            status["code"] = http(port, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 300},
                                  timeout=DRAIN_S)[0]
        except Exception as exc:  # the connection may close as the server exits
            status["error"] = type(exc).__name__

    import threading

    t = threading.Thread(target=long_request)
    t.start()
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    # uvicorn re-raises the signal after its graceful shutdown, so the exit status says "terminated by SIGTERM"
    assert proc.wait(timeout=DRAIN_S + 30) in (0, -signal.SIGTERM), log.read_text()[-2000:]
    t.join(DRAIN_S)
    assert not t.is_alive()
    # the server drains the request in flight (up to DRAIN_S; tests/test_engine_runner.py: what the deadline
    # cancels is answered 503) before the engine stops: the request finished, nothing leaked
    assert status.get("code") == 200, status
    assert f"engine stopped: 0 request(s) in flight cancelled, {MAX_SEQS}/{MAX_SEQS} slots free" in log.read_text()
