// Row-invariant bf16 linear layers for the CPU: y = x W^T (+ b), accumulated in fp32, written
// as bf16 or fp32 (the LM head's logits).
//
// Why not torch's own bf16 GEMM: oneDNN picks its kernel by the shape, and on a CPU with
// native bf16 its kernels sum K in different orders (measured on SmolLM2's shapes with AMX:
// rows 1-32, 33-47, 48-299 and 300+ each round some outputs differently). So a token's hidden
// state depended on how many tokens shared its forward: the last prompt token computed after
// a cached prefix (one row) differed from the same token in the whole prompt's prefill, and a
// near-tie in the logits flipped the greedy answer.
//
// Here every output element y[m][n] is one fixed sequence of operations over k = 0..K-1, the
// same whatever M is, whichever thread computes it and whatever else shares the call; so a
// row's result depends on that row alone (cache-, chunk- and batch-invariant). The path is
// chosen once per process from the CPU (never from the shape):
//   amx:        tiles of 16 x 32 bf16, TDPBF16PS (per element: fp32, k in pairs, in order);
//               rows are the A operand and the weight is packed per call into B tiles, or,
//               for at most 16 rows, the weight is the A operand read in place and the rows
//               the B operand. Both orders compute each element by the same instruction
//               sequence (the product is commutative, the k order the same);
//               `tests/kernels/test_linear_kernel.py` checks that they agree bit for bit.
//   avx512bf16: VDPBF16PS (per element: fp32, k in pairs, in order), each row's k-pairs
//               broadcast against the weight packed per call into VNNI blocks.
//   avx2:       bf16 widened to fp32, FMA into 8 lanes over k, then one fixed reduction tree
//               (CPUs without native bf16, where `--dtype auto` picks fp32 anyway).
// Memory traffic is the weight read once per call (the LM head: one pass over the
// embedding matrix, in place, with no fp32 copy).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

// each element's sums must stay in the order written (the extension builds with
// -fassociative-math for the other kernels)
#pragma GCC optimize("no-associative-math")

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define SLUICE_LINEAR_AMX 1
#endif
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#define SLUICE_LINEAR_AVX512BF16 1
#endif
#if defined(__AVX2__) && defined(__FMA__)
#define SLUICE_LINEAR_AVX2 1
#endif

namespace {

enum Path : int64_t { kAvx2 = 0, kAvx512Bf16 = 1, kAmx = 2 };

// up to this many rows the amx path reads the weight in place as A (measured on SmolLM2's
// shapes: faster up to 128 rows); past it, the weight is packed per chunk of rows as B
constexpr int64_t kAmxWeightAsAMaxRows = 128;

using bf16 = c10::BFloat16;

struct Problem {
  const uint16_t* x;  // [M][K] bf16 bits
  const uint16_t* w;  // [N][K]
  const float* bias;  // [N] or null (fp32 copy of the bias)
  void* out;          // [M][N]
  bool out_fp32;
  int64_t M, N, K;
  int64_t x_stride, w_stride;  // elements between rows
};

inline uint16_t to_bf16_bits(float f) {
  // round to nearest even, as c10::BFloat16 and VCVTNEPS2BF16 do (NaN stays NaN)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// One output value: + bias, then stored as the output dtype.
inline void store_one(const Problem& p, int64_t m, int64_t n, float v) {
  if (p.bias != nullptr) v += p.bias[n];
  if (p.out_fp32)
    static_cast<float*>(p.out)[m * p.N + n] = v;
  else
    static_cast<uint16_t*>(p.out)[m * p.N + n] = to_bf16_bits(v);
}

// Output row m, columns n0..n0+count-1 from 16 fp32 values (count <= 16); the same
// arithmetic as `store_one`, 16 at a time.
inline void store_row16(const Problem& p, int64_t m, int64_t n0, int count, const float* v) {
#ifdef __AVX512F__
  const __mmask16 mask = count >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << count) - 1);
  __m512 val = _mm512_loadu_ps(v);
  if (p.bias != nullptr) val = _mm512_add_ps(val, _mm512_maskz_loadu_ps(mask, p.bias + n0));
  if (p.out_fp32) {
    _mm512_mask_storeu_ps(static_cast<float*>(p.out) + m * p.N + n0, mask, val);
    return;
  }
#ifdef __AVX512BF16__
  _mm256_mask_storeu_epi16(static_cast<uint16_t*>(p.out) + m * p.N + n0, mask,
                           (__m256i)_mm512_cvtneps_pbh(val));
#else
  const __m512i u = _mm512_castps_si512(val);
  const __m512i high = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(
      _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(val, val, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(high, _mm512_set1_epi32(0x40)));
  _mm256_mask_storeu_epi16(static_cast<uint16_t*>(p.out) + m * p.N + n0, mask,
                           _mm512_cvtepi32_epi16(r));
#endif
#else
  for (int i = 0; i < count; ++i) store_one(p, m, n0 + i, v[i]);
#endif
}

// Scratch memory of the calling thread, kept between calls: a fresh buffer of a megabyte
// each call would cost more in page faults and zeroing than the copy it holds. Not zeroed.
template <typename T, int kSlot>
T* scratch(size_t n) {
  static thread_local std::vector<T> buffer;
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}

// ---- the weight's columns split over threads; rows in chunks that stay in cache ----------

template <typename F>
void for_column_blocks(int64_t blocks, F&& body) {
  at::parallel_for(0, blocks, 1, [&](int64_t b, int64_t e) { body(b, e); });
}

#ifdef SLUICE_LINEAR_AVX2
// ---- avx2: widen bf16 to fp32, 8 lanes over k ---------------------------------------------

inline __m256 widen8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline float reduce8(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// acc[i][j] over all of k for rows m0..m0+MR-1 and weight rows n0..n0+NR-1; the k tail
// (K % 8) goes through a zero-padded copy, so every element sees the same steps.
template <int MR, int NR>
void avx2_block(const Problem& p, int64_t m0, int64_t n0) {
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  const int64_t K8 = p.K / 8 * 8;
  for (int64_t k = 0; k < K8; k += 8) {
    __m256 xv[MR];
    for (int i = 0; i < MR; ++i) xv[i] = widen8(p.x + (m0 + i) * p.x_stride + k);
    for (int j = 0; j < NR; ++j) {
      const __m256 wv = widen8(p.w + (n0 + j) * p.w_stride + k);
      for (int i = 0; i < MR; ++i) acc[i][j] = _mm256_fmadd_ps(xv[i], wv, acc[i][j]);
    }
  }
  if (K8 < p.K) {
    alignas(32) uint16_t xt[MR][8] = {}, wt[NR][8] = {};
    const int64_t tail = p.K - K8;
    for (int i = 0; i < MR; ++i) std::memcpy(xt[i], p.x + (m0 + i) * p.x_stride + K8, 2 * tail);
    for (int j = 0; j < NR; ++j) std::memcpy(wt[j], p.w + (n0 + j) * p.w_stride + K8, 2 * tail);
    for (int j = 0; j < NR; ++j) {
      const __m256 wv = widen8(wt[j]);
      for (int i = 0; i < MR; ++i) acc[i][j] = _mm256_fmadd_ps(widen8(xt[i]), wv, acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) store_one(p, m0 + i, n0 + j, reduce8(acc[i][j]));
}
#endif

#ifdef SLUICE_LINEAR_AVX512BF16
// ---- shared by avx512bf16 and amx: VNNI packing ----------------------------------------------

// 16 x 16 dwords: out[c][r] = in[r][c] (a dword is a k-pair of bf16, or an fp32)
inline void transpose16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 4; ++g) {  // u[4g + j], lane L: column 4L + j of rows 4g..4g+3
    u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g + 0], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g + 0], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x44);
    const __m512i v1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xEE);
    const __m512i w0 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x44);
    const __m512i w1 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xEE);
    r[0 + j] = _mm512_shuffle_i32x4(v0, w0, 0x88);
    r[4 + j] = _mm512_shuffle_i32x4(v0, w0, 0xDD);
    r[8 + j] = _mm512_shuffle_i32x4(v1, w1, 0x88);
    r[12 + j] = _mm512_shuffle_i32x4(v1, w1, 0xDD);
  }
}

// A VNNI block (an AMX B tile) from 16 rows of a [rows][K] bf16 matrix at column k: tile[q][j]
// = the k-pair q of row j; rows past `valid` and columns past `cols` (of 32) are zero.
inline void pack_b_tile(const uint16_t* src, int64_t stride, int64_t valid, uint32_t* tile,
                        int64_t cols = 32) {
  const __mmask32 mask = cols >= 32 ? ~__mmask32(0) : (__mmask32(1) << cols) - 1;
  __m512i r[16];
  for (int j = 0; j < 16; ++j)
    r[j] = j < valid ? _mm512_maskz_loadu_epi16(mask, src + j * stride) : _mm512_setzero_si512();
  transpose16(r);
  for (int q = 0; q < 16; ++q) _mm512_storeu_si512(tile + 16 * q, r[q]);
}

// `vectors` x 16 weight rows from row n0 as VNNI blocks: block (k, j) at (k * vectors + j) *
// 256 dwords holds rows n0 + 16 j .. + 15 at k-block k (zero past N and past K)
inline void pack_weight_panel(const Problem& p, int64_t n0, int vectors, uint32_t* panel) {
  const int64_t kb = (p.K + 31) / 32;
  for (int64_t k = 0; k < kb; ++k)
    for (int j = 0; j < vectors; ++j)
      pack_b_tile(p.w + (n0 + 16 * j) * p.w_stride + 32 * k, p.w_stride,
                  std::max<int64_t>(0, std::min<int64_t>(16, p.N - n0 - 16 * j)),
                  panel + (k * vectors + j) * 256, std::min<int64_t>(32, p.K - 32 * k));
}

// ---- avx512bf16: VDPBF16PS, acc += a[2q] b[2q] + a[2q+1] b[2q+1] for the k-pairs q in order --
// Each row's k-pair broadcast against 64 columns of the weight, packed per call into VNNI
// blocks (one pass over the weight). Broadcasting the weight against packed rows instead was
// measured slower even for one row (16 lanes of work for one useful one).

inline int64_t pairs_of(int64_t K) { return (K + 1) / 2; }

// k-pair q of a bf16 row as one dword (its second half zero past K)
inline uint32_t pair_at(const uint16_t* row, int64_t q, int64_t K) {
  if (2 * q + 1 < K) {
    uint32_t v;
    std::memcpy(&v, row + 2 * q, 4);
    return v;
  }
  return row[2 * q];
}

// Rows broadcast: MR rows x 64 columns (four 16-column vectors of a packed panel).
template <int MR>
void dp_rows_block(const Problem& p, const uint32_t* panel, int64_t m0, int64_t n0) {
  __m512 acc[MR][4];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_setzero_ps();
  const int64_t P = pairs_of(p.K);
  for (int64_t q = 0; q < P; ++q) {
    const uint32_t* block = panel + (q / 16) * 4 * 256 + (q % 16) * 16;
    __m512bh w[4];
    for (int j = 0; j < 4; ++j) w[j] = (__m512bh)_mm512_loadu_si512(block + j * 256);
    for (int i = 0; i < MR; ++i) {
      const __m512bh x = (__m512bh)_mm512_set1_epi32(
          static_cast<int>(pair_at(p.x + (m0 + i) * p.x_stride, q, p.K)));
      for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], x, w[j]);
    }
  }
  alignas(64) float row[16];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 4; ++j) {
      const int64_t n = n0 + 16 * j;
      if (n >= p.N) break;
      _mm512_store_ps(row, acc[i][j]);
      store_row16(p, m0 + i, n, static_cast<int>(std::min<int64_t>(16, p.N - n)), row);
    }
}

void dp_rows_broadcast(const Problem& p) {
  const int64_t kb = (p.K + 31) / 32;
  const int64_t panels = (p.N + 63) / 64;
  for_column_blocks(panels, [&](int64_t b, int64_t e) {
    uint32_t* panel = scratch<uint32_t, 4>(static_cast<size_t>(kb) * 4 * 256);
    for (int64_t pn = b; pn < e; ++pn) {
      const int64_t n0 = pn * 64;
      pack_weight_panel(p, n0, 4, panel);
      int64_t m = 0;
      for (; m + 6 <= p.M; m += 6) dp_rows_block<6>(p, panel, m, n0);
      switch (p.M - m) {
        case 5: dp_rows_block<5>(p, panel, m, n0); break;
        case 4: dp_rows_block<4>(p, panel, m, n0); break;
        case 3: dp_rows_block<3>(p, panel, m, n0); break;
        case 2: dp_rows_block<2>(p, panel, m, n0); break;
        case 1: dp_rows_block<1>(p, panel, m, n0); break;
        default: break;
      }
    }
  });
}

#endif

// Blocks of MR x NR outputs over a range of weight rows, for every row of x; tails take
// smaller blocks (each element's steps do not depend on its block).
template <template <int, int> class Kernel>
void dot_product_linear(const Problem& p) {
  constexpr int64_t kN = 16;  // weight rows per parallel unit
  const int64_t blocks = (p.N + kN - 1) / kN;
  constexpr int64_t kChunkM = 64;
  for_column_blocks(blocks, [&](int64_t b, int64_t e) {
    for (int64_t mc = 0; mc < p.M; mc += kChunkM) {
      const int64_t m_end = std::min(p.M, mc + kChunkM);
      for (int64_t nb = b; nb < e; ++nb) {
        const int64_t n_lo = nb * kN, n_hi = std::min(p.N, n_lo + kN);
        int64_t m = mc;
        for (; m + 4 <= m_end; m += 4) {
          int64_t n = n_lo;
          for (; n + 4 <= n_hi; n += 4) Kernel<4, 4>::run(p, m, n);
          for (; n < n_hi; ++n) Kernel<4, 1>::run(p, m, n);
        }
        for (; m < m_end; ++m) {
          int64_t n = n_lo;
          for (; n + 4 <= n_hi; n += 4) Kernel<1, 4>::run(p, m, n);
          for (; n < n_hi; ++n) Kernel<1, 1>::run(p, m, n);
        }
      }
    }
  });
}

#ifdef SLUICE_LINEAR_AVX2
template <int MR, int NR>
struct Avx2Kernel {
  static void run(const Problem& p, int64_t m, int64_t n) { avx2_block<MR, NR>(p, m, n); }
};
#endif

#ifdef SLUICE_LINEAR_AMX
// ---- amx ------------------------------------------------------------------------------------

bool amx_permitted() {
  // Linux hands out the tile state only on request (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
  static const bool ok = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return ok;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// every tile 16 rows of 64 bytes: C tiles 16 x 16 fp32, A tiles 16 x 32 bf16, B tiles 16
// k-pairs x 16 columns x 2 bf16
inline void configure_tiles() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
}

// c[2 i + j] = A_i . B_j over all of K, in k order: A_0, A_1 the 16-row tiles at `a` and
// 16 rows below (`a_stride` bytes a row), B_0, B_1 VNNI tiles at b0, b1, `b_step` dwords
// from one k-block to the next. Both operand orders run through here.
inline void amx_tile_block(const uint16_t* a, int64_t a_stride, const uint32_t* b0,
                           const uint32_t* b1, int64_t b_step, int64_t kb, float (*c)[256]) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t k = 0; k < kb; ++k) {
    _tile_loadd(4, a + 32 * k, a_stride);
    _tile_loadd(5, a + 16 * (a_stride / 2) + 32 * k, a_stride);
    _tile_loadd(6, b0 + k * b_step, 64);
    _tile_loadd(7, b1 + k * b_step, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c[0], 64);
  _tile_stored(1, c[1], 64);
  _tile_stored(2, c[2], 64);
  _tile_stored(3, c[3], 64);
}

// A C tile's rows to the output: full 16-column tiles take a short loop (the same bias add
// and rounding as `store_row16`, which the other order uses), the rest `store_row16`.
inline void store_c_rows(const Problem& p, const float* c, int64_t m0, int64_t rows,
                         int64_t n0) {
  const int cols = static_cast<int>(std::min<int64_t>(16, p.N - n0));
  if (cols < 16) {
    for (int64_t i = 0; i < rows; ++i) store_row16(p, m0 + i, n0, cols, c + 16 * i);
    return;
  }
  const __m512 bias = p.bias != nullptr ? _mm512_loadu_ps(p.bias + n0) : _mm512_setzero_ps();
  for (int64_t i = 0; i < rows; ++i) {
    __m512 v = _mm512_load_ps(c + 16 * i);
    if (p.bias != nullptr) v = _mm512_add_ps(v, bias);
    if (p.out_fp32)
      _mm512_storeu_ps(static_cast<float*>(p.out) + (m0 + i) * p.N + n0, v);
    else
      _mm256_storeu_si256(
          reinterpret_cast<__m256i*>(static_cast<uint16_t*>(p.out) + (m0 + i) * p.N + n0),
          (__m256i)_mm512_cvtneps_pbh(v));
  }
}

// Rows as A (read in place, 32 at a time), the weight packed per call into B tiles.
void amx_rows_as_a(const Problem& p) {
  const int64_t kb = p.K / 32;
  const int64_t panels = (p.N + 31) / 32;
  constexpr int64_t kChunkM = 1024;
  // a padded copy of the last (M % 32) rows, so no tile load reads past x
  const int64_t full = p.M / 32 * 32;
  uint16_t* tail = scratch<uint16_t, 0>(32 * p.K);
  std::memset(tail, 0, 2 * 32 * p.K);
  for (int64_t m = full; m < p.M; ++m)
    std::memcpy(tail + (m - full) * p.K, p.x + m * p.x_stride, 2 * p.K);
  for_column_blocks(panels, [&](int64_t b, int64_t e) {
    configure_tiles();
    uint32_t* packed = scratch<uint32_t, 1>(static_cast<size_t>(kb) * 2 * 256);
    alignas(64) float c[4][256];
    for (int64_t mc = 0; mc < p.M; mc += kChunkM) {
      const int64_t m_end = std::min(p.M, mc + kChunkM);
      for (int64_t panel = b; panel < e; ++panel) {
        const int64_t n0 = panel * 32;
        pack_weight_panel(p, n0, 2, packed);
        for (int64_t m0 = mc; m0 < m_end; m0 += 32) {
          const uint16_t* a = m0 < full ? p.x + m0 * p.x_stride : tail;
          const int64_t a_stride = 2 * (m0 < full ? p.x_stride : p.K);
          amx_tile_block(a, a_stride, packed, packed + 256, 512, kb, c);
          const int64_t rows = std::min<int64_t>(32, p.M - m0);
          for (int h = 0; h < 2; ++h) {
            if (n0 + 16 * h >= p.N) continue;
            store_c_rows(p, c[h], m0, std::min<int64_t>(16, rows), n0 + 16 * h);
            if (rows > 16) store_c_rows(p, c[2 + h], m0 + 16, rows - 16, n0 + 16 * h);
          }
        }
      }
    }
    _tile_release();
  });
}

// The weight as A (read in place, 32 weight rows at a time), the rows packed once per call
// into B tiles (16 rows each); each C tile is [weight row][x row], transposed on the way out.
// Cheaper than packing the weight when there are few rows (decode batches).
void amx_weight_as_a(const Problem& p) {
  const int64_t kb = p.K / 32;
  const int64_t groups = (p.M + 31) / 32 * 2;  // B tiles of 16 rows, an even number
  uint32_t* xt = scratch<uint32_t, 2>(static_cast<size_t>(groups) * kb * 256);
  at::parallel_for(0, groups * kb, 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t g = i / kb, k = i % kb;
      pack_b_tile(p.x + g * 16 * p.x_stride + 32 * k, p.x_stride,
                  std::max<int64_t>(0, std::min<int64_t>(16, p.M - 16 * g)), &xt[i * 256]);
    }
  });
  const int64_t full = p.N / 32 * 32;  // the last N % 32 weight rows: a padded copy
  uint16_t* tail = scratch<uint16_t, 3>(32 * p.K);
  std::memset(tail, 0, 2 * 32 * p.K);
  for (int64_t n = full; n < p.N; ++n)
    std::memcpy(&tail[(n - full) * p.K], p.w + n * p.w_stride, 2 * p.K);
  const int64_t panels = (p.N + 31) / 32;
  for_column_blocks(panels, [&](int64_t b, int64_t e) {
    configure_tiles();
    alignas(64) float c[4][256];
    for (int64_t panel = b; panel < e; ++panel) {
      const int64_t n0 = panel * 32;
      const uint16_t* a = n0 < full ? p.w + n0 * p.w_stride : tail;
      const int64_t a_stride = 2 * (n0 < full ? p.w_stride : p.K);
      for (int64_t g = 0; g < groups; g += 2) {
        amx_tile_block(a, a_stride, &xt[g * kb * 256], &xt[(g + 1) * kb * 256], 256, kb, c);
        for (int t = 0; t < 4; ++t) {  // c[t]: weight rows n0 + 16 (t / 2), x rows 16 (g + t % 2)
          const int64_t nh = n0 + 16 * (t / 2), m0 = 16 * (g + t % 2);
          if (nh >= p.N || m0 >= p.M) continue;
          __m512i r[16];
          for (int i = 0; i < 16; ++i) r[i] = _mm512_load_si512(c[t] + 16 * i);
          transpose16(r);  // r[i] = outputs nh..nh+15 of row m0 + i
          const int cols = static_cast<int>(std::min<int64_t>(16, p.N - nh));
          const int64_t rows = std::min<int64_t>(16, p.M - m0);
          alignas(64) float row[16];
          for (int64_t i = 0; i < rows; ++i) {
            _mm512_store_si512(row, r[i]);
            store_row16(p, m0 + i, nh, cols, row);
          }
        }
      }
    }
    _tile_release();
  });
}
#endif

bool path_available(int64_t path) {
  switch (path) {
#ifdef SLUICE_LINEAR_AMX
    case kAmx:
      return __builtin_cpu_supports("amx-bf16") && amx_permitted();
#endif
#ifdef SLUICE_LINEAR_AVX512BF16
    case kAvx512Bf16:
      return __builtin_cpu_supports("avx512bf16");
#endif
#ifdef SLUICE_LINEAR_AVX2
    case kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    default:
      return false;
  }
}

std::vector<int64_t> linear_paths() {
  std::vector<int64_t> out;
  for (int64_t path : {kAmx, kAvx512Bf16, kAvx2})
    if (path_available(path)) out.push_back(path);
  return out;
}

// The fastest path on this CPU; the amx path needs K in whole tiles (32), so a layer whose
// K is not takes the next one: a choice by the layer's fixed K, never by the row count.
int64_t best_path(int64_t K) {
  static const std::vector<int64_t> paths = linear_paths();
  for (int64_t path : paths)
    if (path != kAmx || K % 32 == 0) return path;
  return -1;
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight,
                  const c10::optional<at::Tensor>& bias, at::ScalarType out_dtype, int64_t path) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2, "x must be [rows, K] and weight [N, K]");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16,
              "x and weight must be bfloat16");
  TORCH_CHECK(x.size(1) == weight.size(1), "x and weight differ in K");
  TORCH_CHECK(out_dtype == at::kBFloat16 || out_dtype == at::kFloat,
              "the output dtype must be bfloat16 or float32");
  const at::Tensor xc = x.stride(1) == 1 ? x : x.contiguous();
  const at::Tensor wc = weight.stride(1) == 1 ? weight : weight.contiguous();
  at::Tensor b32;
  if (bias.has_value()) {
    TORCH_CHECK(bias->numel() == weight.size(0), "bias must hold one value per output");
    b32 = bias->to(at::kFloat).contiguous();
  }
  const int64_t M = xc.size(0), N = wc.size(0), K = xc.size(1);
  at::Tensor out = at::empty({M, N}, x.options().dtype(out_dtype));
  if (M == 0 || N == 0) return out;
  if (K == 0) return bias.has_value() ? out.copy_(b32.expand({M, N})) : out.zero_();
  if (path < 0) path = best_path(K);
  TORCH_CHECK(path_available(path), "linear path ", path, " is not available on this CPU");
  TORCH_CHECK(path != kAmx || K % 32 == 0, "the amx path needs K in multiples of 32");
  Problem p;
  p.x = reinterpret_cast<const uint16_t*>(xc.data_ptr<bf16>());
  p.w = reinterpret_cast<const uint16_t*>(wc.data_ptr<bf16>());
  p.bias = bias.has_value() ? b32.data_ptr<float>() : nullptr;
  p.out = out.data_ptr();
  p.out_fp32 = out_dtype == at::kFloat;
  p.M = M;
  p.N = N;
  p.K = K;
  p.x_stride = xc.stride(0);
  p.w_stride = wc.stride(0);
  switch (path) {
#ifdef SLUICE_LINEAR_AMX
    case kAmx:
      if (M <= kAmxWeightAsAMaxRows)
        amx_weight_as_a(p);
      else
        amx_rows_as_a(p);
      break;
#endif
#ifdef SLUICE_LINEAR_AVX512BF16
    case kAvx512Bf16:
      dp_rows_broadcast(p);
      break;
#endif
#ifdef SLUICE_LINEAR_AVX2
    case kAvx2:
      dot_product_linear<Avx2Kernel>(p);
      break;
#endif
    default:
      TORCH_CHECK(false, "no linear path");
  }
  return out;
}

// for tests: one of the amx path's two operand orders, whatever the row count (0: the rows
// as A, 1: the weight as A), fp32 out
at::Tensor linear_order(const at::Tensor& x, const at::Tensor& weight, int64_t path,
                        int64_t order) {
  TORCH_CHECK(path_available(path), "linear path ", path, " is not available on this CPU");
  TORCH_CHECK(x.is_contiguous() && weight.is_contiguous() && x.size(1) == weight.size(1) &&
                  x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16,
              "contiguous bf16 inputs of one K");
  at::Tensor out = at::empty({x.size(0), weight.size(0)}, x.options().dtype(at::kFloat));
  Problem p{reinterpret_cast<const uint16_t*>(x.data_ptr<bf16>()),
            reinterpret_cast<const uint16_t*>(weight.data_ptr<bf16>()), nullptr, out.data_ptr(),
            true, x.size(0), weight.size(0), x.size(1), x.stride(0), weight.stride(0)};
  switch (path) {
#ifdef SLUICE_LINEAR_AMX
    case kAmx:
      TORCH_CHECK(p.K % 32 == 0, "the amx path needs K in multiples of 32");
      if (order == 1)
        amx_weight_as_a(p);
      else
        amx_rows_as_a(p);
      return out;
#endif
    default:
      TORCH_CHECK(false, "path ", path, " has one order");
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(sluice_cpu, m) {
  m.def("linear(Tensor x, Tensor weight, Tensor? bias, ScalarType out_dtype, int path=-1) -> Tensor");
  m.def("linear_paths() -> int[]", &linear_paths);
  m.def("linear_order(Tensor x, Tensor weight, int path, int order) -> Tensor");
}

TORCH_LIBRARY_IMPL(sluice_cpu, CPU, m) {
  m.impl("linear", &linear);
  m.impl("linear_order", &linear_order);
}
