"""Committing an accepted path: the cache rows afterwards are those a plain causal run over the accepted tokens
writes; LENGTH and PATH_INDEX agree wherever both apply; the in-graph row move reads every source before any
write, works on any list of (k, v) buffers, and never touches a row below the committed length."""

import numpy as np
import pytest
from mindspore import Parameter, Tensor

from mindspore_eagle.cache import BranchableKVCache, CommitMode, PathCommit
from mindspore_eagle.cache.commit import compile_commit
from mindspore_eagle.config import RuntimeConfig
from mindspore_eagle.generate import plan_prefill
from mindspore_eagle.teacher import Teacher, setup_mindspore
from mindspore_eagle.tree import TreeLayout, tree_attention_mask
from mindspore_eagle.tree.mask import causal_mask

RUNTIME = RuntimeConfig(max_cache_len=128, buckets=(1, 8, 16, 32), prefill_chunk=16, exec_mode="performance")
TOL = 1e-5

setup_mindspore()  # before the first kernel runs: the device cannot be chosen afterwards

#        0
#      / | \
#     1  2  .
#     |  | \
#     3  4  5
#     |     |
#     6     7
BRANCHY_PARENTS = [0, 0, 0, 1, 2, 2, 3, 5]


# ----- helpers (also used by test_cache_isolation) --------------------------------------------------------


def make_pairs(shapes, seed=0):
    """Random (k, v) Parameter pairs of the given ``[B, Hkv, max_len, D]`` shapes, and their numpy copies."""
    rng = np.random.default_rng(seed)
    pairs, arrays = [], []
    for n, shape in enumerate(shapes):
        k = rng.standard_normal(shape).astype(np.float32)
        v = rng.standard_normal(shape).astype(np.float32)
        pairs.append((Parameter(Tensor(k.copy()), name=f"k{n}_{seed}", requires_grad=False),
                      Parameter(Tensor(v.copy()), name=f"v{n}_{seed}", requires_grad=False)))
        arrays += [k, v]
    return pairs, arrays


def buffers(pairs):
    """Host copies of every buffer, in order k0, v0, k1, v1, ..."""
    return [p.asnumpy().copy() for pair in pairs for p in pair]


def prefill_committed(teacher, cache, tokens):
    """Write ``tokens`` after the committed prefix as chain rounds, each committed by LENGTH; last output."""
    ids = np.asarray(tokens, np.int64)[None]
    out = None
    for off, size, bucket in plan_prefill(len(tokens), cache.committed_len, teacher):
        L = cache.begin_round(bucket)
        pos = (L + np.arange(size))[None]
        out = teacher.forward(ids[:, off:off + size], pos, pos, causal_mask(L, size, teacher.max_len), bucket)
        cache.commit(np.arange(size), CommitMode.LENGTH)
    return out


def tree_round(teacher, cache, layout, bucket):
    """One speculative round: reserve, then verify the whole tree (padded to ``bucket``) in one forward."""
    L = cache.begin_round(bucket)
    padded = layout.padded(bucket)
    return teacher.forward(padded.tokens[None], padded.positions(L)[None], cache.round_rows(bucket),
                           tree_attention_mask(padded, L, teacher.max_len), bucket)


def decode_logits(teacher, cache, token):
    """Logits of ``token`` fed at row L (an aborted round: nothing is committed)."""
    L = cache.begin_round(1)
    pos = np.array([[L]])
    out = teacher.forward(np.array([[token]]), pos, pos, causal_mask(L, 1, teacher.max_len), 1)
    cache.abort_round()
    return out.logits[0, -1]


def reference_rows_and_logits(teacher, cache, seq, next_token):
    """No speculation: reset, prefill ``seq`` causally, decode ``next_token``. -> (buffers[:len(seq)], logits)."""
    cache.reset()
    prefill_committed(teacher, cache, seq)
    rows = [b[:, :, :len(seq)] for b in buffers(cache.pairs)]
    return rows, decode_logits(teacher, cache, next_token)


def assert_rows_close(got, ref, n):
    if n == 0:
        return
    for i, (g, r) in enumerate(zip(got, ref)):
        err = np.abs(g[:, :, :n] - r[:, :, :n]).max()
        assert err <= TOL * max(1.0, np.abs(r[:, :, :n]).max()), f"buffer {i}: max |diff| {err}"


# ----- fixtures ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rig(hf_tiny):
    _, ms_dir, torch_model = hf_tiny("pangu")
    teacher = Teacher.load(ms_dir, RUNTIME)
    cache = BranchableKVCache.for_teacher(teacher)
    return teacher, cache, torch_model


# ----- the in-graph row move --------------------------------------------------------------------------------


@pytest.mark.parametrize("exec_mode", ["reference", "performance"])
def test_row_move_reads_all_sources_before_any_write(exec_mode):
    # Path [0, 2, 5] at L=10: 12 -> 11 and 15 -> 12. Row 12 is both a source and a destination.
    pairs, before = make_pairs([(1, 2, 32, 4)] * 3)
    fn = compile_commit(PathCommit(pairs), exec_mode)
    src = np.array([[12, 15, 15, 15, 15, 15, 15, 15]], np.int32)  # padded to P=8 by repeating the last move
    dst = np.array([[11, 12, 12, 12, 12, 12, 12, 12]], np.int32)
    fn(Tensor(src), Tensor(dst))
    for got, old in zip(buffers(pairs), before):
        want = old.copy()
        want[:, :, 11], want[:, :, 12] = old[:, :, 12], old[:, :, 15]
        np.testing.assert_array_equal(got, want)
    # A shift by one (every destination is the next move's source): still the old values everywhere.
    before = buffers(pairs)
    src = np.arange(3, 11, dtype=np.int32)[None]
    fn(Tensor(src), Tensor(src - 1))
    for got, old in zip(buffers(pairs), before):
        want = old.copy()
        want[:, :, 2:10] = old[:, :, 3:11]
        np.testing.assert_array_equal(got, want)


def test_row_move_takes_any_pairs_and_per_sequence_rows():
    # Draft-head-like buffers: different head counts and head dims, batch of 2 with different moves.
    pairs, before = make_pairs([(2, 1, 16, 8), (2, 3, 16, 4)], seed=1)
    fn = compile_commit(PathCommit(pairs))
    src = np.array([[5, 7, 7, 7, 7, 7, 7, 7], [9, 4, 3, 3, 3, 3, 3, 3]], np.int32)
    dst = np.array([[4, 5, 5, 5, 5, 5, 5, 5], [3, 9, 4, 4, 4, 4, 4, 4]], np.int32)
    fn(Tensor(src), Tensor(dst))
    for got, old in zip(buffers(pairs), before):
        want = old.copy()
        for b in range(2):
            want[b][:, dst[b]] = old[b][:, src[b]]
        np.testing.assert_array_equal(got, want)


def test_path_index_commit_moves_only_the_new_segment():
    pairs, _ = make_pairs([(1, 2, 64, 4)] * 2, seed=2)
    cache = BranchableKVCache(pairs)
    cache.state.committed_len = 20
    before = buffers(pairs)
    cache.begin_round(8)
    assert cache.commit([0, 2, 5, 7], CommitMode.PATH_INDEX, BRANCHY_PARENTS) == 24
    for got, old in zip(buffers(pairs), before):
        want = old.copy()
        want[:, :, [21, 22, 23]] = old[:, :, [22, 25, 27]]  # root (row 20) already in place
        np.testing.assert_array_equal(got, want)  # bit-identical below 20 and from 24 on


def test_reorder_by_arbitrary_index_map():
    pairs, _ = make_pairs([(2, 2, 16, 4)], seed=3)
    cache = BranchableKVCache(pairs)
    before = buffers(pairs)
    m = np.array([[0, 1, 5, 3, 2, 9], [4, 1, 2, 0, 4, 5]])  # a chain 9 -> 5 -> 2 -> 4; row 0 read and written
    cache.reorder(m)
    for got, old in zip(buffers(pairs), before):
        want = old.copy()
        for b in range(2):
            want[b][:, :6] = old[b][:, m[b]]
        np.testing.assert_array_equal(got, want)
    assert cache.committed_len == 0


def test_identity_moves_leave_buffers_bit_identical():
    """LENGTH moves nothing; PATH_INDEX on a chain path is the identity gather/scatter: same bits."""
    pairs, _ = make_pairs([(1, 2, 32, 4)] * 2, seed=4)
    before = buffers(pairs)
    rows = (10 + np.arange(8, dtype=np.int32))[None]
    compile_commit(PathCommit(pairs))(Tensor(rows), Tensor(rows))
    for got, old in zip(buffers(pairs), before):
        np.testing.assert_array_equal(got, old)


# ----- commits on a real teacher ---------------------------------------------------------------------------


PROMPT = [3, 17, 42, 5, 99, 8, 1, 64, 23]


@pytest.mark.parametrize("parents,node,mode", [
    (BRANCHY_PARENTS, 7, CommitMode.PATH_INDEX),  # path [0, 2, 5, 7]: sources overlap destinations
    (BRANCHY_PARENTS, 6, CommitMode.PATH_INDEX),  # path [0, 1, 3, 6]
    (BRANCHY_PARENTS, 4, CommitMode.PATH_INDEX),  # path [0, 2, 4]
    (BRANCHY_PARENTS, 0, CommitMode.LENGTH),  # root only
    ([0, 0, 1, 2, 3, 0, 5], 4, CommitMode.LENGTH),  # first-child chain [0, 1, 2, 3, 4] inside a tree
    ([0, 0, 1, 2, 3, 0, 5], 6, CommitMode.PATH_INDEX),  # path [0, 5, 6]
])
def test_commit_equals_fresh_causal_run(rig, parents, node, mode):
    teacher, cache, torch_model = rig
    rng = np.random.default_rng(node)
    tokens = [int(t) for t in rng.integers(0, teacher.cfg.vocab_size, len(parents))]
    layout = TreeLayout.from_parents(tokens, parents)
    cache.reset()
    prefill_committed(teacher, cache, PROMPT)
    L = cache.committed_len
    prefix = [b[:, :, :L] for b in buffers(cache.pairs)]
    tree_round(teacher, cache, layout, 8)
    path = layout.path_to(node)[:layout.path_length(node)]
    assert cache.commit(path, mode, layout.parents) == L + len(path)
    for got, old in zip(buffers(cache.pairs), prefix):
        np.testing.assert_array_equal(got[:, :, :L], old)  # the committed prefix is bit-identical
    seq = PROMPT + [tokens[i] for i in path]
    got_rows = buffers(cache.pairs)
    got_logits = decode_logits(teacher, cache, 11)
    ref_rows, ref_logits = reference_rows_and_logits(teacher, cache, seq, 11)
    assert_rows_close(got_rows, ref_rows, len(seq))
    assert np.abs(got_logits - ref_logits).max() <= TOL * max(1.0, np.abs(ref_logits).max())
    import torch

    with torch.no_grad():
        hf = torch_model(torch.tensor([seq + [11]])).logits[0, -1].numpy()
    assert np.abs(got_logits - hf).max() <= 1e-4


def test_length_and_path_index_give_identical_caches(rig):
    """A chain path committed by LENGTH (nothing moves) and by PATH_INDEX forced through the graph
    (identity moves of every path row): bit-identical buffers and the same committed length."""
    teacher, cache, _ = rig
    layout = TreeLayout.from_parents([9, 30, 31, 32, 40, 41], [0, 0, 1, 2, 0, 4])
    cache.reset()
    prefill_committed(teacher, cache, PROMPT)
    tree_round(teacher, cache, layout, 8)
    L = cache.committed_len
    before = buffers(cache.pairs)
    assert cache.commit([0, 1, 2, 3], CommitMode.LENGTH) == L + 4
    by_length = buffers(cache.pairs)
    cache.rollback(L)
    cache.begin_round(8)
    rows = L + np.arange(4)
    cache.move_rows(rows, rows)  # what PATH_INDEX would run for [0, 1, 2, 3] without its shortcut
    assert cache.commit([0, 1, 2, 3], CommitMode.PATH_INDEX) == L + 4
    for a, b, c in zip(before, by_length, buffers(cache.pairs)):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(b, c)
