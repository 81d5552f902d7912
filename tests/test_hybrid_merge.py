"""One tree from EAGLE and suffix candidates: shared prefixes once, max of the two estimates, siblings capped
to sum 1, best-first under the budget, ancestor-closed, a valid TreeLayout, sources recorded; and the
adaptive budget rule picks the bucket a brute-force search picks."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mindspore_eagle.draft.budget import CostTracker, EagleProfile, VerifyCosts, plan_budget, should_grow
from mindspore_eagle.draft.hybrid import BASELINE_EVERY, BASELINE_SAMPLES
from mindspore_eagle.draft.grow import select_tree
from mindspore_eagle.draft.merge import (SOURCE_BOTH, SOURCE_EAGLE, SOURCE_ROOT, SOURCE_SUFFIX, CandidateTree,
                                         merge_trees, select, union)
from mindspore_eagle.drafting import DraftingConfig
from mindspore_eagle.errors import ConfigError, TreeInvariantError
from mindspore_eagle.tree import check_tree

ROOT_TOKEN = 50


def tree_paths(tokens, parents):
    """Token path (from the root, root excluded) of every node of a parents-first tree."""
    out = [()]
    for i in range(1, len(tokens)):
        out.append(out[int(parents[i])] + (int(tokens[i]),))
    return out


def paths(tree):
    return tree_paths(tree.tokens, tree.parents)


# EAGLE: root -> 1 (0.6) -> 2 (0.3); root -> 3 (0.2)
EAGLE = CandidateTree([ROOT_TOKEN, 1, 2, 3], [0, 0, 1, 0], [1.0, 0.6, 0.3, 0.2])
# suffix: root -> 1 (0.7) -> 2 (0.65) -> 4 (0.6); root -> 5 (0.1)
SUFFIX = CandidateTree([ROOT_TOKEN, 1, 2, 4, 5], [0, 0, 1, 2, 0], [1.0, 0.7, 0.65, 0.6, 0.1])


def test_shared_prefixes_are_merged_once_with_the_larger_estimate():
    u = union(EAGLE, SUFFIX)
    t = u.tree
    by_path = {p: i for i, p in enumerate(paths(t))}
    assert set(by_path) == {(), (1,), (1, 2), (3,), (1, 2, 4), (5,)}
    p = dict(zip(by_path, t.probs[list(by_path.values())]))
    # root children conditionals: 0.7 + 0.2 + 0.1 = 1.0: no scaling
    assert p[(1,)] == pytest.approx(0.7) and p[(1, 2)] == pytest.approx(0.65) and p[(1, 2, 4)] == pytest.approx(0.6)
    assert p[(3,)] == pytest.approx(0.2) and p[(5,)] == pytest.approx(0.1)
    src = dict(zip(by_path, u.source[list(by_path.values())]))
    assert src == {(): SOURCE_ROOT, (1,): SOURCE_BOTH, (1, 2): SOURCE_BOTH, (3,): SOURCE_EAGLE,
                   (1, 2, 4): SOURCE_SUFFIX, (5,): SOURCE_SUFFIX}


def test_siblings_from_two_sources_are_scaled_to_sum_one():
    eagle = CandidateTree([ROOT_TOKEN, 1, 6], [0, 0, 1], [1.0, 0.8, 0.4])
    suffix = CandidateTree([ROOT_TOKEN, 2], [0, 0], [1.0, 0.6])
    t = union(eagle, suffix).tree
    # root's children 0.8 + 0.6 = 1.4 -> 0.8/1.4, 0.6/1.4; the grandchild keeps its conditional 0.5
    np.testing.assert_allclose(t.probs, [1.0, 0.8 / 1.4, 0.8 / 1.4 * 0.5, 0.6 / 1.4])


def test_selection_is_best_first_ancestor_closed_and_depth_first_most_probable_child_first():
    m = merge_trees(EAGLE, SUFFIX, 4)
    check_tree(m.layout, 100)
    # the 3 best non-root nodes: (1) 0.7, (1,2) 0.65, (1,2,4) 0.6 -> one chain, laid out 0..3
    assert paths(m.layout) == [(), (1,), (1, 2), (1, 2, 4)]
    assert m.layout.parents.tolist() == [0, 0, 1, 2]
    np.testing.assert_allclose(m.probs, [1, 0.7, 0.65, 0.6])
    assert m.expected_tokens == pytest.approx(2.95)
    m = merge_trees(EAGLE, SUFFIX, 6)
    assert paths(m.layout) == [(), (1,), (1, 2), (1, 2, 4), (3,), (5,)]
    assert m.source.tolist() == [SOURCE_ROOT, SOURCE_BOTH, SOURCE_BOTH, SOURCE_SUFFIX, SOURCE_EAGLE, SOURCE_SUFFIX]
    assert merge_trees(EAGLE, SUFFIX, 1).layout.num_nodes == 1


def test_a_child_that_outranks_its_parent_waits_for_it():
    # Not produced by the scorers (p never increases down a path), but selection stays a tree anyway.
    t = CandidateTree([ROOT_TOKEN, 1, 2, 3], [0, 0, 1, 0], [1.0, 0.1, 0.1, 0.5])
    bad = union(None, t)
    object.__setattr__(bad.tree, "probs", np.array([1.0, 0.1, 0.9, 0.5]))
    m = select(bad, 3)
    assert paths(m.layout) == [(), (3,), (1,)]


# Scores on a 1e-3 grid: two distinct scores then stay distinct after exp() in float64 (the merge ranks by
# p = exp(score); hypothesis found -5.6e-17 vs 0.0, one float32 apart, equal as p = 1.0 and so ranked by index,
# a tie no log-softmax produces).
candidate_sets = st.integers(1, 4).flatmap(lambda k: st.tuples(
    st.just(k), st.integers(1, 3),
    st.lists(st.floats(-6, 0).map(lambda x: round(x, 3)), min_size=k + 2 * k * k, max_size=k + 2 * k * k),
    st.lists(st.integers(0, 7), min_size=k + 2 * k * k, max_size=k + 2 * k * k)))


def eagle_candidates(k, depth, raw_scores, raw_tokens):
    """Candidates shaped like growth's output: level 1 under the root, then k*k per level under the previous
    level's first k candidates; cumulative scores, siblings distinct."""
    scores, tokens, parents = [], [], []
    level, base = list(range(1, k + 1)), 0
    for j in range(k):
        scores.append(raw_scores[j] / 4)
        tokens.append(j)
        parents.append(0)
    for d in range(1, depth):
        new = []
        for f_i, f in enumerate(level):
            for c in range(k):
                i = len(scores)
                scores.append(scores[f - 1] + raw_scores[i] / 4)
                tokens.append((raw_tokens[i] * k + c) % 64)
                parents.append(f)
                new.append(i + 1)
        level = new[:k]
    return np.array(scores, np.float32), np.array(tokens), np.array(parents)


@settings(max_examples=80, deadline=None)
@given(candidate_sets, st.integers(1, 20))
def test_eagle_candidates_alone_select_what_select_tree_selects(cands, max_nodes):
    k, depth, raw_s, raw_t = cands
    scores, tokens, parents = eagle_candidates(k, depth, raw_s, raw_t)
    want = select_tree(ROOT_TOKEN, scores, tokens, parents, max_nodes)
    got = merge_trees(CandidateTree.from_eagle(ROOT_TOKEN, scores, tokens, parents), None, max_nodes)
    check_tree(got.layout, 64)
    assert sorted(paths(got.layout)) == sorted(paths(want.layout))
    np.testing.assert_allclose(np.sort(got.probs), np.sort(np.exp(want.scores.astype(np.float64))), rtol=1e-6)


@settings(max_examples=80, deadline=None)
@given(candidate_sets, st.lists(st.integers(0, 7), min_size=1, max_size=12), st.integers(1, 30))
def test_merged_trees_are_valid_deduplicated_and_hold_the_most_probable_union_nodes(cands, chain, max_nodes):
    k, depth, raw_s, raw_t = cands
    eagle = CandidateTree.from_eagle(ROOT_TOKEN, *eagle_candidates(k, depth, raw_s, raw_t))
    probs = np.cumprod(np.full(len(chain), 0.9))
    suffix = CandidateTree([ROOT_TOKEN] + chain, [0] + list(range(len(chain))), np.concatenate([[1.0], probs]))
    u = union(eagle, suffix)
    m = select(u, max_nodes)
    check_tree(m.layout, 64)
    ps = paths(m.layout)
    assert len(set(ps)) == len(ps) == min(max_nodes, u.tree.num_nodes)
    # best-first: no unselected union node is more probable than a selected one
    chosen = set(ps)
    upaths = paths(u.tree)
    left = [p for i, p in enumerate(u.tree.probs) if upaths[i] not in chosen]
    if left and m.layout.num_nodes > 1:
        assert max(left) <= m.probs[1:].min() + 1e-12
    # p never increases down a path, and the first child of every node is its most probable one
    for i in range(1, m.layout.num_nodes):
        assert m.probs[i] <= m.probs[int(m.layout.parents[i])] + 1e-12
    for v in range(m.layout.num_nodes):
        kids = [i for i in range(1, m.layout.num_nodes) if m.layout.parents[i] == v]
        if kids:
            assert m.probs[kids[0]] == max(m.probs[kids]) and kids[0] == (v + 1)


def test_candidate_trees_are_validated():
    with pytest.raises(TreeInvariantError, match="rule: order"):
        CandidateTree([1, 2, 3], [0, 2, 0], [1, 0.5, 0.5])
    with pytest.raises(TreeInvariantError, match="probability"):
        CandidateTree([1, 2], [0, 0], [1, 1.5])
    with pytest.raises(TreeInvariantError, match="different roots"):
        union(CandidateTree.single(1), CandidateTree.single(2))
    p = CandidateTree.from_eagle(7, np.array([np.nan, -1.0]), np.array([3, 4]), np.array([0, 1])).probs
    np.testing.assert_allclose(p, [1.0, 0.0, np.exp(-1.0)])


# ----- the adaptive budget ---------------------------------------------------------------------------------

COSTS = VerifyCosts(((1, 70.0), (8, 125.0), (16, 126.0), (32, 176.0)), grow_ms=25.0)
COST_BUCKETS = (1, 8, 16, 32)
SUFFIX_ADAPTIVE = DraftingConfig(proposer="suffix", budget="adaptive", max_nodes=16)


def brute_force_plan(p, costs, draft_ms):
    p = sorted(p, reverse=True)
    best = None
    for bucket, ms in costs.bucket_ms:
        n = min(bucket, len(p) + 1)
        e = 1 + sum(p[:n - 1])
        if best is None or e / (ms + draft_ms) > best[2] + 1e-12:
            best = (n, bucket, e / (ms + draft_ms))
    return best


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1), max_size=40), st.floats(0, 50))
def test_plan_budget_equals_a_brute_force_search(p, draft_ms):
    plan = plan_budget(np.sort(np.array(p, np.float64))[::-1], COSTS, draft_ms)
    n, bucket, rate = brute_force_plan(p, COSTS, draft_ms)
    assert (plan.num_nodes, plan.bucket) == (n, bucket) and plan.rate == pytest.approx(rate)


def test_plan_budget_literal_cases():
    none = plan_budget(np.zeros(0), COSTS, 0.0)
    assert (none.num_nodes, none.bucket, none.expected_tokens) == (1, 1, 1.0)
    weak = plan_budget(np.array([0.3, 0.2, 0.1]), COSTS, 0.0)  # E(8) = 1.6 < 125/70: plain decoding
    assert weak.bucket == 1
    chain = plan_budget(0.97 ** np.arange(1, 40), COSTS, 0.0)  # a long confident chain fills a deep bucket
    assert chain.bucket == 32 and chain.num_nodes == 32
    mid = plan_budget(np.array([0.9, 0.8, 0.7]), COSTS, 0.0)
    assert (mid.num_nodes, mid.bucket) == (4, 8)


def test_growth_is_skipped_when_the_suffix_branch_is_confident():
    profile = EagleProfile(warmup=2)
    assert should_grow(np.zeros(0), 0.0, profile, COSTS)  # no profile yet: grow to learn it
    profile.update(np.array([0.6, 0.4, 0.3, 0.2, 0.1, 0.0]))
    assert should_grow(0.95 ** np.arange(1, 20), 0.95, profile, COSTS)  # one sample is not enough evidence
    profile.update(np.array([0.8, 0.6, 0.5, 0.4, 0.3, 0.2]))
    np.testing.assert_allclose(profile.mean, [0.7, 0.5, 0.4, 0.3, 0.2, 0.1])  # the plain mean of the two
    chain = 0.95 ** np.arange(1, 20)
    assert not should_grow(chain, 0.95, profile, COSTS)
    assert should_grow(np.zeros(0), 0.0, profile, COSTS)  # nothing else to go on: the head's 3.2 tokens pay
    weak = EagleProfile(warmup=1)
    weak.update(np.array([0.3, 0.1, 0.05]))
    assert not should_grow(np.zeros(0), 0.0, weak, COSTS)  # 1.45 expected tokens never pay 25 + 125 ms


def test_costs_are_validated():
    with pytest.raises(ConfigError, match="increasing"):
        VerifyCosts(((8, 10.0), (1, 5.0)))
    with pytest.raises(ConfigError, match="> 0"):
        VerifyCosts(((1, 0.0),))
    with pytest.raises(ConfigError, match="no cost for buckets"):
        COSTS.restricted((1, 8, 64))
    assert COSTS.restricted((1, 16)).bucket_ms == ((1, 70.0), (16, 126.0))
    with pytest.raises(ConfigError, match="alpha"):
        EagleProfile(0.0)
    with pytest.raises(ConfigError, match="warmup"):
        EagleProfile(warmup=0)


def test_cost_tracker_follows_observed_medians_and_drops_compile_outliers():
    tracker = CostTracker(COSTS, window=3)
    assert tracker.costs().bucket_ms == COSTS.bucket_ms  # nothing seen: the prior
    tracker.observe(12, 5000.0)  # a first call that compiled the 16-row graph: dropped
    for ms in (90.0, 95.0, 100.0, 400.0):  # the window keeps the last 3: median 100
        tracker.observe(16, ms)
    tracker.observe(1, 60.0)
    tracker.observe_growth(12.0)
    c = tracker.costs()
    # seen: 1 -> 60 (prior 70), 16 -> 100 (prior 126); unseen 8, between them, interpolates their costs in rows;
    # unseen 32, beyond them, scales its prior by the median ratio of the seen ones
    scale = np.median([60 / 70, 100 / 126])
    np.testing.assert_allclose([ms for _, ms in c.bucket_ms], [60, 60 + 40 * 7 / 15, 100, 176 * scale])
    assert c.grow_ms == 12.0
    assert tracker.bucket_of(9) == 16 and tracker.bucket_of(100) == 32


@settings(max_examples=60, deadline=None)
@given(events=st.lists(st.tuples(st.sampled_from([0, 1, 2, 4, 9, 16, 30, 33]),
                                 st.floats(0.0, 2000.0, allow_nan=False)), max_size=60),
       window=st.integers(1, 5))
def test_cost_tracker_table_equals_numpy_medians_recomputed_from_every_observation(events, window):
    """The tracker keeps its medians (and the table) as observations arrive; the table must equal, bit for bit,
    the rule recomputed from scratch with numpy from the observations it kept, whenever it is asked."""
    tracker = CostTracker(COSTS, window=window)
    prior = dict(COSTS.bucket_ms)
    kept: dict[int, list[float]] = {b: [] for b in prior}
    grow: list[float] = []
    for kind, ms in events:
        win, ref = (grow, COSTS.grow_ms) if kind == 0 else (kept[tracker.bucket_of(kind)], None)
        current = float(np.median(win)) if win else (ref if ref is not None else prior[tracker.bucket_of(kind)])
        if ms >= 1e-3 and not ms > 10.0 * max(current, 1e-3):  # the documented rule: no sample under 1 us, no outlier
            win.append(ms)
            del win[:-window]
        tracker.observe_growth(ms) if kind == 0 else tracker.observe(kind, ms)
        seen = {b: float(np.median(v)) for b, v in kept.items() if v}
        scale = float(np.median([seen[b] / prior[b] for b in seen])) if seen else 1.0
        known = sorted(seen)
        inside = [bool(known) and known[0] < b < known[-1] for b in sorted(prior)]
        want = np.minimum.accumulate([  # non-decreasing from the top down: a bucket at most the next larger one
            seen[b] if b in seen else float(np.interp(b, known, [seen[k] for k in known])) if inner
            else prior[b] * scale for b, inner in reversed(list(zip(sorted(prior), inside)))])[::-1].tolist()
        got = tracker.costs()
        assert [ms for _, ms in got.bucket_ms] == want
        assert got.grow_ms == (float(np.median(grow)) if grow else COSTS.grow_ms)


def test_a_slow_sample_in_a_small_bucket_does_not_price_the_larger_buckets():
    """The table is non-decreasing from the top down: a bucket costs at most what the next larger one measured, so a
    slow sample that stays a bucket's median (the rule stops choosing it; no new sample comes) neither keeps the
    larger buckets unused nor stays above them. Seen in the single-request engine: bucket 8 stuck at 95 ms made 16
    and 32 cost 95 ms too."""
    tracker = CostTracker(COSTS, window=3)
    tracker.observe(8, 400.0)  # slow, yet under the outlier cut (10 x 125)
    tracker.observe(16, 130.0)
    tracker.observe(32, 180.0)
    assert dict(tracker.costs().bucket_ms) == {1: pytest.approx(70 * np.median([400 / 125, 130 / 126, 180 / 176])),
                                               8: 130.0, 16: 130.0, 32: 180.0}


def test_a_cost_sample_under_a_microsecond_is_not_learnt():
    """A subnormal sample (5e-324 ms) scaled every unseen bucket's prior to 0 ms and the table was refused."""
    tracker = CostTracker(COSTS, window=1)
    tracker.observe(2, 5e-324)
    tracker.observe(16, 0.0005)
    tracker.observe_growth(1e-300)
    assert tracker.costs().bucket_ms == COSTS.bucket_ms and tracker.costs().grow_ms == COSTS.grow_ms
    tracker.observe(2, 0.002)  # two microseconds: a sample
    assert dict(tracker.costs().bucket_ms)[8] == 0.002


def test_a_single_source_union_is_that_tree_with_its_flag():
    """A step the head did not grow drafts from the suffix trie alone: same nodes, order and estimates."""
    for tree, flag in ((SUFFIX, SOURCE_SUFFIX), (EAGLE, SOURCE_EAGLE)):
        u = union(tree, None) if flag == SOURCE_EAGLE else union(None, tree)
        assert u.tree.tokens.tolist() == tree.tokens.tolist() and u.tree.parents.tolist() == tree.parents.tolist()
        assert u.tree.probs.tolist() == tree.probs.tolist()
        assert u.source.tolist() == [SOURCE_ROOT] + [flag] * (tree.num_nodes - 1)
    # two children of the root share a token: merged into one node holding the larger estimate
    dup = union(CandidateTree([ROOT_TOKEN, 7, 7, 8], [0, 0, 0, 2], [1.0, 0.2, 0.5, 0.4]), None)
    assert dup.tree.tokens.tolist() == [ROOT_TOKEN, 7, 8] and dup.tree.parents.tolist() == [0, 0, 1]
    assert dup.tree.probs.tolist() == [1.0, 0.5, 0.4]
    one = select(union(EAGLE, SUFFIX), 1)
    assert one.layout.tokens.tolist()[:1] == [ROOT_TOKEN] and one.layout.num_valid == 1
    assert one.probs.tolist() == [1.0] and one.source.tolist() == [SOURCE_ROOT]


def test_an_adaptive_proposer_learns_costs_from_the_time_between_propose_and_accept():
    from mindspore_eagle.draft.hybrid import HybridProposer
    from mindspore_eagle.verify import Acceptance

    now = [0.0]
    prop = HybridProposer(SUFFIX_ADAPTIVE, buckets=COST_BUCKETS, costs=COSTS, clock=lambda: now[0])
    seq = [1, 2, 3, 4] * 6
    prop.begin(seq, np.zeros((len(seq), 0), np.float32), 1)
    for _ in range(3):
        layout = prop.propose(prop.index.tokens[-1])
        now[0] += 0.040  # the engine spent 40 ms verifying
        prop.accept(Acceptance((0,), (2,), 2), np.zeros((1, 0), np.float32))
        seq.append(2)
    assert dict(prop.costs.bucket_ms)[prop.tracker.bucket_of(layout.num_nodes)] == pytest.approx(40.0)
    with pytest.raises(ConfigError, match="window"):
        CostTracker(COSTS, window=0)


def test_a_tree_the_engine_replaced_by_the_root_alone_is_charged_to_the_root_bucket():
    """Near the end of the cache the engine verifies the root alone: the 1-row time must not be learnt as the cost
    of the bucket the proposer asked for (that made large trees look cheap at the end of every long request)."""
    from mindspore_eagle.draft.hybrid import HybridProposer
    from mindspore_eagle.verify import Acceptance

    now = [0.0]
    prop = HybridProposer(SUFFIX_ADAPTIVE, buckets=COST_BUCKETS, costs=COSTS, clock=lambda: now[0])
    seq = [1, 2, 3, 4] * 6
    prop.begin(seq, np.zeros((len(seq), 0), np.float32), 1)
    for _ in range(BASELINE_SAMPLES):  # plain decoding already timed (no root-only probe this step)
        prop.tracker.observe(1, 70.0)
    observed = []
    learn = prop.tracker.observe
    prop.tracker.observe = lambda nodes, ms: (observed.append((nodes, ms)), learn(nodes, ms))
    layout = prop.propose(1)
    assert layout.num_nodes > 1
    now[0] += 0.005  # 5 ms: one row
    prop.accept(Acceptance((0,), (2,), 2, nodes=1), np.zeros((1, 0), np.float32))
    assert observed == [(1, pytest.approx(5.0))]  # charged to the root's bucket, not the proposed tree's
    assert prop.ratio.factor == 1.0  # and the unverified drafts taught the acceptance ratio nothing


class _ClockedHead:
    """Stands in for an Eagle3Proposer on a fake clock: a catch-up costs 10 ms, a growth 3 ms."""

    def __init__(self, clock):
        self.clock, self.extended = clock, []

    def reset(self):
        pass

    def extend(self, tokens, feats):
        self.extended.append(len(tokens))
        self.clock[0] += 0.010

    def candidates(self):
        self.clock[0] += 0.003
        return np.array([-50.0]), np.array([7]), np.array([0])  # one candidate of p ~ 0


def test_a_growth_is_charged_one_steps_share_of_the_deferred_catch_up():
    """Skipped growths defer the head's catch-up; the growth that writes it must not be charged all of it (that
    made growth look dearer the rarer it was, and so rarer still): 4 steps per growth -> 3 + 10 / 4 ms."""
    from mindspore_eagle.draft.hybrid import HybridProposer
    from mindspore_eagle.verify import Acceptance

    clock = [0.0]
    head = _ClockedHead(clock)
    prop = HybridProposer(DraftingConfig(proposer="hybrid", budget="adaptive", max_nodes=8), head,
                          buckets=COST_BUCKETS, costs=COSTS, explore_every=4, clock=lambda: clock[0])
    prop.profile.mean, prop.profile.updates = np.zeros(1), prop.profile.warmup  # a head that never pays
    prop.begin([1, 2, 3], np.zeros((3, 4), np.float32), 4)
    root = 4
    for step in range(8):
        prop.propose(root)
        clock[0] += 0.020  # the engine's verification
        root = 10 + step  # never seen before: no suffix match, nothing accepted but the bonus
        prop.accept(Acceptance((0,), (root,), root), np.zeros((1, 4), np.float32))
    assert [s.grew for s in prop.log] == [False, False, False, True] * 2
    assert head.extended == [3 + 3, 4]  # prompt entries + 3 steps, then 4 steps
    assert prop.tracker.costs().grow_ms == pytest.approx(3 + 10 / 4)


def test_a_growth_the_batch_engine_skips_counts_as_a_step_without_growth():
    """``wants_growth`` then ``skip_growth`` (the batch engine's veto): the step drafts from the suffix alone, the head
    is not extended, and the forced exploration still comes ``explore_every`` steps after the last real growth."""
    from mindspore_eagle.draft.hybrid import HybridProposer
    from mindspore_eagle.verify import Acceptance

    clock = [0.0]
    head = _ClockedHead(clock)
    prop = HybridProposer(DraftingConfig(proposer="hybrid", budget="adaptive", max_nodes=8), head,
                          buckets=COST_BUCKETS, costs=COSTS, explore_every=3, learn_ratio=False, clock=lambda: clock[0])
    # a head whose 0.5 does not pay for its 25 ms growth beside a 70 ms step: only the forced exploration grows it
    prop.profile.mean, prop.profile.updates = np.array([0.5]), prop.profile.warmup
    prop.begin([1, 2, 3], np.zeros((3, 4), np.float32), 4)
    root, wanted = 4, []
    for step in range(6):
        want = prop.wants_growth(root)
        wanted.append(want)
        suffix, estimate = prop.growth_estimate()
        assert estimate.shape == (1,) and 0 < estimate[0] <= 0.5  # the profile, discounted by the suffix's q1
        if want and step < 4:
            prop.skip_growth()
            want = False
        prop.finish(prop.draft_from(root, prop.eagle.candidates() if want else None), 1)
        root = 10 + step
        prop.accept(Acceptance((0,), (root,), root), np.zeros((1, 4), np.float32))
    # steps 2 and 3 are forced explorations, skipped: they count as steps without growth, so step 4 is forced too
    assert wanted == [False, False, True, True, True, False]
    assert [s.grew for s in prop.log] == [False, False, False, False, True, False]
    assert head.extended == []  # the one growth's catch-up was never asked for here (draft_from does not write it)
    with pytest.raises(ConfigError, match="wants_growth said grow=False"):
        prop.wants_growth(root)
        prop.skip_growth()
        prop.draft_from(root, (np.zeros(1), np.zeros(1, np.int64), np.zeros(1, np.int64)))
