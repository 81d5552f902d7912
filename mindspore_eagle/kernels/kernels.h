// The kernels' internal interface, shared by the sources of the one library:
//
//     compute.cc    the arithmetic, compiled once per instruction-set path (simd.h); exports one IsaOps table
//     isa.cc        which paths this processor can run, and the one in use (MSE_KERNEL_ISA or the best)
//     linear.cc     linear_forward: argument checks, the thread pool, prologues; calls the path's blocks
//     attention.cc  attention_forward and the in-place row moves; calls the path's attention body
//     layer.cc      a whole decoder layer from the two
//     argmax.cc     an LM head's greedy token (native Q8, dense fp32 / bf16) from int16 dot products and a bound
//                   (fast part in compute.cc)
//
// Arguments are checked by the entry points; these functions trust them.

#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace mse {

enum Prologue { kNone = 0, kNorm = 1, kGlu = 2 };

// The packed weight formats of kernels/layout.py, per 16-column panel:
//     kF32  [np, K, 16] fp32          kBf16  [np, K/2, 32] bf16 bits
//     kQ4   [np, K/32, 384] bytes: per 32-row block d[16], m[16] fp32, then 16 row pairs of 16 bytes, byte j of
//           pair p holding column j of row 2p (low nibble) and of row 2p + 1 (high nibble);
//           W[k, n] = fma(d[n], q[k, n], m[n]) (GGUF Q4_1; Q4_0 is m = -8 d)
//     kQ8   [np, K/32, 576] bytes: per block d[16] fp32, then 32 rows of 16 int8; W[k, n] = d[n] * q[k, n] (Q8_0)
// The quantized formats reproduce the GGUF converter's fp32 value of every weight exactly (compute.cc).
enum WeightFormat { kF32 = 0, kBf16 = 1, kQ4 = 2, kQ8 = 3 };
constexpr int64_t kQBlock = 32, kQ4Bytes = 384, kQ8Bytes = 576;

// The format of a packed weight tensor (rank 3) from its dtype and last dim, with its reduction length K (rows of
// W; for bf16 2 * K2, the caller checks against its own K) and width N = 16 np; false when it is none of them.
inline bool packed_dims(int nd, const int64_t* shape, const char* dtype, WeightFormat* fmt, int64_t* K, int64_t* N) {
  if (nd != 3) return false;
  *N = 16 * shape[0];
  if (!std::strcmp(dtype, "float32") && shape[2] == 16) {
    *fmt = kF32, *K = shape[1];
  } else if (!std::strcmp(dtype, "int16") && shape[2] == 32) {
    *fmt = kBf16, *K = 2 * shape[1];
  } else if (!std::strcmp(dtype, "uint8") && (shape[2] == kQ4Bytes || shape[2] == kQ8Bytes)) {
    *fmt = shape[2] == kQ4Bytes ? kQ4 : kQ8, *K = kQBlock * shape[1];
  } else {
    return false;
  }
  return true;
}

// fp32 -> bf16 bits, rounding to nearest even; NaN -> quiet NaN; subnormals -> zero of the same sign (what
// VDPBF16PS does to a subnormal input anyway, so every path multiplies the same values). layout.bf16_bits is
// the same rule for the weights.
inline uint32_t bf16_round(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu)) return 0x7FC0u | ((u >> 16) & 0x8000u);
  if ((u & 0x7F800000u) == 0) return (u >> 16) & 0x8000u;
  return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

// Activations -> bf16 pairs (low half = even k), zero-padded to an even K: what the bf16 kernels multiply
// (linear.cc; argmax.cc's bf16 head).
inline void pack_bf16_activations(const float* x, int64_t M, int64_t K, uint32_t* xq, int64_t K2) {
  for (int64_t i = 0; i < M; ++i) {
    const float* row = x + i * K;
    for (int64_t q = 0; q < K2; ++q) {
      const uint32_t lo = bf16_round(row[2 * q]), hi = 2 * q + 1 < K ? bf16_round(row[2 * q + 1]) : 0u;
      xq[i * K2 + q] = lo | (hi << 16);
    }
  }
}

// y [M, N] = res + (a @ W + bias), a = x (kNone), RMSNorm(x; norm_w, eps) (kNorm), or silu(x[:, :K]) * x[:, K:]
// with x [M, 2K] (kGlu). W: packed panels in format fmt. bias, norm_w and res may be null. Adds its wall time
// to MseKernelStats.
struct LinearCall {
  WeightFormat fmt;
  Prologue prologue;
  int64_t M, K, N;
  const float* x;
  const void* w;
  const float* bias;
  const float* norm_w;
  float eps;
  const float* res;
  float* y;
};
void linear_forward(const LinearCall& c);

// MseTreeAttention's computation (attention.cc): qkv [B, T, (H + 2 Hkv) D], cos/sin [B, T, D], mask [B, T, S],
// write_idx [B, Hkv, T, 3], caches [B, Hkv, S, D] written in place, out [B, T, H D]. Returns 0, or 5 when a
// write row lies outside [0, S) (then nothing is written). Adds its wall time to MseAttentionStats.
struct AttentionCall {
  int64_t B, T, H, Hkv, D, S;
  const float* qkv;
  const float* cos;
  const float* sin;
  const float* mask;
  const int64_t* write_idx;
  float* k_cache;
  float* v_cache;
  float* out;
};
int attention_forward(const AttentionCall& c);

// fn(ctx, item) for every item in [0, n) on the kernel pool (linear.cc: the caller and MSE_KERNEL_THREADS - 1
// workers); returns when all are done. An item's result must not depend on which thread runs it.
void parallel_for(int64_t n, void (*fn)(const void* ctx, int64_t item), const void* ctx);

// One linear call's work, cut into chunks of whole 16-column panels (linear.cc's pool hands them out).
struct LinearJob {
  int64_t M, K, N, np, chunk, nchunks;  // chunk = panels per work item
  const float* x;        // fp32 activations [M, K] (fp32 kernels)
  const float* wf;       // fp32 panels, or
  const uint16_t* wb;    // bf16 panels
  const uint32_t* xq;    // bf16 activations, K2 pairs per row (bf16 kernels)
  int64_t K2;
  const uint8_t* wq;     // quantized panels (kQ4, kQ8)
  const float* bias;     // [N] or null
  const float* res;      // residual [M, N] added to the result, or null
  float* y;              // [M, N]
  WeightFormat fmt;
};

// A Q8 LM head's approximate logits from int16 activations (argmax.cc: the bound that makes its greedy token
// exact). w: the head's blocks in the pair layout, per 16-column panel per 32-row block 64 B d[16] fp32, then 16 row
// pairs x 16 columns x 2 int8 (byte 2j + t of pair p: column j of row 2p + t), so that one widening load gives every
// lane j its (row 2p, row 2p + 1) int16 pair. out[i, n] (row stride ldo = 16 np) =
//     sum over blocks b: d[b, n] * float(sum_{k in b} xq[i, k] q[k, n])     (the inner sum exact in int32)
// chunk = panels per work item.
struct ApproxQ8Job {
  int64_t M, K, np, chunk, nchunks;
  const int16_t* xq;  // [M, K]
  const uint8_t* w;   // [np, K/32, 576]
  float* out;         // [M, 16 np]
};

// What one instruction-set path provides (compute.cc). Every path computes the same bits.
struct IsaOps {
  const char* name;
  int (*panels_for_rows)(int rm);                                      // register block width for rm rows
  void (*linear_chunk)(const LinearJob& job, int64_t item);            // chunk `item` of a job into job.y
  void (*rmsnorm_rows)(const float* x, int64_t M, int64_t K, const float* w, float eps, float* a);
  void (*swiglu_rows)(const float* x, int64_t M, int64_t K, float* a);  // x [M, 2K] -> a [M, K]
  int (*attention)(const AttentionCall& c);
  // AVX-512, AVX2 and NEON (null on the portable path, where argmax.cc's portable loops serve): chunk `item` of an
  // ApproxQ8Job on every processor of the path, and the candidates of one row of approximate logits (argmax.cc
  // states the rule and the bound F); approx_q8_chunk_vnni: the same chunk with AVX512-VNNI instructions (the
  // AVX-512 paths; null elsewhere), run only where the processor has them. Both give the same sums.
  void (*approx_q8_chunk)(const ApproxQ8Job& job, int64_t item);
  int64_t (*approx_q8_candidates)(const float* out, const float* colabs, int64_t N, float s, float F, int32_t* cand,
                                  int64_t cap);
  void (*approx_q8_chunk_vnni)(const ApproxQ8Job& job, int64_t item);
};

// The ApproxQ8Job chunk of the path in use (isa.cc): its VNNI one where the processor has AVX512-VNNI and
// MseApproxVnni has not turned it off, else its baseline one; null on the portable path.
using ApproxChunkFn = void (*)(const ApproxQ8Job& job, int64_t item);
ApproxChunkFn approx_q8_chunk();

// The candidates' threshold of one row, shared by every scan (compute.cc's and argmax.cc's portable one): top - delta
// rounded down to fp32, top the largest fp32 L_n - B_n, mag the largest |L_n| + B_n, delta = 4.04 u mag (u = 2^-24),
// which covers the fp32 rounding of those sums, of top and of this subtraction, so that every column whose exact
// L_n + B_n reaches the exact max(L_n - B_n) has fp32 L_n + B_n >= the threshold.
inline float approx_threshold(float top, float mag) {
  const double want = (double)top - 4.04 * 0x1p-24 * (double)mag;
  float thr = (float)want;
  if ((double)thr > want) thr = std::nextafter(thr, -std::numeric_limits<float>::infinity());  // never fewer
  return thr;
}

// The path in use (isa.cc): chosen once, on first use, from MSE_KERNEL_ISA or the processor; MseSelectIsa
// changes it (tests compare the paths' bits in one process).
const IsaOps& isa();

constexpr int kMaxRM = 4;  // rows per register block of the linear kernels (every path)

}  // namespace mse
