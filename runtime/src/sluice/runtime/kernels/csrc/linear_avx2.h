// linear.cpp's avx2 path: bf16 widened to fp32, 8 lanes over k, then one fixed reduction
// tree, for CPUs without native bf16 (where `--dtype auto` picks fp32 anyway).
#pragma once

#include "linear_common.h"

namespace {

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

// Blocks of MR x NR outputs over a range of weight rows, for every row of x; tails take
// smaller blocks (each element's steps do not depend on its block).
void avx2_linear(const Problem& p) {
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
          for (; n + 4 <= n_hi; n += 4) avx2_block<4, 4>(p, m, n);
          for (; n < n_hi; ++n) avx2_block<4, 1>(p, m, n);
        }
        for (; m < m_end; ++m) {
          int64_t n = n_lo;
          for (; n + 4 <= n_hi; n += 4) avx2_block<1, 4>(p, m, n);
          for (; n < n_hi; ++n) avx2_block<1, 1>(p, m, n);
        }
      }
    }
  });
}
#endif

}  // namespace
