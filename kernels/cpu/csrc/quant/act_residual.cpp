// quantize_activations_residual: each row as two 8-bit rows, x itself and what its 8-bit
// blocks miss (x - d*q), interleaved (row 2i is x_i, row 2i + 1 its residual), so a
// product over the pairs (quant_matmul_stack with pairs: one read of the weight, twice the
// integer dots) carries about 15 bits of each activation instead of 8. On the starter the
// 8-bit rows alone moved 2.7% of greedy next tokens off the float32 path's; the pairs
// move none (engine/layers/weights.py, NativeQuantized).
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <vector>

#include "act.h"
#include "checks.h"
#include "kernels.h"
#include "layout.h"

namespace folio_cpu::quant {

namespace {

// x[k] -> high[act_row_bytes(k)] (x's 8-bit blocks) and low (the residual's).
void quantize_row_residual(const Kernels& kern, const float* x, int64_t k, uint8_t* high,
                           uint8_t* low, float* residual) {
  kern.quantize_row(x, k, high);
  const int8_t* q = reinterpret_cast<const int8_t*>(high);              // [kp]
  const float* d = reinterpret_cast<const float*>(high + padded_k(k));  // [kp / 32]
  for (int64_t i = 0; i < k; ++i) residual[i] = x[i] - d[i / 32] * static_cast<float>(q[i]);
  kern.quantize_row(residual, k, low);
}

}  // namespace

at::Tensor quantize_activations_residual(const at::Tensor& x) {
  const at::Tensor xr = checked_float_rows(x);
  const int64_t m = x.size(0), k = x.size(1);
  const int64_t row_bytes = act_row_bytes(k);
  // [2m, row_bytes]: row 2i the 8-bit x_i, row 2i + 1 its 8-bit residual.
  at::Tensor out = at::empty({2 * m, row_bytes}, x.options().dtype(at::kByte));
  const float* xp = xr.data_ptr<float>();
  const int64_t xstride = xr.stride(0);
  uint8_t* op = out.data_ptr<uint8_t>();
  const Kernels& kern = kernels_for(active_isa());
  at::parallel_for(0, m, (1 << 15) / k + 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> residual(static_cast<size_t>(k));
    for (int64_t i = lo; i < hi; ++i) {
      quantize_row_residual(kern, xp + i * xstride, k, op + 2 * i * row_bytes,
                            op + (2 * i + 1) * row_bytes, residual.data());
    }
  });
  return out;
}

}  // namespace folio_cpu::quant

TORCH_LIBRARY_FRAGMENT(folio_cpu, m) {
  m.def("quantize_activations_residual(Tensor x) -> Tensor",
        &folio_cpu::quant::quantize_activations_residual);
}
