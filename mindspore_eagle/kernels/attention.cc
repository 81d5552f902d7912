// Fused cached attention for x86-64 CPUs with AVX-512: one call per decoder layer does what ~25 MindSpore ops
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

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels.h"
#include "vmath.h"

using mse::kLanes;
using mse::lane_mask;

namespace {

constexpr float kHiddenBelow = -5e8f;  // additive mask values at or below this hide a column (MASK_VALUE/2)
constexpr int kRM = 6;                 // query rows per register block
constexpr int kRN = 4;                 // 16-column (or 16-dim) vectors per register block

int64_t floor16(int64_t j) { return j / kLanes * kLanes; }
int64_t ceil16(int64_t j) { return (j + kLanes - 1) / kLanes * kLanes; }

struct Span {
  int64_t lo, hi;  // visible columns lie in [lo, hi)
  bool all;        // the row sees nothing: every column counts as visible (the reference averages them all)
};

// The first and last visible column of one mask row.
MSE_AVX512 Span visible_span(const float* m, int64_t S) {
  const __m512 th = _mm512_set1_ps(kHiddenBelow);
  int64_t lo = -1, hi = -1;
  for (int64_t j0 = 0; j0 < S; j0 += kLanes) {
    const __mmask16 valid = lane_mask(S - j0);
    const __mmask16 vis = _mm512_mask_cmp_ps_mask(valid, _mm512_maskz_loadu_ps(valid, m + j0), th, _CMP_GT_OQ);
    if (vis) {
      lo = j0 + __builtin_ctz((unsigned)vis);
      break;
    }
  }
  if (lo < 0) return {0, S, true};
  for (int64_t j0 = floor16(S - 1); j0 >= 0; j0 -= kLanes) {
    const __mmask16 valid = lane_mask(S - j0);
    const __mmask16 vis = _mm512_mask_cmp_ps_mask(valid, _mm512_maskz_loadu_ps(valid, m + j0), th, _CMP_GT_OQ);
    if (vis) {
      hi = j0 + 32 - __builtin_clz((unsigned)vis);
      break;
    }
  }
  return {lo, hi, false};
}

// out = x * cos + rotate_half(x) * sin, rotate_half(x) = [-x[D/2:], x[:D/2]] (HF's layout).
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

// 16 x 16 transpose in registers: r[i] (row i) -> r[c] (column c). Pure data movement.
MSE_AVX512 inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  __m512 u[16];  // u[4i + k], 128-bit lane L: column 4L + k of rows 4i .. 4i+3
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

// Keys [j0, j1) of one head (rows of D floats at k, row j at k + j * D; j1 <= S) into kt[d][j - j0] with row
// stride ldk; j0, ldk multiples of 16, columns past j1 (up to ceil16) zero. D % 16 == 0.
MSE_AVX512 void transpose_keys(const float* k, int64_t D, int64_t j0, int64_t j1, float* kt, int64_t ldk) {
  for (int64_t jb = j0; jb < j1; jb += kLanes) {
    const int64_t nrows = std::min<int64_t>(kLanes, j1 - jb);
    for (int64_t d0 = 0; d0 < D; d0 += kLanes) {
      __m512 r[16];
      for (int i = 0; i < 16; ++i) r[i] = i < nrows ? _mm512_loadu_ps(k + (jb + i) * D + d0) : _mm512_setzero_ps();
      transpose16(r);
      for (int c = 0; c < 16; ++c) _mm512_storeu_ps(kt + (d0 + c) * ldk + (jb - j0), r[c]);
    }
  }
}

// scores s[i][16 c + l] = sum_d q[i][d] kt[d][16 c + l] for RM query rows and RN column vectors.
template <int RM, int RN>
MSE_AVX512 void qk_block(const float* q, int64_t D, const float* kt, int64_t ldk, float* s, int64_t lds) {
  __m512 acc[RM][RN];
  for (int i = 0; i < RM; ++i)
    for (int c = 0; c < RN; ++c) acc[i][c] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; ++d) {
    __m512 w[RN];
    for (int c = 0; c < RN; ++c) w[c] = _mm512_loadu_ps(kt + d * ldk + c * kLanes);
    for (int i = 0; i < RM; ++i) {
      const __m512 b = _mm512_set1_ps(q[i * D + d]);
      for (int c = 0; c < RN; ++c) acc[i][c] = _mm512_fmadd_ps(b, w[c], acc[i][c]);
    }
  }
  for (int i = 0; i < RM; ++i)
    for (int c = 0; c < RN; ++c) _mm512_storeu_ps(s + i * lds + c * kLanes, acc[i][c]);
}

// o[i][16 c + l] = sum_{j < n} p[i][j] v[j][16 c + l] (sequential in j), RM rows x RN 16-dim vectors; v rows
// have stride D.
template <int RM, int RN>
MSE_AVX512 void pv_block(const float* p, int64_t ldp, const float* v, int64_t D, int64_t n, float* o, int64_t ldo) {
  __m512 acc[RM][RN];
  for (int i = 0; i < RM; ++i)
    for (int c = 0; c < RN; ++c) acc[i][c] = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    __m512 w[RN];
    for (int c = 0; c < RN; ++c) w[c] = _mm512_loadu_ps(v + j * D + c * kLanes);
    for (int i = 0; i < RM; ++i) {
      const __m512 b = _mm512_set1_ps(p[i * ldp + j]);
      for (int c = 0; c < RN; ++c) acc[i][c] = _mm512_fmadd_ps(b, w[c], acc[i][c]);
    }
  }
  for (int i = 0; i < RM; ++i)
    for (int c = 0; c < RN; ++c) _mm512_storeu_ps(o + i * ldo + c * kLanes, acc[i][c]);
}

using QkFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t);
using PvFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t);

template <int RM, int... RNs>
constexpr std::array<QkFn, sizeof...(RNs)> qk_row(std::integer_sequence<int, RNs...>) {
  return {&qk_block<RM, RNs + 1>...};
}
template <int RM, int... RNs>
constexpr std::array<PvFn, sizeof...(RNs)> pv_row(std::integer_sequence<int, RNs...>) {
  return {&pv_block<RM, RNs + 1>...};
}
template <int... RMs>
constexpr std::array<std::array<QkFn, kRN>, sizeof...(RMs)> qk_table(std::integer_sequence<int, RMs...>) {
  return {qk_row<RMs + 1>(std::make_integer_sequence<int, kRN>{})...};
}
template <int... RMs>
constexpr std::array<std::array<PvFn, kRN>, sizeof...(RMs)> pv_table(std::integer_sequence<int, RMs...>) {
  return {pv_row<RMs + 1>(std::make_integer_sequence<int, kRN>{})...};
}
const auto kQk = qk_table(std::make_integer_sequence<int, kRM>{});  // [RM - 1][RN - 1]
const auto kPv = pv_table(std::make_integer_sequence<int, kRM>{});

// Lanes of the 16 columns from j that are visible: inside the span and (unless the row sees nothing) with a mask
// value above the threshold.
MSE_AVX512 inline __mmask16 visible_lanes(const float* mask, int64_t j, Span span) {
  const __mmask16 in = lane_mask(span.hi - j) & (__mmask16)~lane_mask(span.lo - j);
  if (span.all) return in;
  return _mm512_mask_cmp_ps_mask(in, _mm512_maskz_loadu_ps(in, mask + j), _mm512_set1_ps(kHiddenBelow), _CMP_GT_OQ);
}

// Softmax of one row in place: s holds raw dot products for columns [c0, c1) (c0 a multiple of 16, absolute
// column c0 at s[0]); afterwards s holds p, +0 at every hidden column; returns l (summed by rank, using
// `packed`, room for c1 - c0 floats).
MSE_AVX512 float softmax_row(float* s, int64_t c0, int64_t c1, const float* mask, Span span, float scale,
                             float* packed) {
  const __m512 sc = _mm512_set1_ps(scale);
  const int64_t b0 = floor16(span.lo), b1 = ceil16(span.hi);
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int64_t j = b0; j < b1; j += kLanes) {
    const __mmask16 vis = visible_lanes(mask, j, span);
    const __m512 x = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(s + (j - c0)), sc), _mm512_maskz_loadu_ps(vis, mask + j));
    const __m512 xm = _mm512_mask_blend_ps(vis, _mm512_set1_ps(-INFINITY), x);
    _mm512_storeu_ps(s + (j - c0), xm);
    mx = _mm512_max_ps(mx, xm);
  }
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  int64_t n = 0;  // visible columns so far
  for (int64_t j = c0; j < c1; j += kLanes) {
    if (j < b0 || j >= b1) {
      _mm512_storeu_ps(s + (j - c0), _mm512_setzero_ps());
      continue;
    }
    const __mmask16 vis = visible_lanes(mask, j, span);
    const __m512 p = _mm512_maskz_mov_ps(vis, mse::exp512(_mm512_sub_ps(_mm512_loadu_ps(s + (j - c0)), m)));
    _mm512_storeu_ps(s + (j - c0), p);
    _mm512_mask_compressstoreu_ps(packed + n, vis, p);
    n += __builtin_popcount((unsigned)vis);
  }
  __m512 lsum = _mm512_setzero_ps();
  for (int64_t r = 0; r < n; r += kLanes) lsum = _mm512_add_ps(lsum, _mm512_maskz_loadu_ps(lane_mask(n - r), packed + r));
  return mse::hsum(lsum);
}

struct Scratch {
  std::vector<float> kt, q, s, o, packed;
  std::vector<Span> spans;
};

int tree_attention(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) {
  if (nparam != 8) return 1;
  for (int i : {0, 1, 2, 3, 5, 6, 7})
    if (std::strcmp(dtypes[i], "float32") != 0) return 3;
  if (std::strcmp(dtypes[4], "int64") != 0) return 3;
  if (ndims[0] != 3 || ndims[3] != 4 || ndims[4] != 4 || ndims[5] != 4 || ndims[6] != 4 || ndims[7] != 3) return 2;
  const int64_t B = shapes[0][0], T = shapes[0][1], W = shapes[0][2];
  const int64_t Hkv = shapes[5][1], S = shapes[5][2], D = shapes[5][3];
  if (D % kLanes != 0 || D <= 0 || Hkv <= 0 || W % D != 0) return 4;
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

int attention_body(const mse::AttentionCall& c) {
  const int64_t B = c.B, T = c.T, H = c.H, Hkv = c.Hkv, D = c.D, S = c.S, W = (H + 2 * Hkv) * D, rep = H / Hkv;
  const float* qkv = c.qkv;
  const float* cosv = c.cos;
  const float* sinv = c.sin;
  const float* mask = c.mask;
  const int64_t* widx = c.write_idx;
  float* kc = c.k_cache;
  float* vc = c.v_cache;
  float* out = c.out;
  const float scale = (float)(1.0 / std::sqrt((double)D));

  for (int64_t b = 0; b < B; ++b)  // all row indices first: a bad one writes nothing
    for (int64_t t = 0; t < T; ++t) {
      const int64_t row = widx[((b * Hkv) * T + t) * 3 + 2];
      if (row < 0 || row >= S) return 5;
    }

  thread_local Scratch sc;
  sc.spans.resize((size_t)T);
  sc.q.resize((size_t)(rep * T * D));
  sc.o.resize((size_t)(kRM * D));
  for (int64_t b = 0; b < B; ++b) {
    // 1. new K (roped) and V rows into the cache, in place
    for (int64_t t = 0; t < T; ++t) {
      const int64_t row = widx[((b * Hkv) * T + t) * 3 + 2];
      const float* tok = qkv + (b * T + t) * W;
      const float* c = cosv + (b * T + t) * D;
      const float* s = sinv + (b * T + t) * D;
      for (int64_t g = 0; g < Hkv; ++g) {
        rope(tok + (H + g) * D, c, s, D, kc + ((b * Hkv + g) * S + row) * D);
        std::memcpy(vc + ((b * Hkv + g) * S + row) * D, tok + (H + Hkv + g) * D, (size_t)D * sizeof(float));
      }
    }
    // 2. each token's visible span
    int64_t jlo = S, jhi = 0;
    for (int64_t t = 0; t < T; ++t) {
      sc.spans[t] = visible_span(mask + (b * T + t) * S, S);
      jlo = std::min(jlo, sc.spans[t].lo);
      jhi = std::max(jhi, sc.spans[t].hi);
    }
    const int64_t k0 = floor16(jlo), ncol = ceil16(jhi) - k0;  // this batch entry's key columns [k0, k0 + ncol)
    sc.kt.resize((size_t)(D * ncol));
    sc.s.resize((size_t)(kRM * ncol));
    sc.packed.resize((size_t)ncol);
    for (int64_t g = 0; g < Hkv; ++g) {
      const float* kh = kc + (b * Hkv + g) * S * D;
      const float* vh = vc + (b * Hkv + g) * S * D;
      transpose_keys(kh, D, k0, jhi, sc.kt.data(), ncol);
      // queries of KV head g, row i = t * rep + r (head g * rep + r of token t), roped
      for (int64_t t = 0; t < T; ++t)
        for (int64_t r = 0; r < rep; ++r)
          rope(qkv + (b * T + t) * W + (g * rep + r) * D, cosv + (b * T + t) * D, sinv + (b * T + t) * D, D,
               sc.q.data() + (t * rep + r) * D);
      const int64_t rows = T * rep;
      for (int64_t i0 = 0; i0 < rows; i0 += kRM) {
        const int rm = (int)std::min<int64_t>(kRM, rows - i0);
        int64_t blo = S, bhi = 0;  // the block's column union
        for (int i = 0; i < rm; ++i) {
          const Span sp = sc.spans[(i0 + i) / rep];
          blo = std::min(blo, sp.lo);
          bhi = std::max(bhi, sp.hi);
        }
        const int64_t c0 = floor16(blo), c1 = ceil16(bhi);
        float* s = sc.s.data();
        const int64_t lds = ncol;
        for (int64_t j = c0; j < c1; j += kRN * kLanes) {
          const int rn = (int)std::min<int64_t>(kRN, (c1 - j) / kLanes);
          kQk[rm - 1][rn - 1](sc.q.data() + i0 * D, D, sc.kt.data() + (j - k0), ncol, s + (j - c0), lds);
        }
        float l[kRM];
        for (int i = 0; i < rm; ++i) {
          const int64_t t = (i0 + i) / rep;
          l[i] = softmax_row(s + i * lds, c0, c1, mask + (b * T + t) * S, sc.spans[t], scale, sc.packed.data());
        }
        for (int64_t d0 = 0; d0 < D; d0 += kRN * kLanes) {  // columns [blo, bhi): p from s[blo - c0]
          const int rn = (int)std::min<int64_t>(kRN, (D - d0) / kLanes);
          kPv[rm - 1][rn - 1](s + (blo - c0), lds, vh + blo * D + d0, D, bhi - blo, sc.o.data() + d0, D);
        }
        for (int i = 0; i < rm; ++i) {
          const int64_t t = (i0 + i) / rep, h = g * rep + (i0 + i) % rep;
          float* dst = out + (b * T + t) * H * D + h * D;
          for (int64_t d = 0; d < D; ++d) dst[d] = sc.o[i * D + d] / l[i];
        }
      }
    }
  }
  return 0;
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
  const int err = attention_body(c);
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
