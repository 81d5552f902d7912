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
//
// The whole decoder stack in one AOT op (MseDecoderStack{F32,Bf16}[QkvBias][OBias], kernels.DecoderStackKernel):
// MindSpore spends ~35 us scheduling each op that follows a long one, and ~1 ms on the small ops that gather the
// embedding and RoPE rows and build the write index (measured on a 2-vCPU Zen 4: 29 gaps between layer ops ~1 ms
// per forward). The stack takes
//     ids, positions, rows int32 [B, T], mask f32 [B, 1, T, S], embed f32 [V, E], cos_table, sin_table f32 [P, D],
//     eps f32 [1], taps int32 [A], then per layer: norm1, W_qkv [, b_qkv], k_cache, v_cache, W_o [, b_o], norm2,
//     W_gate|up, W_down                          -> hidden f32 [B, T, E] (the last layer's output), aux f32 [B, T, A E]
// and runs every layer as decoder_layer does, on the embedding rows of ids, the RoPE rows of positions and the
// write index of rows (models.layers.write_index); aux[..., a E:(a + 1) E] is the hidden state entering layer
// taps[a]. Copies aside, the same functions on the same data: bit-identical to one op per layer
// (tests/test_kernel_teacher.py). Every input is checked before the first layer runs (an id outside the table, a
// position outside the RoPE tables, a row outside the cache: codes 8, 9, 10), so a refused call writes nothing.

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

// Where a layer's weights and caches sit in an op's params (-1: no such bias).
struct LayerSlots {
  int n1, wqkv, bqkv, k, v, wo, bo, n2, wgu, wd;
};

// The group order of the stack (MseDecoderStack*): norm1, W_qkv [, b_qkv], k_cache, v_cache, W_o [, b_o], norm2,
// W_gate|up, W_down from params[g]; *next = the index after it.
LayerSlots group_slots(int g, bool qkv_bias, bool o_bias, int* next) {
  LayerSlots s;
  int i = g;
  s.n1 = i++, s.wqkv = i++, s.bqkv = qkv_bias ? i++ : -1, s.k = i++, s.v = i++, s.wo = i++;
  s.bo = o_bias ? i++ : -1, s.n2 = i++, s.wgu = i++, s.wd = i++;
  *next = i;
  return s;
}

// One layer's weights and caches, checked (layer_weights) and then run (run_layer).
struct Layer {
  mse::WeightFormat fqkv, fo, fgu, fd;
  int64_t H, Hkv, D, S, Nqkv, Ngu, Kd;
  const float *norm1, *bqkv, *bo, *norm2;
  const void *wqkv, *wo, *wgu, *wd;
  float *k, *v;
};

// Checks the layer at `s` for a model of width E and batch B and fills *L; 0, or the failing check's code.
int layer_weights(const LayerSlots& s, void** params, int* ndims, int64_t** shapes, const char** dtypes, bool bf16,
                  int64_t B, int64_t E, Layer* L) {
  for (int f : {s.n1, s.k, s.v, s.n2})
    if (!is(dtypes[f], "float32")) return 3;
  if (ndims[s.k] != 4 || ndims[s.v] != 4) return 2;
  int64_t Kqkv, Ko, No, Kgu, Nd;
  if (!panel_dims(ndims[s.wqkv], shapes[s.wqkv], dtypes[s.wqkv], bf16, &L->fqkv, &Kqkv, &L->Nqkv) ||
      !panel_dims(ndims[s.wo], shapes[s.wo], dtypes[s.wo], bf16, &L->fo, &Ko, &No) ||
      !panel_dims(ndims[s.wgu], shapes[s.wgu], dtypes[s.wgu], bf16, &L->fgu, &Kgu, &L->Ngu) ||
      !panel_dims(ndims[s.wd], shapes[s.wd], dtypes[s.wd], bf16, &L->fd, &L->Kd, &Nd))
    return 5;
  L->Hkv = shapes[s.k][1], L->S = shapes[s.k][2], L->D = shapes[s.k][3];
  const int64_t D = L->D;
  if (D <= 0 || D % kLanes || L->Nqkv % D || Kqkv != E || No != E || Kgu != E || Nd != E || L->Ngu != 2 * L->Kd)
    return 4;
  L->H = L->Nqkv / D - 2 * L->Hkv;
  if (L->H <= 0 || L->H % L->Hkv || Ko != L->H * D) return 4;
  for (int f : {s.n1, s.n2})
    if (ndims[f] != 1 || shapes[f][0] != E) return 6;
  if ((s.bqkv >= 0 && (ndims[s.bqkv] != 1 || shapes[s.bqkv][0] != L->Nqkv || !is(dtypes[s.bqkv], "float32"))) ||
      (s.bo >= 0 && (ndims[s.bo] != 1 || shapes[s.bo][0] != E || !is(dtypes[s.bo], "float32"))))
    return 6;
  for (int a = 0; a < 4; ++a)
    if (shapes[s.v][a] != shapes[s.k][a]) return 7;
  if (shapes[s.k][0] != B) return 7;
  auto f32 = [&](int idx) { return idx < 0 ? nullptr : static_cast<const float*>(params[idx]); };
  L->norm1 = f32(s.n1), L->bqkv = f32(s.bqkv), L->bo = f32(s.bo), L->norm2 = f32(s.n2);
  L->wqkv = params[s.wqkv], L->wo = params[s.wo], L->wgu = params[s.wgu], L->wd = params[s.wd];
  L->k = static_cast<float*>(params[s.k]), L->v = static_cast<float*>(params[s.v]);
  return 0;
}

// y = the layer of x (B x T rows of width E); cos / sin [B, T, D], mask [B, T, S] and write_idx [B, Hkv, T, 3]
// checked by the caller; y must not alias x.
int run_layer(const Layer& L, int64_t B, int64_t T, int64_t E, const float* x, const float* cos, const float* sin,
              const float* mask, const int64_t* write_idx, float eps, float* y) {
  const int64_t M = B * T, H = L.H, D = L.D;
  thread_local std::vector<float> qkv, attn, h, gu;
  qkv.resize((size_t)(M * L.Nqkv));
  attn.resize((size_t)(M * H * D));
  h.resize((size_t)(M * E));
  gu.resize((size_t)(M * L.Ngu));
  mse::linear_forward({L.fqkv, mse::kNorm, M, E, L.Nqkv, x, L.wqkv, L.bqkv, L.norm1, eps, nullptr, qkv.data()});
  if (int err = mse::attention_forward({B, T, H, L.Hkv, D, L.S, qkv.data(), cos, sin, mask, write_idx, L.k, L.v,
                                        attn.data()}))
    return err;
  mse::linear_forward({L.fo, mse::kNone, M, H * D, E, attn.data(), L.wo, L.bo, nullptr, 0.0f, x, h.data()});
  mse::linear_forward({L.fgu, mse::kNorm, M, E, L.Ngu, h.data(), L.wgu, nullptr, L.norm2, eps, nullptr, gu.data()});
  mse::linear_forward({L.fd, mse::kGlu, M, L.Kd, E, gu.data(), L.wd, nullptr, nullptr, 0.0f, h.data(), y});
  return 0;
}

int decoder_layer(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, bool bf16,
                  bool qkv_bias, bool o_bias) {
  int i = 0;
  LayerSlots s;
  const int x_i = i++;
  s.n1 = i++;
  const int eps_i = i++;
  s.wqkv = i++, s.bqkv = qkv_bias ? i++ : -1;
  const int cos_i = i++, sin_i = i++, mask_i = i++, widx_i = i++;
  s.k = i++, s.v = i++, s.wo = i++, s.bo = o_bias ? i++ : -1, s.n2 = i++, s.wgu = i++, s.wd = i++;
  const int y_i = i++;
  if (nparam != i) return 1;
  for (int f : {x_i, eps_i, cos_i, sin_i, mask_i, y_i})
    if (!is(dtypes[f], "float32")) return 3;
  if (!is(dtypes[widx_i], "int64")) return 3;
  if (ndims[x_i] != 3 || ndims[y_i] != 3 || ndims[mask_i] != 4 || ndims[widx_i] != 4) return 2;
  const int64_t B = shapes[x_i][0], T = shapes[x_i][1], E = shapes[x_i][2], M = B * T;
  Layer L;
  if (int err = layer_weights(s, params, ndims, shapes, dtypes, bf16, B, E, &L)) return err;
  for (int a = 0; a < 3; ++a)
    if (shapes[y_i][a] != shapes[x_i][a]) return 4;
  // the attention inputs, checked as MseTreeAttention checks them
  if (shapes[mask_i][0] != B || shapes[mask_i][1] != 1 || shapes[mask_i][2] != T || shapes[mask_i][3] != L.S ||
      shapes[widx_i][0] != B || shapes[widx_i][1] != L.Hkv || shapes[widx_i][2] != T || shapes[widx_i][3] != 3)
    return 7;
  for (int f : {cos_i, sin_i}) {
    int64_t n = 1;
    for (int a = 0; a < ndims[f]; ++a) n *= shapes[f][a];
    if (n != M * L.D || shapes[f][ndims[f] - 1] != L.D) return 7;
  }
  auto f32 = [&](int idx) { return static_cast<const float*>(params[idx]); };
  return run_layer(L, B, T, E, f32(x_i), f32(cos_i), f32(sin_i), f32(mask_i),
                   static_cast<const int64_t*>(params[widx_i]), *f32(eps_i), static_cast<float*>(params[y_i]));
}

// The whole decoder stack (module comment): the embedding rows of ids, the RoPE rows of positions, the write index
// of rows, then every layer, the hidden state entering layer taps[a] copied to aux[..., a E:(a + 1) E]. Every
// input is checked before the first layer runs, so a bad id, position or row writes nothing.
int decoder_stack(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, bool bf16,
                  bool qkv_bias, bool o_bias) {
  const int ids_i = 0, pos_i = 1, rows_i = 2, mask_i = 3, emb_i = 4, cos_i = 5, sin_i = 6, eps_i = 7, taps_i = 8;
  const int first = 9, per = 8 + (qkv_bias ? 1 : 0) + (o_bias ? 1 : 0);
  const int y_i = nparam - 2, aux_i = nparam - 1;
  if (nparam < first + per + 2 || (nparam - first - 2) % per) return 1;
  const int nlayers = (nparam - first - 2) / per;
  for (int f : {ids_i, pos_i, rows_i, taps_i})
    if (!is(dtypes[f], "int32")) return 3;
  for (int f : {mask_i, emb_i, cos_i, sin_i, eps_i, y_i, aux_i})
    if (!is(dtypes[f], "float32")) return 3;
  if (ndims[ids_i] != 2 || ndims[emb_i] != 2 || ndims[cos_i] != 2 || ndims[taps_i] != 1 || ndims[mask_i] != 4 ||
      ndims[y_i] != 3 || ndims[aux_i] != 3)
    return 2;
  const int64_t B = shapes[ids_i][0], T = shapes[ids_i][1], M = B * T;
  const int64_t V = shapes[emb_i][0], E = shapes[emb_i][1], P = shapes[cos_i][0], A = shapes[taps_i][0];
  for (int f : {pos_i, rows_i})
    if (ndims[f] != 2 || shapes[f][0] != B || shapes[f][1] != T) return 4;
  if (shapes[y_i][0] != B || shapes[y_i][1] != T || shapes[y_i][2] != E || shapes[aux_i][0] != B ||
      shapes[aux_i][1] != T || shapes[aux_i][2] != A * E || ndims[sin_i] != 2 || shapes[sin_i][0] != P ||
      shapes[sin_i][1] != shapes[cos_i][1])
    return 4;
  thread_local std::vector<Layer> layers;
  layers.resize((size_t)nlayers);
  for (int l = 0, g = first; l < nlayers; ++l) {
    if (int err = layer_weights(group_slots(g, qkv_bias, o_bias, &g), params, ndims, shapes, dtypes, bf16, B, E,
                                &layers[(size_t)l]))
      return err;
    const Layer& L = layers[(size_t)l];
    if (L.D != shapes[cos_i][1] || L.S != layers[0].S || L.Hkv != layers[0].Hkv) return 7;
  }
  const int64_t D = layers[0].D, S = layers[0].S, Hkv = layers[0].Hkv;
  if (shapes[mask_i][0] != B || shapes[mask_i][1] != 1 || shapes[mask_i][2] != T || shapes[mask_i][3] != S) return 7;
  const int32_t* ids = static_cast<const int32_t*>(params[ids_i]);
  const int32_t* pos = static_cast<const int32_t*>(params[pos_i]);
  const int32_t* rows = static_cast<const int32_t*>(params[rows_i]);
  const int32_t* taps = static_cast<const int32_t*>(params[taps_i]);
  for (int64_t m = 0; m < M; ++m) {
    if (ids[m] < 0 || ids[m] >= V) return 8;
    if (pos[m] < 0 || pos[m] >= P) return 9;
    if (rows[m] < 0 || rows[m] >= S) return 10;
  }
  for (int64_t a = 0; a < A; ++a)
    if (taps[a] < 0 || taps[a] >= nlayers) return 11;
  auto f32 = [&](int idx) { return static_cast<const float*>(params[idx]); };
  const float eps = *f32(eps_i);
  float* y = static_cast<float*>(params[y_i]);
  float* aux = static_cast<float*>(params[aux_i]);
  thread_local std::vector<float> cur, cos, sin;
  thread_local std::vector<int64_t> widx;
  cur.resize((size_t)(M * E));
  cos.resize((size_t)(M * D));
  sin.resize((size_t)(M * D));
  widx.resize((size_t)(B * Hkv * T * 3));
  for (int64_t m = 0; m < M; ++m) {
    std::memcpy(cur.data() + m * E, f32(emb_i) + (int64_t)ids[m] * E, (size_t)E * sizeof(float));
    std::memcpy(cos.data() + m * D, f32(cos_i) + (int64_t)pos[m] * D, (size_t)D * sizeof(float));
    std::memcpy(sin.data() + m * D, f32(sin_i) + (int64_t)pos[m] * D, (size_t)D * sizeof(float));
  }
  for (int64_t b = 0; b < B; ++b)  // models.layers.write_index: (batch, head, row) per token and KV head
    for (int64_t h = 0; h < Hkv; ++h)
      for (int64_t t = 0; t < T; ++t) {
        int64_t* w = widx.data() + ((b * Hkv + h) * T + t) * 3;
        w[0] = b, w[1] = h, w[2] = rows[b * T + t];
      }
  // layer l reads bufs[in] and writes bufs[1 - in]: cur and y alternate, so no layer writes its own input, and
  // the first input is chosen so that the last layer's output lands in y
  float* bufs[2] = {cur.data(), y};
  int in = nlayers % 2 == 0 ? 1 : 0;
  if (in == 1) std::memcpy(y, cur.data(), (size_t)(M * E) * sizeof(float));
  for (int l = 0; l < nlayers; ++l) {
    const float* x = bufs[in];
    for (int64_t a = 0; a < A; ++a)
      if (taps[a] == l)
        for (int64_t m = 0; m < M; ++m)
          std::memcpy(aux + (m * A + a) * E, x + m * E, (size_t)E * sizeof(float));
    if (int err = run_layer(layers[(size_t)l], B, T, E, x, cos.data(), sin.data(), f32(mask_i), widx.data(), eps,
                            bufs[1 - in]))
      return err;
    in = 1 - in;
  }
  return 0;
}

}  // namespace

extern "C" {

// One entry point per (function, dtype, biases): FN is decoder_layer or decoder_stack.
#define MSE_LAYER_ENTRY(NAME, FN, BF16, QKV_BIAS, O_BIAS)                                                  \
  int NAME(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, void*, void*) { \
    return FN(nparam, params, ndims, shapes, dtypes, BF16, QKV_BIAS, O_BIAS);                            \
  }

MSE_LAYER_ENTRY(MseDecoderLayerF32, decoder_layer, false, false, false)
MSE_LAYER_ENTRY(MseDecoderLayerF32QkvBias, decoder_layer, false, true, false)
MSE_LAYER_ENTRY(MseDecoderLayerF32QkvBiasOBias, decoder_layer, false, true, true)
MSE_LAYER_ENTRY(MseDecoderLayerF32OBias, decoder_layer, false, false, true)
MSE_LAYER_ENTRY(MseDecoderLayerBf16, decoder_layer, true, false, false)
MSE_LAYER_ENTRY(MseDecoderLayerBf16QkvBias, decoder_layer, true, true, false)
MSE_LAYER_ENTRY(MseDecoderLayerBf16QkvBiasOBias, decoder_layer, true, true, true)
MSE_LAYER_ENTRY(MseDecoderLayerBf16OBias, decoder_layer, true, false, true)

MSE_LAYER_ENTRY(MseDecoderStackF32, decoder_stack, false, false, false)
MSE_LAYER_ENTRY(MseDecoderStackF32QkvBias, decoder_stack, false, true, false)
MSE_LAYER_ENTRY(MseDecoderStackF32QkvBiasOBias, decoder_stack, false, true, true)
MSE_LAYER_ENTRY(MseDecoderStackF32OBias, decoder_stack, false, false, true)
MSE_LAYER_ENTRY(MseDecoderStackBf16, decoder_stack, true, false, false)
MSE_LAYER_ENTRY(MseDecoderStackBf16QkvBias, decoder_stack, true, true, false)
MSE_LAYER_ENTRY(MseDecoderStackBf16QkvBiasOBias, decoder_stack, true, true, true)
MSE_LAYER_ENTRY(MseDecoderStackBf16OBias, decoder_stack, true, false, true)

}  // extern "C"
