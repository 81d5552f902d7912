"""Acceptance keeps exactly the teacher's choices: greedy paths checked on literal trees, sampling checked
against the exact target distribution by a chi-square test with enough draws to catch a wrong rule."""

import numpy as np
import pytest
from scipy import stats

from mindspore_eagle.errors import ConfigError
from mindspore_eagle.tree import TreeLayout
from mindspore_eagle.verify import (NUCLEUS_FIRST, PositionNoise, SamplingParams, accept_greedy, accept_sampling,
                                   nucleus, sample_token, target_probs)

V = 6


def onehot_logits(argmaxes):
    lg = np.zeros((len(argmaxes), V), np.float32)
    for i, a in enumerate(argmaxes):
        lg[i, a] = 5.0
    return lg


def ids(*argmaxes):
    """The teacher's argmax per node, as the greedy verification forward returns it."""
    return np.array(argmaxes, np.int32)


# root(tok 0) -> 1:[tok 3] -> 3:[tok 5]
#             -> 2:[tok 4] -> 4:[tok 1] -> 5:[tok 2]
TREE = TreeLayout.from_parents([0, 3, 4, 5, 1, 2], [0, 0, 0, 1, 2, 4])


def test_greedy_accepts_the_longest_matching_path_plus_bonus():
    # teacher argmax per node: root->4, node2->1, node4->2, node5->0
    acc = accept_greedy(TREE, ids(4, 0, 1, 0, 2, 0))
    assert acc.path == (0, 2, 4, 5) and acc.tokens == (4, 1, 2, 0) and acc.bonus == 0 and acc.num_accepted == 3


def test_greedy_with_no_matching_child_emits_only_the_bonus():
    acc = accept_greedy(TREE, ids(2, 0, 0, 0, 0, 0))
    assert acc.path == (0,) and acc.tokens == (2,)


def test_greedy_stops_mid_path_when_the_teacher_disagrees():
    acc = accept_greedy(TREE, ids(3, 4, 0, 0, 0, 0))  # node1's child is tok 5, teacher wants 4
    assert acc.path == (0, 1) and acc.tokens == (3, 4)


def test_greedy_ignores_padding_rows():
    padded = TREE.padded(8)
    am = ids(4, 0, 1, 0, 2, 0, 0, 0)
    assert accept_greedy(padded, am) == accept_greedy(TREE, am[:6])


@pytest.mark.parametrize("bad", [onehot_logits([4, 0, 1, 0, 2, 0]), ids(4, 0, 1), np.zeros(6, np.float32)])
def test_greedy_refuses_anything_but_one_token_id_per_node(bad):
    with pytest.raises(ConfigError, match="accept_greedy: argmax must be integer token ids"):
        accept_greedy(TREE, bad)


def test_sampling_params_are_validated():
    for kw in (dict(temperature=-1), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-2)):
        with pytest.raises(ConfigError):
            SamplingParams(**kw)


def test_target_probs_top_k_and_top_p_keep_the_right_support():
    logits = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05, 0.0001]))
    p = target_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    np.testing.assert_allclose(p, [0.5 / 0.7, 0.2 / 0.7, 0, 0, 0, 0], atol=1e-9)
    p = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.8))  # 0.5+0.2 < 0.8 <= 0.85
    np.testing.assert_allclose(p[:3], np.array([0.5, 0.2, 0.15]) / 0.85, atol=1e-6)
    assert p[3:].sum() == 0


def _probs_by_full_sort(logits, params):
    """Reference: temperature, top-k by a full sort, top-p by one stable sort of the whole vocabulary, cumulative
    mass summed one token at a time in Python (the definition, written out)."""
    z = logits.astype(np.float64) / params.temperature
    if params.top_k:
        kth = sorted(z.tolist())[-min(params.top_k, z.size)]
        z = np.where(z >= kth, z, -np.inf)
    p = np.exp(z - z.max())
    p /= p.sum()
    if params.top_p < 1:
        ranked = sorted(range(p.size), key=lambda i: (-p[i], i))  # decreasing p, ties by id
        keep, mass = [], 0.0
        for i in ranked:
            keep.append(i)
            mass += float(p[i])
            if mass >= params.top_p:
                break
        mask = np.zeros(p.size, bool)
        mask[keep] = True
        p = np.where(mask, p, 0.0)
        p /= p.sum()
    return p


def _vocab_logits(rng, kind, v=4096):
    if kind == "peaked":  # the mass in a few tokens (a trained model's usual row)
        return (rng.standard_normal(v) * 4).astype(np.float32)
    if kind == "flat":  # the mass spread over far more than NUCLEUS_FIRST tokens: the ranking must widen
        return (rng.standard_normal(v) * 0.05).astype(np.float32)
    # ties: few distinct values, so the m-th largest ties with many tokens on both sides of any cut
    return rng.integers(0, 6, v).astype(np.float32)


@pytest.mark.parametrize("kind", ["peaked", "flat", "ties"])
def test_target_probs_equal_the_full_sort_bit_for_bit(kind):
    rng = np.random.default_rng({"peaked": 1, "flat": 2, "ties": 3}[kind])
    for trial in range(12):
        logits = _vocab_logits(rng, kind)
        for params in (SamplingParams(0.7, top_p=float(rng.uniform(0.05, 0.999))),
                       SamplingParams(1.3, top_p=0.95, top_k=int(rng.integers(1, 300))),
                       SamplingParams(1.0, top_k=int(rng.integers(1, 4096))), SamplingParams(0.5, top_p=1e-9),
                       SamplingParams(2.0, top_p=0.9999999), SamplingParams(1.0, top_p=0.9999999, top_k=5)):
            got, want = target_probs(logits, params), _probs_by_full_sort(logits, params)
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (kind, trial, params)


def test_nucleus_widens_its_ranking_until_the_mass_is_reached():
    p = np.full(10 * NUCLEUS_FIRST, 1.0 / (10 * NUCLEUS_FIRST))  # uniform: the mass needs most of the tokens
    keep = nucleus(p, 0.9)
    assert keep.size > NUCLEUS_FIRST * 8 and list(keep) == list(range(keep.size))  # ties by id
    assert list(nucleus(p, 1.5)) == list(range(p.size))  # never reached: every token
    sparse = np.zeros(1000)
    sparse[[9, 5, 7]] = [0.2, 0.5, 0.3]  # fewer tokens with mass than the first ranking takes (top-k ran before)
    assert list(nucleus(sparse, 0.7)) == [5, 7]
    assert list(nucleus(sparse, 1.5)) == [5, 7, 9] + [i for i in range(1000) if i not in (5, 7, 9)]


def _first_two_tokens_distribution(logits_by_node, tree, params, n, seed):
    counts = {}
    for i in range(n):  # one seed per draw: each is an independent sample
        acc = accept_sampling(tree, logits_by_node, params, PositionNoise(seed * n + i), 10)
        counts[acc.tokens[0]] = counts.get(acc.tokens[0], 0) + 1
    return counts


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9),
                                    SamplingParams(temperature=1.3, top_k=3)])
def test_sampling_acceptance_reproduces_the_teacher_distribution(params):
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 1.5, (TREE.num_nodes, V))
    n = 20000
    counts = _first_two_tokens_distribution(logits, TREE, params, n, seed=1)
    p = target_probs(logits[0], params)
    support = np.flatnonzero(p > 0)
    observed = np.array([counts.get(int(t), 0) for t in support])
    assert sum(counts.get(int(t), 0) for t in range(V) if p[t] == 0) == 0
    _, pvalue = stats.chisquare(observed, p[support] * n)
    assert pvalue > 1e-3, (observed, p[support] * n)


def test_a_wrong_acceptance_rule_fails_the_same_test():
    """Negative control: accepting a child with probability sqrt(p(x)) (a plausible bug) is detected."""
    rng_l = np.random.default_rng(0)
    logits = rng_l.normal(0, 1.5, (TREE.num_nodes, V))
    params = SamplingParams(temperature=1.0)
    p = target_probs(logits[0], params)
    rng = np.random.default_rng(1)
    counts = np.zeros(V)
    kids = [1, 2]
    for _ in range(20000):
        q = p.copy()
        tok = None
        for c in kids:
            x = int(TREE.tokens[c])
            if rng.random() < np.sqrt(q[x]):
                tok = x
                break
            q[x] = 0
            q /= q.sum()
        counts[tok if tok is not None else rng.choice(V, p=q)] += 1
    _, pvalue = stats.chisquare(counts, p * 20000)
    assert pvalue < 1e-6


def test_second_token_is_conditionally_teacher_distributed():
    """Given first token 4 (node 2 accepted), the next token follows p at node 2."""
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 1.0, (TREE.num_nodes, V))
    params = SamplingParams(temperature=1.0)
    seconds = []
    for i in range(30000):
        acc = accept_sampling(TREE, logits, params, PositionNoise(5 * 30000 + i), 10)
        if acc.tokens[0] == 4:
            seconds.append(acc.tokens[1])
    p = target_probs(logits[2], params)
    observed = np.bincount(seconds, minlength=V)
    _, pvalue = stats.chisquare(observed, p * len(seconds))
    assert pvalue > 1e-3


def test_sampling_is_reproducible_for_a_seed_and_greedy_at_zero_temperature():
    logits = np.random.default_rng(0).normal(0, 1, (TREE.num_nodes, V))
    a = [accept_sampling(TREE, logits, SamplingParams(1.0), PositionNoise(9), 10) for _ in range(3)]
    assert a[0] == a[1] == a[2]
    assert (accept_sampling(TREE, logits, SamplingParams(0.0), PositionNoise(9), 10)
            == accept_greedy(TREE, np.argmax(logits, -1)))
    assert sample_token(logits[0], SamplingParams(0.0), PositionNoise(0), 10) == int(np.argmax(logits[0]))


def test_sampled_tokens_do_not_depend_on_the_tree():
    """The token at a position depends on (seed, position, context) only: the tree's emitted tokens are exactly
    what sampling one token at a time gives, whatever the tree proposed."""
    logits = np.random.default_rng(4).normal(0, 1, (TREE.num_nodes, V))
    root_only = TreeLayout.single(int(TREE.tokens[0]))
    for seed in range(200):
        acc = accept_sampling(TREE, logits, SamplingParams(1.0), PositionNoise(seed), 10)
        first = sample_token(logits[0], SamplingParams(1.0), PositionNoise(seed), 10)
        assert acc.tokens[0] == first  # the root's next token, with or without drafts under the root
        assert accept_sampling(root_only, logits[:1], SamplingParams(1.0), PositionNoise(seed), 10).tokens == (first,)
        if acc.num_accepted:  # the next token after an accepted child is the one-token sample at position 11
            node = acc.path[1]
            assert acc.tokens[1] == sample_token(logits[node], SamplingParams(1.0), PositionNoise(seed), 11)


def test_position_noise_is_keyed_by_seed_and_position():
    a, b = PositionNoise(3), PositionNoise(3)
    assert np.array_equal(a.gumbel(7, 50), b.gumbel(7, 50))
    assert not np.array_equal(a.gumbel(7, 50), a.gumbel(8, 50))
    assert not np.array_equal(a.gumbel(7, 50), PositionNoise(4).gumbel(7, 50))
    assert np.array_equal(PositionNoise(2 ** 70).gumbel(1, 8), PositionNoise(2 ** 70).gumbel(1, 8))
