"""Tree attention masks against literal 0/1 matrices and a naive ancestor walk; the inputs a forward receives
(``ForwardInputs``: the one padding rule) against the rules written out here.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mindspore_eagle.runtime import Buckets
from mindspore_eagle.errors import CacheCapacityError, ConfigError
from mindspore_eagle.tree import (PAD_DEPTH, PAD_TOKEN, ForwardInputs, TreeLayout, ascend_tree_mask, check_tree,
                                  tree_attention_mask, tree_visibility)
from mindspore_eagle.tree.mask import MASK_VALUE
from tests.helpers import tree_layouts

VOCAB = 1000
BUCKETS = Buckets((1, 8, 16, 32, 64))


def naive_visibility(parents, valid):
    """Reference: a real row walks up to the root marking each node; a padding row sees only itself."""
    n = len(parents)
    vis = np.zeros((n, n), dtype=bool)
    for i in range(n):
        if not valid[i]:
            vis[i, i] = True
            continue
        j = i
        while True:
            vis[i, j] = True
            if j == 0:
                break
            j = int(parents[j])
    return vis


# ----- literal matrices -----------------------------------------------------------------------------------

CHAIN = TreeLayout.from_parents([5, 6, 7, 8], [0, 0, 1, 2])
STAR = TreeLayout.from_parents([5, 6, 7, 8], [0, 0, 0, 0])
#      0
#     / \
#    1   2
#   / \   \
#  3   4   5
MIXED = TreeLayout.from_parents([5, 6, 7, 8, 9, 10], [0, 0, 0, 1, 1, 2])

LITERAL_VISIBILITY = {
    "chain": (
        CHAIN,
        [[1, 0, 0, 0],
         [1, 1, 0, 0],
         [1, 1, 1, 0],
         [1, 1, 1, 1]],
    ),
    "star": (
        STAR,
        [[1, 0, 0, 0],
         [1, 1, 0, 0],
         [1, 0, 1, 0],
         [1, 0, 0, 1]],
    ),
    "mixed": (
        MIXED,
        [[1, 0, 0, 0, 0, 0],
         [1, 1, 0, 0, 0, 0],
         [1, 0, 1, 0, 0, 0],
         [1, 1, 0, 1, 0, 0],
         [1, 1, 0, 0, 1, 0],
         [1, 0, 1, 0, 0, 1]],
    ),
    "mixed-padded": (
        MIXED.padded(8),
        [[1, 0, 0, 0, 0, 0, 0, 0],
         [1, 1, 0, 0, 0, 0, 0, 0],
         [1, 0, 1, 0, 0, 0, 0, 0],
         [1, 1, 0, 1, 0, 0, 0, 0],
         [1, 1, 0, 0, 1, 0, 0, 0],
         [1, 0, 1, 0, 0, 1, 0, 0],
         [0, 0, 0, 0, 0, 0, 1, 0],
         [0, 0, 0, 0, 0, 0, 0, 1]],
    ),
}


@pytest.mark.parametrize("name", sorted(LITERAL_VISIBILITY))
def test_tree_visibility_matches_literal_matrix(name):
    layout, expected = LITERAL_VISIBILITY[name]
    expected = np.array(expected, dtype=bool)
    np.testing.assert_array_equal(tree_visibility(layout), expected)


def test_full_mask_of_padded_mixed_tree_matches_literal():
    # committed_len 2, mixed tree (6 real rows) padded to 8, cache 12: the last 2 columns are unused rows.
    vis = np.array(
        [[1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0],
         [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0],
         [1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0],
         [1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0],
         [1, 1, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0],
         [1, 1, 1, 0, 1, 0, 0, 1, 0, 0, 0, 0],
         [1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
         [1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0]],
        dtype=bool,
    )
    layout = MIXED.padded(8)
    additive = tree_attention_mask(layout, committed_len=2, cache_len=12)
    assert additive.shape == (1, 1, 8, 12) and additive.dtype == np.float32
    np.testing.assert_array_equal(additive[0, 0], np.where(vis, 0.0, MASK_VALUE).astype(np.float32))
    ascend = ascend_tree_mask(layout, committed_len=2, cache_len=12)
    assert ascend.dtype == np.uint8
    np.testing.assert_array_equal(ascend[0, 0], (~vis).astype(np.uint8))  # 1 = masked out


@pytest.mark.parametrize("committed_len,cache_len", [(0, 4), (3, 7), (10, 32)])
def test_a_chain_tree_gets_exactly_the_causal_mask(committed_len, cache_len):
    cols, rows = np.arange(cache_len)[None, :], committed_len + np.arange(4)[:, None]
    causal = np.where(cols <= rows, 0.0, MASK_VALUE).astype(np.float32)  # row t sees columns <= L + t
    np.testing.assert_array_equal(tree_attention_mask(CHAIN, committed_len, cache_len)[0, 0], causal)


def test_tree_that_overflows_the_cache_is_refused():
    with pytest.raises(CacheCapacityError, match="cache_len=10"):
        tree_attention_mask(MIXED, committed_len=5, cache_len=10)
    with pytest.raises(ConfigError, match="committed_len=-1"):
        tree_attention_mask(MIXED, committed_len=-1, cache_len=10)


# ----- properties ----------------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(tree_layouts(VOCAB))
def test_host_mask_equals_a_naive_walk(layout):
    padded = layout.padded(BUCKETS.fit(layout.num_nodes))
    check_tree(padded, VOCAB)
    for lay in (layout, padded):
        np.testing.assert_array_equal(tree_visibility(lay), naive_visibility(lay.parents, lay.valid))


@settings(max_examples=80, deadline=None)
@given(tree_layouts(VOCAB), st.integers(0, 200))
def test_padding_never_changes_a_real_row_and_is_never_seen(layout, committed_len):
    n = layout.num_nodes
    padded = layout.padded(BUCKETS.fit(n))
    cache_len = committed_len + padded.num_nodes + 3
    vis, vis_p = tree_visibility(layout), tree_visibility(padded)
    np.testing.assert_array_equal(vis_p[:n, :n], vis)
    assert not vis_p[:n, n:].any(), "a real node sees a padding row"
    np.testing.assert_array_equal(vis_p[n:, n:], np.eye(padded.num_nodes - n, dtype=bool))
    full = tree_attention_mask(layout, committed_len, cache_len)
    full_p = tree_attention_mask(padded, committed_len, cache_len)
    np.testing.assert_array_equal(full_p[:, :, :n], full)
    assert (full_p[0, 0] == 0).any(axis=1).all(), "a row sees nothing"


@settings(max_examples=80, deadline=None)
@given(tree_layouts(VOCAB), st.integers(0, 200), st.integers(0, 2))
def test_forward_inputs_follow_the_one_padding_rule(layout, committed_len, spare):
    """What every forward receives: the real rows as the layout says, then padding rows with token PAD_TOKEN,
    position L + PAD_DEPTH, consecutive cache rows; no real row sees a padding row, and each padding row sees the
    committed prefix and itself only."""
    n = layout.num_nodes
    bucket = BUCKETS.sizes[min(BUCKETS.sizes.index(BUCKETS.fit(n)) + spare, len(BUCKETS.sizes) - 1)]
    cache_len = committed_len + bucket + 3
    inputs = ForwardInputs.for_tree(layout, committed_len, bucket, cache_len)
    assert inputs.bucket == bucket and inputs.num_real == n
    assert inputs.ids.shape == inputs.positions.shape == inputs.rows.shape == (1, bucket)
    np.testing.assert_array_equal(inputs.ids[0, :n], layout.tokens)
    np.testing.assert_array_equal(inputs.positions[0, :n], committed_len + layout.depth)
    assert (inputs.ids[0, n:] == PAD_TOKEN).all() and (inputs.positions[0, n:] == committed_len + PAD_DEPTH).all()
    np.testing.assert_array_equal(inputs.rows[0], committed_len + np.arange(bucket))
    visible = inputs.mask[0, 0] == 0
    np.testing.assert_array_equal(visible[:n], tree_attention_mask(layout, committed_len, cache_len)[0, 0] == 0)
    assert not visible[:n, committed_len + n:].any(), "a real row sees a padding or unused row"
    for r in range(n, bucket):
        want = np.zeros(cache_len, bool)
        want[:committed_len] = True
        want[committed_len + r] = True
        np.testing.assert_array_equal(visible[r], want)
