"""TreeLayout: constructors, derived index tensors, padding and buckets.

References are literal arrays and a naive parent walk written here, not the code under test.
"""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mindspore_eagle.runtime import Buckets
from mindspore_eagle.errors import CacheCapacityError, ConfigError, TreeInvariantError
from mindspore_eagle.tree import PAD_SLOT, ROOT, TreeLayout, check_tree
from tests.helpers import tree_layouts

VOCAB = 1000
BUCKETS = Buckets((1, 8, 16, 32, 64))


def naive_path(parents, node):
    """Root-to-node path by walking parents (independent of ancestor_table)."""
    path = [node]
    while path[-1] != 0:
        path.append(int(parents[path[-1]]))
    return path[::-1]


# ----- constructors ---------------------------------------------------------------------------------------


def test_from_parents_computes_depth_and_marks_all_nodes_real():
    layout = TreeLayout.from_parents([7, 3, 9, 4, 5], [0, 0, 0, 1, 3])
    np.testing.assert_array_equal(layout.depth, [0, 1, 1, 2, 3])
    np.testing.assert_array_equal(layout.valid, [True] * 5)
    assert layout.tokens.dtype == np.int64 and layout.parents.dtype == np.int64
    assert (layout.num_nodes, layout.num_valid, layout.max_depth) == (5, 5, 3)


def test_chain_is_a_path_whose_positions_are_consecutive():
    layout = TreeLayout.chain([4, 8, 6, 1])
    np.testing.assert_array_equal(layout.parents, [0, 0, 1, 2])
    np.testing.assert_array_equal(layout.depth, [0, 1, 2, 3])
    np.testing.assert_array_equal(layout.positions(10), [10, 11, 12, 13])
    assert TreeLayout.chain([5]).num_nodes == 1


@pytest.mark.parametrize("parents,node", [([0, -1], 1), ([0, 0, 2], 2), ([0, 3, 0, 1], 1), ([1, 0], 0)])
def test_from_parents_refuses_parents_outside_topological_order(parents, node):
    with pytest.raises(TreeInvariantError, match=f"node {node}"):
        TreeLayout.from_parents(list(range(len(parents))), parents)


def test_layout_is_immutable_and_owns_its_arrays():
    tokens = np.array([1, 2, 3])
    layout = TreeLayout.from_parents(tokens, [0, 0, 1])
    tokens[0] = 99
    assert layout.tokens[0] == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        layout.tokens = np.zeros(3, np.int64)
    with pytest.raises(ValueError):
        layout.parents[1] = 0


@pytest.mark.parametrize(
    "fields",
    [
        dict(tokens=[1, 2], parents=[0, 0], depth=[0, 1], valid=[True]),
        dict(tokens=[1.0, 2.0], parents=[0, 0], depth=[0, 1], valid=[True, True]),
        dict(tokens=[1, 2], parents=[0, 0], depth=[0, 1], valid=[1, 1]),
        dict(tokens=[[1, 2]], parents=[0, 0], depth=[0, 1], valid=[True, True]),
        dict(tokens=[], parents=[], depth=[], valid=np.zeros(0, bool)),
    ],
    ids=["length", "float-tokens", "int-valid", "2d", "empty"],
)
def test_malformed_fields_are_refused_at_construction(fields):
    with pytest.raises(TreeInvariantError, match="rule: (shape|dtype)"):
        TreeLayout(**fields)


# ----- ancestor table, positions, paths -------------------------------------------------------------------


def test_ancestor_table_of_a_mixed_tree_matches_literal():
    #        0
    #      / | \
    #     1  2  3
    #    / \  \
    #   4   5  6
    #   |
    #   7
    layout = TreeLayout.from_parents([0] * 8, [0, 0, 0, 0, 1, 1, 2, 4])
    expected = np.array(
        [
            [0, 0, 0, 0],
            [0, 1, 0, 0],
            [0, 2, 0, 0],
            [0, 3, 0, 0],
            [0, 1, 4, 0],
            [0, 1, 5, 0],
            [0, 2, 6, 0],
            [0, 1, 4, 7],
        ]
    )
    np.testing.assert_array_equal(layout.ancestor_table(), expected)
    wide = layout.ancestor_table(num_levels=6)
    np.testing.assert_array_equal(wide[:, :4], expected)
    assert (wide[:, 4:] == PAD_SLOT).all()
    with pytest.raises(ConfigError, match="num_levels=3"):
        layout.ancestor_table(num_levels=3)


def test_positions_are_committed_length_plus_depth():
    layout = TreeLayout.from_parents([0] * 5, [0, 0, 0, 1, 3])
    np.testing.assert_array_equal(layout.positions(10), [10, 11, 11, 12, 13])
    np.testing.assert_array_equal(layout.positions(0), [0, 1, 1, 2, 3])
    with pytest.raises(ConfigError):
        layout.positions(-1)


@settings(max_examples=80, deadline=None)
@given(tree_layouts(VOCAB), st.integers(0, 4096), st.integers(0, 40))
def test_no_index_tensor_is_ever_negative_or_out_of_range(layout, committed_len, extra_rows):
    for lay in (layout, layout.padded(layout.num_nodes + extra_rows)):
        n = lay.num_nodes
        table = lay.ancestor_table()
        for arr in (lay.tokens, lay.parents, lay.depth, table, lay.positions(committed_len)):
            assert arr.dtype == np.int64 and (arr >= 0).all()
        assert (lay.parents < n).all() and (table < n).all()
        assert (lay.positions(committed_len) - committed_len <= lay.max_depth).all()


@settings(max_examples=60, deadline=None)
@given(tree_layouts(VOCAB))
def test_ancestor_rows_equal_a_naive_parent_walk(layout):
    table = layout.ancestor_table()
    assert (table[:, 0] == ROOT).all()
    for node in range(layout.num_nodes):
        walk = naive_path(layout.parents, node)
        assert int(layout.depth[node]) + 1 == len(walk)
        np.testing.assert_array_equal(table[node, : len(walk)], walk)
        assert (table[node, len(walk) :] == PAD_SLOT).all()


# ----- padding and buckets --------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(tree_layouts(VOCAB), st.sampled_from([8, 16, 32, 64]), st.integers(0, 100))
def test_padding_keeps_every_real_row_and_appends_inert_rows(layout, bucket_floor, committed_len):
    n = layout.num_nodes
    bucket = max(bucket_floor, BUCKETS.fit(n))
    padded = layout.padded(bucket)
    assert padded.num_nodes == bucket and padded.num_valid == n
    for f in ("tokens", "parents", "depth", "valid"):
        np.testing.assert_array_equal(getattr(padded, f)[:n], getattr(layout, f))
    d = layout.max_depth + 1
    np.testing.assert_array_equal(padded.ancestor_table(num_levels=max(d, 2))[:n, :d], layout.ancestor_table())
    np.testing.assert_array_equal(padded.positions(committed_len)[:n], layout.positions(committed_len))
    assert not padded.valid[n:].any()
    assert (padded.parents[n:] == ROOT).all() and (padded.depth[n:] == 1).all()
    check_tree(padded, VOCAB)


def test_padding_to_the_current_size_is_a_no_op_and_to_a_smaller_size_fails():
    layout = TreeLayout.from_parents([1, 2, 3], [0, 0, 1])
    assert layout.padded(3) is layout
    with pytest.raises(ConfigError, match="bucket=2"):
        layout.padded(2)


@pytest.mark.parametrize("n,bucket", [(1, 1), (2, 8), (8, 8), (9, 16), (16, 16), (17, 32), (33, 64), (64, 64)])
def test_the_bucket_of_n_rows_is_the_smallest_that_holds_them(n, bucket):
    assert BUCKETS.fit(n) == bucket


def test_no_bucket_holds_more_rows_than_the_largest():
    with pytest.raises(ConfigError, match="65 rows exceed the largest bucket 64"):
        BUCKETS.fit(65)
    assert Buckets((128, 80, 1)).fit(65) == 80


@pytest.mark.parametrize("sizes,match", [((8, 16), "must contain 1"), ((), "positive integers"),
                                         ((1, 0), "positive integers"), ((1, 2.5), "positive integers")])
def test_bad_bucket_sizes_are_refused(sizes, match):
    with pytest.raises(ConfigError, match=match):
        Buckets(sizes)


@pytest.mark.parametrize("rows,room,want", [
    (70, 1000, [(64, 64), (6, 8)]),
    (70, 70, [(64, 64)] + [(1, 1)] * 6),
    (5, 5, [(1, 1)] * 5),
    (8, 8, [(8, 8)]),
])
def test_chunks_cover_every_row_within_the_room(rows, room, want):
    got = BUCKETS.chunks(rows, 64, room)
    assert got == want
    assert sum(size for size, _ in got) == rows
    used = 0
    for size, bucket in got:  # each padded chunk fits the rows left when it is written
        assert bucket <= room - used
        used += size


def test_chunks_refuse_rows_beyond_the_room():
    with pytest.raises(CacheCapacityError, match="9 rows do not fit: 8 cache rows left"):
        BUCKETS.chunks(9, 64, 8)
