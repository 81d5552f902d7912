"""The custom linear kernels compute ``x @ W (+ bias)`` as independent numpy references do, and a row's result
is bit-identical whatever the number of rows in the call (batch invariance: what lets a 16-row tree
verification reproduce the 1-row greedy decode exactly).

References: fp32 against a float64 product, within the rigorous bound of a sequential fp32 sum; bf16 *bit for
bit* against a numpy emulation of the documented VDPBF16PS semantics (operands rounded to bf16 by torch,
products exact in fp32, per pair ``acc = (acc + x[2q+1] w[2q+1]) + x[2q] w[2q]``, each addition rounded to
fp32). Tests skip only when the processor lacks the instructions; on one that has them the library must build.
"""

from __future__ import annotations

import io
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from mindspore_eagle.compute import ComputeChoice
from mindspore_eagle.errors import ConfigError
from mindspore_eagle.kernels import MatmulChoice, check_packed, pack_weights
from mindspore_eagle.kernels import build, ops as kernel_ops
from tests.helpers import cpu_flags, require_kernel
from mindspore_eagle.kernels.layout import pack_bf16, pack_f32
from mindspore_eagle.models.layers import Linear

ms.set_device("CPU")
DTYPES = ("float32", "bfloat16")
ROWS = (1, 2, 7, 16, 17, 64, 128)


def make_linear(w: np.ndarray, bias: np.ndarray | None, dtype: str) -> Linear:
    lin = Linear(w.shape[0], w.shape[1], bias is not None, MatmulChoice("custom", dtype))
    lin.weight.set_data(Tensor(w))
    if bias is not None:
        lin.bias.set_data(Tensor(bias))
    assert pack_weights(lin) == 1
    return lin


_GRAPHS: dict = {}


def run(lin: Linear, x: np.ndarray) -> np.ndarray:
    """The Linear compiled (``ms.jit``, as the teacher runs it), one graph per Linear."""
    fn = _GRAPHS.setdefault(id(lin), ms.jit(lin))
    return fn(Tensor(x)).asnumpy()


def bf16_round(a: np.ndarray) -> np.ndarray:
    import torch

    return torch.from_numpy(np.ascontiguousarray(a, np.float32)).to(torch.bfloat16).to(torch.float32).numpy()


def emulate_bf16(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """VDPBF16PS accumulation in numpy float32: pairs along K, odd product first, zero pad for an odd K."""
    k = x.shape[1]
    xb, wb = bf16_round(x), bf16_round(w)
    if k % 2:
        xb = np.concatenate([xb, np.zeros((x.shape[0], 1), np.float32)], 1)
        wb = np.concatenate([wb, np.zeros((1, w.shape[1]), np.float32)], 0)
    acc = np.zeros((x.shape[0], w.shape[1]), np.float32)
    for q in range(xb.shape[1] // 2):
        acc = acc + xb[:, 2 * q + 1, None] * wb[None, 2 * q + 1]
        acc = acc + xb[:, 2 * q, None] * wb[None, 2 * q]
    return acc + bias if bias is not None else acc


def random_case(m: int, k: int, n: int, seed: int, bias: bool):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    return x, w, b


SHAPES = [(m, 77, 50) for m in ROWS] + [(5, 576, 1536), (3, 1536, 576), (2, 1, 1), (9, 33, 17), (4, 64, 16)]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_fp32_kernel_matches_float64_within_sequential_sum_bound(m, k, n, bias):
    require_kernel("float32")
    x, w, b = random_case(m, k, n, seed=m * 1000 + k + n, bias=bias)
    y = run(make_linear(w, b, "float32"), x)
    ref = x.astype(np.float64) @ w.astype(np.float64) + (b if bias else 0.0)
    # |fl(sum) - sum| <= (K+1) u sum|x_k w_k| (+ the bias add) for any sequential fp32 summation
    bound = (k + 2) * 2.0 ** -24 * (np.abs(x).astype(np.float64) @ np.abs(w) + (np.abs(b) if bias else 0.0))
    assert y.shape == (m, n) and y.dtype == np.float32
    assert np.all(np.abs(y - ref) <= bound + 1e-30)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_bf16_kernel_equals_bf16_emulation_bit_for_bit(m, k, n, bias):
    require_kernel("bfloat16")
    x, w, b = random_case(m, k, n, seed=m * 1000 + k + n + 7, bias=bias)
    y = run(make_linear(w, b, "bfloat16"), x)
    expect = emulate_bf16(x, w, b)
    assert np.array_equal(y.view(np.uint32), expect.view(np.uint32)), np.abs(y - expect).max()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
def test_row_result_does_not_depend_on_rows_in_the_call(dtype, bias):
    require_kernel(dtype)
    k, n = 577, 1000  # odd K (bf16 pair padding), N not a multiple of 16
    x, w, b = random_case(128, k, n, seed=11, bias=bias)
    lin = make_linear(w, b, dtype)
    full = run(lin, x).view(np.uint32)  # [128, N]
    for m in ROWS:
        assert np.array_equal(run(lin, x[:m]).view(np.uint32), full[:m]), f"rows of an M={m} call differ"
    for i in (0, 5, 16, 63, 127):  # row i alone == row i inside M=16/64/128 calls
        assert np.array_equal(run(lin, x[i:i + 1]).view(np.uint32)[0], full[i])
    shuffled = np.random.default_rng(3).permutation(64)  # neighbours and position in the call do not matter
    assert np.array_equal(run(lin, x[shuffled]).view(np.uint32), full[shuffled])


@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_mode_equals_graph_mode(dtype):
    require_kernel(dtype)
    x, w, b = random_case(16, 96, 40, seed=5, bias=True)
    lin = make_linear(w, b, dtype)
    assert np.array_equal(lin(Tensor(x)).asnumpy(), run(lin, x))


# ----- fused variants: RMSNorm / SwiGLU prologue, residual epilogue ------------------------------------------


class FusedCall(nn.Cell):
    """A ``LinearKernel`` called with the optional inputs of one variant (which ones is fixed per instance)."""

    def __init__(self, kern, bias, norm, residual):
        super().__init__()
        self.kern, self.bias, self.norm, self.residual = kern, bias, norm, residual

    def construct(self, x, b, w, r):
        return self.kern(x, b if self.bias else None, w if self.norm else None, r if self.residual else None)


def fused_reference(x, w, b, norm_w, res, prologue, eps):
    """float64: ``res + (a @ w + b)`` with ``a`` the prologue's activations; also returns ``a``."""
    x = x.astype(np.float64)
    if prologue == "rmsnorm":
        a = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * norm_w
    elif prologue == "swiglu":
        k = x.shape[1] // 2
        a = x[:, :k] / (1.0 + np.exp(-x[:, :k])) * x[:, k:]
    else:
        a = x
    y = a @ w.astype(np.float64) + (b if b is not None else 0.0)
    return (y + res if res is not None else y), a


VARIANTS = [("rmsnorm", False), ("rmsnorm", True), ("swiglu", False), ("swiglu", True), ("none", True)]


def make_variant(m, k, n, prologue, residual, bias, dtype, seed):
    from mindspore_eagle.kernels import LinearKernel

    x, w, b = random_case(m, 2 * k if prologue == "swiglu" else k, n, seed, bias)
    w = w[:k] if prologue == "swiglu" else w
    rng = np.random.default_rng(seed + 1)
    norm_w = (1.0 + 0.1 * rng.standard_normal(k)).astype(np.float32)
    res = rng.standard_normal((m, n)).astype(np.float32) if residual else None
    kern = LinearKernel(k, n, dtype, bias, glu=prologue == "swiglu", norm_eps=1e-5 if prologue == "rmsnorm" else None)
    kern.pack(w)
    call = FusedCall(kern, bias, prologue == "rmsnorm", residual)
    dummy = Tensor(np.zeros(1, np.float32))
    args = [Tensor(b) if bias else dummy, Tensor(norm_w), Tensor(res) if residual else dummy]
    return call, x, w, b, norm_w, res, args


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("prologue,residual", VARIANTS)
def test_fused_variants_match_float64(dtype, prologue, residual, bias):
    require_kernel(dtype)
    m, k, n = 9, 77, 50
    call, x, w, b, norm_w, res, args = make_variant(m, k, n, prologue, residual, bias, dtype, seed=21)
    y = ms.jit(call)(Tensor(x), *args).asnumpy()
    ref, a = fused_reference(x, w, b, norm_w, res, prologue, 1e-5)
    scale = np.abs(a) @ np.abs(w).astype(np.float64) + (np.abs(res) if residual else 0.0) + 1e-30
    # fp32: sequential-sum bound plus the activations' own few roundings; bf16: activations and weights rounded
    # to 8 bits, each product off by <= 2^-7 relative
    tol = (k + 16) * 2.0 ** -24 if dtype == "float32" else 2.0 ** -7
    assert np.all(np.abs(y - ref) <= tol * scale), np.max(np.abs(y - ref) / scale)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("prologue,residual", VARIANTS)
def test_fused_variant_row_does_not_depend_on_rows_in_the_call(dtype, prologue, residual):
    require_kernel(dtype)
    call, x, w, b, norm_w, res, args = make_variant(64, 577, 300, prologue, residual, True, dtype, seed=22)
    fn = ms.jit(call)

    def rows(sl):
        r = Tensor(res[sl]) if residual else args[2]
        return fn(Tensor(x[sl]), args[0], args[1], r).asnumpy().view(np.uint32)

    full = rows(slice(0, 64))
    for m in (1, 7, 16):
        assert np.array_equal(rows(slice(0, m)), full[:m]), m
    for i in (3, 40):
        assert np.array_equal(rows(slice(i, i + 1))[0], full[i])


def test_packed_layouts_match_the_documented_example():
    w = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32)  # K = 3, N = 2
    p = pack_f32(w)
    assert p.shape == (1, 3, 16)
    expect = np.zeros((1, 3, 16), np.float32)
    expect[0, :, :2] = w
    assert np.array_equal(p, expect)
    q = pack_bf16(w).view(np.uint16)
    assert q.shape == (1, 2, 32)
    b = {1.0: 0x3F80, 2.0: 0x4000, 3.0: 0x4040, 4.0: 0x4080, 5.0: 0x40A0, 6.0: 0x40C0}
    expect_q = np.zeros((1, 2, 32), np.uint16)
    expect_q[0, 0, :4] = [b[1.0], b[3.0], b[2.0], b[4.0]]  # (W00, W10), (W01, W11)
    expect_q[0, 1, :4] = [b[5.0], 0, b[6.0], 0]  # (W20, pad), (W21, pad)
    assert np.array_equal(q, expect_q)
    assert np.array_equal(pack_f32(w.T, transposed=True), p)


def test_bf16_packing_rounds_to_nearest_even():
    # 1 + 2^-8 is halfway between bf16 1.0 and 1 + 2^-7: ties go to the even mantissa (1.0); just above goes up
    vals = np.array([[1.0 + 2.0 ** -8, 1.0 + 2.0 ** -8 + 2.0 ** -20, 1.0 + 3 * 2.0 ** -8, -0.0]], np.float32)
    q = pack_bf16(vals).view(np.uint16)[0, 0, 0::2][:4]  # W [K=1, N=4]: entries (q=0, t=0) of columns 0..3
    assert list(q) == [0x3F80, 0x3F81, 0x3F82, 0x8000]
    assert list(q) == list(bf16_round(vals[0]).view(np.uint32) >> 16)


@pytest.mark.parametrize("dtype", DTYPES)
def test_tied_head_kernel_packs_the_transposed_table(dtype):
    require_kernel(dtype)
    from mindspore_eagle.kernels import LinearKernel

    x, w, _ = random_case(7, 64, 100, seed=9, bias=False)
    table = np.ascontiguousarray(w.T)  # [vocab, hidden], as the embedding is stored
    kern = LinearKernel(64, 100, dtype, transposed=True)
    kern.pack(table)
    assert np.array_equal(kern(Tensor(x), None).asnumpy(), run(make_linear(w, None, dtype), x))
    with pytest.raises(ConfigError, match="expected"):
        kern.pack(w)


def test_unpacked_kernel_is_refused_before_any_forward():
    require_kernel("float32")
    lin = Linear(8, 4, False, MatmulChoice("custom", "float32"))
    with pytest.raises(ConfigError, match="never packed"):
        check_packed(lin)
    assert np.isnan(lin(Tensor(np.ones((1, 8), np.float32))).asnumpy()).all()  # NaN, never a plausible result


def test_matmul_choice_validates_its_fields():
    with pytest.raises(ConfigError, match="backend"):
        MatmulChoice("onednn")
    with pytest.raises(ConfigError, match="dtype"):
        MatmulChoice("custom", "float16")
    with pytest.raises(ConfigError, match="no bf16 kernel"):
        MatmulChoice("mindspore", "bfloat16")


def test_unavailable_kernel_falls_back_to_mindspore_with_the_reason(monkeypatch):
    monkeypatch.setattr(kernel_ops, "kernel_status", lambda dtype: build.KernelStatus(None, "no AVX-512 here"))
    log = io.StringIO()
    assert ComputeChoice(matmul=MatmulChoice("custom", "bfloat16")).runnable(log) == ComputeChoice()
    assert "no AVX-512 here" in log.getvalue() and "MindSpore" in log.getvalue()
    with pytest.raises(ConfigError, match="no AVX-512 here"):
        Linear(8, 4, False, MatmulChoice("custom", "float32"))
    assert ComputeChoice().runnable() == ComputeChoice()


def test_build_is_keyed_by_flags_and_reports_failures_in_one_line(tmp_path, monkeypatch):
    loaded = build.load()  # the process's library, built in the real project home
    if loaded.library is not None:
        assert loaded.library.path == build.library_path() and loaded.library.path.startswith(build.kernels_dir())
    monkeypatch.setenv("MINDSPORE_EAGLE_HOME", str(tmp_path))
    assert build.library_path() != build.library_path(flags=build.FLAGS + ("-DMSE_TEST_KEY=1",))
    assert build.library_path().startswith(str(tmp_path / "kernels"))
    missing = build.build(cxx="no-such-compiler-xyz")
    assert missing.library is None and "not found" in missing.reason
    if loaded.library is None:
        pytest.skip(f"no working kernel build here: {loaded.reason}")
    broken = build.build(flags=build.FLAGS + ("-include/nonexistent/mse-missing.h",))
    assert broken.library is None and "failed" in broken.reason and "\n" not in broken.reason
    assert list((tmp_path / "kernels").iterdir()) == []  # neither a library nor a temporary file is left


_STRESS = r"""
import ctypes, sys
import numpy as np
from mindspore_eagle.kernels.build import load
from mindspore_eagle.kernels.layout import pack_bf16, pack_f32

lib = ctypes.CDLL(load().library.path)
out = {}
rng = np.random.default_rng(0)
for case, (m, k, n, dtype) in enumerate([(1, 576, 1536, "f32"), (16, 576, 192, "bf16"), (64, 1536, 576, "f32"),
                                         (7, 77, 50, "bf16"), (128, 64, 4000, "f32"), (3, 576, 49152, "bf16")]):
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    packed = pack_f32(w) if dtype == "f32" else pack_bf16(w)
    arrays = [x, packed, np.zeros((m, n), np.float32)]
    ndims = (ctypes.c_int * 3)(*[a.ndim for a in arrays])
    shapes = [(ctypes.c_int64 * a.ndim)(*a.shape) for a in arrays]
    shape_ptrs = (ctypes.POINTER(ctypes.c_int64) * 3)(*[ctypes.cast(s, ctypes.POINTER(ctypes.c_int64)) for s in shapes])
    names = [b"float32", b"float32" if dtype == "f32" else b"int16", b"float32"]
    dtypes = (ctypes.c_char_p * 3)(*names)
    params = (ctypes.c_void_p * 3)(*[a.ctypes.data for a in arrays])
    fn = lib.MseLinearF32 if dtype == "f32" else lib.MseLinearBf16
    for rep in range(30):  # many calls: the pool's claim / publish / take-over paths all run
        arrays[2][:] = np.nan
        assert fn(3, params, ndims, shape_ptrs, dtypes, None, None) == 0
        if rep == 0:
            first = arrays[2].copy()
        assert np.array_equal(arrays[2].view(np.uint32), first.view(np.uint32)), (case, rep)
    out[f"case{case}"] = first
lib.MseKernelWorkerChunks.restype = ctypes.c_int64
np.savez(sys.argv[1], threads=lib.MseKernelThreads(), worker_chunks=lib.MseKernelWorkerChunks(), **out)
"""


def test_results_do_not_depend_on_the_number_of_kernel_threads(tmp_path):
    """1 thread vs 4 threads on 2 cores (workers preempted, waking late, claiming varying shares of chunks):
    every output bit-identical, and identical across 30 repeated calls."""
    import os
    import subprocess
    import sys

    require_kernel("bfloat16")
    results = {}
    for threads in (1, 4):
        root = str(Path(__file__).resolve().parents[1])
        env = dict(os.environ, MSE_KERNEL_THREADS=str(threads), PYTHONPATH=root)
        path = tmp_path / f"t{threads}.npz"
        proc = subprocess.run([sys.executable, "-c", _STRESS, str(path)], env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]
        results[threads] = np.load(path)
        assert int(results[threads]["threads"]) == threads
    assert int(results[1]["worker_chunks"]) == 0 and int(results[4]["worker_chunks"]) > 0  # workers did compute
    for name in [f for f in results[1].files if f.startswith("case")]:
        assert not np.isnan(results[1][name]).any()
        assert np.array_equal(results[1][name].view(np.uint32), results[4][name].view(np.uint32)), name
