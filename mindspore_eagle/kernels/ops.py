"""The custom linear kernel as a MindSpore Cell, and the host steps around it (packing, checks).

``LinearKernel`` holds the packed copy of one weight (``packed_weight``, a non-trainable Parameter, NaN until
packed so a forgotten packing step cannot pass for a result) and calls the AOT Custom op of ``linear.cc``:
``y [M, N] = x [M, K] @ W (+ bias)``, fp32 in and out. Packing happens once, after the checkpoint is loaded
and before the first graph runs (``pack_weights``), because a Parameter whose data is replaced after a graph
ran is silently detached from it.

Fused variants (fewer MindSpore ops per decoder layer; each a different entry point of linear.cc on the same
packed weight): the RMSNorm of the input taken inside the kernel (``norm_weight`` given at the call), a
residual added to the result (``residual`` given), and the SwiGLU of a ``[gate | up]`` input (built with
``glu=True``: the down projection of the MLP). Which variant a call uses is decided by which optional inputs
it passes, a compile-time constant in graph mode: one Cell, one packed weight, several Custom primitives.

Who packs what: every Cell with a ``pack_kernel()`` method packs its own kernels from its own weights
(``Linear`` from ``weight``, the teacher's tied LM head from the embedding table). ``pack_weights(root)``
calls them all; ``Teacher.load`` and ``Eagle3DraftHead.load`` do so after ``load_strict``.
"""

from __future__ import annotations

import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from ..errors import ConfigError
from . import build
from .layout import KERNEL_FORMAT, gguf_fields, pack_bf16, pack_f32, pack_quantized, packed_shape



FORMAT_NAMES = {"float32": "F32", "bfloat16": "Bf16", "q4": "Q4", "q8": "Q8"}  # packed weight formats (layout.py)


def entry_point(fmt: str, prologue: str, bias: bool, residual: bool, rows: bool = False) -> str:
    """linear.cc's entry point of one variant: ``MseLinear{F32,Bf16,Q4,Q8}[Norm|Glu][Bias][Res]``, or an LM
    head's ``MseLinear{...}[Norm]Rows`` (``rows``: no SwiGLU, no bias, no residual).

    Example: ``entry_point("bfloat16", "rmsnorm", False, True) == "MseLinearBf16NormRes"``."""
    pro = {"none": "", "rmsnorm": "Norm", "swiglu": "Glu"}[prologue]
    if rows:
        if prologue == "swiglu" or bias or residual:
            raise ConfigError("entry_point: the rows variant is an LM head's (no SwiGLU, no bias, no residual)")
        return f"MseLinear{FORMAT_NAMES[fmt]}{pro}Rows"
    return f"MseLinear{FORMAT_NAMES[fmt]}{pro}{'Bias' if bias else ''}{'Res' if residual else ''}"


def kernel_status(dtype: str):
    """``build.KernelStatus`` of the custom kernels for ``dtype`` on this machine (built on first use)."""
    return build.load().for_dtype(dtype)


class LinearKernel(nn.Cell):
    """``construct(x, bias=None, norm_weight=None, residual=None) -> y [..., N]`` on the packed copy of a
    ``[K, N]`` weight: ``y = residual + (a @ W + bias)`` with ``a`` the kernel's activations of ``x``:

        glu=False, norm_weight None:  a = x                                        x [..., K]
        glu=False, norm_weight [K]:   a = x * rsqrt(mean(x^2) + norm_eps) * norm_weight   (RMSNorm)
        glu=True:                     a = silu(x[..., :K]) * x[..., K:]            x [..., 2K] = [gate | up]

    ``x`` has any leading dims (rows = their product); ``y`` and ``residual`` have the same ones.
    ``transposed``: the weight handed to ``pack`` is stored ``[N, K]`` (the tied LM head's embedding table).
    ``bias``: whether ``construct`` receives a bias (added inside the kernel, after the K reduction).
    ``residual`` (optional ``[M, N]``) is added last. ``rows`` (optional int32, x's leading dims; neither SwiGLU,
    bias nor residual: an LM head): only the rows flagged nonzero are computed, the others are NaN. Every variant
    keeps the batch invariance of the plain kernel: the activations of a row depend on that row only, so a computed
    row is the same whatever else is flagged.
    """

    def __init__(self, in_features: int, out_features: int, dtype: str, bias: bool = False, transposed: bool = False,
                 glu: bool = False, norm_eps: float | None = None):
        super().__init__()
        if in_features < 1 or out_features < 1:
            raise ConfigError(f"LinearKernel({in_features}, {out_features}): both sizes must be >= 1")
        if glu and norm_eps is not None:
            raise ConfigError("LinearKernel: a SwiGLU input takes no RMSNorm (glu=True with norm_eps)")
        status = kernel_status(dtype)
        if status.library is None:
            raise ConfigError(f"MatmulChoice(backend='custom', dtype={dtype!r}) cannot run here: {status.reason} "
                              "(compute.ComputeChoice.runnable falls back to MindSpore's MatMul)")
        self.in_features, self.out_features = in_features, out_features
        self.dtype, self.has_bias, self.transposed, self.glu = dtype, bias, transposed, glu
        self.format = dtype  # the packed weight's format: the dtype, or "q4" / "q8" once pack_native ran
        shape = packed_shape(in_features, out_features, dtype)
        # NaN until packed: fp32 NaN, or the bf16 NaN pattern 0x7FC0 in int16 bits
        init = np.full(shape, 0x7FC0, np.int16) if dtype == "bfloat16" else np.full(shape, np.nan, np.float32)
        self.packed_weight = Parameter(Tensor(init), name="packed_weight", requires_grad=False)
        self.packed = False  # host flag, set by pack()
        self.has_norm = norm_eps is not None
        if self.has_norm:
            self.eps = Tensor(np.array([norm_eps], np.float32))
        self._make_ops(status.library)

    def _make_ops(self, library) -> None:
        """The Custom primitives of this kernel's variants for its current ``format``."""
        n, fmt, bias = self.out_features, self.format, self.has_bias

        def infer_shape(x, *rest):
            return list(x[:-1]) + [n]

        def infer_dtype(x, *rest):
            return x

        def op(prologue: str, residual: bool, rows: bool = False):
            return ops.Custom(library.symbol(entry_point(fmt, prologue, bias, residual, rows)),
                              out_shape=infer_shape, out_dtype=infer_dtype, func_type="aot")

        first = "swiglu" if self.glu else "none"
        self.op = op(first, False)
        self.op_res = op(first, True)
        if not self.glu and not bias:
            self.op_rows = op("none", False, rows=True)
        if self.has_norm:
            self.op_norm = op("rmsnorm", False)
            self.op_norm_res = op("rmsnorm", True)
            if not bias:
                self.op_norm_rows = op("rmsnorm", False, rows=True)

    def pack(self, weight: np.ndarray) -> None:
        """Fill the packed copy from ``weight`` (``[K, N]``, or ``[N, K]`` when ``transposed``)."""
        expect = (self.out_features, self.in_features) if self.transposed else (self.in_features, self.out_features)
        if tuple(weight.shape) != expect:
            raise ConfigError(f"LinearKernel.pack: weight of shape {tuple(weight.shape)}, expected {expect}")
        fn = pack_bf16 if self.dtype == "bfloat16" else pack_f32
        self.packed_weight.set_data(Tensor(fn(weight, self.transposed)))
        self.packed = True

    def pack_native(self, parts: list[tuple[str, np.ndarray]]) -> bool:
        """Pack from GGUF blocks instead: ``parts`` are (GGML type, raw rows ``uint8 [rows, bytes]``) whose rows,
        stacked, are this kernel's N output columns (q|k|v, gate|up), each row K inputs. Returns False (nothing
        changed; ``pack`` the dense weight instead) unless every part is in one exactly-computed format of the
        same kernel format (layout.KERNEL_FORMAT) and the kernel computes float32. Must run before the first
        forward: the packed Parameter and the primitives are replaced (a new format, a new shape)."""
        fmts = {KERNEL_FORMAT.get(kind) for kind, _ in parts}
        rows = sum(raw.shape[0] for _, raw in parts)
        if self.dtype != "float32" or len(fmts) != 1 or None in fmts or rows != self.out_features:
            return False
        fmt = fmts.pop()
        fields = [gguf_fields(raw, kind) for kind, raw in parts]
        d, m, q = (np.concatenate([f[i] for f in fields], 0) for i in range(3))
        if q.shape != (self.out_features, self.in_features):
            raise ConfigError(f"LinearKernel.pack_native: blocks hold {q.shape} weights, expected "
                              f"{(self.out_features, self.in_features)}")
        name = self.packed_weight.name
        self.packed_weight = Parameter(Tensor(pack_quantized(d, m, q, fmt)), name=name, requires_grad=False)
        self.format = fmt
        self._make_ops(kernel_status("float32").library)
        self.packed = True
        return True

    def construct(self, x, bias=None, norm_weight=None, residual=None, rows=None):
        args = (x, self.packed_weight)
        if self.has_bias:
            args = args + (bias,)
        if norm_weight is None:
            if residual is None:
                if rows is not None:  # int32, x's leading dims: only the flagged rows are computed, the others NaN
                    return self.op_rows(*(args + (rows,)))
                return self.op(*args)
            return self.op_res(*(args + (residual,)))
        if residual is None:
            if rows is not None:  # int32, x's leading dims: only the flagged rows are computed, the others NaN
                return self.op_norm_rows(*(args + (norm_weight, self.eps, rows)))
            return self.op_norm(*(args + (norm_weight, self.eps)))
        return self.op_norm_res(*(args + (norm_weight, self.eps, residual)))


def pack_weights(root: nn.Cell, native: dict | None = None) -> int:
    """Call ``pack_kernel(native)`` on every cell of ``root`` that has one; return how many kernels are packed.
    ``native``: weight name -> (GGML type, raw GGUF rows) of the checkpoint's quantized blocks (``--weights
    native``); a kernel whose weights are all there in an exactly-computed format packs those, others the
    dense weights. Then ``after_pack()`` on every cell that has one (what needs its sub-cells' kernels packed: the
    teacher's greedy Q8 head reads its LM head's packed blocks)."""
    for _, cell in list(root.cells_and_names()):
        pack = getattr(cell, "pack_kernel", None)
        if callable(pack):
            pack(native or {})
    for _, cell in list(root.cells_and_names()):
        after = getattr(cell, "after_pack", None)
        if callable(after):
            after()
    return sum(1 for _, c in root.cells_and_names() if isinstance(c, LinearKernel) and c.packed)


def check_packed(root: nn.Cell) -> None:
    """ConfigError naming every custom kernel of ``root`` whose packed weight was never filled."""
    missing = [name for name, c in root.cells_and_names() if isinstance(c, LinearKernel) and not c.packed]
    if missing:
        raise ConfigError(f"{len(missing)} custom linear kernels were never packed (first: {missing[0]}); call "
                          "kernels.pack_weights(model) after loading the weights and before the first forward")


__all__ = ["LinearKernel", "entry_point", "check_packed", "kernel_status", "pack_weights"]
