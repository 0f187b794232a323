// What every path of `linear.cpp` shares: the problem, the output stores (bias, rounding),
// per-thread scratch, and the split of the weight's rows over threads. Included by
// linear.cpp only (one translation unit).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <immintrin.h>

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

using bf16 = c10::BFloat16;

struct Problem {
  const uint16_t* x;  // [M][K] bf16 bits
  const uint16_t* w;  // [N][K]
  const float* bias;  // [N] or null (fp32 copy of the bias)
  void* out;          // [M][N]
  bool out_fp32;
  int64_t M, N, K;
  int64_t x_stride, w_stride;  // elements between rows
  // int8 weights (W8A16) replace `w`, packed at load in AMX tiles: `w8` [N / 16][K / 32][16][32]
  // (a tile of 16 weight rows by one group of 32 inputs, 512 contiguous bytes) and `w8_scale`
  // [N / 16][K / 32][16], one scale per row and group (N rounded up to 16, the padding rows
  // zero with scale zero). A weight is widened to bf16(w8 * scale) as it is read: what the bf16
  // path would read from those bf16 weights.
  const int8_t* w8 = nullptr;
  const float* w8_scale = nullptr;
  // output n scaled by w_scale[n] before the bias (unused by the paths here: kept null)
  const float* w_scale = nullptr;
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
  if (p.w_scale != nullptr) v *= p.w_scale[n];
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
  if (p.w_scale != nullptr) val = _mm512_mul_ps(val, _mm512_maskz_loadu_ps(mask, p.w_scale + n0));
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
// Aligned to a cache line, so a tile row or a vector store never straddles two.
template <typename T, int kSlot>
T* scratch(size_t n) {
  static thread_local std::vector<T> buffer;
  const size_t pad = 64 / sizeof(T);
  if (buffer.size() < n + pad) buffer.resize(n + pad);
  const auto address = reinterpret_cast<uintptr_t>(buffer.data());
  return reinterpret_cast<T*>((address + 63) & ~uintptr_t(63));
}

// ---- the weight's columns split over threads; rows in chunks that stay in cache ----------

template <typename F>
void for_column_blocks(int64_t blocks, F&& body) {
  at::parallel_for(0, blocks, 1, [&](int64_t b, int64_t e) { body(b, e); });
}

}  // namespace
