"""The speculative loop is lossless: its output equals teacher-only greedy decoding token for token, with
perfect, always-wrong and mixed drafts, chain and bushy trees, in reference and performance mode; a proposer whose
trees no bucket holds is refused before the request; each step phase is timed where it happens."""

import time

import numpy as np
import pytest

from mindspore_eagle.runtime import RuntimeConfig
from mindspore_eagle.engine import SpeculativeEngine, greedy_generate
from mindspore_eagle.errors import ConfigError, TreeInvariantError
from mindspore_eagle.teacher import Teacher
from mindspore_eagle.tree import TreeLayout
from tests.helpers import ScriptedProposer, torch_greedy

RUNTIME = dict(max_cache_len=160, buckets=(1, 8, 16, 32), prefill_chunk=16)


@pytest.fixture(scope="module")
def tiny(hf_tiny):
    _, ms_dir, torch_model = hf_tiny("pangu")
    made = {}

    def get(mode):
        if mode not in made:
            made[mode] = Teacher.load(ms_dir, RuntimeConfig(exec_mode=mode, **RUNTIME))
        return made[mode]

    return get, torch_model


PROMPTS = [[3, 17, 42, 5], [9, 9, 9, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14, 15, 16, 20], [50]]


@pytest.mark.parametrize("exec_mode", ["reference", "performance"])
@pytest.mark.parametrize("draft", ["oracle", "wrong", "bushy"])
def test_speculative_output_equals_greedy(tiny, exec_mode, draft):
    get, torch_model = tiny
    teacher = get(exec_mode)
    for prompt in PROMPTS if exec_mode == "performance" else PROMPTS[:1]:  # PyNative is slow: one prompt
        n = 24
        future = torch_greedy(torch_model, prompt, n + 8)
        proposer = ScriptedProposer(teacher.cfg.vocab_size, depth=4, mode=draft)
        proposer.future = future
        gen = SpeculativeEngine(teacher).generate(prompt, n, proposer=proposer)
        assert list(gen.tokens) == future[:n]
        if draft == "oracle":
            assert all(s.accepted_len == 4 for s in gen.steps[:-1])
        if draft == "wrong":
            assert gen.tau == 1.0
        if draft == "bushy":
            assert any(s.path != tuple(range(len(s.path))) for s in gen.steps)  # rows were moved


def test_oracle_draft_reaches_tau_depth_plus_one(tiny):
    get, torch_model = tiny
    teacher = get("performance")
    prompt = PROMPTS[0]
    future = torch_greedy(torch_model, prompt, 60)
    proposer = ScriptedProposer(teacher.cfg.vocab_size, depth=5, mode="oracle")
    proposer.future = future
    gen = SpeculativeEngine(teacher).generate(prompt, 1 + 6 * 8, proposer=proposer)
    assert [s.emitted for s in gen.steps] == [6] * 8
    assert gen.tau == 6.0 and list(gen.tokens) == future[:49]


def test_root_only_engine_is_the_greedy_baseline(tiny):
    get, _ = tiny
    teacher = get("performance")
    gen = SpeculativeEngine(teacher).generate(PROMPTS[1], 20)
    assert list(gen.tokens) == list(greedy_generate(teacher, PROMPTS[1], 20).tokens)
    assert gen.tau == 1.0


def test_cache_full_stops_with_tokens_so_far_and_engine_stays_usable(tiny):
    get, torch_model = tiny
    teacher = get("performance")
    prompt = [1 + i % 100 for i in range(150)]  # 150 of 160 rows
    future = torch_greedy(torch_model, prompt, 40)
    proposer = ScriptedProposer(teacher.cfg.vocab_size, depth=4, mode="oracle")
    proposer.future = future
    engine = SpeculativeEngine(teacher)
    gen = engine.generate(prompt, 40, proposer=proposer)
    assert gen.stop_reason == "cache_full"
    assert list(gen.tokens) == future[:len(gen.tokens)] and len(gen.tokens) == 11
    with pytest.raises(ConfigError, match="empty prompt"):
        engine.generate([], 5, proposer=proposer)
    proposer.future = torch_greedy(torch_model, PROMPTS[0], 20)
    assert list(engine.generate(PROMPTS[0], 10, proposer=proposer).tokens) == proposer.future[:10]


def test_a_proposer_with_a_foreign_root_is_refused(tiny):
    get, _ = tiny
    teacher = get("reference")

    class Bad:
        max_nodes = 2

        def begin(self, *a):
            pass

        def propose(self, root):
            return TreeLayout.from_parents([root + 1, 2], [0, 0])

        def accept(self, *a):
            pass

    with pytest.raises(TreeInvariantError, match="root token"):
        SpeculativeEngine(teacher).generate([1, 2, 3], 5, proposer=Bad())
    assert np.isfinite(SpeculativeEngine(teacher).generate([1, 2, 3], 3).tau)


def test_a_proposer_whose_trees_fit_no_bucket_is_refused_before_the_request(tiny, monkeypatch):
    get, _ = tiny
    engine = SpeculativeEngine(get("performance"))
    proposer = ScriptedProposer(101, depth=40, mode="oracle")  # 41 nodes; the largest bucket is 32
    calls = []
    monkeypatch.setattr(engine.teacher, "forward", calls.append)
    with pytest.raises(ConfigError, match=r"ScriptedProposer.max_nodes=41 does not fit RuntimeConfig.buckets="
                                          r"\(1, 8, 16, 32\)"):
        engine.generate(PROMPTS[0], 5, proposer=proposer)
    assert calls == []  # nothing ran


@pytest.mark.parametrize("bad", [0, 2.5, True, "3"])
def test_a_bad_token_limit_is_refused_before_anything_runs(tiny, bad):
    get, _ = tiny
    with pytest.raises(ConfigError, match="max_new_tokens"):
        SpeculativeEngine(get("performance")).generate(PROMPTS[0], bad)


@pytest.mark.parametrize("prompt,match", [([1.5, 2], "integers"), (["3"], "integers"), ([True], "integers"),
                                          ("hello", "not text"), ([1, 1000], "outside the vocabulary")])
def test_a_bad_prompt_is_refused_before_anything_runs(tiny, prompt, match):
    get, _ = tiny
    with pytest.raises(ConfigError, match=match):
        SpeculativeEngine(get("performance")).generate(prompt, 3)


def test_each_step_phase_is_timed_where_it_happens(tiny):
    """A proposer that sleeps 200 ms in propose and 150 ms in accept: those land in grow_ms and update_ms, and
    nowhere else (verify, commit and host stay below the smaller sleep)."""
    get, torch_model = tiny
    teacher = get("performance")
    future = torch_greedy(torch_model, PROMPTS[0], 12)

    class Sleepy(ScriptedProposer):
        def propose(self, root):
            time.sleep(0.2)
            return super().propose(root)

        def accept(self, acc, aux):
            time.sleep(0.15)
            super().accept(acc, aux)

    proposer = Sleepy(teacher.cfg.vocab_size, depth=2, mode="bushy")
    proposer.future = future
    engine = SpeculativeEngine(teacher)
    engine.generate(PROMPTS[0], 4, proposer=proposer)  # compiles
    gen = engine.generate(PROMPTS[0], 7, proposer=proposer)
    assert gen.steps
    for s in gen.steps:
        assert s.grow_ms >= 200 and s.update_ms >= 150
        assert max(s.verify_ms, s.commit_ms, s.host_ms) < 150
