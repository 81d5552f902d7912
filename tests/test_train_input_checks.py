"""Bad input refused early with a typed error (issue 34): the trainer's and the data generator's flags are checked
before any model loads or any file is written, a torn last manifest line (a disk-full append) no longer blocks
resume, manifest shard names stay inside their data directory, and token ids outside the teacher's vocabulary are
named instead of crashing inside numpy.

Probes of the issue and what they give now:
* ``train-draft --eval-every 0`` / ``--ttt-steps 0`` / ``--clip -1`` (tracebacks after start), ``--lr nan`` /
  ``--lr -1`` / ``--epochs -1`` (exit 0, a NaN head): ``error: ConfigError: --FLAG VALUE: ...``, exit 2, nothing
  written; so for every other numeric flag out of range, and ``--head-intermediate 100000000`` names the memory.
* the data generator's own ConfigErrors: one line and exit 2, no traceback.
* a torn last manifest line: dropped with a warning, generation resumes after the last complete record; a bad
  line before others is a DataError naming file and line.
* ``../x.npz`` or an absolute shard name in a manifest: DataError naming the entry.
* out-of-vocabulary ids in training data or in the generator's prompts: a typed error naming the first bad id.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from mindspore_eagle.app import cli
from mindspore_eagle.errors import ConfigError, DataError
from tests.test_train_provenance import TOPK, random_sequences, snapshot

VOCAB = 101  # tests.helpers.TINY


class Started(Exception):
    """Raised by a stand-in for the first piece of real work (data generation, a teacher load)."""


def _started(*args, **kwargs):
    raise Started


@pytest.fixture
def no_work(monkeypatch):
    """Data generation and teacher loads raise ``Started``: a refusal must come before either."""
    import mindspore_eagle.train.data as data
    from mindspore_eagle.teacher import Teacher

    monkeypatch.setattr(data, "generate_dataset", _started)
    monkeypatch.setattr(Teacher, "load", _started)


def _one_error_line(err: str) -> str:
    """The error line of ``err``: exactly one, last, and no traceback (notes may come before it)."""
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in err, err
    return errors[0]


# ---- 1. flags -------------------------------------------------------------------------------------------------
BAD_TRAIN_FLAGS = [
    ("--eval-every", "0", "must be >= 1"), ("--eval-every", "-5", "must be >= 1"),
    ("--ckpt-every", "0", "must be >= 1"),
    ("--ttt-steps", "0", "must be >= 1"), ("--ttt-steps", "-2", "must be >= 1"),
    ("--clip", "-1", "finite number > 0"), ("--clip", "0", "finite number > 0"), ("--clip", "nan", "finite"),
    ("--lr", "nan", "finite number > 0"), ("--lr", "inf", "finite number > 0"), ("--lr", "-1", "> 0"),
    ("--lr", "0", "> 0"),
    ("--epochs", "-1", "finite number > 0"), ("--epochs", "0", "> 0"), ("--epochs", "nan", "finite"),
    ("--epochs", "inf", "finite"),
    ("--max-steps", "-1", "must be >= 0"), ("--warmup", "-1", "must be >= 0"),
    ("--tokens-per-batch", "0", "must be >= 1"), ("--draft-vocab", "0", "must be >= 1"),
    ("--num-prompts", "0", "must be >= 1"), ("--heldout-max", "-1", "must be >= 0"),
    ("--train-eval-max", "-1", "must be >= 0"), ("--patience", "-1", "must be >= 0"),
    ("--min-delta", "nan", "finite"), ("--max-answer-tokens", "0", "must be >= 1"),
    ("--seed", "-1", "must be >= 0"), ("--head-intermediate", "0", "must be >= 1"),
    ("--heldout", "0", "strictly between 0 and 1"), ("--heldout", "1", "strictly between 0 and 1"),
    ("--heldout", "nan", "strictly between 0 and 1"),
    ("--time-limit-min", "0", "minutes > 0"), ("--time-limit-min", "nan", "minutes > 0"),
    ("--buckets", "16,abc", "comma-separated integers"), ("--buckets", "0", "strictly increasing"),
    ("--buckets", "32,16", "strictly increasing"),
    # what this teacher cannot train (its config is read, nothing loaded): positions past its 256, and memory
    ("--ttt-steps", "250", "past the teacher's positions 0..255"),
    ("--head-intermediate", "100000000", "GiB"),
]


@pytest.mark.parametrize("flag,value,allowed", BAD_TRAIN_FLAGS)
def test_train_draft_refuses_an_out_of_range_flag_before_any_work(tiny_taps_dir, tmp_path, no_work, capsys,
                                                                  flag, value, allowed):
    args = ["train-draft", "--teacher", tiny_taps_dir, "--data", str(tmp_path / "data"), "--out",
            str(tmp_path / "head"), "--buckets", "16", flag, value]
    assert cli.main(args) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: ConfigError: {flag} ") and allowed in line, line
    float_flag = flag in ("--clip", "--lr", "--epochs", "--min-delta", "--heldout", "--time-limit-min")
    assert (str(float(value)) if float_flag else value) in line  # the value as given
    assert os.listdir(tmp_path) == []  # no data, run or head directory begun


def test_the_meaningful_edge_values_are_still_accepted(tiny_taps_dir, tmp_path, no_work):
    """``--max-steps 0`` (evaluate and export only), ``--warmup 0``, ``--heldout-max 0`` / ``--train-eval-max 0``
    / ``--patience 0`` (all / off / never) and a fractional epoch pass the checks and reach the work."""
    with pytest.raises(Started):
        cli.main(["train-draft", "--teacher", tiny_taps_dir, "--data", str(tmp_path / "data"), "--out",
                  str(tmp_path / "head"), "--buckets", "16,32", "--max-steps", "0", "--warmup", "0", "--heldout-max",
                  "0", "--train-eval-max", "0", "--patience", "0", "--epochs", "0.5", "--ttt-steps", "3"])


BAD_DATA_FLAGS = [
    ("--batch-size", "0", "must be >= 1"), ("--max-new-tokens", "0", "must be >= 1"),
    ("--max-prompt-tokens", "-1", "must be >= 1"), ("--num-conversations", "0", "must be >= 1"),
    ("--per-category", "0", "must be >= 1"), ("--max-answer-tokens", "0", "must be >= 1"),
    ("--time-limit", "nan", "finite"), ("--time-limit", "-3", "seconds > 0"),
    ("--topk", "0", f"[1, {VOCAB}]"), ("--topk", str(VOCAB + 1), f"[1, {VOCAB}]"),
    ("--max-new-tokens", "200", "past the teacher's 256 positions"),
    ("--batch-size", "1000000000", "GiB"),
]


@pytest.mark.parametrize("flag,value,allowed", BAD_DATA_FLAGS)
def test_the_data_generator_refuses_an_out_of_range_flag_in_one_line(tiny_taps_dir, tmp_path, capsys, monkeypatch,
                                                                      flag, value, allowed):
    import mindspore_eagle.train.data as data
    from mindspore_eagle.teacher import Teacher

    monkeypatch.setattr(Teacher, "load", _started)
    out = tmp_path / "data"
    assert data.main(["--teacher", tiny_taps_dir, "--out", str(out), "--max-new-tokens", "8", "--max-prompt-tokens",
                      "8", flag, value]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: ConfigError: {flag} ") and allowed in line, line
    assert not out.exists()
    assert data.main(["--teacher", str(tmp_path / "nowhere"), "--out", str(out)]) == 2
    assert "no such directory" in _one_error_line(capsys.readouterr().err)


def test_both_entry_points_print_one_line_and_exit_2(tiny_taps_dir, tmp_path):
    """The real commands, as a user runs them: no traceback from either."""
    env = dict(os.environ, PYTHONPATH=os.getcwd(), GLOG_v="3")
    for argv, expect in (
            (["-m", "mindspore_eagle.app.cli", "train-draft", "--teacher", tiny_taps_dir, "--out", str(tmp_path / "h"),
              "--eval-every", "0"], "error: ConfigError: --eval-every 0: must be >= 1"),
            (["-m", "mindspore_eagle.train.data", "--teacher", tiny_taps_dir, "--out", str(tmp_path / "d"),
              "--batch-size", "0"], "error: ConfigError: --batch-size 0: must be >= 1")):
        proc = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert _one_error_line(proc.stderr).startswith(expect)
    assert os.listdir(tmp_path) == []


# ---- 2. a torn manifest tail ------------------------------------------------------------------------------------
def _seqs(prefix: str, n: int, seed: int, bad_token: int | None = None, bad_topk: int | None = None,
          hidden: int | None = None):
    seqs = random_sequences(prefix, n, seed)
    if hidden is not None:  # the features of a teacher with another hidden size
        seqs = [dataclasses.replace(s, features=np.zeros((len(s.features), 3 * hidden), np.float16)) for s in seqs]
    if bad_token is not None:
        seqs[-1].tokens[7] = bad_token
    if bad_topk is not None:  # in every sequence: the trainer counts the training split's top-k
        for seq in seqs:
            seq.topk_ids[5, 2] = bad_topk
    return seqs


def _data_dir(path, shards: int = 2, per: int = 8, **bad) -> str:
    """A data directory of ``shards`` shards listed in its manifest (one record per line)."""
    from mindspore_eagle.train.data import MANIFEST, write_shard

    os.makedirs(path)
    lines = []
    for k in range(shards):
        seqs = _seqs(f"s{k}-", per, seed=k, **(bad if k == shards - 1 else {}))
        name = os.path.basename(write_shard(str(path), k, seqs))
        lines.append(json.dumps({"shard": name, "ids": [s.pid for s in seqs]}) + "\n")
    with open(os.path.join(path, MANIFEST), "w") as f:
        f.write("".join(lines))
    return str(path)


def test_a_torn_last_manifest_line_is_dropped_with_a_warning(tmp_path, capsys):
    from mindspore_eagle.train.data import MANIFEST, index_sequences, read_manifest
    from mindspore_eagle.train.trainer import data_digest

    data = _data_dir(tmp_path / "data")
    manifest = os.path.join(data, MANIFEST)
    full = open(manifest).read()
    digest = data_digest(data)
    first, second = full.splitlines(keepends=True)
    with open(manifest, "w") as f:  # what a disk-full append of the second record leaves
        f.write(first + second[:25])
    assert [r["shard"] for r in read_manifest(data)] == ["shard_00000.npz"]
    err = capsys.readouterr().err
    assert "warning" in err and manifest in err and "torn" in err
    assert [s.pid[:3] for s in index_sequences(data)] == ["s0-"] * 8  # the complete record's shard only
    with open(manifest, "w") as f:  # the same data plus a torn tail: the same data for the trainer's identity
        f.write(full + '{"shard": "shard_00002.npz", "ids": ["s2-0')
    assert data_digest(data) == digest and len(read_manifest(data)) == 2
    with open(manifest, "w") as f:  # a damaged line with records after it is not a torn tail
        f.write(first[:25] + "\n" + second)
    with pytest.raises(DataError, match=f"{manifest}: line 1 is not valid JSON"):
        read_manifest(data)


def test_generation_resumes_after_a_torn_manifest_tail(tiny_taps_dir, tmp_path):
    """A torn tail is cut off before the next record is appended, so the manifest stays readable and every
    conversation ends up listed exactly once (the torn record's shard is regenerated)."""
    from mindspore_eagle.evaluation.evalset import EvalItem
    from mindspore_eagle.train.data import MANIFEST, finished_conversations, run_generation

    items = [EvalItem(f"c{i:02d}", "test", turns_ids=((1, 5, 9, 3 + i),)) for i in range(8)]
    out = str(tmp_path / "d")
    run_generation(tiny_taps_dir, out, items[:4], None, 4, 6, TOPK, None, 16, (16, 24))
    manifest = os.path.join(out, MANIFEST)
    lines = open(manifest).read().splitlines(keepends=True)
    assert len(lines) == 4  # a shard per conversation (batch 4 -> flush every one)
    with open(manifest, "w") as f:
        f.write("".join(lines[:3]) + lines[3][:30])
    done = finished_conversations(out)
    assert len(done) == 3
    run_generation(tiny_taps_dir, out, [i for i in items if i.id not in done], None, 4, 6, TOPK, None, 16, (16, 24))
    text = open(manifest).read()
    assert text.endswith("\n")
    ids = [i for line in text.splitlines() for i in json.loads(line)["ids"]]  # every line whole again
    assert sorted(ids) == [i.id for i in items]  # each exactly once


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # numpy's ZipFile retries its close
def test_a_disk_full_shard_write_leaves_no_partial_shard(tmp_path):
    """``/dev/full`` answers every write with ENOSPC, as a full disk does: the shard's temporary file is
    removed and no shard appears (the manifest never lists a shard that is not whole)."""
    from mindspore_eagle.train.data import write_shard

    tmp = tmp_path / "shard_00000.npz.tmp.npz"
    os.symlink("/dev/full", tmp)
    with pytest.raises(OSError, match="No space left on device"):
        write_shard(str(tmp_path), 0, _seqs("f", 2, seed=7))
    assert os.listdir(tmp_path) == []


def test_the_data_generator_reports_a_full_disk_in_one_line(tmp_path, tiny_taps_dir, monkeypatch, capsys):
    import errno

    import mindspore_eagle.train.data as data

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "d" / "shard_00003.npz.tmp.npz"))

    monkeypatch.setattr(data, "generate_dataset", full)
    assert data.main(["--teacher", tiny_taps_dir, "--out", str(tmp_path / "d")]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "No space left on device" in line and "rerun to resume" in line, line


# ---- 3. shard names confined to the data directory ----------------------------------------------------------
@pytest.mark.parametrize("name", ["../x.npz", "ABS", "sub/../../x.npz", "", ".."])
def test_a_manifest_shard_name_outside_the_data_directory_is_refused(tmp_path, name):
    """``x.npz`` beside the data directory is a real shard: without the check it was read as training data."""
    from mindspore_eagle.train.data import MANIFEST, index_sequences, write_shard

    seqs = _seqs("x", 4, seed=3)
    write_shard(str(tmp_path), 0, seqs)
    os.replace(tmp_path / "shard_00000.npz", tmp_path / "x.npz")
    data = tmp_path / "data"
    data.mkdir()
    (data / "sub").mkdir()
    name = str(tmp_path / "x.npz") if name == "ABS" else name
    (data / MANIFEST).write_text(json.dumps({"shard": name, "ids": [s.pid for s in seqs]}) + "\n")
    with pytest.raises(DataError, match=f"line 1: shard {name!r} is not a file inside the data directory"):
        index_sequences(str(data))


def test_a_shard_in_a_subdirectory_of_the_data_directory_is_still_read(tmp_path):
    from mindspore_eagle.train.data import MANIFEST, index_sequences, write_shard

    seqs = _seqs("x", 3, seed=4)
    (tmp_path / "part").mkdir()
    write_shard(str(tmp_path / "part"), 0, seqs)
    (tmp_path / MANIFEST).write_text(json.dumps({"shard": "part/./shard_00000.npz", "ids": ["x"]}) + "\n")
    assert [s.pid for s in index_sequences(str(tmp_path))] == [s.pid for s in seqs]


# ---- 4. token ids outside the vocabulary --------------------------------------------------------------------
@pytest.mark.parametrize("bad,expect", [({"bad_token": VOCAB}, f"token id {VOCAB} (position 7)"),
                                        ({"bad_token": -3}, "token id -3 (position 7)"),
                                        ({"bad_topk": VOCAB + 20}, f"top-k token id {VOCAB + 20} (row "),
                                        ({"bad_topk": -1}, "top-k token id -1 (row ")])
def test_training_data_with_an_out_of_vocabulary_id_is_refused_before_the_teacher_loads(
        tiny_taps_dir, tmp_path, no_work, capsys, bad, expect):
    data = _data_dir(tmp_path / "data", **bad)
    assert cli.main(["train-draft", "--teacher", tiny_taps_dir, "--data", data, "--out", str(tmp_path / "head"),
                     "--run-dir", str(tmp_path / "run"), "--buckets", "16", "--heldout", "0.25"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith("error: DataError: ") and expect in line and f"[0, {VOCAB})" in line, line
    if "bad_token" in bad:
        assert "sequence s1-07" in line  # the first bad sequence of the data
        assert os.listdir(tmp_path) == ["data"]  # refused before the run directory is claimed
    assert not (tmp_path / "head").exists()


def test_data_of_a_teacher_with_another_hidden_size_is_refused_before_any_graph(tiny_taps_dir, tmp_path, capsys,
                                                                               monkeypatch):
    """Without the check the head's ``fc`` met 3 x 48 features in MindSpore's Reshape and the compiler dumped
    ``rank_0/om/analyze_fail.ir`` into the working directory."""
    data = _data_dir(tmp_path / "data", hidden=48)
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    assert cli.main(["train-draft", "--teacher", tiny_taps_dir, "--data", data, "--out", str(tmp_path / "head"),
                     "--run-dir", str(tmp_path / "run"), "--buckets", "16", "--heldout", "0.25"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith("error: DataError: ") and "shard_00001.npz" in line, line
    assert "features of shape (88, 144), this teacher's are [rows, 192]" in line and "hidden size 64" in line, line
    assert os.listdir(work) == [] and sorted(os.listdir(tmp_path)) == ["cwd", "data"]


def test_top_k_ids_and_logits_of_different_widths_are_a_damaged_shard():
    from mindspore_eagle.train.data import check_shapes

    seqs = _seqs("w", 2, seed=6)
    check_shapes(seqs, 64)
    seqs[1] = dataclasses.replace(seqs[1], topk_logits=seqs[1].topk_logits[:, :2])
    with pytest.raises(DataError, match=r"sequence w01: top-k ids \(11, 4\) and logits \(11, 2\) do not match"):
        check_shapes(seqs, 64)


def test_a_batch_with_an_out_of_vocabulary_id_is_a_data_error_not_an_index_error():
    """``pack_batch`` guards every batch (a resumed run reuses its vocabulary and never recounts the top-k)."""
    from mindspore_eagle.train.ttt import pack_batch
    from mindspore_eagle.train.vocab import DraftVocab

    vocab = DraftVocab.from_target_ids(range(0, VOCAB, 2), VOCAB)
    good = _seqs("g", 2, seed=5)
    pack_batch(good, vocab, 16, 2)
    for bad, expect in (({"bad_topk": 150}, "b00: top-k token id 150"), ({"bad_topk": -2}, "b00: top-k token id -2"),
                        ({"bad_token": 400}, "b01: token id 400")):
        with pytest.raises(DataError, match=f"sequence {expect} is outside the teacher's vocabulary"):
            pack_batch(_seqs("b", 2, seed=5, **bad), vocab, 16, 2)


def test_generator_prompts_with_an_out_of_vocabulary_id_are_refused_before_the_teacher_loads(
        tiny_taps_dir, tmp_path, no_work):
    from mindspore_eagle.evaluation.evalset import EvalItem
    from mindspore_eagle.train.data import run_generation

    items = [EvalItem("ok", "test", turns_ids=((1, 5, 9),)),
             EvalItem("bad", "test", turns_ids=((1, 5, 9), (4, VOCAB + 399, 7, -1)))]
    out = tmp_path / "d"
    with pytest.raises(ConfigError, match=rf"conversation bad: turn 2: token id {VOCAB + 399} \(position 1\) is "
                                          rf"outside the teacher's vocabulary \[0, {VOCAB}\)"):
        run_generation(tiny_taps_dir, str(out), items, None, 4, 6, TOPK, None, 16, (16, 24))
    assert not out.exists()
