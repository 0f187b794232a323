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

// The rows as VNNI B tiles of 16 rows (zero past M), `groups` of them at each k-block, into the
// calling thread's scratch: tile (g, k) at (g * kb + k) * 256 dwords, or at (k * groups + g) * 256
// when `k_major` (one k-block's tiles adjacent)
inline const uint32_t* pack_rows_as_b(const Problem& p, int64_t groups, bool k_major) {
  const int64_t kb = p.K / 32;
  uint32_t* xt = scratch<uint32_t, 2>(static_cast<size_t>(groups) * kb * 256);
  at::parallel_for(0, groups * kb, 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t g = k_major ? i % groups : i / kb, k = k_major ? i / groups : i % kb;
      pack_b_tile(p.x + g * 16 * p.x_stride + 32 * k, p.x_stride,
                  std::max<int64_t>(0, std::min<int64_t>(16, p.M - 16 * g)), &xt[i * 256]);
    }
  });
  return xt;
}

// A C tile of [16 weight rows][16 x rows] (weight rows from nh, x rows from m0) to the output,
// transposed; tiles wholly past N or M are skipped
inline void store_transposed(const Problem& p, const float* c, int64_t nh, int64_t m0) {
  if (nh >= p.N || m0 >= p.M) return;
  __m512i r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_load_si512(c + 16 * i);
  transpose16(r);  // r[i] = outputs nh..nh+15 of row m0 + i
  const int cols = static_cast<int>(std::min<int64_t>(16, p.N - nh));
  const int64_t rows = std::min<int64_t>(16, p.M - m0);
  alignas(64) float row[16];
  for (int64_t i = 0; i < rows; ++i) {
    _mm512_store_si512(row, r[i]);
    store_row16(p, m0 + i, nh, cols, row);
  }
}

// The weight as A (read in place, 32 weight rows at a time), the rows packed once per call
// into B tiles (16 rows each); each C tile is [weight row][x row], transposed on the way out.
// Cheaper than packing the weight when there are few rows (decode batches).
void amx_weight_as_a(const Problem& p) {
  const int64_t kb = p.K / 32;
  const int64_t groups = (p.M + 31) / 32 * 2;  // B tiles of 16 rows, an even number
  const uint32_t* xt = pack_rows_as_b(p, groups, false);
  // the weight is read in place; the last N % 32 rows from a padded copy
  const int64_t full = p.N / 32 * 32;
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
        for (int t = 0; t < 4; ++t)  // c[t]: weight rows n0 + 16 (t / 2), x rows 16 (g + t % 2)
          store_transposed(p, c[t], n0 + 16 * (t / 2), 16 * (g + t % 2));
      }
    }
    _tile_release();
  });
}

// int8 weights as A, one tile of 16 weight rows at a time against up to four B tiles of 16 rows
// (64 rows a pass): C tile g = [weight rows n0..+15][rows 16 (g0 + g)..+15]. Each k-block's
// A tile is widened from its packed 512 bytes into the thread's scratch as the pass needs it
// (the first pass; later passes of more than 64 rows reread it), so the vector work of
// widening runs beside the tile products. Each element is the same TDPBF16PS sequence over
// the k-blocks in order as `amx_weight_as_a` on the widened weights.
void amx_w8_weight_as_a(const Problem& p) {
  const int64_t kb = p.K / 32;
  const int64_t groups = (p.M + 15) / 16;
  const uint32_t* xt = pack_rows_as_b(p, groups, true);
  const int64_t panels = (p.N + 15) / 16, last_tile = panels * kb;
  for_column_blocks(panels, [&](int64_t b, int64_t e) {
    configure_tiles();
    alignas(64) float c[4][256];
    uint16_t* widened = scratch<uint16_t, 4>(static_cast<size_t>(kb) * 512);
    for (int64_t panel = b; panel < e; ++panel) {
      for (int64_t g0 = 0; g0 < groups; g0 += 4) {
        const int64_t ng = std::min<int64_t>(4, groups - g0);
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        if (g0 == 0) widen_w8_tile(p, panel * kb, widened);
        for (int64_t k = 0; k < kb; ++k) {
          const uint16_t* a = widened + k * 512;
          // the next tile is widened one k-block ahead: a tile load waits for the stores it
          // reads to reach the cache (no forwarding), so it should read stores long done
          if (g0 == 0 && k + 1 < kb) {
            const int64_t next = panel * kb + k + 1;
            if (next + 8 < last_tile) {  // the weight 8 tiles ahead into L1
              const char* ahead = reinterpret_cast<const char*>(p.w8 + (next + 8) * 512);
              for (int line = 0; line < 8; ++line) _mm_prefetch(ahead + 64 * line, _MM_HINT_T0);
            }
            widen_w8_tile(p, next, widened + (k + 1) * 512);
          }
          const uint32_t* bt = xt + (k * groups + g0) * 256;
          _tile_loadd(4, a, 64);
          _tile_loadd(5, bt, 64);
          if (ng > 1) _tile_loadd(6, bt + 256, 64);
          if (ng > 2) _tile_loadd(7, bt + 512, 64);
          _tile_dpbf16ps(0, 4, 5);
          if (ng > 1) _tile_dpbf16ps(1, 4, 6);
          if (ng > 3) _tile_loadd(5, bt + 768, 64);  // tile 5 again, once its product is done
          if (ng > 2) _tile_dpbf16ps(2, 4, 7);
          if (ng > 3) _tile_dpbf16ps(3, 4, 5);
        }
        _tile_stored(0, c[0], 64);
        _tile_stored(1, c[1], 64);
        _tile_stored(2, c[2], 64);
        _tile_stored(3, c[3], 64);
        for (int64_t g = 0; g < ng; ++g) store_transposed(p, c[g], panel * 16, 16 * (g0 + g));
      }
    }
    _tile_release();
  });
}
#endif

}  // namespace
