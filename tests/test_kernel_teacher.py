"""A teacher built with the custom linear kernels: fp32 stays the parity path against transformers, a row's
logits are bit-identical in a 1-token decode and inside a 16-token forward (batch invariance end to end), and
speculative output equals the same teacher's greedy output in fp32 and bf16 (tiny random checkpoints; the
default model is covered by test_kernel_lossless_default.py)."""

from __future__ import annotations

import numpy as np
import pytest
from mindspore import nn

from mindspore_eagle.compute import ComputeChoice
from mindspore_eagle.runtime import RuntimeConfig
from mindspore_eagle.engine import SpeculativeEngine
from mindspore_eagle.kernels import MatmulChoice
from mindspore_eagle.teacher import Teacher
from mindspore_eagle.tree import ForwardInputs, TreeLayout
from tests.helpers import ScriptedProposer, require_kernel

RUNTIME = RuntimeConfig(max_cache_len=160, buckets=(1, 8, 16, 32), prefill_chunk=16)
DTYPES = ("float32", "bfloat16")
KINDS = ("pangu", "llama")  # biases on q/k/v/o and an untied head; no bias and the tied (transposed) head


@pytest.fixture(scope="module")
def kernel_teachers(hf_tiny):
    made = {}

    def get(kind, dtype):
        require_kernel(dtype)
        if (kind, dtype) not in made:
            _, ms_dir, torch_model = hf_tiny(kind)
            teacher = Teacher.load(ms_dir, RUNTIME, ComputeChoice(matmul=MatmulChoice("custom", dtype)))
            made[kind, dtype] = (teacher, torch_model)
        return made[kind, dtype]

    return get


def chain(teacher, ids, start):
    """One forward of ``ids`` as a chain from row ``start``, in the smallest bucket that holds it."""
    bucket = teacher.runtime.buckets.fit(len(ids))
    return teacher.forward(ForwardInputs.for_tree(TreeLayout.chain(list(ids)), start, bucket, teacher.max_len))


@pytest.mark.parametrize("kind", KINDS)
def test_fp32_kernel_teacher_matches_transformers(kernel_teachers, kind):
    import torch

    teacher, torch_model = kernel_teachers(kind, "float32")
    prompt = [int(t) for t in np.random.default_rng(1).integers(0, teacher.cfg.vocab_size, 16)]
    ours = chain(teacher, prompt, 0).logits[0]
    with torch.no_grad():
        ref = torch_model(torch.tensor([prompt])).logits[0].numpy()
    assert np.abs(ours - ref).max() <= 1e-4, np.abs(ours - ref).max()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_row_logits_identical_in_decode_and_in_a_16_token_forward(kernel_teachers, kind, dtype):
    teacher, _ = kernel_teachers(kind, dtype)
    rng = np.random.default_rng(2)
    prefix = rng.integers(0, teacher.cfg.vocab_size, 40)
    tokens = rng.integers(0, teacher.cfg.vocab_size, 16)
    for off in range(0, 40, 16):
        chain(teacher, prefix[off:off + 16], off)
    block = chain(teacher, tokens, 40)  # one forward, bucket 16
    for i in range(16):  # the same tokens one decode at a time (bucket 1), rows 40 + i
        one = chain(teacher, tokens[i:i + 1], 40 + i)
        assert np.array_equal(one.logits[0, 0].view(np.uint32), block.logits[0, i].view(np.uint32)), i
        assert np.array_equal(one.aux_hidden[0, 0].view(np.uint32), block.aux_hidden[0, i].view(np.uint32)), i


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_accepted_branch_logits_identical_in_a_bushy_tree_and_in_decode(kernel_teachers, kind, dtype):
    """The true child of every node comes after a wrong sibling: the path [0, 2, 4, 6, 8] is verified at rows
    L + [0, 2, 4, 6, 8] with siblings in between, and decoded one token at a time at rows L + [0, 1, 2, 3, 4]."""
    teacher, _ = kernel_teachers(kind, dtype)
    rng = np.random.default_rng(4)
    prefix = rng.integers(0, teacher.cfg.vocab_size, 40)
    path_tokens = rng.integers(0, teacher.cfg.vocab_size, 5)
    wrong = (path_tokens + 1) % teacher.cfg.vocab_size
    tokens = [int(t) for t in (path_tokens[0], wrong[1], path_tokens[1], wrong[2], path_tokens[2], wrong[3],
                               path_tokens[3], wrong[4], path_tokens[4])]
    layout = TreeLayout.from_parents(tokens, [0, 0, 0, 2, 2, 4, 4, 6, 6])
    for off in range(0, 40, 16):
        chain(teacher, prefix[off:off + 16], off)
    tree = teacher.forward(ForwardInputs.for_tree(layout, 40, 16, teacher.max_len))
    for k, node in enumerate([0, 2, 4, 6, 8]):
        one = chain(teacher, [tokens[node]], 40 + k)
        assert np.array_equal(one.logits[0, 0].view(np.uint32), tree.logits[0, node].view(np.uint32)), (k, node)
        assert np.array_equal(one.aux_hidden[0, 0].view(np.uint32), tree.aux_hidden[0, node].view(np.uint32))


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_teacher_runs_the_fused_layers(kernel_teachers, dtype):
    from mindspore_eagle.kernels import DecoderLayerKernel

    teacher, _ = kernel_teachers("llama", dtype)
    layers = [c for _, c in teacher.cell.cells_and_names() if isinstance(c, DecoderLayerKernel)]
    assert len(layers) == teacher.cfg.num_layers
    assert all(layer.fused and layer.self_attn.fused and layer.mlp.fused for layer in teacher.cell.model.layers)


class FiveKernels(nn.Cell):
    """A fused decoder layer's five kernels called one by one (what its one-op kernel chains in C++)."""

    def __init__(self, layer):
        super().__init__(auto_prefix=False)
        self.layer = layer

    def construct(self, x, cos, sin, mask, write_idx):
        lay = self.layer
        h = lay.self_attn(x, cos, sin, mask, write_idx, lay.input_layernorm.weight, x)
        return lay.mlp(h, lay.post_attention_layernorm.weight, h)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_one_op_layer_equals_its_five_kernels_bit_for_bit(kernel_teachers, kind, dtype):
    import mindspore as ms
    from mindspore import Tensor

    from mindspore_eagle.models.layers import write_index

    teacher, _ = kernel_teachers(kind, dtype)
    layer = teacher.cell.model.layers[1]
    rng = np.random.default_rng(8)
    inputs = ForwardInputs.for_tree(TreeLayout.from_parents(list(rng.integers(0, 50, 6)), [0, 0, 0, 1, 1, 2]), 20, 8,
                                    teacher.max_len)
    pos = inputs.positions[0]
    cos = Tensor(teacher.cell.cos_table.asnumpy()[pos][None, None])  # [1, 1, T, D]
    sin = Tensor(teacher.cell.sin_table.asnumpy()[pos][None, None])
    x = Tensor(rng.standard_normal((1, 8, teacher.cfg.hidden_size)).astype(np.float32))
    args = (x, cos, sin, Tensor(inputs.mask), write_index(Tensor(inputs.rows), teacher.cfg.num_kv_heads))
    one = ms.jit(layer)(*args).asnumpy()
    k_one = layer.self_attn.k_cache.asnumpy().copy()
    five = ms.jit(FiveKernels(layer))(*args).asnumpy()
    assert np.array_equal(one.view(np.uint32), five.view(np.uint32))
    assert np.array_equal(k_one.view(np.uint32), layer.self_attn.k_cache.asnumpy().view(np.uint32))


class LayersOneByOne(nn.Cell):
    """The teacher's decoder stack one op per layer (``PanguForCausalLM.layers_one_by_one``)."""

    def __init__(self, cell):
        super().__init__(auto_prefix=False)
        self.cell = cell

    def construct(self, ids, positions, mask, rows):
        return self.cell.layers_one_by_one(ids, positions, mask, rows)


class Stack(nn.Cell):
    """The teacher's decoder stack as its one op (what ``PanguForCausalLM.construct`` runs)."""

    def __init__(self, cell):
        super().__init__(auto_prefix=False)
        self.cell = cell

    def construct(self, ids, positions, mask, rows):
        args = ()
        for layer in self.cell.model.layers:
            args = args + layer.stack_args()
        return self.cell.stack(ids, positions, rows, mask, self.cell.model.embed_tokens.weight, self.cell.cos_table,
                               self.cell.sin_table, args)


def _tensors(inputs):
    from mindspore import Tensor

    return (Tensor(inputs.ids.astype(np.int32)), Tensor(inputs.positions.astype(np.int32)), Tensor(inputs.mask),
            Tensor(inputs.rows.astype(np.int32)))


def _caches(teacher):
    return [p.asnumpy().copy() for pair in teacher.cell.cache_parameters() for p in pair]


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


@pytest.fixture(scope="module")
def three_layer_teacher(tmp_path_factory):
    """A tiny Llama teacher with an odd number of layers (3): the stack op's two buffers end the other way round."""
    from ckpt_convert import convert_hf
    from tests.helpers import make_hf_checkpoint

    require_kernel("float32")
    root = tmp_path_factory.mktemp("three_layers")
    make_hf_checkpoint("llama", str(root / "hf"), seed=3, num_hidden_layers=3)
    convert_hf(str(root / "hf"), str(root / "ms"))
    return Teacher.load(str(root / "ms"), RUNTIME, ComputeChoice(matmul=MatmulChoice("custom", "float32")))


@pytest.mark.parametrize("case", [("pangu", "float32"), ("pangu", "bfloat16"), ("llama", "float32"),
                                  ("llama", "bfloat16"), ("three_layers", "float32")])
def test_decoder_stack_op_equals_the_layers_one_op_each_bit_for_bit(kernel_teachers, three_layer_teacher, case):
    """The whole stack in one op (embedding and RoPE rows, write index, every layer, the EAGLE-3 taps) gives the
    hidden state, the taps and the cache rows of the layers run one op each, bit for bit, for a chain and a tree."""
    import mindspore as ms

    kind, dtype = case
    teacher = three_layer_teacher if kind == "three_layers" else kernel_teachers(kind, dtype)[0]
    assert teacher.cell.stacked
    stack, one_by_one = ms.jit(Stack(teacher.cell)), ms.jit(LayersOneByOne(teacher.cell))
    rng = np.random.default_rng(5)
    chain(teacher, [int(t) for t in rng.integers(0, teacher.cfg.vocab_size, 16)], 0)  # a context to attend to
    trees = [TreeLayout.chain([int(t) for t in rng.integers(0, teacher.cfg.vocab_size, 8)]),
             TreeLayout.from_parents([int(t) for t in rng.integers(0, teacher.cfg.vocab_size, 7)],
                                     [0, 0, 0, 1, 1, 2, 4])]
    for start, tree in zip((16, 40), trees):
        inputs = ForwardInputs.for_tree(tree, start, 8, teacher.max_len)
        before = _caches(teacher)
        x1, aux1 = (o.asnumpy() for o in stack(*_tensors(inputs)))
        after_stack = _caches(teacher)
        x2, aux2 = (o.asnumpy() for o in one_by_one(*_tensors(inputs)))  # rewrites the same rows
        assert aux1.shape == (1, 8, len(teacher.cfg.aux_layer_ids) * teacher.cfg.hidden_size)
        assert np.array_equal(_bits(x1), _bits(x2)) and np.array_equal(_bits(aux1), _bits(aux2))
        assert all(np.array_equal(_bits(a), _bits(b)) for a, b in zip(after_stack, _caches(teacher)))
        assert any(not np.array_equal(a, b) for a, b in zip(before, after_stack))  # the stack wrote its rows


@pytest.mark.parametrize("bad", ["id", "position", "row"])
def test_decoder_stack_refuses_an_id_position_or_row_out_of_range_before_writing(hf_tiny, bad):
    """Nothing is written, and the teacher keeps working: once a kernel of a compiled graph has failed, MindSpore
    2.10 fails every later call of that graph ("Invalid output number for flatten stub output nodes"), so the
    teacher compiles fresh graphs for the next forward, which gives the bits it gave before."""
    _, ms_dir, _ = hf_tiny("llama")
    teacher = Teacher.load(ms_dir, RUNTIME, ComputeChoice(matmul=MatmulChoice("custom", "float32")))
    good = ForwardInputs.for_tree(TreeLayout.chain([7, 8]), 20, 8, teacher.max_len)
    expected = teacher.forward(good).logits
    inputs = ForwardInputs.for_tree(TreeLayout.chain([3, 4, 5]), 20, 8, teacher.max_len)
    if bad == "id":
        inputs.ids[0, 1] = teacher.cfg.vocab_size
    elif bad == "position":
        inputs.positions[0, 2] = teacher.cell.cos_table.shape[0]
    else:
        inputs.rows[0, 2] = teacher.max_len
    before = _caches(teacher)
    with pytest.raises(RuntimeError):
        teacher.forward(inputs)
    assert all(np.array_equal(a, b) for a, b in zip(before, _caches(teacher)))
    assert np.array_equal(_bits(teacher.forward(good).logits), _bits(expected))  # the same bucket's graph, again


@pytest.mark.parametrize("dtype", DTYPES)
def test_logits_of_the_rows_asked_for_equal_every_row_forward_and_the_rest_are_nan(kernel_teachers, dtype):
    """A custom LM head computes only the rows the caller reads (``logit_rows``): those rows' logits are the bits
    of a forward computing every row, the other real rows come back NaN, the features are untouched, for the tied
    head (llama, norm inside the kernel) and an untied one (pangu); a row outside the real ones is refused."""
    from mindspore_eagle.errors import ConfigError

    teacher, _ = kernel_teachers("llama", dtype)
    rng = np.random.default_rng(11)
    inputs = ForwardInputs.for_tree(TreeLayout.from_parents([int(t) for t in rng.integers(0, 101, 6)],
                                                            [0, 0, 0, 1, 1, 2]), 12, 8, teacher.max_len)
    every = teacher.forward(inputs)
    some = teacher.forward(inputs, logit_rows=[2, 5])
    assert np.array_equal(_bits(some.logits[0, [2, 5]]), _bits(every.logits[0, [2, 5]]))
    assert np.isnan(some.logits[0, [0, 1, 3, 4]]).all() and np.isfinite(every.logits).all()
    assert np.array_equal(_bits(some.aux_hidden), _bits(every.aux_hidden))
    none = teacher.forward(inputs, logit_rows=[])
    assert np.isnan(none.logits).all() and np.array_equal(_bits(none.aux_hidden), _bits(every.aux_hidden))
    with pytest.raises(ConfigError, match="logit_rows"):
        teacher.forward(inputs, logit_rows=[6])  # a padding row
    untied, _ = kernel_teachers("pangu", dtype)
    inputs = ForwardInputs.for_tree(TreeLayout.chain([3, 4, 5]), 12, 8, untied.max_len)
    one, every = untied.forward(inputs, logit_rows=[1]).logits, untied.forward(inputs).logits
    assert np.array_equal(_bits(one[0, 1]), _bits(every[0, 1])) and np.isnan(one[0, [0, 2]]).all()


@pytest.mark.parametrize("draft", ["oracle", "wrong", "bushy"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_speculative_output_equals_greedy_with_kernels(kernel_teachers, dtype, draft):
    teacher, _ = kernel_teachers("pangu", dtype)
    for prompt in ([3, 17, 42, 5], [9, 9, 9, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14, 15, 16, 20]):
        greedy = list(SpeculativeEngine(teacher).generate(prompt, 32).tokens)
        proposer = ScriptedProposer(teacher.cfg.vocab_size, depth=4, mode=draft)
        proposer.future = greedy
        gen = SpeculativeEngine(teacher).generate(prompt, 24, proposer=proposer)
        assert list(gen.tokens) == greedy[:24]
        if draft == "oracle":
            assert all(s.accepted_len == 4 for s in gen.steps[:-1])


def test_bf16_kernel_teacher_is_close_to_fp32_but_not_equal(kernel_teachers):
    """bf16 is a different precision, not a broken one: logits track fp32 closely (and differ, so the bf16 path
    really runs)."""
    t32, _ = kernel_teachers("llama", "float32")
    t16, _ = kernel_teachers("llama", "bfloat16")
    prompt = list(range(1, 17))
    a, b = chain(t32, prompt, 0).logits[0], chain(t16, prompt, 0).logits[0]
    assert not np.array_equal(a, b)
    assert np.abs(a - b).max() <= 0.05 * np.abs(a).max()


def test_teacher_load_falls_back_to_mindspore_matmul_with_a_message(hf_tiny, monkeypatch, capsys):
    from mindspore_eagle.kernels import LinearKernel, build
    from mindspore_eagle.kernels import ops as kernel_ops

    _, ms_dir, _ = hf_tiny("llama")
    monkeypatch.setattr(kernel_ops, "kernel_status", lambda dtype: build.KernelStatus(None, "processor lacks AVX-512"))
    teacher = Teacher.load(ms_dir, RUNTIME, ComputeChoice(matmul=MatmulChoice("custom", "bfloat16")))
    assert not [c for _, c in teacher.cell.cells_and_names() if isinstance(c, LinearKernel)]
    err = capsys.readouterr().err
    assert "processor lacks AVX-512" in err and "MindSpore" in err


@pytest.mark.parametrize("config", ["mapped", "wide_teacher"])  # no bias / attention biases, own embeddings
def test_eagle3_head_with_fp32_kernels_equals_numpy_reference(tmp_path, config):
    import mindspore as ms

    from ckpt_convert import convert_eagle3
    from mindspore_eagle.models.eagle3 import Eagle3DraftHead
    from tests.helpers import PUBLIC_CONFIGS, NumpyHead, causal_visibility, write_public_head

    MAX_LEN, TOL = 32, 1e-4  # the head tests' cache rows and tolerance

    require_kernel("float32")
    c = PUBLIC_CONFIGS[config]
    tensors = write_public_head(str(tmp_path / "public"), c, seed=1)
    convert_eagle3(str(tmp_path / "public"), str(tmp_path / "ours"))
    head = Eagle3DraftHead.load(str(tmp_path / "ours"), max_len=MAX_LEN,
                                compute=ComputeChoice(matmul=MatmulChoice("custom", "float32")))
    ht = c.get("target_hidden_size") or c["hidden_size"]
    table = (head.embed_tokens.weight if head.own_embedding else
             ms.Tensor(np.random.default_rng(7).standard_normal((c["vocab_size"], c["hidden_size"])).astype(np.float32)))
    rng = np.random.default_rng(3)
    ids = rng.integers(0, c["vocab_size"], 8)
    feats = rng.standard_normal((8, 3 * ht)).astype(np.float32)
    inputs = ForwardInputs.for_tree(TreeLayout.chain(ids), 0, 8, MAX_LEN)
    got = ms.jit(head)(table, ms.Tensor(inputs.ids), ms.Tensor(feats[None]), ms.Tensor(inputs.positions),
                       ms.Tensor(inputs.mask), ms.Tensor(inputs.rows)).asnumpy()[0]
    ref = NumpyHead(tensors, c)
    want = ref.forward(np.asarray(table.asnumpy(), np.float64)[ids], ref.fuse(feats), np.arange(8), causal_visibility(8))
    np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL)
    np.testing.assert_allclose(head.compute_logits(ms.Tensor(got)).asnumpy(), ref.logits(want), rtol=TOL, atol=TOL)
