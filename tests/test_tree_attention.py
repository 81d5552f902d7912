"""Tree attention equals per-branch causal attention.

A tiny two-layer numpy transformer (RoPE, multi-head attention over a static cache, residual MLP) runs the
tree once with ``tree_attention_mask`` and ``positions``; each root-to-leaf branch is then run on its own,
prefix + branch as a plain causal sequence from a fresh cache. Every tree node's output must equal its
output in any branch through it. Two layers matter: in layer 2 the keys of a node are built from its layer-1
output, so a mask leak anywhere shows up. Stale cache rows hold finite junk, so hidden columns are tested
too. Float64 throughout; MASK_VALUE underflows exp() to exactly 0.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mindspore_eagle.runtime import Buckets
from mindspore_eagle.tree import ForwardInputs, TreeLayout, tree_attention_mask
from mindspore_eagle.tree.mask import MASK_VALUE
from tests.helpers import tree_layouts

VOCAB, EMBED, HEADS, HEAD_DIM, HIDDEN, LAYERS = 64, 16, 2, 8, 32, 2


def make_weights(seed=0):
    rng = np.random.default_rng(seed)

    def w(*shape):
        return rng.normal(0.0, 0.5, shape)

    layers = [
        dict(wq=w(EMBED, HEADS * HEAD_DIM), wk=w(EMBED, HEADS * HEAD_DIM), wv=w(EMBED, HEADS * HEAD_DIM),
             wo=w(HEADS * HEAD_DIM, EMBED), w1=w(EMBED, HIDDEN), w2=w(HIDDEN, EMBED))
        for _ in range(LAYERS)
    ]
    return dict(emb=w(VOCAB, EMBED), layers=layers)


WEIGHTS = make_weights()


def causal_mask(start, n, cache_len):
    """Literal additive causal mask ``[n, cache_len]`` of a chunk written from row ``start``: row t sees columns
    ``<= start + t`` (written here, independent of the code under test)."""
    cols = np.arange(cache_len)[None, :]
    rows = start + np.arange(n)[:, None]
    return np.where(cols <= rows, 0.0, float(MASK_VALUE))


def junk_cache(cache_len, seed):
    """Per-layer K and V ``[cache_len, HEADS, HEAD_DIM]`` full of finite junk (stale rows must stay hidden)."""
    rng = np.random.default_rng(seed)
    return [(rng.normal(0, 3, (cache_len, HEADS, HEAD_DIM)), rng.normal(0, 3, (cache_len, HEADS, HEAD_DIM)))
            for _ in range(LAYERS)]


def rope(x, positions):
    """Rotate-half RoPE on ``x [T, H, Dh]`` at integer ``positions [T]``."""
    half = HEAD_DIM // 2
    angles = positions[:, None] * (10000.0 ** (-np.arange(half) / half))[None, :]  # [T, half]
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def forward(tokens, positions, rows, mask, cache):
    """Write K/V of ``tokens`` at cache ``rows``, attend over the whole cache under additive ``mask [T, C]``."""
    x = WEIGHTS["emb"][np.asarray(tokens, dtype=np.int64)]  # [T, E]
    t = x.shape[0]
    for layer, (k_cache, v_cache) in zip(WEIGHTS["layers"], cache):
        q = rope((x @ layer["wq"]).reshape(t, HEADS, HEAD_DIM), positions)
        k_cache[rows] = rope((x @ layer["wk"]).reshape(t, HEADS, HEAD_DIM), positions)
        v_cache[rows] = (x @ layer["wv"]).reshape(t, HEADS, HEAD_DIM)
        scores = np.einsum("thd,chd->htc", q, k_cache) / np.sqrt(HEAD_DIM) + mask[None]  # [H, T, C]
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        attn = np.einsum("htc,chd->thd", probs, v_cache).reshape(t, HEADS * HEAD_DIM)
        x = x + attn @ layer["wo"]
        x = x + np.tanh(x @ layer["w1"]) @ layer["w2"]
    return x


def run_tree(layout, prefix, cache_len, mask=None, positions=None, tokens=None):
    """Prefill ``prefix`` causally, then run every tree row in one forward; returns ``[N, E]``.

    ``mask``, ``positions`` and ``tokens`` default to the code under test's tree mask and the layout's own; the
    negative controls and the padding test override them.
    """
    p = len(prefix)
    cache = junk_cache(cache_len, seed=1)
    forward(prefix, np.arange(p), np.arange(p), causal_mask(0, p, cache_len), cache)
    if mask is None:
        mask = tree_attention_mask(layout, p, cache_len)[0, 0]
    if positions is None:
        positions = layout.positions(p)
    rows = p + np.arange(layout.num_nodes)
    return forward(layout.tokens if tokens is None else tokens, positions, rows, mask, cache)


def run_branch(tokens, cache_len):
    """Plain causal forward of one sequence from a fresh cache; returns ``[T, E]``."""
    t = len(tokens)
    cache = junk_cache(cache_len, seed=2)
    return forward(tokens, np.arange(t), np.arange(t), causal_mask(0, t, cache_len), cache)


def branches(parents, valid):
    """Root-to-leaf paths of the real nodes, by walking parents (independent of TreeLayout.path_to)."""
    real = [i for i in range(len(parents)) if valid[i]]
    has_child = {int(parents[i]) for i in real if i != 0}
    paths = []
    for leaf in (i for i in real if i not in has_child):
        path = [leaf]
        while path[-1] != 0:
            path.append(int(parents[path[-1]]))
        paths.append(path[::-1])
    return paths


def assert_tree_equals_branches(layout, prefix, cache_len):
    tree_out = run_tree(layout, prefix, cache_len)
    covered = set()
    for path in branches(layout.parents, layout.valid):
        branch_out = run_branch(list(prefix) + [int(layout.tokens[i]) for i in path], cache_len)
        np.testing.assert_allclose(tree_out[path], branch_out[len(prefix):], rtol=0, atol=1e-9)
        covered.update(path)
    assert covered == set(range(layout.num_valid))
    return tree_out


#      0
#     / \
#    1   2
#   / \   \
#  3   4   5
MIXED = TreeLayout.from_parents([3, 14, 15, 9, 26, 5], [0, 0, 0, 1, 1, 2])


@pytest.mark.parametrize("prefix_len", [0, 1, 7])
def test_tree_attention_equals_per_branch_causal_attention_on_a_mixed_tree(prefix_len):
    prefix = list(range(10, 10 + prefix_len))
    assert_tree_equals_branches(MIXED, prefix, cache_len=prefix_len + MIXED.num_nodes + 5)


@pytest.mark.parametrize("fault", ["causal mask over tree rows", "positions by row, not depth"])
def test_the_comparison_detects_a_wrong_mask_or_wrong_positions(fault):
    """Negative controls: the per-branch reference must reject a leaky mask and row-index positions."""
    prefix, cache_len = [1, 2, 3], 16
    if fault == "causal mask over tree rows":
        out = run_tree(MIXED, prefix, cache_len, mask=causal_mask(len(prefix), MIXED.num_nodes, cache_len))
    else:
        out = run_tree(MIXED, prefix, cache_len, positions=len(prefix) + np.arange(MIXED.num_nodes))
    path = [0, 2, 5]
    branch = run_branch(prefix + [int(MIXED.tokens[i]) for i in path], cache_len)
    assert not np.allclose(out[path], branch[len(prefix):], atol=1e-6)


@settings(max_examples=50, deadline=None)
@given(tree_layouts(VOCAB), st.lists(st.integers(0, VOCAB - 1), max_size=8))
def test_tree_attention_equals_per_branch_attention_on_random_trees(layout, prefix):
    assert_tree_equals_branches(layout, prefix, cache_len=len(prefix) + layout.num_nodes + 4)


@settings(max_examples=50, deadline=None)
@given(tree_layouts(VOCAB), st.lists(st.integers(0, VOCAB - 1), max_size=8))
def test_padding_to_a_bucket_does_not_change_any_real_node_output(layout, prefix):
    """The inputs the engine sends (``ForwardInputs.for_tree``: padded tokens, positions, mask) give every real node
    the output it has unpadded."""
    n = layout.num_nodes
    bucket = Buckets((1, 8, 16, 32, 64)).fit(n)
    cache_len = len(prefix) + bucket + 4
    inputs = ForwardInputs.for_tree(layout, len(prefix), bucket, cache_len)
    out = run_tree(layout, prefix, cache_len)
    out_padded = run_tree(layout.padded(bucket), prefix, cache_len, mask=inputs.mask[0, 0],
                          positions=inputs.positions[0], tokens=inputs.ids[0])
    assert np.isfinite(out_padded).all()
    np.testing.assert_allclose(out_padded[:n], out, rtol=0, atol=1e-12)
