// silu_mul and gelu_tanh_mul: the gated MLP's act(gate) * up from the stacked gate_up
// projection [tokens, 2 * inter] in one op (the layers ran slice, act, slice, mul).
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "fused/fast_math.h"
#include "ops.h"

namespace folio_cpu {

namespace {

struct Silu {
  static float apply(float g) { return g / (1.0f + exp_approx(-g)); }
};

struct GeluTanh {  // transformers' gelu_pytorch_tanh
  static float apply(float g) {
    const float inner = 0.7978845608028654f * (g + 0.044715f * g * g * g);  // sqrt(2/pi)
    return 0.5f * g * (1.0f + tanh_approx(inner));
  }
};

// o[j] = act(gate[j * stride]) * up[j * stride] for j < n, cloned per instruction set
// (the library's default flags are baseline x86-64, where this loop runs scalar; the
// loader picks the clone the CPU runs).
template <typename Act>
#if defined(__x86_64__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void gated_run(const float* __restrict gate, const float* __restrict up, int64_t stride,
               int64_t n, float* __restrict o) {
  if (stride == 1) {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) o[j] = Act::apply(gate[j]) * up[j];
  } else {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) o[j] = Act::apply(gate[j * stride]) * up[j * stride];
  }
}

template <typename Act>
at::Tensor gated(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.scalar_type() == at::kFloat && gate_up.dim() == 2 &&
                  gate_up.size(1) % 2 == 0,
              "gate_up must be float32 [tokens, 2 * intermediate]");
  const int64_t tokens = gate_up.size(0), inter = gate_up.size(1) / 2;
  auto out = at::empty({tokens, inter}, gate_up.options());
  const float* src = gate_up.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  // Any strides: a small-batch matmul returns a transposed view (engine/layers/linear.py).
  const int64_t row_stride = gate_up.stride(0), col_stride = gate_up.stride(1);
  // Parallel over rows and over chunks of a row: decode has one row of a few thousand.
  constexpr int64_t kChunk = 1024;
  const int64_t chunks = (inter + kChunk - 1) / kChunk;
  at::parallel_for(0, tokens * chunks, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t t = i / chunks, c0 = (i % chunks) * kChunk;
      const int64_t c1 = c0 + kChunk < inter ? c0 + kChunk : inter;
      const float* gate = src + t * row_stride + c0 * col_stride;
      gated_run<Act>(gate, gate + inter * col_stride, col_stride, c1 - c0, dst + t * inter + c0);
    }
  });
  return out;
}

}  // namespace

at::Tensor silu_mul(const at::Tensor& gate_up) { return gated<Silu>(gate_up); }

}  // namespace folio_cpu

TORCH_LIBRARY_FRAGMENT(folio_cpu, m) {
  m.def("silu_mul(Tensor gate_up) -> Tensor", &folio_cpu::silu_mul);
  m.def("gelu_tanh_mul(Tensor gate_up) -> Tensor", &folio_cpu::gated<folio_cpu::GeluTanh>);
}
