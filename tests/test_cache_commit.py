"""Committing an accepted path: the cache rows afterwards are those a plain causal run over the accepted tokens
writes; only the out-of-place rows of the path move (a chain moves nothing); the in-graph row move reads every
source before any write, works on any list of (k, v) buffers, and never touches a row below the committed
length."""

import numpy as np
import pytest
from mindspore import Tensor

from mindspore_eagle.cache import BranchableKVCache, PathCommit
from mindspore_eagle.runtime import ExecMode
from mindspore_eagle.teacher import Teacher, setup_mindspore
from mindspore_eagle.tree import TreeLayout
from tests.helpers import (BRANCHY_PARENTS, CACHE_RUNTIME, TOL, assert_rows_close, buffers, decode_logits, make_pairs,
                           path_to, prefill_committed, reference_rows_and_logits, tree_round)

setup_mindspore()  # before the first kernel runs: the device cannot be chosen afterwards


@pytest.fixture(scope="module")
def rig(hf_tiny):
    _, ms_dir, torch_model = hf_tiny("pangu")
    teacher = Teacher.load(ms_dir, CACHE_RUNTIME)
    cache = BranchableKVCache.for_teacher(teacher)
    return teacher, cache, torch_model


# ----- the in-graph row move --------------------------------------------------------------------------------


@pytest.mark.parametrize("exec_mode", ["reference", "performance"])
def test_row_move_reads_all_sources_before_any_write(exec_mode):
    # Path [0, 2, 5] at L=10: 12 -> 11 and 15 -> 12. Row 12 is both a source and a destination.
    pairs, before = make_pairs([(1, 2, 32, 4)] * 3)
    fn = ExecMode.parse(exec_mode).compile(PathCommit(pairs))
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
    fn = ExecMode.PERFORMANCE.compile(PathCommit(pairs))
    src = np.array([[5, 7, 7, 7, 7, 7, 7, 7], [9, 4, 3, 3, 3, 3, 3, 3]], np.int32)
    dst = np.array([[4, 5, 5, 5, 5, 5, 5, 5], [3, 9, 4, 4, 4, 4, 4, 4]], np.int32)
    fn(Tensor(src), Tensor(dst))
    for got, old in zip(buffers(pairs), before):
        want = old.copy()
        for b in range(2):
            want[b][:, dst[b]] = old[b][:, src[b]]
        np.testing.assert_array_equal(got, want)


def test_commit_moves_only_the_out_of_place_rows():
    pairs, _ = make_pairs([(1, 2, 64, 4)] * 2, seed=2)
    cache = BranchableKVCache(pairs)
    cache.state.committed_len = 20
    before = buffers(pairs)
    cache.begin_round(8)
    assert cache.commit([0, 2, 5, 7], BRANCHY_PARENTS) == 24
    for got, old in zip(buffers(pairs), before):
        want = old.copy()
        want[:, :, [21, 22, 23]] = old[:, :, [22, 25, 27]]  # root (row 20) already in place
        np.testing.assert_array_equal(got, want)  # bit-identical below 20 and from 24 on


def test_chain_commit_runs_no_move_and_a_branch_commit_runs_one():
    """A chain path is already in place: committing it advances the length without calling the row-move graph
    (bit-identical buffers); an off-chain path calls it exactly once."""
    pairs, _ = make_pairs([(1, 2, 32, 4)] * 2, seed=4)
    cache = BranchableKVCache(pairs)
    calls = []
    graph = cache._fn
    cache._fn = lambda s, d: calls.append((s.asnumpy(), d.asnumpy())) or graph(s, d)
    before = buffers(pairs)
    cache.begin_round(8)
    assert cache.commit([0, 1, 2, 3]) == 4
    assert calls == []
    for got, old in zip(buffers(pairs), before):
        np.testing.assert_array_equal(got, old)
    cache.begin_round(8)
    assert cache.commit([0, 2], [0, 0, 0]) == 6
    assert len(calls) == 1
    src, dst = calls[0]
    assert src.shape == (1, 8) and set(src[0]) == {6} and set(dst[0]) == {5}  # one move, padded to the bucket


# ----- commits on a real teacher ---------------------------------------------------------------------------


PROMPT = [3, 17, 42, 5, 99, 8, 1, 64, 23]


@pytest.mark.parametrize("parents,node", [
    (BRANCHY_PARENTS, 7),  # path [0, 2, 5, 7]: sources overlap destinations
    (BRANCHY_PARENTS, 6),  # path [0, 1, 3, 6]
    (BRANCHY_PARENTS, 4),  # path [0, 2, 4]
    (BRANCHY_PARENTS, 0),  # root only
    ([0, 0, 1, 2, 3, 0, 5], 4),  # first-child chain [0, 1, 2, 3, 4] inside a tree: nothing moves
    ([0, 0, 1, 2, 3, 0, 5], 6),  # path [0, 5, 6]
])
def test_commit_equals_fresh_causal_run(rig, parents, node):
    teacher, cache, torch_model = rig
    rng = np.random.default_rng(node)
    tokens = [int(t) for t in rng.integers(0, teacher.cfg.vocab_size, len(parents))]
    layout = TreeLayout.from_parents(tokens, parents)
    cache.reset()
    prefill_committed(teacher, cache, PROMPT)
    L = cache.committed_len
    prefix = [b[:, :, :L] for b in buffers(cache.pairs)]
    tree_round(teacher, cache, layout, 8)
    path = path_to(layout, node)
    assert cache.commit(path, layout.parents) == L + len(path)
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
