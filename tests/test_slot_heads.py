"""``SlotHeads``: one head drafting for several request slots. Each slot's context lives in its own region of the
shared cache, and one batched growth gives every slot the candidates of the EAGLE algorithm recomputed in numpy over
that slot's context alone (``numpy_growth``, the reference of ``test_tree_growth.py``), whatever other slots grow in
the same graph, in which order, and with padding sequences beside them; other slots' rows are never written."""

from __future__ import annotations

import numpy as np
import pytest
from mindspore import Tensor

from mindspore_eagle.draft_config import TreeBudget
from mindspore_eagle.errors import CacheCapacityError, ConfigError
from mindspore_eagle.runtime import Buckets
from mindspore_eagle.serving.slot_heads import SlotHeads, growth_batches
from mindspore_eagle.teacher import setup_mindspore

from tests.helpers import mapped_head, numpy_growth

setup_mindspore()

BUDGET = TreeBudget(max_nodes=12, depth=3, top_k=3)  # depth 3: the next frontier is picked per sequence in graph
SLOTS, SLOT_LEN = 3, 24
LENGTHS = (14, 9, 20)  # each slot's context


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    rows = SlotHeads.cache_rows(SLOTS, SLOT_LEN, BUDGET, 8)
    c, ref, head, embed = mapped_head(tmp_path_factory.mktemp("slot_head"), rows)
    return c, ref, SlotHeads(head, Tensor(embed), BUDGET, SLOTS, SLOT_LEN, Buckets((1, 8))), embed


def fill(c, heads, lengths=LENGTHS):
    """A fresh draft per slot with its own random context; returns the drafts and their (tokens, features)."""
    drafts, contexts = [], []
    for s, n in enumerate(lengths):
        rng = np.random.default_rng(100 + s)
        toks = rng.integers(0, c["vocab_size"], n)
        feats = rng.standard_normal((n, 3 * c["hidden_size"])).astype(np.float32)
        d = heads.slot(s)
        d.reset()
        cut = n // 2  # two calls: an entry chunk written after another, as the engine does
        d.extend(toks[:cut], feats[:cut])
        d.extend(toks[cut:], feats[cut:])
        drafts.append(d)
        contexts.append((toks, feats))
    return drafts, contexts


def test_growth_batches_are_powers_of_two_up_to_the_slots():
    assert growth_batches(1) == (1,)
    assert growth_batches(3) == (1, 2, 4)
    assert growth_batches(8) == (1, 2, 4, 8)


def test_each_slot_grows_the_candidates_of_its_own_context_whatever_grows_beside_it(heads):
    c, ref, sh, embed = heads
    drafts, contexts = fill(c, sh)
    want = [numpy_growth(ref, embed, toks, feats, BUDGET.top_k, BUDGET.depth) for toks, feats in contexts]
    cache = sh.head.cache_parameters()[0][0]
    before = cache.asnumpy().copy()
    # slots 2 and 0 together (batch 2, reversed order), slot 1 alone (batch 1), all three (batch 4: one padding)
    groups = [[drafts[2], drafts[0]], [drafts[1]], drafts]
    for group in groups:
        got = sh.grow(group)
        assert len(got) == len(group)
        for d, (scores, tokens, parents) in zip(group, got):
            want_s, want_t, want_p = want[d.slot]
            np.testing.assert_array_equal(tokens, want_t)
            np.testing.assert_array_equal(parents, want_p)
            np.testing.assert_allclose(scores, want_s, rtol=1e-4, atol=1e-4)
    # the growths wrote only tree rows above each context and scratch rows: every committed row is as it was
    after = cache.asnumpy()
    for d, n in zip(drafts, LENGTHS):
        assert d.committed_len == n and d.state.round_bucket is None
        np.testing.assert_array_equal(after[:, :, d.base:d.base + n], before[:, :, d.base:d.base + n])


def test_a_slot_refuses_to_grow_or_extend_past_its_region(heads):
    c, _, sh, _ = heads
    drafts, _ = fill(c, sh, (SLOT_LEN, 4, 4))
    full = drafts[0]
    rng = np.random.default_rng(5)
    with pytest.raises(CacheCapacityError):  # the slot's entries are bounded by the teacher's slot length
        full.extend([1], rng.standard_normal((1, 3 * c["hidden_size"])).astype(np.float32))
    assert full.committed_len == SLOT_LEN and full.state.round_bucket is None
    got = sh.grow([full, drafts[1]])  # a full slot still grows: its tree rows are part of its region
    assert len(got) == 2
    with pytest.raises(ConfigError, match="twice"):
        sh.grow([drafts[1], drafts[1]])
    with pytest.raises(ConfigError, match=r"\[0, 3\)"):
        sh.slot(3)


def test_a_head_cache_too_small_for_the_slots_is_refused(heads):
    _, _, sh, embed = heads
    with pytest.raises(ConfigError, match="cache_rows"):
        SlotHeads(sh.head, Tensor(embed), BUDGET, SLOTS + 1, SLOT_LEN, sh.buckets)
