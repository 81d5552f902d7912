// One 16-lane fp32 vector type, V, for every instruction set the kernels are built for, and the little math
// the kernels need on it (exp, silu, a fixed-order horizontal sum). compute.cc is compiled once per path with
// exactly one of these macros defined (kernels/build.py):
//
//     MSE_ISA_AVX512   x86-64 AVX-512 F/BW/VL/DQ + FMA: V = one zmm register
//     MSE_ISA_AVX2     x86-64 AVX2 + FMA + F16C:        V = two ymm registers (lanes 0-7, 8-15)
//     MSE_ISA_NEON     AArch64 Advanced SIMD:           V = four q registers (lanes 0-3, 4-7, 8-11, 12-15)
//     (none)           portable C++:                    V = float[16], std::fma per lane
//
// Why 16 lanes everywhere, also where a register holds 8 or 4: the kernels' results are fixed by their
// *reduction layout* (which lane accumulates which products, in which order, and the tree that joins the lanes).
// With the same 16-lane layout, the same FMA-everywhere arithmetic and the same exp polynomial on every path,
// AVX-512, AVX2, NEON and the portable path produce the same bits (tests/test_kernel_isa.py, and the self-test
// run under qemu-aarch64). So a trace recorded on one machine replays token for token on another.
//
// Each path lives in its own namespace (mse::MSE_NS), so the per-path objects link into one library without
// clashing definitions. Masks are plain integers: bit l = lane l.

#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(MSE_ISA_AVX512)
#include <immintrin.h>
#if defined(MSE_NATIVE_BF16)
#define MSE_NS avx512bf16
#else
#define MSE_NS avx512
#endif
#elif defined(MSE_ISA_AVX2)
#include <immintrin.h>
#define MSE_NS avx2
#elif defined(MSE_ISA_NEON)
#include <arm_neon.h>
#define MSE_NS neon
#else
#define MSE_NS generic
#endif

// GCC 12 warns about its own _mm512_undefined_* helpers (`__Y = __Y`) once they are inlined: not our code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace mse {
namespace MSE_NS {

constexpr int kLanes = 16;
using Mask = uint32_t;  // bit l = lane l (16 bits used)

inline Mask lane_mask(int64_t valid) {
  return valid >= kLanes ? 0xFFFFu : valid <= 0 ? 0u : (Mask)((1u << valid) - 1u);
}

// ------------------------------------------------------------------------------------------------------------
#if defined(MSE_ISA_AVX512)

struct V {
  __m512 v;
};
inline V zero() { return {_mm512_setzero_ps()}; }
inline V set1(float a) { return {_mm512_set1_ps(a)}; }
inline V load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline V loadz(Mask m, const float* p) { return {_mm512_maskz_loadu_ps((__mmask16)m, p)}; }
inline void store(float* p, V a) { _mm512_storeu_ps(p, a.v); }
inline void stores(Mask m, float* p, V a) { _mm512_mask_storeu_ps(p, (__mmask16)m, a.v); }
inline V add(V a, V b) { return {_mm512_add_ps(a.v, b.v)}; }
inline V sub(V a, V b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline V mul(V a, V b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline V div(V a, V b) { return {_mm512_div_ps(a.v, b.v)}; }
inline V vmax(V a, V b) { return {_mm512_max_ps(a.v, b.v)}; }  // x86 rule: b when unordered or equal
inline V vmin(V a, V b) { return {_mm512_min_ps(a.v, b.v)}; }
inline V fma(V a, V b, V c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }   // a * b + c, one rounding
inline V fnma(V a, V b, V c) { return {_mm512_fnmadd_ps(a.v, b.v, c.v)}; }  // c - a * b, one rounding
inline V round_even(V a) { return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
inline V pow2(V n) {  // 2^n for integral n in [-126, 127]
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n.v), _mm512_set1_epi32(127)), 23);
  return {_mm512_castsi512_ps(e)};
}
inline Mask cmp_gt(V a, V b) { return (Mask)_mm512_cmp_ps_mask(a.v, b.v, _CMP_GT_OQ); }
inline Mask cmp_lt(V a, V b) { return (Mask)_mm512_cmp_ps_mask(a.v, b.v, _CMP_LT_OQ); }
inline V select(Mask m, V a, V b) { return {_mm512_mask_blend_ps((__mmask16)m, b.v, a.v)}; }  // m ? a : b
// The native register R (kSub of them make a V, kRL lanes each), for the hot loops: arrays of R stay in
// registers where arrays of V (a struct) would be spilled by the compiler.
using R = __m512;
constexpr int kSub = 1, kRL = 16;
inline R part(const V& a, int) { return a.v; }
inline void set_part(V& a, int, R r) { a.v = r; }
inline R rload(const float* p) { return _mm512_loadu_ps(p); }
inline R rset1(float a) { return _mm512_set1_ps(a); }
inline R rfma(R a, R b, R c) { return _mm512_fmadd_ps(a, b, c); }
// acc + x[0] * w, x[0] broadcast by the fma itself (an embedded-broadcast memory operand). The same one rounding as
// rfma(rset1(x[0]), w, acc); written in asm so that the compiler cannot hoist the broadcast into a register it
// keeps across panels: in the wide row blocks those registers are what the accumulators need (compute.cc).
// The asm names x as an address, not as memory it reads (a memory operand brings back the stores `prefetch`
// below avoids): sound because no kernel writes its activations while a row block reads them.
inline R rfma_bcast(const float* x, R w, R acc) {
  __asm__("vfmadd231ps (%2)%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "r"(x));
  return acc;
}
#if defined(MSE_NATIVE_BF16)
// acc + the bf16 pair at x (one 32-bit word) dotted with w's pairs, the pair broadcast by the instruction itself: the
// same products and sums as _mm512_dpbf16_ps(acc, set1(*x), w) (the dot multiplies pairwise, its operand order
// changes no product), in asm for rfma_bcast's reason.
inline R rdpbf16_bcast(const uint32_t* x, __m512bh w, R acc) {
  __asm__("vdpbf16ps (%2)%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "r"(x));
  return acc;
}
#endif
// Lane j of `even` / `odd` = bf16 p[2j] / p[2j + 1] (kRL pairs at p) widened to fp32: exact, a shift of the bits.
inline void rbf16_pairs(const uint16_t* p, R& even, R& odd) {
  const __m512i w = _mm512_loadu_si512(p);
  even = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  odd = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32((int)0xFFFF0000u)));
}
inline void rbf16_bcast(uint32_t pair, R& even, R& odd) {
  even = _mm512_castsi512_ps(_mm512_set1_epi32((int)(pair << 16)));
  odd = _mm512_castsi512_ps(_mm512_set1_epi32((int)(pair & 0xFFFF0000u)));
}
inline R rmul(R a, R b) { return _mm512_mul_ps(a, b); }
// Two rows of 16 4-bit values from 16 bytes: lane j of `even` = low nibble of byte j, of `odd` = its high nibble
// (layout.py's q4 pairs). One widening load serves both rows.
inline void rq4_pair(const uint8_t* p, R even[kSub], R odd[kSub]) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));
  even[0] = _mm512_cvtepi32_ps(_mm512_and_si512(b, _mm512_set1_epi32(15)));
  odd[0] = _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4));
}
inline void rq8(const int8_t* p, R q[kSub]) {  // 16 int8 values
  q[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
}
// A prefetch the compiler sees as no memory access at all: GCC 12 treats _mm_prefetch as one that may read any
// array whose address it cannot track, and then keeps a row block's accumulator array in memory, storing every
// accumulator to the stack once per K step (24 zmm stores per K pair in the 8-row wide block, measured by objdump).
inline void prefetch(const void* p) { __asm__ volatile("prefetcht0 (%0)" : : "r"(p)); }

// ------------------------------------------------------------------------------------------------------------
#elif defined(MSE_ISA_AVX2)

struct V {
  __m256 lo, hi;
};
inline __m256i ymask(Mask m) {  // lane l of the result all-ones when bit l of m (8 lanes)
  const __m256i bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)m), bits), bits);
}
inline V zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline V set1(float a) { return {_mm256_set1_ps(a), _mm256_set1_ps(a)}; }
inline V load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline V loadz(Mask m, const float* p) {
  if ((m & 0xFFFFu) == 0xFFFFu) return load(p);
  return {_mm256_maskload_ps(p, ymask(m & 0xFF)), _mm256_maskload_ps(p + 8, ymask(m >> 8))};
}
inline void store(float* p, V a) {
  _mm256_storeu_ps(p, a.lo);
  _mm256_storeu_ps(p + 8, a.hi);
}
inline void stores(Mask m, float* p, V a) {
  if ((m & 0xFFFFu) == 0xFFFFu) return store(p, a);
  _mm256_maskstore_ps(p, ymask(m & 0xFF), a.lo);
  _mm256_maskstore_ps(p + 8, ymask(m >> 8), a.hi);
}
#define MSE_AVX2_BIN(NAME, OP) \
  inline V NAME(V a, V b) { return {OP(a.lo, b.lo), OP(a.hi, b.hi)}; }
MSE_AVX2_BIN(add, _mm256_add_ps)
MSE_AVX2_BIN(sub, _mm256_sub_ps)
MSE_AVX2_BIN(mul, _mm256_mul_ps)
MSE_AVX2_BIN(div, _mm256_div_ps)
MSE_AVX2_BIN(vmax, _mm256_max_ps)
MSE_AVX2_BIN(vmin, _mm256_min_ps)
#undef MSE_AVX2_BIN
inline V fma(V a, V b, V c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline V fnma(V a, V b, V c) { return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)}; }
inline V round_even(V a) {
  return {_mm256_round_ps(a.lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
          _mm256_round_ps(a.hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
inline __m256 pow2_8(__m256 n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23));
}
inline V pow2(V n) { return {pow2_8(n.lo), pow2_8(n.hi)}; }
inline Mask cmp_gt(V a, V b) {
  return (Mask)_mm256_movemask_ps(_mm256_cmp_ps(a.lo, b.lo, _CMP_GT_OQ)) |
         ((Mask)_mm256_movemask_ps(_mm256_cmp_ps(a.hi, b.hi, _CMP_GT_OQ)) << 8);
}
inline Mask cmp_lt(V a, V b) {
  return (Mask)_mm256_movemask_ps(_mm256_cmp_ps(a.lo, b.lo, _CMP_LT_OQ)) |
         ((Mask)_mm256_movemask_ps(_mm256_cmp_ps(a.hi, b.hi, _CMP_LT_OQ)) << 8);
}
inline V select(Mask m, V a, V b) {
  return {_mm256_blendv_ps(b.lo, a.lo, _mm256_castsi256_ps(ymask(m & 0xFF))),
          _mm256_blendv_ps(b.hi, a.hi, _mm256_castsi256_ps(ymask(m >> 8)))};
}
using R = __m256;
constexpr int kSub = 2, kRL = 8;
inline R part(const V& a, int s) { return s == 0 ? a.lo : a.hi; }
inline void set_part(V& a, int s, R r) { (s == 0 ? a.lo : a.hi) = r; }
inline R rload(const float* p) { return _mm256_loadu_ps(p); }
inline R rset1(float a) { return _mm256_set1_ps(a); }
inline R rfma(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
inline void rbf16_pairs(const uint16_t* p, R& even, R& odd) {
  const __m256i w = _mm256_loadu_si256((const __m256i*)p);
  even = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  odd = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32((int)0xFFFF0000u)));
}
inline void rbf16_bcast(uint32_t pair, R& even, R& odd) {
  even = _mm256_castsi256_ps(_mm256_set1_epi32((int)(pair << 16)));
  odd = _mm256_castsi256_ps(_mm256_set1_epi32((int)(pair & 0xFFFF0000u)));
}
inline R rmul(R a, R b) { return _mm256_mul_ps(a, b); }
inline void rq4_pair(const uint8_t* p, R even[kSub], R odd[kSub]) {
  for (int s = 0; s < kSub; ++s) {
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(p + s * kRL)));
    even[s] = _mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(15)));
    odd[s] = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
  }
}
inline void rq8(const int8_t* p, R q[kSub]) {
  q[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
  q[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(p + 8))));
}
inline void prefetch(const void* p) { __asm__ volatile("prefetcht0 (%0)" : : "r"(p)); }  // as AVX-512's

// ------------------------------------------------------------------------------------------------------------
#elif defined(MSE_ISA_NEON)

struct V {
  float32x4_t q[4];
};
inline uint32x4_t qmask(Mask m) {  // lane l all-ones when bit l of m (4 lanes)
  const uint32x4_t bits = {1u, 2u, 4u, 8u};
  return vtstq_u32(vdupq_n_u32(m), bits);
}
inline Mask qbits(uint32x4_t c) {
  const uint32x4_t bits = {1u, 2u, 4u, 8u};
  return (Mask)vaddvq_u32(vandq_u32(c, bits));
}
#define MSE_NEON_MAP(EXPR)                      \
  V r;                                          \
  for (int i = 0; i < 4; ++i) r.q[i] = (EXPR); \
  return r
inline V zero() { MSE_NEON_MAP(vdupq_n_f32(0.0f)); }
inline V set1(float a) { MSE_NEON_MAP(vdupq_n_f32(a)); }
inline V load(const float* p) { MSE_NEON_MAP(vld1q_f32(p + 4 * i)); }
inline V loadz(Mask m, const float* p) {
  if ((m & 0xFFFFu) == 0xFFFFu) return load(p);
  float buf[16];
  for (int l = 0; l < 16; ++l) buf[l] = (m >> l) & 1u ? p[l] : 0.0f;
  return load(buf);
}
inline void store(float* p, V a) {
  for (int i = 0; i < 4; ++i) vst1q_f32(p + 4 * i, a.q[i]);
}
inline void stores(Mask m, float* p, V a) {
  if ((m & 0xFFFFu) == 0xFFFFu) return store(p, a);
  float buf[16];
  store(buf, a);
  for (int l = 0; l < 16; ++l)
    if ((m >> l) & 1u) p[l] = buf[l];
}
inline V add(V a, V b) { MSE_NEON_MAP(vaddq_f32(a.q[i], b.q[i])); }
inline V sub(V a, V b) { MSE_NEON_MAP(vsubq_f32(a.q[i], b.q[i])); }
inline V mul(V a, V b) { MSE_NEON_MAP(vmulq_f32(a.q[i], b.q[i])); }
inline V div(V a, V b) { MSE_NEON_MAP(vdivq_f32(a.q[i], b.q[i])); }
// x86's rule (b when unordered or equal), not FMAX's, so NaN and signed zeros behave as on the other paths
inline V vmax(V a, V b) { MSE_NEON_MAP(vbslq_f32(vcgtq_f32(a.q[i], b.q[i]), a.q[i], b.q[i])); }
inline V vmin(V a, V b) { MSE_NEON_MAP(vbslq_f32(vcltq_f32(a.q[i], b.q[i]), a.q[i], b.q[i])); }
inline V fma(V a, V b, V c) { MSE_NEON_MAP(vfmaq_f32(c.q[i], a.q[i], b.q[i])); }
inline V fnma(V a, V b, V c) { MSE_NEON_MAP(vfmsq_f32(c.q[i], a.q[i], b.q[i])); }
inline V round_even(V a) { MSE_NEON_MAP(vrndnq_f32(a.q[i])); }
inline V pow2(V n) {
  MSE_NEON_MAP(vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n.q[i]), vdupq_n_s32(127)), 23)));
}
inline Mask cmp_gt(V a, V b) {
  Mask m = 0;
  for (int i = 0; i < 4; ++i) m |= qbits(vcgtq_f32(a.q[i], b.q[i])) << (4 * i);
  return m;
}
inline Mask cmp_lt(V a, V b) {
  Mask m = 0;
  for (int i = 0; i < 4; ++i) m |= qbits(vcltq_f32(a.q[i], b.q[i])) << (4 * i);
  return m;
}
inline V select(Mask m, V a, V b) { MSE_NEON_MAP(vbslq_f32(qmask(m >> (4 * i)), a.q[i], b.q[i])); }
using R = float32x4_t;
constexpr int kSub = 4, kRL = 4;
inline R part(const V& a, int s) { return a.q[s]; }
inline void set_part(V& a, int s, R r) { a.q[s] = r; }
inline R rload(const float* p) { return vld1q_f32(p); }
inline R rset1(float a) { return vdupq_n_f32(a); }
inline R rfma(R a, R b, R c) { return vfmaq_f32(c, a, b); }
inline void rbf16_pairs(const uint16_t* p, R& even, R& odd) {
  const uint32x4_t w = vld1q_u32((const uint32_t*)p);
  even = vreinterpretq_f32_u32(vshlq_n_u32(w, 16));
  odd = vreinterpretq_f32_u32(vandq_u32(w, vdupq_n_u32(0xFFFF0000u)));
}
inline void rbf16_bcast(uint32_t pair, R& even, R& odd) {
  even = vreinterpretq_f32_u32(vdupq_n_u32(pair << 16));
  odd = vreinterpretq_f32_u32(vdupq_n_u32(pair & 0xFFFF0000u));
}
inline R rmul(R a, R b) { return vmulq_f32(a, b); }
inline void widen_u8(uint8x16_t v, R q[kSub]) {  // 16 bytes -> 16 fp32 lanes
  const uint16x8_t lo = vmovl_u8(vget_low_u8(v)), hi = vmovl_u8(vget_high_u8(v));
  q[0] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo)));
  q[1] = vcvtq_f32_u32(vmovl_u16(vget_high_u16(lo)));
  q[2] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi)));
  q[3] = vcvtq_f32_u32(vmovl_u16(vget_high_u16(hi)));
}
inline void rq4_pair(const uint8_t* p, R even[kSub], R odd[kSub]) {
  const uint8x16_t b = vld1q_u8(p);
  widen_u8(vandq_u8(b, vdupq_n_u8(15)), even);
  widen_u8(vshrq_n_u8(b, 4), odd);
}
inline void rq8(const int8_t* p, R q[kSub]) {
  const int8x16_t b = vld1q_s8(p);
  const int16x8_t lo = vmovl_s8(vget_low_s8(b)), hi = vmovl_s8(vget_high_s8(b));
  q[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo)));
  q[1] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo)));
  q[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi)));
  q[3] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi)));
}
inline void prefetch(const void* p) { __builtin_prefetch(p); }
#undef MSE_NEON_MAP

// ------------------------------------------------------------------------------------------------------------
#else  // portable C++: the same arithmetic one lane at a time (std::fma is exactly rounded on every CPU)

struct V {
  float f[16];
};
#define MSE_GEN_MAP(EXPR)                      \
  V r;                                         \
  for (int l = 0; l < 16; ++l) r.f[l] = (EXPR); \
  return r
inline V zero() { MSE_GEN_MAP(0.0f); }
inline V set1(float a) { MSE_GEN_MAP(a); }
inline V load(const float* p) { MSE_GEN_MAP(p[l]); }
inline V loadz(Mask m, const float* p) { MSE_GEN_MAP((m >> l) & 1u ? p[l] : 0.0f); }
inline void store(float* p, V a) { std::memcpy(p, a.f, sizeof a.f); }
inline void stores(Mask m, float* p, V a) {
  for (int l = 0; l < 16; ++l)
    if ((m >> l) & 1u) p[l] = a.f[l];
}
inline V add(V a, V b) { MSE_GEN_MAP(a.f[l] + b.f[l]); }
inline V sub(V a, V b) { MSE_GEN_MAP(a.f[l] - b.f[l]); }
inline V mul(V a, V b) { MSE_GEN_MAP(a.f[l] * b.f[l]); }
inline V div(V a, V b) { MSE_GEN_MAP(a.f[l] / b.f[l]); }
inline V vmax(V a, V b) { MSE_GEN_MAP(a.f[l] > b.f[l] ? a.f[l] : b.f[l]); }
inline V vmin(V a, V b) { MSE_GEN_MAP(a.f[l] < b.f[l] ? a.f[l] : b.f[l]); }
inline V fma(V a, V b, V c) { MSE_GEN_MAP(std::fma(a.f[l], b.f[l], c.f[l])); }
inline V fnma(V a, V b, V c) { MSE_GEN_MAP(std::fma(-a.f[l], b.f[l], c.f[l])); }
inline V round_even(V a) { MSE_GEN_MAP(std::nearbyint(a.f[l])); }  // default rounding mode: to nearest even
inline V pow2(V n) {
  V r;
  for (int l = 0; l < 16; ++l) {
    const uint32_t e = (uint32_t)((int32_t)n.f[l] + 127) << 23;
    std::memcpy(&r.f[l], &e, 4);
  }
  return r;
}
inline Mask cmp_gt(V a, V b) {
  Mask m = 0;
  for (int l = 0; l < 16; ++l) m |= (Mask)(a.f[l] > b.f[l]) << l;
  return m;
}
inline Mask cmp_lt(V a, V b) {
  Mask m = 0;
  for (int l = 0; l < 16; ++l) m |= (Mask)(a.f[l] < b.f[l]) << l;
  return m;
}
inline V select(Mask m, V a, V b) { MSE_GEN_MAP((m >> l) & 1u ? a.f[l] : b.f[l]); }
inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
using R = float;
constexpr int kSub = 16, kRL = 1;
inline R part(const V& a, int s) { return a.f[s]; }
inline void set_part(V& a, int s, R r) { a.f[s] = r; }
inline R rload(const float* p) { return *p; }
inline R rset1(float a) { return a; }
inline R rfma(R a, R b, R c) { return std::fma(a, b, c); }
inline void rbf16_pairs(const uint16_t* p, R& even, R& odd) {
  even = bits_to_float((uint32_t)p[0] << 16);
  odd = bits_to_float((uint32_t)p[1] << 16);
}
inline void rbf16_bcast(uint32_t pair, R& even, R& odd) {
  even = bits_to_float(pair << 16);
  odd = bits_to_float(pair & 0xFFFF0000u);
}
inline R rmul(R a, R b) { return a * b; }
inline void rq4_pair(const uint8_t* p, R even[kSub], R odd[kSub]) {
  for (int l = 0; l < 16; ++l) even[l] = (float)(p[l] & 15), odd[l] = (float)(p[l] >> 4);
}
inline void rq8(const int8_t* p, R q[kSub]) {
  for (int l = 0; l < 16; ++l) q[l] = (float)p[l];
}
inline void prefetch(const void* p) { __builtin_prefetch(p); }
#undef MSE_GEN_MAP

#endif

// ------------------------------------------------------------------------------------------------------------
// Shared by every path, written once on the operations above.

inline void to_array(V a, float out[16]) { store(out, a); }

// Sum of the 16 lanes in one fixed tree: (lanes 0-7 + 8-15), then (0-3 + 4-7), (0-1 + 2-3), (0 + 1).
inline float hsum(V a) {
  float f[16];
  to_array(a, f);
  float s8[8], s4[4];
  for (int i = 0; i < 8; ++i) s8[i] = f[i] + f[i + 8];
  for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
  const float s2a = s4[0] + s4[2], s2b = s4[1] + s4[3];
  return s2a + s2b;
}

// Largest lane (exact whatever the order, for non-NaN lanes).
inline float hmax(V a) {
  float f[16];
  to_array(a, f);
  float m = f[0];
  for (int l = 1; l < 16; ++l) m = f[l] > m ? f[l] : m;
  return m;
}

// exp(x) per lane, within ~1 ulp: x = n ln2 + r (|r| <= ln2/2, Cody-Waite split of ln2), degree-7 Taylor
// polynomial of exp(r) in Horner form (fma), times 2^n applied as two exact power-of-two products
// (2^n1 * 2^n2, n1 = round(n / 2)), so a result in the subnormal range is rounded once, as a single scaling
// would. Results for x < -87.33654 (below the smallest normal float) are exactly 0, so a hidden attention column
// (score + MASK_VALUE) contributes an exact zero; x > 88.72283 gives +inf.
inline V vexp(V x) {
  const V lo = set1(-87.33654f), hi = set1(88.72283f);
  const Mask tiny = cmp_lt(x, lo);
  x = vmin(vmax(x, lo), hi);
  const V n = round_even(mul(x, set1(1.44269504088896341f)));
  V r = fnma(n, set1(0.693359375f), x);
  r = fnma(n, set1(-2.12194440e-4f), r);
  V p = set1(1.0f / 5040.0f);
  p = fma(p, r, set1(1.0f / 720.0f));
  p = fma(p, r, set1(1.0f / 120.0f));
  p = fma(p, r, set1(1.0f / 24.0f));
  p = fma(p, r, set1(1.0f / 6.0f));
  p = fma(p, r, set1(0.5f));
  p = fma(p, r, set1(1.0f));
  p = fma(p, r, set1(1.0f));
  const V n1 = round_even(mul(n, set1(0.5f)));
  const V n2 = sub(n, n1);
  return select(tiny, zero(), mul(mul(p, pow2(n1)), pow2(n2)));
}

// silu(x) = x / (1 + exp(-x)), per lane.
inline V silu(V x) { return div(x, add(set1(1.0f), vexp(sub(zero(), x)))); }

}  // namespace MSE_NS
}  // namespace mse
