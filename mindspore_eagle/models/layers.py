"""Building blocks of a Llama-family decoder: Linear, RMSNorm, rotary embeddings, cached GQA attention, SwiGLU.

Why these are written by hand: on the CPU backend MindSpore has no fused RMSNorm, RoPE or attention kernel,
and ``nn.Dense`` stores weights ``[out, in]`` and multiplies 3-D by 2-D, which lowers to
BroadcastTo + BatchMatMul (measured 5x slower). Every Linear here keeps its weight ``[in, out]`` and does one
2-D ``MatMul`` on the flattened tokens -- or, with ``MatmulChoice(backend="custom")``, one call of the
batch-invariant kernel of ``mindspore_eagle.kernels`` on a packed copy of the weight.

Parameter names mirror HuggingFace (``self_attn.q_proj.weight`` ...) so a checkpoint maps onto this model
by name; only the orientation of Linear weights differs (transposed by the converter).

Two implementations, one interface. ``CachedAttention`` and ``SwiGLU`` take an optional ``norm_weight`` (the
RMSNorm of their input is then theirs to take) and an optional ``residual`` (added to their output), so a
decoder layer is ``x = attn(x, ..., norm_weight=w1, residual=x); x = mlp(x, norm_weight=w2, residual=x)``:

* primitive path (``MatmulChoice`` "mindspore", or the Ascend fused attention core): MindSpore ops, exactly the
  ops of ``x + attn(rms_norm(x))`` -- the reference, the trainer's path (it has gradients) and Ascend's;
* fused CPU path (``compute.ComputeChoice.fused_layers``: a custom ``MatmulChoice`` with the reference attention
  backend): per decoder layer five AOT kernels instead of ~45 ops -- RMSNorm + q/k/v in one linear kernel, RoPE +
  in-place K/V write + masked attention over the visible rows in one (``kernels.TreeAttentionKernel``), o_proj +
  residual, RMSNorm + gate|up, SwiGLU + down + residual. The Linears keep the checkpoint weights (same names); the
  kernels hold packed copies of the concatenated weights (``pack_kernel``). Batch invariant like the linear kernels.
"""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from .. import attention
from ..compute import ComputeChoice
from ..fields import RopeScaling
from ..teacher_config import TeacherConfig
from ..errors import ConfigError
from ..kernels import LinearKernel, MatmulChoice, TreeAttentionKernel


def pack_linear(kernel: LinearKernel, linears: tuple, native: dict | None) -> None:
    """Pack ``kernel`` from ``linears`` (their outputs concatenated, in order): from the checkpoint's quantized
    blocks when ``native`` holds every one of their weights in an exactly-computed format, else from the dense
    ``[in, out]`` weights (the same values: layout.py)."""
    parts = [native.get(lin.weight.name) for lin in linears] if native else [None]
    if None in parts or not kernel.pack_native(parts):
        kernel.pack(np.concatenate([lin.weight.asnumpy() for lin in linears], 1))


class Linear(nn.Cell):
    """``y = x @ weight + bias`` with ``weight [in, out]``, one 2-D matmul over all leading dims.

    ``matmul`` chooses the implementation (default: MindSpore's MatMul). A custom choice multiplies with a
    packed copy of ``weight`` that ``pack_kernel()`` fills (``kernels.pack_weights``) after loading.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False, matmul: MatmulChoice | None = None):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(Tensor(np.zeros((in_features, out_features), np.float32)), name="weight")
        self.has_bias = bias
        if bias:
            self.bias = Parameter(Tensor(np.zeros((out_features,), np.float32)), name="bias")
        self.matmul = ops.MatMul()
        self.custom = matmul is not None and matmul.custom
        if self.custom:
            self.kernel = LinearKernel(in_features, out_features, matmul.dtype, bias)

    def pack_kernel(self, native: dict | None = None) -> None:
        if self.custom:
            pack_linear(self.kernel, (self,), native)

    def construct(self, x):
        if self.custom and self.has_bias:  # the kernel takes any leading dims
            return self.kernel(x, self.bias)
        if self.custom:
            return self.kernel(x, None)
        lead = x.shape[:-1]
        y = self.matmul(x.reshape(-1, self.in_features), self.weight)  # [prod(lead), out]
        if self.has_bias:
            y = y + self.bias
        return y.reshape(lead + (self.out_features,))


class Embedding(nn.Cell):
    """Token embedding ``weight [vocab, hidden]``; also the tied LM head of SmolLM2-style models."""

    def __init__(self, vocab_size: int, dim: int):
        super().__init__()
        self.weight = Parameter(Tensor(np.zeros((vocab_size, dim), np.float32)), name="weight")

    def construct(self, ids):
        return ops.gather(self.weight, ids, 0)


def rms_norm(x, weight, eps: float):
    """``x / sqrt(mean(x^2) + eps) * weight`` (Llama's RMSNorm, computed in fp32), from primitives."""
    var = ops.mean(ops.square(x), -1, keep_dims=True)
    return x * ops.rsqrt(var + eps) * weight


class RMSNorm(nn.Cell):
    """``rms_norm(x, weight, eps)`` with its own weight Parameter."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = Parameter(Tensor(np.ones((dim,), np.float32)), name="weight")
        self.eps = eps

    def construct(self, x):
        return rms_norm(x, self.weight, self.eps)


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> np.ndarray:
    """Inverse frequencies ``[head_dim/2]`` in float32, as HuggingFace computes them (incl. llama3 scaling)."""
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv_freq = (np.float32(1.0) / (np.float32(theta) ** exponents)).astype(np.float32)
    if scaling is None:
        return inv_freq
    if scaling.kind == "linear":
        return (inv_freq / np.float32(scaling.factor)).astype(np.float32)
    # llama3: long wavelengths are divided by `factor`, short ones kept, the band between interpolated.
    old_len = scaling.original_max_position_embeddings
    low_wavelen = old_len / scaling.low_freq_factor
    high_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_tables(cfg: TeacherConfig, max_positions: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin tables ``[max_positions, head_dim]`` in HF's rotate-half layout (halves repeated)."""
    inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    pos = np.arange(max_positions, dtype=np.float32)[:, None]
    freqs = (pos * inv_freq[None, :]).astype(np.float32)  # [P, D/2]
    emb = np.concatenate([freqs, freqs], axis=-1)  # [P, D]
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


def apply_rope(x, cos, sin):
    """Rotate ``x [B, H, T, D]`` by ``cos/sin [B, 1, T, D]`` (rotate-half: ``[-x2, x1]``)."""
    half = x.shape[-1] // 2
    x1 = x[..., :half]
    x2 = x[..., half:]
    rotated = ops.concat((-x2, x1), -1)
    return x * cos + rotated * sin


class CachedAttention(nn.Cell):
    """Grouped-query attention over a static KV cache owned by this cell.

    The cache is two ``Parameter`` buffers ``[B, kv_heads, max_len, head_dim]``. A forward first writes the new
    keys/values into the rows given by ``write_idx`` and then attends over the buffer; the
    ``mask [B, 1, T, W]`` (additive float32, see ``tree.mask``) decides which rows each query sees
    (committed prefix, its own tree ancestors, itself), so stale or speculative rows never leak in.

    ``construct(x, cos, sin, mask, write_idx, norm_weight=None, residual=None)`` returns
    ``residual + o_proj(attention(rms_norm(x, norm_weight)))``, each part only when given.

    ``compute`` (a ``compute.ComputeChoice``, given by the builder) picks the path and, on the primitive one, the
    attention core (``compute.attention``: primitives on CPU, the fused op on Ascend) and the Linears' matmul.
    Primitive path: the new rows are scattered with ``ScatterNdUpdate`` (a whole-buffer copy on CPU) and the core
    reads the buffer's rows ``[0, W)``: ``W`` is the mask's width, a *context bucket*
    (``RuntimeConfig.context_sizes``) that holds every row the forward writes or sees, so a forward at a short
    context does not attend over the whole cache. ``W`` is a static shape: one graph per (T, W). The cache dtype is
    the core's (float32 for the reference core). Fused CPU path (``compute.fused_layers``): three kernels, see the
    module docstring; the attention kernel writes only the new rows and reads only each query's visible rows (its
    mask must be ``W = max_len`` wide).
    ``in_features``: the projections' input width (default ``hidden_size``; the EAGLE-3 head reads 2H).
    """

    def __init__(self, cfg: TeacherConfig, batch_size: int, max_len: int, compute: ComputeChoice = ComputeChoice(),
                 in_features: int | None = None):
        super().__init__()
        if not isinstance(compute, ComputeChoice):
            raise ConfigError(f"CachedAttention: compute must be a compute.ComputeChoice, got {compute!r}")
        choice, matmul = compute.attention, compute.matmul
        h, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        width = in_features or cfg.hidden_size
        self.num_heads, self.num_kv_heads, self.head_dim = h, hkv, d
        self.eps = cfg.rms_norm_eps
        self.fused = compute.fused_layers(d)
        linear_choice = None if self.fused else matmul  # fused: the Linears only hold the checkpoint weights
        self.q_proj = Linear(width, h * d, cfg.qkv_bias, linear_choice)
        self.k_proj = Linear(width, hkv * d, cfg.qkv_bias, linear_choice)
        self.v_proj = Linear(width, hkv * d, cfg.qkv_bias, linear_choice)
        self.o_proj = Linear(h * d, cfg.hidden_size, cfg.o_bias, linear_choice)
        self.qkv_bias, self.o_bias = cfg.qkv_bias, cfg.o_bias
        if self.fused:
            self.qkv_kernel = LinearKernel(width, (h + 2 * hkv) * d, matmul.dtype, cfg.qkv_bias,
                                           norm_eps=cfg.rms_norm_eps)
            self.attention_kernel = TreeAttentionKernel(h, hkv, d)
            self.o_kernel = LinearKernel(h * d, cfg.hidden_size, matmul.dtype, cfg.o_bias)
        else:
            self.core = attention.make_core(h, hkv, d, choice)
        self.cast_kv = choice.backend != attention.REFERENCE  # the fused core's cache is fp16/bf16
        self.kv_dtype = attention.cache_dtype(choice)
        shape = (batch_size, hkv, max_len, d)
        self.k_cache = Parameter(attention.zeros_cache(shape, choice), name="k_cache", requires_grad=False)
        self.v_cache = Parameter(attention.zeros_cache(shape, choice), name="v_cache", requires_grad=False)

    def pack_kernel(self, native: dict | None = None) -> None:
        """Pack the fused kernels from the checkpoint weights: q|k|v concatenated along the outputs, and o_proj
        (from the quantized blocks in ``native`` where every part has them: ``kernels.pack_weights``)."""
        if self.fused:
            pack_linear(self.qkv_kernel, (self.q_proj, self.k_proj, self.v_proj), native)  # [in, (H + 2 Hkv) D]
            pack_linear(self.o_kernel, (self.o_proj,), native)

    def construct(self, x, cos, sin, mask, write_idx, norm_weight=None, residual=None):
        if self.fused:
            return self._fused(x, cos, sin, mask, write_idx, norm_weight, residual)
        if norm_weight is not None:
            x = rms_norm(x, norm_weight, self.eps)
        out = self._primitive(x, cos, sin, mask, write_idx)
        return out if residual is None else residual + out

    def _fused(self, x, cos, sin, mask, write_idx, norm_weight, residual):
        bias = None
        if self.qkv_bias:
            bias = ops.concat((self.q_proj.bias, self.k_proj.bias, self.v_proj.bias))
        qkv = self.qkv_kernel(x, bias, norm_weight)  # [B, T, (H + 2 Hkv) D]
        out = self.attention_kernel(qkv, cos, sin, mask, write_idx, self.k_cache, self.v_cache)  # [B, T, H D]
        return self.o_kernel(out, self.o_proj.bias if self.o_bias else None, None, residual)  # [B, T, hidden]

    def _primitive(self, x, cos, sin, mask, write_idx):
        b, t, _ = x.shape
        q = self.q_proj(x).reshape(b, t, self.num_heads, self.head_dim).transpose(0, 2, 1, 3)  # [B, H, T, D]
        k = self.k_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim).transpose(0, 2, 1, 3)  # [B, Hkv, T, D]
        v = self.v_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim).transpose(0, 2, 1, 3)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        if self.cast_kv:
            k = ops.cast(k, self.kv_dtype)
            v = ops.cast(v, self.kv_dtype)
        k_all = ops.scatter_nd_update(self.k_cache, write_idx, k)  # [B, Hkv, S, D]
        v_all = ops.scatter_nd_update(self.v_cache, write_idx, v)
        width = mask.shape[-1]  # static: the context bucket of this graph
        if width < k_all.shape[2]:
            k_all = k_all[:, :, :width]  # [B, Hkv, W, D]: rows >= W are hidden from every query anyway
            v_all = v_all[:, :, :width]
        out = self.core(q, k_all, v_all, mask)  # [B, H, T, D] float32
        out = out.transpose(0, 2, 1, 3).reshape(b, t, -1)
        return self.o_proj(out)


class SwiGLU(nn.Cell):
    """``construct(x, norm_weight=None, residual=None) = residual + down(silu(gate(a)) * up(a))`` with
    ``a = rms_norm(x, norm_weight, eps)`` (each part only when given).

    With a custom ``matmul`` two kernels: RMSNorm + gate|up (one weight ``[hidden, 2 * intermediate]``), then
    SwiGLU + down + residual; the Linears keep the checkpoint weights."""

    def __init__(self, hidden: int, intermediate: int, matmul: MatmulChoice | None = None, eps: float = 1e-6):
        super().__init__()
        self.fused = matmul is not None and matmul.custom
        linear_choice = None if self.fused else matmul
        self.gate_proj = Linear(hidden, intermediate, matmul=linear_choice)
        self.up_proj = Linear(hidden, intermediate, matmul=linear_choice)
        self.down_proj = Linear(intermediate, hidden, matmul=linear_choice)
        self.eps = eps
        if self.fused:
            self.gate_up_kernel = LinearKernel(hidden, 2 * intermediate, matmul.dtype, norm_eps=eps)
            self.down_kernel = LinearKernel(intermediate, hidden, matmul.dtype, glu=True)

    def pack_kernel(self, native: dict | None = None) -> None:
        """Pack gate|up concatenated along the outputs, and down (which reads their SwiGLU)."""
        if self.fused:
            pack_linear(self.gate_up_kernel, (self.gate_proj, self.up_proj), native)
            pack_linear(self.down_kernel, (self.down_proj,), native)

    def construct(self, x, norm_weight=None, residual=None):
        if self.fused:
            gate_up = self.gate_up_kernel(x, None, norm_weight)  # [..., 2 * intermediate]
            return self.down_kernel(gate_up, None, None, residual)
        if norm_weight is not None:
            x = rms_norm(x, norm_weight, self.eps)
        out = self.down_proj(ops.silu(self.gate_proj(x)) * self.up_proj(x))
        return out if residual is None else residual + out


def write_index(cache_rows, num_kv_heads: int):
    """Scatter index ``[B, Hkv, T, 3]`` (batch, head, row) for writing token ``t`` of batch ``b`` to row
    ``cache_rows[b, t]`` of every KV head. Built once per forward and shared by all layers.

    Example: B=1, Hkv=2, cache_rows=[[5, 6]] ->
        [[[[0,0,5],[0,0,6]], [[0,1,5],[0,1,6]]]]
    """
    b, t = cache_rows.shape
    rows = ops.cast(cache_rows, ms.int64).reshape(b, 1, t, 1)
    rows = ops.broadcast_to(rows, (b, num_kv_heads, t, 1))
    bi = ops.broadcast_to(ops.arange(b, dtype=ms.int64).reshape(b, 1, 1, 1), (b, num_kv_heads, t, 1))
    hi = ops.broadcast_to(ops.arange(num_kv_heads, dtype=ms.int64).reshape(1, num_kv_heads, 1, 1),
                          (b, num_kv_heads, t, 1))
    return ops.concat((bi, hi, rows), -1)
