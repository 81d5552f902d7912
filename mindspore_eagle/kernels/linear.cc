// Batch-invariant small-M linear kernels: y[M, N] = x[M, K] @ W (+ bias); fp32, bf16 or GGUF-quantized (Q4_0,
// Q4_1, Q8_0) weights, fp32 sums.
//
// Why this exists: MindSpore's CPU MatMul is bandwidth-efficient at one row but slow at 8-64 rows, which is
// what tree verification, batched data generation and draft growth run. These kernels stream the weight once
// per call for any M <= a few hundred and keep the FMA units busy from M = 4 on.
//
// This file holds what does not depend on the instruction set: the argument checks of the AOT entry points,
// the prologues' dispatch, the rounding of activations to bf16, and the thread pool. The arithmetic (register
// blocks, RMSNorm, SwiGLU) is compute.cc, compiled once per path (AVX-512, AVX2, NEON, portable); its header
// states the batch invariance and why every path computes the same bits.
//
// Weight layouts (the caller packs once, at load time; see kernels/layout.py):
//     fp32 "panels":  P[np, K, 16]   P[p, k, j] = W[k, 16p + j]           (zero where 16p + j >= N)
//     bf16 "panels":  Q[np, K2, 32]  Q[p, q, 2j + t] = bf16(W[2q + t, 16p + j])   (zero-padded in K and N)
// with np = ceil(N / 16) and K2 = ceil(K / 2); bf16 values are stored as uint16 bit patterns (round to nearest
// even, subnormals flushed to zero). A panel is contiguous, so each thread streams whole panels.
//
// Entry points follow MindSpore's AOT Custom op ABI (inputs, then outputs, in params):
//     MseLinearF32       (x f32 [M, K], P f32 [np, K, 16])                 -> y f32 [M, N]
//     MseLinearF32Bias   (x, P, bias f32 [N])                              -> y
//     MseLinearBf16      (x f32 [M, K], Q int16 [np, K2, 32])              -> y f32 [M, N]
//     MseLinearBf16Bias  (x, Q, bias f32 [N])                              -> y
// N is read from the output shape. MseKernelStats() reports the calls and wall time spent in the entry points.
//
// Threading: MindSpore calls an AOT kernel on one thread. The library can run its own small pool (the caller
// plus MSE_KERNEL_THREADS - 1 workers, at most 8) that takes work items from a shared counter (column chunks
// here; attention's items through mse::parallel_for); which thread computes a column never changes its value. Default: one thread per CPU this process may run on (at most 8);
// MSE_KERNEL_THREADS overrides. Measured on an idle 2-vCPU AMD EPYC Zen 3 VM (teacher forward, native Q4_1, one
// process, side by side): 1 / 4 / 16 / 64 rows 20.5 / 42.9 / 98.7 / 248 ms with 1 thread, 12.9 / 27.6 / 64.6 /
// 137 ms with 2. (Earlier, on development machines shared with other jobs, a second thread was slower: the caller
// waited for chunks whose worker was preempted. On a loaded machine, set MSE_KERNEL_THREADS=1.)

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

#include "kernels.h"

namespace {

using Job = mse::LinearJob;
using mse::kGlu;
using mse::kNone;
using mse::kNorm;
using mse::Prologue;
constexpr int64_t kLanes = 16;  // output columns per panel

inline void cpu_relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// One piece of work the pool hands out: fn(ctx, item) for item in [0, n). ctx lives until run() returns.
struct Task {
  void (*fn)(const void* ctx, int64_t item);
  const void* ctx;
  int64_t n;
};

void linear_item(const void* ctx, int64_t item) { mse::isa().linear_chunk(*static_cast<const Job*>(ctx), item); }

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

  // Runs every item of `task` and returns when all are done. A concurrent or re-entrant call runs its task on
  // the calling thread alone (same results: an item's value does not depend on who computes it).
  void run(const Task& task) {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock() || workers_.empty() || task.n < 2 || task.n > kMaxChunks) {
      for (int64_t i = 0; i < task.n; ++i) task.fn(task.ctx, i);
      return;
    }
    job_ = task;
    done_.store(0, std::memory_order_relaxed);
    const uint64_t epoch = ++epoch_count_ & kEpochMask;
    state_.store(epoch << 40 | (uint64_t)task.n << 20, std::memory_order_release);
    wake_.fetch_add(1, std::memory_order_release);
    if (sleepers_.load(std::memory_order_acquire) > 0) futex(&wake_, FUTEX_WAKE_PRIVATE, INT32_MAX);
    work(epoch, false);
    while (done_.load(std::memory_order_acquire) != task.n) cpu_relax();
  }

 private:
  static constexpr uint64_t kEpochMask = (1ull << 24) - 1;
  static constexpr uint64_t kField = (1ull << 20) - 1;
  // A worker spins this long after its last job before sleeping: long enough to bridge the small MindSpore ops
  // between two Linears of a layer, short enough not to steal a shared core for long.
  static constexpr auto kSpin = std::chrono::microseconds(100);

  Pool() {
    int n = 1;
    cpu_set_t cpus;
    if (sched_getaffinity(0, sizeof(cpus), &cpus) == 0) n = CPU_COUNT(&cpus);  // the CPUs this process may use
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
      job_.fn(job_.ctx, (int64_t)(s & kField));  // job_ is stable: the caller waits for this item
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
        cpu_relax();
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
  Task job_{};
  uint64_t epoch_count_ = 0;
  std::atomic<uint64_t> state_{0};
  std::atomic<int64_t> done_{0};
  std::atomic<uint32_t> wake_{0};
  std::atomic<int> sleepers_{0};
};

// Panels per work item: one full register block for the call's row blocks, so no chunk is cut into narrow,
// latency-bound blocks; threads balance by claiming many small items. Very wide outputs take a multiple, to
// stay within the pool's chunk table.
int64_t chunk_panels(int64_t M, int64_t np) {
  const int64_t block = mse::isa().panels_for_rows((int)std::min<int64_t>(M, mse::kMaxRM));
  const int64_t blocks = (np + block - 1) / block;
  return block * ((blocks + Pool::kMaxChunks - 1) / Pool::kMaxChunks);
}

// ---------------------------------------------------------------------------------------------------------
// One entry point per variant: (dtype, prologue, bias, residual). Inputs in this order, then the output y:
//     x f32 [..., Kx]                  Kx = K, or 2K for SwiGLU ([gate | up]); M = the product of the leading dims
//     W panels                         fp32 [np, K, 16], bf16 bits int16 [np, ceil(K/2), 32], or the quantized
//                                      Q4 / Q8 blocks uint8 [np, K/32, 384 | 576] (kernels.h)
//     bias f32 [N]                     if bias
//     norm weight f32 [K], eps f32 [1] if RMSNorm
//     residual f32 [..., N]            if residual: y = residual + (x W + bias); y f32 [..., N], x's leading dims
//     rows int32 [...]                 if rows (x's leading dims): only the rows whose flag is nonzero are computed,
//                                      the others are NaN (an LM head whose caller reads some rows' logits: a
//                                      prompt chunk's last row, a tree's real rows; a row's value is the same as in
//                                      a call computing every row, the kernels' batch invariance)
// Returns 0, or a nonzero code naming the first inconsistent argument (1 count, 2 rank, 3 dtype, 4-9 shape).

struct Variant {
  mse::WeightFormat fmt;
  Prologue prologue;
  bool bias, residual, rows;
};

bool is_f32(const char* dtype) { return std::strcmp(dtype, "float32") == 0; }

// Whether tensor i has the leading dims of x (tensor 0) and last dim n.
bool rows_like_x(int i, int64_t n, int* ndims, int64_t** shapes) {
  if (ndims[i] != ndims[0] || shapes[i][ndims[i] - 1] != n) return false;
  for (int a = 0; a + 1 < ndims[0]; ++a)
    if (shapes[i][a] != shapes[0][a]) return false;
  return true;
}

// The rows variant: the flagged rows of x computed in one call of M' rows (in place when they are the first M' rows,
// as real rows before padding are; else gathered and scattered back); the other rows of y set to NaN so that a
// caller reading one sees it.
int selected_rows(const Variant& v, int64_t M, int64_t Kx, int64_t K, int64_t N, const void* x, const void* w,
                  const void* bias, const void* norm, const void* eps, const int32_t* flags, float* y) {
  thread_local std::vector<int64_t> picked;
  thread_local std::vector<float> xs, ys;
  picked.clear();
  for (int64_t m = 0; m < M; ++m)
    if (flags[m]) picked.push_back(m);
  const int64_t Mp = (int64_t)picked.size();
  const bool first_rows = Mp == 0 || picked.back() == Mp - 1;  // real rows before padding: no gather, no scatter
  const float* src = static_cast<const float*>(x);
  float* dst = y;
  if (!first_rows) {
    xs.resize((size_t)(Mp * Kx));
    ys.resize((size_t)(Mp * N));
    for (int64_t i = 0; i < Mp; ++i) std::memcpy(xs.data() + i * Kx, src + picked[(size_t)i] * Kx, (size_t)Kx * 4);
    src = xs.data(), dst = ys.data();
  }
  if (Mp > 0)
    mse::linear_forward({v.fmt, v.prologue, Mp, K, N, src, w, static_cast<const float*>(bias),
                         static_cast<const float*>(norm), eps ? *static_cast<const float*>(eps) : 0.0f, nullptr, dst});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  if (first_rows) {
    std::fill(y + Mp * N, y + M * N, nan);
    return 0;
  }
  for (int64_t m = 0, i = 0; m < M; ++m) {
    float* row = y + m * N;
    if (i < Mp && picked[(size_t)i] == m)
      std::memcpy(row, ys.data() + (i++) * N, (size_t)N * 4);
    else
      std::fill(row, row + N, nan);
  }
  return 0;
}

int linear(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, const Variant& v) {
  int next = 2;
  const int bias_i = v.bias ? next++ : -1;
  const int norm_i = v.prologue == kNorm ? next++ : -1;
  const int eps_i = v.prologue == kNorm ? next++ : -1;
  const int res_i = v.residual ? next++ : -1;
  const int rows_i = v.rows ? next++ : -1;
  if (nparam != next + 1) return 1;
  const int yi = nparam - 1;
  if (ndims[0] < 2 || ndims[1] != 3 || ndims[yi] != ndims[0]) return 2;
  mse::WeightFormat fmt;
  int64_t Kw, Nw;
  if (!is_f32(dtypes[0]) || !is_f32(dtypes[yi]) || !mse::packed_dims(ndims[1], shapes[1], dtypes[1], &fmt, &Kw, &Nw) ||
      fmt != v.fmt)
    return 3;
  int64_t M = 1;
  for (int a = 0; a + 1 < ndims[0]; ++a) M *= shapes[0][a];
  const int64_t Kx = shapes[0][ndims[0] - 1], N = shapes[yi][ndims[yi] - 1];
  if (v.prologue == kGlu && Kx % 2 != 0) return 4;
  const int64_t K = v.prologue == kGlu ? Kx / 2 : Kx, K2 = (K + 1) / 2;
  const int64_t np = (N + kLanes - 1) / kLanes;
  if (!rows_like_x(yi, N, ndims, shapes)) return 4;
  if (shapes[1][0] != np || Kw != (fmt == mse::kBf16 ? 2 * K2 : K) || ((fmt == mse::kQ4 || fmt == mse::kQ8) && K % 32))
    return 5;
  if (bias_i >= 0 && (ndims[bias_i] != 1 || shapes[bias_i][0] != N || !is_f32(dtypes[bias_i]))) return 6;
  if (norm_i >= 0 && (ndims[norm_i] != 1 || shapes[norm_i][0] != K || !is_f32(dtypes[norm_i]) ||
                      ndims[eps_i] != 1 || shapes[eps_i][0] != 1 || !is_f32(dtypes[eps_i])))
    return 7;
  if (res_i >= 0 && (!rows_like_x(res_i, N, ndims, shapes) || !is_f32(dtypes[res_i]))) return 8;
  if (rows_i >= 0) {
    if (ndims[rows_i] != ndims[0] - 1 || std::strcmp(dtypes[rows_i], "int32") != 0 || res_i >= 0) return 9;
    for (int a = 0; a + 1 < ndims[0]; ++a)
      if (shapes[rows_i][a] != shapes[0][a]) return 9;
    return selected_rows(v, M, Kx, K, N, params[0], params[1], bias_i >= 0 ? params[bias_i] : nullptr,
                         norm_i >= 0 ? params[norm_i] : nullptr, eps_i >= 0 ? params[eps_i] : nullptr,
                         static_cast<const int32_t*>(params[rows_i]), static_cast<float*>(params[yi]));
  }

  mse::linear_forward({v.fmt, v.prologue, M, K, N, static_cast<const float*>(params[0]), params[1],
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
      mse::isa().rmsnorm_rows(a, M, K, call.norm_w, call.eps, act.data());
    else
      mse::isa().swiglu_rows(a, M, K, act.data());
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
  c.fmt = call.fmt;
  c.x = a;
  if (call.fmt == mse::kBf16) {
    xq.resize((size_t)(M * K2));
    mse::pack_bf16_activations(a, M, K, xq.data(), K2);
    c.wb = static_cast<const uint16_t*>(call.w);
    c.xq = xq.data(), c.K2 = K2;
  } else if (call.fmt == mse::kQ4 || call.fmt == mse::kQ8) {
    c.wq = static_cast<const uint8_t*>(call.w);
  } else {
    c.x = a;
    c.wf = static_cast<const float*>(call.w);
  }
  Pool::get().run(Task{linear_item, &c, c.nchunks});
}

void mse::parallel_for(int64_t n, void (*fn)(const void* ctx, int64_t item), const void* ctx) {
  Pool::get().run(Task{fn, ctx, n});
}

extern "C" {

// Calls and seconds spent in linear_forward since the last reset (reset = 1 zeroes them after reading).
int64_t MseKernelStats(double* seconds, int reset) {
  const int64_t calls = reset ? g_calls.exchange(0) : g_calls.load();
  const int64_t nanos = reset ? g_nanos.exchange(0) : g_nanos.load();
  *seconds = (double)nanos * 1e-9;
  return calls;
}

int MseKernelThreads() { return Pool::get().threads(); }

// Chunks computed by the pool's worker threads since it started.
int64_t MseKernelWorkerChunks() { return Pool::get().worker_chunks.load(); }

// MseLinear{F32,Bf16,Q4,Q8}[Norm|Glu][Bias][Res]: every variant of ``linear`` above.
#define MSE_LINEAR_ENTRY(NAME, FMT, PRO, BIAS, RES)                                                         \
  int NAME(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, void*, void*) {    \
    return linear(nparam, params, ndims, shapes, dtypes, Variant{FMT, PRO, BIAS, RES, false});               \
  }
#define MSE_LINEAR_DTYPES(PRO_NAME, PRO, BIAS_NAME, BIAS, RES_NAME, RES)                       \
  MSE_LINEAR_ENTRY(MseLinearF32##PRO_NAME##BIAS_NAME##RES_NAME, mse::kF32, PRO, BIAS, RES)    \
  MSE_LINEAR_ENTRY(MseLinearBf16##PRO_NAME##BIAS_NAME##RES_NAME, mse::kBf16, PRO, BIAS, RES)  \
  MSE_LINEAR_ENTRY(MseLinearQ4##PRO_NAME##BIAS_NAME##RES_NAME, mse::kQ4, PRO, BIAS, RES)      \
  MSE_LINEAR_ENTRY(MseLinearQ8##PRO_NAME##BIAS_NAME##RES_NAME, mse::kQ8, PRO, BIAS, RES)
#define MSE_LINEAR_RES(PRO_NAME, PRO, BIAS_NAME, BIAS)      \
  MSE_LINEAR_DTYPES(PRO_NAME, PRO, BIAS_NAME, BIAS, , false) \
  MSE_LINEAR_DTYPES(PRO_NAME, PRO, BIAS_NAME, BIAS, Res, true)
#define MSE_LINEAR_BIAS(PRO_NAME, PRO)        \
  MSE_LINEAR_RES(PRO_NAME, PRO, , false)      \
  MSE_LINEAR_RES(PRO_NAME, PRO, Bias, true)

MSE_LINEAR_BIAS(, kNone)
MSE_LINEAR_BIAS(Norm, kNorm)
MSE_LINEAR_BIAS(Glu, kGlu)

// The LM heads' rows variants (no bias, no residual): MseLinear{F32,Bf16,Q4,Q8}[Norm]Rows, the tied head with its
// RMSNorm inside, an untied one after the model's own norm.
#define MSE_LINEAR_ROWS(NAME, FMT, PRO)                                                                     \
  int NAME(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, void*, void*) {    \
    return linear(nparam, params, ndims, shapes, dtypes, Variant{FMT, PRO, false, false, true});             \
  }
MSE_LINEAR_ROWS(MseLinearF32NormRows, mse::kF32, kNorm)
MSE_LINEAR_ROWS(MseLinearBf16NormRows, mse::kBf16, kNorm)
MSE_LINEAR_ROWS(MseLinearQ4NormRows, mse::kQ4, kNorm)
MSE_LINEAR_ROWS(MseLinearQ8NormRows, mse::kQ8, kNorm)
MSE_LINEAR_ROWS(MseLinearF32Rows, mse::kF32, kNone)
MSE_LINEAR_ROWS(MseLinearBf16Rows, mse::kBf16, kNone)
MSE_LINEAR_ROWS(MseLinearQ4Rows, mse::kQ4, kNone)
MSE_LINEAR_ROWS(MseLinearQ8Rows, mse::kQ8, kNone)

}  // extern "C"
