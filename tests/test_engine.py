"""The speculative loop is lossless: its output equals teacher-only greedy decoding token for token, with
perfect, always-wrong and mixed drafts, chain and bushy trees, in reference and performance mode."""

import numpy as np
import pytest

from mindspore_eagle.cache import CommitMode
from mindspore_eagle.config import RuntimeConfig
from mindspore_eagle.engine import SpeculativeEngine
from mindspore_eagle.errors import ConfigError, TreeInvariantError
from mindspore_eagle.generate import greedy_generate
from mindspore_eagle.teacher import Teacher
from mindspore_eagle.tree import TreeLayout
from tests.conftest import torch_greedy

RUNTIME = dict(max_cache_len=160, buckets=(1, 8, 16, 32), prefill_chunk=16)


class ScriptedProposer:
    """Test draft that knows the teacher's greedy continuation ``future`` and proposes from it.

    mode "oracle": a chain of the next ``depth`` true tokens (every level accepted);
    "wrong": a chain of tokens that are never the teacher's choice; "bushy": at every level a wrong sibling
    placed *before* the true child, so accepted paths are not in place (PATH_INDEX commits are exercised).
    """

    def __init__(self, vocab, depth, mode):
        self.vocab, self.depth, self.mode = vocab, depth, mode
        self.future, self.pos = [], 0

    def begin(self, prompt, aux, first):
        self.pos = 1  # future[0] == first token (the root)
        assert aux.shape[0] == len(prompt)

    def propose(self, root):
        assert root == self.future[self.pos - 1]
        nxt = self.future[self.pos:self.pos + self.depth]
        wrong = [(t + 1) % self.vocab for t in nxt]
        if self.mode == "oracle":
            return TreeLayout.from_parents([root] + nxt, [0] + list(range(len(nxt))))
        if self.mode == "wrong":
            return TreeLayout.from_parents([root] + wrong, [0] + list(range(len(wrong))))
        tokens, parents, cur = [root], [0], 0
        for t, w in zip(nxt, wrong):
            tokens += [w, t]
            parents += [cur, cur]
            cur = len(tokens) - 1
        return TreeLayout.from_parents(tokens, parents)

    def accept(self, acc, aux):
        assert aux.shape[0] == len(acc.path)
        self.pos += len(acc.tokens)


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
        gen = SpeculativeEngine(teacher, proposer).generate(prompt, n)
        assert list(gen.tokens) == future[:n]
        if draft == "oracle":
            assert all(s.accepted_len == 4 for s in gen.steps[:-1])
        if draft == "wrong":
            assert gen.tau == 1.0
        if draft == "bushy":
            assert any(s.commit_mode == "path_index" for s in gen.steps)


def test_oracle_draft_reaches_tau_depth_plus_one(tiny):
    get, torch_model = tiny
    teacher = get("performance")
    prompt = PROMPTS[0]
    future = torch_greedy(torch_model, prompt, 60)
    proposer = ScriptedProposer(teacher.cfg.vocab_size, depth=5, mode="oracle")
    proposer.future = future
    gen = SpeculativeEngine(teacher, proposer).generate(prompt, 1 + 6 * 8)
    assert [s.emitted for s in gen.steps] == [6] * 8
    assert gen.tau == 6.0 and list(gen.tokens) == future[:49]


@pytest.mark.parametrize("mode", [CommitMode.LENGTH, CommitMode.PATH_INDEX])
def test_commit_modes_give_the_same_tokens(tiny, mode):
    get, torch_model = tiny
    teacher = get("performance")
    future = torch_greedy(torch_model, PROMPTS[0], 30)
    proposer = ScriptedProposer(teacher.cfg.vocab_size, depth=3, mode="oracle")
    proposer.future = future
    gen = SpeculativeEngine(teacher, proposer, commit_mode=mode).generate(PROMPTS[0], 25)
    assert list(gen.tokens) == future[:25]
    assert {s.commit_mode for s in gen.steps} == {mode.value}


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
    engine = SpeculativeEngine(teacher, proposer)
    gen = engine.generate(prompt, 40)
    assert gen.stop_reason == "cache_full"
    assert list(gen.tokens) == future[:len(gen.tokens)] and len(gen.tokens) == 11
    with pytest.raises(ConfigError, match="empty prompt"):
        engine.generate([], 5)
    proposer.future = torch_greedy(torch_model, PROMPTS[0], 20)
    assert list(engine.generate(PROMPTS[0], 10).tokens) == proposer.future[:10]


def test_a_proposer_with_a_foreign_root_is_refused(tiny):
    get, _ = tiny
    teacher = get("reference")

    class Bad:
        def begin(self, *a):
            pass

        def propose(self, root):
            return TreeLayout.from_parents([root + 1, 2], [0, 0])

        def accept(self, *a):
            pass

    with pytest.raises(TreeInvariantError, match="root token"):
        SpeculativeEngine(teacher, Bad()).generate([1, 2, 3], 5)
    assert np.isfinite(SpeculativeEngine(teacher).generate([1, 2, 3], 3).tau)
