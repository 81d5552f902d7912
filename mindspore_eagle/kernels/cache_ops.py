"""The kernels that write the KV cache in place, as MindSpore Cells: fused cached attention and in-place row moves
(``attention.cc``), and a whole teacher decoder layer (``layer.cc``).

Why: on the CPU, ``ops.scatter_nd_update`` into a cache Parameter copies the whole buffer on every write (60
copies per forward of the default teacher), attention over the whole static cache costs the same at every
committed length, and the ~25 primitive ops of one attention layer each pay MindSpore's ~12 us dispatch.
``TreeAttentionKernel`` does RoPE, the cache write and the attention of one layer in one op that reads only the
visible cache rows; ``RowMoveKernel`` moves committed rows (``cache.commit.PathCommit``) without copying buffers;
``DecoderLayerKernel`` runs a teacher layer's five fused kernels as one op (one MindSpore dispatch per layer),
``DecoderStackKernel`` every layer of the teacher in one op.

All four write their cache inputs *in place*. MindSpore treats a Custom op as pure unless told otherwise: without
``side_effect_mem`` it drops an op whose output is unused and may order a read of the same Parameter before
the write (both observed on CPU with MindSpore 2.10). With it, the auto-monad pass threads the op through
MindSpore's memory-effect chain, like ``ScatterNdUpdate``: it is never elided, and reads of the written
Parameters are ordered after it, in the same graph, in later graphs and in PyNative
(tests/test_fused_attention.py checks all of these on the Parameter's own memory, ``param.asnumpy()``).
"""

from __future__ import annotations

import numpy as np
from mindspore import Tensor, nn, ops

from ..errors import ConfigError
from .ops import kernel_status

LANES = 16  # attention.cc's vector width: head_dim must be a multiple of it


def fused_attention_supported(head_dim: int) -> bool:
    """Whether ``TreeAttentionKernel`` takes this head size (its register blocks need ``head_dim % 16 == 0``)."""
    return head_dim > 0 and head_dim % LANES == 0


def _custom(symbol: str, out_shape, out_dtype):
    status = kernel_status("float32")
    if status.library is None:
        raise ConfigError(f"the fused attention kernels cannot run here: {status.reason}")
    op = ops.Custom(status.library.symbol(symbol), out_shape=out_shape, out_dtype=out_dtype, func_type="aot")
    op.add_prim_attr("side_effect_mem", True)  # writes its cache inputs: see the module docstring
    return op


class TreeAttentionKernel(nn.Cell):
    """``construct(qkv, cos, sin, mask, write_idx, k_cache, v_cache) -> out [B, T, H * D]`` (fp32).

    ``qkv [B, T, (H + 2 Hkv) D]`` is the output of the fused q/k/v projection (per token: H query heads, then
    Hkv key heads, then Hkv value heads, each D wide); ``cos, sin [B, 1, T, D]`` the RoPE rows of the tokens'
    positions; ``mask [B, 1, T, S]`` additive float32 (``tree.mask``); ``write_idx [B, Hkv, T, 3]`` int64 as
    built by ``models.layers.write_index`` (token t writes cache row ``write_idx[b, 0, t, 2]``);
    ``k_cache, v_cache [B, Hkv, S, D]`` float32 Parameters, written in place. The op ropes q and k, writes the
    new K/V rows, then computes ``softmax(q k^T / sqrt(D) + mask) v`` per query head over the visible span of
    its mask row only (numerics and batch invariance: attention.cc).
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int):
        super().__init__()
        if not fused_attention_supported(head_dim) or num_heads % num_kv_heads:
            raise ConfigError(f"TreeAttentionKernel: head_dim={head_dim} must be a multiple of {LANES} and "
                              f"num_heads={num_heads} a multiple of num_kv_heads={num_kv_heads}")
        width = num_heads * head_dim

        def infer_shape(qkv, *rest):
            return [qkv[0], qkv[1], width]

        def infer_dtype(qkv, *rest):
            return qkv

        self.op = _custom("MseTreeAttention", infer_shape, infer_dtype)

    def construct(self, qkv, cos, sin, mask, write_idx, k_cache, v_cache):
        return self.op(qkv, cos, sin, mask, write_idx, k_cache, v_cache)


class RowMoveKernel(nn.Cell):
    """``construct(src_rows [B, P], dst_rows [B, P], *caches) -> dst_rows``: row ``src_rows[b, j]`` of every
    cache buffer ``[B, Hkv, S, D]`` (any dtype) is copied to row ``dst_rows[b, j]``, in place, all reads of a
    buffer before its writes. Indices int32 in ``[0, S)`` (the kernel refuses others before writing)."""

    def __init__(self):
        super().__init__()

        def infer_shape(src, dst, *caches):
            return dst

        def infer_dtype(src, dst, *caches):
            return dst

        self.op = _custom("MseMoveRows", infer_shape, infer_dtype)

    def construct(self, src_rows, dst_rows, caches):
        return self.op(src_rows, dst_rows, *caches)


class DecoderLayerKernel(nn.Cell):
    """``construct(x, norm1, w_qkv, b_qkv, cos, sin, mask, write_idx, k_cache, v_cache, w_o, b_o, norm2, w_gu,
    w_down) -> out [B, T, E]``: ``h = x + o(attention(qkv(rms_norm(x; norm1))))``, ``out = h + down(swiglu(
    gate_up(rms_norm(h; norm2))))``, the K/V rows written in place. The ``w_*`` are the packed weights of the layer's
    ``LinearKernel`` s (q|k|v, o, gate|up, down), ``b_qkv`` / ``b_o`` the biases (None when the model has none),
    the rest as for ``TreeAttentionKernel``. Bit-identical to running those five kernels one by one (layer.cc).
    """

    def __init__(self, dtype: str, qkv_bias: bool, o_bias: bool, eps: float):
        super().__init__()
        self.qkv_bias, self.o_bias = qkv_bias, o_bias
        self.eps = Tensor(np.array([eps], np.float32))
        name = f"MseDecoderLayer{'Bf16' if dtype == 'bfloat16' else 'F32'}{'QkvBias' if qkv_bias else ''}" \
               f"{'OBias' if o_bias else ''}"

        def infer_shape(x, *rest):
            return x

        def infer_dtype(x, *rest):
            return x

        self.op = _custom(name, infer_shape, infer_dtype)

    def construct(self, x, norm1, w_qkv, b_qkv, cos, sin, mask, write_idx, k_cache, v_cache, w_o, b_o, norm2, w_gu,
                  w_down):
        args = (x, norm1, self.eps, w_qkv)
        if self.qkv_bias:
            args = args + (b_qkv,)
        args = args + (cos, sin, mask, write_idx, k_cache, v_cache, w_o)
        if self.o_bias:
            args = args + (b_o,)
        return self.op(*(args + (norm2, w_gu, w_down)))


class DecoderStackKernel(nn.Cell):
    """``construct(ids, positions, rows, mask, embed, cos_table, sin_table, layer_args) -> (hidden [B, T, E], aux
    [B, T, A E])``: a whole teacher decoder stack in one op (layer.cc). The embedding rows of ``ids``, the RoPE rows
    of ``positions`` and the write index of ``rows`` (``models.layers.write_index``) are taken inside, then every
    layer as ``DecoderLayerKernel`` runs it; ``hidden`` is the last layer's output (before the final norm), ``aux``
    the hidden states entering the layers ``taps`` in that order (the EAGLE-3 features). ``layer_args``: per layer,
    ``(norm1, w_qkv[, b_qkv], k_cache, v_cache, w_o[, b_o], norm2, w_gu, w_down)`` concatenated (the biases only
    when the model has them). Bit-identical to the per-layer ops (the same functions on the same data, copies
    aside), so just as batch invariant. Why: MindSpore spends ~35 us scheduling each op that follows a long one and
    ~1.5 ms on the small ops before the first layer (embedding, RoPE gathers, write index): ~2.5 ms of an 11 ms
    decode step of the default teacher on a Zen 4 (docs/kernels.md).

    Ids, positions and rows outside the embedding table, the RoPE tables and the cache are refused (the op fails)
    before any layer writes its cache."""

    def __init__(self, dtype: str, qkv_bias: bool, o_bias: bool, eps: float, taps: tuple[int, ...]):
        super().__init__()
        if not taps:
            raise ConfigError("DecoderStackKernel: at least one tap layer (the EAGLE-3 features)")
        self.eps = Tensor(np.array([eps], np.float32))
        self.taps = Tensor(np.array(taps, np.int32))
        name = f"MseDecoderStack{'Bf16' if dtype == 'bfloat16' else 'F32'}{'QkvBias' if qkv_bias else ''}" \
               f"{'OBias' if o_bias else ''}"

        def infer_shape(ids, positions, rows, mask, embed, cos, sin, eps, taps, *rest):
            return list(ids) + [embed[1]], list(ids) + [taps[0] * embed[1]]

        def infer_dtype(ids, positions, rows, mask, embed, *rest):
            return embed, embed

        self.op = _custom(name, infer_shape, infer_dtype)

    def construct(self, ids, positions, rows, mask, embed, cos_table, sin_table, layer_args):
        return self.op(ids, positions, rows, mask, embed, cos_table, sin_table, self.eps, self.taps, *layer_args)


def fused_layer_supported(hidden: int, intermediate: int, head_dim: int) -> bool:
    """Whether ``DecoderLayerKernel`` takes these sizes: whole 16-column panels everywhere (hidden, 2 x intermediate
    and head_dim multiples of 16) and an even intermediate size (the bf16 pairs of the down projection)."""
    return (fused_attention_supported(head_dim) and hidden % LANES == 0 and (2 * intermediate) % LANES == 0
            and intermediate % 2 == 0)


__all__ = ["DecoderLayerKernel", "DecoderStackKernel", "LANES", "RowMoveKernel", "TreeAttentionKernel",
           "fused_attention_supported", "fused_layer_supported"]
