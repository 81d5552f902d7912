// One teacher decoder layer in one AOT op: the five kernels of the fused path (linear.cc, attention.cc) called in
// sequence, so MindSpore dispatches one op per layer instead of five (~14 us of runtime scheduling each, ~1.7 ms
// per forward of the 30-layer default teacher). Same functions in the same order on the same data: the result
// is bit-identical to the five separate ops (tests/test_fused_attention.py), hence just as batch invariant.
//
//     h   = x + o_proj(attention(qkv_proj(RMSNorm(x; norm1))))       (attention writes its K/V rows in place)
//     out = h + down(silu(gate(RMSNorm(h; norm2))) * up(RMSNorm(h; norm2)))
//
// Entry points MseDecoderLayer{F32,Bf16}[QkvBias][OBias], inputs then the output (MindSpore AOT Custom ABI):
//     x f32 [B, T, E], norm1 f32 [E], eps f32 [1], W_qkv panels [, b_qkv f32 [(H + 2 Hkv) D]],
//     cos, sin f32 [B, 1, T, D], mask f32 [B, 1, T, S], write_idx int64 [B, Hkv, T, 3],
//     k_cache, v_cache f32 [B, Hkv, S, D] (written in place), W_o panels [, b_o f32 [E]], norm2 f32 [E],
//     W_gate|up panels (N = 2I), W_down panels (K = I)                          -> out f32 [B, T, E]
// Panel widths must be whole (E, (H + 2 Hkv) D and 2I multiples of 16, I even): models.layers checks this
// before choosing the fused layer. Returns 0, or the first failing check's code.

#include <cstring>
#include <vector>

#include "kernels.h"

namespace {

constexpr int64_t kLanes = 16;

bool is(const char* dtype, const char* want) { return std::strcmp(dtype, want) == 0; }

// A packed weight's format and (K, N) (kernels.h's packed_dims; whole panels only). The entry point's dtype
// (F32 / Bf16) names the dense format; a quantized weight (Q4 / Q8) may stand in for any of the four, each
// weight keeping its own format.
bool panel_dims(int nd, const int64_t* shape, const char* dtype, bool bf16, mse::WeightFormat* fmt, int64_t* K,
                int64_t* N) {
  if (!mse::packed_dims(nd, shape, dtype, fmt, K, N)) return false;
  return *fmt == mse::kQ4 || *fmt == mse::kQ8 || *fmt == (bf16 ? mse::kBf16 : mse::kF32);
}

int decoder_layer(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, bool bf16,
                  bool qkv_bias, bool o_bias) {
  int i = 0;
  const int x_i = i++, n1_i = i++, eps_i = i++, wqkv_i = i++, bqkv_i = qkv_bias ? i++ : -1;
  const int cos_i = i++, sin_i = i++, mask_i = i++, widx_i = i++, k_i = i++, v_i = i++;
  const int wo_i = i++, bo_i = o_bias ? i++ : -1, n2_i = i++, wgu_i = i++, wd_i = i++, y_i = i++;
  if (nparam != i) return 1;
  for (int f : {x_i, n1_i, eps_i, cos_i, sin_i, mask_i, k_i, v_i, n2_i, y_i})
    if (!is(dtypes[f], "float32")) return 3;
  if (!is(dtypes[widx_i], "int64")) return 3;
  if (ndims[x_i] != 3 || ndims[y_i] != 3 || ndims[k_i] != 4 || ndims[mask_i] != 4 || ndims[widx_i] != 4) return 2;
  const int64_t B = shapes[x_i][0], T = shapes[x_i][1], E = shapes[x_i][2], M = B * T;
  const int64_t Hkv = shapes[k_i][1], S = shapes[k_i][2], D = shapes[k_i][3];
  int64_t Kqkv, Nqkv, Ko, No, Kgu, Ngu, Kd, Nd;
  mse::WeightFormat fqkv, fo, fgu, fd;
  if (!panel_dims(ndims[wqkv_i], shapes[wqkv_i], dtypes[wqkv_i], bf16, &fqkv, &Kqkv, &Nqkv) ||
      !panel_dims(ndims[wo_i], shapes[wo_i], dtypes[wo_i], bf16, &fo, &Ko, &No) ||
      !panel_dims(ndims[wgu_i], shapes[wgu_i], dtypes[wgu_i], bf16, &fgu, &Kgu, &Ngu) ||
      !panel_dims(ndims[wd_i], shapes[wd_i], dtypes[wd_i], bf16, &fd, &Kd, &Nd))
    return 5;
  if (D <= 0 || D % kLanes || Nqkv % D || Kqkv != E || No != E || Kgu != E || Nd != E || Ngu != 2 * Kd) return 4;
  const int64_t H = Nqkv / D - 2 * Hkv;
  if (H <= 0 || H % Hkv || Ko != H * D) return 4;
  for (int a = 0; a < 3; ++a)
    if (shapes[y_i][a] != shapes[x_i][a]) return 4;
  for (int f : {n1_i, n2_i})
    if (ndims[f] != 1 || shapes[f][0] != E) return 6;
  if ((bqkv_i >= 0 && (ndims[bqkv_i] != 1 || shapes[bqkv_i][0] != Nqkv || !is(dtypes[bqkv_i], "float32"))) ||
      (bo_i >= 0 && (ndims[bo_i] != 1 || shapes[bo_i][0] != E || !is(dtypes[bo_i], "float32"))))
    return 6;
  // the attention inputs, checked as MseTreeAttention checks them
  for (int a = 0; a < 4; ++a)
    if (shapes[v_i][a] != shapes[k_i][a]) return 7;
  if (shapes[k_i][0] != B || shapes[mask_i][0] != B || shapes[mask_i][1] != 1 || shapes[mask_i][2] != T ||
      shapes[mask_i][3] != S || shapes[widx_i][0] != B || shapes[widx_i][1] != Hkv || shapes[widx_i][2] != T ||
      shapes[widx_i][3] != 3)
    return 7;
  for (int f : {cos_i, sin_i}) {
    int64_t n = 1;
    for (int a = 0; a < ndims[f]; ++a) n *= shapes[f][a];
    if (n != M * D || shapes[f][ndims[f] - 1] != D) return 7;
  }

  auto f32 = [&](int idx) { return idx < 0 ? nullptr : static_cast<const float*>(params[idx]); };
  const float* x = f32(x_i);
  const float eps = *f32(eps_i);
  thread_local std::vector<float> qkv, attn, h, gu;
  qkv.resize((size_t)(M * Nqkv));
  attn.resize((size_t)(M * H * D));
  h.resize((size_t)(M * E));
  gu.resize((size_t)(M * Ngu));
  mse::linear_forward({fqkv, mse::kNorm, M, E, Nqkv, x, params[wqkv_i], f32(bqkv_i), f32(n1_i), eps, nullptr,
                       qkv.data()});
  if (int err = mse::attention_forward({B, T, H, Hkv, D, S, qkv.data(), f32(cos_i), f32(sin_i), f32(mask_i),
                                        static_cast<const int64_t*>(params[widx_i]), static_cast<float*>(params[k_i]),
                                        static_cast<float*>(params[v_i]), attn.data()}))
    return err;
  mse::linear_forward({fo, mse::kNone, M, H * D, E, attn.data(), params[wo_i], f32(bo_i), nullptr, 0.0f, x, h.data()});
  mse::linear_forward({fgu, mse::kNorm, M, E, Ngu, h.data(), params[wgu_i], nullptr, f32(n2_i), eps, nullptr,
                       gu.data()});
  mse::linear_forward({fd, mse::kGlu, M, Kd, E, gu.data(), params[wd_i], nullptr, nullptr, 0.0f, h.data(),
                       static_cast<float*>(params[y_i])});
  return 0;
}

}  // namespace

extern "C" {

#define MSE_LAYER_ENTRY(NAME, BF16, QKV_BIAS, O_BIAS)                                                      \
  int NAME(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, void*, void*) { \
    return decoder_layer(nparam, params, ndims, shapes, dtypes, BF16, QKV_BIAS, O_BIAS);                 \
  }

MSE_LAYER_ENTRY(MseDecoderLayerF32, false, false, false)
MSE_LAYER_ENTRY(MseDecoderLayerF32QkvBias, false, true, false)
MSE_LAYER_ENTRY(MseDecoderLayerF32QkvBiasOBias, false, true, true)
MSE_LAYER_ENTRY(MseDecoderLayerF32OBias, false, false, true)
MSE_LAYER_ENTRY(MseDecoderLayerBf16, true, false, false)
MSE_LAYER_ENTRY(MseDecoderLayerBf16QkvBias, true, true, false)
MSE_LAYER_ENTRY(MseDecoderLayerBf16QkvBiasOBias, true, true, true)
MSE_LAYER_ENTRY(MseDecoderLayerBf16OBias, true, false, true)

}  // extern "C"
