"""The KV-cache kernels of ``attention.cc`` as MindSpore Cells: fused cached attention and in-place row moves.

Why: on the CPU, ``ops.scatter_nd_update`` into a cache Parameter copies the whole buffer on every write (60
copies per forward of the default teacher), attention over the whole static cache costs the same at every
committed length, and the ~25 primitive ops of one attention layer each pay MindSpore's ~12 us dispatch.
``TreeAttentionKernel`` does RoPE, the cache write and the attention of one layer in one op that reads only the
visible cache rows; ``RowMoveKernel`` moves committed rows (``cache.commit.PathCommit``) without copying buffers.

Both write their cache inputs *in place*. MindSpore treats a Custom op as pure unless told otherwise: without
``side_effect_mem`` it drops an op whose output is unused and may order a read of the same Parameter before
the write (both observed on CPU with MindSpore 2.10). With it, the auto-monad pass threads the op through
MindSpore's memory-effect chain, like ``ScatterNdUpdate``: it is never elided, and reads of the written
Parameters are ordered after it, in the same graph, in later graphs and in PyNative
(tests/test_fused_attention.py checks all of these on the Parameter's own memory, ``param.asnumpy()``).
"""

from __future__ import annotations

from mindspore import nn, ops

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


__all__ = ["LANES", "RowMoveKernel", "TreeAttentionKernel", "fused_attention_supported"]
