"""Importing published EAGLE-3 heads: exact round trip of the public layout, and the foundation converter's
strictness (one CheckpointError naming every bad tensor, nothing written, existing output kept)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from ckpt_convert import convert_eagle3
from ckpt_convert.__main__ import main as cli_main
from mindspore_eagle.draft_config import DraftConfig
from mindspore_eagle.draft import load_head
from mindspore_eagle.errors import AssetError, CheckpointError, ConfigError
from mindspore_eagle.models.eagle3 import Eagle3DraftHead
from mindspore_eagle.teacher import setup_mindspore

from tests.helpers import PUBLIC_CONFIGS, public_tensors, write_public_head

setup_mindspore()

MAPPED = PUBLIC_CONFIGS["mapped"]


def assert_nothing_written(tmp_path, out):
    assert not out.exists()
    assert [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")] == []


@pytest.mark.parametrize("name", sorted(PUBLIC_CONFIGS))
def test_round_trip_keeps_every_weight_and_the_vocabulary_map(tmp_path, name):
    c = PUBLIC_CONFIGS[name]
    t = write_public_head(str(tmp_path / "src"), c, seed=3)
    cfg = convert_eagle3(str(tmp_path / "src"), str(tmp_path / "out"))
    assert cfg == DraftConfig.load(str(tmp_path / "out"))
    head = Eagle3DraftHead.load(str(tmp_path / "out"), max_len=16)
    params = head.weight_parameters()
    expected = {k for k in t if k not in ("d2t", "t2d", "embed_tokens.weight")}
    if head.own_embedding:
        expected.add("embed_tokens.weight")  # a head narrower than its teacher keeps its own embeddings
    assert set(params) == expected
    for k, p in params.items():
        src = t[k].T if p.ndim == 2 and k != "embed_tokens.weight" else t[k]
        np.testing.assert_array_equal(p.asnumpy(), src, err_msg=k)
    mapped = cfg.draft_vocab_size < cfg.vocab_size
    assert os.path.isfile(tmp_path / "out" / "d2t.npy") == mapped
    if mapped:
        np.testing.assert_array_equal(np.load(tmp_path / "out" / "d2t.npy"), t["d2t"])
        np.testing.assert_array_equal(np.load(tmp_path / "out" / "t2d.npy"), t["t2d"])
        assert np.load(tmp_path / "out" / "t2d.npy").dtype == np.bool_


def test_public_config_keys_become_the_draft_config():
    cfg = DraftConfig.from_hf_dict(PUBLIC_CONFIGS["wide_teacher"])
    shape = (cfg.hidden_size, cfg.target_hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads)
    assert shape == (32, 40, 16, 4, 1)
    assert cfg.attention_bias and not cfg.has_vocab_map and cfg.rope_theta == 50000.0
    cfg = DraftConfig.from_hf_dict(dict(MAPPED, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 3, 5]}))
    assert cfg.target_hidden_size == 32 and cfg.has_vocab_map and cfg.aux_layer_ids == (1, 3, 5)
    assert DraftConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("case", ["missing", "unexpected", "misshaped", "all_three"])
def test_bad_checkpoint_raises_one_error_naming_tensors_and_writes_nothing(tmp_path, case):
    t = public_tensors(MAPPED, seed=4)
    named = []
    if case in ("missing", "all_three"):
        del t["midlayer.hidden_norm.weight"], t["d2t"]
        named += ["midlayer.hidden_norm.weight", "d2t"]
    if case in ("unexpected", "all_three"):
        t["midlayer.self_attn.rogue.weight"] = np.zeros((4, 4), np.float32)
        named.append("midlayer.self_attn.rogue.weight")
    if case in ("misshaped", "all_three"):
        t["fc.weight"] = np.zeros((32, 64), np.float32)  # in-dim must be 3 * H_t = 96
        named.append("fc.weight: got (64, 32), expected (96, 32)")
    write_public_head(str(tmp_path / "bad"), MAPPED, tensors=t)
    out = tmp_path / "out"
    with pytest.raises(CheckpointError) as err:
        convert_eagle3(str(tmp_path / "bad"), str(out))
    for name in named:
        assert name in str(err.value)
    assert_nothing_written(tmp_path, out)


@pytest.mark.parametrize("fault, message", [
    ("d2t_out_of_range", "outside the vocabulary"),
    ("d2t_duplicate", "same target id"),
    ("t2d_inconsistent", "t2d does not mark exactly"),
])
def test_inconsistent_vocabulary_map_is_refused(tmp_path, fault, message):
    t = public_tensors(MAPPED, seed=5)
    if fault == "d2t_out_of_range":
        t["d2t"][-1] = MAPPED["vocab_size"]
    elif fault == "d2t_duplicate":
        t["d2t"][1] = t["d2t"][0] - 1  # draft ids 0 and 1 both map to target id 0 + d2t[0]
    else:
        t["t2d"][np.flatnonzero(~t["t2d"])[0]] = True
    write_public_head(str(tmp_path / "bad"), MAPPED, tensors=t)
    with pytest.raises(CheckpointError, match=message):
        convert_eagle3(str(tmp_path / "bad"), str(tmp_path / "out"))
    assert_nothing_written(tmp_path, tmp_path / "out")


def test_known_extras_are_dropped_but_a_needed_own_embedding_is_required(tmp_path):
    wide = PUBLIC_CONFIGS["wide_teacher"]
    t = public_tensors(wide, seed=6)
    t["midlayer.self_attn.rotary_emb.inv_freq"] = np.ones(8, np.float32)
    write_public_head(str(tmp_path / "ok"), wide, tensors=dict(t))
    convert_eagle3(str(tmp_path / "ok"), str(tmp_path / "out_ok"))  # inv_freq, d2t/t2d (no map) dropped
    del t["embed_tokens.weight"]
    write_public_head(str(tmp_path / "bad"), wide, tensors=t)
    with pytest.raises(CheckpointError, match="missing 1: \\['embed_tokens.weight'\\]"):
        convert_eagle3(str(tmp_path / "bad"), str(tmp_path / "out"))


def test_half_precision_safetensors_convert_to_float32(tmp_path):
    t = public_tensors(MAPPED, seed=7)
    half = {k: (v.astype(np.float16) if v.dtype == np.float32 else v) for k, v in t.items()}
    write_public_head(str(tmp_path / "src"), MAPPED, tensors=half)
    convert_eagle3(str(tmp_path / "src"), str(tmp_path / "out"))
    head = Eagle3DraftHead.load(str(tmp_path / "out"), max_len=16)
    np.testing.assert_array_equal(head.lm_head.weight.asnumpy(), t["lm_head.weight"].astype(np.float16).T)


def test_pytorch_bin_converts_like_safetensors(tmp_path):
    torch = pytest.importorskip("torch")
    t = public_tensors(MAPPED, seed=8)
    os.makedirs(tmp_path / "bin")
    with open(tmp_path / "bin" / "config.json", "w") as f:
        json.dump(MAPPED, f)
    torch.save({k: torch.from_numpy(v.copy()) for k, v in t.items()}, tmp_path / "bin" / "pytorch_model.bin")
    write_public_head(str(tmp_path / "st"), MAPPED, tensors=t)
    convert_eagle3(str(tmp_path / "bin"), str(tmp_path / "out_bin"))
    convert_eagle3(str(tmp_path / "st"), str(tmp_path / "out_st"))
    a = Eagle3DraftHead.load(str(tmp_path / "out_bin"), max_len=16).weight_parameters()
    b = Eagle3DraftHead.load(str(tmp_path / "out_st"), max_len=16).weight_parameters()
    for k in a:
        np.testing.assert_array_equal(a[k].asnumpy(), b[k].asnumpy(), err_msg=k)
    np.testing.assert_array_equal(np.load(tmp_path / "out_bin" / "d2t.npy"), t["d2t"])


@pytest.mark.parametrize("change, field", [
    (dict(num_hidden_layers=2), "num_hidden_layers"),
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(draft_vocab_size=61), "draft_vocab_size"),
    (dict(num_key_value_heads=3), "num_kv_heads"),
    (dict(fc_norm=True), "fc_norm"),
])
def test_unsupported_or_invalid_config_names_the_key(tmp_path, change, field):
    write_public_head(str(tmp_path / "src"), dict(MAPPED, **change), tensors=public_tensors(MAPPED))
    with pytest.raises(ConfigError, match=field):
        convert_eagle3(str(tmp_path / "src"), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_missing_required_key_and_missing_files_are_named(tmp_path):
    c = dict(MAPPED)
    del c["intermediate_size"]
    write_public_head(str(tmp_path / "nokey"), c, tensors=public_tensors(MAPPED))
    with pytest.raises(ConfigError, match="intermediate_size"):
        convert_eagle3(str(tmp_path / "nokey"), str(tmp_path / "out"))
    os.makedirs(tmp_path / "empty")
    with pytest.raises(CheckpointError, match="no config.json"):
        convert_eagle3(str(tmp_path / "empty"), str(tmp_path / "out"))
    with open(tmp_path / "empty" / "config.json", "w") as f:
        json.dump(MAPPED, f)
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        convert_eagle3(str(tmp_path / "empty"), str(tmp_path / "out"))


def test_existing_output_is_kept_and_cli_reports_errors(tmp_path, capsys):
    write_public_head(str(tmp_path / "src"), MAPPED, seed=9)
    out = tmp_path / "out"
    assert cli_main(["eagle3", str(tmp_path / "src"), str(out)]) == 0
    before = (out / "weights.safetensors").read_bytes()
    t = public_tensors(MAPPED, seed=9)
    del t["norm.weight"]
    write_public_head(str(tmp_path / "bad"), MAPPED, tensors=t)
    assert cli_main(["eagle3", str(tmp_path / "bad"), str(out), "--overwrite"]) == 2
    assert "CheckpointError" in capsys.readouterr().err
    assert (out / "weights.safetensors").read_bytes() == before
    with pytest.raises(CheckpointError, match="already exists"):
        convert_eagle3(str(tmp_path / "src"), str(out))


def test_a_public_directory_loads_in_memory_like_the_converted_one(tmp_path):
    write_public_head(str(tmp_path / "src"), MAPPED, seed=11)
    convert_eagle3(str(tmp_path / "src"), str(tmp_path / "out"))
    public, ours = load_head(str(tmp_path / "src"), max_len=16), load_head(str(tmp_path / "out"), max_len=16)
    assert public.cfg == ours.cfg
    a, b = public.weight_parameters(), ours.weight_parameters()
    assert set(a) == set(b)
    for k in a:
        np.testing.assert_array_equal(a[k].asnumpy(), b[k].asnumpy(), err_msg=k)
    np.testing.assert_array_equal(public.target_ids(np.arange(24)), ours.target_ids(np.arange(24)))
    t = public_tensors(MAPPED, seed=11)
    del t["lm_head.weight"]
    write_public_head(str(tmp_path / "bad"), MAPPED, tensors=t)
    with pytest.raises(CheckpointError, match="lm_head.weight"):
        load_head(str(tmp_path / "bad"), max_len=16)
    with pytest.raises(AssetError, match="does not exist"):
        load_head(str(tmp_path / "nowhere"), max_len=16)


def test_loading_a_converted_head_is_strict(tmp_path):
    write_public_head(str(tmp_path / "src"), MAPPED, seed=10)
    convert_eagle3(str(tmp_path / "src"), str(tmp_path / "out"))
    os.remove(tmp_path / "out" / "t2d.npy")
    with pytest.raises(CheckpointError, match="vocabulary map is missing"):
        Eagle3DraftHead.load(str(tmp_path / "out"))
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    cfg["intermediate_size"] = 40
    (tmp_path / "out" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="mlp.gate_proj.weight"):
        Eagle3DraftHead.load(str(tmp_path / "out"))
