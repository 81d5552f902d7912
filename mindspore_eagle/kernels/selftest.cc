// Kernel self-test: runs fixed cases (linear in fp32 and bf16 with every prologue, bias and residual; tree
// attention with a tree mask) on every instruction-set path this processor runs, and prints one line per case
// and path:
//
//     <case> <path> <FNV-1a 64 hash of the output's bits>
//
// plus one line per path, "rows <path> ok|FAIL", for batch invariance: every row of a multi-row call must equal
// the same row computed alone. Inputs come from a fixed integer generator whose floats are exact (k / 2^23),
// so the same cases run on every CPU and architecture: tests/test_kernel_isa.py compares the paths of this
// machine, and `make test-arm` compares this machine's lines with the AArch64 build's, run under qemu.
// Built by kernels/build.py's compile_commands with this file as an extra source; needs no MindSpore.
//
// Usage: mse_selftest [path ...]   (default: every path this processor runs)

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels.h"

extern "C" {
int MseKernelIsas(char* buf, int size);
int MseSelectIsa(const char* name);
}

namespace {

struct Rng {
  uint64_t s;
  uint64_t next() {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    return s;
  }
  float uniform(float scale) {  // exact: an integer in [-2^23, 2^23) times 2^-23, times a power of two
    return (float)((int32_t)(next() >> 40) - (1 << 23)) * (scale / 8388608.0f);
  }
};

std::vector<float> randn(size_t n, uint64_t seed, float scale) {
  Rng r{seed * 0x9E3779B97F4A7C15ull + 1};
  std::vector<float> v(n);
  for (auto& x : v) x = r.uniform(scale);
  return v;
}

uint64_t fnv(const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// Panels as kernels/layout.py packs them (fp32 P[np, K, 16]; bf16 Q[np, K2, 32] of rounded bits).
std::vector<float> pack_f32(const std::vector<float>& w, int64_t K, int64_t N) {
  const int64_t np = (N + 15) / 16;
  std::vector<float> p((size_t)(np * K * 16), 0.0f);
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n) p[(size_t)(((n / 16) * K + k) * 16 + n % 16)] = w[(size_t)(k * N + n)];
  return p;
}

uint16_t bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7F800000u) == 0) return (uint16_t)((u >> 16) & 0x8000u);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

std::vector<uint16_t> pack_bf16(const std::vector<float>& w, int64_t K, int64_t N) {
  const int64_t np = (N + 15) / 16, K2 = (K + 1) / 2;
  std::vector<uint16_t> p((size_t)(np * K2 * 32), 0);
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n)
      p[(size_t)(((n / 16) * K2 + k / 2) * 32 + 2 * (n % 16) + k % 2)] = bf16(w[(size_t)(k * N + n)]);
  return p;
}

struct LinearCase {
  const char* name;
  bool bf16;
  mse::Prologue pro;
  bool bias, res;
  int64_t M, K, N;
};

const LinearCase kLinear[] = {
    {"lin_f32_plain", false, mse::kNone, false, false, 9, 77, 50},
    {"lin_f32_bias_res", false, mse::kNone, true, true, 16, 576, 192},
    {"lin_f32_norm", false, mse::kNorm, false, false, 5, 576, 96},
    {"lin_f32_glu_res", false, mse::kGlu, false, true, 7, 96, 64},
    {"lin_f32_wide", false, mse::kNone, false, false, 64, 64, 300},
    {"lin_bf16_plain", true, mse::kNone, false, false, 9, 77, 50},
    {"lin_bf16_norm_bias", true, mse::kNorm, true, false, 16, 576, 192},
    {"lin_bf16_glu_res", true, mse::kGlu, false, true, 3, 96, 64},
};

std::vector<float> run_linear(const LinearCase& c, int64_t row0, int64_t rows) {
  const int64_t Kx = c.pro == mse::kGlu ? 2 * c.K : c.K;
  const auto x = randn((size_t)(c.M * Kx), 1, 2.0f);
  const auto w = randn((size_t)(c.K * c.N), 2, 0.25f);
  const auto bias = randn((size_t)c.N, 3, 1.0f);
  const auto norm = randn((size_t)c.K, 4, 1.0f);
  const auto res = randn((size_t)(c.M * c.N), 5, 1.0f);
  const auto pf = pack_f32(w, c.K, c.N);
  const auto pb = pack_bf16(w, c.K, c.N);
  std::vector<float> y((size_t)(rows * c.N), -1.0f);
  mse::linear_forward({c.bf16, c.pro, rows, c.K, c.N, x.data() + row0 * Kx,
                       c.bf16 ? (const void*)pb.data() : (const void*)pf.data(), c.bias ? bias.data() : nullptr,
                       c.pro == mse::kNorm ? norm.data() : nullptr, 1e-5f, c.res ? res.data() + row0 * c.N : nullptr,
                       y.data()});
  return y;
}

// Tree attention: T new tokens after L committed rows; token t sees the prefix, its tree ancestors and itself.
std::vector<float> run_attention(int64_t T, int64_t L) {
  const int64_t B = 1, H = 6, Hkv = 2, D = 64, S = 160;
  const auto qkv = randn((size_t)(B * T * (H + 2 * Hkv) * D), 11, 1.0f);
  const auto cs = randn((size_t)(B * T * D), 12, 1.0f);
  const auto sn = randn((size_t)(B * T * D), 13, 1.0f);
  auto kc = randn((size_t)(B * Hkv * S * D), 14, 1.0f);
  auto vc = randn((size_t)(B * Hkv * S * D), 15, 1.0f);
  std::vector<float> mask((size_t)(B * T * S), -1e9f);
  std::vector<int64_t> parent((size_t)T), widx((size_t)(B * Hkv * T * 3));
  for (int64_t t = 0; t < T; ++t) {
    parent[t] = t == 0 ? -1 : (t * 7 + 3) % t;  // a fixed tree
    for (int64_t j = 0; j < L; ++j) mask[(size_t)(t * S + j)] = 0.0f;
    for (int64_t a = t; a >= 0; a = parent[a]) mask[(size_t)(t * S + L + a)] = 0.0f;
    for (int64_t g = 0; g < Hkv; ++g) {
      int64_t* w = &widx[(size_t)((g * T + t) * 3)];
      w[0] = 0, w[1] = g, w[2] = L + t;
    }
  }
  std::vector<float> out((size_t)(B * T * H * D));
  const int err = mse::attention_forward({B, T, H, Hkv, D, S, qkv.data(), cs.data(), sn.data(), mask.data(),
                                          widx.data(), kc.data(), vc.data(), out.data()});
  if (err) std::fprintf(stderr, "attention returned %d\n", err);
  out.insert(out.end(), kc.begin(), kc.end());  // the in-place cache writes are part of the result
  return out;
}

bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) paths.push_back(argv[i]);
  if (paths.empty()) {
    char buf[256];
    MseKernelIsas(buf, sizeof buf);
    std::string all = buf;
    for (size_t pos = 0; pos <= all.size();) {
      const size_t end = all.find(',', pos) == std::string::npos ? all.size() : all.find(',', pos);
      paths.push_back(all.substr(pos, end - pos));
      pos = end + 1;
    }
  }
  int failures = 0;
  for (const std::string& path : paths) {
    if (MseSelectIsa(path.c_str()) != 0) {
      std::printf("path %s unavailable\n", path.c_str());
      ++failures;
      continue;
    }
    bool rows_ok = true;
    for (const LinearCase& c : kLinear) {
      const auto y = run_linear(c, 0, c.M);
      std::printf("%s %s %016llx\n", c.name, path.c_str(), (unsigned long long)fnv(y.data(), y.size() * 4));
      for (int64_t i = 0; i < c.M; ++i) {  // each row alone, and the last rows as a smaller call
        const auto one = run_linear(c, i, 1);
        rows_ok &= same_bits(one.data(), y.data() + i * c.N, (size_t)c.N);
      }
      const int64_t tail = c.M / 2;
      const auto part = run_linear(c, c.M - tail, tail);
      rows_ok &= same_bits(part.data(), y.data() + (c.M - tail) * c.N, (size_t)(tail * c.N));
    }
    for (int64_t T : {1, 5, 16}) {
      const auto out = run_attention(T, 37);
      std::printf("att_T%lld %s %016llx\n", (long long)T, path.c_str(), (unsigned long long)fnv(out.data(), out.size() * 4));
    }
    std::printf("rows %s %s\n", path.c_str(), rows_ok ? "ok" : "FAIL");
    failures += rows_ok ? 0 : 1;
  }
  return failures ? 1 : 0;
}
