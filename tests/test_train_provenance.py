"""Nothing lost, nothing mixed (issue 34): ``train-draft`` never replaces a directory it did not write, and a run or
data directory refuses to be continued by another teacher, other data or another recipe.

* ``--out`` is replaced by the export: a non-empty directory that is not a head is refused before any work (it
  deleted ``proj/notes.txt`` and ``proj/src/``), unless ``--overwrite``; so is a ``--run-dir`` the trainer did not
  create.
* A run directory records its identity; a resume with another teacher, other data, another vocabulary or other TTT
  steps is refused naming the keys (it printed "resumed from step 2" and exported the previous teacher's rows);
  ``--overwrite`` starts it afresh, removing only the trainer's own files.
* A data directory records its teacher: generation refuses to append a second teacher's answers, training refuses
  another teacher's data, and the default data directory is keyed by the teacher's content, not its name.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from mindspore_eagle.app import cli
from mindspore_eagle.errors import IdentityError

H3 = 3 * 64  # features: three taps of the tiny teacher's hidden size (tests.helpers.TINY)
TOPK = 4
TRAIN = ["--ttt-steps", "2", "--buckets", "16", "--tokens-per-batch", "64", "--heldout", "0.25", "--draft-vocab",
         "40", "--dtype", "float32"]


def snapshot(root) -> dict:
    """Relative path -> bytes of every file under ``root`` (directories as None)."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs:
            out[os.path.relpath(os.path.join(dirpath, name), root)] = None
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


@pytest.fixture(scope="module")
def teachers(tiny_taps_dir, tmp_path_factory):
    """Two teachers in directories of the same name: ``a`` (the tiny teacher) and ``b``, the same with one weight's
    lowest mantissa bit flipped (same shapes, same config: only the content tells them apart)."""
    root = tmp_path_factory.mktemp("teachers")
    a, b = root / "a" / "teacher", root / "b" / "teacher"
    shutil.copytree(tiny_taps_dir, a)
    shutil.copytree(tiny_taps_dir, b)
    weights = max((p for p in b.iterdir() if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(weights.read_bytes())
    data[-4] ^= 0x01
    weights.write_bytes(bytes(data))
    return str(a), str(b)


def random_sequences(prefix: str, n: int, seed: int) -> list:
    """``n`` random training sequences of the tiny teacher's shapes (12 tokens, prompt 4, top-k led by the next
    token), ids ``{prefix}00``, ``{prefix}01``, ..."""
    from mindspore_eagle.train.data import Sequence_

    rng = np.random.default_rng(seed)
    seqs = []
    for i in range(n):
        tokens = rng.integers(3, 100, 12).astype(np.int32)
        topk = rng.integers(3, 100, (11, TOPK)).astype(np.int32)
        topk[:, 0] = tokens[1:]
        seqs.append(Sequence_(f"{prefix}{i:02d}", tokens, 4, rng.normal(size=(11, H3)).astype(np.float16), topk,
                              np.sort(rng.normal(size=(11, TOPK)), -1)[:, ::-1].astype(np.float16)))
    return seqs


def write_data(out, seed: int, n: int = 16) -> str:
    """A one-shard data directory of ``n`` random sequences of the tiny teacher's shapes (no identity record, as
    data written by hand or by an older version)."""
    from mindspore_eagle.train.data import MANIFEST, write_shard

    seqs = random_sequences(f"s{seed}-", n, seed)
    os.makedirs(out)
    name = os.path.basename(write_shard(str(out), 0, seqs))
    with open(os.path.join(out, MANIFEST), "w") as f:
        f.write(json.dumps({"shard": name, "ids": [s.pid for s in seqs]}) + "\n")
    return str(out)


def test_train_draft_refuses_a_non_empty_output_dir_before_any_work(teachers, tmp_path, monkeypatch, capsys):
    import mindspore_eagle.train.data as data
    from mindspore_eagle.train.trainer import train_draft_main

    class Started(Exception):
        pass

    def started(*args, **kwargs):
        raise Started

    monkeypatch.setattr(data, "generate_dataset", started)
    proj = tmp_path / "proj"
    (proj / "src").mkdir(parents=True)
    (proj / "notes.txt").write_text("mine")
    (proj / "src" / "main.py").write_text("print('mine')")
    before = snapshot(proj)
    args = ["train-draft", "--teacher", teachers[0], "--data", str(tmp_path / "data")]
    assert cli.main(args + ["--out", str(proj)]) == 2
    err = capsys.readouterr().err
    assert "already exists and is not empty" in err and "--overwrite" in err
    # the run directory (default: beside OUT) is the user's too unless the trainer created it
    assert cli.main(args + ["--out", str(tmp_path / "head"), "--run-dir", str(proj)]) == 2
    err = capsys.readouterr().err
    assert "IdentityError" in err and "notes.txt" in err and "--overwrite" in err
    assert snapshot(proj) == before
    assert sorted(os.listdir(tmp_path)) == ["proj"]  # no data, run or head directory begun
    with pytest.raises(Started):  # --overwrite lifts the refusal: the work begins
        # (buckets the tiny teacher's 256 positions hold: the defaults reach position 261, refused before the work)
        train_draft_main(args[1:] + ["--out", str(proj), "--overwrite", "--buckets", "16"])


@pytest.mark.slow  # three trainer starts (~36 s on a 2-vCPU Zen 3)
def test_a_run_directory_refuses_a_resume_with_another_teacher_data_or_recipe(teachers, tmp_path, capsys):
    """One real run records the identity; each rerun that differs in one key is refused (exit 2) naming that key,
    before anything loads, and leaves the run untouched; ``--overwrite`` restarts it and keeps the user's file."""
    data = write_data(tmp_path / "data", seed=1)
    run, head = tmp_path / "run", tmp_path / "head"
    args = ["train-draft", "--teacher", teachers[0], "--data", data, "--out", str(head), "--run-dir", str(run),
            "--max-steps", "1", *TRAIN]
    assert cli.main(args) == 0
    (run / "notes.txt").write_text("mine")
    before = snapshot(run)
    other_data = write_data(tmp_path / "data2", seed=2)

    def with_(flag, value):
        out = list(args)
        if flag in out:
            out[out.index(flag) + 1] = value
        else:
            out += [flag, value]
        return out

    for argv, change in ((with_("--teacher", teachers[1]), "teacher: 'sha256:"),
                         (with_("--data", other_data), "data: 'sha256:"),
                         (with_("--draft-vocab", "30"), "draft_vocab: 40 -> 30"),
                         (with_("--ttt-steps", "3"), "ttt_steps: 2 -> 3")):
        capsys.readouterr()
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert "IdentityError" in err and change in err and "--overwrite" in err, err
        assert "resumed" not in err
        assert snapshot(run) == before
    assert cli.main(with_("--ttt-steps", "3") + ["--overwrite"]) == 0
    state = json.loads((run / "state.json").read_text())
    assert [h["step"] for h in state["history"]] == [0, 1]  # started afresh, not resumed at step 1
    assert all(len(h["acc"]) == 3 for h in state["history"])  # every score of one depth
    assert (run / "notes.txt").read_text() == "mine"
    capsys.readouterr()
    assert cli.main(with_("--ttt-steps", "3") + ["--max-steps", "2"]) == 0  # the same identity resumes
    assert "resumed from step 1" in capsys.readouterr().err


def test_data_of_one_teacher_is_neither_extended_nor_trained_on_by_another(teachers, tmp_path, capsys):
    from mindspore_eagle.evaluation.evalset import EvalItem
    from mindspore_eagle.train.data import MANIFEST, run_generation

    items = [EvalItem(f"c{i:02d}", "test", turns_ids=((1, 5, 9, 3 + i),)) for i in range(6)]
    out = tmp_path / "data"
    run_generation(teachers[0], str(out), items[:3], None, 4, 6, TOPK, None, 16, (16, 24))
    before = snapshot(out)
    with pytest.raises(IdentityError, match="teacher: 'sha256:"):
        run_generation(teachers[1], str(out), items[3:], None, 4, 6, TOPK, None, 16, (16, 24))
    assert snapshot(out) == before
    assert cli.main(["train-draft", "--teacher", teachers[1], "--data", str(out), "--out", str(tmp_path / "h"),
                     "--buckets", "16"]) == 2
    assert "holds the answers of another teacher" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["data"]
    mine = tmp_path / "mine"  # a user's directory is not a data directory
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(IdentityError, match="notes.txt"):
        run_generation(teachers[0], str(mine), items, None, 4, 6, TOPK, None, 16, (16, 24))
    assert sorted(os.listdir(mine)) == ["notes.txt"]
    run_generation(teachers[0], str(out), items[3:], None, 4, 6, TOPK, None, 16, (16, 24))  # its own teacher
    assert len((out / MANIFEST).read_text().splitlines()) > len(before[MANIFEST].decode().splitlines())


def test_the_default_data_directory_belongs_to_the_teachers_content_not_its_name(teachers, tmp_path, monkeypatch):
    import mindspore_eagle.train.data as data
    from mindspore_eagle.train.trainer import train_draft_main

    class Started(Exception):
        pass

    chosen = []

    def record(teacher_dir, data_dir, *args, **kwargs):
        chosen.append(data_dir)
        raise Started

    monkeypatch.setenv("MINDSPORE_EAGLE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(data, "generate_dataset", record)
    moved = tmp_path / "elsewhere" / "renamed"  # teacher a's content under another path and name
    shutil.copytree(teachers[0], moved)
    for teacher in (teachers[0], teachers[1], str(moved)):
        with pytest.raises(Started):
            train_draft_main(["--teacher", teacher, "--out", str(tmp_path / "head"), "--buckets", "16"])
    a, b, a_moved = chosen
    assert os.path.basename(teachers[0]) == os.path.basename(teachers[1])
    assert a != b and os.path.dirname(a) == os.path.dirname(b) == str(tmp_path / "home" / "train_data")
    assert a.split("-")[-1] == a_moved.split("-")[-1] != b.split("-")[-1]  # the key is the content's fingerprint


@pytest.mark.slow  # a trainer run
def test_held_out_acceptance_is_reported_per_prompt_source(teachers, tmp_path):
    """Data mixing ShareGPT conversations (ids ``sg-...``) with synthetic ones: every held-out evaluation reports
    the simulated tau of each source beside the overall one, and the overall one counts the positions of both."""
    from mindspore_eagle.train.data import MANIFEST, write_shard

    seqs = random_sequences("sg-", 16, 1) + random_sequences("s1-", 16, 2)
    data = tmp_path / "data"
    data.mkdir()
    name = os.path.basename(write_shard(str(data), 0, seqs))
    (data / MANIFEST).write_text(json.dumps({"shard": name, "ids": [s.pid for s in seqs]}) + "\n")
    run = tmp_path / "run"
    assert cli.main(["train-draft", "--teacher", teachers[0], "--data", str(data), "--out", str(tmp_path / "head"),
                     "--run-dir", str(run), "--max-steps", "1", *TRAIN]) == 0
    history = json.loads((run / "state.json").read_text())["history"]
    assert len(history) == 2  # the initial head and step 1
    for ev in history:
        by = ev["by_source"]
        assert set(by) == {"sharegpt", "synthetic"}
        assert ev["positions"] == by["sharegpt"]["positions"] + by["synthetic"]["positions"] > 0
        assert all(g["positions"] > 0 and 1.0 <= g["tau"] for g in by.values())
