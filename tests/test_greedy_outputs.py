"""Greedy verification hands the host one token id per row, not the logits: the in-graph argmax keeps numpy's tie
rule (literal ties, NaN, a 49152-wide vocabulary, PyNative and graph), speculation on it is token-identical to
teacher-only greedy decoding from the full logits (primitive path, custom fp32 and bf16 kernels, both execution
modes), and what crosses to the host in a greedy request is ``int32 [1, T]`` ids and features, never ``[T, vocab]``
logits (a sampling request still gets them)."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from mindspore_eagle.cache import BranchableKVCache
from mindspore_eagle.compute import ComputeChoice
from mindspore_eagle.runtime import RuntimeConfig
from mindspore_eagle.engine import SpeculativeEngine
from mindspore_eagle.errors import ConfigError
from mindspore_eagle.kernels import MatmulChoice
from mindspore_eagle.models.outputs import first_argmax
from mindspore_eagle.teacher import ARGMAX, LOGITS, Teacher
from mindspore_eagle.tree import ForwardInputs, TreeLayout
from mindspore_eagle.verify import SamplingParams
from tests.helpers import ScriptedProposer, prefill_committed, require_kernel

RUNTIME = dict(max_cache_len=160, buckets=(1, 8, 16, 32), prefill_chunk=16, greedy_output="argmax")  # the device path
PROMPTS = [[3, 17, 42, 5], [9, 9, 9, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14, 15, 16, 20]]


class ArgmaxCell(nn.Cell):
    def construct(self, x):
        return first_argmax(x)


def literal_ties() -> tuple[np.ndarray, list[int]]:
    """Rows of 8 logits with ties, each with the index numpy picks, written out by hand."""
    nan, inf = np.nan, np.inf
    rows = [([1, 3, 0, 3, 2, 3, 0, 1], 1),  # three equal maxima: the first
            ([5, 5, 5, 5, 5, 5, 5, 5], 0),  # all equal
            ([0, 0, 0, 0, 0, 0, 7, 7], 6),  # tie at the end
            ([-inf] * 7 + [-1], 7),
            ([-inf] * 8, 0),  # nothing but -inf: the first
            ([2, 1, inf, 0, inf, 0, 0, 0], 2),
            ([9, 1, nan, 3, nan, 0, 0, 0], 2),  # a NaN wins over any number: the first NaN
            ([nan] * 8, 0)]
    return np.array([r for r, _ in rows], np.float32), [i for _, i in rows]


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_in_graph_argmax_is_numpys_argmax_on_literal_ties(mode):
    fn = ms.jit(ArgmaxCell()) if mode == "graph" else ArgmaxCell()
    logits, want = literal_ties()
    got = fn(Tensor(logits[None])).asnumpy()  # [1, 8]: leading axes are kept
    assert got.dtype == np.int32 and got.shape == (1, 8)
    assert got[0].tolist() == want == np.argmax(logits, -1).tolist()
    wide = np.random.default_rng(0).integers(0, 3, (16, 49152)).astype(np.float32)  # ~16k-way ties per row
    wide[3, [40000, 49151]] = 9.0
    wide[5, 49151] = 9.0
    got = fn(Tensor(wide)).asnumpy()
    assert np.array_equal(got, np.argmax(wide, -1)) and got[3] == 40000 and got[5] == 49151


@pytest.fixture(scope="module")
def teachers(hf_tiny):
    """(mode, matmul backend, dtype) -> the tiny pangu teacher; and the torch model."""
    _, ms_dir, torch_model = hf_tiny("pangu")
    made = {}

    def get(mode, backend="mindspore", dtype="float32"):
        if backend == "custom":
            require_kernel(dtype)
        if (mode, backend, dtype) not in made:
            made[mode, backend, dtype] = Teacher.load(ms_dir, RuntimeConfig(exec_mode=mode, **RUNTIME),
                                                      ComputeChoice(matmul=MatmulChoice(backend, dtype)))
        return made[mode, backend, dtype]

    return get


def greedy_from_logits(teacher, prompt, n):
    """Teacher-only greedy decoding on the host from the full logits (``np.argmax`` of every step's row)."""
    cache = BranchableKVCache.for_teacher(teacher)
    cache.reset()
    out = prefill_committed(teacher, cache, prompt)
    tokens = [int(np.argmax(out.logits[0, -1]))]
    while len(tokens) < n:
        L = cache.begin_round(1)
        out = teacher.forward(ForwardInputs.for_tree(TreeLayout.single(tokens[-1]), L, 1, teacher.max_len), LOGITS)
        cache.commit([0])
        tokens.append(int(np.argmax(out.logits[0, 0])))
    return tokens


@pytest.mark.parametrize("mode,backend,dtype", [("performance", "mindspore", "float32"),
                                                ("performance", "custom", "float32"),
                                                ("performance", "custom", "bfloat16"),
                                                # PyNative, 12 s; the reference path stays in the default
                                                # suite through test_context_buckets' bushy tree
                                                pytest.param("reference", "mindspore", "float32",
                                                             marks=pytest.mark.slow)])
def test_speculation_on_in_graph_argmax_equals_greedy_from_full_logits(teachers, mode, backend, dtype):
    teacher = teachers(mode, backend, dtype)
    n = 24 if mode == "performance" else 10  # PyNative is slow
    for prompt in PROMPTS if mode == "performance" else PROMPTS[:1]:
        want = greedy_from_logits(teacher, prompt, n + 8)
        engine = SpeculativeEngine(teacher)
        assert list(engine.generate(prompt, n).tokens) == want[:n]  # teacher only, argmax path
        for draft in ("oracle", "bushy", "wrong"):
            proposer = ScriptedProposer(teacher.cfg.vocab_size, depth=4, mode=draft)
            proposer.future = want
            assert list(engine.generate(prompt, n, proposer=proposer).tokens) == want[:n], draft


class Recorder:
    """Stands in for one compiled teacher graph: calls it and records the shape and dtype of each output."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __call__(self, *args):
        outs = self.fn(*args)
        self.calls.append([(tuple(o.shape), o.dtype) for o in outs])
        return outs


def test_greedy_verification_hands_the_host_token_ids_not_logits(teachers, monkeypatch):
    teacher = teachers("performance")
    v, h3 = teacher.cfg.vocab_size, 3 * teacher.cfg.hidden_size
    rec = {kind: Recorder(fn) for kind, fn in teacher._fns.items()}
    monkeypatch.setattr(teacher, "_fns", rec)
    outs = []
    forward = teacher.forward
    monkeypatch.setattr(teacher, "forward", lambda inputs, output=LOGITS, logit_rows=None:
                        outs.append(forward(inputs, output, logit_rows)) or outs[-1])
    prompt = PROMPTS[1]
    proposer = ScriptedProposer(v, depth=4, mode="bushy")
    proposer.future = greedy_from_logits(teachers("performance"), prompt, 20)  # through the recorders: cleared next
    rec[LOGITS].calls.clear()
    outs.clear()
    gen = SpeculativeEngine(teacher).generate(prompt, 12, proposer=proposer)
    assert list(gen.tokens) == proposer.future[:12] and gen.cycles >= 3
    assert rec[LOGITS].calls == []  # the logits graph never ran
    buckets = teacher.runtime.buckets.sizes
    assert len(rec[ARGMAX].calls) == len(outs) == 2 + gen.cycles  # prefill (16 + 3 tokens) and one per cycle
    for call in rec[ARGMAX].calls:  # exactly what left the graph
        (ids_shape, ids_dtype), (aux_shape, _) = call
        t = ids_shape[1]
        assert t in buckets and ids_shape == (1, t) and ids_dtype == ms.int32 and aux_shape == (1, t, h3)
        assert not any(v in shape for shape, _ in call)
    for out in outs:
        assert out.logits is None and out.argmax.dtype == np.int32 and out.argmax.shape == out.aux_hidden.shape[:2]

    rec[ARGMAX].calls.clear()
    SpeculativeEngine(teacher).generate(prompt, 4, sampling=SamplingParams(temperature=0.8, seed=1))
    assert rec[ARGMAX].calls == [] and all(call[0][0][-1] == v for call in rec[LOGITS].calls)  # sampling: logits


def test_an_unknown_output_kind_is_refused_before_the_graph_runs(teachers):
    teacher = teachers("performance")
    inputs = ForwardInputs.for_tree(TreeLayout.single(1), 0, 1, teacher.max_len)
    with pytest.raises(ConfigError, match=r"output='probs'.*\('logits', 'argmax'\)"):
        teacher.forward(inputs, "probs")


def test_on_the_cpu_greedy_takes_the_logits_and_numpys_argmax_and_stays_lossless(hf_tiny, monkeypatch):
    """``greedy_output="auto"`` on the CPU where the teacher has no greedy Q8 head (MindSpore's MatMul, the path of a
    CPU without custom kernels; the kernels' Q8, fp32 and bf16 heads take it, tests/test_greedy_head.py): no argmax
    graph runs, and the output is the host-greedy output."""
    _, ms_dir, _ = hf_tiny("pangu")
    teacher = Teacher.load(ms_dir, RuntimeConfig(**dict(RUNTIME, greedy_output="auto", matmul="mindspore")))
    assert teacher.greedy_output == LOGITS and not teacher.cell.greedy_head_ready
    rec = {kind: Recorder(fn) for kind, fn in teacher._fns.items()}
    monkeypatch.setattr(teacher, "_fns", rec)
    prompt = PROMPTS[1]
    want = greedy_from_logits(teacher, prompt, 20)
    proposer = ScriptedProposer(teacher.cfg.vocab_size, depth=4, mode="bushy")
    proposer.future = want
    assert list(SpeculativeEngine(teacher).generate(prompt, 12, proposer=proposer).tokens) == want[:12]
    assert rec[ARGMAX].calls == [] and rec[LOGITS].calls
