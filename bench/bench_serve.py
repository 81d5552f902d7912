"""Serving benchmark: our server vs llama.cpp's (llama-cpp-python's OpenAI server) on the same GGUF, through HTTP.

Each server runs alone (started, loaded, warmed up, measured, stopped; never two at once). For each concurrency c
(default 1, 2, 4, 8, 16) the same prompts (``evalset:N``: first turns spread over the evaluation set, rendered by our
chat template into text, sent to ``/v1/completions`` of both servers so both see the same text) are sent by c
clients, each starting the next prompt as soon as its previous answer ended, streaming, greedy (temperature 0).
Ours runs twice per c: speculation off (``"speculative": false``) and on (the server's default drafting).

Per run: completion tokens / wall seconds (``tok_s``), time to first token and inter-token latency p50/p99 (from
the streamed chunks' arrival; a chunk of ours may carry several accepted tokens, whose gaps count as 0), and
``same_as_c1``: on how many prompts the text equals the same server's c = 1 text (speculation off for ours) --
ours must give all of them (lossless at any concurrency); llama.cpp serves one request at a time and its numbers
are what it is. System ``engine`` (in ``--systems``, run just before our server) is the reference of issue 32's c = 1
target: ``mindspore-eagle bench`` on the same prompts and tokens in its own process (the single-request engine,
greedy and speculative; its tok/s count the prompt's time, as the server's do), and the summary's
``ours_c1_over_engine`` is our server at c = 1 over it (``ours_c1_ttft_p50_minus_engine_ms``: the same for the
median time to first token). Prints one JSON line per run; the last line is the summary.

    python bench/bench_serve.py [--prompts 16] [--max-tokens 64] [--concurrency 1,2,4,8,16]
        [--llamacpp-python .venv-llamacpp/bin/python] [--systems engine,ours,llamacpp] [--max-seqs 16]
        [--ours-flags '--dtype bfloat16']

llama.cpp's server needs ``make bench-peers-setup`` (its venv with the server's dependencies).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port: int, proc: subprocess.Popen, path: str, timeout: float = 600) -> None:
    import httpx

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}{path}", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError("server did not become ready")


async def one(client, url: str, body: dict) -> dict:
    t0 = time.perf_counter()
    arrivals, text, usage = [], [], None
    async with client.stream("POST", url, json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            msg = json.loads(line[6:])
            if msg.get("usage"):
                usage = msg["usage"]
            for ch in msg.get("choices", []):
                if ch.get("text"):
                    arrivals.append(time.perf_counter())
                    text.append(ch["text"])
    t1 = time.perf_counter()
    n = usage["completion_tokens"] if usage else len(arrivals)
    return {"text": "".join(text), "tokens": n, "ttft": (arrivals[0] - t0) if arrivals else t1 - t0,
            "gaps": list(np.diff(arrivals)) + [0.0] * max(0, n - len(arrivals)), "seconds": t1 - t0}


async def load(url: str, prompts: list[str], c: int, extra: dict, max_tokens: int) -> tuple[list[dict], float]:
    import httpx

    queue = list(enumerate(prompts))
    out: list[dict | None] = [None] * len(prompts)

    async def client_loop(client):
        while queue:
            i, p = queue.pop(0)
            body = {"prompt": p, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                    "stream_options": {"include_usage": True}, **extra}
            out[i] = await one(client, url, body)

    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=600) as client:
        await asyncio.gather(*[client_loop(client) for _ in range(c)])
    return out, time.perf_counter() - t0


def summarize(system: str, c: int, res: list[dict], wall: float, ref: list[str] | None) -> dict:
    gaps = [g for r in res for g in r["gaps"]]
    ttft = [r["ttft"] for r in res]
    tokens = sum(r["tokens"] for r in res)
    return {"system": system, "concurrency": c, "requests": len(res), "tokens": tokens, "seconds": round(wall, 2),
            "tok_s": round(tokens / wall, 2), "ttft_p50_ms": round(1000 * float(np.percentile(ttft, 50)), 1),
            "ttft_p99_ms": round(1000 * float(np.percentile(ttft, 99)), 1),
            "itl_p50_ms": round(1000 * float(np.percentile(gaps, 50)), 1) if gaps else None,
            "itl_p99_ms": round(1000 * float(np.percentile(gaps, 99)), 1) if gaps else None,
            "same_as_c1": None if ref is None else sum(r["text"] == t for r, t in zip(res, ref))}


def start_ours(port: int, max_seqs: int, max_len: int, flags: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mindspore_eagle.app.cli", "serve", "--port", str(port),
                             "--max-seqs", str(max_seqs), "--max-cache-len", str(max_len), "--model-name", "m"]
                            + flags, stdout=subprocess.DEVNULL, stderr=sys.stderr, cwd=ROOT)


def run_engine(prompts: int, max_tokens: int, flags: list[str]) -> list[dict]:
    """``mindspore-eagle bench`` (the single-request engine) on the same first turns, in its own process: rows
    ``engine greedy`` and ``engine spec`` (c = 1) from its JSON line."""
    proc = subprocess.run([sys.executable, "-m", "mindspore_eagle.app.cli", "bench", "--prompts", f"evalset:{prompts}",
                           "--max-new-tokens", str(max_tokens)] + flags, capture_output=True, text=True, cwd=ROOT)
    last = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not last:
        raise RuntimeError(f"mindspore-eagle bench exited with {proc.returncode}: {proc.stderr[-500:]}")
    out = json.loads(last[-1])
    return [{"system": f"engine {mode}", "concurrency": 1, "requests": out["turns"], "tok_s": out[f"tok_s_{mode}"],
             "ttft_p50_ms": out["ttft_ms_p50"][mode], "lossless_turns": out["lossless_turns"]}
            for mode in ("greedy", "spec")]


def start_llamacpp(python: str, port: int, gguf: str, n_ctx: int) -> subprocess.Popen:
    return subprocess.Popen([python, "-m", "llama_cpp.server", "--model", gguf, "--n_threads", "2",
                             "--n_threads_batch", "2", "--n_ctx", str(n_ctx), "--port", str(port),
                             "--host", "127.0.0.1", "--model_alias", "m",
                             "--interrupt_requests", "False"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    ap.add_argument("--systems", default="ours,llamacpp")
    ap.add_argument("--max-seqs", type=int, default=16)
    ap.add_argument("--max-cache-len", type=int, default=1024)
    ap.add_argument("--llamacpp-python", default=os.path.join(ROOT, ".venv-llamacpp", "bin", "python"))
    ap.add_argument("--ours-flags", default="", help="more flags for our `serve`, e.g. '--dtype bfloat16'")
    a = ap.parse_args()
    sys.path.insert(0, ROOT)
    from mindspore_eagle.storage.assets import default_gguf_path, require_default_model
    from mindspore_eagle.app.bench import load_prompts
    from mindspore_eagle.tokenizer import load_tokenizer

    tok = load_tokenizer(require_default_model())
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}]) for p in load_prompts(f"evalset:{a.prompts}")]
    conc = [int(c) for c in a.concurrency.split(",")]
    runs = []
    systems = a.systems.split(",")
    unknown = set(systems) - {"engine", "ours", "llamacpp"}
    if unknown:
        ap.error(f"--systems: unknown {sorted(unknown)} (engine, ours, llamacpp)")
    if "engine" in systems:
        for row in run_engine(a.prompts, a.max_tokens, shlex.split(a.ours_flags)):
            print(json.dumps(row), flush=True)
            runs.append(row)
    if "ours" in systems:
        port = free_port()
        proc = start_ours(port, max(a.max_seqs, max(conc)), a.max_cache_len, shlex.split(a.ours_flags))
        try:
            wait_ready(port, proc, "/health")
            url = f"http://127.0.0.1:{port}/v1/completions"
            asyncio.run(load(url, prompts[:2], 2, {}, 8))  # first requests: lazily compiled commit graphs
            ref = None
            for c in conc:
                for spec in (False, True):
                    res, wall = asyncio.run(load(url, prompts, c, {"speculative": spec}, a.max_tokens))
                    ref = ref or [r["text"] for r in res]
                    row = summarize("ours spec" if spec else "ours greedy", c, res, wall, ref)
                    print(json.dumps(row), flush=True)
                    runs.append(row)
        finally:
            stop(proc)
    if "llamacpp" in systems:
        if not os.path.exists(a.llamacpp_python):
            print(json.dumps({"system": "llamacpp", "error": f"{a.llamacpp_python} missing: make bench-peers-setup"}))
        else:
            port = free_port()
            proc = start_llamacpp(a.llamacpp_python, port, default_gguf_path(), a.max_cache_len * 2)
            try:
                wait_ready(port, proc, "/v1/models")
                url = f"http://127.0.0.1:{port}/v1/completions"
                asyncio.run(load(url, prompts[:1], 1, {}, 8))
                ref = None
                for c in conc:
                    res, wall = asyncio.run(load(url, prompts, c, {}, a.max_tokens))
                    ref = ref or [r["text"] for r in res]
                    row = summarize("llamacpp q4_1", c, res, wall, ref)
                    print(json.dumps(row), flush=True)
                    runs.append(row)
            finally:
                stop(proc)
    by = {(r["system"], r["concurrency"]): r["tok_s"] for r in runs}
    summary = {"runs": runs, "prompts": a.prompts, "max_tokens": a.max_tokens, "ours_flags": a.ours_flags}
    if ("ours greedy", 1) in by:
        base = by[("ours greedy", 1)]
        summary["ours_over_c1_greedy"] = {c: round(max(by[("ours greedy", c)], by[("ours spec", c)]) / base, 2)
                                          for c in conc}
        summary["spec_over_greedy"] = {c: round(by[("ours spec", c)] / by[("ours greedy", c)], 2) for c in conc}
    if ("engine greedy", 1) in by and ("ours greedy", 1) in by:
        summary["ours_c1_over_engine"] = {mode: round(by[(f"ours {mode}", 1)] / by[(f"engine {mode}", 1)], 3)
                                          for mode in ("greedy", "spec")}
        ttft = {(r["system"], r["concurrency"]): r["ttft_p50_ms"] for r in runs}
        summary["ours_c1_ttft_p50_minus_engine_ms"] = {
            mode: round(ttft[(f"ours {mode}", 1)] - ttft[(f"engine {mode}", 1)], 1) for mode in ("greedy", "spec")}
    if ("llamacpp q4_1", 1) in by and ("ours spec", 1) in by:
        summary["ours_best_over_llamacpp"] = {c: round(max(by[("ours greedy", c)], by[("ours spec", c)]) /
                                                       by[("llamacpp q4_1", c)], 2) for c in conc}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
