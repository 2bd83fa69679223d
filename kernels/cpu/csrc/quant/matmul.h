// What the two product drivers share: where a product lands, and the wide tiles' entry
// (matmul_wide.cpp) that quant_matmul_stack (matmul.cpp) calls for prefill-sized float
// activations.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "kernels.h"

namespace folio_cpu::quant {

// Row i, column j of a product at data[i * stride + j]; with pairs, activation rows 2i and
// 2i + 1 both land in row i, summed.
struct Out {
  float* data;
  int64_t stride;
  bool pairs;
};

// x float32 [m, k] (unit stride along k) -> its wide chunks, [m, wide_chunks(k)].
at::Tensor quantize_wide_rows(const Kernels& kern, const at::Tensor& x);

// xw (quantize_wide_rows) @ W.T into out (no pairs), W the n rows (rows[j], or j) of a
// weight matrix's file bytes.
void multiply_wide(const Kernels& kern, const at::Tensor& xw, int64_t k, const uint8_t* w,
                   int64_t w_stride, const int64_t* rows, int64_t n, int type, Out out);

}  // namespace folio_cpu::quant
