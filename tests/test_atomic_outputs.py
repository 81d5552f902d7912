"""Outputs never destroy inputs, and a killed write is settled by the next one.

* A conversion whose OUT is its source, contains it or lies inside it is refused before anything is read or
  written, whatever ``--overwrite`` says (it used to delete the source).
* An existing OUT is refused before the source is read.
* A writer killed with SIGKILL (a real subprocess, killed mid-write or between the two renames of an
  overwrite) leaves temporaries the next write to the same OUT settles: unfinished ones removed, an
  interrupted overwrite finished, nothing of a live writer touched.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys

import pytest

from ckpt_convert import convert_eagle3, convert_gguf, convert_hf
from ckpt_convert.__main__ import main as convert_main
from mindspore_eagle.errors import CheckpointError, ConfigError
from tests.helpers import PUBLIC_CONFIGS, make_hf_checkpoint, write_public_head, write_tiny_gguf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def snapshot(root: str) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``root`` (a file ``root`` maps from "")."""
    if os.path.isfile(root):
        return {"": hashlib.sha256(open(root, "rb").read()).hexdigest()}
    out = {}
    for d, _, files in os.walk(root):
        for name in files:
            p = os.path.join(d, name)
            out[os.path.relpath(p, root)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


def strays(parent, base: str) -> list[str]:
    return sorted(n for n in os.listdir(parent) if n.startswith(f".tmp-{base}-"))


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """kind -> a pristine source (HF dir, GGUF file, public EAGLE-3 head dir), copied per test."""

    root = tmp_path_factory.mktemp("sources")
    model = make_hf_checkpoint("llama", str(root / "hf"), seed=1)
    write_tiny_gguf(model, str(root / "m.gguf"))
    write_public_head(str(root / "head"), PUBLIC_CONFIGS["mapped"], seed=1)
    return {"hf": str(root / "hf"), "gguf": str(root / "m.gguf"), "eagle3": str(root / "head")}


CONVERTERS = {"hf": convert_hf, "gguf": convert_gguf, "eagle3": convert_eagle3}


def _place(sources, kind, tmp_path):
    """Copy the ``kind`` source to ``tmp_path/par/src`` (plus an unrelated file beside it); return its path."""
    par = tmp_path / "par"
    par.mkdir()
    (par / "unrelated.txt").write_text("keep me")
    src = par / "src"
    (shutil.copyfile if kind == "gguf" else shutil.copytree)(sources[kind], src)
    return str(src)


@pytest.mark.parametrize("kind", sorted(CONVERTERS))
@pytest.mark.parametrize("relation", ["is", "contains", "lies inside", "symlink to"])
def test_output_overlapping_the_source_is_refused_and_the_source_kept(sources, kind, relation, tmp_path):
    src = _place(sources, kind, tmp_path)
    before = snapshot(str(tmp_path / "par"))
    if relation == "symlink to":
        os.symlink(src, tmp_path / "link")
        out = str(tmp_path / "link")
    else:
        out = {"is": src, "contains": str(tmp_path / "par"), "lies inside": os.path.join(src, "out")}[relation]
    with pytest.raises(CheckpointError, match="the source") as err:
        CONVERTERS[kind](src, out, overwrite=True)
    assert ("is" if relation == "symlink to" else relation) in str(err.value)
    assert snapshot(str(tmp_path / "par")) == before


def test_cli_refuses_converting_a_directory_onto_itself(sources, tmp_path, capsys):
    src = _place(sources, "hf", tmp_path)
    before = snapshot(src)
    assert convert_main(["hf", src, src, "--overwrite"]) == 2
    assert "is the source" in capsys.readouterr().err
    assert snapshot(src) == before


@pytest.mark.parametrize("kind, reader", [("hf", "mindspore_eagle.convert.teacher.read_safetensors"),
                                          ("gguf", "mindspore_eagle.convert.teacher.read_gguf"),
                                          ("eagle3", "mindspore_eagle.convert.eagle3.read_head_tensors")])
def test_existing_output_is_refused_before_the_source_is_read(sources, kind, reader, tmp_path, monkeypatch):
    def must_not_read(*args, **kwargs):
        raise AssertionError("the source was read before the output was checked")

    monkeypatch.setattr(reader, must_not_read)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(CheckpointError, match="already exists"):
        CONVERTERS[kind](sources[kind], str(out))
    assert (out / "keep.txt").read_text() == "x"


def test_exported_head_refuses_an_output_holding_its_teacher(sources, tmp_path):
    from mindspore_eagle.draft_config import DraftConfig
    from mindspore_eagle.train.export import export_head

    teacher = tmp_path / "models" / "teacher"
    shutil.copytree(sources["hf"], teacher)
    before = snapshot(str(teacher))
    cfg = DraftConfig.from_hf_dict(dict(PUBLIC_CONFIGS["mapped"], draft_vocab_size=60))
    with pytest.raises(ConfigError, match="contains the source"):
        export_head(str(tmp_path / "models"), cfg, {}, sources=[str(teacher)])
    assert snapshot(str(teacher)) == before


# ----- killed writers -------------------------------------------------------------------------------------

WRITER = """
import os, sys, time
from mindspore_eagle.storage.atomic import atomic_directory
from mindspore_eagle.errors import CheckpointError
out, payload, stage = sys.argv[1:4]
if stage == "between-renames":  # stop right after OUT was moved aside, before the new directory replaces it
    real = os.replace
    def replace(a, b):
        real(a, b)
        if b.endswith(".old"):
            print("ready", flush=True)
            time.sleep(600)
    os.replace = replace
with atomic_directory(out, overwrite=True, error=CheckpointError) as tmp:
    with open(os.path.join(tmp, "data.bin"), "wb") as f:
        f.write(payload.encode() * 1000)
    if stage == "mid-write":
        print("ready", flush=True)
        time.sleep(600)
print("done", flush=True)
"""


def run_writer(out, payload: str, stage: str, script: str = WRITER) -> subprocess.Popen:
    """Start a writer subprocess; return it once it printed "ready" (or finished, for stage "none")."""
    env = dict(os.environ, PYTHONPATH=ROOT, GLOG_v="3")
    proc = subprocess.Popen([sys.executable, "-c", script, str(out), payload, stage], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, text=True)
    line = proc.stdout.readline().strip()
    if line not in ("ready", "done"):
        proc.kill()
        raise AssertionError(f"writer failed: {line!r} {proc.stderr.read()}")
    return proc


def kill9(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def test_writer_killed_mid_write_leaves_a_temp_dir_the_next_write_removes(tmp_path):
    from mindspore_eagle.storage.atomic import atomic_directory

    out = tmp_path / "out"
    kill9(run_writer(out, "a", "mid-write"))
    assert not out.exists() and len(strays(tmp_path, "out")) == 1  # what SIGKILL leaves
    with atomic_directory(str(out), overwrite=False, error=CheckpointError) as tmp:
        (open(os.path.join(tmp, "data.bin"), "w")).write("b")
    assert (out / "data.bin").read_text() == "b"
    assert strays(tmp_path, "out") == []


def test_overwrite_killed_between_its_two_renames_is_finished_by_the_next_run(tmp_path):
    from mindspore_eagle.storage.atomic import check_output_dir

    out = tmp_path / "out"
    run_writer(out, "old", "none").wait(timeout=60)
    kill9(run_writer(out, "new", "between-renames"))
    assert not out.exists()  # what SIGKILL leaves: the old OUT moved aside, the new one not yet in place
    assert len(strays(tmp_path, "out")) == 2
    with pytest.raises(CheckpointError, match="already exists"):  # the next run sees OUT again...
        check_output_dir(str(out), overwrite=False, error=CheckpointError)
    assert (out / "data.bin").read_text() == "new" * 1000  # ...as the killed writer had committed it
    assert strays(tmp_path, "out") == []


def test_a_live_or_foreign_writers_temporaries_are_left_alone(tmp_path):
    from mindspore_eagle.storage.atomic import owner_tag, recover

    out = tmp_path / "out"
    live = run_writer(out, "a", "mid-write")
    try:
        foreign_host = tmp_path / ".tmp-out-00000000-999999-1-0123abcd"  # another machine's writer
        legacy = tmp_path / ".tmp-out-k3j_x9ab"  # written by an older version: no owner recorded
        foreign_host.mkdir()
        legacy.mkdir()
        kept = strays(tmp_path, "out")
        assert recover(str(out)) == []
        assert strays(tmp_path, "out") == kept and len(kept) == 3
    finally:
        kill9(live)
    host, pid, start = owner_tag().split("-")
    reused = tmp_path / f".tmp-out-{host}-{pid}-{int(start) + 1}-0123abcd"  # our pid, but another process's start
    reused.mkdir()
    recover(str(out))
    assert not reused.exists()
    assert sorted(strays(tmp_path, "out")) == sorted([foreign_host.name, legacy.name])


KILLED_CONVERSION = """
import sys, time
import mindspore_eagle.convert.teacher as conv
real = conv.save_tensors
def save_then_hang(*args, **kwargs):
    real(*args, **kwargs)
    print("ready", flush=True)
    time.sleep(600)
conv.save_tensors = save_then_hang
from ckpt_convert.__main__ import main
main(["hf", sys.argv[2], sys.argv[1]])
"""


def test_conversion_killed_after_writing_its_weights_is_cleaned_by_the_rerun(sources, tmp_path):
    out = tmp_path / "out"
    proc = run_writer(out, sources["hf"], "", script=KILLED_CONVERSION)
    kill9(proc)
    left = strays(tmp_path, "out")
    assert len(left) == 1 and os.path.getsize(tmp_path / left[0] / "weights.safetensors") > 0
    assert convert_main(["hf", sources["hf"], str(out)]) == 0
    assert strays(tmp_path, "out") == [] and (out / "weights.safetensors").is_file()


def test_train_draft_refuses_an_output_holding_its_teacher_before_any_work(sources, tmp_path, monkeypatch):
    import mindspore_eagle.train.data as data
    from mindspore_eagle.train.trainer import train_draft_main

    def must_not_run(*args, **kwargs):
        raise AssertionError("training data generated before the output was checked")

    monkeypatch.setattr(data, "generate_dataset", must_not_run)
    teacher = tmp_path / "models" / "teacher"
    shutil.copytree(sources["hf"], teacher)
    before = snapshot(str(teacher))
    with pytest.raises(ConfigError, match="contains the source"):
        train_draft_main(["--teacher", str(teacher), "--out", str(tmp_path / "models"),
                          "--data", str(tmp_path / "data")])
    assert snapshot(str(teacher)) == before and not (tmp_path / "data").exists()


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_an_atomically_written_file_gets_the_mode_the_umask_gives_not_mkstemps_private_one(umask, tmp_path):
    from mindspore_eagle.storage.atomic import write_bytes

    old = os.umask(umask)
    try:
        write_bytes(str(tmp_path / "part.npz"), b"x" * 10)
    finally:
        os.umask(old)
    assert (tmp_path / "part.npz").read_bytes() == b"x" * 10
    assert os.stat(tmp_path / "part.npz").st_mode & 0o777 == 0o666 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part.npz"]
