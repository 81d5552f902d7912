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


# ----- GGUF quantized blocks, kept as they are (``--weights native``) --------------------------------------
#
# A GGUF tensor of shape [N, K] (N output rows, K inputs; blocks of 32 along K) packs into panels of 16 output
# columns whose 32-row blocks hold what the kernel needs to rebuild each weight with the converter's arithmetic:
#
#     q4:  [np, K/32, 384] bytes = d[16] fp32 | m[16] fp32 | 16 row pairs x 16 bytes (byte j of pair p: column j
#          of row 2p in the low nibble, of row 2p + 1 in the high one: one 16-byte load widens to both rows'
#          16 lanes);  W[k, n] = fma(d[n], q[k, n], m[n])
#     q8:  [np, K/32, 576] bytes = d[16] fp32 | 32 rows x 16 int8;  W[k, n] = d[n] * q[k, n]
#
# GGUF Q4_1 blocks are (d fp16, m fp16, 16 bytes: value j in the low nibble of byte j, value j + 16 in the
# high one); Q4_0 is (d, 16 bytes) with W = d (q - 8), stored here as m = -8 d (exact, and fma(d, q, -8d) rounds
# the exact d (q - 8) to itself); Q8_0 is (d, 32 int8). d * q is exact in fp32 for every format, so each
# rebuilt weight is bit-identical to ``gguf.quants.dequantize``'s float32 value (tested on real blocks), but for
# one sign: Q4_0's zero weights (q = 8) under a negative d, -0 in numpy, +0 here. That sign never reaches an
# output: a kernel's sum starts at +0 and an exact cancellation rounds to +0, so a partial sum is never -0 and
# adding x * (+-0) to it gives the same bits either way (the Q4_0 teacher's logits equal the dense teacher's).

QUANT_BLOCK = 32
GGUF_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}  # the GGUF formats computed exactly
KERNEL_FORMAT = {"Q4_0": "q4", "Q4_1": "q4", "Q8_0": "q8"}
PANEL_BYTES = {"q4": 384, "q8": 576}


def _f16_field(blocks: np.ndarray, start: int) -> np.ndarray:
    return np.ascontiguousarray(blocks[..., start:start + 2]).view(np.float16)[..., 0].astype(np.float32)


def gguf_fields(raw: np.ndarray, ggml_type: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Raw GGUF rows ``uint8 [N, K/32 * block bytes]`` -> ``d [N, K/32]``, ``m [N, K/32]`` (zeros for Q8_0) fp32
    and ``q [N, K]`` (uint8 0..15 for Q4_*, int8 for Q8_0)."""
    if ggml_type not in GGUF_BLOCK_BYTES:
        raise ValueError(f"GGUF type {ggml_type} is not computed exactly (supported: {sorted(GGUF_BLOCK_BYTES)})")
    n = raw.shape[0]
    blocks = np.asarray(raw, np.uint8).reshape(n, -1, GGUF_BLOCK_BYTES[ggml_type])
    d = _f16_field(blocks, 0)
    if ggml_type == "Q8_0":
        q = np.ascontiguousarray(blocks[..., 2:]).view(np.int8).reshape(n, -1)
        return d, np.zeros_like(d), q
    qs = blocks[..., 4:] if ggml_type == "Q4_1" else blocks[..., 2:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(n, -1)  # values j, then j + 16, per block
    m = _f16_field(blocks, 2) if ggml_type == "Q4_1" else np.float32(-8.0) * d
    return d, m, q


def dequantize_fields(d: np.ndarray, m: np.ndarray, q: np.ndarray, fmt: str) -> np.ndarray:
    """The converter's float32 value of every weight, ``[N, K]`` (the reference the kernels must equal)."""
    rep = lambda a: np.repeat(a, QUANT_BLOCK, axis=1)  # noqa: E731
    prod = rep(d) * q.astype(np.float32)
    return prod if fmt == "q8" else prod + rep(m)


def pack_quantized(d: np.ndarray, m: np.ndarray, q: np.ndarray, fmt: str) -> np.ndarray:
    """``d, m [N, K/32]`` fp32 and ``q [N, K]`` -> the kernel's panels ``uint8 [np, K/32, 384 | 576]``."""
    n, k = q.shape
    if k % QUANT_BLOCK or d.shape != (n, k // QUANT_BLOCK) or m.shape != d.shape:
        raise ValueError(f"pack_quantized: q {q.shape}, d {d.shape}, m {m.shape} are not blocks of {QUANT_BLOCK}")
    npanel, kb = panel_count(n), k // QUANT_BLOCK

    def panels(a: np.ndarray) -> np.ndarray:  # [N, ...] -> zero-padded [np, 16, ...]
        out = np.zeros((npanel * LANES,) + a.shape[1:], a.dtype)
        out[:n] = a
        return out.reshape((npanel, LANES) + a.shape[1:])

    dp = panels(d.astype(np.float32)).transpose(0, 2, 1)  # [np, KB, 16]
    qp = panels(q).reshape(npanel, LANES, kb, QUANT_BLOCK).transpose(0, 2, 3, 1)  # [np, KB, 32, 16]
    parts = [np.ascontiguousarray(dp).view(np.uint8)]
    if fmt == "q4":
        parts.append(np.ascontiguousarray(panels(m.astype(np.float32)).transpose(0, 2, 1)).view(np.uint8))
        nib = qp.astype(np.uint8)
        parts.append((nib[:, :, 0::2] | (nib[:, :, 1::2] << 4)).reshape(npanel, kb, 256))  # [np, KB, 16, 16]
    elif fmt == "q8":
        parts.append(np.ascontiguousarray(qp.astype(np.int8)).view(np.uint8).reshape(npanel, kb, 512))
    else:
        raise ValueError(f"pack_quantized: format {fmt!r} (expected 'q4' or 'q8')")
    return np.ascontiguousarray(np.concatenate(parts, axis=2))


# ----- the tied Q8 LM head's greedy token (argmax.cc) --------------------------------------------------------
#
#     pairs:   [np, K/32, 576] bytes = d[16] fp32 | 16 row pairs x 16 columns x 2 int8 (byte 2j + t of pair p:
#              column j of row 2p + t), the q8 panels' bytes reordered so that one widening load gives each lane
#              its two rows' weights as an int16 pair (AVX512-VNNI's VPDPWSSD, AVX2's VPMADDWD)
#     colabs:  [N] fp32, sum_k |W[k, n]| per output column, rounded up (the bound's weight term)


def q8_pair_panels(q8: np.ndarray) -> np.ndarray:
    """q8 panels ``uint8 [np, K/32, 576]`` -> the same weights in the pair layout (same shape)."""
    npanel, kb, width = q8.shape
    if width != PANEL_BYTES["q8"]:
        raise ValueError(f"q8_pair_panels: panels of {width} bytes, expected {PANEL_BYTES['q8']}")
    q = q8[:, :, 64:].reshape(npanel, kb, QUANT_BLOCK // 2, 2, LANES).transpose(0, 1, 2, 4, 3)
    return np.ascontiguousarray(np.concatenate([q8[:, :, :64], q.reshape(npanel, kb, 512)], axis=2))


def q8_column_abs_sums(q8: np.ndarray, n: int) -> np.ndarray:
    """``sum_k |d q|`` of each of the ``n`` output columns of q8 panels, in fp64 (every term exact), rounded up to
    fp32: never below the exact sum, as the bound needs."""
    npanel, kb, _ = q8.shape
    d = np.ascontiguousarray(q8[:, :, :64]).view(np.float32).reshape(npanel, kb, LANES).astype(np.float64)
    q = np.abs(q8[:, :, 64:].view(np.int8).reshape(npanel, kb, QUANT_BLOCK, LANES).astype(np.int64)).sum(axis=2)
    return _round_up((np.abs(d) * q).sum(axis=1).reshape(-1)[:n])  # [np, KB, 16] -> [np, 16] -> [N]


def q8_copy_of_f32(panels: np.ndarray, n: int, chunk_panels: int = 256) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A dense fp32 LM head's Q8 copy for the greedy head (argmax.cc, "a dense fp32 LM head"): fp32 panels
    ``[np, K, 16]`` of ``n`` output columns -> ``(q8 panels uint8 [np, K/32, 576], colabs f32 [N], dnorm f32 [N])``.

    Each 32-row block of a column becomes ``d q`` with ``d = max|w| / 127`` (fp32) and ``q = round(w / d)``: a block
    whose weights are Q8 values already (``d0 q0``, a dequantized GGUF Q8_0 head, where some ``|q0| = 127``) gets
    ``d = d0`` exactly and ``q = q0``, so its error is 0. ``colabs``: the larger of ``sum_k |w|`` and ``sum_k |d q|``
    (fp64, rounded up), which covers every weight term of the bound for either; ``dnorm``: ``||w - d q||_2`` per
    column (every difference exact in fp64; the root rounded up). Works ``chunk_panels`` panels at a time, so the
    fp64 temporaries stay small for a large vocabulary. ValueError unless K is whole blocks."""
    npanel, k, lanes = panels.shape
    if lanes != LANES or k % QUANT_BLOCK or not 0 < n <= npanel * LANES:
        raise ValueError(f"q8_copy_of_f32: panels {panels.shape} of {n} columns are not fp32 panels of whole blocks")
    kb = k // QUANT_BLOCK
    q8 = np.empty((npanel, kb, PANEL_BYTES["q8"]), np.uint8)
    colabs, dnorm = np.empty(npanel * LANES, np.float32), np.empty(npanel * LANES, np.float32)
    for p0 in range(0, npanel, chunk_panels):
        part = panels[p0:p0 + chunk_panels]
        cols = part.shape[0] * LANES
        w = np.ascontiguousarray(part.transpose(0, 2, 1)).reshape(cols, kb, QUANT_BLOCK)  # [cols, KB, 32]
        d = np.abs(w).max(axis=2) / np.float32(127)  # [cols, KB]
        safe = np.where(d > 0, d, np.float32(1))
        q = np.where(d[..., None] > 0, np.clip(np.rint(w / safe[..., None]), -127, 127), 0).astype(np.int8)
        q8[p0:p0 + part.shape[0]] = pack_quantized(d, np.zeros_like(d), q.reshape(cols, k), "q8")
        wide = w.astype(np.float64).reshape(cols, k)
        diff = wide - (d[..., None].astype(np.float64) * q).reshape(cols, k)  # exact: nearby fp32 values
        dnorm[p0 * LANES:p0 * LANES + cols] = _round_up(np.sqrt((diff * diff).sum(axis=1)) * (1 + 2.0 ** -40))
        colabs[p0 * LANES:p0 * LANES + cols] = _round_up(np.abs(wide).sum(axis=1))
    colabs = np.maximum(colabs[:n], q8_column_abs_sums(q8, n))
    return q8, colabs, dnorm[:n]


def f32_panels_of_bf16(panels: np.ndarray) -> np.ndarray:
    """bf16 panels ``[np, K2, 32]`` (bits as int16) -> the same weights as fp32 panels ``[np, 2 K2, 16]`` (exact)."""
    npanel, k2, width = panels.shape
    if width != 2 * LANES:
        raise ValueError(f"f32_panels_of_bf16: panels {panels.shape} are not bf16 panels")
    bits = np.ascontiguousarray(panels).view(np.uint16).astype(np.uint32) << 16
    pairs = bits.view(np.float32).reshape(npanel, k2, LANES, 2)  # [p, q, j, t] = W[2q + t, 16p + j]
    return np.ascontiguousarray(pairs.transpose(0, 1, 3, 2).reshape(npanel, 2 * k2, LANES))


def column_norms(panels: np.ndarray, n: int) -> np.ndarray:
    """``||W[:, c]||_2`` of each of the ``n`` output columns of fp32 panels ``[np, K, 16]``: fp64, rounded up to
    fp32 with a margin that covers the fp64 sum's own error."""
    w = panels.astype(np.float64)
    return _round_up(np.sqrt((w * w).sum(axis=1)).reshape(-1)[:n] * (1 + 2.0 ** -40))


def _round_up(values: np.ndarray) -> np.ndarray:
    """fp64 -> the smallest fp32 values not below them."""
    up = values.astype(np.float32)
    low = up.astype(np.float64) < values
    up[low] = np.nextafter(up[low], np.float32(np.inf))
    return up
