"""check_tree: valid trees pass; every corruption in the catalogue raises TreeInvariantError naming the node and
the rule; random single-field corruptions are caught exactly when an independent rule-by-rule spec says so.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mindspore_eagle.errors import ConfigError, TreeInvariantError
from mindspore_eagle.runtime import Buckets
from mindspore_eagle.tree import TreeLayout, check_tree
from tests.helpers import tree_layouts

BUCKETS = Buckets((1, 8, 16, 32, 64))
VOCAB = 100


def spec_is_valid(tokens, parents, depth, valid, vocab_size):
    """Independent statement of the layout rules, one node at a time (no numpy vectorisation)."""
    n = len(parents)
    if not (valid[0] and parents[0] == 0 and depth[0] == 0):
        return False
    seen_padding = False
    for i in range(n):
        if not 0 <= tokens[i] < vocab_size:
            return False
        if i == 0:
            continue
        if not 0 <= parents[i] < i:
            return False
        if valid[i]:
            if seen_padding or not valid[parents[i]] or depth[i] != depth[parents[i]] + 1:
                return False
        else:
            seen_padding = True
            if parents[i] != 0 or depth[i] != 1:
                return False
    return True


def corrupt(layout, **changes):
    """Copy of ``layout`` with ``field=(index, value)`` entries overwritten (bypasses every constructor check)."""
    fields = {f: np.array(getattr(layout, f)) for f in ("tokens", "parents", "depth", "valid")}
    for field, (index, value) in changes.items():
        fields[field][index] = value
    return TreeLayout(**fields)


#      0
#     / \
#    1   2
#   / \   \
#  3   4   5     + padding rows 6, 7
BASE = TreeLayout.from_parents([5, 6, 7, 8, 9, 10], [0, 0, 0, 1, 1, 2]).padded(8)

CATALOGUE = {
    # name: (corrupted layout, node named in the message, rule named in the message)
    "negative parent": (corrupt(BASE, parents=(3, -1)), 3, "no negative index"),
    "parent past the end": (corrupt(BASE, parents=(4, 8)), 4, "index range"),
    "parent >= own index": (corrupt(BASE, parents=(2, 4)), 2, "topological order"),
    "self-loop": (corrupt(BASE, parents=(3, 3)), 3, "no self-loop"),
    "cycle": (corrupt(BASE, parents=(1, 3)), 1, "no cycles"),
    "orphan under an invalid node": (corrupt(BASE, valid=(2, False)), 5, "closure"),
    "wrong depth": (corrupt(BASE, depth=(4, 3)), 4, "depth consistency"),
    "negative depth": (corrupt(BASE, depth=(5, -2)), 5, "depth consistency"),
    "token out of vocab": (corrupt(BASE, tokens=(2, VOCAB)), 2, "token range"),
    "negative token": (corrupt(BASE, tokens=(5, -3)), 5, "token range"),
    "root not its own parent": (corrupt(BASE, parents=(0, 1)), 0, "root is its own parent"),
    "root marked invalid": (corrupt(BASE, valid=(0, False)), 0, "root is a real node"),
    "root at depth 1": (corrupt(BASE, depth=(0, 1)), 0, "root depth"),
    "padding under a real node": (corrupt(BASE, parents=(7, 3)), 7, "padding inert"),
    "padding at the wrong depth": (corrupt(BASE, depth=(6, 2)), 6, "padding inert"),
    "real node after padding": (corrupt(BASE, valid=(7, True)), 7, "padding rows come last"),
    "padding token out of vocab": (corrupt(BASE, tokens=(6, -1)), 6, "token range"),
}


def test_base_tree_of_the_catalogue_is_valid():
    check_tree(BASE, VOCAB)


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_each_catalogued_corruption_raises_naming_node_and_rule(name):
    layout, node, rule = CATALOGUE[name]
    assert not spec_is_valid(layout.tokens, layout.parents, layout.depth, layout.valid, VOCAB)
    with pytest.raises(TreeInvariantError) as info:
        check_tree(layout, VOCAB)
    message = str(info.value)
    assert message.startswith(f"node {node}:"), message
    assert rule in message, message


@pytest.mark.parametrize("field,value", [("valid", False), ("parents", 1), ("parents", -1), ("depth", 1),
                                         ("tokens", -1), ("tokens", VOCAB)])
def test_a_root_alone_is_held_to_the_same_rules(field, value):
    # one-node layouts (a batch step has one per decoding request) take check_tree's scalar path
    root = TreeLayout.single(7)
    check_tree(root, VOCAB)
    bad = corrupt(root, **{field: (0, value)})
    assert not spec_is_valid(bad.tokens, bad.parents, bad.depth, bad.valid, VOCAB)
    with pytest.raises(TreeInvariantError, match="node 0"):
        check_tree(bad, VOCAB)


def test_cycle_message_spells_out_the_cycle():
    with pytest.raises(TreeInvariantError, match=r"cycle 1 -> 3 -> 1"):
        check_tree(CATALOGUE["cycle"][0], VOCAB)


def test_a_vocab_size_below_one_is_a_config_error():
    with pytest.raises(ConfigError, match="vocab_size=0"):
        check_tree(BASE, 0)


@settings(max_examples=60, deadline=None)
@given(tree_layouts(VOCAB), st.booleans())
def test_every_well_formed_tree_passes(layout, pad):
    if pad:
        layout = layout.padded(BUCKETS.fit(layout.num_nodes))
    check_tree(layout, VOCAB)


FIELD_VALUES = {
    "tokens": st.one_of(st.integers(-3, -1), st.integers(0, VOCAB - 1), st.integers(VOCAB, VOCAB + 3)),
    "parents": st.one_of(st.integers(-3, -1), st.integers(0, 31), st.integers(32, 70)),
    "depth": st.integers(-2, 14),
    "valid": st.booleans(),
}


@settings(max_examples=100, deadline=None)
@given(tree_layouts(VOCAB, max_nodes=24), st.booleans(), st.data())
def test_no_single_field_corruption_passes_silently(layout, pad, data):
    if pad:
        layout = layout.padded(BUCKETS.fit(layout.num_nodes))
    field = data.draw(st.sampled_from(sorted(FIELD_VALUES)))
    index = data.draw(st.integers(0, layout.num_nodes - 1))
    value = data.draw(FIELD_VALUES[field])
    mutated = corrupt(layout, **{field: (index, value)})
    if spec_is_valid(mutated.tokens, mutated.parents, mutated.depth, mutated.valid, VOCAB):
        check_tree(mutated, VOCAB)
    else:
        with pytest.raises(TreeInvariantError, match=r"^node \d+: .*\(rule: "):
            check_tree(mutated, VOCAB)
