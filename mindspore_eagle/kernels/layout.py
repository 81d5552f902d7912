"""Packed weight layouts read by the kernels of ``linear.cc``, made once from a checkpoint weight (numpy).

A weight ``W [K, N]`` (our Linear layout ``[in, out]``; the tied LM head passes the embedding table
``[vocab, hidden] = W^T`` with ``transposed=True``) is cut into panels of 16 output columns, each stored
contiguously along K so that a thread streams whole panels:

    fp32:  P [np, K, 16]        P[p, k, j]      = W[k, 16p + j]
    bf16:  Q [np, ceil(K/2), 32] Q[p, q, 2j + t] = bf16(W[2q + t, 16p + j])     (uint16 bits, stored as int16)

``np = ceil(N / 16)``; columns past N and the extra K row of an odd K are zero. Example, K = 3, N = 2 (one
panel): ``P[0] = [[W00, W01, 0 x 14], [W10, W11, 0 ...], [W20, W21, 0 ...]]`` and
``Q[0] = [[b(W00), b(W10), b(W01), b(W11), 0 ...], [b(W20), 0, b(W21), 0, 0 ...]]``: each fp32 lane of the
bf16 kernel reads the pair (W[2q, n], W[2q+1, n]) of one column n.

Memory: the packed fp32 copy is as large as the weight (plus < 16 columns of padding), the bf16 copy half of
it; the original fp32 Parameter is kept (checkpoint loading, the MindSpore path, training).
"""

from __future__ import annotations

import numpy as np

LANES = 16  # output columns per panel (the kernels' 16-lane vector, compute.cc)


def panel_count(out_features: int) -> int:
    return -(-out_features // LANES)


def bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), rounding to nearest even; NaN stays a (quiet) NaN; a subnormal
    becomes a zero of its sign (AVX512-BF16 treats subnormal inputs as zero, so every kernel path multiplies
    the same values; linear.cc rounds activations by the same rule)."""
    a = np.ascontiguousarray(a, np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    sign = ((u >> 16) & 0x8000).astype(np.uint16)
    rounded = np.where((u & 0x7F800000) == 0, sign, rounded)
    return np.where(np.isnan(a), np.uint16(0x7FC0) | sign, rounded)


def _as_in_out(weight: np.ndarray, transposed: bool) -> np.ndarray:
    w = np.asarray(weight, np.float32)
    if w.ndim != 2:
        raise ValueError(f"weight must be 2-D, got shape {w.shape}")
    return w.T if transposed else w  # [K, N]


def pack_f32(weight: np.ndarray, transposed: bool = False) -> np.ndarray:
    """``W [K, N]`` (or ``W^T`` with ``transposed``) -> fp32 panels ``[np, K, 16]``."""
    w = _as_in_out(weight, transposed)
    k, n = w.shape
    npanel = panel_count(n)
    padded = np.zeros((k, npanel * LANES), np.float32)
    padded[:, :n] = w
    return np.ascontiguousarray(padded.reshape(k, npanel, LANES).transpose(1, 0, 2))  # [np, K, 16]


def pack_bf16(weight: np.ndarray, transposed: bool = False) -> np.ndarray:
    """``W [K, N]`` (or ``W^T`` with ``transposed``) -> bf16 panels ``[np, ceil(K/2), 32]`` as int16 bits."""
    w = _as_in_out(weight, transposed)
    k, n = w.shape
    npanel, k2 = panel_count(n), -(-k // 2)
    padded = np.zeros((2 * k2, npanel * LANES), np.float32)
    padded[:k, :n] = w
    bits = bf16_bits(padded).reshape(k2, 2, npanel, LANES)  # [q, t, p, j]
    return np.ascontiguousarray(bits.transpose(2, 0, 3, 1)).reshape(npanel, k2, 2 * LANES).view(np.int16)


def packed_shape(in_features: int, out_features: int, dtype: str) -> tuple[int, int, int]:
    """Shape of the packed copy of a ``[in_features, out_features]`` weight in ``dtype``."""
    if dtype == "bfloat16":
        return panel_count(out_features), -(-in_features // 2), 2 * LANES
    return panel_count(out_features), in_features, LANES


__all__ = ["LANES", "bf16_bits", "pack_bf16", "pack_f32", "packed_shape", "panel_count"]
