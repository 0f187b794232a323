// Helpers shared by the CPU kernels: bf16 <-> fp32 as torch rounds, an exp the compiler can
// vectorise, and the dispatch over the two dtypes the kernels take.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace sluice_cpu {

inline float to_f(float x) { return x; }
inline float to_f(c10::BFloat16 x) {
  uint32_t u = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// round to nearest even, as torch does (inputs here are finite)
inline uint32_t round_bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
}

inline void store(float x, float* dst) { *dst = x; }
inline void store(float x, c10::BFloat16* dst) {
  dst->x = static_cast<uint16_t>(round_bf16_bits(x) >> 16);
}

// exp(x) for x <= 0 (softmax arguments, exp(-|x|)): 2^n * e^r with a degree-7 Taylor
// polynomial on |r| <= ln2/2 (relative error < 1e-7); x below -87 gives 0.
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);
  const float n = std::nearbyint(x * 1.44269504088896341f);
  const float r = x - n * 0.693145751953125f - n * 1.428606765330187045e-06f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// fn(float{}) or fn(c10::BFloat16{}), by the tensor's dtype
template <typename Fn>
void dispatch_float_or_bf16(c10::ScalarType type, const char* what, Fn&& fn) {
  if (type == c10::kFloat) {
    fn(float{});
  } else if (type == c10::kBFloat16) {
    fn(c10::BFloat16{});
  } else {
    TORCH_CHECK(false, what, " must be float32 or bfloat16, not ", type);
  }
}

}  // namespace sluice_cpu
