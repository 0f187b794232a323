// One-pass CPU versions of the Llama layer's elementwise parts, each replacing a chain of
// torch ops (and their temporaries): RMSNorm (8 ops), the rotary embedding of q and k
// (about 12), SiLU-and-multiply (3). Each rounds where transformers' own bf16 code rounds:
// RMSNorm normalises in fp32, rounds, then multiplies by the weight in the model dtype;
// the rotary embedding rounds q*cos and rotate_half(q)*sin before adding them; SiLU rounds
// its result before the product. In fp32 nothing is rounded. w8a8's per-token activation
// quantization and the rescaling of the int8 GEMM's int32 output are one pass each too
// (the GEMM itself stays torch's `_int_mm`).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "cpu_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>

namespace {

using sluice_cpu::exp_nonpositive;
using sluice_cpu::store;
using sluice_cpu::to_f;

// round to the storage type and back
inline float round_as(float x, float) { return x; }
inline float round_as(float x, c10::BFloat16) {
  const uint32_t u = sluice_cpu::round_bf16_bits(x);
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

template <typename T>
void rms_norm_rows(const T* x, const T* w, T* out, int64_t rows, int64_t h, int64_t stride,
                   float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * stride;
    float ss = 0.0f;
    for (int64_t i = 0; i < h; ++i) {
      const float v = to_f(xr[i]);
      ss += v * v;
    }
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(h) + eps);
    T* o = out + r * h;
    for (int64_t i = 0; i < h; ++i) store(to_f(w[i]) * round_as(to_f(xr[i]) * inv, T()), o + i);
  }
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "rms_norm: x must be [rows, hidden], rows contiguous");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1) && weight.is_contiguous(),
              "rms_norm: weight must be [hidden]");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), "rms_norm: weight and x differ in dtype");
  at::Tensor out = at::empty(x.sizes(), x.options());
  const int64_t rows = x.size(0), h = x.size(1), stride = x.stride(0);
  AT_DISPATCH_SWITCH(x.scalar_type(), "rms_norm",
    AT_DISPATCH_CASE(at::kFloat, [&] {
      at::parallel_for(0, rows, 16, [&](int64_t b, int64_t e) {
        rms_norm_rows<float>(x.data_ptr<float>() + b * stride, weight.data_ptr<float>(),
                             out.data_ptr<float>() + b * h, e - b, h, stride, static_cast<float>(eps));
      });
    })
    AT_DISPATCH_CASE(at::kBFloat16, [&] {
      at::parallel_for(0, rows, 16, [&](int64_t b, int64_t e) {
        rms_norm_rows<c10::BFloat16>(x.data_ptr<c10::BFloat16>() + b * stride,
                                     weight.data_ptr<c10::BFloat16>(),
                                     out.data_ptr<c10::BFloat16>() + b * h, e - b, h, stride,
                                     static_cast<float>(eps));
      });
    }));
  return out;
}

template <typename T>
void silu_mul_rows(const T* in, T* out, int64_t rows, int64_t inter, int64_t stride) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* g = in + r * stride;
    const T* u = g + inter;
    T* o = out + r * inter;
    for (int64_t i = 0; i < inter; ++i) {
      const float x = to_f(g[i]);
      const float e = exp_nonpositive(-std::fabs(x));  // exp(-|x|): never overflows
      const float sig = x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
      store(round_as(x * sig, T()) * to_f(u[i]), o + i);
    }
  }
}

at::Tensor silu_mul(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.stride(1) == 1 && gate_up.size(1) % 2 == 0,
              "silu_mul: gate_up must be [rows, 2 * intermediate], rows contiguous");
  const int64_t rows = gate_up.size(0), inter = gate_up.size(1) / 2, stride = gate_up.stride(0);
  at::Tensor out = at::empty({rows, inter}, gate_up.options());
  AT_DISPATCH_SWITCH(gate_up.scalar_type(), "silu_mul",
    AT_DISPATCH_CASE(at::kFloat, [&] {
      at::parallel_for(0, rows, 4, [&](int64_t b, int64_t e) {
        silu_mul_rows<float>(gate_up.data_ptr<float>() + b * stride,
                             out.data_ptr<float>() + b * inter, e - b, inter, stride);
      });
    })
    AT_DISPATCH_CASE(at::kBFloat16, [&] {
      at::parallel_for(0, rows, 4, [&](int64_t b, int64_t e) {
        silu_mul_rows<c10::BFloat16>(gate_up.data_ptr<c10::BFloat16>() + b * stride,
                                     out.data_ptr<c10::BFloat16>() + b * inter, e - b, inter,
                                     stride);
      });
    }));
  return out;
}

// x*cos + rotate_half(x)*sin for the heads of one token, neox layout (halves rotated)
template <typename T>
void rotate_token(const T* x, int64_t heads, int64_t head_stride, const T* cos, const T* sin,
                  T* out, int64_t d) {
  const int64_t half = d / 2;
  for (int64_t h = 0; h < heads; ++h) {
    const T* xh = x + h * head_stride;
    T* oh = out + h * d;
    for (int64_t i = 0; i < d; ++i) {
      const float rot = i < half ? -to_f(xh[i + half]) : to_f(xh[i - half]);
      const float a = round_as(to_f(xh[i]) * to_f(cos[i]), T());
      const float b = round_as(rot * to_f(sin[i]), T());
      store(a + b, oh + i);
    }
  }
}

template <typename T>
void rotary_rows(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                 at::Tensor& out) {
  const int64_t tokens = x.size(0), heads = x.size(1), d = x.size(2);
  const T* xp = x.data_ptr<T>();
  const T* cp = cos.data_ptr<T>();
  const T* sp = sin.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t ts = x.stride(0), hs = x.stride(1);
  at::parallel_for(0, tokens, 8, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t)
      rotate_token<T>(xp + t * ts, heads, hs, cp + t * d, sp + t * d, op + t * heads * d, d);
  });
}

std::tuple<at::Tensor, at::Tensor> rotary(const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& cos, const at::Tensor& sin) {
  for (const at::Tensor* x : {&q, &k}) {
    TORCH_CHECK(x->dim() == 3 && x->stride(2) == 1, "rotary: q and k must be [tokens, heads, dim]");
    TORCH_CHECK(x->scalar_type() == q.scalar_type() && x->size(0) == cos.size(0) &&
                    x->size(2) == cos.size(1), "rotary: shapes or dtypes differ");
  }
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.sizes() == sin.sizes() &&
                  cos.scalar_type() == q.scalar_type() && sin.scalar_type() == q.scalar_type(),
              "rotary: cos and sin must be contiguous [tokens, dim] in q's dtype");
  TORCH_CHECK(q.size(2) % 2 == 0, "rotary: head_dim must be even");
  at::Tensor q_out = at::empty(q.sizes(), q.options());
  at::Tensor k_out = at::empty(k.sizes(), k.options());
  AT_DISPATCH_SWITCH(q.scalar_type(), "rotary",
    AT_DISPATCH_CASE(at::kFloat, [&] {
      rotary_rows<float>(q, cos, sin, q_out);
      rotary_rows<float>(k, cos, sin, k_out);
    })
    AT_DISPATCH_CASE(at::kBFloat16, [&] {
      rotary_rows<c10::BFloat16>(q, cos, sin, q_out);
      rotary_rows<c10::BFloat16>(k, cos, sin, k_out);
    }));
  return {q_out, k_out};
}

// w8a8's per-token activation quantization (torchao's symmetric scheme): scale =
// max|x| / 127.5 (at least fp32 eps), q = clamp(round_half_even(x / scale), -128, 127).
template <typename T>
void quantize_rows(const T* x, int8_t* q, float* scale, int64_t rows, int64_t k, int64_t stride) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * stride;
    float peak = 0.0f;
    for (int64_t i = 0; i < k; ++i) peak = std::max(peak, std::fabs(to_f(xr[i])));
    const float s = std::max(peak / 127.5f, 1.1920928955078125e-07f);
    scale[r] = s;
    int8_t* qr = q + r * k;
    for (int64_t i = 0; i < k; ++i) {
      const float v = std::nearbyint(to_f(xr[i]) / s);
      qr[i] = static_cast<int8_t>(std::min(127.0f, std::max(-128.0f, v)));
    }
  }
}

std::tuple<at::Tensor, at::Tensor> quantize_per_token(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "quantize_per_token: x must be [rows, k]");
  const int64_t rows = x.size(0), k = x.size(1), stride = x.stride(0);
  at::Tensor q = at::empty({rows, k}, x.options().dtype(at::kChar));
  at::Tensor scale = at::empty({rows, 1}, x.options().dtype(at::kFloat));
  AT_DISPATCH_SWITCH(x.scalar_type(), "quantize_per_token",
    AT_DISPATCH_CASE(at::kFloat, [&] {
      at::parallel_for(0, rows, 8, [&](int64_t b, int64_t e) {
        quantize_rows<float>(x.data_ptr<float>() + b * stride, q.data_ptr<int8_t>() + b * k,
                             scale.data_ptr<float>() + b, e - b, k, stride);
      });
    })
    AT_DISPATCH_CASE(at::kBFloat16, [&] {
      at::parallel_for(0, rows, 8, [&](int64_t b, int64_t e) {
        quantize_rows<c10::BFloat16>(x.data_ptr<c10::BFloat16>() + b * stride,
                                     q.data_ptr<int8_t>() + b * k, scale.data_ptr<float>() + b,
                                     e - b, k, stride);
      });
    }));
  return {q, scale};
}

// y = float(acc) * x_scale[row] * w_scale[col] (+ bias), in the activations' dtype
template <typename T>
void rescale_rows(const int32_t* acc, const float* xs, const float* ws, const T* bias, T* out,
                  int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t* a = acc + r * n;
    T* o = out + r * n;
    const float s = xs[r];
    for (int64_t j = 0; j < n; ++j) {
      float v = static_cast<float>(a[j]) * s * ws[j];
      if (bias != nullptr) v += to_f(bias[j]);
      store(v, o + j);
    }
  }
}

at::Tensor rescale_int_mm(const at::Tensor& acc, const at::Tensor& x_scale,
                          const at::Tensor& w_scale, const c10::optional<at::Tensor>& bias,
                          at::ScalarType out_dtype) {
  TORCH_CHECK(acc.dim() == 2 && acc.is_contiguous() && acc.scalar_type() == at::kInt,
              "rescale_int_mm: acc must be a contiguous int32 [rows, n]");
  const int64_t rows = acc.size(0), n = acc.size(1);
  TORCH_CHECK(x_scale.numel() == rows && x_scale.scalar_type() == at::kFloat && x_scale.is_contiguous(),
              "rescale_int_mm: x_scale must be fp32 [rows]");
  TORCH_CHECK(w_scale.numel() == n && w_scale.scalar_type() == at::kFloat && w_scale.is_contiguous(),
              "rescale_int_mm: w_scale must be fp32 [n]");
  if (bias.has_value())
    TORCH_CHECK(bias->numel() == n && bias->scalar_type() == out_dtype && bias->is_contiguous(),
                "rescale_int_mm: bias must be [n] in the output dtype");
  at::Tensor out = at::empty({rows, n}, acc.options().dtype(out_dtype));
  AT_DISPATCH_SWITCH(out_dtype, "rescale_int_mm",
    AT_DISPATCH_CASE(at::kFloat, [&] {
      const float* b = bias.has_value() ? bias->data_ptr<float>() : nullptr;
      at::parallel_for(0, rows, 8, [&](int64_t lo, int64_t hi) {
        rescale_rows<float>(acc.data_ptr<int32_t>() + lo * n, x_scale.data_ptr<float>() + lo,
                            w_scale.data_ptr<float>(), b, out.data_ptr<float>() + lo * n, hi - lo, n);
      });
    })
    AT_DISPATCH_CASE(at::kBFloat16, [&] {
      const c10::BFloat16* b = bias.has_value() ? bias->data_ptr<c10::BFloat16>() : nullptr;
      at::parallel_for(0, rows, 8, [&](int64_t lo, int64_t hi) {
        rescale_rows<c10::BFloat16>(acc.data_ptr<int32_t>() + lo * n,
                                    x_scale.data_ptr<float>() + lo, w_scale.data_ptr<float>(), b,
                                    out.data_ptr<c10::BFloat16>() + lo * n, hi - lo, n);
      });
    }));
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(sluice_cpu, m) {
  m.def("quantize_per_token(Tensor x) -> (Tensor, Tensor)");
  m.def("rescale_int_mm(Tensor acc, Tensor x_scale, Tensor w_scale, Tensor? bias, ScalarType out_dtype) -> Tensor");
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  m.def("rotary(Tensor q, Tensor k, Tensor cos, Tensor sin) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(sluice_cpu, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("silu_mul", &silu_mul);
  m.impl("rotary", &rotary);
  m.impl("quantize_per_token", &quantize_per_token);
  m.impl("rescale_int_mm", &rescale_int_mm);
}
