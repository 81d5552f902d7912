"""Speculation never corrupts the committed prefix (property-based).

Random prompts, random trees, random accepted paths and random interleavings of committed rounds, aborted
rounds and rollbacks, on a real teacher: the committed rows are bit-identical before and after every
speculative write and every commit, and at the end the cache and the next-step logits equal those of a run
without speculation over the accepted tokens (and HuggingFace's logits over the same tokens).
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mindspore_eagle.cache import BranchableKVCache
from mindspore_eagle.errors import CacheCapacityError
from mindspore_eagle.teacher import Teacher, setup_mindspore
from mindspore_eagle.tree import TreeLayout
from tests.helpers import (CACHE_RUNTIME, TOL, assert_rows_close, buffers, decode_logits, path_to, prefill_committed,
                                     reference_rows_and_logits, tree_round)

setup_mindspore()


@pytest.fixture(scope="module")
def rig(hf_tiny):
    _, ms_dir, torch_model = hf_tiny("llama")
    teacher = Teacher.load(ms_dir, CACHE_RUNTIME)
    return teacher, BranchableKVCache.for_teacher(teacher), torch_model


def committed(cache):
    """Host copies of rows [0, L) of every buffer."""
    L = cache.committed_len
    return [b[:, :, :L] for b in buffers(cache.pairs)]


def assert_same_bits(before, after):
    for i, (a, b) in enumerate(zip(before, after)):
        assert np.array_equal(a, b), f"buffer {i}: committed rows changed"


@st.composite
def trees(draw, root_token, vocab):
    """A random tree of 1..12 nodes (parents drawn before children) with the given root token."""
    n = draw(st.sampled_from(range(1, 13)))
    parents = [0] + [draw(st.sampled_from(range(i))) for i in range(1, n)]  # near-uniform, not biased to 0
    tokens = [root_token] + draw(st.lists(st.integers(0, vocab - 1), min_size=n - 1, max_size=n - 1))
    return TreeLayout.from_parents(tokens, parents)


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_speculation_never_touches_committed_rows_and_matches_plain_run(rig, data):
    teacher, cache, torch_model = rig
    vocab = teacher.cfg.vocab_size
    token = st.integers(0, vocab - 1)
    seq = data.draw(st.lists(token, min_size=1, max_size=12), label="prompt")
    cache.reset()
    prefill_committed(teacher, cache, seq)
    root = data.draw(token, label="first root")
    for op in data.draw(st.lists(st.sampled_from(["commit", "commit", "abort", "rollback"]), min_size=1, max_size=5),
                        label="ops"):
        L = cache.committed_len
        assert L == len(seq)
        if op == "rollback":
            cache.rollback(data.draw(st.integers(0, L), label="rollback to"))
            seq = seq[:cache.committed_len]
            root = data.draw(token, label="root after rollback")
            continue
        layout = data.draw(trees(root, vocab), label="tree")
        bucket = 8 if layout.num_nodes <= 8 else 16
        before = committed(cache)
        if L + bucket > cache.max_len:
            with pytest.raises(CacheCapacityError):
                cache.begin_round(bucket)
            assert_same_bits(before, committed(cache))
            break
        tree_round(teacher, cache, layout, bucket)
        assert_same_bits(before, committed(cache))  # the speculative write stayed in [L, L + bucket)
        if op == "abort":
            cache.abort_round()
            continue
        # Last node first: the simplest draw (and the shrink target) is a deep, usually out-of-place path.
        node = data.draw(st.sampled_from(range(layout.num_nodes - 1, -1, -1)), label="accepted node")
        path = path_to(layout, node)
        chain = path == list(range(len(path)))
        event(f"commit of a {'chain (nothing moves)' if chain else 'moved'} path")
        assert cache.commit(path, layout.parents) == L + len(path)
        after = committed(cache)
        assert_same_bits(before, [a[:, :, :L] for a in after])  # the commit touched nothing below L
        seq = seq + [int(layout.tokens[i]) for i in path]
        root = data.draw(token, label="bonus")

    got_rows = buffers(cache.pairs)
    got_logits = decode_logits(teacher, cache, root)
    ref_rows, ref_logits = reference_rows_and_logits(teacher, cache, seq, root)
    assert_rows_close(got_rows, ref_rows, len(seq))
    assert np.abs(got_logits - ref_logits).max() <= TOL * max(1.0, np.abs(ref_logits).max())
    import torch

    with torch.no_grad():
        hf = torch_model(torch.tensor([seq + [root]])).logits[0, -1].numpy()
    assert np.abs(got_logits - hf).max() <= 1e-4
