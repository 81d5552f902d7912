"""The default teacher with the shipped head: suffix and hybrid drafting, fixed and adaptive budgets, give the
teacher's own greedy output token for token; on a prompt the answer copies from, the suffix branch gets long
chains accepted."""

import pytest

from mindspore_eagle.draft import load_proposer
from mindspore_eagle.draft.hybrid import HybridProposer
from mindspore_eagle.draft_config import TreeBudget
from mindspore_eagle.drafting import DraftingConfig
from mindspore_eagle.engine import SpeculativeEngine

COPY = "Copy this list exactly: apples, bananas, cherries, dates, elderberries, figs, grapes."
CODE = "Write a Python function that returns the n-th Fibonacci number."


@pytest.fixture(scope="module")
def eagle(default_teacher):
    teacher, _ = default_teacher
    return load_proposer(None, teacher, TreeBudget(max_nodes=16, depth=5, top_k=4))


def run(teacher, tok, prompt, n, proposer=None):
    ids = tok.encode_chat([{"role": "user", "content": prompt}])
    return SpeculativeEngine(teacher).generate(ids, n, tok.eos_token_ids, proposer=proposer)


@pytest.mark.parametrize("prompt, n, combos", [
    (COPY, 48, [("suffix", "fixed"), ("suffix", "adaptive"), ("hybrid", "fixed"), ("hybrid", "adaptive")]),
    pytest.param(CODE, 48, [("hybrid", "fixed"), ("hybrid", "adaptive")], marks=pytest.mark.slow),  # copy's modes
], ids=["copy", "code"])
def test_default_model_suffix_and_hybrid_equal_greedy(default_teacher, eagle, prompt, n, combos):
    teacher, tok = default_teacher
    greedy = run(teacher, tok, prompt, n)
    for mode, budget in combos:
        drafting = DraftingConfig(proposer=mode, budget=budget, max_nodes=16 if budget == "fixed" else 64)
        prop = HybridProposer(drafting, eagle, buckets=teacher.runtime.buckets)
        spec = run(teacher, tok, prompt, n, prop)
        assert spec.tokens == greedy.tokens, (mode, budget)
        if prompt is COPY and mode == "suffix":  # the answer copies the prompt: long suffix chains accepted
            assert spec.tau > 2.0, (mode, budget, spec.tau)
            assert max(s.accepted_len for s in spec.steps) >= 5
