"""Custom CPU kernels: batch-invariant small-M matmuls in fp32, bf16 and GGUF-quantized weights computed exactly,
and fused cached attention with in-place KV cache writes; one source compiled per instruction set (AVX-512, AVX2,
NEON, portable), every path computing the same bits.

Why: MindSpore's CPU MatMul is efficient at one row but costs 2.6-3.5x that at 8-16 rows, so a tree
verification cost two decode steps and speculation lost. These kernels stream each weight once per call for
any M and compute every output element with a fixed, strictly sequential reduction along K, so a row's
result is bit-identical whatever the number of rows in the call: the teacher's 1-row greedy decode and its
16-row tree verification see the same linear outputs (see linear.cc). Once the linears were fast, MindSpore's
per-op dispatch, attention over the whole static cache and whole-buffer cache copies were the cost: the
attention kernel (attention.cc) does RoPE, the cache write and the attention of a layer in one op over the
visible rows only, with the same batch invariance.

    choice.py     MatmulChoice: which backend/dtype a model's Linears use (chosen by ``compute.choose``, passed
                  explicitly)
    layout.py     packed panel layouts of the weights (numpy, made once at load), GGUF blocks included
    build.py      compiles compute.cc once per instruction set + isa.cc, linear.cc, attention.cc, layer.cc, rows.cc
                  into one library in the project home, loads it, or says why not; builds the self-test (selftest.cc)
    ops.py        LinearKernel (the AOT Custom op + packed weight, fused RMSNorm/SwiGLU/residual variants),
                  kernel_status, pack_weights, check_packed
    cache_ops.py  TreeAttentionKernel (fused attention, in-place K/V writes), RowMoveKernel (in-place commit),
                  DecoderLayerKernel (a teacher layer's five kernels as one op), DecoderStackKernel (every layer
                  of the teacher as one op)
    greedy_head.py  GreedyQ8HeadKernel (argmax.cc: a Q8 LM head's greedy token from int16 dot products and a
                  rigorous bound, exact; taken by the teacher where it is fast: AVX-512, AVX2, NEON)
    row_ops.py    RowTopKKernel (rows.cc: greedy token, finite flag and top-k of logits rows in one pass; the
                  training data's teacher forward)
"""

import importlib

# Imported on first use (PEP 562): ``build`` (compile and load the library) needs no MindSpore, so ``setup`` and the
# suffix index's loader stay light; the ops below import MindSpore.
_EXPORTS = {"DecoderLayerKernel": "cache_ops", "DecoderStackKernel": "cache_ops", "RowMoveKernel": "cache_ops",
            "TreeAttentionKernel": "cache_ops", "fused_attention_supported": "cache_ops",
            "fused_layer_supported": "cache_ops", "MatmulChoice": "choice", "LinearKernel": "ops",
            "check_packed": "ops", "kernel_status": "ops", "pack_weights": "ops"}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
