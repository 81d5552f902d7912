"""Training-data shards and the resumable generation run: the existing reader reads the new shards, the held-out
split keeps a conversation's turns together, and a run killed mid-way (SIGKILL, in a subprocess) and rerun ends
with every conversation exactly once and the same tokens as an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from mindspore_eagle.train.data import (MANIFEST, Sequence_, ShardFile, bytes_per_token, conversation_id,
                                        index_sequences, load_sequences,
                                        read_manifest, write_shard)
from mindspore_eagle.train.trainer import heldout

RUNNER = r'''
import sys
from mindspore_eagle.evaluation.evalset import EvalItem
from mindspore_eagle.train.data import run_generation
teacher_dir, out_dir, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
items = [EvalItem(f"c{i:03d}", "test", turns_ids=((1, 5, 9, 3 + i % 50, 7 + i % 13),) + (((60, 61),) if i % 4 == 0 else ()))
         for i in range(n)]
from mindspore_eagle.train.data import finished_conversations
done = finished_conversations(out_dir)
run_generation(teacher_dir, out_dir, [i for i in items if i.id not in done], None, 4, 12, 8, None, 16, (24, 40))
'''


def _seq(pid: str, n: int, p: int, width: int = 6, k: int = 3) -> Sequence_:
    rng = np.random.default_rng(len(pid) + n)
    return Sequence_(pid, rng.integers(0, 50, n).astype(np.int32), p, rng.normal(size=(n - 1, width)).astype(np.float16),
                     rng.integers(0, 50, (n - 1, k)).astype(np.int32), rng.normal(size=(n - 1, k)).astype(np.float16))


def test_new_shards_are_read_by_the_trainer_reader(tmp_path):
    seqs = [_seq("aa", 7, 3), _seq("aa-t2", 5, 2), _seq("bb", 4, 1)]
    name = os.path.basename(write_shard(str(tmp_path), 0, seqs, [0, 9, 0], [0, 1, 0], ["math", "math", "coding"]))
    (tmp_path / MANIFEST).write_text(json.dumps({"shard": name, "ids": ["aa", "bb"]}) + "\n")
    back = load_sequences(str(tmp_path))
    assert [s.pid for s in back] == ["aa", "aa-t2", "bb"]
    for a, b in zip(seqs, back):
        assert a.prompt_len == b.prompt_len and np.array_equal(a.tokens, b.tokens)
        assert np.array_equal(a.features, b.features) and np.array_equal(a.topk_ids, b.topk_ids)
    with np.load(tmp_path / name) as z:
        assert list(z["starts"]) == [0, 9, 0] and list(z["turns"]) == [0, 1, 0]
        assert list(z["categories"]) == ["math", "math", "coding"]


def test_heldout_split_keeps_both_turns_of_a_conversation_together():
    assert conversation_id("0123abcd-t2") == "0123abcd" == conversation_id("0123abcd")
    ids = [f"{i:08x}" for i in range(2000)]
    held = [i for i in ids if heldout(i, 0.1)]
    assert 100 < len(held) < 300
    assert all(heldout(i + "-t2", 0.1) == heldout(i, 0.1) for i in ids)


def test_bytes_per_token_of_the_default_teacher():
    assert bytes_per_token(576, 32) == 3 * 576 * 2 + 32 * 6 + 4 == 3652


def _run(teacher_dir: str, out: str, n: int) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.getcwd(), GLOG_v="3")
    return subprocess.Popen([sys.executable, "-c", RUNNER, teacher_dir, out, str(n)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _contents(out: str) -> dict[str, list[int]]:
    return {s.pid: list(s.tokens) for s in load_sequences(out)}


@pytest.mark.slow
def test_a_killed_run_resumes_and_loses_only_conversations_in_flight(tiny_taps_dir, tmp_path):
    n = 120
    ref, cut = str(tmp_path / "ref"), str(tmp_path / "cut")
    assert _run(tiny_taps_dir, ref, n).wait(timeout=300) == 0
    proc = _run(tiny_taps_dir, cut, n)
    deadline = time.time() + 300
    while len(read_manifest(cut)) < 3 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed: give it more conversations"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = read_manifest(cut)
    assert 3 <= len(partial) and sum(len(r["ids"]) for r in partial) < n
    assert _run(tiny_taps_dir, cut, n).wait(timeout=300) == 0
    ids = [i for r in read_manifest(cut) for i in r["ids"]]
    assert len(ids) == len(set(ids)) == n  # every conversation exactly once
    assert _contents(cut) == _contents(ref)  # and the same tokens as the uninterrupted run
    assert sum(pid.endswith("-t2") for pid in _contents(ref)) == n // 4


def _shard(tmp_path, seqs, name="shard_00000.npz"):
    write_shard(str(tmp_path), 0, seqs)
    (tmp_path / MANIFEST).write_text(json.dumps({"shard": name, "ids": [s.pid for s in seqs]}) + "\n")
    return tmp_path / name


def test_indexed_sequences_read_exactly_their_own_rows_from_disk(tmp_path):
    """The trainer's index keeps only tokens in memory; each ``load`` reads that sequence's rows with one
    pread, equal to slicing the arrays ``np.load`` returns for the whole shard."""
    seqs = [_seq(f"c{i}", int(n), int(p), width=9, k=4) for i, (n, p) in enumerate([(7, 3), (2, 1), (30, 5), (4, 4)])]
    path = _shard(tmp_path, seqs)
    index = index_sequences(str(tmp_path))
    assert [s.pid for s in index] == [s.pid for s in seqs]
    assert not hasattr(index[0], "features")
    with np.load(path) as z:
        feats, ids = z["features"], z["topk_ids"]
    row = 0
    for ref, stored in zip(seqs, index):
        got = stored.load()
        n = len(ref.tokens) - 1
        assert np.array_equal(got.features, feats[row:row + n]) and np.array_equal(got.features, ref.features)
        assert np.array_equal(got.topk_ids, ids[row:row + n]) and np.array_equal(got.topk_logits, ref.topk_logits)
        assert got.prompt_len == ref.prompt_len and np.array_equal(got.tokens, ref.tokens)
        row += n


def test_a_compressed_or_truncated_shard_is_refused_with_a_data_error(tmp_path):
    from mindspore_eagle.errors import DataError

    seqs = [_seq("a", 9, 2), _seq("b", 5, 1)]
    (tmp_path / "intact").mkdir()
    intact = _shard(tmp_path / "intact", seqs)
    with pytest.raises(DataError, match="outside"):
        ShardFile(str(intact)).rows("features", 0, 10 ** 6)
    cut = tmp_path / "cut"
    cut.mkdir()
    blob = intact.read_bytes()
    (cut / intact.name).write_bytes(blob[: len(blob) // 2])
    (cut / MANIFEST).write_text((tmp_path / "intact" / MANIFEST).read_text())
    with pytest.raises(DataError, match="shard"):
        index_sequences(str(cut))
    with np.load(intact) as z:
        arrays = {k: z[k] for k in z.files}
    packed = tmp_path / "packed.npz"
    np.savez_compressed(packed, **arrays)
    with pytest.raises(DataError, match="compressed"):
        ShardFile(str(packed))


def test_generation_stops_at_an_answer_token_limit_and_a_larger_limit_resumes(tiny_taps_dir, tmp_path):
    from mindspore_eagle.evaluation.evalset import EvalItem
    from mindspore_eagle.train.data import run_generation, stored_answer_tokens

    items = [EvalItem(f"c{i:03d}", "test", turns_ids=((1, 5, 9, 3 + i % 50, 7 + i % 13),)) for i in range(40)]
    out = str(tmp_path / "d")
    run_generation(tiny_taps_dir, out, items, None, 4, 12, 8, None, 16, (24, 40), max_answer_tokens=50)
    first = stored_answer_tokens(out)
    done = {s.pid for s in load_sequences(out)}
    assert 50 <= first < 40 * 12 and len(done) < 40  # stopped early, at or past the limit
    rest = [i for i in items if i.id not in done]
    run_generation(tiny_taps_dir, out, rest, None, 4, 12, 8, None, 16, (24, 40), max_answer_tokens=150)
    assert stored_answer_tokens(out) >= 150 and len({s.pid for s in load_sequences(out)}) > len(done)


def test_progress_eta_is_the_first_of_last_conversation_and_token_goal():
    """A run stopping at ``--max-answer-tokens`` long before its last conversation must not print the latter's
    ETA (hours for a run that ends in minutes)."""
    from mindspore_eagle.train.data import _Progress

    # 100 of 1000 conversations and 1000 tokens in 360 s: conversations end in 3240 s, a 2000-token goal in 360 s
    assert _Progress(1000, 0).eta_h(100, 1000, 360.0) == pytest.approx(0.9)
    assert _Progress(1000, 0, token_goal=2000).eta_h(100, 1000, 360.0) == pytest.approx(0.1)
    assert _Progress(120, 0, token_goal=10 ** 9).eta_h(100, 1000, 360.0) == pytest.approx(0.02)  # 20 left: 72 s
    assert _Progress(1000, 0, token_goal=500).eta_h(100, 1000, 360.0) == 0.0  # goal passed
