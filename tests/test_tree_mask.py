"""Tree attention masks: host builders against literal 0/1 matrices and a naive ancestor walk, and the in-graph
builders (PyNative and compiled) against the host builders, exactly.
"""

import mindspore as ms
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mindspore import Tensor

from mindspore_eagle.errors import CacheCapacityError, ConfigError
from mindspore_eagle.tree import (
    TreeAttentionMaskCell,
    TreeLayout,
    TreeMaskCell,
    ascend_tree_mask,
    check_tree,
    choose_bucket,
    tree_attention_mask,
    tree_attention_mask_prefix,
    tree_block_mask,
    tree_visibility,
)
from mindspore_eagle.tree.mask import MASK_VALUE, causal_mask
from tests.tree_strategies import tree_layouts

VOCAB = 1000
MAX_DEPTH = 12
CACHE_LEN = 96

ms.set_device("CPU")


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


@pytest.fixture(scope="module")
def graph_tree_mask():
    """One compiled TreeMaskCell for the whole module: it compiles once per bucket size."""
    return ms.jit(TreeMaskCell(MAX_DEPTH))


@pytest.fixture(scope="module")
def graph_attention_mask():
    return ms.jit(TreeAttentionMaskCell(MAX_DEPTH, CACHE_LEN))


def to_graph(layout):
    """Device inputs: int32 parents (what a graph would get from the host) and bool valid."""
    return Tensor(layout.parents.astype(np.int32)), Tensor(layout.valid)


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
    np.testing.assert_array_equal(tree_block_mask(layout), expected[None, None])


@pytest.mark.parametrize("name", sorted(LITERAL_VISIBILITY))
def test_in_graph_mask_matches_literal_matrix_in_pynative(name):
    layout, expected = LITERAL_VISIBILITY[name]
    got = TreeMaskCell(3)(*to_graph(layout)).asnumpy()
    np.testing.assert_array_equal(got, np.array(expected, dtype=bool))


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
    np.testing.assert_array_equal(
        tree_attention_mask(CHAIN, committed_len, cache_len), causal_mask(committed_len, 4, cache_len)
    )


def test_prefix_mask_is_the_full_mask_with_no_spare_cache_rows():
    prefix = tree_attention_mask_prefix(MIXED, prefix_len=5)
    assert prefix.shape == (1, 1, 6, 11)
    np.testing.assert_array_equal(prefix, tree_attention_mask(MIXED, 5, 11))
    assert (prefix[..., :5] == 0).all()


def test_tree_that_overflows_the_cache_is_refused():
    with pytest.raises(CacheCapacityError, match="cache_len=10"):
        tree_attention_mask(MIXED, committed_len=5, cache_len=10)
    with pytest.raises(ConfigError, match="committed_len=-1"):
        tree_attention_mask(MIXED, committed_len=-1, cache_len=10)


def test_tree_mask_cell_refuses_a_depth_that_cannot_reach_padding_parents():
    with pytest.raises(ConfigError, match="max_depth=0"):
        TreeMaskCell(0)


# ----- properties ----------------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(tree_layouts(VOCAB))
def test_host_mask_equals_in_graph_mask_equals_naive_walk(graph_tree_mask, layout):
    padded = layout.padded(choose_bucket(layout.num_nodes))
    check_tree(padded, VOCAB, max_depth=MAX_DEPTH)
    for lay in (layout, padded):
        np.testing.assert_array_equal(tree_visibility(lay), naive_visibility(lay.parents, lay.valid))
    np.testing.assert_array_equal(graph_tree_mask(*to_graph(padded)).asnumpy(), tree_visibility(padded))


@settings(max_examples=80, deadline=None)
@given(tree_layouts(VOCAB), st.integers(0, 200))
def test_padding_never_changes_a_real_row_and_is_never_seen(layout, committed_len):
    n = layout.num_nodes
    padded = layout.padded(choose_bucket(n))
    cache_len = committed_len + padded.num_nodes + 3
    vis, vis_p = tree_visibility(layout), tree_visibility(padded)
    np.testing.assert_array_equal(vis_p[:n, :n], vis)
    assert not vis_p[:n, n:].any(), "a real node sees a padding row"
    np.testing.assert_array_equal(vis_p[n:, n:], np.eye(padded.num_nodes - n, dtype=bool))
    full = tree_attention_mask(layout, committed_len, cache_len)
    full_p = tree_attention_mask(padded, committed_len, cache_len)
    np.testing.assert_array_equal(full_p[:, :, :n], full)
    assert (full_p[0, 0] == 0).any(axis=1).all(), "a row sees nothing"


@settings(max_examples=40, deadline=None)
@given(tree_layouts(VOCAB, max_nodes=16), st.data())
def test_in_graph_full_mask_equals_host_full_mask(graph_attention_mask, layout, data):
    padded = layout.padded(choose_bucket(layout.num_nodes))
    committed_len = data.draw(st.integers(0, CACHE_LEN - padded.num_nodes))
    got = graph_attention_mask(*to_graph(padded), Tensor(committed_len, ms.int64)).asnumpy()
    want = tree_attention_mask(padded, committed_len, CACHE_LEN)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    assert not np.signbit(got[got == 0]).any(), "visible entries must be +0.0, not -0.0"


def test_in_graph_ascend_mask_equals_host_ascend_mask():
    cell = ms.jit(TreeAttentionMaskCell(3, 20, ascend=True))
    layout = MIXED.padded(8)
    for committed_len in (0, 5, 12):
        got = cell(*to_graph(layout), Tensor(committed_len, ms.int64)).asnumpy()
        assert got.dtype == np.uint8
        np.testing.assert_array_equal(got, ascend_tree_mask(layout, committed_len, 20))
