"""A trained head exported in the public EAGLE-3 format loads back through ``ckpt_convert.eagle3`` bit-exactly."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from mindspore_eagle.draft_config import DraftConfig
from mindspore_eagle.train.vocab import DraftVocab

CFG = DraftConfig(hidden_size=32, intermediate_size=48, num_heads=4, num_kv_heads=2, vocab_size=50,
                  draft_vocab_size=20, target_hidden_size=32, rms_norm_eps=1e-5, rope_theta=10000.0,
                  aux_layer_ids=(1, 2, 3))


def _head(seed=0):
    from mindspore import Tensor

    from mindspore_eagle.models.eagle3 import Eagle3DraftHead

    head = Eagle3DraftHead(CFG, 1, 8)
    rng = np.random.default_rng(seed)
    for p in head.weight_parameters().values():
        p.set_data(Tensor(rng.normal(0, 1, p.shape).astype(np.float32)))
    vocab = DraftVocab.from_target_ids(rng.choice(50, 20, replace=False), 50)
    head.set_vocab_map(vocab.d2t, vocab.t2d)
    return head, vocab


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_exported_head_round_trips_through_the_converter(tmp_path, dtype):
    from mindspore_eagle.convert.eagle3 import convert_eagle3
    from mindspore_eagle.models.eagle3 import Eagle3DraftHead
    from mindspore_eagle.train.export import export_head

    head, vocab = _head()
    weights = {n: p.asnumpy() for n, p in head.weight_parameters().items()}
    export_head(str(tmp_path / "pub"), CFG, weights, vocab.d2t, vocab.t2d, dtype=dtype)
    assert sorted(os.listdir(tmp_path / "pub")) == ["config.json", "model.safetensors"]
    cfg = convert_eagle3(str(tmp_path / "pub"), str(tmp_path / "ours"))
    assert cfg == CFG
    back = Eagle3DraftHead.load(str(tmp_path / "ours"), 1, 8)
    for name, w in weights.items():
        expect = w if dtype == "float32" else w.astype(np.float16).astype(np.float32)
        got = back.weight_parameters()[name].asnumpy()
        assert got.dtype == np.float32 and np.array_equal(got, expect), name
    assert np.array_equal(back.d2t.asnumpy(), vocab.d2t) and np.array_equal(back.t2d, vocab.t2d)


def test_exported_names_and_config_are_the_public_ones(tmp_path):
    from safetensors.numpy import load_file

    from mindspore_eagle.train.export import export_head

    head, vocab = _head()
    weights = {n: p.asnumpy() for n, p in head.weight_parameters().items()}
    export_head(str(tmp_path / "pub"), CFG, weights, vocab.d2t, vocab.t2d)
    t = load_file(str(tmp_path / "pub" / "model.safetensors"))
    assert t["fc.weight"].shape == (32, 96)  # HF [out, in]
    assert t["lm_head.weight"].shape == (20, 32)
    assert t["d2t"].dtype == np.int64 and t["t2d"].dtype == np.bool_
    assert {"midlayer.self_attn.q_proj.weight", "midlayer.hidden_norm.weight", "norm.weight"} <= set(t)
    with open(tmp_path / "pub" / "config.json") as f:
        c = json.load(f)
    assert c["architectures"] == ["LlamaForCausalLMEagle3"] and c["draft_vocab_size"] == 20
    assert c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]


@pytest.mark.parametrize("target", [32, 40])
def test_target_hidden_size_is_written_only_when_it_differs_and_both_forms_load(tmp_path, target):
    """Published heads omit ``target_hidden_size`` when the head is as wide as the teacher; SafeAILab EAGLE's loader
    reads the key's presence as "the head holds its own embed_tokens" and otherwise keeps a random table. Our loader
    reads both forms back to the same config."""
    import dataclasses

    from mindspore_eagle.convert.eagle3 import load_hf_config
    from mindspore_eagle.models.eagle3 import expected_head_shapes
    from mindspore_eagle.train.export import export_head

    cfg = dataclasses.replace(CFG, target_hidden_size=target)
    rng = np.random.default_rng(1)
    weights = {n: rng.normal(0, 1, s).astype(np.float32) for n, s in expected_head_shapes(cfg).items()}
    vocab = DraftVocab.from_target_ids(rng.choice(50, 20, replace=False), 50)
    export_head(str(tmp_path / "pub"), cfg, weights, vocab.d2t, vocab.t2d)
    with open(tmp_path / "pub" / "config.json") as f:
        written = json.load(f)
    assert ("target_hidden_size" in written) == (target != CFG.hidden_size)
    assert written.get("target_hidden_size", target) == target
    assert load_hf_config(str(tmp_path / "pub")) == cfg
    written["target_hidden_size"] = target  # the other form: the key present even when equal (our older exports)
    with open(tmp_path / "pub" / "config.json", "w") as f:
        json.dump(written, f)
    assert load_hf_config(str(tmp_path / "pub")) == cfg


def test_the_shipped_head_config_is_in_the_published_form():
    """Other stacks (SafeAILab EAGLE) read a ``target_hidden_size`` key as "this head holds its own embedding" and
    otherwise keep a random one: the shipped head writes it only when it differs from ``hidden_size``."""
    from mindspore_eagle.draft import default_head_dir

    with open(os.path.join(default_head_dir(), "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    assert cfg.get("target_hidden_size", cfg["hidden_size"]) == cfg["hidden_size"]
    assert "target_hidden_size" not in cfg
    assert DraftConfig.from_dict(cfg).target_hidden_size == cfg["hidden_size"]
