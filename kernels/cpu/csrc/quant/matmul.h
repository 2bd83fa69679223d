// What the two product drivers share: where a product lands, a checked matrix, and the
// wide tiles' entry (matmul_wide.cpp) that quant_matmul_stack (matmul.cpp) calls for
// prefill-sized float activations.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "checks.h"
#include "kernels.h"

namespace folio_cpu::quant {

// Row i, column j of a product at data[i * stride + j]; with pairs, activation rows 2i and
// 2i + 1 both land in row i, summed.
struct Out {
  float* data;
  int64_t stride;
  bool pairs;
};

// One matrix's output columns (rows given or not), its checks done.
struct Matrix {
  const at::Tensor& w;
  int type;
  at::Tensor rows;  // int64 [n] or undefined
  int64_t n;
};

inline Matrix checked_matrix(const at::Tensor& w, int64_t type_id, int64_t k,
                             const std::optional<at::Tensor>& rows) {
  const BlockType bt = check_type(type_id, k);
  check_weight(w, bt, k);
  if (!rows.has_value()) return {w, static_cast<int>(type_id), at::Tensor(), w.size(0)};
  check_indices(*rows, "rows", w.size(0));
  at::Tensor rows_c = rows->contiguous();
  return {w, static_cast<int>(type_id), rows_c, rows_c.numel()};
}

// x float32 [m, k] @ [W_1; W_2; ...].T -> float32 [m, n] (n the matrices' columns), on
// the wide tiles.
at::Tensor multiply_wide_stack(const at::Tensor& x, const std::vector<Matrix>& mats,
                               int64_t k, int64_t n);

}  // namespace folio_cpu::quant
