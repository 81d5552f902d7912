"""Capacity, rollback and bad commits are refused before anything is written: the error names the problem,
and both the buffers (bit for bit) and the committed length are exactly as before the call."""

import numpy as np
import pytest

from mindspore_eagle.cache import BranchableKVCache, CacheState
from mindspore_eagle.errors import CacheCapacityError, ConfigError
from mindspore_eagle.teacher import setup_mindspore
from tests.helpers import BRANCHY_PARENTS, buffers, make_pairs

setup_mindspore()

MAX_LEN = 32


@pytest.fixture(scope="module")
def cache():
    pairs, _ = make_pairs([(1, 2, MAX_LEN, 4), (1, 1, MAX_LEN, 8)], seed=7)
    return BranchableKVCache(pairs)


def at(cache, committed_len, bucket=None):
    """Put ``cache`` at a committed length (through its own API), optionally with an open round."""
    cache.reset()
    if committed_len:
        cache.begin_round(committed_len)
        cache.commit(np.arange(committed_len))
    if bucket:
        cache.begin_round(bucket)
    return cache


def refused(cache, error, match, call):
    """``call()`` raises ``error`` matching ``match`` and changes neither the buffers nor the state."""
    before = buffers(cache.pairs)
    state = (cache.committed_len, cache.state.round_bucket)
    with pytest.raises(error, match=match):
        call()
    assert (cache.committed_len, cache.state.round_bucket) == state
    for a, b in zip(before, buffers(cache.pairs)):
        np.testing.assert_array_equal(a, b)


def test_round_past_the_buffer_is_refused_before_any_write(cache):
    at(cache, 20)
    refused(cache, CacheCapacityError, "needs 36 cache rows, max_len=32", lambda: cache.begin_round(16))
    assert cache.begin_round(12) == 20  # exactly fits: rows 20..31


def test_full_cache_refuses_even_one_row(cache):
    at(cache, MAX_LEN)
    refused(cache, CacheCapacityError, "max_len=32", lambda: cache.begin_round(1))
    cache.reset()
    assert cache.committed_len == 0 and cache.begin_round(8) == 0


@pytest.mark.parametrize("target", [-1, 21, 1.5])
def test_rollback_to_a_later_or_invalid_length_is_refused(cache, target):
    at(cache, 20, bucket=8)
    refused(cache, ConfigError, "rollback", lambda: cache.rollback(target))


def test_rollback_to_an_earlier_length_then_continue(cache):
    at(cache, 20, bucket=8)
    assert cache.rollback(5) == 5
    assert cache.state.round_bucket is None  # the open round is discarded
    assert cache.begin_round(8) == 5
    assert cache.commit([0, 2]) == 7


@pytest.mark.parametrize("path,parents,match", [
    ([], None, "non-empty"),
    ([1, 2], None, "start at the root"),
    ([0, 2, 2], None, "strictly increase"),
    ([0, 3, 1], None, "strictly increase"),
    ([0, 8], None, "outside this round's 8"),
    ([0, 1, 5], BRANCHY_PARENTS, "node 5 has parent 2"),
    ([0, 0.5], None, "node indices"),
])
def test_invalid_path_is_refused_before_any_write(cache, path, parents, match):
    at(cache, 10, bucket=8)
    refused(cache, ConfigError, match, lambda: cache.commit(path, parents))


def test_commit_without_an_open_round_is_refused(cache):
    at(cache, 10)
    refused(cache, ConfigError, "without an open round", lambda: cache.commit([0]))
    at(cache, 10, bucket=4)
    cache.abort_round()
    refused(cache, ConfigError, "without an open round", lambda: cache.commit([0]))


def test_cache_state_invariants():
    s = CacheState(max_len=16)
    with pytest.raises(ConfigError, match="without an open round"):
        s.advance(1)
    assert s.reserve(16) == 0
    with pytest.raises(ConfigError, match="wrote 16 rows"):
        s.advance(17)
    assert s.advance(16) == 16 and s.free_rows == 0
    with pytest.raises(CacheCapacityError):
        s.reserve(1)
    with pytest.raises(ConfigError, match="must be an integer >= 1"):
        s.reserve(0)
    with pytest.raises(ConfigError, match="committed_len=17"):
        CacheState(max_len=16, committed_len=17)
