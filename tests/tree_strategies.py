"""Hypothesis strategy shared by the tree tests: random valid trees in the dummy-root layout."""

from hypothesis import strategies as st

from mindspore_eagle.tree import TreeLayout


@st.composite
def tree_layouts(draw, vocab, max_nodes=64, max_depth=12):
    """Random real trees: uniform parent choice (bushy) or among the newest nodes (deep, up to max_depth)."""
    n = draw(st.integers(1, max_nodes))
    deep = draw(st.booleans())
    parents, depth = [0], [0]
    for _ in range(1, n):
        eligible = [j for j in range(len(parents)) if depth[j] < max_depth]
        if deep:
            eligible = eligible[-2:]
        p = eligible[draw(st.integers(0, len(eligible) - 1))]
        parents.append(p)
        depth.append(depth[p] + 1)
    tokens = draw(st.lists(st.integers(0, vocab - 1), min_size=n, max_size=n))
    return TreeLayout.from_parents(tokens, parents)
