"""The two attention cores, reference and fused, and the rule between them; ``compute.choose`` is the one place
that applies it (with the matmul choice).

``CachedAttention`` (teacher and draft head) scatters the new K/V into its static cache and then asks the
*attention core* built here for ``softmax(q k^T * scale + mask) v`` over the cache rows ``[0, S)``: the whole
cache, or the context bucket the mask is as wide as (``CachedAttention``). Two cores, one interface
``core(q [B, H, T, D], k_all, v_all [B, Hkv, S, D], mask [B, 1, T, S]) -> [B, H, T, D] float32``:

* ``ReferenceAttention`` -- primitives only (BatchMatMul, Softmax), fp32, every device. It consumes the
  additive float32 mask of ``tree.mask`` (0 visible, ``MASK_VALUE`` hidden). GQA without repeating K/V: the
  ``rep = H / Hkv`` query heads sharing a KV head are folded into rows, ``[B, H, T, D] -> [B, Hkv, rep*T, D]``.
* ``FusedAttention`` -- Ascend only, graph mode: one call of MindSpore's fused infer attention op.

Backend per (device, exec mode), ``select_backend`` (called by ``compute.choose`` only):

    CPU,    reference | performance  -> "reference"   (no fused attention kernel exists on CPU)
    Ascend, performance (graph)      -> "fused"
    Ascend, reference (PyNative)     -> "reference"   (the check path; ``deploy`` refuses it for serving)

The fused op's contract, as documented: ``mindspore.ops.fused_infer_attention_score``, MindSpore API docs
(mindspore.cn/docs/en/r2.9.0/api_python/ops/mindspore.ops.fused_infer_attention_score.html, same text r2.6 -
r2.11, and the installed docstring of MindSpore 2.10.0):

    out, _ = ops.fused_infer_attention_score(query, key, value, atten_mask=mask, num_heads=H,
                                             num_key_value_heads=Hkv, scale=1/sqrt(D), input_layout="BNSD",
                                             sparse_mode=0, inner_precise=0)

* ``query [B, H, T, D]``, ``key/value [B, Hkv, S, D]`` (layout ``"BNSD"``), dtype float16 / bfloat16 (no float32:
  the fused core keeps its KV cache in ``compute_dtype`` and casts q in and the output back to float32).
  ``num_key_value_heads`` must equal the key's N axis in BNSD; ``H / Hkv <= 64``; D <= 512 and 16-aligned
  for fp16/bf16 when T > 1 (``deploy.check_model`` refuses other shapes before anything compiles).
* ``atten_mask``: int8 / uint8 / bool, **1 = discard, 0 = keep** (``tree.mask``'s "Ascend uint8" convention).
  Shape ``[B, 1, T, S]`` is in the documented list for both branches of the op (T > 1: ``B,1,Q_S,KV_S``,
  the PromptFlashAttention branch; T == 1: ``B,1,1,KV_S``, the IncreFlashAttention branch), so one shape
  serves decode, tree verification and prefill chunks.
* ``sparse_mode=0`` ("defaultMask"): the complete ``S1 x S2`` mask is given and applied as is; modes 2-4 want a
  fixed 2048x2048 causal template and cannot express a tree. ``pre_tokens/next_tokens`` keep their INT_MAX
  defaults (no band).
* ``inner_precise=0``: high precision for fp16, valid in both branches (T == 1 accepts only 0 and 1). Row
  invalidity correction (2, 3) is unnecessary: no row of our masks is ever fully masked (a padding row sees
  itself; see ``tree.mask``).
* Returns ``(attention_out, softmax_lse)``; ``attention_out`` has the query's shape and dtype.

Where the mask conversion happens: in the graph. ``Teacher.forward`` ships the additive float32 mask (the
convention every host builder in ``tree.mask`` produces); the fused core turns it into the uint8 form with
``fused_mask`` (``1`` where the additive value is negative) -- the in-graph twin of
``tree.mask.ascend_uint8_from_bool(additive == 0)``, tested equal to ``tree.mask.ascend_tree_mask``. A caller
that already ships the uint8/bool form passes straight through: the mask dtype is a compile-time constant, so the
choice costs nothing at run time.

Cores are chosen when a ``CachedAttention`` is *built*, from the ``AttentionChoice`` of the ``compute.ComputeChoice``
it is given: the one builder (``mindspore_eagle.app.build``) gets it from ``deploy.prepare`` (``compute.choose``)
and passes the same choice to the teacher and to the draft head; nothing is read from ambient state. Not verifiable
here (no NPU): the op's numerics, its speed, and that the two branches (T == 1 and T > 1) round identically, which
greedy-vs-speculative equality on Ascend needs.
A report to check first on hardware: vllm-ascend issue #15503 (torch_npu, paged KV with ``block_table``) found
the T == 1 branch ignoring a ``[1, 1, 1, S]`` bool mask past KV position 512; our decode mask has exactly that
shape for B == 1 (no paging here, so it may not apply).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from .runtime import ExecMode
from .errors import ConfigError

REFERENCE = "reference"
FUSED = "fused"
BACKENDS = (REFERENCE, FUSED)
COMPUTE_DTYPES = {"float16": ms.float16, "bfloat16": ms.bfloat16}


def select_backend(device: str, exec_mode: ExecMode) -> str:
    """The attention backend for a runtime: fused only on Ascend in performance (graph) mode."""
    if device not in ("CPU", "Ascend"):
        raise ConfigError(f"device={device!r}: expected 'CPU' or 'Ascend'")
    return FUSED if device == "Ascend" and ExecMode.parse(exec_mode) is ExecMode.PERFORMANCE else REFERENCE


@dataclass(frozen=True)
class AttentionChoice:
    """What ``CachedAttention`` builds: the backend, the fused op's compute dtype, and the op itself.

    ``op`` is ``None`` for MindSpore's ``ops.fused_infer_attention_score``; any callable with the same
    signature may stand in (the CPU tests pass a numpy emulation of the documented contract, in PyNative).
    """

    backend: str = REFERENCE
    compute_dtype: str = "float16"
    op: Callable | None = None

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"attention backend={self.backend!r}: expected one of {BACKENDS}")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ConfigError(f"attention compute_dtype={self.compute_dtype!r}: the fused op takes one of "
                              f"{sorted(COMPUTE_DTYPES)}")


# ----- the mask, in-graph ------------------------------------------------------------------------------


def fused_mask(mask):
    """Additive float mask (0 visible, negative hidden) -> uint8 mask (1 = masked out), same shape.

    A bool/uint8/int8 mask is taken to be in the fused convention already and returned unchanged (the dtype is
    static, so graph mode resolves this branch at compile time). In-graph twin of
    ``tree.mask.ascend_uint8_from_bool(additive == 0)``. Example: ``[0, -1e9, 0] -> [0, 1, 0]``.
    """
    if mask.dtype in (ms.bool_, ms.uint8, ms.int8):
        return mask
    return ops.cast(ops.less(mask, 0.0), ms.uint8)


# ----- the two cores ------------------------------------------------------------------------------------


class ReferenceAttention(nn.Cell):
    """Masked GQA attention from primitives, fp32. ``construct(q, k_all, v_all, mask) -> [B, H, T, D]``.

    ``mask [B, 1, T, S]`` additive float32. The query group is folded into rows so one BatchMatMul runs
    against the un-repeated cache: head ``h = g * rep + r`` reads KV head ``g``.
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.rep = num_heads // num_kv_heads
        self.scale = 1.0 / math.sqrt(head_dim)
        self.qk = ops.BatchMatMul(transpose_b=True)
        self.pv = ops.BatchMatMul()
        self.softmax = ops.Softmax(-1)

    def construct(self, q, k_all, v_all, mask):
        b, _, t, _ = q.shape
        q = q.reshape(b, self.num_kv_heads, self.rep * t, self.head_dim)  # fold the query group into rows
        scores = self.qk(q, k_all) * self.scale  # [B, Hkv, rep*T, S]
        s = scores.shape[-1]
        scores = scores.reshape(b, self.num_kv_heads, self.rep, t, s) + mask.reshape(b, 1, 1, t, s)
        probs = self.softmax(scores).reshape(b, self.num_kv_heads, self.rep * t, s)
        out = self.pv(probs, v_all)  # [B, Hkv, rep*T, D]
        return out.reshape(b, self.num_heads, t, self.head_dim)


class FusedAttention(nn.Cell):
    """One call of the fused infer attention op (contract in the module docstring).

    ``construct(q [B, H, T, D] float32, k_all, v_all [B, Hkv, S, D] compute_dtype, mask) -> [B, H, T, D] float32``;
    ``mask`` additive float32 (converted in-graph) or already uint8/bool with 1 = masked out.
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, compute_dtype: str = "float16",
                 op: Callable | None = None):
        super().__init__()
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.scale = 1.0 / math.sqrt(head_dim)
        self.dtype = COMPUTE_DTYPES[compute_dtype]
        self.op = op if op is not None else ops.fused_infer_attention_score

    def construct(self, q, k_all, v_all, mask):
        out = self.op(ops.cast(q, self.dtype), k_all, v_all, atten_mask=fused_mask(mask),
                      num_heads=self.num_heads, num_key_value_heads=self.num_kv_heads, scale=self.scale,
                      input_layout="BNSD", sparse_mode=0, inner_precise=0)
        return ops.cast(out[0], ms.float32)


def make_core(num_heads: int, num_kv_heads: int, head_dim: int, choice: AttentionChoice) -> nn.Cell:
    """The attention core for ``choice``. The real fused op needs the Ascend device target: elsewhere this raises
    ConfigError here, not a kernel-selection failure deep inside a graph compile."""
    if choice.backend == REFERENCE:
        return ReferenceAttention(num_heads, num_kv_heads, head_dim)
    if choice.op is None:
        target = ms.get_context("device_target")
        if target != "Ascend":
            raise ConfigError(f"attention backend 'fused' calls ops.fused_infer_attention_score, an Ascend-only "
                              f"kernel, but MindSpore's device target is {target!r}; use backend 'reference' "
                              "(compute.choose on a CPU runtime) or deploy on Ascend (mindspore_eagle.deploy)")
    return FusedAttention(num_heads, num_kv_heads, head_dim, choice.compute_dtype, choice.op)


def cache_dtype(choice: AttentionChoice):
    """The KV cache dtype a core reads: float32 for the reference core, the op's compute dtype for the fused one."""
    return ms.float32 if choice.backend == REFERENCE else COMPUTE_DTYPES[choice.compute_dtype]


def zeros_cache(shape: tuple[int, ...], choice: AttentionChoice) -> Tensor:
    """A zero KV cache buffer in ``cache_dtype(choice)``."""
    zeros = Tensor(np.zeros(shape, np.float32))
    return zeros if choice.backend == REFERENCE else zeros.astype(cache_dtype(choice))


__all__ = ["AttentionChoice", "BACKENDS", "COMPUTE_DTYPES", "FUSED", "FusedAttention", "REFERENCE",
           "ReferenceAttention", "cache_dtype", "fused_mask", "make_core", "select_backend", "zeros_cache"]
