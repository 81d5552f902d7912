// The kernels' internal interface, shared by the sources of the one library:
//
//     compute.cc    the arithmetic, compiled once per instruction-set path (simd.h); exports one IsaOps table
//     isa.cc        which paths this processor can run, and the one in use (MSE_KERNEL_ISA or the best)
//     linear.cc     linear_forward: argument checks, the thread pool, prologues; calls the path's blocks
//     attention.cc  attention_forward and the in-place row moves; calls the path's attention body
//     layer.cc      a whole decoder layer from the two
//
// Arguments are checked by the entry points; these functions trust them.

#pragma once

#include <cstdint>

namespace mse {

enum Prologue { kNone = 0, kNorm = 1, kGlu = 2 };

// y [M, N] = res + (a @ W + bias), a = x (kNone), RMSNorm(x; norm_w, eps) (kNorm), or silu(x[:, :K]) * x[:, K:]
// with x [M, 2K] (kGlu). W: the packed panels of kernels/layout.py (fp32, or bf16 bits when bf16). bias, norm_w
// and res may be null. Adds its wall time to MseKernelStats.
struct LinearCall {
  bool bf16;
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

// One linear call's work, cut into chunks of whole 16-column panels (linear.cc's pool hands them out).
struct LinearJob {
  int64_t M, K, N, np, chunk, nchunks;  // chunk = panels per work item
  const float* x;        // fp32 activations [M, K] (fp32 kernels)
  const float* wf;       // fp32 panels, or
  const uint16_t* wb;    // bf16 panels
  const uint32_t* xq;    // bf16 activations, K2 pairs per row (bf16 kernels)
  int64_t K2;
  const float* bias;     // [N] or null
  const float* res;      // residual [M, N] added to the result, or null
  float* y;              // [M, N]
  bool bf16;
};

// What one instruction-set path provides (compute.cc). Every path computes the same bits.
struct IsaOps {
  const char* name;
  int (*panels_for_rows)(int rm);                                      // register block width for rm rows
  void (*linear_chunk)(const LinearJob& job, int64_t item);            // chunk `item` of a job into job.y
  void (*rmsnorm_rows)(const float* x, int64_t M, int64_t K, const float* w, float eps, float* a);
  void (*swiglu_rows)(const float* x, int64_t M, int64_t K, float* a);  // x [M, 2K] -> a [M, K]
  int (*attention)(const AttentionCall& c);
};

// The path in use (isa.cc): chosen once, on first use, from MSE_KERNEL_ISA or the processor; MseSelectIsa
// changes it (tests compare the paths' bits in one process).
const IsaOps& isa();

constexpr int kMaxRM = 4;  // rows per register block of the linear kernels (every path)

}  // namespace mse
