"""What would the gain guard (``draft.budget.GainGuard``) have done on a recorded evaluation run?

Offline, over an evaluation trace (``mindspore-eagle eval``'s merged.jsonl[.gz]: every step's timings and accepted
length, every turn's greedy time and output): each turn is walked step by step with a fresh guard. An awake step costs
what it cost in the run and is weighed as the proposer weighs it (``plain_ms``: the turn's median one-row step); an
asleep step emits one token at the turn's measured greedy ms per token; while asleep, the suffix index over prompt +
output so far (``draft.suffix.SuffixIndex``, the prompt rebuilt with ``evaluation.evaluate.build_prompt``) wakes the
turn at a match of ``--wake-match`` tokens. An estimate: after a sleep the real run would propose other trees from
other positions; the replay keeps the recorded steps.

    .venv/bin/python experiments/replay_gain_guard.py [--trace results/eval-avx512-native-b3f5730/merged.jsonl.gz]

One JSON line per setting, decode steps only (prefill excluded, so these ratios are higher than the report's): greedy
over estimated decode time of all turns together, the per-turn mean and p50, turns below 0.95x / 0.90x, the slowest
turn, the share of tokens emitted asleep; the first line is the run as recorded.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mindspore_eagle.draft.budget import GainGuard  # noqa: E402
from mindspore_eagle.draft.suffix import SuffixIndex  # noqa: E402
from mindspore_eagle.evaluation.evaluate import build_prompt, load_items  # noqa: E402
from mindspore_eagle.storage.assets import default_model_dir  # noqa: E402
from mindspore_eagle.tokenizer import load_tokenizer  # noqa: E402

SETTINGS = [  # (probe, decay, min_sleep, max_sleep, wake_match); the first: the product's defaults
    (8, 0.9, 8, 64, 4), (8, 0.9, 8, 64, 0), (8, 0.9, 8, 64, 3), (8, 0.9, 8, 64, 6), (8, 0.9, 4, 64, 4),
    (12, 0.9, 8, 64, 4), (6, 0.9, 4, 64, 4), (16, 0.95, 8, 64, 4)]


def read_trace(path: str):
    opener = gzip.open if path.endswith(".gz") else open
    steps, turns = {}, {}
    with opener(path, "rt") as f:
        for line in f:
            r = json.loads(line)
            if r["record"] == "step":
                steps.setdefault(r["turn"], []).append(r)
            elif r["record"] == "turn":
                turns[r["turn"]] = r
    return steps, turns


def prompts_of(turns: dict, tokenizer) -> dict:
    """Each turn's prompt ids, later turns over the recorded answers of the earlier ones (as the evaluation)."""
    eos = tuple(tokenizer.eos_token_ids)
    out = {}
    for item in load_items():
        answers = []
        for k, tid in enumerate(item.turn_ids):
            if tid not in turns:
                break
            out[tid] = build_prompt(item, k, answers, tokenizer, eos)
            answers.append(turns[tid]["output_ids"])
    return out


def step_ms(s: dict) -> float:
    return s["grow_ms"] + s["verify_ms"] + s["commit_ms"] + s["update_ms"] + s["host_ms"]


def replay_turn(steps: list, turn: dict, prompt: list, setting) -> tuple[float, float, int, int]:
    """(greedy ms, estimated ms, tokens emitted asleep, tokens) of one turn's decode steps."""
    greedy = (turn["greedy_s"] - turn["greedy_ttft_s"]) / max(1, turn["tokens"] - 1) * 1000
    plain = [s["verify_ms"] + s["commit_ms"] + s["host_ms"] for s in steps if s["bucket"] == 1]
    plain_ms = statistics.median(plain) if plain else greedy
    guard = GainGuard(*setting[:4]) if setting else None
    wake = setting[4] if setting else 0
    out = turn["output_ids"]
    index = SuffixIndex(16)
    index.extend(list(prompt) + out[:1])
    pos, ms, asleep, tokens = 1, 0.0, 0, 0
    for s in steps:
        n = s["accepted_len"] + 1
        tokens += n
        if guard is None or not guard.dormant:
            ms += step_ms(s)
            index.extend(out[pos:pos + n])
            pos += n
            if guard is not None:
                guard.observe(s["accepted_len"], step_ms(s), plain_ms)
            continue
        for j in range(n):  # asleep: one plain step per token, until the sleep ends or a copy starts
            if wake and index.match_at_least(wake):
                guard.wake()
                ms += step_ms(s) * (n - j) / n  # the rest of this step as recorded (an estimate)
                index.extend(out[pos:pos + n - j])
                pos += n - j
                break
            guard.sleep_step()
            ms += greedy
            asleep += 1
            index.extend(out[pos:pos + 1])
            pos += 1
    return tokens * greedy, ms, asleep, tokens


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default="results/eval-avx512-native-b3f5730/merged.jsonl.gz")
    args = ap.parse_args(argv)
    steps, turns = read_trace(args.trace)
    prompts = prompts_of(turns, load_tokenizer(default_model_dir()))
    for setting in [None] + SETTINGS:
        greedy = est = asleep = tokens = 0.0
        ratios = []
        for tid, st in steps.items():
            g, e, a, n = replay_turn(st, turns[tid], prompts[tid], setting)
            greedy, est, asleep, tokens = greedy + g, est + e, asleep + a, tokens + n
            ratios.append(g / e)
        keys = ("probe", "decay", "min_sleep", "max_sleep", "wake_match")
        print(json.dumps({"trace": args.trace, "guard": dict(zip(keys, setting)) if setting else None,
                          "turns": len(ratios), "decode_speedup_all_est": round(greedy / est, 3),
                          "speedup_mean_est": round(sum(ratios) / len(ratios), 3),
                          "speedup_p50_est": round(statistics.median(ratios), 3),
                          "below_0.95": sum(r < 0.95 for r in ratios), "below_0.90": sum(r < 0.90 for r in ratios),
                          "slowest": round(min(ratios), 3), "asleep_share": round(asleep / tokens, 3)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
