// The suffix index and its scored proposal (draft/suffix.py) in C++, for the drafting host path.
//
// Why: a drafting step looks the committed sequence up and builds, features and scores the continuation trie of up
// to 8 occurrences x 32 tokens; in Python (dicts, lists and ~40 small numpy calls) that costs ~0.25 ms per request
// step, 2-3% of a native decode step and, in the batch engine, paid by every awake request on every step whether or
// not the global budget gives it rows. The same computation here takes a few microseconds.
//
// Same results, bit for bit: draft/suffix.py documents the index, the trie and the scores, and stays the reference
// (and the fallback where this library cannot be built); tests/test_suffix_index.py runs every index test on both and
// compares their proposals (tokens, parents, features and the float64 probabilities' bits) on random, periodic and
// real sequences. Each number is produced by the same operations in the same order as there:
//   * the trie's nodes in the order the occurrences are merged, counts, longest match, periodic flags;
//   * roles from the sibling counts and each parent's best match; m_eff = match + depth - 1;
//   * q from the table ([m_eff bucket][role][count bucket], a bucket = the last edge <= value, clamped at 0), q[0] = 1;
//     each parent's children's q summed in node order (as np.bincount does), each q divided by max(sum, 1);
//     p[i] = q[i] * p[parent] in node order;
//   * the max_candidates most probable nodes (ties to the lower index: ancestor-closed), in node order.
//
// C ABI (ctypes, draft/native_suffix.py): MseSuffixNew / Free / Reset / Extend / NumNodes / LongestMatch /
// MatchAtLeast / Count / Matches / Propose. A handle belongs to one request's proposer; calls on one handle must not
// run concurrently (the batch engine and the server step requests from one thread).

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

constexpr int64_t kNone = 0;  // "no (earlier) occurrence": continuation starts are >= 1
constexpr int64_t kMaxToken = 0x7FFFFFFF;

// token -> child of one node, for every node: open addressing on (node, token) keys, linear probing.
class ChildMap {
 public:
  ChildMap() { clear(); }
  void clear() {
    keys_.assign(1024, kEmpty);
    vals_.assign(1024, 0);
    size_ = 0;
  }
  int64_t get(int64_t node, int64_t token) const {
    const uint64_t key = pack(node, token);
    for (size_t i = slot(key);; i = (i + 1) & (keys_.size() - 1)) {
      if (keys_[i] == key) return vals_[i];
      if (keys_[i] == kEmpty) return -1;
    }
  }
  void put(int64_t node, int64_t token, int64_t child) {
    if (2 * (size_ + 1) > keys_.size()) grow();
    insert(pack(node, token), child);
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  static uint64_t pack(int64_t node, int64_t token) { return (uint64_t(node) << 32) ^ uint64_t(token); }
  size_t slot(uint64_t key) const { return size_t((key * 0x9E3779B97F4A7C15ull) >> 20) & (keys_.size() - 1); }
  void insert(uint64_t key, int64_t child) {
    size_t i = slot(key);
    while (keys_[i] != kEmpty) i = (i + 1) & (keys_.size() - 1);
    keys_[i] = key;
    vals_[i] = child;
    ++size_;
  }
  void grow() {
    std::vector<uint64_t> keys;
    std::vector<int64_t> vals;
    keys.swap(keys_);
    vals.swap(vals_);
    keys_.assign(keys.size() * 2, kEmpty);
    vals_.assign(keys.size() * 2, 0);
    size_ = 0;
    for (size_t i = 0; i < keys.size(); ++i)
      if (keys[i] != kEmpty) insert(keys[i], vals[i]);
  }
  std::vector<uint64_t> keys_;
  std::vector<int64_t> vals_;
  size_t size_ = 0;
};

struct Index {
  explicit Index(int max_match) : max_match(max_match) { reset(); }
  void reset() {
    seq.clear();
    children.clear();
    last.assign(1, kNone);
    count.assign(1, 0);
    prev.assign(max_match + 1, std::vector<int64_t>(1, kNone));
    active.assign(1, 0);
  }
  // draft/suffix.py SuffixIndex.extend, one token.
  void push(int64_t t) {
    seq.push_back(t);
    const int64_t s = (int64_t)seq.size();
    std::vector<int64_t> next(1, 0);
    const size_t grows = std::min(active.size(), (size_t)max_match);
    for (size_t d = 0; d < grows; ++d) {  // the suffix of length d grows into the one of length d + 1
      std::vector<int64_t>& row = prev[d + 1];
      int64_t w = children.get(active[d], t);
      if (w < 0) {  // the first occurrence of this substring
        w = (int64_t)last.size();
        children.put(active[d], t, w);
        last.push_back(s);
        count.push_back(1);
        row.push_back(kNone);
      } else {
        row.push_back(last[w]);
        last[w] = s;
        ++count[w];
      }
      next.push_back(w);
    }
    for (size_t d = next.size(); d <= (size_t)max_match; ++d) prev[d].push_back(kNone);
    active.swap(next);
  }
  int longest_match() const {
    const size_t n = seq.size();
    for (size_t d = active.size() - 1; d > 0; --d)
      if (prev[d][n] != kNone) return (int)d;
    return 0;
  }
  // SuffixIndex.matches: (start, length) pairs, longest suffix first, most recent first, distinct starts.
  int matches(int max_occ, int min_match, int64_t* starts, int32_t* lengths) const {
    const size_t n = seq.size();
    int out = 0;
    seen.assign(n + 1, 0);
    for (int64_t d = (int64_t)active.size() - 1; d >= std::max(min_match, 1); --d) {
      const std::vector<int64_t>& chain = prev[d];
      for (int64_t s = chain[n]; s != kNone && out < max_occ; s = chain[s]) {
        if (!seen[s]) {
          seen[s] = 1;
          starts[out] = s;
          lengths[out] = (int32_t)d;
          ++out;
        }
      }
      if (out >= max_occ) break;
    }
    return out;
  }

  int max_match;
  std::vector<int64_t> seq;
  ChildMap children;
  std::vector<int64_t> last, count;
  std::vector<std::vector<int64_t>> prev;  // prev[d][s]; prev[0] unused
  std::vector<int64_t> active;
  mutable std::vector<char> seen;
};

// The continuation trie of one proposal (suffix.py continuation_trie), with first-child / next-sibling links for
// the merge's lookups (a node has at most max_occurrences children).
struct Trie {
  std::vector<int64_t> tokens, parents, depth, count, match, first_child, next_sibling;
  std::vector<char> real;
  void clear() {
    for (auto* v : {&tokens, &parents, &depth, &count, &match, &first_child, &next_sibling}) v->clear();
    real.clear();
  }
  int64_t add(int64_t token, int64_t parent, int64_t d, int64_t cnt, int64_t m, bool is_real) {
    const int64_t i = (int64_t)tokens.size();
    tokens.push_back(token), parents.push_back(parent), depth.push_back(d), count.push_back(cnt), match.push_back(m);
    real.push_back(is_real);
    first_child.push_back(-1), next_sibling.push_back(-1);
    if (i > 0) {  // appended last among its siblings: the sibling order is node order
      int64_t* link = &first_child[parent];
      while (*link >= 0) link = &next_sibling[*link];
      *link = i;
    }
    return i;
  }
  int64_t child(int64_t v, int64_t token) const {
    for (int64_t c = first_child[v]; c >= 0; c = next_sibling[c])
      if (tokens[c] == token) return c;
    return -1;
  }
};

// The bucket of value: the last edge <= value, clamped at 0 (calibration.py SuffixCalibration.cells).
int64_t bucket(const int64_t* edges, int n, int64_t value) {
  const int64_t i = (int64_t)(std::upper_bound(edges, edges + n, value) - edges) - 1;
  return i < 0 ? 0 : i;
}

}  // namespace

extern "C" {

void* MseSuffixNew(int32_t max_match) { return max_match >= 1 ? new Index(max_match) : nullptr; }
void MseSuffixFree(void* h) { delete static_cast<Index*>(h); }
void MseSuffixReset(void* h) { static_cast<Index*>(h)->reset(); }
int64_t MseSuffixNumNodes(void* h) { return (int64_t)static_cast<Index*>(h)->last.size(); }
int32_t MseSuffixLongestMatch(void* h) { return static_cast<Index*>(h)->longest_match(); }

// Appends tokens[0:n]; refuses an id outside [0, 2^31) (the child map packs (node, token) into 64 bits), returning
// the position of the first one + 1 and appending nothing.
int64_t MseSuffixExtend(void* h, const int64_t* tokens, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] > kMaxToken) return i + 1;
  Index* x = static_cast<Index*>(h);
  for (int64_t i = 0; i < n; ++i) x->push(tokens[i]);
  return 0;
}

// Whether the sequence's last `length` tokens (1..max_match, checked by the caller) occurred earlier.
int32_t MseSuffixMatchAtLeast(void* h, int32_t length) {
  const Index* x = static_cast<Index*>(h);
  return (int64_t)x->active.size() > length && x->prev[length][x->seq.size()] != kNone;
}

// Occurrences of pattern[0:len] (1..max_match tokens, checked by the caller); 0 if it never occurred.
int64_t MseSuffixCount(void* h, const int64_t* pattern, int32_t len) {
  const Index* x = static_cast<Index*>(h);
  int64_t v = 0;
  for (int32_t i = 0; i < len && v >= 0; ++i)
    v = pattern[i] < 0 || pattern[i] > kMaxToken ? -1 : x->children.get(v, pattern[i]);
  return v < 0 ? 0 : x->count[v];
}

int32_t MseSuffixMatches(void* h, int32_t max_occ, int32_t min_match, int64_t* starts, int32_t* lengths) {
  return static_cast<Index*>(h)->matches(max_occ, min_match, starts, lengths);
}

// suffix.py suffix_proposal on this index. cfg = (max_occurrences, max_depth, min_match, max_candidates); the table
// is float64 [n_match][4 roles][n_count] (the calibration's q now). Writes up to max(max_candidates, 1) nodes into
// the six outputs (node 0 the root) and returns how many; -1 when the index is empty.
int64_t MseSuffixPropose(void* h, const int64_t* cfg, const int64_t* match_edges, int32_t n_match,
                         const int64_t* count_edges, int32_t n_count, const double* table, int64_t* out_tokens,
                         int64_t* out_parents, double* out_probs, int64_t* out_m_eff, int64_t* out_role,
                         int64_t* out_count) {
  const Index* x = static_cast<Index*>(h);
  const int64_t n = (int64_t)x->seq.size();
  if (n == 0) return -1;
  const int max_occ = (int)cfg[0], max_depth = (int)cfg[1], min_match = (int)cfg[2];
  const int64_t max_cand = cfg[3];
  thread_local std::vector<int64_t> starts;
  thread_local std::vector<int32_t> lengths;
  starts.resize(max_occ), lengths.resize(max_occ);
  const int occ = x->matches(max_occ, min_match, starts.data(), lengths.data());

  thread_local Trie t;
  t.clear();
  t.add(x->seq[n - 1], 0, 0, occ, 0, true);
  thread_local std::vector<int64_t> cont;
  for (int o = 0; o < occ; ++o) {
    const int64_t s = starts[o], m = lengths[o], period = n - s;
    cont.assign(x->seq.begin() + s, x->seq.begin() + std::min(n, s + max_depth));
    while ((int64_t)cont.size() < max_depth) cont.push_back(cont[cont.size() - period]);
    int64_t v = 0, k = 0;
    for (; k < max_depth; ++k) {  // down the nodes earlier continuations already made
      const int64_t w = t.child(v, cont[k]);
      if (w < 0) break;
      ++t.count[w];
      if (m > t.match[w]) t.match[w] = m;
      t.real[w] = t.real[w] || k < period;
      v = w;
    }
    for (; k < max_depth; ++k) v = t.add(cont[k], v, k + 1, 1, m, k < period);
  }
  const int64_t N = (int64_t)t.tokens.size();

  // features (calibration.py node_features)
  thread_local std::vector<int64_t> siblings, best, holders, role;
  siblings.assign(N, 0), best.assign(N, 0), holders.assign(N, 0), role.assign(N, 0);
  for (int64_t i = 1; i < N; ++i) {
    ++siblings[t.parents[i]];
    best[t.parents[i]] = std::max(best[t.parents[i]], t.match[i]);
  }
  for (int64_t i = 1; i < N; ++i) holders[t.parents[i]] += t.match[i] == best[t.parents[i]];
  for (int64_t i = 1; i < N; ++i) {
    const int64_t par = t.parents[i];
    const bool holds = t.match[i] == best[par];
    role[i] = siblings[par] == 1 ? 0 : holds ? (holders[par] == 1 ? 1 : 2) : 3;
  }
  // scores (suffix.py _score)
  thread_local std::vector<double> q, total;
  q.assign(N, 0.0), total.assign(N, 0.0);
  q[0] = 1.0;
  for (int64_t i = 1; i < N; ++i) {
    const int64_t mb = bucket(match_edges, n_match, t.match[i] + t.depth[i] - 1);
    const int64_t cb = bucket(count_edges, n_count, t.count[i]);
    q[i] = table[(mb * 4 + role[i]) * n_count + cb];
  }
  for (int64_t i = 1; i < N; ++i) total[t.parents[i]] += q[i];
  for (int64_t i = 1; i < N; ++i) q[i] /= std::max(total[t.parents[i]], 1.0);
  for (int64_t i = 1; i < N; ++i) q[i] *= q[t.parents[i]];  // now p (parents first)

  thread_local std::vector<int64_t> keep, new_index;
  keep.resize(N);
  for (int64_t i = 0; i < N; ++i) keep[i] = i;
  if (N > max_cand) {  // top by p, ties to the lower index (ancestor-closed: p never grows down a path)
    std::stable_sort(keep.begin(), keep.end(), [&](int64_t a, int64_t b) { return q[a] > q[b]; });
    keep.resize(max_cand);
    std::sort(keep.begin(), keep.end());
  }
  new_index.assign(N, 0);
  for (size_t j = 0; j < keep.size(); ++j) new_index[keep[j]] = (int64_t)j;
  for (size_t j = 0; j < keep.size(); ++j) {
    const int64_t i = keep[j];
    out_tokens[j] = t.tokens[i];
    out_parents[j] = new_index[t.parents[i]];
    out_probs[j] = q[i];
    out_m_eff[j] = t.match[i] + t.depth[i] - 1;
    out_role[j] = role[i];
    out_count[j] = t.count[i];
  }
  return (int64_t)keep.size();
}

}  // extern "C"
