// A Q8 LM head's greedy token, exact, without computing 49k logits per row the exact way:
//
//     MseTiedArgmaxQ8     (x f32 [..., K], Q8 panels, pair panels, colabs f32 [N], norm f32 [K], eps f32 [1])
//                         -> token int32 [...]                      (a tied head: the final RMSNorm inside)
//     MseArgmaxQ8         (x f32 [..., K], Q8 panels, pair panels, colabs f32 [N]) -> token   (x already normed)
//     ...Rows             (the same, then rows int32 [...])  -> token; rows flagged 0 get token 0 (not computed)
//
// token = np.argmax of the row's logits as the Q8 LM head kernel computes them (linear.cc, MseLinearQ8[Norm]Rows:
// a = RMSNorm(x) or x, logit[n] = one fma chain over k from 0 with w = d q): the first of equal maxima, the first
// NaN.
//
// Why: with several rows (tree verification, batched decoding) the exact Q8 head spends 3 + M instructions per K row
// and 16 columns (weights rebuilt, one fma per row); AVX512-VNNI's VPDPWSSD multiplies int16 activations by the int8
// weights two K rows at a time, (1 + M) / 2 instructions (AVX2's VPMADDWD + VPADDD on two ymm halves: 1 + 2M, where
// the exact kernel spends 6 + 2M there). Its logits are approximate; a bound makes the token exact:
//
//   1. a = RMSNorm(x) (the kernel's own prologue, same bits) or x; s = max|a| / 32767; xq = round(a / s) (int16);
//      e = max_k |a_k - s xq_k| (fp64, exact).
//   2. approx: L~[n] = s * sum_b d[b, n] float(sum_{k in b} xq_k q[k, n])   (int32 inner sums exact; compute.cc's
//      VNNI / AVX2 blocks where the path has them, approx_portable elsewhere: correct on every path, fast only there)
//   3. every logit L[n] of the exact kernel lies within B[n] = F W1[n] of L~[n], W1[n] = sum_k |w[k, n]| (colabs,
//      rounded up), F = 1.01 (e + (gamma_K + gamma_{K/32 + 3}) max(max|a|, 32767 s)), gamma_n = n u / (1 - n u),
//      u = 2^-24:  |L - a.w| <= gamma_K sum_k |a_k w_k| (the kernel's K fmas, each rounding once);
//      |s xq.w - a.w| <= e W1 (quantisation); |L~ - s xq.w| <= gamma_{K/32+3} 32767 s W1 (int32 -> fp32, the block
//      fmas, the product by s).
//   4. T = max_n (L~[n] - B[n]); the argmax column n* has L~[n*] + B[n*] >= L[n*] >= L[n] >= L~[n] - B[n] for every
//      n, so it is among the candidates {n : L~[n] + B[n] >= T} (compute.cc's scan: fp32 with a slack covering
//      its own roundings), and so is every column tied with it. The candidates' exact logits, by the kernel's own
//      chain (exact_logit), pick the token: the largest, the lowest index among equals.
// A row with a non-finite or zero max|a|, a subnormal s, or more than kMaxCandidates candidates takes the exact
// kernel for its whole row (linear_forward, one row) and np.argmax's rule on it: the same token, the slow way.
// Measured on MT-Bench and outside prompts (experiments/lm_head_bound.py): ~1.05 candidates per row.
//
// A dense fp32 LM head (MseTiedArgmaxF32, MseArgmaxF32[Rows]: the f32 panels in place of the Q8 ones, then
// dnorm f32 [N]): the pair panels hold a Q8 copy w^ = d q of its weights w (kernels/greedy_head.py quantises each
// 32-row block of a column: d = max|w| / 127), the exact logits are the fp32 kernel's chain on w (exact_logit_f32,
// and linear_forward kF32 for the fallback rows), and the bound gains the copy's error:
//     |a.w^ - a.w| <= ||a||_2 dnorm[n],  dnorm[n] >= ||w[:, n] - w^[:, n]||_2 (fp64, rounded up),
// so a row's columns are scanned against B[n] = F W1[n] + G dnorm[n] (G >= ||a||_2; W1 = the larger of the two
// weights' column sums, which covers every term of step 3 for either). A head whose weights are Q8 values already
// (the dequantized GGUF of --weights dense) has dnorm = 0: the Q8 head's bound, and the same candidates.
//
// A dense bf16 LM head (MseTiedArgmaxBf16, MseArgmaxBf16[Rows]: bf16 panels, dnorm, then wnorm f32 [N]): its kernel
// multiplies b = bf16(a) (linear.cc's rounding, kernels.h) by the bf16 weights, so the exact logits are that kernel
// itself on the candidate's one panel (exact_logit_bf16: the path's own pair order and VDPBF16PS rounding), and the
// bound gains the activations' rounding and VDPBF16PS's flush of subnormal partial sums:
//     |L - b.w| <= gamma_K max|b| W1[n] + K 2^-126   (max|b| <= (1 + 2^-8) max|a|, inside F's 1.01)
//     |b.w - a.w| <= ||b - a||_2 wnorm[n],   wnorm[n] >= ||w[:, n]||_2
// so B[n] = F W1[n] + G dnorm[n] + Gb wnorm[n] + K 2^-126 (Gb >= ||b - a||_2, exact differences in fp64). A row
// whose b is not finite takes the exact kernel. Measured in docs/kernels.md.
//
// Rows are independent (the activations, the bound and the candidates of a row depend on that row only), so a
// row's token never depends on the other rows of the call: the kernels' batch invariance.

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels.h"

namespace {

constexpr double kU = 0x1p-24;
constexpr int64_t kMaxCandidates = 64;
constexpr int64_t kChunkPanels = 24;  // panels per work item (a multiple of every register block's width)
constexpr int64_t kLanes = 16;

double gamma(int64_t n) { return n * kU / (1.0 - n * kU); }

std::atomic<int64_t> g_rows{0}, g_candidates{0}, g_fallbacks{0};

struct RowPlan {
  float s = 0.0f, F = 0.0f;
  bool fallback = true;
  int32_t token = 0;
};

// The smallest fp32 value not below v.
float round_up_f32(double v) {
  float g = (float)v;
  if ((double)g < v) g = std::nextafter(g, std::numeric_limits<float>::infinity());
  return g;
}

// Step 1 for one row: xq, s and F, or a fallback.
RowPlan quantize(const float* a, int64_t K, int16_t* xq) {
  RowPlan plan;
  std::fill(xq, xq + K, (int16_t)0);
  float amax = 0.0f;
  for (int64_t k = 0; k < K; ++k) {
    const float v = std::fabs(a[k]);
    if (!(v <= FLT_MAX)) return plan;  // NaN or an infinity
    amax = std::max(amax, v);
  }
  const float s = amax / 32767.0f;
  if (!std::isnormal(s)) return plan;
  double e = 0.0;
  for (int64_t k = 0; k < K; ++k) {
    const double r = std::min(32767.0, std::max(-32767.0, std::nearbyint((double)a[k] / (double)s)));
    xq[k] = (int16_t)r;
    e = std::max(e, std::fabs((double)a[k] - (double)s * r));  // s r is exact in fp64 (24 + 16 bits)
  }
  const double ref = std::max((double)amax, 32767.0 * (double)s);
  const double F = 1.01 * (e + (gamma(K) + gamma(K / mse::kQBlock + 3)) * ref);
  plan.s = s, plan.F = round_up_f32(F), plan.fallback = false;
  return plan;
}

// Column n's logit exactly as the Q8 kernel computes it (compute.cc block_q: w = d q, acc = fma(a_k, w, acc) for
// k ascending from acc = 0; its K slabs and register blocks never change that chain).
float exact_logit(const float* a, const uint8_t* q8, int64_t KB, int64_t n) {
  const uint8_t* panel = q8 + (n / kLanes) * KB * mse::kQ8Bytes;
  const int64_t lane = n % kLanes;
  float acc = 0.0f;
  for (int64_t kb = 0; kb < KB; ++kb) {
    const uint8_t* blk = panel + kb * mse::kQ8Bytes;
    float d;
    std::memcpy(&d, blk + lane * 4, 4);
    for (int64_t kk = 0; kk < mse::kQBlock; ++kk) {
      const float w = d * (float)(int8_t)blk[64 + kk * kLanes + lane];
      acc = std::fma(a[kb * mse::kQBlock + kk], w, acc);
    }
  }
  return acc;
}

// Column n's logit exactly as the fp32 kernel computes it (compute.cc: acc = fma(a_k, w[k, n], acc) for k ascending
// from acc = 0) from f32 panels [np, K, 16].
float exact_logit_f32(const float* a, const float* wf, int64_t K, int64_t n) {
  const float* col = wf + (n / kLanes) * K * kLanes + n % kLanes;
  float acc = 0.0f;
  for (int64_t k = 0; k < K; ++k) acc = std::fma(a[k], col[k * kLanes], acc);
  return acc;
}

// G >= ||a||_2 for a row of K fp32 activations: the squares are exact in fp64 and their sum and root err by far less
// than the 2^-40 margin; rounded up to fp32.
float l2_bound(const float* a, int64_t K) {
  double s = 0.0;
  for (int64_t k = 0; k < K; ++k) s += (double)a[k] * (double)a[k];
  return round_up_f32(std::sqrt(s) * (1.0 + 0x1p-40));
}

// Column n's logit exactly as the bf16 kernel computes it: that kernel itself (the path's linear_chunk, on this
// thread) on the one panel holding n, given the row's bf16 activation pairs b. Its pair order and VDPBF16PS's
// rounding are the path's own, and a column's value does not depend on the other columns or rows of a call.
float exact_logit_bf16(const uint32_t* b, const uint16_t* wb, int64_t K, int64_t n) {
  const int64_t K2 = (K + 1) / 2;
  float y[kLanes];
  mse::LinearJob job{};
  job.M = 1, job.K = K, job.N = kLanes, job.np = 1, job.chunk = 1, job.nchunks = 1;
  job.wb = wb + (n / kLanes) * K2 * 2 * kLanes, job.xq = b, job.K2 = K2, job.y = y, job.fmt = mse::kBf16;
  mse::isa().linear_chunk(job, 0);
  return y[n % kLanes];
}

using ApproxChunk = void (*)(const mse::ApproxQ8Job&, int64_t);
using CandidateScan = int64_t (*)(const float*, const float*, int64_t, float, float, int32_t*, int64_t);

struct ArgmaxJob {
  int64_t K, KB, N, ldo;
  const float* act;       // [Mp, K]
  const float* approx;    // [Mp, ldo]
  const float* colabs;    // [N]
  const uint8_t* q8;      // the Q8 head's panels, or
  const float* wf;        // a dense head's f32 panels [np, K, 16], or
  const uint16_t* wb;     // its bf16 panels [np, K2, 32]
  const float* dnorm;     // a dense head's copy error per column [N] (null: none, or all zero)
  const float* wnorm;     // a bf16 head's column norms ||w_n||_2 [N] (null otherwise)
  RowPlan* plans;         // [Mp]
  int32_t* cand;          // [Mp, kMaxCandidates]
  CandidateScan scan;     // the path's scan, or the portable one
};

// The portable approximation and scan, for paths without fast blocks (compute.cc has those): the same sums in
// another order (the int32 block sums are exact; one fma per block, as there), so the same bound holds. The product
// takes the greedy head only where the fast one runs (MseArgmaxQ8Fast); tests run this one on every machine.
void approx_portable(const mse::ApproxQ8Job& c, int64_t item) {
  const int64_t p0 = item * c.chunk, p1 = std::min(c.np, p0 + c.chunk), KB = c.K / mse::kQBlock, ldo = c.np * kLanes;
  for (int64_t p = p0; p < p1; ++p)
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t j = 0; j < kLanes; ++j) {
        float f = 0.0f;
        for (int64_t kb = 0; kb < KB; ++kb) {
          const uint8_t* blk = c.w + (p * KB + kb) * mse::kQ8Bytes;
          const int16_t* xk = c.xq + i * c.K + kb * mse::kQBlock;
          int32_t acc = 0;
          for (int64_t k = 0; k < mse::kQBlock; ++k)
            acc += (int32_t)xk[k] * (int32_t)(int8_t)blk[64 + (k / 2) * 32 + 2 * j + (k % 2)];
          float d;
          std::memcpy(&d, blk + j * 4, 4);
          f = std::fma(d, (float)acc, f);
        }
        c.out[i * ldo + p * kLanes + j] = f;
      }
}

int64_t candidates_portable(const float* out, const float* colabs, int64_t N, float s, float F, int32_t* cand,
                            int64_t cap) {
  float top = -std::numeric_limits<float>::infinity(), mag = 0.0f;
  for (int64_t n = 0; n < N; ++n) {
    const float L = s * out[n], B = F * colabs[n];
    top = std::max(top, L - B);
    mag = std::max(mag, std::fabs(L) + B);
  }
  const float thr = mse::approx_threshold(top, mag);
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) {
    const float L = s * out[n], B = F * colabs[n];
    if (L + B >= thr) {
      if (count == cap) return cap + 1;
      cand[count++] = (int32_t)n;
    }
  }
  return count;
}

struct ApproxCall {  // a job and the blocks that compute it (chosen once per call)
  mse::ApproxQ8Job job;
  ApproxChunk chunk;
};

void approx_item(const void* ctx, int64_t item) {
  const ApproxCall& call = *static_cast<const ApproxCall*>(ctx);
  call.chunk(call.job, item);
}

// Step 2 for M rows into out [M, 16 np] on the kernel pool, by the path's blocks where they run (else the portable
// loops); and the scan that finds a row's candidates on this path.
void approximate(int64_t M, int64_t K, int64_t np, const int16_t* xq, const uint8_t* pairs, float* out) {
  const mse::ApproxChunkFn chunk = mse::approx_q8_chunk();
  const ApproxCall call{{M, K, np, kChunkPanels, (np + kChunkPanels - 1) / kChunkPanels, xq, pairs, out},
                        chunk ? chunk : approx_portable};
  mse::parallel_for(call.job.nchunks, approx_item, &call);
}

CandidateScan candidate_scan() {
  return mse::isa().approx_q8_candidates ? mse::isa().approx_q8_candidates : candidates_portable;
}

// Steps 3-4 for row r: its candidates, then the largest exact logit among them (lowest index among equals).
void pick_item(const void* ctx, int64_t r) {
  const ArgmaxJob& job = *static_cast<const ArgmaxJob*>(ctx);
  RowPlan& plan = job.plans[r];
  if (plan.fallback) return;
  int32_t* cand = job.cand + r * kMaxCandidates;
  const float* a = job.act + r * job.K;
  const float* colabs = job.colabs;
  float F = plan.F;
  thread_local std::vector<uint32_t> b;  // a bf16 head's activations as its kernel multiplies them (pairs)
  float Gb = 0.0f, c = 0.0f;
  if (job.wb) {
    const int64_t K2 = (job.K + 1) / 2;
    b.resize((size_t)K2);
    mse::pack_bf16_activations(a, 1, job.K, b.data(), K2);
    double d2 = 0.0;
    for (int64_t k = 0; k < job.K; ++k) {
      const uint32_t bits = (b[(size_t)(k / 2)] >> (16 * (k % 2))) << 16;
      float v;
      std::memcpy(&v, &bits, 4);
      if (!std::isfinite(v)) {  // rounded past FLT_MAX: the exact kernel's whole row
        plan.fallback = true;
        return;
      }
      d2 += ((double)v - (double)a[k]) * ((double)v - (double)a[k]);  // exact differences, squares in fp64
    }
    Gb = round_up_f32(std::sqrt(d2) * (1.0 + 0x1p-40));
    c = (float)job.K * 0x1p-126f;  // VDPBF16PS flushes a subnormal partial sum: at most 2^-126 per step
  }
  if (job.dnorm || job.wnorm) {  // B[n] = F W1[n] + G dnorm[n] (+ Gb wnorm[n] + c), rounded up (<= five roundings
    thread_local std::vector<float> bound;  // of < 2^-24 each, under the 2^-20)
    bound.resize((size_t)job.N);
    const float G = l2_bound(a, job.K), up = 1.0f + 0x1p-20f;
    for (int64_t n = 0; n < job.N; ++n) {
      float v = F * job.colabs[n] + (job.dnorm ? G * job.dnorm[n] : 0.0f);
      if (job.wnorm) v += Gb * job.wnorm[n] + c;
      bound[(size_t)n] = v * up;
    }
    colabs = bound.data(), F = 1.0f;  // the scan's B = F colabs[n] is then bound[n] exactly
  }
  const int64_t count = job.scan(job.approx + r * job.ldo, colabs, job.N, plan.s, F, cand, kMaxCandidates);
  if (count < 1 || count > kMaxCandidates) {
    plan.fallback = true;
    return;
  }
  auto exact = [&](int64_t n) {
    if (job.wb) return exact_logit_bf16(b.data(), job.wb, job.K, n);
    return job.wf ? exact_logit_f32(a, job.wf, job.K, n) : exact_logit(a, job.q8, job.KB, n);
  };
  float best = exact(cand[0]);
  int32_t at = cand[0];
  for (int64_t c = 1; c < count; ++c) {
    const float v = exact(cand[c]);
    if (v > best) best = v, at = cand[c];  // finite: a row with a non-finite activation fell back
  }
  plan.token = at;
  g_candidates.fetch_add(count, std::memory_order_relaxed);
}

// np.argmax's rule on one row of logits: the first NaN, else the first of equal maxima.
int32_t first_argmax(const float* y, int64_t N) {
  int64_t at = 0;
  for (int64_t n = 0; n < N; ++n) {
    if (y[n] != y[n]) return (int32_t)n;
    if (y[n] > y[at]) at = n;
  }
  return (int32_t)at;
}

bool is(const char* dtype, const char* want) { return std::strcmp(dtype, want) == 0; }

int argmax_q8(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, mse::WeightFormat fmt,
              bool with_norm, bool with_rows) {
  // x, exact panels (q8, f32 or bf16), pair panels, colabs, [dnorm (f32, bf16)], [wnorm (bf16)], [norm, eps],
  // [rows], token
  const bool dense = fmt != mse::kQ8, half = fmt == mse::kBf16;
  const int di = dense ? 4 : -1, wi = half ? 5 : -1, ni = 4 + dense + half;  // dnorm, wnorm and norm, if any
  const int ri = with_norm ? ni + 2 : ni;  // rows, if any
  if (nparam != ri + (with_rows ? 2 : 1)) return 1;
  const int ti = nparam - 1;
  if (ndims[0] < 2 || ndims[1] != 3 || ndims[2] != 3 || ndims[3] != 1 || ndims[ti] != ndims[0] - 1 ||
      (dense && ndims[di] != 1) || (half && ndims[wi] != 1) ||
      (with_norm && (ndims[ni] != 1 || ndims[ni + 1] != 1)))
    return 2;
  const char* exact_dtype = fmt == mse::kQ8 ? "uint8" : half ? "int16" : "float32";
  if (!is(dtypes[0], "float32") || !is(dtypes[1], exact_dtype) || !is(dtypes[2], "uint8") ||
      !is(dtypes[3], "float32") || (dense && !is(dtypes[di], "float32")) || (half && !is(dtypes[wi], "float32")) ||
      (with_norm && (!is(dtypes[ni], "float32") || !is(dtypes[ni + 1], "float32"))) || !is(dtypes[ti], "int32") ||
      (with_rows && !is(dtypes[ri], "int32")))
    return 3;
  int64_t M = 1;
  for (int a = 0; a + 1 < ndims[0]; ++a) {
    M *= shapes[0][a];
    if (shapes[ti][a] != shapes[0][a] || (with_rows && (ndims[ri] != ndims[0] - 1 || shapes[ri][a] != shapes[0][a])))
      return 4;
  }
  const int64_t K = shapes[0][ndims[0] - 1], N = shapes[3][0], np = (N + kLanes - 1) / kLanes, KB = K / mse::kQBlock;
  if (K % mse::kQBlock || N < 1) return 5;
  if (shapes[2][0] != np || shapes[2][1] != KB || shapes[2][2] != mse::kQ8Bytes) return 5;
  const int64_t rows1 = fmt == mse::kQ8 ? KB : half ? (K + 1) / 2 : K;
  const int64_t width1 = fmt == mse::kQ8 ? mse::kQ8Bytes : half ? 2 * kLanes : kLanes;
  if (shapes[1][0] != np || shapes[1][1] != rows1 || shapes[1][2] != width1 || (dense && shapes[di][0] != N) ||
      (half && shapes[wi][0] != N))
    return 5;
  if (with_norm && (shapes[ni][0] != K || shapes[ni + 1][0] != 1)) return 6;

  const float* x = static_cast<const float*>(params[0]);
  const uint8_t* q8 = fmt == mse::kQ8 ? static_cast<const uint8_t*>(params[1]) : nullptr;
  const float* wf = fmt == mse::kF32 ? static_cast<const float*>(params[1]) : nullptr;
  const uint16_t* wb = half ? static_cast<const uint16_t*>(params[1]) : nullptr;
  const float* dnorm = dense ? static_cast<const float*>(params[di]) : nullptr;
  if (dnorm && std::all_of(dnorm, dnorm + N, [](float v) { return v == 0.0f; })) dnorm = nullptr;  // Q8 values
  const float* wnorm = half ? static_cast<const float*>(params[wi]) : nullptr;
  const float* norm = with_norm ? static_cast<const float*>(params[ni]) : nullptr;
  const float eps = with_norm ? *static_cast<const float*>(params[ni + 1]) : 0.0f;
  const int32_t* flags = with_rows ? static_cast<const int32_t*>(params[ri]) : nullptr;
  int32_t* token = static_cast<int32_t*>(params[ti]);

  thread_local std::vector<int64_t> picked;
  thread_local std::vector<float> xs, act, approx, row;
  thread_local std::vector<int16_t> xq;
  thread_local std::vector<RowPlan> plans;
  thread_local std::vector<int32_t> cand;
  picked.clear();
  for (int64_t m = 0; m < M; ++m)
    if (!flags || flags[m]) picked.push_back(m);
  const int64_t Mp = (int64_t)picked.size();
  std::fill(token, token + M, 0);
  if (Mp == 0) return 0;
  xs.resize((size_t)(Mp * K));
  for (int64_t i = 0; i < Mp; ++i) std::memcpy(xs.data() + i * K, x + picked[(size_t)i] * K, (size_t)K * 4);
  const float* a = xs.data();  // the head's activations: x, or its RMSNorm as the exact kernel computes it
  if (with_norm) {
    act.resize((size_t)(Mp * K));
    mse::isa().rmsnorm_rows(xs.data(), Mp, K, norm, eps, act.data());
    a = act.data();
  }
  xq.resize((size_t)(Mp * K));
  plans.assign((size_t)Mp, RowPlan{});
  for (int64_t i = 0; i < Mp; ++i) plans[(size_t)i] = quantize(a + i * K, K, xq.data() + i * K);

  const int64_t ldo = np * kLanes;
  approx.resize((size_t)(Mp * ldo));
  approximate(Mp, K, np, xq.data(), static_cast<const uint8_t*>(params[2]), approx.data());
  cand.resize((size_t)(Mp * kMaxCandidates));
  ArgmaxJob pick{K, KB, N, ldo, a, approx.data(), static_cast<const float*>(params[3]), q8, wf, wb, dnorm,
                 wnorm, plans.data(), cand.data(), candidate_scan()};
  mse::parallel_for(Mp, pick_item, &pick);

  int64_t fallbacks = 0;
  for (int64_t i = 0; i < Mp; ++i) {
    RowPlan& plan = plans[(size_t)i];
    if (plan.fallback) {  // the exact kernel on this row, np.argmax's rule on its logits
      row.resize((size_t)N);
      mse::linear_forward({fmt, with_norm ? mse::kNorm : mse::kNone, 1, K, N,
                           xs.data() + i * K, params[1], nullptr, norm, eps, nullptr, row.data()});
      plan.token = first_argmax(row.data(), N);
      ++fallbacks;
    }
    token[picked[(size_t)i]] = plan.token;
  }
  g_rows.fetch_add(Mp, std::memory_order_relaxed);
  g_fallbacks.fetch_add(fallbacks, std::memory_order_relaxed);
  return 0;
}

}  // namespace

extern "C" {

// One entry point per (exact weights, norm inside, rows): Q8 panels, or a dense head's f32 or bf16 panels (module
// comment).
#define MSE_ARGMAX_ENTRY(NAME, FMT, NORM, ROWS)                                                           \
  int NAME(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, void*, void*) { \
    return argmax_q8(nparam, params, ndims, shapes, dtypes, FMT, NORM, ROWS);                            \
  }

MSE_ARGMAX_ENTRY(MseTiedArgmaxQ8, mse::kQ8, true, false)
MSE_ARGMAX_ENTRY(MseTiedArgmaxQ8Rows, mse::kQ8, true, true)
MSE_ARGMAX_ENTRY(MseArgmaxQ8, mse::kQ8, false, false)
MSE_ARGMAX_ENTRY(MseArgmaxQ8Rows, mse::kQ8, false, true)
MSE_ARGMAX_ENTRY(MseTiedArgmaxF32, mse::kF32, true, false)
MSE_ARGMAX_ENTRY(MseTiedArgmaxF32Rows, mse::kF32, true, true)
MSE_ARGMAX_ENTRY(MseArgmaxF32, mse::kF32, false, false)
MSE_ARGMAX_ENTRY(MseArgmaxF32Rows, mse::kF32, false, true)
MSE_ARGMAX_ENTRY(MseTiedArgmaxBf16, mse::kBf16, true, false)
MSE_ARGMAX_ENTRY(MseTiedArgmaxBf16Rows, mse::kBf16, true, true)
MSE_ARGMAX_ENTRY(MseArgmaxBf16, mse::kBf16, false, false)
MSE_ARGMAX_ENTRY(MseArgmaxBf16Rows, mse::kBf16, false, true)

// Rows computed, candidates summed over the rows that took the bound, and rows that fell back to the exact kernel,
// since the last reset (reset = 1 zeroes them after reading): out[0..2].
void MseArgmaxQ8Stats(int64_t* out, int reset) {
  out[0] = reset ? g_rows.exchange(0) : g_rows.load();
  out[1] = reset ? g_candidates.exchange(0) : g_candidates.load();
  out[2] = reset ? g_fallbacks.exchange(0) : g_fallbacks.load();
}

// Step 2 and the scan alone, for the self-test (selftest.cc): the approximate logits out [M, 16 np] of M rows of
// int16 activations xq [M, K] against pair panels [np, K/32, 576], and each row's candidates (s = 1, the given F;
// cand [M, 64], counts [M], a count of 65 meaning "more than 64"), by the blocks and scan the argmax kernel uses on
// the path in use. Every path must give the same bits (its blocks, or the portable loops where none run).
void MseApproxQ8Check(int64_t M, int64_t K, int64_t N, const int16_t* xq, const uint8_t* pairs, const float* colabs,
                      float F, float* out, int32_t* cand, int64_t* counts) {
  const int64_t np = (N + kLanes - 1) / kLanes, ldo = np * kLanes;
  approximate(M, K, np, xq, pairs, out);
  const CandidateScan scan = candidate_scan();
  for (int64_t i = 0; i < M; ++i) counts[i] = scan(out + i * ldo, colabs, N, 1.0f, F, cand + i * kMaxCandidates,
                                                   kMaxCandidates);
}

}  // extern "C"
