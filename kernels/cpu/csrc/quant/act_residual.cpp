// quantize_activations_residual: each row as two 8-bit rows, x itself and what its 8-bit
// blocks miss (x - d*q), interleaved (row 2i is x_i, row 2i + 1 its residual), so a
// product over the pairs (quant_matmul_stack with pairs: one read of the weight, twice the
// integer dots) carries about 15 bits of each activation instead of 8. On the starter the
// 8-bit rows alone moved 2.7% of greedy next tokens off the float32 path's; the pairs
// move none (engine/layers/weights.py, NativeQuantized).
//
// The residual's step is fixed at 1/256 of its block's (|r| <= d / 2, so its 8-bit range
// covers it; the rare |r| past 127.5 steps is clipped to 127, one step off), not its own
// maximum over 127: about the same precision, and a pair is then exactly
// d_lo (256 q_hi + q_lo), so the decode kernels combine its two integer dots before
// any float work (gemv_pairs, kernels.h). The rows: Kernels::quantize_residual (act_row.h).
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "act.h"
#include "checks.h"
#include "kernels.h"
#include "layout.h"

namespace folio_cpu::quant {

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
    for (int64_t i = lo; i < hi; ++i)
      kern.quantize_residual(xp + i * xstride, k, op + 2 * i * row_bytes,
                             op + (2 * i + 1) * row_bytes);
  });
  return out;
}

}  // namespace folio_cpu::quant

TORCH_LIBRARY_FRAGMENT(folio_cpu, m) {
  m.def("quantize_activations_residual(Tensor x) -> Tensor",
        &folio_cpu::quant::quantize_activations_residual);
}
