// Paged causal attention for the CPU, reading K/V in place through the request->token table.
//
// One op serves decode and extend: query j of request i sits at absolute position
// prefix_lens[i] + j and attends to the request's KV slots 0..that position, found through
// req_to_token[req_pool_indices[i], :]. Nothing is padded and nothing is gathered into a
// batch-sized tensor: each work unit streams its keys and values from the pool.
//
// Work units are (request, KV head, block of queries, chunk of keys). All query heads of a
// KV head (the GQA group) are rows of the same unit, so each key and value row is loaded and
// converted once for the whole group. A unit keeps an online softmax (running max, sum and
// fp32 accumulator per row); a query block whose keys span several chunks writes partial
// results that a second pass merges (split-KV), so one long request is spread over all
// threads. Units are dealt to threads in contiguous runs of equal total cost, so a skewed
// batch costs what a uniform one with the same number of tokens costs.
//
// Per-layer options (all off by default): a sliding window (query at position p sees keys
// p - window + 1 .. p; units start at the window's first key, so keys before it are never
// read), one sink logit per query head (a softmax term with a zero value: the rows of a
// query block's first key chunk start their online softmax at m = sink, l = 1, so split-KV
// merges count it once), and logit soft-capping (score -> cap * tanh(score / cap)).
//
// Compute is fp32; q/out may be fp32 or bf16, the cache fp32 or bf16. Built by
// torch.utils.cpp_extension with -O3 -march=native; the loops are written for the
// compiler's vectoriser (omp simd), no intrinsics, so the same source builds anywhere.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "cpu_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

constexpr int kBlockKeys = 32;     // keys scored together
constexpr int kMaxHeadDim = 256;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kPrefetchKeys = 8;   // how far ahead key rows are prefetched

// Rows of a paged cache sit at unrelated addresses (the hardware prefetcher cannot follow
// them), so every cache line of a row that will be needed soon is prefetched by hand.
template <typename T>
inline void prefetch_row(const T* row, int n) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int off = 0; off < n * static_cast<int>(sizeof(T)); off += 64) __builtin_prefetch(p + off);
}

using sluice_cpu::exp_nonpositive;

// 16 floats as one value (GCC/Clang vector extension): one zmm register with AVX-512, split
// into narrower registers by the compiler elsewhere. Loads and stores go through memcpy, so
// nothing needs to be aligned.
typedef float v16 __attribute__((vector_size(64)));

inline v16 load16(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store16(float* p, v16 v) { std::memcpy(p, &v, sizeof(v)); }

// The 16 lanes summed by one fixed tree (halves, quarters, eighths, pairs): every score of
// every row takes the same steps, so it does not depend on how many rows share the unit.
typedef int32_t i16 __attribute__((vector_size(64)));

inline float sum16(v16 v) {
  v += __builtin_shuffle(v, i16{8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
  v += __builtin_shuffle(v, i16{4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11});
  v += __builtin_shuffle(v, i16{2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
  v += __builtin_shuffle(v, i16{1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
  return v[0];
}

inline void load_row(const float* src, float* dst, int n) {
  std::memcpy(dst, src, sizeof(float) * n);
}

inline void load_row(const c10::BFloat16* src, float* dst, int n) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
#pragma omp simd
  for (int d = 0; d < n; ++d) {
    uint32_t u = static_cast<uint32_t>(bits[d]) << 16;
    float f;
    std::memcpy(&f, &u, sizeof(f));
    dst[d] = f;
  }
}

inline void store_row(const float* src, float* dst, int n, float mul) {
  for (int d = 0; d < n; ++d) dst[d] = src[d] * mul;
}

inline void store_row(const float* src, c10::BFloat16* dst, int n, float mul) {
  for (int d = 0; d < n; ++d) dst[d] = c10::BFloat16(src[d] * mul);
}

struct Unit {
  int32_t req;
  int32_t kv_head;
  int32_t q_begin;  // query offsets within the request's new tokens
  int32_t q_end;
  int32_t k_begin;  // key positions
  int32_t k_end;
  int32_t chunk;    // index of this key chunk within its query block (chunks sit at whole
                    // multiples of kv_chunk in key positions, whatever the query block)
  int32_t num_chunks;
  int64_t partial;  // first row of this unit in the partial buffers (-1: write output)
  int64_t cost;
};

struct Problem {
  int64_t num_heads, num_kv_heads, head_dim, group;
  float scale;
  const int64_t* prefix;
  const int64_t* extend;
  const int64_t* q_start;
  const int64_t* pool_rows;
  const int32_t* req_to_token;
  int64_t req_to_token_stride;
  int64_t cache_stride;  // elements between consecutive slots
  int64_t window;        // 0: full attention
  const float* sinks;    // [num_heads] or nullptr
  float softcap;         // 0: off
  int64_t kv_chunk;      // keys per split-KV chunk
};

// Scores, softmax and the value sum of one unit. Rows are (query, head in group).
// kHeadDim > 0 fixes head_dim at compile time, so the per-row loops unroll into a few
// vector instructions (a runtime trip count costs more in loop overhead than in math).
template <typename scalar_t, typename cache_t, int kHeadDim>
void run_unit(const Problem& p, const Unit& u, const scalar_t* q, const cache_t* k_cache,
              const cache_t* v_cache, scalar_t* out, float* part_acc, float* part_ml) {
  const int D = kHeadDim > 0 ? kHeadDim : static_cast<int>(p.head_dim);
  const int G = static_cast<int>(p.group);
  const int nq = u.q_end - u.q_begin;
  const int R = nq * G;
  const int64_t prefix = p.prefix[u.req];
  const int32_t* slots = p.req_to_token + p.pool_rows[u.req] * p.req_to_token_stride;

  std::vector<float> qf(static_cast<size_t>(R) * D);
  std::vector<float> acc(static_cast<size_t>(R) * D, 0.0f);
  std::vector<float> m(R, kNegInf), l(R, 0.0f);
  std::vector<float> scores(static_cast<size_t>(R) * kBlockKeys);
  std::vector<int32_t> limit(R);  // keys visible to a row: positions < limit
  std::vector<int32_t> low(R, 0);  // and positions >= low (the sliding window)
  alignas(64) float vb[kBlockKeys * kMaxHeadDim];  // values of a block [keys][D]
  alignas(64) float kb[kMaxHeadDim];

  for (int qi = 0; qi < nq; ++qi) {
    const int64_t token = p.q_start[u.req] + u.q_begin + qi;
    for (int g = 0; g < G; ++g) {
      const int r = qi * G + g;
      const int64_t head = u.kv_head * G + g;
      load_row(q + (token * p.num_heads + head) * D, &qf[static_cast<size_t>(r) * D], D);
      for (int d = 0; d < D; ++d) qf[static_cast<size_t>(r) * D + d] *= p.scale;
      limit[r] = static_cast<int32_t>(prefix + u.q_begin + qi + 1);
      if (p.window > 0) low[r] = static_cast<int32_t>(std::max<int64_t>(0, limit[r] - p.window));
      // the sink joins the chunk of the row's first visible key: the same chunk however
      // the row's query block or forward was cut
      if (p.sinks != nullptr && low[r] / p.kv_chunk == u.k_begin / p.kv_chunk) {
        m[r] = p.sinks[head];  // the sink's term exp(sink - m) = 1, its value zero
        l[r] = 1.0f;
      }
    }
  }
  const int64_t head_offset = static_cast<int64_t>(u.kv_head) * D;

  for (int j = u.k_begin; j < std::min(u.k_end, u.k_begin + kPrefetchKeys); ++j)
    prefetch_row(k_cache + slots[j] * p.cache_stride + head_offset, D);
  for (int k0 = u.k_begin; k0 < u.k_end; k0 += kBlockKeys) {
    const int nk = std::min(kBlockKeys, u.k_end - k0);
    // scores[r][j] = q_r . k_{k0+j}: 16 lanes over d, then one fixed tree (`sum16`); the same
    // steps for a decode row and for a row of a long prefill
    for (int j = 0; j < nk; ++j) {
      if (k0 + j + kPrefetchKeys < u.k_end)
        prefetch_row(k_cache + slots[k0 + j + kPrefetchKeys] * p.cache_stride + head_offset, D);
      prefetch_row(v_cache + slots[k0 + j] * p.cache_stride + head_offset, D);
      load_row(k_cache + slots[k0 + j] * p.cache_stride + head_offset, kb, D);
      for (int r = 0; r < R; ++r) {
        const float* qr = &qf[static_cast<size_t>(r) * D];
        v16 dot = {};
        for (int d0 = 0; d0 < D; d0 += 16) dot += load16(qr + d0) * load16(kb + d0);
        scores[static_cast<size_t>(r) * kBlockKeys + j] = sum16(dot);
      }
    }
    for (int j = 0; j < nk; ++j)
      load_row(v_cache + slots[k0 + j] * p.cache_stride + head_offset, &vb[j * D], D);
    // online softmax and the value sum, row by row
    for (int r = 0; r < R; ++r) {
      const int visible = std::min(nk, limit[r] - k0);
      const int first = std::max(0, low[r] - k0);  // keys of the block before the window
      if (visible <= first) continue;
      float* s = &scores[static_cast<size_t>(r) * kBlockKeys];
      if (p.softcap > 0.0f) {
        const float cap = p.softcap, inv = 1.0f / p.softcap;
        for (int j = first; j < visible; ++j) s[j] = cap * std::tanh(s[j] * inv);
      }
      float block_max = kNegInf;
      for (int j = first; j < visible; ++j) block_max = std::max(block_max, s[j]);
      const float new_max = std::max(m[r], block_max);
      const float alpha = m[r] == kNegInf ? 0.0f : exp_nonpositive(m[r] - new_max);
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int j = first; j < visible; ++j) {
        const float e = exp_nonpositive(s[j] - new_max);
        s[j] = e;
        sum += e;
      }
      l[r] = l[r] * alpha + sum;
      m[r] = new_max;
      float* a = &acc[static_cast<size_t>(r) * D];
      if (alpha != 1.0f) {
#pragma omp simd
        for (int d = 0; d < D; ++d) a[d] *= alpha;
      }
      // the row's accumulator lives in registers over the block's keys (head_dim / 16
      // independent FMA chains), stored once
      constexpr int kChunks = kHeadDim > 0 ? kHeadDim / 16 : kMaxHeadDim / 16;
      const int chunks = D / 16;  // head_dim is a multiple of 16 (checked)
      v16 t[kChunks];
      for (int c = 0; c < chunks; ++c) t[c] = load16(a + 16 * c);
      for (int j = first; j < visible; ++j) {
        const float pj = s[j];
        const float* vj = &vb[j * D];
        for (int c = 0; c < chunks; ++c) t[c] += pj * load16(vj + 16 * c);
      }
      for (int c = 0; c < chunks; ++c) store16(a + 16 * c, t[c]);
    }
  }

  for (int r = 0; r < R; ++r) {
    const float* a = &acc[static_cast<size_t>(r) * D];
    if (u.partial < 0) {
      const int qi = r / G, g = r % G;
      const int64_t token = p.q_start[u.req] + u.q_begin + qi;
      const int64_t head = u.kv_head * G + g;
      store_row(a, out + (token * p.num_heads + head) * D, D, l[r] > 0.0f ? 1.0f / l[r] : 0.0f);
    } else {
      const int64_t row = u.partial + r;
      std::memcpy(part_acc + row * D, a, sizeof(float) * D);
      part_ml[row * 2] = m[r];
      part_ml[row * 2 + 1] = l[r];
    }
  }
}

template <typename scalar_t, typename cache_t>
void run_unit_any(const Problem& p, const Unit& u, const scalar_t* q, const cache_t* k_cache,
                  const cache_t* v_cache, scalar_t* out, float* part_acc, float* part_ml) {
  switch (p.head_dim) {
    case 64: return run_unit<scalar_t, cache_t, 64>(p, u, q, k_cache, v_cache, out, part_acc, part_ml);
    case 128: return run_unit<scalar_t, cache_t, 128>(p, u, q, k_cache, v_cache, out, part_acc, part_ml);
    case 256: return run_unit<scalar_t, cache_t, 256>(p, u, q, k_cache, v_cache, out, part_acc, part_ml);
    default: return run_unit<scalar_t, cache_t, 0>(p, u, q, k_cache, v_cache, out, part_acc, part_ml);
  }
}

// Merge the key chunks of one query block (split-KV) into the output.
template <typename scalar_t>
void merge_chunks(const Problem& p, const Unit& first, int64_t rows, const float* part_acc,
                  const float* part_ml, scalar_t* out) {
  const int D = static_cast<int>(p.head_dim);
  const int G = static_cast<int>(p.group);
  std::vector<float> a(D);
  for (int64_t r = 0; r < rows; ++r) {
    float peak = kNegInf;
    for (int c = 0; c < first.num_chunks; ++c)
      peak = std::max(peak, part_ml[(first.partial + c * rows + r) * 2]);
    std::fill(a.begin(), a.end(), 0.0f);
    float total = 0.0f;
    if (peak != kNegInf) {
      for (int c = 0; c < first.num_chunks; ++c) {
        const int64_t row = first.partial + c * rows + r;
        const float mc = part_ml[row * 2];
        if (mc == kNegInf) continue;
        const float w = std::exp(mc - peak);
        total += part_ml[row * 2 + 1] * w;
        const float* src = part_acc + row * D;
#pragma omp simd
        for (int d = 0; d < D; ++d) a[d] += w * src[d];
      }
    }
    const int qi = static_cast<int>(r / G), g = static_cast<int>(r % G);
    const int64_t token = p.q_start[first.req] + first.q_begin + qi;
    const int64_t head = first.kv_head * G + g;
    store_row(a.data(), out + (token * p.num_heads + head) * D, D, total > 0.0f ? 1.0f / total : 0.0f);
  }
}

// Contiguous runs of units of about equal cost, one run per thread.
std::vector<int64_t> balance(const std::vector<Unit>& units, int64_t parts) {
  int64_t total = 0;
  for (const auto& u : units) total += u.cost;
  std::vector<int64_t> bounds(parts + 1, static_cast<int64_t>(units.size()));
  bounds[0] = 0;
  int64_t acc = 0, part = 1;
  for (size_t i = 0; i < units.size() && part < parts; ++i) {
    acc += units[i].cost;
    while (part < parts && acc * parts >= total * part) bounds[part++] = static_cast<int64_t>(i) + 1;
  }
  return bounds;
}

at::Tensor paged_attention(const at::Tensor& q_in, const at::Tensor& k_cache,
                           const at::Tensor& v_cache, const at::Tensor& req_to_token,
                           const at::Tensor& req_pool_indices, const at::Tensor& prefix_lens,
                           const at::Tensor& extend_lens, double scale, int64_t kv_chunk,
                           int64_t query_block, int64_t window,
                           const c10::optional<at::Tensor>& sinks, double softcap) {
  TORCH_CHECK(q_in.dim() == 3, "q must be [tokens, heads, head_dim]");
  TORCH_CHECK(k_cache.dim() == 3 && v_cache.sizes() == k_cache.sizes(),
              "k_cache and v_cache must be [slots, kv_heads, head_dim]");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type(), "k and v caches differ in dtype");
  TORCH_CHECK(req_to_token.scalar_type() == at::kInt && req_to_token.dim() == 2,
              "req_to_token must be a 2-D int32 table");
  TORCH_CHECK(req_to_token.stride(1) == 1, "req_to_token rows must be contiguous");
  TORCH_CHECK(kv_chunk >= kBlockKeys && kv_chunk % kBlockKeys == 0 && query_block >= 1,
              "kv_chunk must be a multiple of 32 and query_block >= 1");
  const at::Tensor q = q_in.contiguous();
  const at::Tensor rows = req_pool_indices.to(at::kLong).contiguous();
  const at::Tensor prefix = prefix_lens.to(at::kLong).contiguous();
  const at::Tensor extend = extend_lens.to(at::kLong).contiguous();
  const int64_t num_reqs = rows.numel();
  TORCH_CHECK(prefix.numel() == num_reqs && extend.numel() == num_reqs, "per-request sizes differ");
  const int64_t num_heads = q.size(1), head_dim = q.size(2);
  const int64_t num_kv_heads = k_cache.size(1);
  TORCH_CHECK(k_cache.size(2) == head_dim && head_dim <= kMaxHeadDim && head_dim % 16 == 0,
              "head_dim must match the cache, be a multiple of 16 and at most 256");
  TORCH_CHECK(num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads");
  const int64_t group = num_heads / num_kv_heads;
  TORCH_CHECK(window >= 0, "window must be >= 0 (0: full attention)");
  TORCH_CHECK(softcap >= 0.0, "softcap must be >= 0 (0: off)");
  at::Tensor sink_values;
  if (sinks.has_value()) {
    sink_values = sinks->to(at::kFloat).contiguous();
    TORCH_CHECK(sink_values.numel() == num_heads, "sinks must hold one logit per query head");
  }

  const int64_t* pre = prefix.data_ptr<int64_t>();
  const int64_t* ext = extend.data_ptr<int64_t>();
  std::vector<int64_t> q_start(num_reqs + 1, 0);
  for (int64_t i = 0; i < num_reqs; ++i) {
    TORCH_CHECK(pre[i] >= 0 && ext[i] >= 0, "negative prefix or extend length");
    TORCH_CHECK(pre[i] + ext[i] <= req_to_token.size(1), "sequence longer than req_to_token row");
    q_start[i + 1] = q_start[i] + ext[i];
  }
  TORCH_CHECK(q_start[num_reqs] <= q.size(0), "fewer query tokens than extend_lens sum");

  // units, ordered by request, KV head, query block, key chunk
  std::vector<Unit> units;
  int64_t partial_rows = 0;
  for (int64_t i = 0; i < num_reqs; ++i) {
    for (int64_t h = 0; h < num_kv_heads; ++h) {
      for (int64_t qb = 0; qb < ext[i]; qb += query_block) {
        const int64_t qe = std::min(ext[i], qb + query_block);
        const int64_t keys = pre[i] + qe;  // the block's last query sees this many keys
        // the block's first query sees from here on (0 without a window)
        // key blocks start at whole multiples of kBlockKeys and chunks at whole multiples of
        // kv_chunk, so a query's keys are grouped alike in a prefill, a chunk or a decode
        const int64_t k_lo = (window > 0 ? std::max<int64_t>(0, pre[i] + qb + 1 - window) : 0)
                             / kBlockKeys * kBlockKeys;
        const int64_t c_first = k_lo / kv_chunk;
        const int64_t chunks = (keys - 1) / kv_chunk - c_first + 1;
        const int64_t block_rows = (qe - qb) * group;
        for (int64_t c = 0; c < chunks; ++c) {
          Unit u;
          u.req = static_cast<int32_t>(i);
          u.kv_head = static_cast<int32_t>(h);
          u.q_begin = static_cast<int32_t>(qb);
          u.q_end = static_cast<int32_t>(qe);
          u.k_begin = static_cast<int32_t>(std::max(k_lo, (c_first + c) * kv_chunk));
          u.k_end = static_cast<int32_t>(std::min(keys, (c_first + c + 1) * kv_chunk));
          u.chunk = static_cast<int32_t>(c);
          u.num_chunks = static_cast<int32_t>(chunks);
          u.partial = chunks > 1 ? partial_rows + c * block_rows : -1;
          u.cost = block_rows * (u.k_end - u.k_begin) + 64 * block_rows;
          units.push_back(u);
        }
        if (chunks > 1) partial_rows += chunks * block_rows;
      }
    }
  }

  at::Tensor out = at::zeros_like(q);  // rows past the requests' tokens (padding) stay zero
  if (units.empty()) return out;
  std::vector<float> part_acc(static_cast<size_t>(partial_rows) * head_dim);
  std::vector<float> part_ml(static_cast<size_t>(partial_rows) * 2);

  Problem p;
  p.num_heads = num_heads;
  p.num_kv_heads = num_kv_heads;
  p.head_dim = head_dim;
  p.group = group;
  p.scale = static_cast<float>(scale);
  p.prefix = pre;
  p.extend = ext;
  p.q_start = q_start.data();
  p.pool_rows = rows.data_ptr<int64_t>();
  p.req_to_token = req_to_token.data_ptr<int32_t>();
  p.req_to_token_stride = req_to_token.stride(0);
  p.cache_stride = num_kv_heads * head_dim;
  p.window = window;
  p.sinks = sinks.has_value() ? sink_values.data_ptr<float>() : nullptr;
  p.softcap = static_cast<float>(softcap);
  p.kv_chunk = kv_chunk;

  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), units.size()));
  const std::vector<int64_t> bounds = balance(units, threads);

  sluice_cpu::dispatch_float_or_bf16(q.scalar_type(), "q", [&](auto q_type) {
    using scalar_t = decltype(q_type);
    sluice_cpu::dispatch_float_or_bf16(k_cache.scalar_type(), "the KV cache", [&](auto kv_type) {
      using cache_t = decltype(kv_type);
      at::parallel_for(0, threads, 1, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t)
          for (int64_t i = bounds[t]; i < bounds[t + 1]; ++i)
            run_unit_any<scalar_t, cache_t>(p, units[i], q.data_ptr<scalar_t>(),
              k_cache.data_ptr<cache_t>(), v_cache.data_ptr<cache_t>(),
              out.data_ptr<scalar_t>(), part_acc.data(), part_ml.data());
      });
    });
  });

  if (partial_rows == 0) return out;
  std::vector<int64_t> firsts;  // the first unit of every split query block
  for (size_t i = 0; i < units.size(); ++i)
    if (units[i].partial >= 0 && units[i].chunk == 0) firsts.push_back(static_cast<int64_t>(i));
  sluice_cpu::dispatch_float_or_bf16(q.scalar_type(), "q", [&](auto q_type) {
    using scalar_t = decltype(q_type);
    at::parallel_for(0, firsts.size(), 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const Unit& u = units[firsts[i]];
        merge_chunks<scalar_t>(p, u, (u.q_end - u.q_begin) * group, part_acc.data(),
                               part_ml.data(), out.data_ptr<scalar_t>());
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(sluice_cpu, m) {
  m.def(
      "paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor req_to_token, "
      "Tensor req_pool_indices, Tensor prefix_lens, Tensor extend_lens, float scale, "
      "int kv_chunk, int query_block, int window=0, Tensor? sinks=None, float softcap=0.0) -> Tensor");
}

TORCH_LIBRARY_IMPL(sluice_cpu, CPU, m) {
  m.impl("paged_attention", &paged_attention);
}
