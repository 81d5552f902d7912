"""``--weights native``: a GGUF's Q4_0 / Q4_1 / Q8_0 blocks, kept by the converter and rebuilt inside the kernels,
compute the same teacher as its dequantized fp32 weights, bit for bit.

References: ``gguf.quants.dequantize`` (the gguf package, what the converter runs) for the packed layouts
decoded here in numpy, and the dense teacher (itself checked against transformers elsewhere) for logits and
tokens."""

from __future__ import annotations

import numpy as np
import pytest

from mindspore_eagle.runtime import RuntimeConfig
from mindspore_eagle.errors import ConfigError
from mindspore_eagle.kernels.layout import KERNEL_FORMAT, gguf_fields, pack_quantized
from mindspore_eagle.teacher import Teacher
from mindspore_eagle.tree import ForwardInputs, TreeLayout
from tests.helpers import DEFAULT_TEACHER_PROMPTS, default_gguf_or_skip, default_model_or_skip, write_tiny_gguf

QTYPES = ("Q4_0", "Q4_1", "Q8_0")


def runtime(weights: str) -> RuntimeConfig:
    return RuntimeConfig(max_cache_len=128, buckets=(1, 8, 16, 32), prefill_chunk=16, weights=weights)


def decode_panels(packed: np.ndarray, fmt: str, n: int) -> np.ndarray:
    """The weights ``[n, K]`` a kernel rebuilds from packed panels, decoded literally from the documented
    layout (layout.py), with the kernel's one rounding: fma(d, q, m) = round(d * q + m), computed in float64
    (exact here) and rounded once to float32."""
    npanel, kb, _ = packed.shape
    d = packed[..., :64].copy().view(np.float32)  # [np, KB, 16]
    if fmt == "q4":
        m = packed[..., 64:128].copy().view(np.float32)
        pairs = packed[..., 128:].reshape(npanel, kb, 16, 16)  # [np, KB, row pair, column]
        q = np.stack([pairs & 15, pairs >> 4], axis=3).reshape(npanel, kb, 32, 16).astype(np.float64)  # rows 2p, 2p+1
    else:
        m = np.zeros_like(d)
        q = packed[..., 64:].copy().view(np.int8).reshape(npanel, kb, 32, 16).astype(np.float64)
    w = (d[:, :, None, :].astype(np.float64) * q + m[:, :, None, :].astype(np.float64)).astype(np.float32)
    return w.transpose(0, 3, 1, 2).reshape(npanel * 16, kb * 32)[:n]  # [columns, K]


@pytest.mark.parametrize("qtype", QTYPES)
def test_packed_blocks_rebuild_what_gguf_dequantize_gives(qtype):
    import gguf

    rng = np.random.default_rng(3)
    w = (rng.standard_normal((40, 96)) * rng.uniform(0.01, 3.0, (40, 1))).astype(np.float32)  # 40 is 2.5 panels
    kind = gguf.GGMLQuantizationType[qtype]
    raw = gguf.quants.quantize(w, kind)
    ref = gguf.quants.dequantize(raw, kind).reshape(w.shape)
    fmt = KERNEL_FORMAT[qtype]
    packed = pack_quantized(*gguf_fields(raw, qtype), fmt)
    assert packed.shape == (3, 3, {"q4": 384, "q8": 576}[fmt])
    # + 0.0 turns -0 into +0: Q4_0's d (q - 8) is -0 for d < 0, q = 8, where fma(d, q, -8 d) gives +0; a dot
    # product accumulated from +0 never holds -0, so the zero's sign never reaches an output (layout.py)
    assert np.array_equal((decode_panels(packed, fmt, 40) + 0.0).view(np.uint32), (ref + 0.0).view(np.uint32))


def test_the_default_ggufs_blocks_rebuild_its_dequantized_weights():
    import gguf

    reader = gguf.GGUFReader(default_gguf_or_skip())
    seen = set()
    for t in reader.tensors:
        if t.tensor_type.name not in KERNEL_FORMAT or t.tensor_type.name in seen:
            continue
        seen.add(t.tensor_type.name)  # one tensor of each format: Q4_1 (the Linears), Q8_0 (the embedding)
        ref = gguf.quants.dequantize(t.data, t.tensor_type).reshape(t.data.shape[0], -1)
        fmt = KERNEL_FORMAT[t.tensor_type.name]
        packed = pack_quantized(*gguf_fields(np.asarray(t.data), t.tensor_type.name), fmt)
        assert np.array_equal(decode_panels(packed, fmt, ref.shape[0]).view(np.uint32), ref.view(np.uint32)), t.name
    assert seen == {"Q4_1", "Q8_0"}


@pytest.fixture(scope="module")
def quantized_dirs(hf_tiny, tmp_path_factory):
    """qtype -> a converted tiny Llama (its embedding Q8_0) whose Linears, LM head included, are stored in qtype."""
    from ckpt_convert import convert_gguf

    _, _, model = hf_tiny("llama")
    made = {}
    for qtype in QTYPES:
        root = tmp_path_factory.mktemp(f"gguf_{qtype}")
        write_tiny_gguf(model, str(root / "m.gguf"), quantize_embeddings=True, tokenizer=True, linear_type=qtype)
        convert_gguf(str(root / "m.gguf"), str(root / "ms"))
        made[qtype] = str(root / "ms")
    return made


@pytest.mark.parametrize("qtype", QTYPES)
def test_native_teacher_logits_equal_the_dense_teachers_bit_for_bit(quantized_dirs, qtype):
    """Prefill chunks of 16, a 32-token forward, trees of 8 and decode steps: every logit bit-identical."""
    native = Teacher.load(quantized_dirs[qtype], runtime("native"))
    dense = Teacher.load(quantized_dirs[qtype], runtime("dense"))
    assert native.weights == "native" and dense.weights == "dense"
    formats = {c.format for _, c in native.cell.cells_and_names() if hasattr(c, "pack_native")}
    assert KERNEL_FORMAT[qtype] in formats and formats <= {"q4", "q8"}, formats  # every kernel reads blocks
    ids = [int(t) for t in np.random.default_rng(5).integers(0, 101, 80)]
    for teacher in (native, dense):
        teacher.outs = []
        for start, n in ((0, 16), (16, 16), (32, 32), (64, 8), (72, 1), (73, 1)):
            bucket = teacher.runtime.buckets.fit(n)
            out = teacher.forward(ForwardInputs.for_tree(TreeLayout.chain(ids[start:start + n]), start, bucket,
                                                         teacher.max_len))
            teacher.outs.append(out.logits[0].copy())
    for a, b in zip(native.outs, dense.outs):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_native_is_refused_where_it_cannot_be_exact(hf_tiny):
    _, dense_dir, _ = hf_tiny("llama")  # converted from a dense HF checkpoint: no blocks
    with pytest.raises(ConfigError, match="no quantized blocks"):
        Teacher.load(dense_dir, runtime("native"))
    assert Teacher.load(dense_dir, runtime("auto")).weights == "dense"
    with pytest.raises(ConfigError, match="custom float32 kernels"):
        RuntimeConfig(weights="native", dtype="bfloat16")
    with pytest.raises(ConfigError, match="custom float32 kernels"):
        RuntimeConfig(weights="native", matmul="mindspore")


def test_default_teacher_greedy_tokens_are_the_same_native_and_dense():
    """The shipped Q4_1 GGUF: native (the default) and dense greedy decoding give the same tokens."""
    from mindspore_eagle.engine import SpeculativeEngine
    from mindspore_eagle.tokenizer import load_tokenizer

    model_dir = default_model_or_skip()
    tok = load_tokenizer(model_dir)
    rt = lambda w: RuntimeConfig(max_cache_len=256, weights=w)  # noqa: E731
    native, dense = Teacher.load(model_dir, rt("auto")), Teacher.load(model_dir, rt("dense"))
    assert native.weights == "native"
    for text in DEFAULT_TEACHER_PROMPTS:
        ids = tok.encode_chat([{"role": "user", "content": text}])
        a = list(SpeculativeEngine(native).generate(ids, 32).tokens)
        b = list(SpeculativeEngine(dense).generate(ids, 32).tokens)
        assert a == b, text
