"""Bench statistics computed on hand-made generations equal values worked out by hand."""

import pytest

from mindspore_eagle.bench import PromptResult, load_prompts, summarize
from mindspore_eagle.engine import Generation
from mindspore_eagle.errors import ConfigError
from mindspore_eagle.trace import StepTrace


def step(emitted, draft_ms=0.0, teacher_ms=0.0):
    toks = tuple(range(emitted))
    return StepTrace(step=0, committed_len=0, tree_nodes=emitted, bucket=8, depth=emitted - 1,
                     accepted_len=emitted - 1, bonus=0, path=tuple(range(emitted)), tokens=toks,
                     commit_mode="length", draft_ms=draft_ms, verify_ms=teacher_ms, commit_ms=0.0,
                     teacher_ms=teacher_ms)


def gen(tokens, total_s, steps=(), prefill=0.0):
    return Generation((1,), tuple(tokens), "max_new_tokens", 0.1, total_s, tuple(steps), prefill)


def test_summary_matches_hand_computed_values():
    # prompt A: greedy 10 tokens in 2 s (5 tok/s); spec same tokens in 1 s (10 tok/s) -> speedup 2
    # prompt B: greedy 10 tokens in 1 s (10 tok/s); spec (different tokens) in 0.25 s (40 tok/s) -> speedup 4
    a = PromptResult(gen(range(10), 2.0), gen(range(10), 1.0, [step(4, 100, 500), step(2, 100, 200)], 0.05))
    b = PromptResult(gen(range(10), 1.0), gen([9] * 10, 0.25, [step(3, 20, 150)], 0.05))
    s = summarize([a, b])
    assert s["turns"] == 2 and s["lossless_turns"] == 1
    assert s["tau"] == pytest.approx((4 + 2 + 3) / 3, abs=1e-3)
    assert s["speedup_mean"] == pytest.approx(3.0)  # (2 + 4) / 2
    assert s["speedup_p50"] == pytest.approx(3.0)
    assert s["speedup_p99"] == pytest.approx(2 + 0.99 * 2)  # linear interpolation between 2 and 4
    assert s["tok_s_greedy"] == pytest.approx(20 / 3.0, abs=1e-3)
    assert s["tok_s_spec"] == pytest.approx(20 / 1.25, abs=1e-3)
    # outside teacher (0.05 + 0.7 + 0.05 + 0.15 = 0.95 s) and draft (0.22 s) forwards: 1.25 - 1.17 = 0.08 s
    assert s["overhead_share"] == pytest.approx(0.08 / 1.25, abs=1e-4)


def test_prompt_file_errors_name_the_line(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt": "hi"}\n{"text": "no"}\n')
    with pytest.raises(ConfigError, match="p.jsonl:2"):
        load_prompts(str(p))
    p.write_text('{"prompt": "hi"}\n\n{"prompt": "there"}\n')
    assert load_prompts(str(p)) == ["hi", "there"]
