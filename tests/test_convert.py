"""The converter imports sharded / half-precision / GGUF checkpoints exactly, and refuses bad ones loudly
(one CheckpointError naming every bad tensor) without leaving any output behind."""

import json
import os
import shutil

import numpy as np
import pytest

from ckpt_convert import convert_gguf, convert_hf
from mindspore_eagle.errors import CheckpointError, ConfigError
from tests.helpers import TINY, make_hf_checkpoint, write_tiny_gguf


@pytest.fixture(scope="module")
def hf_pangu(tmp_path_factory):
    root = tmp_path_factory.mktemp("conv")
    model = make_hf_checkpoint("pangu", str(root / "hf"), seed=3)
    return str(root / "hf"), model


def _tensors(hf_dir):
    from safetensors.numpy import load_file

    return load_file(os.path.join(hf_dir, "model.safetensors"))


def _rewrite(src_dir, dst_dir, tensors):
    from safetensors.numpy import save_file

    os.makedirs(dst_dir, exist_ok=True)
    shutil.copyfile(os.path.join(src_dir, "config.json"), os.path.join(dst_dir, "config.json"))
    save_file(tensors, os.path.join(dst_dir, "model.safetensors"))


def _converted(out_dir):
    from safetensors.numpy import load_file

    return load_file(os.path.join(out_dir, "weights.safetensors"))


def test_converted_weights_are_transposed_hf_weights(hf_pangu, tmp_path):
    hf_dir, _ = hf_pangu
    convert_hf(hf_dir, str(tmp_path / "out"))
    ours, theirs = _converted(str(tmp_path / "out")), _tensors(hf_dir)
    assert set(ours) == set(theirs)
    for name, arr in theirs.items():
        expect = arr.T if name.endswith("proj.weight") or name == "lm_head.weight" else arr
        np.testing.assert_array_equal(ours[name], expect, err_msg=name)
    cfg = json.load(open(tmp_path / "out" / "config.json"))
    assert cfg["qkv_bias"] and cfg["o_bias"] and cfg["architecture"] == "pangu"


@pytest.mark.parametrize("case", ["missing", "unexpected", "misshaped", "all_three"])
def test_bad_checkpoint_raises_one_error_naming_tensors_and_writes_nothing(hf_pangu, tmp_path, case):
    hf_dir, _ = hf_pangu
    t = dict(_tensors(hf_dir))
    named = []
    if case in ("missing", "all_three"):
        del t["model.layers.1.mlp.up_proj.weight"]
        named.append("model.layers.1.mlp.up_proj.weight")
    if case in ("unexpected", "all_three"):
        t["model.layers.0.self_attn.rogue.weight"] = np.zeros((4, 4), np.float32)
        named.append("model.layers.0.self_attn.rogue.weight")
    if case in ("misshaped", "all_three"):
        t["model.layers.2.self_attn.k_proj.weight"] = np.zeros((3, 64), np.float32)
        named.append("model.layers.2.self_attn.k_proj.weight")
    _rewrite(hf_dir, str(tmp_path / "bad"), t)
    out = tmp_path / "out"
    with pytest.raises(CheckpointError) as err:
        convert_hf(str(tmp_path / "bad"), str(out))
    for name in named:
        assert name in str(err.value)
    assert not out.exists()
    assert [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")] == []


def test_truncated_safetensors_is_refused_without_output(hf_pangu, tmp_path):
    hf_dir, _ = hf_pangu
    bad = tmp_path / "trunc"
    shutil.copytree(hf_dir, bad)
    path = bad / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        convert_hf(str(bad), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_existing_output_is_kept_when_conversion_fails(hf_pangu, tmp_path):
    hf_dir, _ = hf_pangu
    out = tmp_path / "out"
    convert_hf(hf_dir, str(out))
    before = (out / "weights.safetensors").read_bytes()
    t = dict(_tensors(hf_dir))
    del t["model.norm.weight"]
    _rewrite(hf_dir, str(tmp_path / "bad"), t)
    with pytest.raises(CheckpointError, match="model.norm.weight"):
        convert_hf(str(tmp_path / "bad"), str(out), overwrite=True)
    assert (out / "weights.safetensors").read_bytes() == before
    with pytest.raises(CheckpointError, match="already exists"):
        convert_hf(hf_dir, str(out))


def test_sharded_checkpoint_converts_like_single_file(hf_pangu, tmp_path):
    from safetensors.numpy import save_file

    hf_dir, _ = hf_pangu
    t = _tensors(hf_dir)
    names = sorted(t)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    shutil.copyfile(os.path.join(hf_dir, "config.json"), sharded / "config.json")
    weight_map = {}
    for fname, keys in shards.items():
        save_file({k: t[k] for k in keys}, str(sharded / fname))
        weight_map.update({k: fname for k in keys})
    json.dump({"metadata": {}, "weight_map": weight_map}, open(sharded / "model.safetensors.index.json", "w"))
    convert_hf(str(sharded), str(tmp_path / "a"))
    convert_hf(hf_dir, str(tmp_path / "b"))
    a, b = _converted(str(tmp_path / "a")), _converted(str(tmp_path / "b"))
    assert set(a) == set(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_checkpoints_convert_to_their_exact_fp32_values(tmp_path, dtype):
    import torch

    model = make_hf_checkpoint("qwen2", str(tmp_path / "hf"), seed=5, dtype=dtype)
    convert_hf(str(tmp_path / "hf"), str(tmp_path / "out"))
    ours = _converted(str(tmp_path / "out"))
    for name, p in model.named_parameters():
        ref = p.detach().to(getattr(torch, dtype)).float().numpy()
        got = ours[name].T if name.endswith("proj.weight") or name == "lm_head.weight" else ours[name]
        np.testing.assert_array_equal(got, ref, err_msg=name)


def test_unknown_architecture_is_a_config_error(hf_pangu, tmp_path):
    hf_dir, _ = hf_pangu
    bad = tmp_path / "arch"
    shutil.copytree(hf_dir, bad)
    cfg = json.load(open(bad / "config.json"))
    cfg["architectures"] = ["MysteryForCausalLM"]
    json.dump(cfg, open(bad / "config.json", "w"))
    with pytest.raises(ConfigError, match="MysteryForCausalLM"):
        convert_hf(str(bad), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_gguf_import_undoes_llama_cpp_permutation(tmp_path):
    """A GGUF written with llama.cpp's q/k permutation converts back to the HF weights exactly, so our teacher
    reproduces the HF model's logits."""
    model = make_hf_checkpoint("llama", str(tmp_path / "hf_llama"), seed=7)
    write_tiny_gguf(model, str(tmp_path / "tiny.gguf"))
    from mindspore_eagle.convert.readers import read_gguf

    meta, raw = read_gguf(str(tmp_path / "tiny.gguf"))
    from mindspore_eagle.convert.teacher import gguf_to_ours
    from mindspore_eagle.teacher_config import TeacherConfig

    cfg = TeacherConfig.from_gguf_metadata(meta, tied="output.weight" not in raw)
    ours = gguf_to_ours(raw, cfg)
    for name, p in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied: the GGUF has no output.weight
        ref = p.detach().float().numpy()
        got = ours[name].T if name.endswith("proj.weight") else ours[name]
        np.testing.assert_array_equal(got, ref, err_msg=name)


def test_gguf_with_unmapped_tensor_is_refused(tmp_path):
    model = make_hf_checkpoint("llama", str(tmp_path / "hf"), seed=8)
    write_tiny_gguf(model, str(tmp_path / "tiny.gguf"))
    from mindspore_eagle.convert.teacher import gguf_to_ours
    from mindspore_eagle.convert.readers import read_gguf
    from mindspore_eagle.teacher_config import TeacherConfig

    meta, raw = read_gguf(str(tmp_path / "tiny.gguf"))
    raw["blk.0.mystery.weight"] = np.zeros(3, np.float32)
    cfg = TeacherConfig.from_gguf_metadata(meta, tied=True)
    with pytest.raises(CheckpointError, match="blk.0.mystery.weight"):
        gguf_to_ours(raw, cfg)
