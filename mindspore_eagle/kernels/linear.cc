// Batch-invariant small-M linear kernels for x86-64 CPUs with AVX-512: y[M, N] = x[M, K] @ W (+ bias).
//
// Why this exists: MindSpore's CPU MatMul is bandwidth-efficient at one row but slow at 8-64 rows, which is
// what tree verification, batched data generation and draft growth run. These kernels stream the weight once
// per call for any M <= a few hundred and keep the FMA units busy from M = 4 on.
//
// Batch invariance (the property speculation needs): every output element y[i, n] is computed by the same
// sequence of operations whatever M is, however rows are blocked and whichever thread runs it:
//     fp32:  acc = 0; for k = 0 .. K-1: acc = fma(x[i, k], W[k, n], acc);  y = acc (+ bias[n])
//     bf16:  acc = 0; for p = 0 .. ceil(K/2)-1: acc = dpbf16(acc, (x[i,2p], x[i,2p+1]), (W[2p,n], W[2p+1,n]))
// i.e. a strictly sequential reduction along K, one accumulator lane per output element. Row blocking (RM),
// column blocking (RN) and the split of columns between threads change only *which register* holds a lane,
// never the order of its additions; nothing splits K into separately summed parts (K slabs, below, only pause
// the sequential sum). So row i of an M = 64 call is bit-identical to the same row computed alone.
//
// Weight layouts (the caller packs once, at load time; see kernels/layout.py):
//     fp32 "panels":  P[np, K, 16]   P[p, k, j] = W[k, 16p + j]           (zero where 16p + j >= N)
//     bf16 "panels":  Q[np, K2, 32]  Q[p, q, 2j + t] = bf16(W[2q + t, 16p + j])   (zero-padded in K and N)
// with np = ceil(N / 16) and K2 = ceil(K / 2); bf16 values are stored as uint16 bit patterns (round to nearest
// even). A panel is contiguous, so each thread streams whole panels. The same panel format serves weights
// stored [in, out] and the tied LM head's [vocab, hidden] table (packing does the transpose).
//
// dpbf16 is the AVX512-BF16 instruction VDPBF16PS: per fp32 lane, acc = (acc + x[2p+1] W[2p+1]) + x[2p] W[2p],
// the bf16 x bf16 products exact, each addition rounded to fp32 (Intel's definition; checked bit for bit on the
// AMD Zen 5 development machines, 3.2 M random lanes). Activations are rounded to bf16 (nearest even) in the
// kernel; the output is fp32.
//
// Entry points follow MindSpore's AOT Custom op ABI (inputs, then outputs, in params):
//     MseLinearF32       (x f32 [M, K], P f32 [np, K, 16])                 -> y f32 [M, N]
//     MseLinearF32Bias   (x, P, bias f32 [N])                              -> y
//     MseLinearBf16      (x f32 [M, K], Q int16 [np, K2, 32])              -> y f32 [M, N]
//     MseLinearBf16Bias  (x, Q, bias f32 [N])                              -> y
// N is read from the output shape. MseKernelFeatures() reports what the processor supports (for the loader);
// MseKernelStats() the calls and wall time spent in the entry points (for benchmarks).
//
// Threading: MindSpore calls an AOT kernel on one thread. The library can run its own small pool (the caller
// plus MSE_KERNEL_THREADS - 1 workers, at most 8) that takes column chunks from a shared counter; which thread
// computes a column never changes its value. Default: 1 thread. Measured on the 2-vCPU development machines
// (shared with other jobs; MindSpore's own KernelThread also spins on the second core), a second kernel thread
// made every shape slower, because the caller must wait for a chunk whose worker was preempted. Set
// MSE_KERNEL_THREADS=2 on a dedicated machine, where the compute-bound shapes (M >= 16) can gain from it.

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "kernels.h"
#include "vmath.h"

namespace {

constexpr int kLanes = 16;   // fp32 lanes per zmm register = output columns per panel
constexpr int kMaxRM = 4;    // rows per register block
constexpr int kMaxRN = 8;    // panels per register block
// With several row blocks (4 < M <= 16), K is processed in slabs of kSlab panel rows (64 B each): the chunk's
// slab (<= 8 panels x 2 KB) stays in L1 while every row block uses it and the next slab is prefetched
// meanwhile, so streaming the weight from DRAM overlaps the arithmetic of all row blocks. Between slabs the
// partial sums wait in y (fp32, exactly the accumulator's value), so slabbing changes no addition's order and
// may depend on M. Measured (one core): slabs help M = 8-16 by 5-10%, cost 5-15% at M = 1-4 and M >= 32.
constexpr int64_t kSlab = 32;
constexpr int64_t kPrefetchRows = 16;  // prefetch distance along K without slabs

int64_t slab_for_rows(int64_t M, int64_t depth) { return M > kMaxRM && M <= 16 ? kSlab : depth; }

// ---------------------------------------------------------------------------------------------------------
// Register-blocked micro-kernels: RM rows x RN panels of accumulators, sequential over k in [k0, k1).

inline __mmask16 lane_mask(int64_t valid) {
  return valid >= kLanes ? (__mmask16)0xFFFF : (__mmask16)((1u << valid) - 1u);
}

// Start value of a panel's accumulator: zero on the first slab, else the partial sum left in y.
MSE_AVX512 inline __m512 load_partial(const float* y, bool first, __mmask16 m) {
  return first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m, y);
}

// End of a slab: store the partial sum, or on the last slab the result: (acc + bias), then residual + that,
// masked to the valid columns. bias and res are null except on the last slab.
MSE_AVX512 inline void store_partial(float* y, const float* bias, const float* res, __mmask16 m, __m512 acc) {
  if (bias) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(m, bias));
  if (res) acc = _mm512_add_ps(_mm512_maskz_loadu_ps(m, res), acc);
  _mm512_mask_storeu_ps(y, m, acc);
}

// fp32: x rows at x + i * ldx; panel p of the block at w + p * K * 16; pf: prefetch distance in rows. y, bias
// and res (the residual, row stride ldy) point at the block's first column (bias and res only on the last
// slab); valid: columns left from there.
template <int RM, int RN>
MSE_AVX512 void block_f32(const float* x, int64_t ldx, const float* w, int64_t K, int64_t k0, int64_t k1,
                          int64_t pf, float* y, int64_t ldy, const float* bias, const float* res, bool first,
                          int64_t valid) {
  __m512 acc[RM][RN];
  __mmask16 mask[RN];
  for (int j = 0; j < RN; ++j) mask[j] = lane_mask(valid - j * kLanes);
  for (int i = 0; i < RM; ++i)
    for (int j = 0; j < RN; ++j) acc[i][j] = load_partial(y + i * ldy + j * kLanes, first, mask[j]);
  const int64_t pstride = K * kLanes;
  for (int64_t k = k0; k < k1; ++k) {
    __m512 wv[RN];
    for (int j = 0; j < RN; ++j) {
      wv[j] = _mm512_loadu_ps(w + j * pstride + k * kLanes);
      _mm_prefetch((const char*)(w + j * pstride + (k + pf) * kLanes), _MM_HINT_T0);
    }
    for (int i = 0; i < RM; ++i) {
      const __m512 xb = _mm512_set1_ps(x[i * ldx + k]);
      for (int j = 0; j < RN; ++j) acc[i][j] = _mm512_fmadd_ps(xb, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < RM; ++i)
    for (int j = 0; j < RN; ++j)
      store_partial(y + i * ldy + j * kLanes, bias ? bias + j * kLanes : nullptr,
                    res ? res + i * ldy + j * kLanes : nullptr, mask[j], acc[i][j]);
}

// bf16: xq rows hold ceil(K/2) packed bf16 pairs (low half = even k); panel p at w + p * K2 * 32; [q0, q1) are
// pair indices.
template <int RM, int RN>
MSE_AVX512BF16 void block_bf16(const uint32_t* xq, int64_t ldx, const uint16_t* w, int64_t K2, int64_t q0,
                               int64_t q1, int64_t pf, float* y, int64_t ldy, const float* bias, const float* res,
                               bool first, int64_t valid) {
  __m512 acc[RM][RN];
  __mmask16 mask[RN];
  for (int j = 0; j < RN; ++j) mask[j] = lane_mask(valid - j * kLanes);
  for (int i = 0; i < RM; ++i)
    for (int j = 0; j < RN; ++j) acc[i][j] = load_partial(y + i * ldy + j * kLanes, first, mask[j]);
  const int64_t pstride = K2 * 2 * kLanes;
  for (int64_t q = q0; q < q1; ++q) {
    __m512bh wv[RN];
    for (int j = 0; j < RN; ++j) {
      wv[j] = (__m512bh)_mm512_loadu_si512(w + j * pstride + q * 2 * kLanes);
      _mm_prefetch((const char*)(w + j * pstride + (q + pf) * 2 * kLanes), _MM_HINT_T0);
    }
    for (int i = 0; i < RM; ++i) {
      const __m512bh xb = (__m512bh)_mm512_set1_epi32((int)xq[i * ldx + q]);
      for (int j = 0; j < RN; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xb, wv[j]);
    }
  }
  for (int i = 0; i < RM; ++i)
    for (int j = 0; j < RN; ++j)
      store_partial(y + i * ldy + j * kLanes, bias ? bias + j * kLanes : nullptr,
                    res ? res + i * ldy + j * kLanes : nullptr, mask[j], acc[i][j]);
}

// Dispatch tables over (RM, RN): index [RM - 1][RN - 1].
using BlockF32 = void (*)(const float*, int64_t, const float*, int64_t, int64_t, int64_t, int64_t, float*,
                          int64_t, const float*, const float*, bool, int64_t);
using BlockBf16 = void (*)(const uint32_t*, int64_t, const uint16_t*, int64_t, int64_t, int64_t, int64_t, float*,
                           int64_t, const float*, const float*, bool, int64_t);

template <int RM, int... RNs>
constexpr std::array<BlockF32, sizeof...(RNs)> row_f32(std::integer_sequence<int, RNs...>) {
  return {&block_f32<RM, RNs + 1>...};
}
template <int RM, int... RNs>
constexpr std::array<BlockBf16, sizeof...(RNs)> row_bf16(std::integer_sequence<int, RNs...>) {
  return {&block_bf16<RM, RNs + 1>...};
}

const std::array<std::array<BlockF32, kMaxRN>, kMaxRM> kF32 = {
    row_f32<1>(std::make_integer_sequence<int, kMaxRN>{}), row_f32<2>(std::make_integer_sequence<int, kMaxRN>{}),
    row_f32<3>(std::make_integer_sequence<int, kMaxRN>{}), row_f32<4>(std::make_integer_sequence<int, kMaxRN>{})};
const std::array<std::array<BlockBf16, kMaxRN>, kMaxRM> kBf16 = {
    row_bf16<1>(std::make_integer_sequence<int, kMaxRN>{}),
    row_bf16<2>(std::make_integer_sequence<int, kMaxRN>{}),
    row_bf16<3>(std::make_integer_sequence<int, kMaxRN>{}),
    row_bf16<4>(std::make_integer_sequence<int, kMaxRN>{})};

// Panels per register block for a row block of rm rows: RM * RN accumulators + RN weights + 1 broadcast
// must fit the 32 zmm registers.
constexpr int panels_for_rows(int rm) { return rm <= 2 ? 8 : 6; }

// ---------------------------------------------------------------------------------------------------------
// One call = one Job: columns are cut into chunks of whole panels; a thread that claims a chunk runs every row
// block of it (the chunk's weights stay in L2 across row blocks).

struct Job {
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

// Computes chunk `item` into `out` (row 0, first column of the chunk; row stride ldo): y itself, or a worker's
// private buffer.
void run_chunk(const Job& c, int64_t item, float* out, int64_t ldo) {
  const int64_t p0 = item * c.chunk, p1 = std::min(c.np, p0 + c.chunk);
  const int64_t depth = c.bf16 ? c.K2 : c.K;  // reduction steps: pairs (bf16) or rows (fp32)
  const int64_t slab = slab_for_rows(c.M, depth), pf = slab < depth ? slab : kPrefetchRows;
  for (int64_t k0 = 0; k0 < depth; k0 += slab) {
    const int64_t k1 = std::min(depth, k0 + slab);
    const bool first = k0 == 0;
    const bool last = k1 == depth;
    for (int64_t m0 = 0; m0 < c.M; m0 += kMaxRM) {
      const int rm = (int)std::min<int64_t>(kMaxRM, c.M - m0);
      const int rn_max = panels_for_rows(rm);
      for (int64_t p = p0; p < p1; p += rn_max) {
        const int rn = (int)std::min<int64_t>(rn_max, p1 - p);
        const int64_t n0 = p * kLanes;
        float* y = out + m0 * ldo + (p - p0) * kLanes;
        const float* bias = last && c.bias ? c.bias + n0 : nullptr;
        const float* res = last && c.res ? c.res + m0 * c.N + n0 : nullptr;  // ldo == N (run_chunk_into_y)
        if (c.bf16) {
          kBf16[rm - 1][rn - 1](c.xq + m0 * c.K2, c.K2, c.wb + p * c.K2 * 2 * kLanes, c.K2, k0, k1, pf, y, ldo,
                                bias, res, first, c.N - n0);
        } else {
          kF32[rm - 1][rn - 1](c.x + m0 * c.K, c.K, c.wf + p * c.K * kLanes, c.K, k0, k1, pf, y, ldo, bias, res,
                               first, c.N - n0);
        }
      }
    }
  }
}

void run_chunk_into_y(const Job& c, int64_t item) { run_chunk(c, item, c.y + item * c.chunk * kLanes, c.N); }

// ---------------------------------------------------------------------------------------------------------
// A tiny persistent thread pool. The caller posts a job and works on it too; workers spin briefly, then sleep
// on a futex. Chunks are claimed from one atomic word tagged with the job's epoch,
//     state = epoch << 40 | nchunks << 20 | next,
// so a worker that wakes late (preempted by another process on a shared machine) finds the job finished or
// replaced and claims nothing: the caller never waits for a thread that has not started, only for chunks
// already claimed. It does wait for those: a worker must not touch the call's buffers after it returned.
// (Taking a claimed chunk over from a preempted worker would need every buffer it reads to outlive the call;
// tried, and a late worker read a freed weight.)

long futex(std::atomic<uint32_t>* addr, int op, uint32_t val) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, nullptr, nullptr, 0);
}

class Pool {
 public:
  static constexpr int64_t kMaxChunks = (1 << 20) - 1;

  static Pool& get() {
    static Pool* pool = new Pool();  // never destroyed: detached workers outlive static destructors
    return *pool;
  }

  int threads() const { return (int)workers_.size() + 1; }

  std::atomic<int64_t> worker_chunks{0};  // chunks computed by workers since the pool started

  // Runs every chunk of `job` and returns when all are done. A concurrent or re-entrant call runs its job on
  // the calling thread alone (same results: a column's value does not depend on who computes it).
  void run(const Job& job) {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock() || workers_.empty() || job.nchunks < 2) {
      for (int64_t i = 0; i < job.nchunks; ++i) run_chunk_into_y(job, i);
      return;
    }
    job_ = job;
    done_.store(0, std::memory_order_relaxed);
    const uint64_t epoch = ++epoch_count_ & kEpochMask;
    state_.store(epoch << 40 | (uint64_t)job.nchunks << 20, std::memory_order_release);
    wake_.fetch_add(1, std::memory_order_release);
    if (sleepers_.load(std::memory_order_acquire) > 0) futex(&wake_, FUTEX_WAKE_PRIVATE, INT32_MAX);
    work(epoch, false);
    while (done_.load(std::memory_order_acquire) != job.nchunks) _mm_pause();
  }

 private:
  static constexpr uint64_t kEpochMask = (1ull << 24) - 1;
  static constexpr uint64_t kField = (1ull << 20) - 1;
  // A worker spins this long after its last job before sleeping: long enough to bridge the small MindSpore ops
  // between two Linears of a layer, short enough not to steal a shared core for long.
  static constexpr auto kSpin = std::chrono::microseconds(100);

  Pool() {
    int n = 1;
    if (const char* env = std::getenv("MSE_KERNEL_THREADS")) n = std::atoi(env);
    n = std::max(1, std::min(n, 8));
    for (int t = 1; t < n; ++t) workers_.emplace_back([this] { loop(); });
    for (auto& w : workers_) w.detach();
  }

  // Claims and runs chunks of job `epoch` until none is left or the job is no longer current.
  void work(uint64_t epoch, bool worker) {
    uint64_t s = state_.load(std::memory_order_acquire);
    for (;;) {
      if ((s >> 40) != epoch || (s & kField) >= ((s >> 20) & kField)) return;
      if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      run_chunk_into_y(job_, (int64_t)(s & kField));  // job_ is stable: the caller waits for this chunk
      if (worker) worker_chunks.fetch_add(1, std::memory_order_relaxed);
      done_.fetch_add(1, std::memory_order_release);
      s = state_.load(std::memory_order_acquire);
    }
  }

  void loop() {
    uint32_t seen = 0;  // the value at construction: a job posted before this thread starts is not missed
    for (;;) {
      uint32_t now;
      auto until = std::chrono::steady_clock::now() + kSpin;
      for (int spins = 0; (now = wake_.load(std::memory_order_acquire)) == seen; ++spins) {
        _mm_pause();
        if ((spins & 255) != 255 || std::chrono::steady_clock::now() < until) continue;
        sleepers_.fetch_add(1, std::memory_order_acq_rel);  // a locked RMW on x86: a full barrier
        if (wake_.load(std::memory_order_acquire) == seen) futex(&wake_, FUTEX_WAIT_PRIVATE, seen);
        sleepers_.fetch_sub(1, std::memory_order_acq_rel);
        until = std::chrono::steady_clock::now() + kSpin;
      }
      seen = now;
      work(state_.load(std::memory_order_acquire) >> 40, true);
    }
  }

  std::mutex mu_;
  std::vector<std::thread> workers_;
  Job job_{};
  uint64_t epoch_count_ = 0;
  std::atomic<uint64_t> state_{0};
  std::atomic<int64_t> done_{0};
  std::atomic<uint32_t> wake_{0};
  std::atomic<int> sleepers_{0};
};

// Panels per work item: one full register block for the call's row blocks (6 panels when M >= 3, else 8), so
// no chunk is cut into narrow, latency-bound blocks; threads balance by claiming many small items. Very wide
// outputs take a multiple, to stay within the pool's chunk table.
int64_t chunk_panels(int64_t M, int64_t np) {
  const int64_t block = panels_for_rows((int)std::min<int64_t>(M, kMaxRM));
  const int64_t blocks = (np + block - 1) / block;
  return block * ((blocks + Pool::kMaxChunks - 1) / Pool::kMaxChunks);
}

// Activations -> bf16 pairs (round to nearest even), zero-padded to an even K.
MSE_AVX512BF16 void pack_activations(const float* x, int64_t M, int64_t K, uint32_t* xq, int64_t K2) {
  for (int64_t i = 0; i < M; ++i) {
    const float* row = x + i * K;
    uint32_t* out = xq + i * K2;
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {  // 32 floats -> 16 pairs
      const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(row + k + 16), _mm512_loadu_ps(row + k));
      _mm512_storeu_si512(out + k / 2, (__m512i)b);
    }
    for (; k < K; k += 2) {
      const float lo = row[k], hi = k + 1 < K ? row[k + 1] : 0.0f;
      const __m128bh b = _mm_cvtne2ps_pbh(_mm_set_ss(hi), _mm_set_ss(lo));  // [lo, 0, 0, 0, hi, 0, 0, 0]
      const __m128i v = (__m128i)b;
      out[k / 2] = (uint32_t)(uint16_t)_mm_extract_epi16(v, 0) | ((uint32_t)(uint16_t)_mm_extract_epi16(v, 4) << 16);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Prologues: the activations a fused Linear multiplies, computed per row from its input (so they depend on that
// row alone, never on M). RMSNorm: a = (x * r) * w with r = 1 / sqrt(sum(x^2) / K + eps), the sum of squares
// an fma chain per lane (k mod 16) and then hsum's fixed tree. SwiGLU: the input is [gate | up] (2K wide) and
// a = silu(gate) * up.

using mse::kGlu;
using mse::kNone;
using mse::kNorm;
using mse::Prologue;

MSE_AVX512 void rmsnorm_rows(const float* x, int64_t M, int64_t K, const float* w, float eps, float* a) {
  for (int64_t i = 0; i < M; ++i) {
    const float* row = x + i * K;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += kLanes) {
      const __m512 v = _mm512_maskz_loadu_ps(lane_mask(K - k), row + k);
      acc = _mm512_fmadd_ps(v, v, acc);
    }
    const float r = 1.0f / std::sqrt(mse::hsum(acc) / (float)K + eps);
    const __m512 rv = _mm512_set1_ps(r);
    for (int64_t k = 0; k < K; k += kLanes) {
      const __mmask16 m = lane_mask(K - k);
      const __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + k), rv), _mm512_maskz_loadu_ps(m, w + k));
      _mm512_mask_storeu_ps(a + i * K + k, m, v);
    }
  }
}

MSE_AVX512 void swiglu_rows(const float* x, int64_t M, int64_t K, float* a) {
  for (int64_t i = 0; i < M; ++i) {
    const float* gate = x + i * 2 * K;
    const float* up = gate + K;
    for (int64_t k = 0; k < K; k += kLanes) {
      const __mmask16 m = lane_mask(K - k);
      const __m512 v = _mm512_mul_ps(mse::silu512(_mm512_maskz_loadu_ps(m, gate + k)), _mm512_maskz_loadu_ps(m, up + k));
      _mm512_mask_storeu_ps(a + i * K + k, m, v);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// One entry point per variant: (dtype, prologue, bias, residual). Inputs in this order, then the output y:
//     x f32 [..., Kx]                  Kx = K, or 2K for SwiGLU ([gate | up]); M = the product of the leading dims
//     W panels                         fp32 [np, K, 16] or bf16 bits int16 [np, ceil(K/2), 32]
//     bias f32 [N]                     if bias
//     norm weight f32 [K], eps f32 [1] if RMSNorm
//     residual f32 [..., N]            if residual: y = residual + (x W + bias); y f32 [..., N], x's leading dims
// Returns 0, or a nonzero code naming the first inconsistent argument (1 count, 2 rank, 3 dtype, 4-8 shape).

struct Variant {
  bool bf16;
  Prologue prologue;
  bool bias, residual;
};

bool is_f32(const char* dtype) { return std::strcmp(dtype, "float32") == 0; }

// Whether tensor i has the leading dims of x (tensor 0) and last dim n.
bool rows_like_x(int i, int64_t n, int* ndims, int64_t** shapes) {
  if (ndims[i] != ndims[0] || shapes[i][ndims[i] - 1] != n) return false;
  for (int a = 0; a + 1 < ndims[0]; ++a)
    if (shapes[i][a] != shapes[0][a]) return false;
  return true;
}

int linear(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, const Variant& v) {
  int next = 2;
  const int bias_i = v.bias ? next++ : -1;
  const int norm_i = v.prologue == kNorm ? next++ : -1;
  const int eps_i = v.prologue == kNorm ? next++ : -1;
  const int res_i = v.residual ? next++ : -1;
  if (nparam != next + 1) return 1;
  const int yi = nparam - 1;
  if (ndims[0] < 2 || ndims[1] != 3 || ndims[yi] != ndims[0]) return 2;
  if (!is_f32(dtypes[0]) || !is_f32(dtypes[yi]) || std::strcmp(dtypes[1], v.bf16 ? "int16" : "float32") != 0)
    return 3;
  int64_t M = 1;
  for (int a = 0; a + 1 < ndims[0]; ++a) M *= shapes[0][a];
  const int64_t Kx = shapes[0][ndims[0] - 1], N = shapes[yi][ndims[yi] - 1];
  if (v.prologue == kGlu && Kx % 2 != 0) return 4;
  const int64_t K = v.prologue == kGlu ? Kx / 2 : Kx, K2 = (K + 1) / 2;
  const int64_t np = (N + kLanes - 1) / kLanes;
  if (!rows_like_x(yi, N, ndims, shapes)) return 4;
  if (shapes[1][0] != np || shapes[1][1] != (v.bf16 ? K2 : K) || shapes[1][2] != (v.bf16 ? 2 : 1) * kLanes) return 5;
  if (bias_i >= 0 && (ndims[bias_i] != 1 || shapes[bias_i][0] != N || !is_f32(dtypes[bias_i]))) return 6;
  if (norm_i >= 0 && (ndims[norm_i] != 1 || shapes[norm_i][0] != K || !is_f32(dtypes[norm_i]) ||
                      ndims[eps_i] != 1 || shapes[eps_i][0] != 1 || !is_f32(dtypes[eps_i])))
    return 7;
  if (res_i >= 0 && (!rows_like_x(res_i, N, ndims, shapes) || !is_f32(dtypes[res_i]))) return 8;

  mse::linear_forward({v.bf16, v.prologue, M, K, N, static_cast<const float*>(params[0]), params[1],
                       bias_i >= 0 ? static_cast<const float*>(params[bias_i]) : nullptr,
                       norm_i >= 0 ? static_cast<const float*>(params[norm_i]) : nullptr,
                       eps_i >= 0 ? *static_cast<const float*>(params[eps_i]) : 0.0f,
                       res_i >= 0 ? static_cast<const float*>(params[res_i]) : nullptr, static_cast<float*>(params[yi])});
  return 0;
}

// Wall time spent inside linear_forward (for benchmarks: the linear share of a forward), and call count.
std::atomic<int64_t> g_calls{0}, g_nanos{0};

struct CallTimer {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  ~CallTimer() {
    g_calls.fetch_add(1, std::memory_order_relaxed);
    g_nanos.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
                          .count(), std::memory_order_relaxed);
  }
};

}  // namespace

void mse::linear_forward(const LinearCall& call) {
  CallTimer timer;
  const int64_t M = call.M, K = call.K, N = call.N, K2 = (K + 1) / 2;
  const float* a = call.x;
  thread_local std::vector<float> act;
  if (call.prologue != kNone) {
    act.resize((size_t)(M * K));
    if (call.prologue == kNorm)
      rmsnorm_rows(a, M, K, call.norm_w, call.eps, act.data());
    else
      swiglu_rows(a, M, K, act.data());
    a = act.data();
  }
  Job c{};
  c.M = M, c.K = K, c.N = N, c.np = (N + kLanes - 1) / kLanes;
  c.chunk = chunk_panels(M, c.np);
  c.nchunks = M > 0 ? (c.np + c.chunk - 1) / c.chunk : 0;
  c.bias = call.bias;
  c.res = call.res;
  c.y = call.y;
  thread_local std::vector<uint32_t> xq;
  if (call.bf16) {
    xq.resize((size_t)(M * K2));
    pack_activations(a, M, K, xq.data(), K2);
    c.wb = static_cast<const uint16_t*>(call.w);
    c.xq = xq.data(), c.K2 = K2;
    c.bf16 = true;
  } else {
    c.x = a;
    c.wf = static_cast<const float*>(call.w);
  }
  Pool::get().run(c);
}

extern "C" {

// Calls and seconds spent in linear_forward since the last reset (reset = 1 zeroes them after reading).
int64_t MseKernelStats(double* seconds, int reset) {
  const int64_t calls = reset ? g_calls.exchange(0) : g_calls.load();
  const int64_t nanos = reset ? g_nanos.exchange(0) : g_nanos.load();
  *seconds = (double)nanos * 1e-9;
  return calls;
}

// Bit 0: AVX-512 F/BW/VL/DQ + FMA (fp32 kernels); bit 1: AVX512-BF16 (bf16 kernels).
int MseKernelFeatures() {
  __builtin_cpu_init();
  const bool f32 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                   __builtin_cpu_supports("fma");
  const bool bf16 = f32 && __builtin_cpu_supports("avx512bf16");
  return (f32 ? 1 : 0) | (bf16 ? 2 : 0);
}

int MseKernelThreads() { return Pool::get().threads(); }

// Chunks computed by the pool's worker threads since it started.
int64_t MseKernelWorkerChunks() { return Pool::get().worker_chunks.load(); }

// MseLinear{F32,Bf16}[Norm|Glu][Bias][Res]: every variant of ``linear`` above.
#define MSE_LINEAR_ENTRY(NAME, BF16, PRO, BIAS, RES)                                                        \
  int NAME(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, void*, void*) {    \
    return linear(nparam, params, ndims, shapes, dtypes, Variant{BF16, PRO, BIAS, RES});                     \
  }
#define MSE_LINEAR_DTYPES(PRO_NAME, PRO, BIAS_NAME, BIAS, RES_NAME, RES)                    \
  MSE_LINEAR_ENTRY(MseLinearF32##PRO_NAME##BIAS_NAME##RES_NAME, false, PRO, BIAS, RES)     \
  MSE_LINEAR_ENTRY(MseLinearBf16##PRO_NAME##BIAS_NAME##RES_NAME, true, PRO, BIAS, RES)
#define MSE_LINEAR_RES(PRO_NAME, PRO, BIAS_NAME, BIAS)      \
  MSE_LINEAR_DTYPES(PRO_NAME, PRO, BIAS_NAME, BIAS, , false) \
  MSE_LINEAR_DTYPES(PRO_NAME, PRO, BIAS_NAME, BIAS, Res, true)
#define MSE_LINEAR_BIAS(PRO_NAME, PRO)        \
  MSE_LINEAR_RES(PRO_NAME, PRO, , false)      \
  MSE_LINEAR_RES(PRO_NAME, PRO, Bias, true)

MSE_LINEAR_BIAS(, kNone)
MSE_LINEAR_BIAS(Norm, kNorm)
MSE_LINEAR_BIAS(Glu, kGlu)

}  // extern "C"
