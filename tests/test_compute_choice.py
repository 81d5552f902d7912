"""``compute.choose`` is the one rule for how the models compute: attention core x matmul x fused CPU layers, per
device, exec mode and whether the custom kernels run here (the table in ``compute``'s docstring).

Kernel availability is set by hand (``kernels.ops.kernel_status`` replaced) so every row of the table is proved on
any machine; no device is touched (``choose`` only decides, ``deploy.prepare`` selects the device).
"""

from __future__ import annotations

import io

import mindspore as ms
import pytest

from mindspore_eagle import attention, deploy
from mindspore_eagle.compute import ComputeChoice, choose
from mindspore_eagle.errors import ConfigError
from mindspore_eagle.kernels import MatmulChoice, build
from mindspore_eagle.kernels import ops as kernel_ops
from mindspore_eagle.runtime import RuntimeConfig

ms.set_device("CPU")
CUSTOM_F32, CUSTOM_BF16 = MatmulChoice("custom", "float32"), MatmulChoice("custom", "bfloat16")
MINDSPORE_F32 = MatmulChoice()


@pytest.fixture
def kernels(monkeypatch):
    """``kernels(True)``: the custom kernels run here (every dtype); ``kernels(False)``: they do not, for a reason."""

    def set_available(available: bool) -> None:
        status = build.KernelStatus(object()) if available else build.KernelStatus(None, "processor lacks AVX-512")
        monkeypatch.setattr(kernel_ops, "kernel_status", lambda dtype: status)

    return set_available


@pytest.mark.parametrize("mode", ["performance", "reference"])
def test_cpu_with_kernels_takes_custom_matmul_reference_attention_and_fused_layers(kernels, mode):
    kernels(True)
    choice = choose(RuntimeConfig(exec_mode=mode))
    assert choice == ComputeChoice(attention.AttentionChoice(attention.REFERENCE), CUSTOM_F32)
    assert choice.fused_layers(64)


def test_runtime_matmul_mindspore_takes_mindspore_matmul_and_no_fused_layers(kernels):
    kernels(True)
    choice = choose(RuntimeConfig(matmul="mindspore"))
    assert choice.matmul == MINDSPORE_F32 and choice.attention.backend == attention.REFERENCE
    assert not choice.fused_layers(64)


def test_bfloat16_with_kernels_takes_the_custom_bf16_matmul(kernels):
    kernels(True)
    for matmul in ("auto", "custom"):
        choice = choose(RuntimeConfig(dtype="bfloat16", matmul=matmul))
        assert choice.matmul == CUSTOM_BF16 and choice.fused_layers(64)


def test_ascend_performance_takes_fused_attention_without_touching_the_device(kernels):
    kernels(True)  # the custom kernels are CPU kernels: Ascend never takes them
    choice = choose(RuntimeConfig(device="Ascend"))
    assert choice == ComputeChoice(attention.AttentionChoice(attention.FUSED, "float16"), MINDSPORE_F32)
    assert not choice.fused_layers(64)
    bf16 = choose(RuntimeConfig(device="Ascend", dtype="bfloat16"), deploy.AscendDeployment(compute_dtype="bfloat16"))
    assert bf16 == ComputeChoice(attention.AttentionChoice(attention.FUSED, "bfloat16"), MINDSPORE_F32)
    assert choose(RuntimeConfig(device="Ascend", exec_mode="reference")).attention.backend == attention.REFERENCE
    assert ms.get_context("device_target") == "CPU"  # choose decided; nothing was selected


@pytest.mark.parametrize("head_dim", [8, 24, 40, 72])
def test_head_dim_not_a_multiple_of_16_takes_no_fused_layers(head_dim):
    custom = ComputeChoice(matmul=CUSTOM_F32)
    assert not custom.fused_layers(head_dim)
    assert custom.fused_layers(head_dim // 8 * 16)  # the same choice with a head size the attention kernel takes


def test_fused_layers_need_custom_matmul_and_reference_attention():
    assert not ComputeChoice().fused_layers(64)  # MindSpore's MatMul: the trainer's and the reference path
    fused_attention = attention.AttentionChoice(attention.FUSED)
    assert not ComputeChoice(fused_attention, CUSTOM_F32).fused_layers(64)  # the Ascend core is not a CPU kernel
    assert ComputeChoice(matmul=CUSTOM_BF16).fused_layers(64)


def test_auto_float32_without_kernels_falls_back_with_a_message(kernels, capsys):
    kernels(False)
    assert choose(RuntimeConfig()) == ComputeChoice()
    err = capsys.readouterr().err
    assert "processor lacks AVX-512" in err and "MindSpore's float32 MatMul" in err and err.count("\n") == 1


@pytest.mark.parametrize("dtype, matmul", [("float32", "custom"), ("bfloat16", "auto"), ("bfloat16", "custom")])
def test_custom_or_bfloat16_without_kernels_is_refused_by_name(kernels, dtype, matmul):
    kernels(False)
    with pytest.raises(ConfigError, match=rf"--dtype {dtype} --matmul {matmul}: .*processor lacks AVX-512.*"
                                          r"--matmul mindspore"):
        choose(RuntimeConfig(dtype=dtype, matmul=matmul))


def test_a_hand_made_choice_runs_as_given_or_falls_back_with_a_message(kernels):
    kernels(True)
    custom = ComputeChoice(matmul=CUSTOM_BF16)
    assert custom.runnable() is custom
    kernels(False)
    log = io.StringIO()
    fused = attention.AttentionChoice(attention.FUSED)
    assert ComputeChoice(fused, CUSTOM_BF16).runnable(log) == ComputeChoice(fused, MINDSPORE_F32)
    assert "processor lacks AVX-512" in log.getvalue()
    plain = ComputeChoice()
    assert plain.runnable() is plain


def test_prepare_on_the_cpu_returns_the_choice_of_choose(kernels):
    for available in (True, False):
        kernels(available)
        runtime = RuntimeConfig(max_cache_len=256)
        assert deploy.prepare(runtime) == choose(runtime)


def test_compute_choice_refuses_what_is_not_a_choice():
    with pytest.raises(ConfigError, match="ComputeChoice.attention='fused': expected an attention.AttentionChoice"):
        ComputeChoice("fused")
    with pytest.raises(ConfigError, match="ComputeChoice.matmul=None: expected a kernels.MatmulChoice"):
        ComputeChoice(matmul=None)
