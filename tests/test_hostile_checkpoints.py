"""Hostile checkpoints are refused where they enter, with a CheckpointError naming the tensor or file.

* NaN/Inf weights: in every converter (HF, GGUF, public EAGLE-3 head, also loaded in memory) and on loading a
  converted teacher or head. They used to load: greedy then answered nothing (argmax of NaN is token 0),
  sampling crashed in numpy, a NaN head gave tau 1.00 without a word.
* Integer and bool weights: refused, not silently cast to float.
* Shards named outside the checkpoint directory (``../x``, an absolute path, a symlink leading out).
* Vocabulary-map side files (``d2t.npy`` / ``t2d.npy``) that are garbage, pickled, of the wrong dtype, shape
  or range.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil

import numpy as np
import pytest

from ckpt_convert import convert_eagle3, convert_gguf, convert_hf
from mindspore_eagle.runtime import RuntimeConfig
from mindspore_eagle.draft import load_head
from mindspore_eagle.errors import CheckpointError
from mindspore_eagle.models.eagle3 import Eagle3DraftHead
from mindspore_eagle.teacher import Teacher, setup_mindspore
from tests.helpers import PUBLIC_CONFIGS, make_hf_checkpoint, public_tensors, write_public_head, write_tiny_gguf

setup_mindspore()

MAPPED = PUBLIC_CONFIGS["mapped"]
RT = RuntimeConfig(max_cache_len=64, exec_mode="reference", buckets=(1, 8), prefill_chunk=8)
VICTIM = "model.layers.1.mlp.up_proj.weight"


@pytest.fixture(scope="module")
def hf_src(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    model = make_hf_checkpoint("llama", str(root / "hf"), seed=2)
    return str(root / "hf"), model


def _hf_tensors(src: str) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return dict(load_file(os.path.join(src, "model.safetensors")))


def rewrite_hf(src: str, dst: str, tensors: dict[str, np.ndarray]) -> str:
    """``src`` with its weights replaced by ``tensors`` (config and everything else copied)."""
    from safetensors.numpy import save_file

    shutil.copytree(src, dst)
    save_file(tensors, os.path.join(dst, "model.safetensors"))
    return dst


def assert_nothing_written(out) -> None:
    parent = os.path.dirname(out)
    assert not os.path.exists(out)
    assert [n for n in os.listdir(parent) if n.startswith(".tmp-")] == []


# ----- non-finite weights ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_hf_weight_is_refused_naming_the_tensor(hf_src, tmp_path, value, dtype):
    t = {n: a.astype(dtype) for n, a in _hf_tensors(hf_src[0]).items()}
    t[VICTIM][3, 5] = value
    bad = rewrite_hf(hf_src[0], str(tmp_path / "bad"), t)
    out = str(tmp_path / "out")
    with pytest.raises(CheckpointError, match=f"{VICTIM} holds 1 non-finite value"):
        convert_hf(bad, out)
    assert_nothing_written(out)


def test_non_finite_gguf_weight_is_refused_naming_the_tensor(hf_src, tmp_path):
    import torch

    model = make_hf_checkpoint("llama", str(tmp_path / "hf"), seed=4)
    with torch.no_grad():
        model.model.layers[0].self_attn.v_proj.weight[0, :3] = float("nan")
    write_tiny_gguf(model, str(tmp_path / "m.gguf"))
    with pytest.raises(CheckpointError, match="blk.0.attn_v.weight holds 3 non-finite values"):
        convert_gguf(str(tmp_path / "m.gguf"), str(tmp_path / "out"))
    assert_nothing_written(str(tmp_path / "out"))


@pytest.mark.parametrize("load", ["convert", "in memory"])
def test_non_finite_public_head_weight_is_refused(tmp_path, load):
    t = public_tensors(MAPPED, seed=1)
    t["midlayer.mlp.down_proj.weight"][:] = np.inf
    write_public_head(str(tmp_path / "src"), MAPPED, tensors=t)
    with pytest.raises(CheckpointError, match="midlayer.mlp.down_proj.weight holds .* non-finite"):
        if load == "convert":
            convert_eagle3(str(tmp_path / "src"), str(tmp_path / "out"))
        else:
            load_head(str(tmp_path / "src"), max_len=16)
    assert_nothing_written(str(tmp_path / "out"))


def _poison_converted(model_dir: str, name: str) -> None:
    """Set one value of tensor ``name`` of a converted directory to NaN (what bit rot or a bad export does)."""
    from safetensors.numpy import load_file, save_file

    path = os.path.join(model_dir, "weights.safetensors")
    t = dict(load_file(path))
    t[name].reshape(-1)[7] = np.nan
    os.chmod(path, 0o644)
    save_file(t, path, metadata={"format": "mindspore_eagle", "layout": "in_out"})


def test_non_finite_weight_of_a_converted_teacher_is_refused_on_load(hf_src, tmp_path):
    convert_hf(hf_src[0], str(tmp_path / "ms"))
    _poison_converted(str(tmp_path / "ms"), "model.norm.weight")
    with pytest.raises(CheckpointError, match="model.norm.weight holds 1 non-finite value"):
        Teacher.load(str(tmp_path / "ms"), RT)


def test_non_finite_weight_of_a_converted_head_is_refused_on_load(tmp_path):
    write_public_head(str(tmp_path / "src"), MAPPED, seed=2)
    convert_eagle3(str(tmp_path / "src"), str(tmp_path / "out"))
    _poison_converted(str(tmp_path / "out"), "lm_head.weight")
    with pytest.raises(CheckpointError, match="lm_head.weight holds 1 non-finite value"):
        Eagle3DraftHead.load(str(tmp_path / "out"), max_len=16)


# ----- non-float weights --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["int32", "int8", "bool"])
def test_integer_or_bool_hf_weight_is_refused(hf_src, tmp_path, dtype):
    t = _hf_tensors(hf_src[0])
    t[VICTIM] = np.ones(t[VICTIM].shape, dtype)
    bad = rewrite_hf(hf_src[0], str(tmp_path / "bad"), t)
    with pytest.raises(CheckpointError, match=f"{VICTIM} has dtype {dtype}"):
        convert_hf(bad, str(tmp_path / "out"))
    assert_nothing_written(str(tmp_path / "out"))


@pytest.mark.parametrize("container", ["safetensors", "pytorch_model.bin"])
def test_bool_or_integer_head_weight_is_refused(tmp_path, container):
    t = public_tensors(MAPPED, seed=3)
    t["norm.weight"] = np.ones(t["norm.weight"].shape, np.bool_)
    t["fc.weight"] = np.ones(t["fc.weight"].shape, np.int32)
    if container == "safetensors":
        write_public_head(str(tmp_path / "src"), MAPPED, tensors=t)
    else:
        torch = pytest.importorskip("torch")
        os.makedirs(tmp_path / "src")
        (tmp_path / "src" / "config.json").write_text(json.dumps(MAPPED))
        torch.save({k: torch.from_numpy(v.copy()) for k, v in t.items()}, tmp_path / "src" / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="(fc.weight has dtype int32|norm.weight has dtype bool)"):
        convert_eagle3(str(tmp_path / "src"), str(tmp_path / "out"))
    assert_nothing_written(str(tmp_path / "out"))


def test_integer_gguf_tensor_is_refused(tmp_path):
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    w.add_tensor("token_embd.weight", np.ones((4, 8), np.int32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    from mindspore_eagle.convert.readers import read_gguf

    with pytest.raises(CheckpointError, match="token_embd.weight has integer type I32"):
        read_gguf(str(tmp_path / "m.gguf"))


# ----- shards outside the checkpoint ----------------------------------------------------------------------


def _split_into_shards(src: str, dst: str, second: str) -> None:
    """``src`` as two shards, the second one listed in the index under the name ``second``."""
    from safetensors.numpy import save_file

    t = _hf_tensors(src)
    names = sorted(t)
    os.makedirs(dst)
    shutil.copyfile(os.path.join(src, "config.json"), os.path.join(dst, "config.json"))
    save_file({n: t[n] for n in names[:5]}, os.path.join(dst, "part-1.safetensors"))
    outside = os.path.join(os.path.dirname(dst), "outside.safetensors")
    save_file({n: t[n] for n in names[5:]}, outside)
    if second == "link.safetensors":
        os.symlink(outside, os.path.join(dst, second))
    weight_map = {n: "part-1.safetensors" for n in names[:5]}
    weight_map.update({n: outside if second == "ABSOLUTE" else second for n in names[5:]})
    with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": weight_map}, f)


@pytest.mark.parametrize("second", ["../outside.safetensors", "ABSOLUTE", "link.safetensors"])
def test_shard_outside_the_checkpoint_directory_is_refused(hf_src, tmp_path, second):
    _split_into_shards(hf_src[0], str(tmp_path / "ckpt"), second)
    with pytest.raises(CheckpointError, match="outside the checkpoint directory"):
        convert_hf(str(tmp_path / "ckpt"), str(tmp_path / "out"))
    assert_nothing_written(str(tmp_path / "out"))


def test_hf_cache_snapshot_whose_files_link_to_its_blobs_converts(hf_src, tmp_path):
    """The HF hub cache stores snapshot files as symlinks to ``../../blobs``: that is not an escape (but the same
    layout outside a ``models--*`` repository folder is)."""
    for repo_name in ("models--org--tiny", "not-a-hub-cache"):
        repo = tmp_path / repo_name
        snap = repo / "snapshots" / "0123abc"
        (repo / "blobs").mkdir(parents=True)
        snap.mkdir(parents=True)
        for name in os.listdir(hf_src[0]):
            shutil.copyfile(os.path.join(hf_src[0], name), repo / "blobs" / name)
            os.symlink(os.path.join("..", "..", "blobs", name), snap / name)
    convert_hf(str(tmp_path / "models--org--tiny" / "snapshots" / "0123abc"), str(tmp_path / "out"))
    assert (tmp_path / "out" / "weights.safetensors").is_file()
    with pytest.raises(CheckpointError, match="outside the checkpoint directory"):
        convert_hf(str(tmp_path / "not-a-hub-cache" / "snapshots" / "0123abc"), str(tmp_path / "out2"))


@pytest.mark.parametrize("index", [{"weight_map": ["a.safetensors"]}, {"weight_map": {"w": 3}}, [1, 2]])
def test_malformed_shard_index_is_refused(hf_src, tmp_path, index):
    bad = tmp_path / "bad"
    bad.mkdir()
    shutil.copyfile(os.path.join(hf_src[0], "config.json"), bad / "config.json")
    (bad / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="model.safetensors.index.json"):
        convert_hf(str(bad), str(tmp_path / "out"))


# ----- vocabulary-map side files ----------------------------------------------------------------------------


@pytest.fixture
def converted_head(tmp_path):
    write_public_head(str(tmp_path / "src"), MAPPED, seed=4)
    convert_eagle3(str(tmp_path / "src"), str(tmp_path / "out"))
    return tmp_path / "out"


@pytest.mark.parametrize("fault, message", [
    ("garbage", "d2t.npy: not a numpy array file"),
    ("pickled", "d2t.npy: not a numpy array file"),
    ("float", "d2t.npy: dtype float32; expected integer"),
    ("shape", "d2t.npy: shape \\(3, 8\\); expected \\(24,\\)"),
    ("range", "d2t maps draft id 0 to -5, outside the vocabulary"),
    ("t2d_int", "t2d.npy: dtype int64; expected bool"),
    ("t2d_truncated", "t2d.npy: not a numpy array file"),
])
def test_corrupt_vocabulary_map_file_is_refused_on_load(converted_head, fault, message):
    d2t_path, t2d_path = converted_head / "d2t.npy", converted_head / "t2d.npy"
    d2t = np.load(d2t_path)
    if fault == "garbage":
        d2t_path.write_bytes(os.urandom(200))
    elif fault == "pickled":
        with open(d2t_path, "wb") as f:
            np.save(f, np.array([{"evil": 1}] * 24, dtype=object), allow_pickle=True)
    elif fault == "float":
        np.save(d2t_path, d2t.astype(np.float32))
    elif fault == "shape":
        np.save(d2t_path, np.zeros((3, 8), np.int64))
    elif fault == "range":
        d2t[0] = -5
        np.save(d2t_path, d2t)
    elif fault == "t2d_int":
        np.save(t2d_path, np.load(t2d_path).astype(np.int64))
    else:
        t2d_path.write_bytes(t2d_path.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match=message):
        Eagle3DraftHead.load(str(converted_head), max_len=16)


def test_pickled_vocabulary_map_is_never_unpickled(converted_head, monkeypatch):
    """Loading must not run pickle at all, whatever the file holds."""
    def refuse(*args, **kwargs):
        raise AssertionError("pickle used")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    with open(converted_head / "d2t.npy", "wb") as f:
        np.save(f, np.array([None] * 24, dtype=object), allow_pickle=True)
    with pytest.raises(CheckpointError, match="d2t.npy"):
        Eagle3DraftHead.load(str(converted_head), max_len=16)


# ----- file kinds -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def upper_case_gguf(tmp_path_factory, hf_src):
    path = tmp_path_factory.mktemp("upper") / "TINY.GGUF"
    write_tiny_gguf(hf_src[1], str(path), tokenizer=True)
    return str(path)


def test_upper_case_gguf_suffix_is_recognised(upper_case_gguf, tmp_path):
    from mindspore_eagle.app import cli
    from mindspore_eagle.tokenizer import BPETokenizer, load_tokenizer

    assert cli.main(["convert", upper_case_gguf, str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "weights.safetensors").is_file()
    assert isinstance(load_tokenizer(upper_case_gguf), BPETokenizer)


def test_gguf_without_its_suffix_is_recognised_by_its_magic_bytes(upper_case_gguf, tmp_path):
    from mindspore_eagle.tokenizer import BPETokenizer, load_tokenizer

    shutil.copyfile(upper_case_gguf, tmp_path / "model.bin")
    assert isinstance(load_tokenizer(tmp_path / "model.bin"), BPETokenizer)


def test_converter_cli_names_a_gguf_given_as_hf_and_a_directory_given_as_gguf(upper_case_gguf, hf_src, tmp_path,
                                                                               capsys):
    from ckpt_convert.__main__ import main

    assert main(["hf", upper_case_gguf, str(tmp_path / "a")]) == 2
    assert "is a GGUF file: convert it with `python -m ckpt_convert gguf" in capsys.readouterr().err
    assert main(["gguf", hf_src[0], str(tmp_path / "b")]) == 2
    assert "is a directory, not a GGUF file" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
