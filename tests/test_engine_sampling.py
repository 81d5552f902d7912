"""Speculative sampling is lossless in distribution: on a tiny teacher, the 2nd and 3rd generated tokens
(produced by tree acceptance) follow the teacher's exact sampling distribution, computed independently with
the HuggingFace model."""

import numpy as np
import pytest
import torch
from scipy import stats

from mindspore_eagle.config import RuntimeConfig
from mindspore_eagle.engine import SpeculativeEngine
from mindspore_eagle.teacher import Teacher
from mindspore_eagle.tree import TreeLayout
from mindspore_eagle.verify import SamplingParams

PROMPT = [11, 22, 33, 44]
PARAMS = dict(temperature=1.0, top_k=4)
RUNS = 800


_MEMO = {}


def torch_probs(model, seq):
    """Teacher sampling distribution after ``seq`` (temperature 1, top-4), from transformers (memoised: the
    same few contexts recur across runs)."""
    key = (id(model), tuple(int(t) for t in seq))
    if key not in _MEMO:
        _MEMO[key] = _torch_probs(model, seq)
    return _MEMO[key]


def _torch_probs(model, seq):
    with torch.no_grad():
        logits = model(torch.tensor([seq])).logits[0, -1].double().numpy()
    kth = np.sort(logits)[-PARAMS["top_k"]]
    z = np.where(logits >= kth, logits, -np.inf)
    p = np.exp(z - z.max())
    return p / p.sum()


class TopTokensProposer:
    """A real-looking draft: under the root, the teacher's 3 most likely tokens; under each, its 2 most likely.
    (Deterministic drafts, as the acceptance rule assumes.)"""

    max_nodes = 10  # the root, 3 children, 2 grandchildren each

    def __init__(self, model):
        self.model, self.seq = model, []

    def begin(self, prompt, aux, first):
        self.seq = list(prompt) + [first]

    def propose(self, root):
        top1 = np.argsort(-torch_probs(self.model, self.seq))[:3]
        tokens, parents = [root], [0]
        for t in top1:
            tokens.append(int(t))
            parents.append(0)
            me = len(tokens) - 1
            for u in np.argsort(-torch_probs(self.model, self.seq + [int(t)]))[:2]:
                tokens.append(int(u))
                parents.append(me)
        return TreeLayout.from_parents(tokens, parents)

    def accept(self, acc, aux):
        self.seq += list(acc.tokens)


@pytest.fixture(scope="module")
def setup(hf_tiny):
    _, ms_dir, model = hf_tiny("qwen2")
    teacher = Teacher.load(ms_dir, RuntimeConfig(max_cache_len=64, buckets=(1, 8, 16), prefill_chunk=8))
    return teacher, model


def test_sampled_tokens_follow_the_teacher_distribution(setup):
    teacher, model = setup
    engine, proposer = SpeculativeEngine(teacher), TopTokensProposer(model)
    samples = np.array([engine.generate(PROMPT, 3, sampling=SamplingParams(seed=s, **PARAMS), proposer=proposer).tokens
                        for s in range(RUNS)])
    p1 = torch_probs(model, PROMPT)
    p2 = np.zeros_like(p1)
    p3 = np.zeros_like(p1)
    for a in np.flatnonzero(p1):
        pa = torch_probs(model, PROMPT + [int(a)])
        p2 += p1[a] * pa
        for b in np.flatnonzero(pa):
            p3 += p1[a] * pa[b] * torch_probs(model, PROMPT + [int(a), int(b)])
    for k, p in ((0, p1), (1, p2), (2, p3)):
        support = np.flatnonzero(p > 1e-12)
        observed = np.array([(samples[:, k] == t).sum() for t in support])
        assert observed.sum() == RUNS, f"token {k} left the teacher's top-k support"
        expected = p[support] * RUNS
        keep = expected >= 5  # chi-square validity: pool the rare outcomes
        obs = np.append(observed[keep], observed[~keep].sum())
        exp = np.append(expected[keep], expected[~keep].sum())
        if exp[-1] == 0:
            obs, exp = obs[:-1], exp[:-1]
        _, pvalue = stats.chisquare(obs, exp)
        assert pvalue > 1e-3, (k, obs, exp)
    # The draft was useful: some cycles accepted drafts (so acceptance, not only bonus sampling, was tested).
    gen = engine.generate(PROMPT, 12, sampling=SamplingParams(seed=1, **PARAMS), proposer=proposer)
    assert gen.tau > 1.0
