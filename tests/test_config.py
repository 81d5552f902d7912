"""Configs are validated where they enter: every invalid value is a ConfigError naming the field."""

import dataclasses

import pytest

from mindspore_eagle.runtime import Buckets, ExecMode, RuntimeConfig
from mindspore_eagle.teacher_config import TeacherConfig
from mindspore_eagle.errors import ConfigError

BASE = dict(vocab_size=100, hidden_size=64, intermediate_size=96, num_layers=4, num_heads=4, num_kv_heads=2)


def test_defaults_derive_head_dim_and_eagle3_taps():
    cfg = TeacherConfig(**BASE)
    assert cfg.head_dim == 16
    assert cfg.aux_layer_ids == (2, 2, 1)  # (2, n//2, n-3) for n = 4
    assert TeacherConfig(**{**BASE, "num_layers": 30}).aux_layer_ids == (2, 15, 27)


@pytest.mark.parametrize("field,value,needle", [
    ("vocab_size", 0, "vocab_size=0"),
    ("num_heads", 3, "num_heads=3"),  # 64 % 3 != 0
    ("num_kv_heads", 3, "num_kv_heads=3"),  # 4 % 3 != 0
    ("rms_norm_eps", 0.0, "rms_norm_eps"),
    ("architecture", "gpt2", "architecture='gpt2'"),
    ("aux_layer_ids", (0, 1, 9), "layer 9"),
    ("eos_token_ids", (100,), "special token id 100"),
])
def test_invalid_teacher_config_names_the_field(field, value, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        TeacherConfig(**{**BASE, field: value})


def test_configs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        TeacherConfig(**BASE).vocab_size = 5


def _hf(arch, **extra):
    return {"architectures": [arch], "vocab_size": 100, "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, **extra}


def test_hf_dicts_select_the_bias_layout_of_each_family():
    pangu = TeacherConfig.from_hf_dict(_hf("PanguEmbeddedForCausalLM", bias=True))
    qwen = TeacherConfig.from_hf_dict(_hf("Qwen2ForCausalLM"))
    llama = TeacherConfig.from_hf_dict(_hf("LlamaForCausalLM"))
    assert (pangu.qkv_bias, pangu.o_bias) == (True, True)
    assert (qwen.qkv_bias, qwen.o_bias) == (True, False)
    assert (llama.qkv_bias, llama.o_bias) == (False, False)


def test_hf_dict_errors_are_config_errors():
    with pytest.raises(ConfigError, match="GPTNeoXForCausalLM"):
        TeacherConfig.from_hf_dict(_hf("GPTNeoXForCausalLM"))
    d = _hf("LlamaForCausalLM")
    del d["hidden_size"]
    with pytest.raises(ConfigError, match="hidden_size"):
        TeacherConfig.from_hf_dict(d)
    with pytest.raises(ConfigError, match="gelu"):
        TeacherConfig.from_hf_dict(_hf("LlamaForCausalLM", hidden_act="gelu"))
    with pytest.raises(ConfigError, match="yarn"):
        TeacherConfig.from_hf_dict(_hf("LlamaForCausalLM", rope_scaling={"rope_type": "yarn", "factor": 2.0}))


def test_our_config_round_trips_through_dict():
    cfg = TeacherConfig.from_hf_dict(_hf("LlamaForCausalLM", rope_scaling={"rope_type": "llama3", "factor": 8.0}))
    assert TeacherConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("kwargs,needle", [
    (dict(max_cache_len=0), "max_cache_len=0"),
    (dict(exec_mode="fast"), "exec_mode='fast'"),
    (dict(device="GPU"), "device='GPU'"),
    (dict(buckets=(8, 16)), "must contain 1"),
    (dict(prefill_chunk=12), "prefill_chunk=12"),
    (dict(max_cache_len=32), "exceeds max_cache_len=32"),
])
def test_invalid_runtime_config_names_the_field(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        RuntimeConfig(**kwargs)


def test_the_runtime_buckets_pick_the_smallest_fitting_size():
    rt = RuntimeConfig()
    assert [rt.buckets.fit(n) for n in (1, 2, 3, 5, 8, 9, 64)] == [1, 2, 4, 8, 8, 16, 64]
    with pytest.raises(ConfigError, match="largest bucket 64"):
        rt.buckets.fit(65)


def test_a_tree_budget_larger_than_the_buckets_is_refused_naming_both():
    rt = RuntimeConfig(buckets=(1, 8, 16), prefill_chunk=16)
    assert rt.check_tree_size(9) == 16
    with pytest.raises(ConfigError, match=r"TreeBudget.max_nodes=32 does not fit RuntimeConfig.buckets=\(1, 8, 16\)"):
        rt.check_tree_size(32)


def test_exec_mode_is_parsed_once_into_the_enum():
    assert RuntimeConfig(exec_mode="reference").exec_mode is ExecMode.REFERENCE
    assert RuntimeConfig(exec_mode=ExecMode.PERFORMANCE).reference is False
    assert RuntimeConfig(buckets=Buckets.parse("16,1,8"), prefill_chunk=16).buckets.sizes == (1, 8, 16)
    with pytest.raises(ConfigError, match="comma-separated integers"):
        Buckets.parse("1,x")


def test_context_buckets_default_to_powers_of_two_up_to_the_cache_and_are_validated_where_they_enter():
    assert RuntimeConfig().context_sizes == (128, 256, 512, 1024)
    assert RuntimeConfig(max_cache_len=160, buckets=(1, 8), prefill_chunk=8).context_sizes == (128, 160)
    assert RuntimeConfig(max_cache_len=100, buckets=(1, 8), prefill_chunk=8).context_sizes == (100,)
    given = RuntimeConfig(context_buckets=[512, 64, 64])
    assert given.context_buckets == (64, 512) and given.context_sizes == (64, 512, 1024)  # the whole cache added
    assert RuntimeConfig(context_buckets=(1024,)).context_sizes == (1024,)  # bucketing off
    for bad, match in (([], "non-empty sequence of integers"), ((True,), "integers"), ((64.0,), "integers"),
                       ("128", "integers"), ((0, 128), r"\[0\] outside \[1, max_cache_len=1024\]"),
                       ((128, 2048), r"\[2048\] outside")):
        with pytest.raises(ConfigError, match=f"RuntimeConfig.context_buckets=.*{match}"):
            RuntimeConfig(context_buckets=bad)


def test_greedy_output_reduces_on_the_device_and_on_the_host_for_the_cpu():
    assert RuntimeConfig().greedy_kind == "logits"  # CPU: np.argmax on the host is the cheaper reduction
    assert RuntimeConfig(device="Ascend").greedy_kind == "argmax"  # a device: only ids cross to the host
    assert RuntimeConfig(greedy_output="argmax").greedy_kind == "argmax"
    assert RuntimeConfig(device="Ascend", greedy_output="logits").greedy_kind == "logits"
    with pytest.raises(ConfigError, match="RuntimeConfig.greedy_output='ids'"):
        RuntimeConfig(greedy_output="ids")
