// Quantizing activation rows to the layout of layout.h (8-bit blocks of 32).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace folio_cpu::quant {

// x float32 [m, k] (unit stride along k) -> uint8 [m, act_row_bytes(k)].
at::Tensor quantize_activations(const at::Tensor& x);

}  // namespace folio_cpu::quant
