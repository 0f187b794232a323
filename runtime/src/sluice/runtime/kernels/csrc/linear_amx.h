// linear.cpp's amx path.
#pragma once

#include <sys/syscall.h>
#include <unistd.h>

#include "linear_vnni.h"

namespace {

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
  const __m512 scale = p.w_scale != nullptr ? _mm512_loadu_ps(p.w_scale + n0) : _mm512_setzero_ps();
  for (int64_t i = 0; i < rows; ++i) {
    __m512 v = _mm512_load_ps(c + 16 * i);
    if (p.w_scale != nullptr) v = _mm512_mul_ps(v, scale);
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
  // bf16 weights are read in place; the last N % 32 rows from a padded copy. int8 weights
  // are widened to bf16 a panel at a time, into the thread's scratch (zero past N).
  const bool int8 = p.w8 != nullptr;
  const int64_t full = int8 ? 0 : p.N / 32 * 32;
  uint16_t* tail = scratch<uint16_t, 3>(32 * p.K);
  if (!int8) {
    std::memset(tail, 0, 2 * 32 * p.K);
    for (int64_t n = full; n < p.N; ++n)
      std::memcpy(&tail[(n - full) * p.K], p.w + n * p.w_stride, 2 * p.K);
  }
  const int64_t panels = (p.N + 31) / 32;
  for_column_blocks(panels, [&](int64_t b, int64_t e) {
    configure_tiles();
    alignas(64) float c[4][256];
    uint16_t* widened = int8 ? scratch<uint16_t, 4>(32 * p.K) : nullptr;
    for (int64_t panel = b; panel < e; ++panel) {
      const int64_t n0 = panel * 32;
      if (int8) {
        for (int64_t r = 0; r < 32; ++r)
          for (int64_t k = 0; k < p.K; k += 32) {
            const __m512i v =
                n0 + r < p.N
                    ? int8_to_bf16(p.w8 + (n0 + r) * p.w_stride + k, p.w8_scale[(n0 + r) * kb + k / 32])
                    : _mm512_setzero_si512();
            _mm512_storeu_si512(widened + r * p.K + k, v);
          }
      }
      const uint16_t* a = int8 ? widened : n0 < full ? p.w + n0 * p.w_stride : tail;
      const int64_t a_stride = 2 * (!int8 && n0 < full ? p.w_stride : p.K);
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

}  // namespace
