"""``mindspore-eagle bench``: greedy vs speculative on the same prompts, in the same process, side by side.

For each prompt the teacher-only baseline (the engine with a one-node tree) and the speculative run go one after
the other through ``harness.compare``, after ``harness.warm_up`` compiled every shape. Speed is new tokens per
second over the whole request (prefill included, as in the EAGLE papers); ``speedup`` is the per-prompt ratio
spec/greedy. The last stdout line is one JSON object (see ``summarize``).
"""

from __future__ import annotations

import json
from typing import Callable, Sequence

import numpy as np

from ..engine import SpeculativeEngine
from ..errors import ConfigError
from .harness import Comparison, ProposerFactory, compare, warm_up

DEFAULT_PROMPTS = (
    "Explain in two sentences why the sky is blue.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Give me three tips for staying focused while studying.",
    "What is the difference between a list and a tuple in Python?",
    "Summarize the plot of Romeo and Juliet in a few sentences.",
    "Write a short poem about the ocean.",
    "How do I reverse a string in Python?",
    "List the planets of the solar system in order.",
)


EVALSET_PREFIX = "evalset:"


def evalset_prompts(n: int) -> list[str]:
    """First-turn prompts of ``n`` conversations spread evenly over the evaluation set (sorted by id, so both
    HumanEval and MT-Bench are drawn): the same text the evaluation's turn 1 sends through the chat template."""
    from ..evaluation.evalset import load_evalset, spread_sample

    items = load_evalset()
    if not 1 <= n <= len(items):
        raise ConfigError(f"{EVALSET_PREFIX}{n}: expected 1..{len(items)} prompts")
    return [item.turns[0] for item in spread_sample(items, n)]


def load_prompts(path: str | None) -> list[str]:
    """Prompts from a JSONL file (one ``{"prompt": "..."}`` per line), ``evalset:N`` (N first turns of the
    evaluation set) or the built-in set."""
    if path is None:
        return list(DEFAULT_PROMPTS)
    if path.startswith(EVALSET_PREFIX):
        count = path[len(EVALSET_PREFIX):]
        if not count.isdigit():
            raise ConfigError(f"--prompts {path}: expected {EVALSET_PREFIX}N with N a number")
        return evalset_prompts(int(count))
    return [item["prompt"] for item in read_prompt_file(path)]


def read_prompt_file(path: str, allow_ids: bool = False) -> list[dict]:
    """One JSON object per non-empty line, in file order: ``{"prompt": "..."}`` or, with ``allow_ids``, also
    ``{"prompt_ids": [int, ...]}`` (pre-tokenized). Each item gets ``"id"`` = its index. Shared by ``bench`` and
    ``scripts/multi_generate.py``; a bad line is a ConfigError naming ``path:line``."""
    expected = ('{"prompt": "..."} or {"prompt_ids": [...]}' if allow_ids
                else 'a JSON object with a "prompt" key')
    items: list[dict] = []
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"--prompts {path}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--prompts {path}: not UTF-8 (byte {exc.object[exc.start]:#04x} at offset {exc.start}); "
                          "save the file as UTF-8") from None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise ConfigError(f"{path}:{n}: not a JSON object") from None
        ids = obj.get("prompt_ids") if isinstance(obj, dict) else None
        if allow_ids and isinstance(ids, list):
            if not ids or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
                raise ConfigError(f"{path}:{n}: prompt_ids must be a non-empty list of integers >= 0")
            items.append({"id": len(items), "prompt_ids": ids})
        elif isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
            items.append({"id": len(items), "prompt": obj["prompt"]})
        else:
            raise ConfigError(f"{path}:{n}: expected {expected}")
    if not items:
        raise ConfigError(f"{path}: no prompts")
    return items


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    return float(np.percentile(np.asarray(values, np.float64), q))


def speedup_stats(speedups: Sequence[float], percentiles: Sequence[int] = (50, 99)) -> dict:
    """``speedup_mean`` and ``speedup_p{q}`` (linear-interpolated) of per-turn speedups, rounded to 3 places;
    shared by ``bench`` and ``report``."""
    out = {"speedup_mean": round(float(np.mean(speedups)), 3) if len(speedups) else float("nan")}
    for q in percentiles:
        out[f"speedup_p{q}"] = round(percentile(speedups, q), 3) if len(speedups) else float("nan")
    return out


def summarize(results: Sequence[Comparison]) -> dict:
    """The bench JSON: turns, lossless turns, tau (mean tokens per cycle over all cycles), speedups, speeds,
    the host overhead share (spec time in host work of the steps -- checks, mask, acceptance -- over spec
    total) and the median time to first token of each mode."""
    speedups = [r.speedup for r in results]
    emitted = [s.emitted for r in results for s in r.spec.steps]
    spec_total = sum(r.spec.total_s for r in results)
    return {
        "turns": len(results),
        "lossless_turns": sum(r.lossless for r in results),
        "tau": round(float(np.mean(emitted)), 3) if emitted else float("nan"),
        **speedup_stats(speedups, (50, 99)),
        "tok_s_greedy": round(sum(len(r.greedy.tokens) for r in results) / sum(r.greedy.total_s for r in results), 3),
        "tok_s_spec": round(sum(len(r.spec.tokens) for r in results) / spec_total, 3),
        "overhead_share": round(sum(r.spec.seconds("host") for r in results) / spec_total, 4),
        "ttft_ms_p50": {mode: round(1000 * float(np.median([getattr(r, mode).ttft_s for r in results])), 1)
                        for mode in ("greedy", "spec")},
        "step_ms": {phase: round(float(np.mean([getattr(s, f"{phase}_ms") for r in results for s in r.spec.steps])),
                                 2) if emitted else float("nan")
                    for phase in ("grow", "verify", "commit", "update", "host")},
    }


def run_bench(engine: SpeculativeEngine, prompts_ids: Sequence[Sequence[int]], proposer_for: ProposerFactory,
              max_new_tokens: int, eos: Sequence[int] = (), log: Callable[[str], None] = print) -> list[Comparison]:
    """Warm up, then greedy and speculative for every prompt (``harness.compare``)."""
    warm_up(engine, proposer_for, prompts_ids[0], max_new_tokens, eos)
    results = []
    log(f"{'#':>3} {'tokens':>6} {'greedy tok/s':>12} {'spec tok/s':>10} {'tau':>5} {'speedup':>7} lossless")
    for i, ids in enumerate(prompts_ids):
        r = compare(engine, ids, proposer_for, max_new_tokens, eos)
        results.append(r)
        log(f"{i:>3} {len(r.greedy.tokens):>6} {r.greedy.tok_s:>12.2f} {r.spec.tok_s:>10.2f} {r.spec.tau:>5.2f} "
            f"{r.speedup:>7.2f} {'yes' if r.lossless else 'NO'}")
    return results


__all__ = ["DEFAULT_PROMPTS", "load_prompts", "percentile", "read_prompt_file", "run_bench", "speedup_stats",
           "summarize"]
