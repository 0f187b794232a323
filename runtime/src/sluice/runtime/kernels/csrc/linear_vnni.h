// linear.cpp's VNNI packing (AMX B tiles, AVX512-BF16 broadcast operands) and its
// avx512bf16 path.
#pragma once

#include "linear_common.h"

namespace {

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

// 32 int8 weights of one group as 32 bf16: bf16(w * scale), rounded to nearest even as torch's
// `.bfloat16()`
inline __m512i int8_to_bf16(const int8_t* src, float scale) {
  const __m512 s = _mm512_set1_ps(scale);
  const __m512 lo = _mm512_mul_ps(
      _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)))), s);
  const __m512 hi = _mm512_mul_ps(
      _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16)))), s);
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

// Tile `t` of packed int8 weights (16 rows by one group of 32 inputs, `Problem::w8`) widened
// to bf16 rows of 32: dst[j][0..31] = bf16(w8 * scale) of row j
inline void widen_w8_tile(const Problem& p, int64_t t, uint16_t* dst) {
  const int8_t* src = p.w8 + t * 512;
  const float* scales = p.w8_scale + t * 16;
  for (int j = 0; j < 16; ++j) _mm512_storeu_si512(dst + 32 * j, int8_to_bf16(src + 32 * j, scales[j]));
}

// `pack_b_tile` of packed int8 tile `t` (widened as `widen_w8_tile`)
inline void pack_b_tile_w8(const Problem& p, int64_t t, uint32_t* tile) {
  const int8_t* src = p.w8 + t * 512;
  const float* scales = p.w8_scale + t * 16;
  __m512i r[16];
  for (int j = 0; j < 16; ++j) r[j] = int8_to_bf16(src + 32 * j, scales[j]);
  transpose16(r);
  for (int q = 0; q < 16; ++q) _mm512_storeu_si512(tile + 16 * q, r[q]);
}

// `vectors` x 16 weight rows from row n0 as VNNI blocks: block (k, j) at (k * vectors + j) *
// 256 dwords holds rows n0 + 16 j .. + 15 at k-block k (zero past N and past K)
inline void pack_weight_panel(const Problem& p, int64_t n0, int vectors, uint32_t* panel) {
  const int64_t kb = (p.K + 31) / 32;
  for (int64_t k = 0; k < kb; ++k)
    for (int j = 0; j < vectors; ++j) {
      const int64_t valid = std::max<int64_t>(0, std::min<int64_t>(16, p.N - n0 - 16 * j));
      const int64_t cols = std::min<int64_t>(32, p.K - 32 * k);
      uint32_t* tile = panel + (k * vectors + j) * 256;
      if (p.w8 != nullptr && valid > 0)  // K is whole groups; rows past N are zero in memory
        pack_b_tile_w8(p, ((n0 + 16 * j) / 16) * kb + k, tile);
      else if (p.w8 != nullptr)
        std::memset(tile, 0, 1024);
      else
        pack_b_tile(p.w + (n0 + 16 * j) * p.w_stride + 32 * k, p.w_stride, valid, tile, cols);
    }
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

}  // namespace
