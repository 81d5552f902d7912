"""Bench statistics computed on hand-made generations equal values worked out by hand."""

import pytest

from mindspore_eagle.app.bench import load_prompts, summarize
from mindspore_eagle.engine import Generation
from mindspore_eagle.errors import ConfigError
from mindspore_eagle.app.harness import Comparison
from mindspore_eagle.evaluation.trace import StepTrace


def step(emitted, grow_ms=0.0, verify_ms=0.0, host_ms=0.0):
    toks = tuple(range(emitted))
    return StepTrace(step=0, committed_len=0, tree_nodes=emitted, bucket=8, depth=emitted - 1,
                     accepted_len=emitted - 1, bonus=0, path=tuple(range(emitted)), tokens=toks, grow_ms=grow_ms,
                     verify_ms=verify_ms, commit_ms=1.0, update_ms=2.0, host_ms=host_ms)


def gen(tokens, total_s, steps=(), prefill=0.0, ttft=0.1):
    return Generation((1,), tuple(tokens), "max_new_tokens", ttft, total_s, tuple(steps), prefill)


def test_summary_matches_hand_computed_values():
    # prompt A: greedy 10 tokens in 2 s (5 tok/s); spec same tokens in 1 s (10 tok/s) -> speedup 2
    # prompt B: greedy 10 tokens in 1 s (10 tok/s); spec (different tokens) in 0.25 s (40 tok/s) -> speedup 4
    a = Comparison(gen(range(10), 2.0, ttft=0.2),
                   gen(range(10), 1.0, [step(4, 100, 500, 30), step(2, 100, 200, 20)], 0.05, ttft=0.3))
    b = Comparison(gen(range(10), 1.0), gen([9] * 10, 0.25, [step(3, 20, 150, 12.5)], 0.05, ttft=0.05))
    s = summarize([a, b])
    assert s["turns"] == 2 and s["lossless_turns"] == 1
    assert s["tau"] == pytest.approx((4 + 2 + 3) / 3, abs=1e-3)
    assert s["speedup_mean"] == pytest.approx(3.0)  # (2 + 4) / 2
    assert s["speedup_p50"] == pytest.approx(3.0)
    assert s["speedup_p99"] == pytest.approx(2 + 0.99 * 2)  # linear interpolation between 2 and 4
    assert s["tok_s_greedy"] == pytest.approx(20 / 3.0, abs=1e-3)
    assert s["tok_s_spec"] == pytest.approx(20 / 1.25, abs=1e-3)
    # host time of the steps only (30 + 20 + 12.5 ms) over the spec total (1.25 s)
    assert s["overhead_share"] == pytest.approx(0.0625 / 1.25, abs=1e-4)
    assert s["step_ms"] == {"grow": pytest.approx(220 / 3, abs=0.01), "verify": pytest.approx(850 / 3, abs=0.01),
                            "commit": 1.0, "update": 2.0, "host": pytest.approx(62.5 / 3, abs=0.01)}
    assert s["ttft_ms_p50"] == {"greedy": 150.0, "spec": 175.0}  # medians of (200, 100) and (300, 50) ms


def test_prompt_file_errors_name_the_line(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt": "hi"}\n{"text": "no"}\n')
    with pytest.raises(ConfigError, match="p.jsonl:2"):
        load_prompts(str(p))
    p.write_text('{"prompt": "hi"}\n\n{"prompt": "there"}\n')
    assert load_prompts(str(p)) == ["hi", "there"]
