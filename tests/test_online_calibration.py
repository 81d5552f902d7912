"""OnlineCalibration: what one verified step labels (literal trees), the learnt ratio (hand-computed numbers), and
on an offline replay that a wrong suffix table is corrected while drafting (more tokens per step) without any
change to the output."""

import numpy as np
import pytest

from mindspore_eagle.draft.budget import VerifyCosts
from mindspore_eagle.draft.hybrid import HybridProposer
from mindspore_eagle.draft.online_calibration import OnlineCalibration, labelled_nodes
from mindspore_eagle.draft.replay import replay
from mindspore_eagle.draft.calibration import ROLES, NodeFeatures, SuffixCalibration, default_calibration
from mindspore_eagle.drafting import DraftingConfig
from mindspore_eagle.errors import ConfigError


def two_bucket_table(low: float, high: float) -> SuffixCalibration:
    """m_eff 1..3 read ``low``, m_eff >= 4 read ``high`` (every role, one count bucket)."""
    return SuffixCalibration((1, 4), (1,), [[[low]] * len(ROLES), [[high]] * len(ROLES)])


def features(m_eff, role=0, count=1) -> NodeFeatures:
    m = np.asarray(m_eff, np.int64)
    return NodeFeatures(m, np.full(m.shape, role, np.int64), np.full(m.shape, count, np.int64))


def test_a_step_labels_the_candidates_whose_parent_path_was_committed():
    # root r; 5 and 6 under it; 7 under 5; 8 under 7
    tokens, parents = [99, 5, 6, 7, 8], [0, 0, 0, 1, 3]
    labelled, accepted = labelled_nodes(tokens, parents, [5, 7, 4])
    assert labelled.tolist() == [False, True, True, True, True]
    assert accepted[labelled].tolist() == [True, False, True, False]  # 8 is not the committed 4
    labelled, accepted = labelled_nodes(tokens, parents, [5])  # only the bonus after 5 is known: depth 1 only
    assert labelled.tolist() == [False, True, True, False, False]
    assert accepted[labelled].tolist() == [True, False]
    labelled, _ = labelled_nodes(tokens, parents, [6, 1])  # 6 accepted: nothing under 5 is labelled
    assert labelled.tolist() == [False, True, True, False, False]


def test_without_evidence_it_reads_the_shipped_table():
    prior = default_calibration()
    rng = np.random.default_rng(1)
    f = NodeFeatures(rng.integers(1, 40, 200), rng.integers(0, len(ROLES), 200), rng.integers(1, 6, 200))
    np.testing.assert_allclose(OnlineCalibration(prior).q(f), np.minimum(prior.q(f), 0.995))


def test_the_ratio_is_observed_over_expected_hits_with_prior_strength():
    cal = OnlineCalibration(two_bucket_table(0.5, 0.8), strength=4.0, decay=1.0)
    cal.observe(features([1] * 10), np.array([1, 1] + [0] * 8, bool))
    # bucket 0: hits 2, expected 10 * 0.5 = 5 -> (2 + 4) / (5 + 4); bucket 1 untouched
    np.testing.assert_allclose(cal.ratio, [6 / 9, 1.0])
    np.testing.assert_allclose(cal.q(features([2, 7])), [0.5 * 6 / 9, 0.8])
    assert cal.labels == 10
    halving = OnlineCalibration(two_bucket_table(0.5, 0.8), strength=4.0, decay=0.5)
    halving.observe(features([1] * 10), np.array([1, 1] + [0] * 8, bool))
    halving.observe(features([]), np.zeros(0, bool))  # a step without labels still ages the evidence
    np.testing.assert_allclose(halving.ratio[0], (1 + 4) / (2.5 + 4))  # hits 2 -> 1, expected 5 -> 2.5
    halving.reset()
    np.testing.assert_allclose(halving.ratio, [1.0, 1.0])


def test_a_bucket_accepted_more_than_its_table_says_is_capped_below_one():
    cal = OnlineCalibration(two_bucket_table(0.9, 0.9), strength=4.0, decay=1.0, q_max=0.995)
    cal.observe(features([5] * 100), np.ones(100, bool))
    assert cal.ratio[1] == pytest.approx(104 / 94)
    assert cal.q(features([5]))[0] == pytest.approx(0.995)


def test_bad_parameters_and_mismatched_labels_are_refused_by_name():
    prior = two_bucket_table(0.5, 0.8)
    for kw, name in ((dict(strength=0), "strength"), (dict(decay=0), "decay"), (dict(decay=1.5), "decay"),
                     (dict(q_max=0), "q_max")):
        with pytest.raises(ConfigError, match=name):
            OnlineCalibration(prior, **kw)
    with pytest.raises(ConfigError, match="SuffixCalibration"):
        OnlineCalibration({"table": []})
    with pytest.raises(ConfigError, match="3 labels"):
        OnlineCalibration(prior).observe(features([1, 2]), np.ones(3, bool))


def noisy_loop(n: int, period: int = 12, noise: float = 0.08, seed: int = 0) -> list[int]:
    """A greedy small model's loop: one period repeated, a token replaced at random now and then."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 40, period)
    out = [int(base[i % period]) for i in range(n)]
    for i in np.flatnonzero(rng.random(n) < noise):
        out[i] = int(rng.integers(40, 60))
    return out


def test_a_table_that_underestimates_acceptance_is_corrected_while_drafting():
    """The table scaled by 0.3 makes the adaptive rule verify short trees on a loop it could copy; learning from
    the verified steps raises the ratio and the tokens emitted per step, and every step still commits exactly the
    known greedy output (the replay asserts nothing else is possible; the count of tokens proves it)."""
    shipped = default_calibration()
    low = SuffixCalibration(shipped.match_edges, shipped.count_edges, np.asarray(shipped.table) * 0.3)
    costs = VerifyCosts(((1, 18.6), (8, 23.4), (16, 33.6), (32, 54.5), (64, 94.9)))
    seq = noisy_loop(700)
    prompt, output = seq[:60], seq[60:]
    tau = {}
    for learn in (False, True):
        # learn_ratio=False: the proposer's global AcceptanceRatio would correct the scaled table too; the test
        # isolates the online table's own correction
        drafting = DraftingConfig(proposer="suffix", budget="adaptive", max_nodes=64,
                                  suffix_calibration="online" if learn else "shipped")
        prop = HybridProposer(drafting, buckets=(1, 8, 16, 32, 64), calibration=low, costs=costs, learn_costs=False,
                              learn_ratio=False)
        steps = replay(prop, prompt, output)
        assert sum(s.emitted for s in steps) == len(output) - 1
        tau[learn] = np.mean([s.emitted for s in steps])
        if learn:
            assert prop.learner.labels > 100
            assert prop.learner.ratio.max() > 1.5
        else:
            assert prop.learner is None and prop.calibration is low
    assert tau[True] > 1.1 * tau[False], tau
