// The kernels' internal interface, shared by the sources of the one library: linear.cc and attention.cc each
// implement one call below behind their own AOT entry points, and layer.cc chains them into a whole decoder
// layer. Arguments are checked by the entry points; these functions trust them.

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

}  // namespace mse
