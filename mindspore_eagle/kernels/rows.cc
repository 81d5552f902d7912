// Row reductions of logits, for the training data's teacher forward (train/topk_teacher.py):
//
//     MseRowTopK(logits f32 [R, V]) -> greedy int32 [R], finite int32 [R], ids int32 [R, k], values f32 [R, k]
//
// with k the width of the ids output. Per row, in one pass over its V values:
//   greedy  np.argmax's rule: the index of the first NaN if the row holds one, else the first of its equal maxima;
//   finite  1 when every value of the row is finite, else 0;
//   ids, values  the k largest values in descending order, equal values by increasing index (the order of a stable
//           sort of -x); a row with fewer than k values above -inf pads with (-inf, -1), NaN never enters. Callers
//           refuse a row that is not finite, so only finite rows' top-k is ever used.
//
// Why a kernel: MindSpore's CPU TopK, Argmax and ReduceSum over a 49k-wide row cost ~39 ms for 64 rows of the
// default teacher (a teacher forward of those rows: ~77 ms), a third of every data-generation step and ledger
// rebuild chunk; this pass costs a few milliseconds. Rows are independent (each item of the pool is one row),
// so a row's outputs never depend on the other rows of the call or their number.

#include <cmath>
#include <cstring>
#include <limits>

#include "kernels.h"

namespace {

struct TopKJob {
  int64_t V, k;
  const float* logits;
  int32_t* greedy;
  int32_t* finite;
  int32_t* ids;
  float* values;
};

// One value of the row, the slow way: NaN and infinities, a new maximum, an entry into the top k.
inline void visit(float v, int64_t j, int64_t k, float* val, int32_t* id, float* best, int64_t* best_at,
                  int64_t* first_nan, bool* finite) {
  if (!std::isfinite(v)) {
    *finite = false;
    if (v != v && *first_nan < 0) *first_nan = j;
  }
  if (v > *best) *best = v, *best_at = j;  // strictly greater: the first of equal maxima stays
  if (v > val[k - 1]) {  // strictly greater: an equal value with a lower index keeps its rank
    int64_t p = k - 1;
    while (p > 0 && val[p - 1] < v) {
      val[p] = val[p - 1], id[p] = id[p - 1];
      --p;
    }
    val[p] = v, id[p] = static_cast<int32_t>(j);
  }
}

constexpr int64_t kBlock = 16;

void topk_row(const void* ctx, int64_t r) {
  const TopKJob& job = *static_cast<const TopKJob*>(ctx);
  const float* x = job.logits + r * job.V;
  float* val = job.values + r * job.k;
  int32_t* id = job.ids + r * job.k;
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < job.k; ++i) val[i] = ninf, id[i] = -1;
  float best = ninf;
  int64_t best_at = 0, first_nan = -1;
  bool finite = true;
  int64_t j0 = 0;
  // Whole blocks: their maximum and whether all are finite (a vectorisable pass); only a block that holds a
  // non-finite value, a new maximum or an entry into the top k is visited value by value, in order -- the
  // same visits, so the same result, as visiting every value.
  for (; j0 + kBlock <= job.V; j0 += kBlock) {
    float m = ninf;
    int bad = 0;
    for (int64_t i = 0; i < kBlock; ++i) {
      const float v = x[j0 + i];
      bad |= !(v - v == 0.0f);  // NaN or an infinity
      m = v > m ? v : m;
    }
    if (bad || m > best || m > val[job.k - 1])
      for (int64_t i = 0; i < kBlock; ++i) visit(x[j0 + i], j0 + i, job.k, val, id, &best, &best_at, &first_nan,
                                                &finite);
  }
  for (; j0 < job.V; ++j0) visit(x[j0], j0, job.k, val, id, &best, &best_at, &first_nan, &finite);
  job.greedy[r] = static_cast<int32_t>(first_nan >= 0 ? first_nan : best_at);
  job.finite[r] = finite ? 1 : 0;
}

int row_topk(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) {
  if (nparam != 5) return 1;
  if (std::strcmp(dtypes[0], "float32") || std::strcmp(dtypes[1], "int32") || std::strcmp(dtypes[2], "int32") ||
      std::strcmp(dtypes[3], "int32") || std::strcmp(dtypes[4], "float32"))
    return 3;
  if (ndims[0] != 2 || ndims[1] != 1 || ndims[2] != 1 || ndims[3] != 2 || ndims[4] != 2) return 2;
  const int64_t R = shapes[0][0], V = shapes[0][1], k = shapes[3][1];
  if (V < 1 || k < 1 || k > V || shapes[1][0] != R || shapes[2][0] != R || shapes[3][0] != R ||
      shapes[4][0] != R || shapes[4][1] != k)
    return 4;
  TopKJob job{V, k, static_cast<const float*>(params[0]), static_cast<int32_t*>(params[1]),
              static_cast<int32_t*>(params[2]), static_cast<int32_t*>(params[3]), static_cast<float*>(params[4])};
  mse::parallel_for(R, topk_row, &job);
  return 0;
}

}  // namespace

extern "C" {

int MseRowTopK(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, void*, void*) {
  return row_topk(nparam, params, ndims, shapes, dtypes);
}

}  // extern "C"
