"""``mindspore-eagle bench-batch``: the batch engine under load, speculation on vs off, side by side in one process.

For each concurrency ``c`` the same prompts run with at most ``c`` requests in flight (a finished request is
replaced at once, as clients of a server would), first without speculation, then with it; the first run (c = 1,
no speculation) is the reference every other run's tokens are compared with (greedy: identical token for token,
``lossless``). One JSON line per run (with ``head_growths``: request-steps whose drafts included the head's, of
``request_steps``, and ``full_tok_s``: the throughput of the steps that ran with all ``c`` requests in flight); the
last line is the summary: throughput per run, speculation's ratio per concurrency (``spec_over_greedy_full``: the
same for ``full_tok_s``, the steady state without the closing drain) and each concurrency's throughput over c = 1
greedy.

``rounds``: how many times each concurrency's pair (without, then with speculation) runs, the pairs back to back;
each round starts with the single-request engine's pair (the c = 1 reference), so that the c = 1 runs it is
compared with ran a minute later, not a whole sweep later.
Why: on a shared VM the same forward's speed drifts by up to 1.5x between minutes, more than speculation's effect
at high concurrency, so one pair cannot say whether speculation is below plain decoding "beyond noise". With
several rounds the summary gives per concurrency the median throughput of each mode, speculation's ratio of the
medians, and every round's own ratio (its pair ran seconds apart): their spread is the noise the ratio is read
against.
"""

from __future__ import annotations

import json
import time
from typing import Sequence

import numpy as np

from ..errors import ConfigError
from .batch import BatchEngine


def run_load(engine: BatchEngine, prompts: Sequence[Sequence[int]], concurrency: int, max_new_tokens: int,
             eos: Sequence[int], speculative: bool) -> dict:
    """Run every prompt with at most ``concurrency`` in flight; tokens per prompt and the timings. ``full_tok_s``:
    tokens emitted per second by the steps that ran with all ``concurrency`` requests in flight (``full_share`` of
    the wall time) -- the steady state a server under a steady stream sees, without the closing drain of a fixed set
    of prompts, where fewer requests share a step (and speculation, which lets requests finish at different times,
    makes that drain longer)."""
    pending = list(enumerate(prompts))
    active: dict[str, tuple[int, object]] = {}
    tokens: list[tuple[int, ...] | None] = [None] * len(prompts)
    latency, ttft, taus = [], [], []
    request_steps = head_growths = 0
    full_s, full_tokens = 0.0, 0
    t0 = time.perf_counter()
    steps0 = engine.steps
    while pending or active:
        while pending and len(active) < concurrency:
            i, p = pending.pop(0)
            req = engine.submit(p, max_new_tokens, eos, max_nodes=None if speculative else 1)
            active[req.id] = (i, req)
        full = len(active) == concurrency
        t_step = time.perf_counter()
        events = engine.step()
        if full:
            full_s += time.perf_counter() - t_step
            full_tokens += sum(len(ev.tokens) for ev in events)
        for ev in events:
            if ev.finish_reason is not None and ev.request.id in active:
                i, req = active.pop(ev.request.id)
                tokens[i] = tuple(req.tokens)
                latency.append(req.finished_s - req.submitted_s)
                ttft.append((req.first_token_s or req.finished_s) - req.submitted_s)
                if req.stats.steps:
                    taus.append(req.stats.tau)
                request_steps += req.stats.steps
                head_growths += req.stats.head_growths
    seconds = time.perf_counter() - t0
    total = sum(len(t) for t in tokens)
    return {"concurrency": concurrency, "speculative": speculative, "requests": len(prompts), "tokens": total,
            "seconds": round(seconds, 3), "tok_s": round(total / seconds, 2), "steps": engine.steps - steps0,
            "full_tok_s": round(full_tokens / full_s, 2) if full_s else None, "full_share": round(full_s / seconds, 3),
            "latency_p50_s": round(float(np.percentile(latency, 50)), 3),
            "latency_p99_s": round(float(np.percentile(latency, 99)), 3),
            "ttft_p50_s": round(float(np.percentile(ttft, 50)), 3),
            "tau_mean": round(float(np.mean(taus)), 3) if taus else None,
            "head_growths": head_growths, "request_steps": request_steps, "_tokens": tokens}


def run_single(engine: BatchEngine, prompts: Sequence[Sequence[int]], max_new_tokens: int, eos: Sequence[int],
               proposer=None) -> dict:
    """The same prompts one after the other through the batch-1 ``SpeculativeEngine`` on the same teacher (same
    kernels, same cache buffers; the batch engine is idle meanwhile), with ``proposer`` (None: plain decoding): the
    reference for c = 1."""
    from ..engine import SpeculativeEngine

    single = SpeculativeEngine(engine.teacher)
    t0 = time.perf_counter()
    tokens = []
    for p in prompts:
        tokens.append(single.generate(p, max_new_tokens, eos, proposer=proposer).tokens)
    seconds = time.perf_counter() - t0
    total = sum(len(t) for t in tokens)
    return {"single_engine": True, "speculative": proposer is not None, "requests": len(prompts), "tokens": total,
            "seconds": round(seconds, 3), "tok_s": round(total / seconds, 2), "_tokens": tokens}


def bench_batch(engine: BatchEngine, prompts: Sequence[Sequence[int]], concurrencies: Sequence[int],
                max_new_tokens: int, eos: Sequence[int], single_proposer=None, log=print, rounds: int = 1) -> dict:
    """``single_proposer``: today's single-request proposer for the c = 1 reference (``stack.single_proposer``; it
    learns its own step costs, as ``generate``'s does), or None without speculation. ``rounds``: pairs per
    concurrency (module docstring)."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ConfigError(f"rounds={rounds!r}: must be an integer >= 1")
    singles: dict[bool, list[float]] = {}
    speculative = single_proposer is not None
    modes = (False, True) if speculative else (False,)
    for spec in modes:  # compile the batch-1 engine's own graphs (commit moves)
        run_single(engine, prompts[:2], 8, eos, single_proposer if spec else None)
    runs, ref = [], None
    for round_ in range(rounds):  # each round: the single-request pair, then every concurrency's pair
        for spec in modes:
            r = run_single(engine, prompts, max_new_tokens, eos, single_proposer if spec else None)
            r.pop("_tokens")
            r["round"] = round_
            log(json.dumps(r))
            singles.setdefault(spec, []).append(r["tok_s"])
        for c in concurrencies:
            for spec in modes:
                r = run_load(engine, prompts, c, max_new_tokens, eos, spec)
                toks = r.pop("_tokens")
                if ref is None:
                    ref = toks
                r["lossless"] = sum(a == b for a, b in zip(toks, ref))
                r["round"] = round_
                log(json.dumps(r))
                runs.append(r)

    def per_pair(field: str) -> dict[tuple[int, bool], list[float]]:
        """Each round's ``field`` per (concurrency, speculative), runs without it (None) left out."""
        out: dict[tuple[int, bool], list[float]] = {}
        for r in runs:
            if r[field] is not None:
                out.setdefault((r["concurrency"], r["speculative"]), []).append(r[field])
        return out

    tok_s = per_pair("tok_s")
    by = {key: float(np.median(v)) for key, v in tok_s.items()}
    full = {key: float(np.median(v)) for key, v in per_pair("full_tok_s").items()}
    base = by[(concurrencies[0], False)]
    summary = {"runs": [{k: r[k] for k in ("concurrency", "round", "speculative", "tok_s", "tau_mean", "lossless")}
                        for r in runs],
               "rounds": rounds,
               "throughput_over_c1_greedy": {c: round(by[(c, False)] / base, 2) for c in concurrencies},
               "spec_over_greedy": ({c: round(by[(c, True)] / by[(c, False)], 2) for c in concurrencies}
                                    if speculative else {}),
               "spec_over_greedy_full": ({c: round(full[(c, True)] / full[(c, False)], 2) for c in concurrencies
                                          if full.get((c, True)) and full.get((c, False))} if speculative else {}),
               "spec_over_greedy_by_round": ({c: [round(s / g, 2) for g, s in zip(tok_s[(c, False)],
                                                                                  tok_s[(c, True)])]
                                              for c in concurrencies} if speculative else {}),
               "c1_over_single_engine": {("spec" if k else "greedy"): round(by[(concurrencies[0], k)]
                                                                            / float(np.median(v)), 3)
                                         for k, v in singles.items()} if concurrencies[0] == 1 else {},
               "all_lossless": all(r["lossless"] == len(prompts) for r in runs),
               "requests": len(prompts), "max_new_tokens": max_new_tokens}
    return summary


__all__ = ["bench_batch", "run_load"]
