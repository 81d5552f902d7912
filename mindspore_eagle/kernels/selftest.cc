// Kernel self-test: runs fixed cases (linear in fp32 and bf16 with every prologue, bias and residual; tree
// attention with a tree mask; the greedy Q8 head's approximate logits and candidates) on every instruction-set path
// this processor runs, and prints one line per case
// and path:
//
//     <case> <path> <FNV-1a 64 hash of the output's bits>
//
// (an AVX-512 path that runs the greedy head's AVX512-VNNI blocks also prints its approx cases as "<path>/bw",
// through the AVX512-BW blocks a processor without VNNI takes)
// plus one line per path, "rows <path> ok|FAIL", for batch invariance: every row of a multi-row call must equal
// the same row computed alone, and per quantized case "exact_<case> <path> ok|FAIL": the Q4 / Q8 kernel equals,
// bit for bit, the fp32 kernel on the weights dequantized as the GGUF converter does ((d * q) + m in float32). Inputs come from a fixed integer generator whose floats are exact (k / 2^23),
// so the same cases run on every CPU and architecture: tests/test_kernel_isa.py compares the paths of this
// machine, and `make test-arm` compares this machine's lines with the AArch64 build's, run under qemu.
// Built by kernels/build.py's compile_commands with this file as an extra source; needs no MindSpore.
//
// Usage: mse_selftest [path ...]   (default: every path this processor runs)

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels.h"

extern "C" {
int MseKernelIsas(char* buf, int size);
int MseSelectIsa(const char* name);
int MseApproxVnni(int allowed);
void MseApproxQ8Check(int64_t M, int64_t K, int64_t N, const int16_t* xq, const uint8_t* pairs, const float* colabs,
                      float F, float* out, int32_t* cand, int64_t* counts);
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

// A quantized weight as GGUF holds it (d, m per 32-row block and column; 4- or 8-bit q), its value as the
// converter computes it (numpy: (d * q) + m, two float32 operations), and its kQ4 / kQ8 panels (kernels.h).
struct QWeight {
  std::vector<float> dense;   // [K, N]
  std::vector<uint8_t> panels;
};

float fp16_value(Rng& r) {  // an fp16-representable scale: integer in [1, 2047] times 2^-16, random sign
  const int64_t u = (int64_t)(r.next() >> 40);
  return (float)(1 + u % 2047) * (1.0f / 65536.0f) * ((u >> 12) & 1 ? -1.0f : 1.0f);
}

QWeight make_q(mse::WeightFormat fmt, int64_t K, int64_t N, uint64_t seed) {
  Rng r{seed * 0x9E3779B97F4A7C15ull + 7};
  const int64_t KB = K / 32, np = (N + 15) / 16, bytes = fmt == mse::kQ4 ? mse::kQ4Bytes : mse::kQ8Bytes;
  QWeight w{std::vector<float>((size_t)(K * N)), std::vector<uint8_t>((size_t)(np * KB * bytes), 0)};
  for (int64_t n = 0; n < N; ++n)
    for (int64_t kb = 0; kb < KB; ++kb) {
      const float d = fp16_value(r), m = fmt == mse::kQ4 ? fp16_value(r) : 0.0f;
      uint8_t* blk = w.panels.data() + ((n / 16) * KB + kb) * bytes;
      std::memcpy(blk + 4 * (n % 16), &d, 4);
      if (fmt == mse::kQ4) std::memcpy(blk + 64 + 4 * (n % 16), &m, 4);
      for (int64_t kk = 0; kk < 32; ++kk) {
        const int64_t k = kb * 32 + kk, j = n % 16;
        if (fmt == mse::kQ4) {
          const int q = (int)(r.next() >> 60);  // 0..15
          const float prod = d * (float)q;
          w.dense[(size_t)(k * N + n)] = prod + m;
          blk[128 + (kk / 2) * 16 + j] |= (uint8_t)(kk % 2 ? q << 4 : q);
        } else {
          const int q = (int)(int8_t)(r.next() >> 56);
          w.dense[(size_t)(k * N + n)] = (float)q * d;
          blk[64 + kk * 16 + j] = (uint8_t)(int8_t)q;
        }
      }
    }
  return w;
}

struct LinearCase {
  const char* name;
  mse::WeightFormat fmt;
  mse::Prologue pro;
  bool bias, res;
  int64_t M, K, N;
};

const LinearCase kLinear[] = {
    {"lin_f32_plain", mse::kF32, mse::kNone, false, false, 9, 77, 50},
    {"lin_f32_bias_res", mse::kF32, mse::kNone, true, true, 16, 576, 192},
    {"lin_f32_norm", mse::kF32, mse::kNorm, false, false, 5, 576, 96},
    {"lin_f32_glu_res", mse::kF32, mse::kGlu, false, true, 7, 96, 64},
    {"lin_f32_wide", mse::kF32, mse::kNone, false, false, 64, 64, 300},
    {"lin_bf16_plain", mse::kBf16, mse::kNone, false, false, 9, 77, 50},
    {"lin_bf16_norm_bias", mse::kBf16, mse::kNorm, true, false, 16, 576, 192},
    {"lin_bf16_glu_res", mse::kBf16, mse::kGlu, false, true, 3, 96, 64},
    {"lin_q4_norm_bias", mse::kQ4, mse::kNorm, true, false, 16, 576, 200},
    {"lin_q4_glu_res", mse::kQ4, mse::kGlu, false, true, 5, 96, 64},
    {"lin_q4_wide", mse::kQ4, mse::kNone, false, false, 64, 64, 48},
    {"lin_q8_plain", mse::kQ8, mse::kNone, false, false, 9, 64, 50},
    {"lin_q8_norm", mse::kQ8, mse::kNorm, false, true, 16, 576, 96},
    {"lin_q4_rows8", mse::kQ4, mse::kNorm, true, true, 8, 576, 208},
    {"lin_q8_rows6", mse::kQ8, mse::kGlu, false, true, 6, 96, 80},
    {"lin_bf16_rows7_bias_res", mse::kBf16, mse::kNorm, true, true, 7, 576, 208},  // the wide bf16 block (5-8 rows)
};

// `dense`: a quantized case computed by the fp32 kernel on the converter's values of its weights instead.
std::vector<float> run_linear(const LinearCase& c, int64_t row0, int64_t rows, bool dense = false) {
  const int64_t Kx = c.pro == mse::kGlu ? 2 * c.K : c.K;
  const auto x = randn((size_t)(c.M * Kx), 1, 2.0f);
  const bool quant = c.fmt == mse::kQ4 || c.fmt == mse::kQ8;
  const QWeight qw = quant ? make_q(c.fmt, c.K, c.N, 2) : QWeight{};
  const auto w = quant ? qw.dense : randn((size_t)(c.K * c.N), 2, 0.25f);
  const auto bias = randn((size_t)c.N, 3, 1.0f);
  const auto norm = randn((size_t)c.K, 4, 1.0f);
  const auto res = randn((size_t)(c.M * c.N), 5, 1.0f);
  const auto pf = pack_f32(w, c.K, c.N);
  const auto pb = pack_bf16(w, c.K, c.N);
  std::vector<float> y((size_t)(rows * c.N), -1.0f);
  const mse::WeightFormat fmt = dense ? mse::kF32 : c.fmt;
  const void* packed = fmt == mse::kBf16 ? (const void*)pb.data() : quant && !dense ? (const void*)qw.panels.data()
                                                                                    : (const void*)pf.data();
  mse::linear_forward({fmt, c.pro, rows, c.K, c.N, x.data() + row0 * Kx, packed, c.bias ? bias.data() : nullptr,
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

// The greedy Q8 head's approximate logits and candidates (argmax.cc's MseApproxQ8Check) for M rows: random pair
// panels (fp32 d, int8 weights), int16 activations, positive column sums; N not a multiple of 4, 8 or 16, so every
// scan's tail runs. The hash covers the logits, every row's candidates and their counts.
uint64_t run_approx(int64_t M) {
  const int64_t K = 96, N = 203, np = (N + 15) / 16, KB = K / 32;
  Rng r{0xA5A5A5A5ull + (uint64_t)M};
  std::vector<uint8_t> pairs((size_t)(np * KB * mse::kQ8Bytes));
  for (int64_t b = 0; b < np * KB; ++b) {
    uint8_t* blk = pairs.data() + b * mse::kQ8Bytes;
    for (int j = 0; j < 16; ++j) {
      const float d = r.uniform(1.0f / 1048576.0f);
      std::memcpy(blk + 4 * j, &d, 4);
    }
    for (int64_t i = 64; i < mse::kQ8Bytes; ++i) blk[i] = (uint8_t)(int8_t)((int)(r.next() % 255) - 127);
  }
  std::vector<int16_t> xq((size_t)(M * K));
  for (auto& v : xq) v = (int16_t)((int)(r.next() % 65535) - 32767);
  std::vector<float> colabs((size_t)N);
  for (auto& c : colabs) c = std::fabs(r.uniform(1.0f));
  colabs[N - 1] = 1000.0f;  // a bound this wide makes the last column (in every scan's tail) a candidate
  std::vector<float> out((size_t)(M * np * 16), -1.0f);
  std::vector<int32_t> cand((size_t)(M * 64), -1);
  std::vector<int64_t> counts((size_t)M, -1);
  MseApproxQ8Check(M, K, N, xq.data(), pairs.data(), colabs.data(), 2.0f, out.data(), cand.data(), counts.data());
  uint64_t h = fnv(out.data(), out.size() * 4) ^ (fnv(cand.data(), cand.size() * 4) * 31);
  return h ^ (fnv(counts.data(), counts.size() * 8) * 131);
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
      if (c.fmt == mse::kQ4 || c.fmt == mse::kQ8) {  // the converter's values through the fp32 kernel
        const auto dense = run_linear(c, 0, c.M, true);
        const bool exact = same_bits(dense.data(), y.data(), y.size());
        std::printf("exact_%s %s %s\n", c.name, path.c_str(), exact ? "ok" : "FAIL");
        failures += exact ? 0 : 1;
      }
      const int64_t tail = c.M / 2;
      const auto part = run_linear(c, c.M - tail, tail);
      rows_ok &= same_bits(part.data(), y.data() + (c.M - tail) * c.N, (size_t)(tail * c.N));
    }
    for (int64_t T : {1, 5, 16}) {
      const auto out = run_attention(T, 37);
      std::printf("att_T%lld %s %016llx\n", (long long)T, path.c_str(), (unsigned long long)fnv(out.data(), out.size() * 4));
    }
    // the path's greedy-head blocks; where they are its VNNI ones, its AVX512-BW ones too ("<path>/bw")
    const bool vnni = MseApproxVnni(-1) == 1;
    for (const bool bw : {false, true}) {
      if (bw && !vnni) break;
      MseApproxVnni(bw ? 0 : 1);
      for (int64_t M : {1, 7})
        std::printf("approx_q8_M%lld %s%s %016llx\n", (long long)M, path.c_str(), bw ? "/bw" : "",
                    (unsigned long long)run_approx(M));
    }
    MseApproxVnni(1);
    std::printf("rows %s %s\n", path.c_str(), rows_ok ? "ok" : "FAIL");
    failures += rows_ok ? 0 : 1;
  }
  return failures ? 1 : 0;
}
