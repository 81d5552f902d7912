"""The suffix index finds what a naive scan finds, incrementally: earlier occurrences of the sequence's
suffixes (longest first, most recent first), their continuations merged into a trie, and the scores read
from the calibration table. The index tests run on both implementations (the Python reference and the kernel
library's ``NativeSuffixIndex``), and the native proposals equal the reference's bit for bit."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mindspore_eagle.draft.calibration import (ROLE_LEADER, ROLE_ONLY, ROLE_OTHER, ROLE_TIED, ROLES, NodeFeatures,
                                               SuffixCalibration, default_calibration, fit_calibration,
                                               node_features)
from mindspore_eagle.draft import native_suffix
from mindspore_eagle.draft.native_suffix import NativeSuffixIndex, new_suffix_index
from mindspore_eagle.draft.online_calibration import OnlineCalibration
from mindspore_eagle.draft.suffix import (MAX_TOKEN_ID, Match, SuffixConfig, SuffixIndex, continuation_trie,
                                          score_trie, suffix_candidates, suffix_proposal)
from mindspore_eagle.errors import ConfigError


# ----- naive references -------------------------------------------------------------------------------------


def naive_matches(seq, max_match, max_occ, min_match=1):
    """Scan every length from the longest down and every earlier end position from the most recent."""
    n = len(seq)
    out, seen = [], set()
    for d in range(min(max_match, n), min_match - 1, -1):
        for end in range(n - 2, d - 2, -1):  # occurrence seq[end-d+1 .. end], end < n - 1
            if seq[end - d + 1:end + 1] == seq[n - d:] and end + 1 not in seen and len(out) < max_occ:
                seen.add(end + 1)
                out.append(Match(end + 1, d))
        if len(out) >= max_occ:
            break
    return out


def naive_count(seq, pattern):
    m = len(pattern)
    return sum(seq[i:i + m] == list(pattern) for i in range(len(seq) - m + 1))


def naive_continuations(seq, matches, depth):
    """Each match's continuation, periodically extended past the end of seq."""
    n, out = len(seq), []
    for mt in matches:
        cont = []
        for k in range(depth):
            cont.append(seq[mt.start + k] if mt.start + k < n else cont[k - (n - mt.start)])
        out.append((cont, mt.length))
    return out


sequences = st.lists(st.integers(0, 2), min_size=1, max_size=60)
INDEXES = pytest.mark.parametrize("index_cls", [SuffixIndex, NativeSuffixIndex], ids=["python", "native"])


@INDEXES
@settings(max_examples=150, deadline=None)
@given(seq=sequences, max_match=st.integers(1, 6), max_occ=st.integers(1, 6), min_match=st.integers(1, 3))
def test_matches_equal_a_naive_scan_at_every_prefix(index_cls, seq, max_match, max_occ, min_match):
    index = index_cls(max_match)
    for i, t in enumerate(seq):
        index.extend([t])
        prefix = seq[:i + 1]
        want = naive_matches(prefix, max_match, max_occ, min(min_match, max_match))
        assert index.matches(max_occ, min(min_match, max_match)) == want
        longest = max((m.length for m in naive_matches(prefix, max_match, 1)), default=0)
        assert index.longest_match() == longest
        # the gain guard's O(1) wake-up check: the last `length` tokens occurred earlier
        assert [index.match_at_least(d) for d in range(1, max_match + 1)] == [longest >= d
                                                                             for d in range(1, max_match + 1)]


@INDEXES
@settings(max_examples=100, deadline=None)
@given(seq=sequences, max_match=st.integers(1, 5), cuts=st.lists(st.integers(0, 60), max_size=6),
       pattern=st.lists(st.integers(0, 2), min_size=1, max_size=5))
def test_incremental_extension_equals_a_rebuild(index_cls, seq, max_match, cuts, pattern):
    whole = index_cls(max_match)
    whole.extend(seq)
    chunked = index_cls(max_match)
    bounds = sorted({0, len(seq), *[c for c in cuts if c <= len(seq)]})
    for a, b in zip(bounds, bounds[1:]):
        chunked.extend(np.asarray(seq[a:b], np.int64))  # numpy input too
    assert list(chunked.tokens) == list(whole.tokens) == seq
    assert chunked.num_nodes == whole.num_nodes
    assert chunked.matches(8) == whole.matches(8)
    if len(pattern) <= max_match:
        assert chunked.count(pattern) == whole.count(pattern) == naive_count(seq, pattern)
    chunked.reset()
    chunked.extend(seq)
    assert chunked.matches(8) == whole.matches(8) and chunked.num_nodes == whole.num_nodes


@settings(max_examples=150, deadline=None)
@given(seq=sequences, max_occ=st.integers(1, 5), depth=st.integers(1, 8))
def test_continuation_trie_holds_every_continuation_prefix_once_with_its_count(seq, max_occ, depth):
    index = SuffixIndex(4)
    index.extend(seq)
    matches = index.matches(max_occ)
    trie = continuation_trie(index.tokens, matches, depth)
    conts = naive_continuations(seq, matches, depth)
    paths = {}
    for i in range(1, trie.num_nodes):
        p = int(trie.parents[i])
        assert 0 <= p < i and trie.depth[i] == trie.depth[p] + 1
        path = paths.get(p, ()) + (int(trie.tokens[i]),)
        assert path not in paths.values(), "a prefix appears twice"
        paths[i] = path
        through = [m for c, m in conts if tuple(c[:len(path)]) == path]
        assert trie.count[i] == len(through)
        assert trie.match[i] == max(through)
    want = {tuple(c[:k]) for c, _ in conts for k in range(1, depth + 1)}
    assert set(paths.values()) == want
    assert trie.tokens[0] == seq[-1] and trie.count[0] == len(matches)


def test_a_loop_is_continued_periodically():
    # The longest earlier match of 9 4 5 6 4 5 6 4 5 is "4 5 6 4 5" ending at index 5, so its continuation
    # starts at 6: T[6:9] = 6 4 5, then past the end it repeats with period n - 6 = 3.
    seq = [9, 4, 5, 6, 4, 5, 6, 4, 5]
    index = SuffixIndex(8)
    index.extend(seq)
    assert index.matches(1) == [Match(6, 5)]
    trie = continuation_trie(seq, index.matches(1), 7)
    assert trie.tokens.tolist() == [5, 6, 4, 5, 6, 4, 5, 6]
    assert trie.periodic.tolist() == [False, False, False, False, True, True, True, True]


@INDEXES
def test_match_at_least_refuses_a_length_the_index_does_not_hold(index_cls):
    index = index_cls(4)
    index.extend([1, 2, 1, 2])
    assert index.match_at_least(2) and not index.match_at_least(3)
    for bad in (0, 5):
        with pytest.raises(ConfigError, match="match_at_least"):
            index.match_at_least(bad)


@INDEXES
def test_extend_refuses_ids_out_of_range_before_appending_and_configs_name_the_field(index_cls):
    index = index_cls(3)
    index.extend([4, 5])
    for bad in (-2, MAX_TOKEN_ID + 1):
        with pytest.raises(ConfigError, match=f"token id {bad} is outside"):
            index.extend([1, bad])
    assert list(index.tokens) == [4, 5] and index.count([4, 5]) == 1  # nothing of a refused call was appended
    index.extend([MAX_TOKEN_ID])
    assert index.count([MAX_TOKEN_ID]) == 1 and index.count([MAX_TOKEN_ID + 1]) == 0
    with pytest.raises(ConfigError, match="max_match"):
        index_cls(0)
    with pytest.raises(ConfigError, match="SuffixConfig.max_depth"):
        SuffixConfig(max_depth=0)
    with pytest.raises(ConfigError, match="min_match"):
        SuffixConfig(max_match=2, min_match=3)
    with pytest.raises(ConfigError, match="index is empty"):
        suffix_candidates(index_cls(2), SuffixConfig(), default_calibration())


# ----- the native index proposes what the reference proposes --------------------------------------------------


def assert_same_proposal(reference, native, cfg, calibration):
    (ta, fa), (tb, fb) = suffix_proposal(reference, cfg, calibration), suffix_proposal(native, cfg, calibration)
    for name, a, b in (("tokens", ta.tokens, tb.tokens), ("parents", ta.parents, tb.parents),
                       ("m_eff", fa.m_eff, fb.m_eff), ("role", fa.role, fb.role), ("count", fa.count, fb.count)):
        assert a.tolist() == b.tolist(), name
    assert ta.probs.tobytes() == tb.probs.tobytes(), "probabilities differ in their bits"


def learnt_calibration(seed):
    """An ``OnlineCalibration`` whose per-bucket ratios moved away from 1 (as after some observed steps)."""
    cal = OnlineCalibration(default_calibration())
    rng = np.random.default_rng(seed)
    cal.hits = cal.hits + rng.random(cal.hits.shape) * 6
    return cal


@settings(max_examples=120, deadline=None)
@given(seq=st.lists(st.integers(0, 5), min_size=1, max_size=120), period=st.integers(0, 7),
       max_match=st.integers(1, 18), max_occ=st.integers(1, 9), depth=st.integers(1, 36), min_match=st.integers(1, 4),
       max_candidates=st.integers(1, 70), steps=st.lists(st.integers(1, 4), min_size=1, max_size=30),
       online=st.booleans())
def test_native_proposals_equal_the_reference_bit_for_bit(seq, period, max_match, max_occ, depth, min_match,
                                                           max_candidates, steps, online):
    if period:  # a loop, as a small greedy model falls into: the periodic continuations and the deepest tries
        seq = (seq[:period] * (len(seq) // period + 1))[:len(seq)]
    cfg = SuffixConfig(max_match=max_match, max_occurrences=max_occ, max_depth=depth,
                       min_match=min(min_match, max_match), max_candidates=max_candidates)
    calibration = learnt_calibration(len(seq)) if online else default_calibration()
    reference, native = SuffixIndex(max_match), NativeSuffixIndex(max_match)
    pos = 0
    for step in steps * (len(seq) // sum(steps) + 1):
        if pos >= len(seq):
            break
        reference.extend(seq[pos:pos + step])
        native.extend(seq[pos:pos + step])
        pos += step
        assert native.num_nodes == reference.num_nodes
        assert_same_proposal(reference, native, cfg, calibration)


def test_native_proposals_equal_the_reference_on_the_evaluation_trace():
    """Real conversations: eight turns of the committed 240-turn trace (prompt, then the greedy output three tokens
    a step, as a speculative step commits), the default settings and shipped table."""
    from scripts.replay_suffix import load_turns

    turns = load_turns("results/eval-default/merged.jsonl.gz")
    cfg, calibration = SuffixConfig(), default_calibration()
    for turn in turns[::30]:
        reference, native = SuffixIndex(cfg.max_match), NativeSuffixIndex(cfg.max_match)
        reference.extend(turn.prompt)
        native.extend(turn.prompt)
        for i in range(0, len(turn.output), 3):
            assert_same_proposal(reference, native, cfg, calibration)
            reference.extend(turn.output[i:i + 3])
            native.extend(turn.output[i:i + 3])
        assert native.longest_match() == reference.longest_match()


def test_proposers_draft_with_the_native_index_where_the_library_loads(monkeypatch):
    assert isinstance(new_suffix_index(16), NativeSuffixIndex)
    monkeypatch.setattr(native_suffix, "_library", lambda: None)  # no kernel library: the Python reference
    assert type(new_suffix_index(16)) is SuffixIndex
    with pytest.raises(ConfigError, match="kernel library is unavailable"):
        NativeSuffixIndex(16)


# ----- features, scores, calibration ----------------------------------------------------------------------


def literal_trie():
    """seq with three earlier occurrences of the suffix (1, 2): continuations [3, 4], [3, 4] and [7, 8];
    the two [3 ..] ones match 3 tokens (0 1 2), the [7 ..] one 2 tokens."""
    seq = [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 6, 9, 1, 2, 7, 8, 0, 1, 2]
    index = SuffixIndex(3)
    index.extend(seq)
    return seq, index, continuation_trie(seq, index.matches(8), 2)


def test_literal_trie_and_its_features():
    seq, index, trie = literal_trie()
    assert index.matches(8) == [Match(9, 3), Match(3, 3), Match(15, 2)]
    assert trie.tokens.tolist() == [2, 3, 4, 7, 8]
    assert trie.parents.tolist() == [0, 0, 1, 0, 3]
    assert trie.count.tolist() == [3, 2, 2, 1, 1]
    assert trie.match.tolist() == [0, 3, 3, 2, 2]
    f = node_features(trie)
    assert f.m_eff.tolist()[1:] == [3, 4, 2, 3]
    assert f.role.tolist()[1:] == [ROLE_LEADER, ROLE_ONLY, ROLE_OTHER, ROLE_ONLY]


def test_tied_siblings_get_the_tied_role():
    seq = [5, 1, 3, 5, 1, 4, 5, 1]  # (5, 1) occurred twice before, continuing with 3 and 4: both match 2
    index = SuffixIndex(2)
    index.extend(seq)
    f = node_features(continuation_trie(seq, index.matches(4, min_match=2), 1))
    assert f.role.tolist()[1:] == [ROLE_TIED, ROLE_TIED]


def table_calibration(values):
    """A calibration whose q depends on the role only (one m_eff and one count bucket)."""
    return SuffixCalibration((1,), (1,), [[[values[r]] for r in range(len(ROLES))]])


def test_scores_are_products_of_conditionals_with_siblings_capped_to_sum_one():
    _, _, trie = literal_trie()
    cal = table_calibration({ROLE_ONLY: 0.9, ROLE_LEADER: 0.6, ROLE_TIED: 0.5, ROLE_OTHER: 0.3})
    p = score_trie(trie, cal)
    np.testing.assert_allclose(p, [1, 0.6, 0.6 * 0.9, 0.3, 0.3 * 0.9])
    greedy = table_calibration({ROLE_ONLY: 1.0, ROLE_LEADER: 0.9, ROLE_TIED: 0.5, ROLE_OTHER: 0.6})
    p = score_trie(trie, greedy)  # 0.9 + 0.6 > 1: both scaled by 1 / 1.5
    np.testing.assert_allclose(p, [1, 0.6, 0.6, 0.4, 0.4])


def test_candidates_keep_the_most_probable_nodes_ancestor_closed():
    seq, index, _ = literal_trie()
    cal = table_calibration({ROLE_ONLY: 0.9, ROLE_LEADER: 0.6, ROLE_TIED: 0.5, ROLE_OTHER: 0.3})
    full = suffix_candidates(index, SuffixConfig(max_match=3, max_depth=2), cal)
    assert full.tokens.tolist() == [2, 3, 4, 7, 8]
    cut = suffix_candidates(index, SuffixConfig(max_match=3, max_depth=2, max_candidates=3), cal)
    assert cut.tokens.tolist() == [2, 3, 4] and cut.parents.tolist() == [0, 0, 1]
    np.testing.assert_allclose(cut.probs, [1, 0.6, 0.54])
    none = SuffixIndex(3)
    none.extend([1, 2, 3])
    assert suffix_candidates(none, SuffixConfig(), cal).num_nodes == 1


def test_fit_recovers_the_rates_of_synthetic_labels():
    rng = np.random.default_rng(0)
    n = 40000
    m_eff = rng.integers(1, 30, n)
    role = rng.integers(0, 4, n)
    count = rng.integers(1, 5, n)
    rate = np.where(m_eff >= 8, 0.9, 0.3) * np.where(role == ROLE_OTHER, 0.2, 1.0)
    acc = rng.random(n) < rate
    cal = fit_calibration(NodeFeatures(m_eff, role, count), acc, (1, 8), (1, 3), prior=5.0)
    table = np.asarray(cal.table)
    np.testing.assert_allclose(table[0, ROLE_ONLY], 0.3, atol=0.03)
    np.testing.assert_allclose(table[1, ROLE_LEADER], 0.9, atol=0.03)
    np.testing.assert_allclose(table[1, ROLE_OTHER], 0.18, atol=0.03)
    np.testing.assert_allclose(cal.q(NodeFeatures(np.array([2, 9]), np.array([0, 3]), np.array([1, 4]))),
                               [table[0, 0, 0], table[1, 3, 1]])


def test_a_sparse_cell_reads_its_neighbourhood():
    # One accepted sample in a cell is no evidence of q = 1: it shrinks towards the coarser rates.
    m_eff = np.array([1] * 200 + [10])
    role = np.array([0] * 200 + [1])
    cal = fit_calibration(NodeFeatures(m_eff, role, np.ones(201, np.int64)), np.r_[np.zeros(200), 1.0], (1, 8), (1,))
    assert 0 < cal.table[1][1][0] < 0.2


def test_calibration_round_trips_and_bad_tables_are_refused(tmp_path):
    cal = default_calibration()
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cal.to_dict()))
    again = SuffixCalibration.load(str(path))
    assert again.table == cal.table and again.match_edges == cal.match_edges and "fit" in cal.source
    with pytest.raises(ConfigError, match="shape"):
        SuffixCalibration((1, 4), (1,), [[[0.5]] * 4])
    with pytest.raises(ConfigError, match="increasing"):
        SuffixCalibration((2,), (1,), [[[0.5]] * 4])
    with pytest.raises(ConfigError, match="probability"):
        SuffixCalibration((1,), (1,), [[[1.5], [0.5], [0.5], [0.5]]])
    path.write_text("{")
    with pytest.raises(ConfigError, match="suffix calibration"):
        SuffixCalibration.load(str(path))
