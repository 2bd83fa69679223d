// Quantizing activation rows to the layout of layout.h (8-bit blocks of 32).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace folio_cpu::quant {

// x float32 [m, k] (unit stride along k) -> uint8 [m, act_row_bytes(k)].
at::Tensor quantize_activations(const at::Tensor& x);

// x float32 [m, k] -> uint8 [2m, act_row_bytes(k)]: row 2i x_i's 8-bit blocks, row 2i + 1
// its residual's (act_residual.cpp).
at::Tensor quantize_activations_residual(const at::Tensor& x);

}  // namespace folio_cpu::quant
