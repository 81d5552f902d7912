"""Bad requests and bad model directories fail with typed errors before anything runs, and the teacher
stays usable afterwards."""

import os
import shutil

import numpy as np
import pytest

from mindspore_eagle.runtime import RuntimeConfig
from mindspore_eagle.engine import greedy_generate
from mindspore_eagle.errors import CacheCapacityError, CheckpointError, ConfigError
from mindspore_eagle.teacher import Teacher
from mindspore_eagle.tree import ForwardInputs, TreeLayout
from tests.helpers import torch_greedy

RT = RuntimeConfig(max_cache_len=64, buckets=(1, 8, 16), prefill_chunk=16, exec_mode="reference")


@pytest.fixture(scope="module")
def tiny(hf_tiny):
    _, ms_dir, torch_model = hf_tiny("llama")
    return Teacher.load(ms_dir, RT), torch_model, ms_dir


def test_bad_requests_raise_typed_errors_and_teacher_stays_usable(tiny):
    teacher, torch_model, _ = tiny
    with pytest.raises(ConfigError, match="empty prompt"):
        greedy_generate(teacher, [], 4)
    with pytest.raises(CacheCapacityError, match="prompt of 64 tokens"):
        greedy_generate(teacher, [1] * 64, 4)
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        greedy_generate(teacher, [1, 500], 4)
    with pytest.raises(ConfigError, match="max_new_tokens=0"):
        greedy_generate(teacher, [1, 2], 0)
    ok = greedy_generate(teacher, [5, 6, 7], 6)
    assert list(ok.tokens) == torch_greedy(torch_model, [5, 6, 7], 6)


def test_generation_stops_at_a_full_cache_with_tokens_so_far(tiny):
    teacher, torch_model, _ = tiny
    prompt = list(range(1, 61))  # 60 of 64 rows
    res = greedy_generate(teacher, prompt, 50)
    assert res.stop_reason == "cache_full"
    assert len(res.tokens) == 5  # rows 60..63 hold 4 generated tokens; the 5th is known but not written
    assert list(res.tokens) == torch_greedy(torch_model, prompt, 5)


def test_generation_stops_at_eos(tiny):
    teacher, torch_model, _ = tiny
    ref = torch_greedy(torch_model, [9, 8, 7], 10)
    eos = ref[3]
    res = greedy_generate(teacher, [9, 8, 7], 10, eos_token_ids=[eos])
    assert res.stop_reason == "eos" and list(res.tokens) == ref[: ref.index(eos) + 1]


def test_forward_refuses_inputs_built_for_another_runtime(tiny):
    teacher, _, _ = tiny
    other = ForwardInputs.for_tree(TreeLayout.single(1), 0, 1, 128)  # a mask over 128 rows; this cache has 64
    with pytest.raises(ConfigError, match="max_cache_len=64"):
        teacher.forward(other)


def test_loading_a_checkpoint_that_does_not_match_the_config_names_the_tensors(tiny, tmp_path):
    import json

    _, _, ms_dir = tiny
    bad = tmp_path / "bad"
    shutil.copytree(ms_dir, bad)
    cfg = json.load(open(bad / "config.json"))
    cfg["intermediate_size"] = 80
    json.dump(cfg, open(bad / "config.json", "w"))
    with pytest.raises(CheckpointError, match="mlp.up_proj.weight: got \\(64, 96\\), expected \\(64, 80\\)"):
        Teacher.load(str(bad), RT)
    os.remove(bad / "weights.safetensors")
    with pytest.raises(CheckpointError, match="not found"):
        Teacher.load(str(bad), RT)


def test_weights_load_one_tensor_at_a_time_without_mindspore_ckpt_reader(tiny, tmp_path, monkeypatch):
    """MindSpore's ``load_checkpoint`` refuses files larger than the machine's free memory; our loader never
    calls it. A truncated weights file is a CheckpointError naming the file, and an old ``model.ckpt``
    directory says to convert again."""
    import mindspore as ms

    from mindspore_eagle.storage.checkpoint import CKPT_NAME

    _, _, ms_dir = tiny

    def refuse(*a, **k):
        raise AssertionError("ms.load_checkpoint must not be used")

    monkeypatch.setattr(ms, "load_checkpoint", refuse)
    Teacher.load(ms_dir, RT)
    bad = tmp_path / "bad"
    shutil.copytree(ms_dir, bad)
    data = (bad / CKPT_NAME).read_bytes()
    (bad / CKPT_NAME).write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=CKPT_NAME):
        Teacher.load(str(bad), RT)
    os.replace(bad / CKPT_NAME, bad / "model.ckpt")
    with pytest.raises(CheckpointError, match="convert the model again"):
        Teacher.load(str(bad), RT)
