// Which instruction-set paths of compute.cc this library holds, which of them the processor can run, and the
// one in use. Compiled for the baseline of the target (no ISA flags), so it runs before any wider instruction.
//
// Paths, best first: x86-64 avx512bf16 > avx512 > avx2 > generic; AArch64 neon > generic. The one in use is
// the best the processor runs, unless MSE_KERNEL_ISA names another (one it can run): tests and benchmarks run
// a lower path on a machine that has a higher one, and every path computes the same bits.
//
//     MseKernelFeatures()       bit 0: the kernels run here (always, the generic path at least);
//                               bit 1: bf16 natively (AVX512-BF16), bit 2: a SIMD path (not only generic)
//     MseKernelIsa()            name of the path in use
//     MseArgmaxQ8Fast()         1 when the path in use runs argmax.cc's greedy Q8 LM head fast (AVX-512, AVX2,
//                               NEON), else 0 (the portable path)
//     MseApproxVnni(allowed)    whether the AVX-512 paths may use their AVX512-VNNI blocks for that head (default
//                               yes, where the processor has them; tests turn them off to run the AVX512-BW ones;
//                               -1 changes nothing); returns 1 when the path in use now runs VNNI blocks
//     MseKernelIsas(buf, n)     comma-separated names of the paths this processor can run, best first
//     MseSelectIsa(name)        use that path from now on: 0, or 1 when it is unknown or cannot run here

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels.h"

namespace mse {

#if defined(__x86_64__)
namespace avx512bf16 { extern const IsaOps kOps; }
namespace avx512 { extern const IsaOps kOps; }
namespace avx2 { extern const IsaOps kOps; }
#elif defined(__aarch64__)
namespace neon { extern const IsaOps kOps; }
#endif
namespace generic { extern const IsaOps kOps; }

namespace {

bool runs_here(const char* name) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (!std::strcmp(name, "avx512bf16")) return avx512 && __builtin_cpu_supports("avx512bf16");
  if (!std::strcmp(name, "avx512")) return avx512;
  if (!std::strcmp(name, "avx2")) return avx2;
#elif defined(__aarch64__)
  if (!std::strcmp(name, "neon")) return true;  // Advanced SIMD is part of every AArch64 processor
#endif
  return !std::strcmp(name, "generic");
}

// Every path of this build, best first.
std::vector<const IsaOps*> all_paths() {
#if defined(__x86_64__)
  return {&avx512bf16::kOps, &avx512::kOps, &avx2::kOps, &generic::kOps};
#elif defined(__aarch64__)
  return {&neon::kOps, &generic::kOps};
#else
  return {&generic::kOps};
#endif
}

const IsaOps* find(const char* name) {
  for (const IsaOps* ops : all_paths())
    if (!std::strcmp(ops->name, name) && runs_here(name)) return ops;
  return nullptr;
}

const IsaOps* best() {
  for (const IsaOps* ops : all_paths())
    if (runs_here(ops->name)) return ops;
  return &generic::kOps;
}

const IsaOps* initial() {
  if (const char* env = std::getenv("MSE_KERNEL_ISA")) {
    if (*env) {
      if (const IsaOps* ops = find(env)) return ops;
      std::fprintf(stderr, "mindspore_eagle kernels: MSE_KERNEL_ISA=%s is not a path this processor runs; using %s\n",
                   env, best()->name);
    }
  }
  return best();
}

const IsaOps* g_current = nullptr;

}  // namespace

const IsaOps& isa() {
  if (!g_current) g_current = initial();  // racing first calls pick the same table
  return *g_current;
}

namespace {
bool g_vnni_allowed = true;  // MseApproxVnni

bool has_vnni() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}
}  // namespace

ApproxChunkFn approx_q8_chunk() {
  const IsaOps& ops = isa();
  if (ops.approx_q8_chunk_vnni != nullptr && g_vnni_allowed && has_vnni()) return ops.approx_q8_chunk_vnni;
  return ops.approx_q8_chunk;
}

}  // namespace mse

extern "C" {

int MseKernelFeatures() {
  int f = 1;
  if (mse::runs_here("avx512bf16")) f |= 2;
  if (mse::best() != &mse::generic::kOps) f |= 4;
  return f;
}

const char* MseKernelIsa() { return mse::isa().name; }

int MseArgmaxQ8Fast() { return mse::approx_q8_chunk() != nullptr ? 1 : 0; }

int MseApproxVnni(int allowed) {
  if (allowed >= 0) mse::g_vnni_allowed = allowed != 0;
  const mse::IsaOps& ops = mse::isa();
  return ops.approx_q8_chunk_vnni != nullptr && mse::approx_q8_chunk() == ops.approx_q8_chunk_vnni;
}

int MseKernelIsas(char* buf, int size) {
  std::string names;
  for (const mse::IsaOps* ops : mse::all_paths())
    if (mse::runs_here(ops->name)) names += (names.empty() ? "" : ",") + std::string(ops->name);
  std::snprintf(buf, (size_t)size, "%s", names.c_str());
  return (int)names.size();
}

int MseSelectIsa(const char* name) {
  const mse::IsaOps* ops = mse::find(name);
  if (!ops) return 1;
  mse::g_current = ops;
  return 0;
}

}  // extern "C"
