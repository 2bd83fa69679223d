// quantize_activations: each row once to int8 blocks of 32 with a float scale and int16
// sums per 16 (layout.h), so every weight type's offset term is one small integer dot.
#include "act.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "checks.h"
#include "kernels.h"
#include "layout.h"

namespace folio_cpu::quant {

at::Tensor quantize_activations(const at::Tensor& x) {
  const at::Tensor xr = checked_float_rows(x);
  const int64_t m = x.size(0), k = x.size(1);
  const int64_t row_bytes = act_row_bytes(k);
  at::Tensor out = at::empty({m, row_bytes}, x.options().dtype(at::kByte));
  const float* xp = xr.data_ptr<float>();
  const int64_t xstride = xr.stride(0);
  uint8_t* op = out.data_ptr<uint8_t>();
  const Kernels& kern = kernels_for(active_isa());
  at::parallel_for(0, m, (1 << 15) / k + 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) kern.quantize_row(xp + i * xstride, k, op + i * row_bytes);
  });
  return out;
}

}  // namespace folio_cpu::quant

TORCH_LIBRARY_FRAGMENT(folio_cpu, m) {
  m.def("quantize_activations(Tensor x) -> Tensor", &folio_cpu::quant::quantize_activations);
}
