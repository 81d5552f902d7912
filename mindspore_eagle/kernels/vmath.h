// Shared by the kernel sources: target attributes, lane masks, a fixed-order horizontal sum and an exp.
//
// Everything here is deterministic: the same inputs give the same bits whatever the caller's blocking, which
// the batch-invariant kernels rely on. The library is compiled with -ffp-contract=off (kernels/build.py), so
// a product and a sum written separately stay two roundings, as in the MindSpore/PyTorch references.

#pragma once

// GCC 12 warns about its own _mm512_undefined_* helpers (`__Y = __Y`) once they are inlined: not our code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstdint>

#define MSE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
#define MSE_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")))

namespace mse {

constexpr int kLanes = 16;  // fp32 lanes per zmm register

inline __mmask16 lane_mask(int64_t valid) {
  return valid >= kLanes ? (__mmask16)0xFFFF : valid <= 0 ? (__mmask16)0 : (__mmask16)((1u << valid) - 1u);
}

// Sum of the 16 lanes in one fixed tree: (lanes 0-7 + 8-15), then (0-3 + 4-7), (0-1 + 2-3), (0 + 1).
MSE_AVX512 inline float hsum(__m512 v) {
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  const __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));
  return _mm_cvtss_f32(d);
}

// exp(x) per lane, within ~1 ulp: x = n ln2 + r (|r| <= ln2/2, Cody-Waite split of ln2), degree-7 Taylor
// polynomial of exp(r) in Horner form, times 2^n (VSCALEFPS). Results below the smallest normal float
// (x < -87.33) are flushed to exactly 0, so a hidden attention column (score + MASK_VALUE) contributes an exact
// zero; x > 88.72 gives +inf.
MSE_AVX512 inline __m512 exp512(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.33654f), hi = _mm512_set1_ps(88.72283f);
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_mov_ps((__mmask16)~tiny, _mm512_scalef_ps(p, n));
}

// silu(x) = x / (1 + exp(-x)), per lane.
MSE_AVX512 inline __m512 silu512(__m512 x) {
  const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), x));
  return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

}  // namespace mse
