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
//               for at most 128 rows, the weight is the A operand read in place and the
//               rows the B operand. Both orders compute each element by the same instruction
//               sequence (the product is commutative, the k order the same);
//               `tests/kernels/test_linear_kernel.py` checks that they agree bit for bit.
//   avx512bf16: VDPBF16PS (per element: fp32, k in pairs, in order), each row's k-pairs
//               broadcast against the weight packed per call into VNNI blocks.
//   avx2:       bf16 widened to fp32, FMA into 8 lanes over k, then one fixed reduction tree
//               (CPUs without native bf16, where `--dtype auto` picks fp32 anyway).
// Memory traffic is the weight read once per call (the LM head: one pass over the
// embedding matrix, in place, with no fp32 copy). The paths live in linear_avx2.h,
// linear_vnni.h (packing and avx512bf16) and linear_amx.h, over linear_common.h; this file
// chooses among them and registers the ops.

#include <torch/library.h>

#include "linear_amx.h"
#include "linear_avx2.h"
#include "linear_common.h"
#include "linear_vnni.h"

namespace {

enum Path : int64_t { kAvx2 = 0, kAvx512Bf16 = 1, kAmx = 2 };

// up to this many rows the amx path reads the weight in place as A (measured on SmolLM2's
// shapes: faster up to 128 rows); past it, the weight is packed per chunk of rows as B
constexpr int64_t kAmxWeightAsAMaxRows = 128;

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

// What `linear` and `linear_w8` share: the rows contiguous in K, the bias as fp32, the
// output, and the problem over them (its weight pointer left for the caller)
struct Call {
  at::Tensor xc, b32, out;
  Problem p;
};

Call prepare(const at::Tensor& x, int64_t n, const c10::optional<at::Tensor>& bias,
             at::ScalarType out_dtype) {
  TORCH_CHECK(out_dtype == at::kBFloat16 || out_dtype == at::kFloat,
              "the output dtype must be bfloat16 or float32");
  Call c;
  c.xc = x.stride(1) == 1 ? x : x.contiguous();
  if (bias.has_value()) {
    TORCH_CHECK(bias->numel() == n, "bias must hold one value per output");
    c.b32 = bias->to(at::kFloat).contiguous();
  }
  c.out = at::empty({c.xc.size(0), n}, x.options().dtype(out_dtype));
  c.p.x = reinterpret_cast<const uint16_t*>(c.xc.data_ptr<bf16>());
  c.p.w = nullptr;
  c.p.bias = bias.has_value() ? c.b32.data_ptr<float>() : nullptr;
  c.p.out = c.out.data_ptr();
  c.p.out_fp32 = out_dtype == at::kFloat;
  c.p.M = c.xc.size(0);
  c.p.N = n;
  c.p.K = c.xc.size(1);
  c.p.x_stride = c.xc.stride(0);
  c.p.w_stride = 0;
  return c;
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight,
                  const c10::optional<at::Tensor>& bias, at::ScalarType out_dtype, int64_t path) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2, "x must be [rows, K] and weight [N, K]");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16,
              "x and weight must be bfloat16");
  TORCH_CHECK(x.size(1) == weight.size(1), "x and weight differ in K");
  const at::Tensor wc = weight.stride(1) == 1 ? weight : weight.contiguous();
  Call c = prepare(x, wc.size(0), bias, out_dtype);
  Problem& p = c.p;
  p.w_stride = wc.stride(0);
  const int64_t M = p.M, N = p.N, K = p.K;
  if (M == 0 || N == 0) return c.out;
  if (K == 0) return bias.has_value() ? c.out.copy_(c.b32.expand({M, N})) : c.out.zero_();
  if (path < 0) path = best_path(K);
  TORCH_CHECK(path_available(path), "linear path ", path, " is not available on this CPU");
  TORCH_CHECK(path != kAmx || K % 32 == 0, "the amx path needs K in multiples of 32");
  p.w = reinterpret_cast<const uint16_t*>(wc.data_ptr<bf16>());
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
      avx2_linear(p);
      break;
#endif
    default:
      TORCH_CHECK(false, "no linear path");
  }
  return c.out;
}

// W8A16: y = x bf16(W8 * scale)^T (+ b), x bf16, W8 int8 [N][K] with one fp32 scale per
// output row and group of 32 along K, both packed in AMX tiles (`Problem::w8`; `pack_w8`
// below writes them): `weight` [ceil(N / 16)][K / 32][16][32] int8, `scale`
// [ceil(N / 16)][K / 32][16] fp32, `n` the output width. The amx path only (each weight widened
// to bf16 as it is read), in either order by the row count as `linear`, so a row's result
// depends on that row alone here too, and equals `linear` on the widened bf16 weights
at::Tensor linear_w8(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                     int64_t n, const c10::optional<at::Tensor>& bias, at::ScalarType out_dtype,
                     int64_t order) {
  TORCH_CHECK(path_available(kAmx), "int8 weights need the amx path (a CPU with AMX-BF16)");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "x must be bfloat16 [rows, K]");
  const int64_t K = x.size(1);
  TORCH_CHECK(K % 32 == 0, "the amx path needs K in multiples of 32");
  const int64_t panels = (n + 15) / 16;
  TORCH_CHECK(weight.scalar_type() == at::kChar && weight.is_contiguous() &&
                  weight.sizes() == at::IntArrayRef({panels, K / 32, 16, 32}),
              "weight must be int8 packed by pack_w8: [ceil(N / 16), K / 32, 16, 32]");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() &&
                  scale.sizes() == at::IntArrayRef({panels, K / 32, 16}),
              "scale must be float32 packed by pack_w8: [ceil(N / 16), K / 32, 16]");
  Call c = prepare(x, n, bias, out_dtype);
  Problem& p = c.p;
  if (p.M == 0 || p.N == 0) return c.out;
  p.w8 = weight.data_ptr<int8_t>();
  p.w8_scale = scale.data_ptr<float>();
#ifdef SLUICE_LINEAR_AMX
  if (order == 1 || (order < 0 && p.M <= kAmxWeightAsAMaxRows))
    amx_w8_weight_as_a(p);
  else
    amx_rows_as_a(p);
#endif
  return c.out;
}

// int8 weights [N][K] and their scales [N][K / 32] in the tile order `linear_w8` reads (rows
// padded to a multiple of 16 with zero weights and zero scales)
std::vector<at::Tensor> pack_w8(const at::Tensor& weight, const at::Tensor& scale) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kChar && weight.size(1) % 32 == 0,
              "weight int8 [N, K] with K a multiple of 32");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.dim() == 2 &&
                  scale.size(0) == weight.size(0) && scale.size(1) * 32 == weight.size(1),
              "scale must be float32 [N, K / 32] (one per row and group of 32)");
  const int64_t N = weight.size(0), groups = weight.size(1) / 32, pad = (16 - N % 16) % 16;
  const int64_t panels = (N + pad) / 16;
  const at::Tensor w = at::constant_pad_nd(weight, {0, 0, 0, pad});
  const at::Tensor s = at::constant_pad_nd(scale, {0, 0, 0, pad});
  return {w.view({panels, 16, groups, 32}).permute({0, 2, 1, 3}).contiguous(),
          s.view({panels, 16, groups}).permute({0, 2, 1}).contiguous()};
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
  m.def("linear_w8(Tensor x, Tensor weight, Tensor scale, int n, Tensor? bias, ScalarType out_dtype, int order=-1) -> Tensor");
  m.def("pack_w8(Tensor weight, Tensor scale) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(sluice_cpu, CPU, m) {
  m.impl("linear", &linear);
  m.impl("linear_order", &linear_order);
  m.impl("linear_w8", &linear_w8);
  m.impl("pack_w8", &pack_w8);
}
