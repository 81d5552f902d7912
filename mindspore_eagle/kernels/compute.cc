// The kernels' arithmetic, written once on simd.h's 16-lane vector V and compiled once per instruction-set path
// (kernels/build.py passes one MSE_ISA_* macro and that path's compiler flags). Each compilation exports one
// IsaOps table (kernels.h); isa.cc picks the table the processor can run.
//
// Linear kernels (y[M, N] = x[M, K] @ W (+ bias)), batch-invariant: every output element y[i, n] is computed by
// the same sequence of operations whatever M is, however rows are blocked and whichever thread runs it:
//     fp32:  acc = 0; for k = 0 .. K-1: acc = fma(x[i, k], W[k, n], acc);  y = acc (+ bias[n])
//     bf16:  acc = 0; for p = 0 .. ceil(K/2)-1:
//                acc = fma(x[i, 2p+1], W[2p+1, n], acc); acc = fma(x[i, 2p], W[2p, n], acc)
// i.e. a strictly sequential reduction along K, one accumulator lane per output element. Row blocking (RM),
// column blocking (RN), the split of columns between threads and the register width change only *which register*
// holds a lane, never the order of its additions; nothing splits K into separately summed parts (K slabs only
// pause the sequential sum, the partial sum waiting in y). So row i of an M = 64 call is bit-identical to the
// same row computed alone, and every path computes the same bits.
//
// bf16: the product of two bf16 values is exact in fp32, so each fma above rounds exactly once, after the add:
// that is AVX512-BF16's VDPBF16PS per lane (odd element first, Intel's definition), which the avx512bf16 path
// uses; the other paths widen the bf16 bits to fp32 (a shift) and run the two fmas. The one difference left:
// VDPBF16PS flushes a partial sum below 2^-126 to zero, the fma path keeps it subnormal.
//
// Attention (attention.cc's entry point; numerics described there): RoPE, the in-place K/V writes, and masked
// GQA attention over each query row's visible span, with the same reduction layout on every path.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels.h"
#include "simd.h"

namespace mse {
namespace MSE_NS {
namespace {

// ---------------------------------------------------------------------------------------------------------
// Register budgets per path: RM * RN accumulators + RN weights + 1 broadcast must fit the register file
// (32 zmm; 16 ymm with V = 2 ymm; 32 q with V = 4 q).
#if defined(MSE_ISA_AVX512)
constexpr int kMaxRN = 8;
int panels_for_rows(int rm) { return rm <= 2 ? 8 : 6; }
constexpr int kAttRM = 6, kAttRN = 4;
#elif defined(MSE_ISA_AVX2)
constexpr int kMaxRN = 3;
int panels_for_rows(int rm) { return rm == 1 ? 3 : rm == 2 ? 2 : 1; }
constexpr int kAttRM = 4, kAttRN = 1;
#elif defined(MSE_ISA_NEON)
constexpr int kMaxRN = 3;
int panels_for_rows(int rm) { return rm == 1 ? 3 : rm == 2 ? 2 : 1; }
constexpr int kAttRM = 4, kAttRN = 1;
#else
constexpr int kMaxRN = 2;
int panels_for_rows(int rm) { return rm == 1 ? 2 : 1; }
constexpr int kAttRM = 2, kAttRN = 1;
#endif

// With several row blocks (4 < M <= 16), K is processed in slabs of kSlab panel rows: the chunk's slab stays
// in L1 while every row block uses it. Between slabs the partial sums wait in y (fp32, exactly the
// accumulator's value), so slabbing changes no addition's order and may depend on M. The slab is as long as L1
// allows for the panels one block reads: each block call pays a prologue and epilogue (partial sums loaded and
// stored, masks), which at 32 rows of K dominated the AVX2 block (1 panel, 2 KB per slab; perf: the 16-row
// forward ran at ~45% of the FMA peak). AVX2 / NEON / portable blocks read 1 panel at M > 2: 256 rows = 16 KB
// (16-row native Q4_1 forward, 2 threads, Zen 3: 64.6-70 -> 47-48 ms; 8 rows ~30 ms). AVX-512 blocks read 6 panels:
// 64 rows = 24 KB, half the 48 KB L1 (Xeon, 2 threads, context 400, 32 -> 64 rows: native Q4_1 8 / 16 rows
// 27.5 / 41 -> 23.7 / 34.3 ms, dense fp32 31.9 / 47.7 -> 30.6 / 43.1 ms; 128 rows was no better than 64).
#if defined(MSE_ISA_AVX512)
constexpr int64_t kSlab = 64;
#else
constexpr int64_t kSlab = 256;
#endif
constexpr int64_t kPrefetchRows = 16;  // prefetch distance along K without slabs

constexpr int64_t kMaxSlabbedRows = 16;  // above this many rows a call's row blocks amortise whole-K panels

// K slab of a call of M rows in blocks of `rows`: slabs while there are several blocks (up to kMaxSlabbedRows rows).
int64_t slab_for_rows(int64_t M, int64_t rows, int64_t depth) {
  return M > rows && M <= kMaxSlabbedRows ? kSlab : depth;
}

// Start value of a panel's accumulator: zero on the first slab, else the partial sum left in y.
inline V load_partial(const float* y, bool first, Mask m) { return first ? zero() : loadz(m, y); }

// End of a slab: store the partial sum, or on the last slab the result: (acc + bias), then residual + that,
// masked to the valid columns. bias and res are null except on the last slab.
inline void store_partial(float* y, const float* bias, const float* res, Mask m, V acc) {
  if (bias) acc = add(acc, loadz(m, bias));
  if (res) acc = add(loadz(m, res), acc);
  stores(m, y, acc);
}

// fp32: x rows at x + i * ldx; panel p of the block at w + p * K * 16; pf: prefetch distance in rows. y, bias
// and res (row stride ldy) point at the block's first column; valid: columns left from there.
template <int RM, int RN>
void block_f32(const float* x, int64_t ldx, const float* w, int64_t K, int64_t k0, int64_t k1, int64_t pf,
               float* y, int64_t ldy, const float* bias, const float* res, bool first, int64_t valid) {
  R acc[RM][RN][kSub];
  Mask mask[RN];
  for (int j = 0; j < RN; ++j) mask[j] = lane_mask(valid - j * kLanes);
  for (int i = 0; i < RM; ++i)
    for (int j = 0; j < RN; ++j) {
      const V a = load_partial(y + i * ldy + j * kLanes, first, mask[j]);
      for (int s = 0; s < kSub; ++s) acc[i][j][s] = part(a, s);
    }
  const int64_t pstride = K * kLanes;
  for (int64_t k = k0; k < k1; ++k) {
    R wv[RN][kSub];
    for (int j = 0; j < RN; ++j) {
      for (int s = 0; s < kSub; ++s) wv[j][s] = rload(w + j * pstride + k * kLanes + s * kRL);
      prefetch(w + j * pstride + (k + pf) * kLanes);
    }
    for (int i = 0; i < RM; ++i) {
#if defined(MSE_ISA_AVX512)
      if constexpr (RM > kMaxRM) {  // the wide blocks: each broadcast inside its fma (simd.h, rfma_bcast)
        for (int j = 0; j < RN; ++j) acc[i][j][0] = rfma_bcast(x + i * ldx + k, wv[j][0], acc[i][j][0]);
        continue;
      }
#endif
      const R xb = rset1(x[i * ldx + k]);
      for (int j = 0; j < RN; ++j)
        for (int s = 0; s < kSub; ++s) acc[i][j][s] = rfma(xb, wv[j][s], acc[i][j][s]);
    }
  }
  for (int i = 0; i < RM; ++i)
    for (int j = 0; j < RN; ++j) {
      V a;
      for (int s = 0; s < kSub; ++s) set_part(a, s, acc[i][j][s]);
      store_partial(y + i * ldy + j * kLanes, bias ? bias + j * kLanes : nullptr,
                    res ? res + i * ldy + j * kLanes : nullptr, mask[j], a);
    }
}

// bf16: xq rows hold ceil(K/2) packed bf16 pairs (low half = even k); panel p at w + p * K2 * 32; [q0, q1) are
// pair indices.
template <int RM, int RN>
void block_bf16(const uint32_t* xq, int64_t ldx, const uint16_t* w, int64_t K2, int64_t q0, int64_t q1, int64_t pf,
                float* y, int64_t ldy, const float* bias, const float* res, bool first, int64_t valid) {
  R acc[RM][RN][kSub];
  Mask mask[RN];
  for (int j = 0; j < RN; ++j) mask[j] = lane_mask(valid - j * kLanes);
  for (int i = 0; i < RM; ++i)
    for (int j = 0; j < RN; ++j) {
      const V a = load_partial(y + i * ldy + j * kLanes, first, mask[j]);
      for (int s = 0; s < kSub; ++s) acc[i][j][s] = part(a, s);
    }
  const int64_t pstride = K2 * 2 * kLanes;
  for (int64_t q = q0; q < q1; ++q) {
#if defined(MSE_NATIVE_BF16)
    __m512bh wv[RN];
    for (int j = 0; j < RN; ++j) {
      wv[j] = (__m512bh)_mm512_loadu_si512(w + j * pstride + q * 2 * kLanes);
      prefetch(w + j * pstride + (q + pf) * 2 * kLanes);
    }
    for (int i = 0; i < RM; ++i) {
      if constexpr (RM > kMaxRM) {  // the wide blocks: each pair's broadcast inside its dot (rdpbf16_bcast)
        for (int j = 0; j < RN; ++j) acc[i][j][0] = rdpbf16_bcast(xq + i * ldx + q, wv[j], acc[i][j][0]);
        continue;
      }
      const __m512bh xb = (__m512bh)_mm512_set1_epi32((int)xq[i * ldx + q]);
      for (int j = 0; j < RN; ++j) acc[i][j][0] = _mm512_dpbf16_ps(acc[i][j][0], xb, wv[j]);
    }
#else
    R we[RN][kSub], wo[RN][kSub];
    for (int j = 0; j < RN; ++j) {
      for (int s = 0; s < kSub; ++s) rbf16_pairs(w + j * pstride + q * 2 * kLanes + 2 * s * kRL, we[j][s], wo[j][s]);
      prefetch(w + j * pstride + (q + pf) * 2 * kLanes);
    }
    for (int i = 0; i < RM; ++i) {
      R xe, xo;
      rbf16_bcast(xq[i * ldx + q], xe, xo);
      for (int j = 0; j < RN; ++j)
        for (int s = 0; s < kSub; ++s) acc[i][j][s] = rfma(xe, we[j][s], rfma(xo, wo[j][s], acc[i][j][s]));
    }
#endif
  }
  for (int i = 0; i < RM; ++i)
    for (int j = 0; j < RN; ++j) {
      V a;
      for (int s = 0; s < kSub; ++s) set_part(a, s, acc[i][j][s]);
      store_partial(y + i * ldy + j * kLanes, bias ? bias + j * kLanes : nullptr,
                    res ? res + i * ldy + j * kLanes : nullptr, mask[j], a);
    }
}

// Quantized panels (kQ4 / kQ8, kernels.h): per 32-row block, each panel's weights are rebuilt in registers with
// the converter's own arithmetic, then used exactly as the fp32 kernel uses its weights:
//     Q4:  w = fma(d, q, m)   (d * q is exact in fp32: an 11-bit fp16 significand times a 4-bit integer, so
//                              the one rounding is numpy's rounding of (d * q) + m)
//     Q8:  w = d * q          (exact: 11 bits times 8 bits)
// so the result is bit-identical to the fp32 kernel on the dequantized weights, at a fraction of the bytes read.
// [k0, k1) are whole blocks.
template <int RM, int RN, bool Q8>
void block_q(const float* x, int64_t ldx, const uint8_t* w, int64_t KB, int64_t k0, int64_t k1, float* y,
             int64_t ldy, const float* bias, const float* res, bool first, int64_t valid) {
  constexpr int64_t kBytes = Q8 ? kQ8Bytes : kQ4Bytes;
  R acc[RM][RN][kSub];
  Mask mask[RN];
  for (int j = 0; j < RN; ++j) mask[j] = lane_mask(valid - j * kLanes);
  for (int i = 0; i < RM; ++i)
    for (int j = 0; j < RN; ++j) {
      const V a = load_partial(y + i * ldy + j * kLanes, first, mask[j]);
      for (int s = 0; s < kSub; ++s) acc[i][j][s] = part(a, s);
    }
  const int64_t pstride = KB * kBytes;
  for (int64_t kb = k0 / kQBlock; kb < k1 / kQBlock; ++kb) {
    R d[RN][kSub], m[RN][kSub];
    const uint8_t* blk[RN];
    for (int j = 0; j < RN; ++j) {
      blk[j] = w + j * pstride + kb * kBytes;
      for (int64_t off = 0; off < kBytes; off += 64) prefetch(blk[j] + 2 * kBytes + off);
      for (int s = 0; s < kSub; ++s) {
        d[j][s] = rload(reinterpret_cast<const float*>(blk[j]) + s * kRL);
        if (!Q8) m[j][s] = rload(reinterpret_cast<const float*>(blk[j] + 64) + s * kRL);
      }
    }
    const float* xk = x + kb * kQBlock;
    // Two K rows at a time (a Q4 pair shares one load, layout.py); each accumulator still adds row kk, then kk + 1.
    for (int kk = 0; kk < kQBlock; kk += 2) {
      // Unrolled so that acc[i][j] are registers: GCC otherwise keeps the 4 x 6 block's panel loop rolled and its
      // accumulators in memory (objdump), ~5% of a 4-row Q4 linear on the Zen 4 VM.
#pragma GCC unroll 8
      for (int j = 0; j < RN; ++j) {
        R w0[kSub], w1[kSub];
        if (Q8) {
          rq8(reinterpret_cast<const int8_t*>(blk[j] + 64 + kk * 16), w0);
          rq8(reinterpret_cast<const int8_t*>(blk[j] + 64 + (kk + 1) * 16), w1);
          for (int s = 0; s < kSub; ++s) w0[s] = rmul(d[j][s], w0[s]), w1[s] = rmul(d[j][s], w1[s]);
        } else {
          rq4_pair(blk[j] + 128 + kk * 8, w0, w1);
          for (int s = 0; s < kSub; ++s) w0[s] = rfma(d[j][s], w0[s], m[j][s]), w1[s] = rfma(d[j][s], w1[s], m[j][s]);
        }
        for (int i = 0; i < RM; ++i) {
#if defined(MSE_ISA_AVX512)
          if constexpr (RM > 2) {  // 3+ rows: each broadcast inside its fma (simd.h, rfma_bcast), no register
            acc[i][j][0] = rfma_bcast(xk + i * ldx + kk + 1, w1[0], rfma_bcast(xk + i * ldx + kk, w0[0], acc[i][j][0]));
            continue;
          }
#endif
          const R x0 = rset1(xk[i * ldx + kk]), x1 = rset1(xk[i * ldx + kk + 1]);
          for (int s = 0; s < kSub; ++s) acc[i][j][s] = rfma(x1, w1[s], rfma(x0, w0[s], acc[i][j][s]));
        }
      }
    }
  }
  for (int i = 0; i < RM; ++i)
    for (int j = 0; j < RN; ++j) {
      V a;
      for (int s = 0; s < kSub; ++s) set_part(a, s, acc[i][j][s]);
      store_partial(y + i * ldy + j * kLanes, bias ? bias + j * kLanes : nullptr,
                    res ? res + i * ldy + j * kLanes : nullptr, mask[j], a);
    }
}

using BlockF32 = void (*)(const float*, int64_t, const float*, int64_t, int64_t, int64_t, int64_t, float*, int64_t,
                          const float*, const float*, bool, int64_t);
using BlockBf16 = void (*)(const uint32_t*, int64_t, const uint16_t*, int64_t, int64_t, int64_t, int64_t, float*,
                           int64_t, const float*, const float*, bool, int64_t);

using BlockQ = void (*)(const float*, int64_t, const uint8_t*, int64_t, int64_t, int64_t, float*, int64_t,
                        const float*, const float*, bool, int64_t);

template <int RM, bool Q8, int... RNs>
constexpr std::array<BlockQ, sizeof...(RNs)> row_q(std::integer_sequence<int, RNs...>) {
  return {&block_q<RM, RNs + 1, Q8>...};
}
template <int RM, int... RNs>
constexpr std::array<BlockF32, sizeof...(RNs)> row_f32(std::integer_sequence<int, RNs...>) {
  return {&block_f32<RM, RNs + 1>...};
}
template <int RM, int... RNs>
constexpr std::array<BlockBf16, sizeof...(RNs)> row_bf16(std::integer_sequence<int, RNs...>) {
  return {&block_bf16<RM, RNs + 1>...};
}
// A table of register blocks [RM - First][RN - 1]: rows First, First + 1, ... (one per RMs), panels 1..Width.
template <int First, int Width, bool Q8, int... RMs>
constexpr std::array<std::array<BlockQ, Width>, sizeof...(RMs)> table_q(std::integer_sequence<int, RMs...>) {
  return {row_q<First + RMs, Q8>(std::make_integer_sequence<int, Width>{})...};
}
template <int First, int Width, int... RMs>
constexpr std::array<std::array<BlockF32, Width>, sizeof...(RMs)> table_f32(std::integer_sequence<int, RMs...>) {
  return {row_f32<First + RMs>(std::make_integer_sequence<int, Width>{})...};
}
template <int First, int Width, int... RMs>
constexpr std::array<std::array<BlockBf16, Width>, sizeof...(RMs)> table_bf16(std::integer_sequence<int, RMs...>) {
  return {row_bf16<First + RMs>(std::make_integer_sequence<int, Width>{})...};
}
const auto kBlocksF32 = table_f32<1, kMaxRN>(std::make_integer_sequence<int, kMaxRM>{});  // [RM - 1][RN - 1]
const auto kBlocksBf16 = table_bf16<1, kMaxRN>(std::make_integer_sequence<int, kMaxRM>{});
const auto kBlocksQ4 = table_q<1, kMaxRN, false>(std::make_integer_sequence<int, kMaxRM>{});
const auto kBlocksQ8 = table_q<1, kMaxRN, true>(std::make_integer_sequence<int, kMaxRM>{});

// Wide quantized row blocks (AVX-512 only: 32 registers): 5-8 rows x kWideRN panels, each rebuilt weight feeding up
// to 8 rows' fmas instead of 4. Rebuilding a Q4 weight costs about four vector instructions per 16 weights (unpack,
// widen, convert, fma(d, q, m)) against one fma per row, so with 4 rows half the instructions are the rebuild and 8
// rows cost what 4 rows cost twice (Xeon, 2 threads: linear kernels 10.2 ms at 4 rows, 19.7 at 8 through the L1
// slabs). The bits are block_q's: the same rebuilt weights, the same sequential chain per output.
#if defined(MSE_ISA_AVX512)
constexpr int kMaxRMQ = 8, kWideRN = 3;
constexpr auto kWideRows = std::make_integer_sequence<int, kMaxRMQ - kMaxRM>{};  // tables [RM - kMaxRM - 1][RN - 1]
const auto kWideQ4 = table_q<kMaxRM + 1, kWideRN, false>(kWideRows);
const auto kWideQ8 = table_q<kMaxRM + 1, kWideRN, true>(kWideRows);
const auto kWideF32 = table_f32<kMaxRM + 1, kWideRN>(kWideRows);
#if defined(MSE_NATIVE_BF16)
const auto kWideBf16 = table_bf16<kMaxRM + 1, kWideRN>(kWideRows);
#endif
// Rows up to which quantized weights take the wide block; more rows go through the L1 slabs (quant_chunk_rows).
// Dense weights take the wide blocks too (dense_rows).
// Before the pair loop (block_q rebuilding two K rows per load, each panel's fmas right after its rebuild) AMD's
// Zen 4 (AVX-512 on 256-bit halves) ran 8 rows faster through the slabs (wide / slabs 27-31 / 22-26 ms) and stopped
// the wide block at 7; with it the wide block wins there too (linear kernels of a native Q4_1 forward, 2 threads,
// context 256, two interleaved rounds: 16.8 / 18.6 ms wide against 23.9 / 32.4 through the slabs), so every
// AVX-512 core takes it up to 8 rows. Same bits either way (the same rebuilt weights and fma chains);
// MSE_WIDE_Q_ROWS=4..8 overrides both (4: never wide), which the self-test's test runs both ways; another value is
// named on stderr and ignored, as MSE_KERNEL_ISA's (isa.cc).
int wide_rows() {
  static const int rows = [] {
    if (const char* env = std::getenv("MSE_WIDE_Q_ROWS")) {
      const int v = std::atoi(env);
      if (v >= kMaxRM && v <= kMaxRMQ) return v;
      std::fprintf(stderr, "mindspore_eagle kernels: MSE_WIDE_Q_ROWS=%s is not a row count in [%d, %d]; ignored\n", env,
                   kMaxRM, kMaxRMQ);
    }
    return kMaxRMQ;
  }();
  return rows;
}
#else
constexpr int kMaxRMQ = kMaxRM;
int wide_rows() { return kMaxRM; }
#endif
// Panels that the two row blocks of 9-16 quantized rows take in turn (twice the wide block's 3 panels, once a 3-4 row
// block's 6), so the second block reads the group's Q blocks from L1.
constexpr int64_t kQGroup = 6;

// The register block of `rm` <= kMaxRMQ rows x `rn` panels of quantized weights, and its widest `rn`.
int q_panels(int rm) {
#if defined(MSE_ISA_AVX512)
  if (rm > kMaxRM) return kWideRN;
#endif
  return std::min(kMaxRN, panels_for_rows(rm));
}
BlockQ q_block(bool q8, int rm, int rn) {
#if defined(MSE_ISA_AVX512)
  if (rm > kMaxRM) return (q8 ? kWideQ8 : kWideQ4)[rm - kMaxRM - 1][rn - 1];
#endif
  return (q8 ? kBlocksQ8 : kBlocksQ4)[rm - 1][rn - 1];
}

// One 32-row block of a quantized panel rebuilt as fp32 panel rows out[32][16] (the weights block_q uses).
void dequant_block(const uint8_t* blk, bool q8, float* out) {
  R d[kSub], m[kSub], q[kSub], q1[kSub];
  for (int s = 0; s < kSub; ++s) {
    d[s] = rload(reinterpret_cast<const float*>(blk) + s * kRL);
    if (!q8) m[s] = rload(reinterpret_cast<const float*>(blk + 64) + s * kRL);
  }
  for (int kk = 0; kk < kQBlock; kk += 2) {
    V w0, w1;
    if (q8) {
      rq8(reinterpret_cast<const int8_t*>(blk + 64 + kk * 16), q);
      rq8(reinterpret_cast<const int8_t*>(blk + 64 + (kk + 1) * 16), q1);
      for (int s = 0; s < kSub; ++s) set_part(w0, s, rmul(d[s], q[s])), set_part(w1, s, rmul(d[s], q1[s]));
    } else {
      rq4_pair(blk + 128 + kk * 8, q, q1);
      for (int s = 0; s < kSub; ++s) set_part(w0, s, rfma(d[s], q[s], m[s])), set_part(w1, s, rfma(d[s], q1[s], m[s]));
    }
    store(out + kk * kLanes, w0);
    store(out + (kk + 1) * kLanes, w1);
  }
}

// A quantized job with several row blocks. Up to kMaxSlabbedRows rows: for each group of panels one register block
// wide, one K slab at a time is rebuilt into an L1-sized fp32 buffer that every row block then multiplies (the
// partial sums wait in y between slabs, exactly as in dense_chunk's slabs), so the rebuilt weights never leave L1.
// More rows: the chunk's panels are rebuilt once into fp32 panels (all K rows, L2-sized) that the fp32 path
// multiplies as it multiplies dense panels. Either way the same weights and the same sequential chain per output as
// block_q. (Rebuilding the whole chunk at every row count wrote and re-read ~540 MB of fp32 per forward through L2:
// at 8 rows on AVX-512 the rebuild took 31% of the forward, the multiply 39%. Xeon, native Q4_1, 8 rows: 29.6 ->
// 27.4 ms with L1 slabs, 23.7 ms with 64-row AVX-512 slabs.)
void dense_chunk(const LinearJob& c, int64_t p0, int64_t p1, const float* wf);

void quant_chunk_rows(const LinearJob& c, int64_t p0, int64_t p1) {
  const bool q8 = c.fmt == kQ8;
  const int64_t KB = c.K / kQBlock, bytes = q8 ? kQ8Bytes : kQ4Bytes;
  thread_local std::vector<float> tmp;
  if (c.M > kMaxSlabbedRows) {
    tmp.resize((size_t)((p1 - p0) * c.K * kLanes));
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t kb = 0; kb < KB; ++kb)
        dequant_block(c.wq + (p * KB + kb) * bytes, q8, tmp.data() + ((p - p0) * c.K + kb * kQBlock) * kLanes);
    return dense_chunk(c, p0, p1, tmp.data());
  }
  const int64_t G = std::min(kMaxRN, panels_for_rows(kMaxRM));  // panels per group: one full block's width
  const int64_t slab = std::min<int64_t>(kSlab, c.K);  // both multiples of kQBlock
  tmp.resize((size_t)(G * slab * kLanes));
  for (int64_t pg = p0; pg < p1; pg += G) {
    const int g = (int)std::min(G, p1 - pg);
    const int64_t n0 = pg * kLanes;
    for (int64_t k0 = 0; k0 < c.K; k0 += slab) {
      const int64_t k1 = std::min(c.K, k0 + slab);
      for (int j = 0; j < g; ++j)  // panel j of the group: rows [k0, k1) at tmp + j * slab * kLanes
        for (int64_t kb = k0 / kQBlock; kb < k1 / kQBlock; ++kb)
          dequant_block(c.wq + ((pg + j) * KB + kb) * bytes, q8, tmp.data() + (j * slab + kb * kQBlock - k0) * kLanes);
      const bool first = k0 == 0, last = k1 == c.K;
      for (int64_t m0 = 0; m0 < c.M; m0 += kMaxRM) {
        const int rm = (int)std::min<int64_t>(kMaxRM, c.M - m0);
        kBlocksF32[rm - 1][g - 1](c.x + m0 * c.K + k0, c.K, tmp.data(), slab, 0, k1 - k0, kPrefetchRows,
                                  c.y + m0 * c.N + n0, c.N, last && c.bias ? c.bias + n0 : nullptr,
                                  last && c.res ? c.res + m0 * c.N + n0 : nullptr, first, c.N - n0);
      }
    }
  }
}

// Rows per register block of a dense job: kMaxRM, or on AVX-512 (wide_rows() > 4) the wide blocks' wide_rows() for
// an fp32 job of 5 to 2 x wide_rows() rows and a native bf16 one of 5 to wide_rows() (at 9-16 bf16 rows two wide
// blocks per slab were no faster than the 4-row blocks). Each weight is then loaded once for up to 8 rows instead of
// 4: up to wide_rows() rows one block over the whole K, the weights streamed once with the one-row prefetch; more,
// two blocks per K slab. Same chains either way: the same bits. Zen 4 VM, a 576 x 16,384 linear, 2 threads, min of
// 150: fp32 6 rows 1.94-2.77 -> 1.21-1.28 ms, 8 rows 1.97-2.70 -> 1.35-1.49, 16 rows 3.06-4.24 -> 2.54-2.55; bf16 8
// rows 0.76-0.98 -> 0.62-0.67.
int64_t dense_rows(const LinearJob& c) {
  const int wr = wide_rows();
#if defined(MSE_NATIVE_BF16)
  const bool wide_fmt = c.fmt == kF32 || (c.fmt == kBf16 && c.M <= wr);
#else
  const bool wide_fmt = c.fmt == kF32;
#endif
  return wide_fmt && wr > kMaxRM && c.M > kMaxRM && c.M <= 2 * wr ? wr : kMaxRM;
}

// The register block of `rm` dense rows x `rn` panels, and its widest `rn` (dense_panels).
int dense_panels(int rm) {
#if defined(MSE_ISA_AVX512)
  if (rm > kMaxRM) return kWideRN;
#endif
  return std::min(kMaxRN, panels_for_rows(rm));
}
BlockF32 f32_block(int rm, int rn) {
#if defined(MSE_ISA_AVX512)
  if (rm > kMaxRM) return kWideF32[rm - kMaxRM - 1][rn - 1];
#endif
  return kBlocksF32[rm - 1][rn - 1];
}
BlockBf16 bf16_block(int rm, int rn) {
#if defined(MSE_NATIVE_BF16)
  if (rm > kMaxRM) return kWideBf16[rm - kMaxRM - 1][rn - 1];
#endif
  return kBlocksBf16[rm - 1][rn - 1];
}

// Panels [p0, p1) of a job whose weights are fp32 panels (wf: panel p0; dense jobs pass their own) or bf16
// panels: for each K slab, every row block of the panels.
void dense_chunk(const LinearJob& c, int64_t p0, int64_t p1, const float* wf) {
  const int64_t depth = c.fmt == kBf16 ? c.K2 : c.K;  // reduction steps: pairs (bf16) or rows
  const int64_t rows = dense_rows(c);
  const int64_t slab = slab_for_rows(c.M, rows, depth), pf = slab < depth ? slab : kPrefetchRows;
  for (int64_t k0 = 0; k0 < depth; k0 += slab) {
    const int64_t k1 = std::min(depth, k0 + slab);
    const bool first = k0 == 0;
    const bool last = k1 == depth;
    for (int64_t m0 = 0; m0 < c.M; m0 += rows) {
      const int rm = (int)std::min<int64_t>(rows, c.M - m0), rn_max = dense_panels(rm);
      for (int64_t p = p0; p < p1; p += rn_max) {
        const int rn = (int)std::min<int64_t>(rn_max, p1 - p);
        const int64_t n0 = p * kLanes;
        float* y = c.y + m0 * c.N + n0;
        const float* bias = last && c.bias ? c.bias + n0 : nullptr;
        const float* res = last && c.res ? c.res + m0 * c.N + n0 : nullptr;
        if (c.fmt == kBf16) {
          bf16_block(rm, rn)(c.xq + m0 * c.K2, c.K2, c.wb + p * c.K2 * 2 * kLanes, c.K2, k0, k1, pf, y, c.N, bias,
                             res, first, c.N - n0);
        } else {
          f32_block(rm, rn)(c.x + m0 * c.K, c.K, wf + (p - p0) * c.K * kLanes, c.K, k0, k1, pf, y, c.N, bias, res,
                            first, c.N - n0);
        }
      }
    }
  }
}

// Chunk `item` of the job into y. Quantized weights with at most one row block (decode, small trees: up to 4 rows,
// 8 on AVX-512, wide_rows) go through block_q, which rebuilds each weight in registers on its way to the row block's
// accumulators; on AVX-512 9-16 rows (verification trees, 9-16 decoding requests) do the same as two row blocks, each
// rebuilding the weights again (a 16-row native Q4_1 forward on a Zen 4 VM, context 256, three interleaved rounds:
// 43.8-44.2 ms through the L1 slabs, 37.8-40.3 ms so; at 32 and 64 rows four and eight blocks lost to the slabs and
// the fp32 rebuild, 71-83 / 140-160 against 67-68 / 103-122 ms). Same bits either way.
void linear_chunk(const LinearJob& c, int64_t item) {
  const int64_t p0 = item * c.chunk, p1 = std::min(c.np, p0 + c.chunk);
  if (c.fmt == kQ4 || c.fmt == kQ8) {
    const int wr = wide_rows();
    if (c.M > 2 * wr || (c.M > wr && wr <= kMaxRM)) return quant_chunk_rows(c, p0, p1);
    // Up to wr rows: one register block over the chunk's panels; wr < M <= 2 wr (the wide blocks): two row blocks
    // over each group of kQGroup panels.
    const int64_t KB = c.K / kQBlock, bytes = c.fmt == kQ4 ? kQ4Bytes : kQ8Bytes;
    const int64_t group = c.M > wr ? kQGroup : p1 - p0;
    for (int64_t g = p0; g < p1; g += group) {
      const int64_t g1 = std::min(p1, g + group);
      for (int64_t m0 = 0; m0 < c.M; m0 += wr) {
        const int rm = (int)std::min<int64_t>(wr, c.M - m0), rn_max = q_panels(rm);
        for (int64_t p = g; p < g1; p += rn_max) {
          const int rn = (int)std::min<int64_t>(rn_max, g1 - p);
          const int64_t n0 = p * kLanes;
          q_block(c.fmt == kQ8, rm, rn)(c.x + m0 * c.K, c.K, c.wq + p * KB * bytes, KB, 0, c.K, c.y + m0 * c.N + n0,
                                        c.N, c.bias ? c.bias + n0 : nullptr, c.res ? c.res + m0 * c.N + n0 : nullptr,
                                        true, c.N - n0);
        }
      }
    }
    return;
  }
  dense_chunk(c, p0, p1, c.wf + p0 * c.K * kLanes);
}

// Prologues: the activations a fused Linear multiplies, computed per row from its input (so they depend on that
// row alone, never on M). RMSNorm: a = (x * r) * w with r = 1 / sqrt(sum(x^2) / K + eps), the sum of squares
// an fma chain per lane (k mod 16) and then hsum's fixed tree. SwiGLU: a = silu(gate) * up.
void rmsnorm_rows(const float* x, int64_t M, int64_t K, const float* w, float eps, float* a) {
  for (int64_t i = 0; i < M; ++i) {
    const float* row = x + i * K;
    V acc = zero();
    for (int64_t k = 0; k < K; k += kLanes) {
      const V v = loadz(lane_mask(K - k), row + k);
      acc = fma(v, v, acc);
    }
    const float r = 1.0f / std::sqrt(hsum(acc) / (float)K + eps);
    const V rv = set1(r);
    for (int64_t k = 0; k < K; k += kLanes) {
      const Mask m = lane_mask(K - k);
      stores(m, a + i * K + k, mul(mul(loadz(m, row + k), rv), loadz(m, w + k)));
    }
  }
}

void swiglu_rows(const float* x, int64_t M, int64_t K, float* a) {
  for (int64_t i = 0; i < M; ++i) {
    const float* gate = x + i * 2 * K;
    const float* up = gate + K;
    for (int64_t k = 0; k < K; k += kLanes) {
      const Mask m = lane_mask(K - k);
      stores(m, a + i * K + k, mul(silu(loadz(m, gate + k)), loadz(m, up + k)));
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Attention (see attention.cc for the contract and the numerics).

constexpr float kHiddenBelow = -5e8f;  // additive mask values at or below this hide a column (MASK_VALUE/2)

int64_t floor16(int64_t j) { return j / kLanes * kLanes; }
int64_t ceil16(int64_t j) { return (j + kLanes - 1) / kLanes * kLanes; }

struct Span {
  int64_t lo, hi;  // visible columns lie in [lo, hi)
  bool all;        // the row sees nothing: every column counts as visible (the reference averages them all)
};

Mask visible_bits(const float* m, int64_t j0, int64_t S) {
  const Mask valid = lane_mask(S - j0);
  return cmp_gt(loadz(valid, m + j0), set1(kHiddenBelow)) & valid;
}

// The first and last visible column of one mask row.
Span visible_span(const float* m, int64_t S) {
  int64_t lo = -1, hi = -1;
  for (int64_t j0 = 0; j0 < S; j0 += kLanes) {
    if (const Mask vis = visible_bits(m, j0, S)) {
      lo = j0 + __builtin_ctz(vis);
      break;
    }
  }
  if (lo < 0) return {0, S, true};
  for (int64_t j0 = floor16(S - 1); j0 >= 0; j0 -= kLanes) {
    if (const Mask vis = visible_bits(m, j0, S)) {
      hi = j0 + 32 - __builtin_clz(vis);
      break;
    }
  }
  return {lo, hi, false};
}

// out = x * cos + rotate_half(x) * sin, rotate_half(x) = [-x[D/2:], x[:D/2]] (HF's layout): three roundings.
void rope(const float* x, const float* cos, const float* sin, int64_t D, float* out) {
  const int64_t h = D / 2;
  for (int64_t d = 0; d < h; ++d) {
    const float a = x[d] * cos[d];
    const float b = -x[d + h] * sin[d];
    out[d] = a + b;
  }
  for (int64_t d = h; d < D; ++d) {
    const float a = x[d] * cos[d];
    const float b = x[d - h] * sin[d];
    out[d] = a + b;
  }
}

#if defined(MSE_ISA_AVX512)
// 16 x 16 transpose in registers: r[i] (row i) -> r[c] (column c). Pure data movement.
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  __m512 u[16];
  for (int i = 0; i < 4; ++i) {
    u[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int k = 0; k < 4; ++k) {
    const __m512 v0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88), w0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xDD);
    const __m512 v1 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88);
    const __m512 w1 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xDD);
    r[k] = _mm512_shuffle_f32x4(v0, v1, 0x88);
    r[8 + k] = _mm512_shuffle_f32x4(v0, v1, 0xDD);
    r[4 + k] = _mm512_shuffle_f32x4(w0, w1, 0x88);
    r[12 + k] = _mm512_shuffle_f32x4(w0, w1, 0xDD);
  }
}
#elif defined(MSE_ISA_AVX2)
// 8 x 8 transpose of rows r[0..7] in registers.
inline void transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int k = 0; k < 4; ++k) {
    r[k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x20);
    r[4 + k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x31);
  }
}
#endif

// Keys [j0, j1) of one head (rows of D floats at k, row j at k + j * D; j1 <= S) into kt[d][j - j0] with row
// stride ldk; j0, ldk multiples of 16, columns past j1 (up to ceil16) zero. D % 16 == 0.
void transpose_keys(const float* k, int64_t D, int64_t j0, int64_t j1, float* kt, int64_t ldk) {
  for (int64_t jb = j0; jb < j1; jb += kLanes) {
    const int64_t nrows = std::min<int64_t>(kLanes, j1 - jb);
    for (int64_t d0 = 0; d0 < D; d0 += kLanes) {
#if defined(MSE_ISA_AVX512)
      __m512 r[16];
      for (int i = 0; i < 16; ++i) r[i] = i < nrows ? _mm512_loadu_ps(k + (jb + i) * D + d0) : _mm512_setzero_ps();
      transpose16(r);
      for (int c = 0; c < 16; ++c) _mm512_storeu_ps(kt + (d0 + c) * ldk + (jb - j0), r[c]);
#elif defined(MSE_ISA_AVX2)
      for (int bi = 0; bi < 2; ++bi)      // key rows jb + 8 bi ..
        for (int bd = 0; bd < 2; ++bd) {  // dims d0 + 8 bd ..
          __m256 r[8];
          for (int i = 0; i < 8; ++i)
            r[i] = 8 * bi + i < nrows ? _mm256_loadu_ps(k + (jb + 8 * bi + i) * D + d0 + 8 * bd) : _mm256_setzero_ps();
          transpose8(r);
          for (int c = 0; c < 8; ++c) _mm256_storeu_ps(kt + (d0 + 8 * bd + c) * ldk + (jb - j0) + 8 * bi, r[c]);
        }
#else
      for (int c = 0; c < 16; ++c)
        for (int i = 0; i < 16; ++i) kt[(d0 + c) * ldk + (jb - j0) + i] = i < nrows ? k[(jb + i) * D + d0 + c] : 0.0f;
#endif
    }
  }
}

// out[i][16 c + l] = sum_{j < n} a[i][j] b[j][16 c + l], a sequential fma chain in j per lane, for RM rows of a
// (row stride lda) and RN 16-lane vectors of b (row stride ldb). Both attention products are this one block:
//     scores  s = q kt   (a = q [rows][D], b = transposed keys [D][columns], n = D)
//     output  o = p v    (a = p [rows][columns], b = values [columns][D], n = the columns)
template <int RM, int RN>
void rows_block(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t n, float* out, int64_t ldo) {
  R acc[RM][RN][kSub];
  for (int i = 0; i < RM; ++i)
    for (int c = 0; c < RN; ++c)
      for (int u = 0; u < kSub; ++u) acc[i][c][u] = rset1(0.0f);
  for (int64_t j = 0; j < n; ++j) {
    R w[RN][kSub];
    for (int c = 0; c < RN; ++c)
      for (int u = 0; u < kSub; ++u) w[c][u] = rload(b + j * ldb + c * kLanes + u * kRL);
    for (int i = 0; i < RM; ++i) {
      const R x = rset1(a[i * lda + j]);
      for (int c = 0; c < RN; ++c)
        for (int u = 0; u < kSub; ++u) acc[i][c][u] = rfma(x, w[c][u], acc[i][c][u]);
    }
  }
  for (int i = 0; i < RM; ++i)
    for (int c = 0; c < RN; ++c) {
      V v;
      for (int u = 0; u < kSub; ++u) set_part(v, u, acc[i][c][u]);
      store(out + i * ldo + c * kLanes, v);
    }
}

using RowsFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t);

template <int RM, int... RNs>
constexpr std::array<RowsFn, sizeof...(RNs)> rows_row(std::integer_sequence<int, RNs...>) {
  return {&rows_block<RM, RNs + 1>...};
}
template <int... RMs>
constexpr std::array<std::array<RowsFn, kAttRN>, sizeof...(RMs)> rows_table(std::integer_sequence<int, RMs...>) {
  return {rows_row<RMs + 1>(std::make_integer_sequence<int, kAttRN>{})...};
}
const auto kRows = rows_table(std::make_integer_sequence<int, kAttRM>{});  // [RM - 1][RN - 1]

// Lanes of the 16 columns from j that are visible: inside the span and (unless the row sees nothing) with a mask
// value above the threshold.
inline Mask visible_lanes(const float* mask, int64_t j, Span span) {
  const Mask in = lane_mask(span.hi - j) & (Mask)~lane_mask(span.lo - j) & 0xFFFFu;
  if (span.all) return in;
  return cmp_gt(loadz(in, mask + j), set1(kHiddenBelow)) & in;
}

// The visible lanes of p, in lane order, appended at dst; returns how many.
inline int64_t compress_store(float* dst, Mask vis, V p) {
#if defined(MSE_ISA_AVX512)
  _mm512_mask_compressstoreu_ps(dst, (__mmask16)vis, p.v);
  return __builtin_popcount(vis);
#else
  float f[16];
  store(f, p);
  int64_t n = 0;
  for (int l = 0; l < 16; ++l)
    if ((vis >> l) & 1u) dst[n++] = f[l];
  return n;
#endif
}

// Softmax of one row in place: s holds raw dot products for columns [c0, c1) (c0 a multiple of 16, absolute
// column c0 at s[0]); afterwards s holds p, +0 at every hidden column; returns l, summed by *rank*: the n-th
// visible column goes to lane n mod 16, then hsum's fixed tree (`packed`: room for c1 - c0 floats).
float softmax_row(float* s, int64_t c0, int64_t c1, const float* mask, Span span, float scale, float* packed) {
  const V sc = set1(scale), neg_inf = set1(-INFINITY);
  const int64_t b0 = floor16(span.lo), b1 = ceil16(span.hi);
  V mx = neg_inf;
  for (int64_t j = b0; j < b1; j += kLanes) {
    const Mask vis = visible_lanes(mask, j, span);
    const V x = add(mul(load(s + (j - c0)), sc), loadz(vis, mask + j));
    const V xm = select(vis, x, neg_inf);
    store(s + (j - c0), xm);
    mx = vmax(mx, xm);
  }
  const V m = set1(hmax(mx));
  int64_t n = 0;  // visible columns so far
  for (int64_t j = c0; j < c1; j += kLanes) {
    if (j < b0 || j >= b1) {
      store(s + (j - c0), zero());
      continue;
    }
    const Mask vis = visible_lanes(mask, j, span);
    const V p = select(vis, vexp(sub(load(s + (j - c0)), m)), zero());
    store(s + (j - c0), p);
    n += compress_store(packed + n, vis, p);
  }
  V lsum = zero();
  for (int64_t r = 0; r < n; r += kLanes) lsum = add(lsum, loadz(lane_mask(n - r), packed + r));
  return hsum(lsum);
}

// One group of consecutive tokens of batch entry b whose visible spans overlap (one request's tree or prefill
// chunk; the batch engine packs several requests, each in its own cache region, into one call): its key columns
// [k0, k0 + ncol) are transposed once per KV head into kt + g * D * ncol (shared by the group's row blocks).
struct AttGroup {
  int64_t b, t0, t1, jlo, jhi, k0, ncol;
  float* kt;
};

// The work of one attention call, cut for the kernel pool (mse::parallel_for) in two phases: (A) the keys of
// every (group, KV head), transposed in pieces of kTransposeCols columns; (B) every (group, KV head, row block):
// RoPE of its queries, scores, softmax, p v. A row's arithmetic is the same whichever thread runs its block and
// however the call is cut (the header: blocking and column positions never matter), so threads change the time,
// never the bits. Phase B reads only what phase A wrote (parallel_for returns when every item is done).
struct AttWork {
  const AttentionCall* c;
  const Span* spans;  // [B * T]
  std::vector<AttGroup> groups;
  std::vector<int64_t> pieces;  // phase A: first item of each group (prefix sums; back() = the item count)
  std::vector<int64_t> blocks;  // phase B: first item of each group (prefix sums)
  float scale;
};
constexpr int64_t kTransposeCols = 128;

void transpose_item(const void* ctx, int64_t item) {
  const AttWork& w = *static_cast<const AttWork*>(ctx);
  const AttentionCall& c = *w.c;
  const int64_t gi = std::upper_bound(w.pieces.begin(), w.pieces.end(), item) - w.pieces.begin() - 1;
  const AttGroup& grp = w.groups[(size_t)gi];
  const int64_t per_head = (grp.ncol + kTransposeCols - 1) / kTransposeCols, local = item - w.pieces[(size_t)gi];
  const int64_t g = local / per_head, j0 = grp.k0 + (local % per_head) * kTransposeCols;
  const int64_t j1 = std::min(grp.jhi, j0 + kTransposeCols);
  if (j0 >= grp.jhi) return;
  const float* kh = c.k_cache + (grp.b * c.Hkv + g) * c.S * c.D;
  transpose_keys(kh, c.D, j0, j1, grp.kt + g * c.D * grp.ncol + (j0 - grp.k0), grp.ncol);
}

void rows_item(const void* ctx, int64_t item) {
  const AttWork& w = *static_cast<const AttWork*>(ctx);
  const AttentionCall& c = *w.c;
  const int64_t gi = std::upper_bound(w.blocks.begin(), w.blocks.end(), item) - w.blocks.begin() - 1;
  const AttGroup& grp = w.groups[(size_t)gi];
  const int64_t T = c.T, H = c.H, Hkv = c.Hkv, D = c.D, S = c.S, W = (H + 2 * Hkv) * D, rep = H / Hkv;
  const int64_t rows = (grp.t1 - grp.t0) * rep, per_head = (rows + kAttRM - 1) / kAttRM;
  const int64_t local = item - w.blocks[(size_t)gi], g = local / per_head, i0 = (local % per_head) * kAttRM;
  const int rm = (int)std::min<int64_t>(kAttRM, rows - i0);
  const int64_t b = grp.b, t0 = grp.t0, k0 = grp.k0, ncol = grp.ncol;
  const float* kt = grp.kt + g * D * ncol;
  const float* vh = c.v_cache + (b * Hkv + g) * S * D;
  thread_local std::vector<float> q, s, o, packed;
  q.resize((size_t)(kAttRM * D));
  o.resize((size_t)(kAttRM * D));
  s.resize((size_t)(kAttRM * ncol));
  packed.resize((size_t)ncol);
  // the block's queries: row i0 + i is head g * rep + r of token t0 + (i0 + i) / rep, roped
  int64_t blo = S, bhi = 0;  // the block's column union
  for (int i = 0; i < rm; ++i) {
    const int64_t t = t0 + (i0 + i) / rep, r = (i0 + i) % rep;
    rope(c.qkv + (b * T + t) * W + (g * rep + r) * D, c.cos + (b * T + t) * D, c.sin + (b * T + t) * D, D,
         q.data() + i * D);
    const Span sp = w.spans[b * T + t];
    blo = std::min(blo, sp.lo);
    bhi = std::max(bhi, sp.hi);
  }
  const int64_t c0 = floor16(blo), c1 = ceil16(bhi), lds = ncol;
  for (int64_t j = c0; j < c1; j += kAttRN * kLanes) {
    const int rn = (int)std::min<int64_t>(kAttRN, (c1 - j) / kLanes);
    kRows[rm - 1][rn - 1](q.data(), D, kt + (j - k0), ncol, D, s.data() + (j - c0), lds);
  }
  float l[kAttRM];
  for (int i = 0; i < rm; ++i) {
    const int64_t t = t0 + (i0 + i) / rep;
    l[i] = softmax_row(s.data() + i * lds, c0, c1, c.mask + (b * T + t) * S, w.spans[b * T + t], w.scale,
                       packed.data());
  }
  for (int64_t d0 = 0; d0 < D; d0 += kAttRN * kLanes) {  // columns [blo, bhi): p from s[blo - c0]
    const int rn = (int)std::min<int64_t>(kAttRN, (D - d0) / kLanes);
    kRows[rm - 1][rn - 1](s.data() + (blo - c0), lds, vh + blo * D + d0, D, bhi - blo, o.data() + d0, D);
  }
  for (int i = 0; i < rm; ++i) {
    const int64_t t = t0 + (i0 + i) / rep, h = g * rep + (i0 + i) % rep;
    float* dst = c.out + (b * T + t) * H * D + h * D;
    for (int64_t d = 0; d < D; ++d) dst[d] = o[i * D + d] / l[i];
  }
}

int attention(const AttentionCall& c) {
  const int64_t B = c.B, T = c.T, H = c.H, Hkv = c.Hkv, D = c.D, S = c.S, W = (H + 2 * Hkv) * D, rep = H / Hkv;
  const float* qkv = c.qkv;
  const float* cosv = c.cos;
  const float* sinv = c.sin;
  const float* mask = c.mask;
  const int64_t* widx = c.write_idx;
  float* kc = c.k_cache;
  float* vc = c.v_cache;

  for (int64_t b = 0; b < B; ++b)  // all row indices first: a bad one writes nothing
    for (int64_t t = 0; t < T; ++t) {
      const int64_t row = widx[((b * Hkv) * T + t) * 3 + 2];
      if (row < 0 || row >= S) return 5;
    }

  // 1. new K (roped) and V rows into the cache, in place; each token's visible span
  thread_local std::vector<Span> spans;
  spans.resize((size_t)(B * T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t row = widx[((b * Hkv) * T + t) * 3 + 2];
      const float* tok = qkv + (b * T + t) * W;
      const float* cs = cosv + (b * T + t) * D;
      const float* sn = sinv + (b * T + t) * D;
      for (int64_t g = 0; g < Hkv; ++g) {
        rope(tok + (H + g) * D, cs, sn, D, kc + ((b * Hkv + g) * S + row) * D);
        std::memcpy(vc + ((b * Hkv + g) * S + row) * D, tok + (H + Hkv + g) * D, (size_t)D * sizeof(float));
      }
      spans[(size_t)(b * T + t)] = visible_span(mask + (b * T + t) * S, S);
    }
  // 2. groups of consecutive tokens whose spans overlap: a call costs the sum of its groups' spans, not their
  //    union (per-row numerics do not depend on the grouping)
  thread_local AttWork w;
  thread_local std::vector<float> kt;
  w.c = &c, w.spans = spans.data(), w.scale = (float)(1.0 / std::sqrt((double)D));
  w.groups.clear(), w.pieces.assign(1, 0), w.blocks.assign(1, 0);
  int64_t kt_size = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t0 = 0; t0 < T;) {
      const Span* sp = spans.data() + b * T;
      int64_t jlo = sp[t0].lo, jhi = sp[t0].hi, t1 = t0 + 1;
      while (t1 < T && sp[t1].lo < jhi && sp[t1].hi > jlo) {
        jlo = std::min(jlo, sp[t1].lo);
        jhi = std::max(jhi, sp[t1].hi);
        ++t1;
      }
      const int64_t k0 = floor16(jlo), ncol = ceil16(jhi) - k0;
      w.groups.push_back({b, t0, t1, jlo, jhi, k0, ncol, nullptr});
      w.pieces.push_back(w.pieces.back() + Hkv * ((ncol + kTransposeCols - 1) / kTransposeCols));
      w.blocks.push_back(w.blocks.back() + Hkv * (((t1 - t0) * rep + kAttRM - 1) / kAttRM));
      kt_size += Hkv * D * ncol;
      t0 = t1;
    }
  kt.resize((size_t)kt_size);
  float* next = kt.data();
  for (AttGroup& grp : w.groups) {
    grp.kt = next;
    next += Hkv * D * grp.ncol;
  }
  // 3. the keys transposed, then every row block, each phase spread over the kernel pool
  mse::parallel_for(w.pieces.back(), transpose_item, &w);
  mse::parallel_for(w.blocks.back(), rows_item, &w);
  return 0;
}

// ---------------------------------------------------------------------------------------------------------
// A Q8 LM head's approximate logits (kernels.h ApproxQ8Job; argmax.cc turns them into the exact greedy token).
// AVX512-VNNI's VPDPWSSD adds two int16 x int16 products per int32 lane, so one instruction per row covers two K rows
// of 16 columns where the exact kernel spends one fma per K row plus the weights' rebuild (3 + M instructions per K
// row against (1 + M) / 2 here). Compiled into the AVX-512 paths with a function-level target, run only where the
// processor has VNNI (isa.cc's approx_q8_chunk); an AVX-512 processor without it (Skylake-SP) takes the same blocks
// with VPMADDWD + VPADDD (AVX512-BW), two instructions. Nothing here needs to match another path's bits: argmax.cc's
// bound covers any order of these sums (and every path's sums are the same exact integers, folded alike). AVX2
// (below) does the same with VPMADDWD, NEON with SMLAL. Each path has its own register blocks and scan; the table of
// blocks and the chunk that runs them come after them.
#if defined(MSE_ISA_AVX512) || defined(MSE_ISA_AVX2) || defined(MSE_ISA_NEON)
inline int32_t xq_pair(const int16_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The scans' columns n0..N-1 one at a time (after the vector loop's last full vector; the same fp32 operations):
// the first pass's top and mag, then the second's candidates. The count, or cap + 1 once more than cap.
inline void scan_tail_extremes(const float* out, const float* colabs, int64_t n0, int64_t N, float s, float F,
                               float& top, float& mag) {
  for (int64_t n = n0; n < N; ++n) {
    const float L = s * out[n], B = F * colabs[n];
    top = std::max(top, L - B);
    mag = std::max(mag, std::fabs(L) + B);
  }
}
inline int64_t scan_tail_candidates(const float* out, const float* colabs, int64_t n0, int64_t N, float s, float F,
                                    float thr, int32_t* cand, int64_t count, int64_t cap) {
  for (int64_t n = n0; n < N; ++n) {
    const float L = s * out[n], B = F * colabs[n];
    if (L + B >= thr) {
      if (count == cap) return cap + 1;
      cand[count++] = (int32_t)n;
    }
  }
  return count;
}

// Block kb of each of RN consecutive panels (pstride bytes apart), the blocks two further on prefetched.
template <int RN>
inline void panel_blocks(const uint8_t* w, int64_t pstride, int64_t kb, const uint8_t* (&blk)[RN]) {
  for (int j = 0; j < RN; ++j) {
    blk[j] = w + j * pstride + kb * kQ8Bytes;
    for (int64_t off = 0; off < kQ8Bytes; off += 64) prefetch(blk[j] + 2 * kQ8Bytes + off);
  }
}
#endif

#if defined(MSE_ISA_AVX512)
#define MSE_APPROX_VNNI

// How a row pair's int16 products reach the int32 sums: one VPDPWSSD (AVX512-VNNI) or VPMADDWD + VPADDD (AVX512-BW,
// every processor of these paths). The same exact sums.
struct DotVnni {
  __attribute__((target("avx512vnni"))) static __m512i mac(__m512i acc, __m512i w, __m512i x) {
    return _mm512_dpwssd_epi32(acc, w, x);
  }
};
struct DotBw {
  static __m512i mac(__m512i acc, __m512i w, __m512i x) { return _mm512_add_epi32(acc, _mm512_madd_epi16(w, x)); }
};

// RM rows x RN panels, all K: acc (int32) per 32-row block, folded into f (fp32) with the block's d.
template <class Dot, int RM, int RN>
inline void approx_block_zmm(const int16_t* xq, int64_t K, const uint8_t* w, int64_t KB, float* out, int64_t ldo) {
  __m512 f[RM][RN];
  for (int i = 0; i < RM; ++i)
    for (int j = 0; j < RN; ++j) f[i][j] = _mm512_setzero_ps();
  const int64_t pstride = KB * kQ8Bytes;
  for (int64_t kb = 0; kb < KB; ++kb) {
    __m512i acc[RM][RN];
    for (int i = 0; i < RM; ++i)
      for (int j = 0; j < RN; ++j) acc[i][j] = _mm512_setzero_si512();
    const uint8_t* blk[RN];
    panel_blocks(w, pstride, kb, blk);
    const int16_t* xk = xq + kb * kQBlock;
    for (int p = 0; p < kQBlock / 2; ++p) {
      __m512i wv[RN];
      for (int j = 0; j < RN; ++j)
        wv[j] = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[j] + 64 + p * 32)));
      for (int i = 0; i < RM; ++i) {
        const __m512i x = _mm512_set1_epi32(xq_pair(xk + i * K + 2 * p));
        for (int j = 0; j < RN; ++j) acc[i][j] = Dot::mac(acc[i][j], wv[j], x);
      }
    }
    for (int j = 0; j < RN; ++j) {
      const __m512 d = _mm512_loadu_ps(reinterpret_cast<const float*>(blk[j]));
      for (int i = 0; i < RM; ++i) f[i][j] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(acc[i][j]), f[i][j]);
    }
  }
  for (int i = 0; i < RM; ++i)
    for (int j = 0; j < RN; ++j) _mm512_storeu_ps(out + i * ldo + j * kLanes, f[i][j]);
}

// The two families of blocks. flatten inlines the body and its Dot::mac into each entry, compiled with the entry's
// target: VPDPWSSD only in the VNNI entries (the body alone cannot take it, its target lacks VNNI).
struct ApproxBlocks {
  template <int RM, int RN>
  __attribute__((flatten)) static void block(const int16_t* xq, int64_t K, const uint8_t* w, int64_t KB, float* out,
                                             int64_t ldo) {
    approx_block_zmm<DotBw, RM, RN>(xq, K, w, KB, out, ldo);
  }
};
struct ApproxBlocksVnni {
  template <int RM, int RN>
  __attribute__((target("avx512vnni"), flatten)) static void block(const int16_t* xq, int64_t K, const uint8_t* w,
                                                                   int64_t KB, float* out, int64_t ldo) {
    approx_block_zmm<DotVnni, RM, RN>(xq, K, w, KB, out, ldo);
  }
};

// Register blocks: 2 RM RN accumulators (int32 and fp32) + RN weights + 1 broadcast <= 32 zmm.
constexpr int kApproxRM = 4, kApproxRN = 8;
int approx_panels(int rm) { return rm == 1 ? 8 : rm == 2 ? 6 : rm == 3 ? 4 : 3; }

// The candidates of one row (argmax.cc): with L_n = s out[n] and B_n = F colabs[n] (fp32), every column n < N whose
// L_n + B_n reaches approx_threshold (kernels.h), in increasing n. Returns the count, or cap + 1 once more than cap.
int64_t approx_q8_candidates(const float* out, const float* colabs, int64_t N, float s, float F, int32_t* cand,
                             int64_t cap) {
  const __m512 vs = _mm512_set1_ps(s), vF = _mm512_set1_ps(F);
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  __m512 top = _mm512_set1_ps(-INFINITY), mag = _mm512_setzero_ps();
  for (int64_t n = 0; n < N; n += kLanes) {
    const __mmask16 m = (__mmask16)lane_mask(N - n);
    const __m512 L = _mm512_mul_ps(vs, _mm512_maskz_loadu_ps(m, out + n));
    const __m512 B = _mm512_mul_ps(vF, _mm512_maskz_loadu_ps(m, colabs + n));
    top = _mm512_mask_max_ps(top, m, top, _mm512_sub_ps(L, B));
    mag = _mm512_max_ps(mag, _mm512_add_ps(_mm512_and_ps(L, abs_mask), B));
  }
  const __m512 vthr = _mm512_set1_ps(approx_threshold(_mm512_reduce_max_ps(top), _mm512_reduce_max_ps(mag)));
  int64_t count = 0;
  for (int64_t n = 0; n < N; n += kLanes) {
    const __mmask16 m = (__mmask16)lane_mask(N - n);
    const __m512 L = _mm512_mul_ps(vs, _mm512_maskz_loadu_ps(m, out + n));
    const __m512 B = _mm512_mul_ps(vF, _mm512_maskz_loadu_ps(m, colabs + n));
    uint32_t hit = _mm512_mask_cmp_ps_mask(m, _mm512_add_ps(L, B), vthr, _CMP_GE_OQ);
    while (hit) {
      if (count == cap) return cap + 1;
      cand[count++] = (int32_t)(n + __builtin_ctz(hit));
      hit &= hit - 1;
    }
  }
  return count;
}
#elif defined(MSE_ISA_AVX2)
// AVX2 has no VPDPWSSD, but VPMADDWD multiplies the same int16 pairs into int32 lanes (then one VPADDD): a panel's
// 16 columns take two ymm halves, so two K rows of one row cost 2 + 2 instructions plus the weights' two widening
// loads, shared by the rows of the block, where the exact kernel rebuilds each K row's 16 weights in 6 and adds 2
// fmas per row. The same int32 block sums (exact) and the same fold, d * float(sum) added in block order, as the
// AVX-512 blocks: the same approximate logits. |xq| <= 32767 and |q| <= 127 keep a block's 32 products far from
// int32's range, as there.

// A panel's 16 columns as two ymm of int32 sums (lanes 0-7, 8-15); one row pair's weights widened to two int16 ymm.
// Register blocks (ApproxBlocks below): 2 RM RN sums + RM broadcasts + 2 weights <= 16 ymm.
struct ApproxIsa {
  static constexpr int kAcc = 2, kW = 2;
  using Acc = __m256i;
  using W = __m256i;
  using X = __m256i;
  static Acc zero() { return _mm256_setzero_si256(); }
  static X broadcast(int32_t pair) { return _mm256_set1_epi32(pair); }
  static void widen(const uint8_t* src, W w[kW]) {
    w[0] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
    w[1] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16)));
  }
  static void mac(Acc acc[kAcc], const W w[kW], X x) {
    for (int h = 0; h < 2; ++h) acc[h] = _mm256_add_epi32(acc[h], _mm256_madd_epi16(w[h], x));
  }
  // o[0..15] = d[0..15] * float(sums) + (first ? 0 : o[0..15]), one rounding per lane
  static void fold(const Acc acc[kAcc], const float* d, float* o, bool first) {
    for (int h = 0; h < 2; ++h) {
      const __m256 f = first ? _mm256_setzero_ps() : _mm256_loadu_ps(o + 8 * h);
      _mm256_storeu_ps(o + 8 * h, _mm256_fmadd_ps(_mm256_loadu_ps(d + 8 * h), _mm256_cvtepi32_ps(acc[h]), f));
    }
  }
};

constexpr int kApproxRM = 4, kApproxRN = 4;
int approx_panels(int rm) { return rm == 1 ? 4 : rm == 2 ? 2 : 1; }

float hmax8(__m256 v) {
  alignas(32) float t[8];
  _mm256_store_ps(t, v);
  float m = t[0];
  for (int l = 1; l < 8; ++l) m = std::max(m, t[l]);
  return m;
}

// The candidates of one row, as the AVX-512 scan (kernels.h's threshold; the same fp32 operations per column, so
// the same candidates), 8 columns per instruction and the columns past the last multiple of 8 one by one.
int64_t approx_q8_candidates(const float* out, const float* colabs, int64_t N, float s, float F, int32_t* cand,
                             int64_t cap) {
  const __m256 vs = _mm256_set1_ps(s), vF = _mm256_set1_ps(F);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 top = _mm256_set1_ps(-INFINITY), mag = _mm256_setzero_ps();
  const int64_t N8 = N / 8 * 8;
  for (int64_t n = 0; n < N8; n += 8) {
    const __m256 L = _mm256_mul_ps(vs, _mm256_loadu_ps(out + n));
    const __m256 B = _mm256_mul_ps(vF, _mm256_loadu_ps(colabs + n));
    top = _mm256_max_ps(top, _mm256_sub_ps(L, B));
    mag = _mm256_max_ps(mag, _mm256_add_ps(_mm256_and_ps(L, abs_mask), B));
  }
  float t = hmax8(top), m = hmax8(mag);
  scan_tail_extremes(out, colabs, N8, N, s, F, t, m);
  const float thr = approx_threshold(t, m);
  const __m256 vthr = _mm256_set1_ps(thr);
  int64_t count = 0;
  for (int64_t n = 0; n < N8; n += 8) {
    const __m256 L = _mm256_mul_ps(vs, _mm256_loadu_ps(out + n));
    const __m256 B = _mm256_mul_ps(vF, _mm256_loadu_ps(colabs + n));
    uint32_t hit = (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_add_ps(L, B), vthr, _CMP_GE_OQ));
    while (hit) {
      if (count == cap) return cap + 1;
      cand[count++] = (int32_t)(n + __builtin_ctz(hit));
      hit &= hit - 1;
    }
  }
  return scan_tail_candidates(out, colabs, N8, N, s, F, thr, cand, count, cap);
}
#elif defined(MSE_ISA_NEON)
// NEON has no pair dot product on int16, but SMLAL / SMLAL2 multiply int16 lanes into int32 lanes: a row pair of 16
// columns (32 int8, widened to four int16x8: columns 4h..4h+3, each its (row 2p, row 2p + 1)) takes 8 of them per row,
// each int32 lane summing one (column, row parity) over the block's 16 pairs; at the block's end ADDP joins each
// column's two parities. The same int32 block sums (integer sums are exact in any order), the same fold
// (d * float(sum) added in block order by FMLA): the same approximate logits as the x86 blocks. Checked under qemu by
// the self-test's approx case (`make test-arm`); its speed is not measured (no Arm machine so far).

// A panel's 16 columns as eight int32x4 sums, lane pairs (column, row parity): sums 2h and 2h + 1 hold columns
// 4h..4h+3; one row pair's weights widened to four int16x8 (columns 4h..4h+3, each its two rows).
// Register blocks (ApproxBlocks below): 8 RM RN sums + 4 weights + RM broadcasts <= 32 q registers.
struct ApproxIsa {
  static constexpr int kAcc = 8, kW = 4;
  using Acc = int32x4_t;
  using W = int16x8_t;
  using X = int16x8_t;
  static Acc zero() { return vdupq_n_s32(0); }
  static X broadcast(int32_t pair) { return vreinterpretq_s16_s32(vdupq_n_s32(pair)); }
  static void widen(const uint8_t* src, W w[kW]) {
    const int8x16_t b0 = vld1q_s8(reinterpret_cast<const int8_t*>(src));
    const int8x16_t b1 = vld1q_s8(reinterpret_cast<const int8_t*>(src + 16));
    w[0] = vmovl_s8(vget_low_s8(b0)), w[1] = vmovl_high_s8(b0), w[2] = vmovl_s8(vget_low_s8(b1));
    w[3] = vmovl_high_s8(b1);
  }
  static void mac(Acc acc[kAcc], const W w[kW], X x) {
    for (int h = 0; h < 4; ++h) {
      acc[2 * h] = vmlal_s16(acc[2 * h], vget_low_s16(w[h]), vget_low_s16(x));
      acc[2 * h + 1] = vmlal_high_s16(acc[2 * h + 1], w[h], x);
    }
  }
  // ADDP joins each column's two parities; o[0..15] = d[0..15] * float(sums) + (first ? 0 : o[0..15])
  static void fold(const Acc acc[kAcc], const float* d, float* o, bool first) {
    for (int h = 0; h < 4; ++h) {
      const float32x4_t f = first ? vdupq_n_f32(0.0f) : vld1q_f32(o + 4 * h);
      const int32x4_t sum = vpaddq_s32(acc[2 * h], acc[2 * h + 1]);
      vst1q_f32(o + 4 * h, vfmaq_f32(f, vld1q_f32(d + 4 * h), vcvtq_f32_s32(sum)));
    }
  }
};

constexpr int kApproxRM = 3, kApproxRN = 3;
int approx_panels(int rm) { return rm == 1 ? 3 : 1; }

// The candidates of one row, as the x86 scans (the same fp32 operations per column), 4 columns per instruction and
// the columns past the last multiple of 4 one by one.
int64_t approx_q8_candidates(const float* out, const float* colabs, int64_t N, float s, float F, int32_t* cand,
                             int64_t cap) {
  const float32x4_t vs = vdupq_n_f32(s), vF = vdupq_n_f32(F);
  float32x4_t top = vdupq_n_f32(-INFINITY), mag = vdupq_n_f32(0.0f);
  const int64_t N4 = N / 4 * 4;
  for (int64_t n = 0; n < N4; n += 4) {
    const float32x4_t L = vmulq_f32(vs, vld1q_f32(out + n));
    const float32x4_t B = vmulq_f32(vF, vld1q_f32(colabs + n));
    top = vmaxq_f32(top, vsubq_f32(L, B));
    mag = vmaxq_f32(mag, vaddq_f32(vabsq_f32(L), B));
  }
  float t = vmaxvq_f32(top), m = vmaxvq_f32(mag);
  scan_tail_extremes(out, colabs, N4, N, s, F, t, m);
  const float thr = approx_threshold(t, m);
  const float32x4_t vthr = vdupq_n_f32(thr);
  int64_t count = 0;
  for (int64_t n = 0; n < N4; n += 4) {
    const float32x4_t L = vmulq_f32(vs, vld1q_f32(out + n));
    const float32x4_t B = vmulq_f32(vF, vld1q_f32(colabs + n));
    const uint32x4_t hit = vcgeq_f32(vaddq_f32(L, B), vthr);
    if (vmaxvq_u32(hit) == 0) continue;
    uint32_t lanes[4];
    vst1q_u32(lanes, hit);
    for (int l = 0; l < 4; ++l)
      if (lanes[l]) {
        if (count == cap) return cap + 1;
        cand[count++] = (int32_t)(n + l);
      }
  }
  return scan_tail_candidates(out, colabs, N4, N, s, F, thr, cand, count, cap);
}
#endif

#if defined(MSE_ISA_AVX2) || defined(MSE_ISA_NEON)
// RM rows x RN panels, all K, on the path's ApproxIsa: one 32-row block's int32 sums in registers, folded into out
// with the block's d (out holds the fp32 sums between blocks: the AVX-512 blocks' registers do not fit here); per row
// pair the RM broadcasts stay in registers and each panel's weights are widened once for the RM rows.
struct ApproxBlocks {
  template <int RM, int RN>
  static void block(const int16_t* xq, int64_t K, const uint8_t* w, int64_t KB, float* out, int64_t ldo) {
    using I = ApproxIsa;
    const int64_t pstride = KB * kQ8Bytes;
    for (int64_t kb = 0; kb < KB; ++kb) {
      I::Acc acc[RM][RN][I::kAcc];
      for (int i = 0; i < RM; ++i)
        for (int j = 0; j < RN; ++j)
          for (int e = 0; e < I::kAcc; ++e) acc[i][j][e] = I::zero();
      const uint8_t* blk[RN];
      panel_blocks(w, pstride, kb, blk);
      const int16_t* xk = xq + kb * kQBlock;
      for (int p = 0; p < kQBlock / 2; ++p) {
        I::X x[RM];
        for (int i = 0; i < RM; ++i) x[i] = I::broadcast(xq_pair(xk + i * K + 2 * p));
        for (int j = 0; j < RN; ++j) {
          I::W wv[I::kW];
          I::widen(blk[j] + 64 + p * 32, wv);
          for (int i = 0; i < RM; ++i) I::mac(acc[i][j], wv, x[i]);
        }
      }
      for (int j = 0; j < RN; ++j)
        for (int i = 0; i < RM; ++i)
          I::fold(acc[i][j], reinterpret_cast<const float*>(blk[j]), out + i * ldo + j * kLanes, kb == 0);
    }
  }
};
#endif

#if defined(MSE_ISA_AVX512) || defined(MSE_ISA_AVX2) || defined(MSE_ISA_NEON)
using ApproxBlock = void (*)(const int16_t*, int64_t, const uint8_t*, int64_t, float*, int64_t);
using ApproxTable = std::array<std::array<ApproxBlock, kApproxRN>, kApproxRM>;
template <class Blocks, int RM, int... RNs>
constexpr std::array<ApproxBlock, sizeof...(RNs)> approx_row(std::integer_sequence<int, RNs...>) {
  return {&Blocks::template block<RM, RNs + 1>...};
}
template <class Blocks, int... RMs>
constexpr ApproxTable approx_table(std::integer_sequence<int, RMs...>) {
  return {approx_row<Blocks, RMs + 1>(std::make_integer_sequence<int, kApproxRN>{})...};
}

// Up to kApproxRM rows: one register block, as wide as its rows allow. More: every row block takes a group of
// approx_panels(kApproxRM) panels in turn, so that the group's weights (~31 KB on AVX-512, ~10 KB on AVX2) are read
// from L1 after the first.
void approx_chunk_with(const ApproxTable& blocks, const ApproxQ8Job& c, int64_t item) {
  const int64_t p0 = item * c.chunk, p1 = std::min(c.np, p0 + c.chunk), KB = c.K / kQBlock, ldo = c.np * kLanes;
  const int G = approx_panels((int)std::min<int64_t>(kApproxRM, c.M));
  for (int64_t p = p0; p < p1; p += G) {
    const int rn = (int)std::min<int64_t>(G, p1 - p);
    for (int64_t m0 = 0; m0 < c.M; m0 += kApproxRM) {
      const int rm = (int)std::min<int64_t>(kApproxRM, c.M - m0);
      blocks[rm - 1][rn - 1](c.xq + m0 * c.K, c.K, c.w + p * KB * kQ8Bytes, KB, c.out + m0 * ldo + p * kLanes, ldo);
    }
  }
}

const ApproxTable kApprox = approx_table<ApproxBlocks>(std::make_integer_sequence<int, kApproxRM>{});
void approx_q8_chunk(const ApproxQ8Job& c, int64_t item) { approx_chunk_with(kApprox, c, item); }
#if defined(MSE_APPROX_VNNI)
const ApproxTable kApproxVnni = approx_table<ApproxBlocksVnni>(std::make_integer_sequence<int, kApproxRM>{});
void approx_q8_chunk_vnni(const ApproxQ8Job& c, int64_t item) { approx_chunk_with(kApproxVnni, c, item); }
#define MSE_APPROX_OPS approx_q8_chunk, approx_q8_candidates, approx_q8_chunk_vnni
#else
#define MSE_APPROX_OPS approx_q8_chunk, approx_q8_candidates, nullptr
#endif
#else
#define MSE_APPROX_OPS nullptr, nullptr, nullptr
#endif

}  // namespace

#define MSE_STR2(x) #x
#define MSE_STR(x) MSE_STR2(x)
extern const IsaOps kOps = {MSE_STR(MSE_NS), panels_for_rows, linear_chunk, rmsnorm_rows, swiglu_rows, attention,
                             MSE_APPROX_OPS};

}  // namespace MSE_NS
}  // namespace mse
