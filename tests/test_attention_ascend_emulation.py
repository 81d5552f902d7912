"""The Ascend path without an NPU: the fused attention op's documented contract emulated in numpy.

``emulated_fused_infer_attention_score`` implements what the docs of ``mindspore.ops.fused_infer_attention_score``
specify (BNSD layout, fp16/bf16 q/k/v, GQA by ``num_key_value_heads``, ``atten_mask`` int8/uint8/bool with
1 = discard in one of the documented shapes, ``sparse_mode`` 0/1 with the full mask) and *refuses* any call
outside it. Against it we prove: our tree mask converted to the op's form is exactly ``tree.mask``'s Ascend
mask; the op on that mask computes exactly our additive-mask attention; the fused core, and a whole teacher +
draft built on it, match the reference path and stay lossless. Selecting Ascend on this machine fails with
one clear ``ConfigError``, and the deployment limits (graph mode, 16 query tokens per round, head sizes) are
enforced before anything compiles. What this cannot show: the real kernel's numerics and speed.
"""

from __future__ import annotations

import math
import os

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from mindspore_eagle import attention, deploy
from mindspore_eagle.compute import ComputeChoice
from mindspore_eagle.runtime import RuntimeConfig
from mindspore_eagle.teacher_config import TeacherConfig
from mindspore_eagle.draft_config import TreeBudget
from mindspore_eagle.drafting import DraftingConfig
from mindspore_eagle.errors import ConfigError
from mindspore_eagle.tree import ForwardInputs, TreeLayout, ascend_tree_mask, tree_attention_mask
from mindspore_eagle.tree.mask import MASK_VALUE

ms.set_device("CPU")

CACHE_LEN = 40
LAYOUTS = {  # (tokens, parents); padded ones add rows with valid == False
    "chain": ([5, 6, 7, 8], [0, 0, 1, 2]),
    "bushy": ([5, 6, 7, 8, 9, 10, 11], [0, 0, 0, 1, 1, 2, 4]),
    "root_only": ([5], [0]),
}


def layouts():
    for name, (tokens, parents) in LAYOUTS.items():
        layout = TreeLayout.from_parents(tokens, parents)
        yield name, layout
        if layout.num_nodes < 8:
            yield name + "_padded8", layout.padded(8)


# ----- the op's documented contract, in numpy ---------------------------------------------------------------


def _mask_shapes(b: int, s1: int, s2: int) -> set[tuple[int, ...]]:
    """The documented ``atten_mask`` shapes (Q_S > 1: PromptFlashAttention branch; Q_S == 1: IncreFlashAttention)."""
    if s1 > 1:
        return {(s1, s2), (b, s1, s2), (1, s1, s2), (b, 1, s1, s2), (1, 1, s1, s2)}
    return {(b, s2), (b, 1, s2), (b, 1, 1, s2)}


def fia_float64(q, k, v, mask, num_heads, num_key_value_heads, scale, input_layout="BNSD", sparse_mode=0,
                inner_precise=1):
    """The op's result before the output cast, in float64; raises AssertionError for any call outside the docs."""
    assert input_layout == "BNSD", input_layout
    assert q.dtype == np.float16 and k.dtype == v.dtype == np.float16, (q.dtype, k.dtype, v.dtype)
    b, n, s1, d = q.shape
    b2, n2, s2, d2 = k.shape
    assert (b2, d2) == (b, d) and v.shape == k.shape
    assert num_heads == n, "num_heads must equal the query's N axis (BNSD)"
    kv_heads = num_key_value_heads or n
    assert kv_heads == n2, "num_key_value_heads must equal the key's N axis (BNSD)"
    assert n % n2 == 0 and n // n2 <= 64 and n <= 256 and d <= 512
    if s1 > 1:
        assert d % 16 == 0, "D must be 16-aligned for fp16/bf16"
        assert sparse_mode in (0, 1), "sparse modes 2-4 take a fixed 2048x2048 causal template, not a tree"
    else:
        assert inner_precise in (0, 1)
    assert mask is not None and mask.dtype in (np.bool_, np.uint8, np.int8), None if mask is None else mask.dtype
    assert tuple(mask.shape) in _mask_shapes(b, s1, s2), (mask.shape, _mask_shapes(b, s1, s2))
    assert set(np.unique(mask)) <= {0, 1}
    if mask.ndim == 2:  # (S1, S2), or (B, S2) when S1 == 1
        mask = mask[None, None] if s1 > 1 else mask[:, None, None]
    elif mask.ndim == 3:  # (B|1, S1, S2), or (B, 1, S2) when S1 == 1
        mask = mask[:, None]
    discard = np.broadcast_to(mask, (b, 1, s1, s2)).astype(bool)
    assert not discard.all(-1).any(), "a fully masked row (precision loss per the docs; our masks never have one)"
    rep = n // n2
    out = np.zeros((b, n, s1, d))
    for h in range(n):
        g = h // rep
        scores = scale * (q[:, h].astype(np.float64) @ np.swapaxes(k[:, g].astype(np.float64), -1, -2))
        scores = np.where(discard[:, 0], -np.inf, scores)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        out[:, h] = (p / p.sum(-1, keepdims=True)) @ v[:, g].astype(np.float64)
    return out


def emulated_fused_infer_attention_score(query, key, value, *, atten_mask=None, num_heads=1, scale=1.0,
                                         input_layout="BSH", num_key_value_heads=0, sparse_mode=0, inner_precise=1,
                                         **unused):
    """Drop-in for ``ops.fused_infer_attention_score`` in PyNative: ``(attention_out, softmax_lse)``."""
    assert not {k for k, val in unused.items() if val is not None}, f"unexpected arguments {sorted(unused)}"
    out = fia_float64(query.asnumpy(), key.asnumpy(), value.asnumpy(), atten_mask.asnumpy(), num_heads,
                      num_key_value_heads, scale, input_layout, sparse_mode, inner_precise)
    return Tensor(out.astype(np.float16)), Tensor(np.zeros(1, np.float32))


def additive_attention_float64(q, k, v, additive_mask, scale):
    """Our reference semantics: ``softmax(scale * q k^T + mask) v`` with the additive float mask, GQA."""
    b, n, s1, _ = q.shape
    n2 = k.shape[1]
    out = np.zeros(q.shape)
    for h in range(n):
        g = h // (n // n2)
        scores = scale * (q[:, h].astype(np.float64) @ np.swapaxes(k[:, g].astype(np.float64), -1, -2))
        scores = scores + additive_mask[:, 0].astype(np.float64)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        out[:, h] = (p / p.sum(-1, keepdims=True)) @ v[:, g].astype(np.float64)
    return out


class MaskCell(nn.Cell):
    def construct(self, mask):
        return attention.fused_mask(mask)


# ----- the mask conversion ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,layout", list(layouts()))
@pytest.mark.parametrize("committed_len", [0, 9])
def test_converted_tree_mask_is_tree_mask_ascend_form(name, layout, committed_len):
    additive = tree_attention_mask(layout, committed_len, CACHE_LEN)  # what the teacher receives
    want = ascend_tree_mask(layout, committed_len, CACHE_LEN)  # tree.mask's Ascend convention
    for fn in (MaskCell(), ms.jit(MaskCell())):
        got = fn(Tensor(additive)).asnumpy()
        assert got.dtype == np.uint8 and got.shape == (1, 1, layout.num_nodes, CACHE_LEN)
        np.testing.assert_array_equal(got, want)
    # and a mask already in the op's form passes through unchanged
    np.testing.assert_array_equal(MaskCell()(Tensor(want)).asnumpy(), want)


def test_mask_conversion_example_is_literal():
    # parents [0, 0, 1] at committed_len 2, cache 6: visible (1) / hidden (0) written out, then 1 = masked.
    layout = TreeLayout.from_parents([5, 6, 7], [0, 0, 1])
    visible = np.array([[1, 1, 1, 0, 0, 0],
                        [1, 1, 1, 1, 0, 0],
                        [1, 1, 1, 1, 1, 0]], np.uint8)
    got = MaskCell()(Tensor(tree_attention_mask(layout, 2, 6))).asnumpy()[0, 0]
    np.testing.assert_array_equal(got, 1 - visible)


# ----- the op on the converted mask ---------------------------------------------------------------------------


def _qkv(rng, b=1, n=4, n2=2, s1=7, s2=CACHE_LEN, d=16):
    q = rng.standard_normal((b, n, s1, d)).astype(np.float16)
    k = rng.standard_normal((b, n2, s2, d)).astype(np.float16)
    v = rng.standard_normal((b, n2, s2, d)).astype(np.float16)
    return q, k, v


@pytest.mark.parametrize("name,layout", list(layouts()))
def test_emulated_op_on_converted_mask_equals_additive_attention_exactly(name, layout):
    rng = np.random.default_rng(len(name))
    q, k, v = _qkv(rng, s1=layout.num_nodes)
    additive = tree_attention_mask(layout, 11, CACHE_LEN)
    converted = MaskCell()(Tensor(additive)).asnumpy()
    scale = 1 / math.sqrt(16)
    fused = fia_float64(q, k, v, converted, num_heads=4, num_key_value_heads=2, scale=scale)
    np.testing.assert_array_equal(fused, additive_attention_float64(q, k, v, additive, scale))


def test_fused_core_with_emulated_op_matches_the_reference_core():
    """The FusedAttention Cell (casts, mask conversion, argument names, layout) against ReferenceAttention."""
    rng = np.random.default_rng(0)
    layout = TreeLayout.from_parents([5, 6, 7, 8, 9], [0, 0, 1, 1, 3]).padded(8)
    q, k, v = _qkv(rng, s1=8)
    mask = Tensor(tree_attention_mask(layout, 20, CACHE_LEN))
    fused = attention.make_core(4, 2, 16, attention.AttentionChoice(attention.FUSED,
                                                                     op=emulated_fused_infer_attention_score))
    got = fused(Tensor(q.astype(np.float32)), Tensor(k), Tensor(v), mask).asnumpy()
    ref = attention.make_core(4, 2, 16, attention.AttentionChoice(attention.REFERENCE))
    want = ref(Tensor(q.astype(np.float32)), Tensor(k.astype(np.float32)), Tensor(v.astype(np.float32)), mask).asnumpy()
    assert got.dtype == np.float32 and got.shape == want.shape == (1, 4, 8, 16)
    np.testing.assert_allclose(got, want, atol=2e-3, rtol=2e-3)  # fp16 output rounding only


def test_fused_core_compiles_in_graph_mode_up_to_the_ascend_kernel():
    """Graph mode parses and type-infers the fused call; only kernel selection fails, because CPU has no such kernel."""
    cell = attention.FusedAttention(4, 2, 16)
    q = Tensor(np.zeros((1, 4, 8, 16), np.float32))
    k = Tensor(np.zeros((1, 2, CACHE_LEN, 16), np.float16))
    with pytest.raises(RuntimeError, match="FusedInferAttentionScore"):
        ms.jit(cell)(q, k, k, Tensor(np.zeros((1, 1, 8, CACHE_LEN), np.float32)))


# ----- a teacher and draft on the fused core (emulated), end to end -----------------------------------------


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    from tests.helpers import make_tiny_pair

    return make_tiny_pair(str(tmp_path_factory.mktemp("fused_tiny")), "random")


def test_teacher_on_emulated_fused_attention_is_lossless_and_close_to_reference(tiny_pair):
    from mindspore_eagle.draft import load_proposer
    from mindspore_eagle.engine import SpeculativeEngine
    from mindspore_eagle.teacher import Teacher

    teacher_dir, head_dir = tiny_pair
    runtime = RuntimeConfig(max_cache_len=64, exec_mode="reference", buckets=(1, 8, 16), prefill_chunk=8)
    budget = TreeBudget(max_nodes=6, depth=2, top_k=3)  # PyNative (the emulated op is Python): keep it small
    fused = attention.AttentionChoice(attention.FUSED, op=emulated_fused_infer_attention_score)
    fused_teacher = Teacher.load(teacher_dir, runtime, ComputeChoice(fused))
    proposer = load_proposer(head_dir, fused_teacher, budget)  # the head takes the teacher's compute choice
    layer = fused_teacher.cell.model.layers[0].self_attn
    assert isinstance(layer.core, attention.FusedAttention) and layer.k_cache.dtype == ms.float16
    assert isinstance(proposer.head.midlayer.self_attn.core, attention.FusedAttention)
    ref_teacher = Teacher.load(teacher_dir, runtime, ComputeChoice())  # the primitive reference path
    assert isinstance(ref_teacher.cell.model.layers[0].self_attn.core, attention.ReferenceAttention)

    prompt = [3, 17, 42, 5, 9, 60, 61]
    engine = SpeculativeEngine(fused_teacher)
    greedy = engine.generate(prompt, 5)
    spec = engine.generate(prompt, 5, proposer=proposer)
    assert spec.tokens == greedy.tokens  # lossless on the fused path itself
    assert SpeculativeEngine(ref_teacher).generate(prompt, 5).tokens == greedy.tokens
    inputs = ForwardInputs.for_tree(TreeLayout.chain(prompt), 0, 8, 64)
    logits = [t.forward(inputs).logits for t in (fused_teacher, ref_teacher)]
    np.testing.assert_allclose(logits[0], logits[1], atol=0.05, rtol=0.02)  # fp16 K/V cache and attention


def test_emulated_fused_attention_over_a_context_bucket_equals_the_whole_cache(tiny_pair):
    """The Ascend core reads only a context bucket's rows (key/value ``[B, Hkv, W, D]`` with mask ``[B, 1, T, W]``, a
    documented shape): outputs equal the whole-cache forward's, and generation across buckets stays lossless."""
    from mindspore_eagle.draft import load_proposer
    from mindspore_eagle.engine import SpeculativeEngine
    from mindspore_eagle.teacher import Teacher

    teacher_dir, head_dir = tiny_pair
    widths = []  # the key rows each call of the op attends over

    def op(query, key, value, **kw):
        widths.append(key.shape[2])
        return emulated_fused_infer_attention_score(query, key, value, **kw)

    runtime = RuntimeConfig(max_cache_len=64, exec_mode="reference", buckets=(1, 8, 16), prefill_chunk=8,
                            context_buckets=(16, 32))
    teacher = Teacher.load(teacher_dir, runtime, ComputeChoice(attention.AttentionChoice(attention.FUSED, op=op)))
    assert teacher.mask_widths == (16, 32, 64)
    prompt = [3, 17, 42, 5, 9, 60, 61]
    narrow, full = (teacher.forward(ForwardInputs.for_tree(TreeLayout.chain(prompt), 0, 8, w)) for w in (16, 64))
    layers = teacher.cfg.num_layers
    assert widths == [16] * layers + [64] * layers  # one call per layer
    np.testing.assert_allclose(narrow.logits, full.logits, atol=1e-3, rtol=1e-3)  # fp16 output rounding at most
    assert np.array_equal(np.argmax(narrow.logits, -1), np.argmax(full.logits, -1))

    widths.clear()
    engine = SpeculativeEngine(teacher)
    greedy = engine.generate(prompt, 12)  # rows 0..18: widths 16, then 32
    assert {16, 32} <= set(widths) and 64 not in widths
    proposer = load_proposer(head_dir, teacher, TreeBudget(max_nodes=6, depth=2, top_k=3))
    assert engine.generate(prompt, 12, proposer=proposer).tokens == greedy.tokens


# ----- selecting Ascend here ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def no_ascend():
    probe = deploy.probe_ascend()
    if probe.usable:
        pytest.skip("this machine has an Ascend NPU")
    return probe


def test_selecting_ascend_without_an_npu_fails_with_a_clear_message(no_ascend, tiny_pair):
    with pytest.raises(ConfigError) as err:
        deploy.require_ascend()
    msg = str(err.value)
    assert "device 'Ascend' requested" in msg and "/dev/davinci" in msg and "CANN" in msg and "MindSpore" in msg
    assert "--device CPU" in msg
    from mindspore_eagle.app.build import build

    runtime = RuntimeConfig(max_cache_len=64, device="Ascend", buckets=(1, 8, 16), prefill_chunk=8)
    with pytest.raises(ConfigError, match="no usable Ascend NPU"):
        build(tiny_pair[0], runtime, None, tokenizer=False)
    with pytest.raises(ConfigError, match="no usable Ascend NPU"):
        build(tiny_pair[0], runtime, DraftingConfig(head=tiny_pair[1], max_nodes=8, depth=3, top_k=4), tokenizer=False)
    assert ms.get_context("device_target") == "CPU"  # nothing was switched


def test_fused_core_is_refused_off_ascend():
    with pytest.raises(ConfigError, match="Ascend-only kernel.*device target is 'CPU'"):
        attention.make_core(4, 2, 16, attention.AttentionChoice(attention.FUSED))


def test_backend_follows_device_and_exec_mode():
    assert attention.select_backend("CPU", "performance") == attention.REFERENCE
    assert attention.select_backend("CPU", "reference") == attention.REFERENCE
    assert attention.select_backend("Ascend", "performance") == attention.FUSED
    assert attention.select_backend("Ascend", "reference") == attention.REFERENCE


def test_the_builder_passes_one_attention_choice_to_teacher_and_head(tiny_pair, monkeypatch):
    """No ambient state: the choice ``deploy.prepare`` returns is the one every layer of the teacher and the draft
    head is built with (here a fused choice on the emulated op, forced through ``prepare``)."""
    from mindspore_eagle.app.build import build

    fused = attention.AttentionChoice(attention.FUSED, op=emulated_fused_infer_attention_score)
    monkeypatch.setattr(deploy, "prepare", lambda *a, **k: ComputeChoice(fused))
    runtime = RuntimeConfig(max_cache_len=64, exec_mode="reference", buckets=(1, 8), prefill_chunk=8)
    drafting = DraftingConfig(proposer="eagle", budget="fixed", head=tiny_pair[1], max_nodes=6, depth=2, top_k=3)
    stack = build(tiny_pair[0], runtime, drafting, tokenizer=False)
    assert stack.teacher.compute.attention is fused
    assert all(isinstance(layer.self_attn.core, attention.FusedAttention) for layer in stack.teacher.cell.model.layers)
    head = stack.proposer_for(None).head
    assert isinstance(head.midlayer.self_attn.core, attention.FusedAttention)


# ----- the deployment plan ------------------------------------------------------------------------------------

ASCEND = dict(max_cache_len=256, device="Ascend", buckets=(1, 8, 16, 64), prefill_chunk=64)
TEACHER = TeacherConfig(vocab_size=100, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=8,
                        num_kv_heads=2)


def test_plan_within_limits_passes():
    deploy.check_plan(RuntimeConfig(**ASCEND), DraftingConfig(max_nodes=16, depth=6, top_k=8), TEACHER)


def test_tree_bucket_above_the_query_token_limit_is_refused_by_name():
    runtime = RuntimeConfig(**{**ASCEND, "buckets": (1, 8, 32, 64)})
    with pytest.raises(ConfigError, match=r"tree bucket 32 .*--max-nodes 12\) exceeds max_query_tokens=16"):
        deploy.check_plan(runtime, DraftingConfig(max_nodes=12, depth=4, top_k=4), TEACHER)
    with pytest.raises(ConfigError,
                       match=r"--max-nodes 32 \(the nodes one step verifies\) exceeds max_query_tokens=16"):
        deploy.check_plan(RuntimeConfig(**ASCEND), DraftingConfig(max_nodes=32), TEACHER)
    with pytest.raises(ConfigError, match=r"--top-k 20: each draft growth level"):
        deploy.check_plan(RuntimeConfig(**ASCEND), DraftingConfig(max_nodes=16, depth=2, top_k=20), TEACHER)
    # the limit is configurable
    deploy.check_plan(runtime, DraftingConfig(max_nodes=12, depth=4, top_k=4), TEACHER,
                      deploy.AscendDeployment(max_query_tokens=32))


def test_ascend_is_graph_mode_only():
    with pytest.raises(ConfigError, match="graph mode only"):
        deploy.check_plan(RuntimeConfig(**ASCEND, exec_mode="reference"), DraftingConfig(max_nodes=16))


def test_head_sizes_the_fused_op_cannot_take_are_refused():
    bad = TeacherConfig(vocab_size=100, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=8,
                        num_kv_heads=2)  # head_dim 8
    with pytest.raises(ConfigError, match="TeacherConfig.head_dim=8"):
        deploy.check_plan(RuntimeConfig(**ASCEND), DraftingConfig(max_nodes=16), bad)


def test_cpu_runtimes_are_not_limited():
    deploy.check_plan(RuntimeConfig(max_cache_len=256), DraftingConfig(max_nodes=64), TEACHER)
    assert deploy.prepare(RuntimeConfig(max_cache_len=256)).attention.backend == attention.REFERENCE


def test_compile_cache_settings_get_one_directory_per_rank(tmp_path, monkeypatch):
    for key in ("MS_COMPILER_CACHE_ENABLE", "MS_COMPILER_CACHE_PATH"):
        monkeypatch.setenv(key, "")  # recorded, so monkeypatch restores (or removes) them afterwards
    monkeypatch.setenv("RANK_ID", "3")
    path = deploy.enable_compile_cache(str(tmp_path / "cc"))
    assert path == str(tmp_path / "cc" / "rank_3") and os.path.isdir(path)
    assert os.environ["MS_COMPILER_CACHE_ENABLE"] == "1" and os.environ["MS_COMPILER_CACHE_PATH"] == path


def test_deploy_check_command_names_the_bucket(capsys):
    assert deploy.main(["check", "--buckets", "1,8,32,64", "--max-nodes", "12", "--top-k", "4"]) == 2
    assert "tree bucket 32" in capsys.readouterr().err
    assert deploy.main(["check", "--buckets", "1,8,16,64", "--max-nodes", "16"]) == 0
    assert "plan ok" in capsys.readouterr().out


def test_masked_value_convention_is_the_one_in_tree_mask():
    # the in-graph conversion keys on the sign: MASK_VALUE must stay negative and visible entries exactly 0
    assert MASK_VALUE < 0
    got = MaskCell()(Tensor(np.array([[0.0, float(MASK_VALUE), 0.0]], np.float32))).asnumpy()
    np.testing.assert_array_equal(got, [[0, 1, 0]])
