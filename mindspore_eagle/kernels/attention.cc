// Fused cached attention (every CPU path of compute.cc): one call per decoder layer does what ~25 MindSpore ops
// did (split of q/k/v, RoPE, two whole-buffer ScatterNdUpdate copies, attention over the whole static cache):
//
//   1. RoPE on the new keys, then the new K/V rows written *into the cache buffers in place* (only the rows
//      this call owns; the op is marked side_effect_mem on the Python side, so MindSpore orders it against
//      every other read/write of those Parameters and never elides it);
//   2. RoPE on the queries;
//   3. masked GQA attention that reads only each query row's *visible span*: the columns from its first to
//      its last visible one (the committed prefix plus its tree ancestors; for a draft window, from the window
//      start). Columns outside the span are never touched; inside it the additive mask is added as usual.
//
// Entry point (MindSpore AOT Custom ABI, inputs then outputs in params):
//     MseTreeAttention(qkv f32 [B, T, (H + 2 Hkv) D],   per token: H query heads, Hkv key heads, Hkv value heads
//                      cos, sin f32 [B, 1, T, D],        RoPE tables gathered at each token's position
//                      mask f32 [B, 1, T, S],            additive (0 visible, MASK_VALUE = -1e9 hidden)
//                      write_idx int64 [B, Hkv, T, 3],   (batch, head, row): token t writes cache row [b, 0, t, 2]
//                      k_cache, v_cache f32 [B, Hkv, S, D])   written in place
//                   -> out f32 [B, T, H D]             heads concatenated, the layout o_proj reads
//     MseMoveRows(src, dst int32 [B, P], cache_0 .. cache_{n-1} [B, Hkv_i, S, D_i]) -> dst copy int32 [B, P]
//         row src[b, j] of every buffer is copied to row dst[b, j]; all reads of a buffer before its writes
//         (the path commit of cache/commit.py, in place).
//
// Numerics. A column is *visible* to a query row when its mask value is above -5e8 (MASK_VALUE / 2); hidden
// columns are skipped (their softmax weight would underflow to exactly 0). The result of a row is a function
// of the *ordered sequence* of the (k, v) rows it sees and nothing else -- not of T (the tokens in the call),
// not of the blocking, and not of which cache columns those rows occupy:
//   * RoPE as the reference computes it: out = x * cos + rotate_half(x) * sin, three separate roundings.
//   * score[j] = (sum_d q[d] k[j, d]) * scale + mask[j]: the dot product is a strictly sequential fma chain
//     over d = 0 .. D-1 (acc = 0; acc = fma(q[d], k[j, d], acc)), one lane per column.
//   * m = max over the visible columns; p[j] = exp(score[j] - m); l = sum of p over the visible columns by
//     *rank*: the n-th visible column goes to lane n mod 16 (VCOMPRESSPS packs them), then hsum's fixed tree.
//   * o[d] = sum_j p[j] v[j, d]: a sequential fma chain over the columns in increasing j, where a hidden
//     column (p = +0) leaves the sum exactly as it was; out = o / l.
// Why the column positions must not matter: a tree verification sees an accepted path's rows at cache columns
// L + path[i], with siblings hidden in between; greedy decoding of the same tokens (and every forward after
// the commit) sees the same rows contiguous at L + i. Both reduce the same sequence in the same order, so
// the logits of a token are bit-identical in a 1-token decode and inside a tree verification, whichever
// branch is accepted (tests/test_fused_attention.py, tests/test_kernel_teacher.py). Row blocks (RM x RN
// register blocks, rows of several tokens) only share loads: a column computed for another row's sake gets
// p = +0. Columns outside a row's span [first visible, last visible] are never read at all.

#include <atomic>
#include <chrono>
#include <cstring>
#include <vector>

#include "kernels.h"

namespace {

int tree_attention(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) {
  if (nparam != 8) return 1;
  for (int i : {0, 1, 2, 3, 5, 6, 7})
    if (std::strcmp(dtypes[i], "float32") != 0) return 3;
  if (std::strcmp(dtypes[4], "int64") != 0) return 3;
  if (ndims[0] != 3 || ndims[3] != 4 || ndims[4] != 4 || ndims[5] != 4 || ndims[6] != 4 || ndims[7] != 3) return 2;
  const int64_t B = shapes[0][0], T = shapes[0][1], W = shapes[0][2];
  const int64_t Hkv = shapes[5][1], S = shapes[5][2], D = shapes[5][3];
  if (D % 16 != 0 || D <= 0 || Hkv <= 0 || W % D != 0) return 4;
  const int64_t H = W / D - 2 * Hkv;
  if (H <= 0 || H % Hkv != 0) return 4;
  for (int i = 0; i < 4; ++i)
    if (shapes[6][i] != shapes[5][i]) return 4;
  if (shapes[5][0] != B || shapes[3][0] != B || shapes[3][1] != 1 || shapes[3][2] != T || shapes[3][3] != S) return 4;
  if (shapes[4][0] != B || shapes[4][1] != Hkv || shapes[4][2] != T || shapes[4][3] != 3) return 4;
  for (int i : {1, 2}) {
    int64_t n = 1;
    for (int a = 0; a < ndims[i]; ++a) n *= shapes[i][a];
    if (n != B * T * D || shapes[i][ndims[i] - 1] != D) return 4;
  }
  if (shapes[7][0] != B || shapes[7][1] != T || shapes[7][2] != H * D) return 4;
  return mse::attention_forward({B, T, H, Hkv, D, S, static_cast<const float*>(params[0]),
                                 static_cast<const float*>(params[1]), static_cast<const float*>(params[2]),
                                 static_cast<const float*>(params[3]), static_cast<const int64_t*>(params[4]),
                                 static_cast<float*>(params[5]), static_cast<float*>(params[6]),
                                 static_cast<float*>(params[7])});
}

size_t dtype_size(const char* dtype) {
  if (!std::strcmp(dtype, "float32") || !std::strcmp(dtype, "int32")) return 4;
  if (!std::strcmp(dtype, "float16") || !std::strcmp(dtype, "bfloat16")) return 2;
  if (!std::strcmp(dtype, "float64") || !std::strcmp(dtype, "int64")) return 8;
  return 0;
}

int move_rows(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) {
  if (nparam < 4) return 1;
  const int out = nparam - 1;
  if (std::strcmp(dtypes[0], "int32") || std::strcmp(dtypes[1], "int32") || std::strcmp(dtypes[out], "int32"))
    return 3;
  if (ndims[0] != 2 || ndims[1] != 2 || ndims[out] != 2) return 2;
  const int64_t B = shapes[0][0], P = shapes[0][1];
  if (shapes[1][0] != B || shapes[1][1] != P || shapes[out][0] != B || shapes[out][1] != P) return 4;
  const int32_t* src = static_cast<const int32_t*>(params[0]);
  const int32_t* dst = static_cast<const int32_t*>(params[1]);
  for (int c = 2; c < out; ++c) {
    if (ndims[c] != 4 || shapes[c][0] != B || dtype_size(dtypes[c]) == 0) return 4;
    const int64_t S = shapes[c][2];
    for (int64_t i = 0; i < B * P; ++i)
      if (src[i] < 0 || src[i] >= S || dst[i] < 0 || dst[i] >= S) return 5;
  }
  thread_local std::vector<char> tmp;
  for (int c = 2; c < out; ++c) {
    const int64_t Hc = shapes[c][1], S = shapes[c][2];
    const size_t row = (size_t)shapes[c][3] * dtype_size(dtypes[c]);
    char* base = static_cast<char*>(params[c]);
    tmp.resize(row * (size_t)P);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hc; ++h) {
        char* buf = base + (size_t)((b * Hc + h) * S) * row;
        for (int64_t j = 0; j < P; ++j) std::memcpy(tmp.data() + j * row, buf + src[b * P + j] * row, row);
        for (int64_t j = 0; j < P; ++j) std::memcpy(buf + dst[b * P + j] * row, tmp.data() + j * row, row);
      }
  }
  std::memcpy(params[out], dst, (size_t)(B * P) * sizeof(int32_t));
  return 0;
}

// Wall time spent in attention_forward (for benchmarks: the attention share of a forward), and call count.
std::atomic<int64_t> g_calls{0}, g_nanos{0};

}  // namespace

int mse::attention_forward(const AttentionCall& c) {
  const auto start = std::chrono::steady_clock::now();
  const int err = mse::isa().attention(c);
  g_calls.fetch_add(1, std::memory_order_relaxed);
  g_nanos.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
                        .count(), std::memory_order_relaxed);
  return err;
}

extern "C" {

// Calls and seconds spent in attention_forward since the last reset (reset = 1 zeroes them after reading).
int64_t MseAttentionStats(double* seconds, int reset) {
  const int64_t calls = reset ? g_calls.exchange(0) : g_calls.load();
  const int64_t nanos = reset ? g_nanos.exchange(0) : g_nanos.load();
  *seconds = (double)nanos * 1e-9;
  return calls;
}

int MseTreeAttention(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, void*, void*) {
  return tree_attention(nparam, params, ndims, shapes, dtypes);
}

int MseMoveRows(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, void*, void*) {
  return move_rows(nparam, params, ndims, shapes, dtypes);
}

}  // extern "C"
