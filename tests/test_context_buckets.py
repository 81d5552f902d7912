"""Attention over a context bucket (primitive attention path): a forward attends over the smallest context bucket
holding the committed rows plus its own; its outputs equal the full-width forward's; the graphs a generation
compiles stay within (token buckets x context buckets) and a second generation compiles none; speculation stays
lossless in reference and performance mode; the fused CPU kernels keep the full-width mask."""

from __future__ import annotations

import numpy as np
import pytest

from mindspore_eagle.cache import BranchableKVCache
from mindspore_eagle.compute import ComputeChoice
from mindspore_eagle.runtime import RuntimeConfig
from mindspore_eagle.engine import SpeculativeEngine
from mindspore_eagle.errors import CacheCapacityError, ConfigError
from mindspore_eagle.kernels import MatmulChoice
from mindspore_eagle.teacher import ARGMAX, LOGITS, Teacher
from mindspore_eagle.tree import ForwardInputs, TreeLayout
from tests.helpers import ScriptedProposer, buffers, prefill_committed, require_kernel, torch_greedy

CONTEXT = (32, 64, 128)  # and max_cache_len 160
RUNTIME = dict(max_cache_len=160, buckets=(1, 8, 16, 32), prefill_chunk=16, context_buckets=CONTEXT,
               greedy_output="argmax")  # as on Ascend, where this path runs


@pytest.fixture(scope="module")
def tiny(hf_tiny):
    """mode -> the tiny pangu teacher on MindSpore's MatMul (the primitive attention path); and the torch model."""
    _, ms_dir, torch_model = hf_tiny("pangu")
    made = {}

    def get(mode, **changes):
        key = (mode, tuple(sorted(changes.items())))
        if key not in made:
            made[key] = Teacher.load(ms_dir, RuntimeConfig(exec_mode=mode, **{**RUNTIME, **changes}),
                                     ComputeChoice())
        return made[key]

    return get, torch_model, ms_dir


def test_the_mask_is_as_wide_as_the_smallest_context_bucket_holding_the_rows(tiny):
    get, _, _ = tiny
    teacher = get("performance")
    assert teacher.mask_widths == (32, 64, 128, 160)
    assert [teacher.mask_width(r) for r in (1, 32, 33, 64, 65, 129, 160)] == [32, 32, 64, 64, 128, 160, 160]
    with pytest.raises(CacheCapacityError, match="max_cache_len=160"):
        teacher.mask_width(161)
    inputs = ForwardInputs.for_tree(TreeLayout.single(1), 0, 1, 48)  # not a context bucket: would be a new graph
    with pytest.raises(ConfigError, match=r"takes mask widths \(32, 64, 128, 160\)"):
        teacher.forward(inputs)


@pytest.mark.parametrize("mode", ["reference", "performance"])
def test_a_forward_over_a_context_bucket_equals_the_full_width_forward(tiny, mode):
    """Prefill 40 tokens, then verify a bushy tree at L=40 in a bucket of 16: at width 64 and at the full 160, the
    logits, the argmax, the features and the cache rows written agree."""
    get, _, _ = tiny
    teacher = get(mode)
    cache = BranchableKVCache.for_teacher(teacher)
    cache.reset()
    prefill_committed(teacher, cache, [1 + (7 * i) % 100 for i in range(40)])
    layout = TreeLayout.from_parents([5, 6, 7, 8, 9, 10], [0, 0, 0, 1, 3, 2])
    outs, rows = {}, {}
    for width in (teacher.mask_width(40 + 16), teacher.max_len):
        inputs = ForwardInputs.for_tree(layout, 40, 16, width)  # writes rows [40, 56) again, same values
        outs[width] = (teacher.forward(inputs, LOGITS), teacher.forward(inputs, ARGMAX))
        rows[width] = [b[:, :, 40:56] for b in buffers(cache.pairs)]
    (narrow, full) = (outs[64], outs[160])
    assert narrow[0].logits.shape == full[0].logits.shape == (1, 6, teacher.cfg.vocab_size)
    np.testing.assert_allclose(narrow[0].logits, full[0].logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(narrow[0].aux_hidden, full[0].aux_hidden, rtol=1e-5, atol=1e-5)
    assert np.array_equal(narrow[1].argmax, full[1].argmax)
    assert np.array_equal(narrow[1].argmax, np.argmax(full[0].logits, -1))
    for a, b in zip(rows[64], rows[160]):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_graphs_over_a_generation_stay_within_buckets_times_context_buckets(tiny):
    get, torch_model, _ = tiny
    teacher = get("performance", prefill_chunk=8)  # a fresh teacher: nothing compiled yet
    assert teacher.first_call_s == {}
    prompt = [1 + (3 * i) % 100 for i in range(20)]
    future = torch_greedy(torch_model, prompt, 130)
    proposer = ScriptedProposer(teacher.cfg.vocab_size, depth=4, mode="bushy")  # 9 nodes: bucket 16
    proposer.future = future
    engine = SpeculativeEngine(teacher)
    gen = engine.generate(prompt, 120, proposer=proposer)
    assert list(gen.tokens) == future[:120]
    shapes = set(teacher.first_call_s)  # (output, tokens, width) of every graph compiled
    tokens, widths = teacher.runtime.buckets.sizes, teacher.mask_widths
    assert {o for o, _, _ in shapes} == {ARGMAX}
    assert all(t in tokens and w in widths for _, t, w in shapes)
    assert {w for _, _, w in shapes} == {32, 64, 128, 160}  # the context grew through every bucket
    # prefill: 8 + 8 + 4 rows at width 32; verification: 16 rows at each width, 1 row once the tree no longer fits
    assert shapes <= {(ARGMAX, 8, 32)} | {(ARGMAX, 16, w) for w in widths} | {(ARGMAX, 1, w) for w in widths}
    assert len(shapes) <= len(tokens) * len(widths)
    proposer.future = future
    assert list(engine.generate(prompt, 120, proposer=proposer).tokens) == future[:120]
    assert set(teacher.first_call_s) == shapes  # a second generation compiles nothing new


# PyNative (reference) runs each forward op by op: the bushy tree (partial acceptance, moved rows) keeps the reference
# mode in the default suite, its oracle and wrong drafts (~24 s together) run with the slow tests, and so does the
# performance mode's wrong draft (rejection is also what the bushy tree's partial acceptance exercises).
@pytest.mark.parametrize("mode,draft", [("performance", "oracle"), ("performance", "bushy"),
                                        pytest.param("performance", "wrong", marks=pytest.mark.slow),
                                        ("reference", "bushy"),
                                        pytest.param("reference", "oracle", marks=pytest.mark.slow),
                                        pytest.param("reference", "wrong", marks=pytest.mark.slow)])
def test_speculative_output_equals_greedy_across_context_buckets(tiny, mode, draft):
    get, torch_model, _ = tiny
    teacher = get(mode)
    prompt = [9, 9, 9, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14, 15, 16, 20]  # 19 rows: width 32, then 64
    n = 40 if mode == "performance" else 20
    future = torch_greedy(torch_model, prompt, n + 8)
    proposer = ScriptedProposer(teacher.cfg.vocab_size, depth=4, mode=draft)
    proposer.future = future
    gen = SpeculativeEngine(teacher).generate(prompt, n, proposer=proposer)
    assert list(gen.tokens) == future[:n]
    assert list(SpeculativeEngine(teacher).generate(prompt, n).tokens) == future[:n]
    assert {w for _, _, w in teacher.first_call_s} >= {32, 64}


def test_the_fused_kernels_keep_the_full_width_mask(tiny):
    """The custom kernels read each row's visible span whatever the width: narrower masks would only add graphs."""
    require_kernel("float32")
    _, _, ms_dir = tiny
    teacher = Teacher.load(ms_dir, RuntimeConfig(**RUNTIME), ComputeChoice(matmul=MatmulChoice("custom")))
    assert teacher.cell.fused_attention and teacher.mask_widths == (160,) and teacher.mask_width(3) == 160
    with pytest.raises(ConfigError, match=r"takes mask widths \(160,\)"):
        teacher.forward(ForwardInputs.for_tree(TreeLayout.single(1), 0, 1, 32))


@pytest.mark.slow  # ~45 s on a 2-vCPU Zen 3; graphs staying within buckets x context buckets stays in the default suite
def test_warm_up_compiles_every_context_bucket_a_request_reaches(tiny):
    """Bench and eval time requests after ``harness.warm_up``: no request may pay a compile at a longer context."""
    from mindspore_eagle.app.harness import warm_up

    get, _, _ = tiny
    teacher = get("performance", prefill_chunk=8)
    engine = SpeculativeEngine(teacher)
    warm_up(engine, None, [5, 6, 7], 8)
    compiled = set(teacher.first_call_s)
    used = {t for _, t, _ in compiled}
    assert compiled >= {(ARGMAX, t, w) for t in used for w in teacher.mask_widths if t <= w}
    assert engine.cache.committed_len == 0
    engine.generate([1 + (3 * i) % 100 for i in range(40)], 100)  # contexts 40 .. 140
    assert set(teacher.first_call_s) == compiled
