"""Speculative sampling is lossless in distribution: on a tiny teacher, the 2nd and 3rd generated tokens
(produced by tree acceptance) follow the teacher's exact sampling distribution, computed independently with
the HuggingFace model."""

import numpy as np
import pytest
import torch
from scipy import stats

from mindspore_eagle.drafting import DraftingConfig
from mindspore_eagle.runtime import RuntimeConfig
from mindspore_eagle.engine import SpeculativeEngine
from mindspore_eagle.teacher import Teacher
from mindspore_eagle.tree import TreeLayout
from mindspore_eagle.verify import SamplingParams, target_probs

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


def teacher_marginals(model, prompt):
    """Exact distributions of the 1st, 2nd and 3rd sampled tokens after ``prompt`` (marginalised), from torch."""
    p1 = torch_probs(model, prompt)
    p2 = np.zeros_like(p1)
    p3 = np.zeros_like(p1)
    for a in np.flatnonzero(p1):
        pa = torch_probs(model, prompt + [int(a)])
        p2 += p1[a] * pa
        for b in np.flatnonzero(pa):
            p3 += p1[a] * pa[b] * torch_probs(model, prompt + [int(a), int(b)])
    return p1, p2, p3


def chi_square_pvalues(samples, model, prompt):
    """p-value of a chi-square test of each of the first three sampled tokens against the teacher's marginal;
    -1 when a token left the teacher's top-k support (impossible for a lossless sampler)."""
    out = []
    for k, p in enumerate(teacher_marginals(model, prompt)):
        support = np.flatnonzero(p > 1e-12)
        observed = np.array([(samples[:, k] == t).sum() for t in support])
        if observed.sum() != samples.shape[0]:
            out.append(-1.0)
            continue
        expected = p[support] * samples.shape[0]
        keep = expected >= 5  # chi-square validity: pool the rare outcomes
        obs = np.append(observed[keep], observed[~keep].sum())
        exp = np.append(expected[keep], expected[~keep].sum())
        if exp[-1] == 0:
            obs, exp = obs[:-1], exp[:-1]
        out.append(stats.chisquare(obs, exp)[1])
    return out


def test_sampled_tokens_follow_the_teacher_distribution(setup):
    teacher, model = setup
    engine, proposer = SpeculativeEngine(teacher), TopTokensProposer(model)
    samples = np.array([engine.generate(PROMPT, 3, sampling=SamplingParams(seed=s, **PARAMS), proposer=proposer).tokens
                        for s in range(RUNS)])
    pvalues = chi_square_pvalues(samples, model, PROMPT)
    assert min(pvalues) > 1e-3, pvalues
    # The draft was useful: some cycles accepted drafts (so acceptance, not only bonus sampling, was tested).
    gen = engine.generate(PROMPT, 12, sampling=SamplingParams(seed=1, **PARAMS), proposer=proposer)
    assert gen.tau > 1.0


# ----- hybrid trees: EAGLE-like candidates and suffix candidates merged ----------------------------------------

# Every token of the vocabulary occurs in it, so whatever root is sampled, the suffix index finds an earlier
# occurrence and proposes a chain next to the "head"'s top tokens.
HYBRID_PROMPT = list(range(101)) + [11, 22, 33, 44]


@pytest.fixture(scope="module")
def long_setup(hf_tiny):
    _, ms_dir, model = hf_tiny("qwen2")
    teacher = Teacher.load(ms_dir, RuntimeConfig(max_cache_len=160, buckets=(1, 8, 16, 32), prefill_chunk=32))
    return teacher, model


class TopTokensEagle:
    """Stands in for ``Eagle3Proposer`` in a ``HybridProposer``: candidates are the teacher's 3 most likely
    tokens and, under each, its 2 most likely, scored by their (cumulative) log-probabilities, numbered like
    tree growth (ids 1-3 under the root, 4-9 under them). ``sequence`` returns the committed tokens."""

    def __init__(self, model):
        self.model, self.sequence = model, None

    def reset(self):
        pass

    def extend(self, tokens, feats):
        pass

    def candidates(self):
        seq = list(self.sequence())
        p = torch_probs(self.model, seq)
        top = np.argsort(-p)[:3]
        scores, tokens, parents = list(np.log(p[top])), list(top), [0, 0, 0]
        for i, t in enumerate(top):
            q = torch_probs(self.model, seq + [int(t)])
            for u in np.argsort(-q)[:2]:
                scores.append(np.log(p[t]) + np.log(max(q[u], 1e-30)))
                tokens.append(int(u))
                parents.append(i + 1)
        return np.array(scores, np.float32), np.array(tokens), np.array(parents)


def hybrid_samples(teacher, model, runs):
    from mindspore_eagle.draft.hybrid import HybridProposer
    from mindspore_eagle.draft.merge import SOURCE_EAGLE, SOURCE_SUFFIX

    stub = TopTokensEagle(model)
    prop = HybridProposer(DraftingConfig(proposer="hybrid", budget="fixed", max_nodes=16), stub,
                          buckets=teacher.runtime.buckets)
    stub.sequence = lambda: prop.index.tokens
    engine = SpeculativeEngine(teacher)
    samples, sources = [], set()
    for s in range(runs):
        samples.append(engine.generate(HYBRID_PROMPT, 3, sampling=SamplingParams(seed=s, **PARAMS), proposer=prop).tokens)
        sources |= {f for step in prop.log for f in step.source}
    assert {SOURCE_EAGLE, SOURCE_SUFFIX} <= sources, "the trees did not merge both sources"
    return np.array(samples)


def test_hybrid_trees_sample_the_teacher_distribution(long_setup):
    teacher, model = long_setup
    pvalues = chi_square_pvalues(hybrid_samples(teacher, model, 600), model, HYBRID_PROMPT)
    assert min(pvalues) > 1e-3, pvalues


def test_negative_control_a_lossy_acceptance_fails_the_same_check(long_setup, monkeypatch):
    """The check above can fail: accepting the first child whenever the teacher allows it (instead of with
    probability p) skews the samples towards the drafts, and the chi-square test rejects them."""
    import mindspore_eagle.engine as engine_module
    from mindspore_eagle.verify import Acceptance, children_lists, sample_token

    def lossy(layout, logits, params, noise, position):
        kids = children_lists(layout)
        path = [0]
        while True:
            p = target_probs(logits[path[-1]], params)
            nxt = next((c for c in kids[path[-1]] if p[int(layout.tokens[c])] > 0), None)
            if nxt is None:
                bonus = sample_token(logits[path[-1]], params, noise, position + len(path) - 1)
                return Acceptance(tuple(path), tuple(int(layout.tokens[n]) for n in path[1:]) + (bonus,), bonus)
            path.append(nxt)

    teacher, model = long_setup
    monkeypatch.setattr(engine_module, "accept_sampling", lossy)
    pvalues = chi_square_pvalues(hybrid_samples(teacher, model, 300), model, HYBRID_PROMPT)
    assert min(pvalues) < 1e-3, pvalues


def test_the_same_seed_gives_the_same_tokens_with_or_without_speculation(setup):
    """Position-keyed sampling: the tree changes how many tokens a step emits, never which ones."""
    teacher, model = setup
    engine = SpeculativeEngine(teacher)
    for seed in range(12):
        s = SamplingParams(seed=seed, **PARAMS)
        plain = engine.generate(PROMPT, 10, sampling=s).tokens
        spec = engine.generate(PROMPT, 10, sampling=s, proposer=TopTokensProposer(model))
        assert spec.tokens == plain, seed
    assert spec.tau > 1.0  # drafts were accepted along the way
