"""A Q8, fp32 or bf16 LM head's greedy token (tied or untied, no bias) as a MindSpore Cell: ``GreedyQ8HeadKernel``,
argmax.cc's entry points (a dense head through a Q8 copy of its weights and that copy's error in the bound).

Why: a greedy forward (decoding, tree verification, batched decoding) reads one number per row of the LM head's
49,152 logits, its argmax. On every SIMD path (AVX-512 -- VPDPWSSD blocks where the processor has AVX512-VNNI,
VPMADDWD ones where it does not --, AVX2, NEON), argmax.cc finds that token from int16 activations and a rigorous
bound, then computes only the few candidate columns exactly: the token of ``np.argmax`` over the exact kernel's
logits, bit for bit the same choice, at a fraction of the head's instructions (numerics and the bound in argmax.cc;
measured in docs/kernels.md). The kernel computes the same tokens on every path (portable loops on the portable
path, exact but slow: tests use them), and the teacher takes it only where it is fast (``fast_here``); elsewhere
greedy forwards keep the logits path.
"""

from __future__ import annotations

import ctypes

import numpy as np

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from ..errors import ConfigError
from .layout import column_norms, f32_panels_of_bf16, q8_column_abs_sums, q8_copy_of_f32, q8_pair_panels
from . import build
from .ops import LinearKernel, kernel_status


FORMATS = {"q8": "Q8", "float32": "F32", "bfloat16": "Bf16"}  # head format -> argmax.cc's entry point names


def fast_here() -> bool:
    """Whether the kernel path in use computes the greedy Q8 head fast (every SIMD path: AVX-512, AVX2, NEON; not the
    portable one).
    Asked at each call: tests and ``MSE_KERNEL_ISA`` may select another path."""
    lib = build.handle()
    return lib is not None and bool(lib.MseArgmaxQ8Fast())


def stats(reset: bool = False) -> dict[str, int]:
    """Rows computed, candidates of the rows that took the bound, and rows that fell back to the exact kernel,
    since the last reset (argmax.cc)."""
    lib = build.handle()
    out = (ctypes.c_int64 * 3)()
    if lib is not None:
        lib.MseArgmaxQ8Stats(out, int(reset))
    return {"rows": out[0], "candidates": out[1], "fallbacks": out[2]}


class HeadNotServed(ConfigError):
    """``GreedyQ8HeadKernel`` cannot serve this LM head (its message says why): greedy forwards keep the logits."""


class GreedyQ8HeadKernel(nn.Cell):
    """``construct(x [..., K], weight, norm_weight=None, eps=None, rows=None) -> token int32 [...]``: per row,
    ``np.argmax`` of the logits that ``head`` (a packed Q8, fp32 or bf16 ``LinearKernel`` without bias: a tied LM head
    with its RMSNorm prologue, given ``norm_weight [K]`` and the kernel's ``eps``, or an untied one on normed ``x``)
    computes for ``x``, given that kernel's own ``packed_weight`` as ``weight`` (read for the candidates' exact
    logits; passed in, not held, so that it stays the head's Parameter); with ``rows`` (int32, x's leading dims) only
    flagged rows are computed, the others get 0. Holds the head's Q8 weights in the pair layout and their column
    sums (layout.py); for a dense head (``--weights dense``, or a model without GGUF blocks; fp32 or bf16) a Q8 copy
    of its weights and the copy's error per column, which the bound adds (``layout.q8_copy_of_f32``; argmax.cc), and
    for a bf16 head its column norms (the bound's term for the activations' rounding to bf16). ``HeadNotServed`` (a
    ConfigError) unless ``head`` is such a kernel with finite weights: a dense head's NaN or infinite weight cannot be
    bounded by its Q8 copy, and np.argmax's first-NaN rule needs the logits."""

    def __init__(self, head: LinearKernel):
        super().__init__()
        if head.format not in FORMATS or not head.packed or head.has_bias or head.glu:
            raise HeadNotServed(f"GreedyQ8HeadKernel: needs a packed Q8, fp32 or bf16 LM head without bias, got "
                                f"format {head.format!r} (packed={head.packed}, bias={head.has_bias}, "
                                f"swiglu={head.glu})")
        self.dense, self.half = head.format != "q8", head.format == "bfloat16"
        if self.dense:  # the weights read once, as fp32 panels
            weights = head.packed_weight.asnumpy()
            if self.half:
                weights = f32_panels_of_bf16(weights)
            if not np.isfinite(weights).all():
                raise HeadNotServed("GreedyQ8HeadKernel: the LM head has NaN or infinite weights: its greedy tokens "
                                    "need the logits")
            if self.half:
                self.packed_wnorm = Parameter(Tensor(column_norms(weights, head.out_features)), name="packed_wnorm",
                                              requires_grad=False)
            q8, colabs, dnorm = q8_copy_of_f32(weights, head.out_features)
            self.packed_dnorm = Parameter(Tensor(dnorm), name="packed_dnorm", requires_grad=False)
        else:
            q8 = head.packed_weight.asnumpy()
            colabs = q8_column_abs_sums(q8, head.out_features)
        self.packed_pairs = Parameter(Tensor(q8_pair_panels(q8)), name="packed_pairs", requires_grad=False)
        self.packed_colabs = Parameter(Tensor(colabs), name="packed_colabs", requires_grad=False)
        library = kernel_status("float32").library

        def infer_shape(x, *rest):
            return list(x[:-1])

        def infer_dtype(x, *rest):
            return ms.int32

        def op(name):
            return ops.Custom(library.symbol(name), out_shape=infer_shape, out_dtype=infer_dtype, func_type="aot")

        fmt = FORMATS[head.format]
        self.op_norm = op(f"MseTiedArgmax{fmt}")
        self.op_norm_rows = op(f"MseTiedArgmax{fmt}Rows")
        self.op = op(f"MseArgmax{fmt}")
        self.op_rows = op(f"MseArgmax{fmt}Rows")

    def construct(self, x, weight, norm_weight=None, eps=None, rows=None):
        args = (x, weight, self.packed_pairs, self.packed_colabs)
        if self.dense:
            args = args + (self.packed_dnorm,)
        if self.half:
            args = args + (self.packed_wnorm,)
        if norm_weight is None:
            if rows is None:
                return self.op(*args)
            return self.op_rows(*(args + (rows,)))
        if rows is None:
            return self.op_norm(*(args + (norm_weight, eps)))
        return self.op_norm_rows(*(args + (norm_weight, eps, rows)))


__all__ = ["FORMATS", "GreedyQ8HeadKernel", "HeadNotServed", "fast_here", "stats"]
