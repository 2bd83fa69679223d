// Argument checks shared by the quantized ops; every message names the argument.
#pragma once

#include <torch/library.h>

#include "layout.h"

namespace folio_cpu::quant {

inline BlockType check_type(int64_t type_id, int64_t k) {
  const BlockType bt = block_type(type_id);
  TORCH_CHECK(bt.block_size != 0, "type_id ", type_id,
              " is not a supported GGUF block type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, ",
              "MXFP4)");
  TORCH_CHECK(k > 0 && k % bt.block_size == 0, "k (", k, ") must be a positive multiple of ",
              "the block size ", bt.block_size, " of type_id ", type_id);
  return bt;
}

// w: uint8 [n, row_bytes] on CPU, unit stride along the row, any row stride.
inline void check_weight(const at::Tensor& w, const BlockType& bt, int64_t k) {
  TORCH_CHECK(w.device().is_cpu(), "w must be on the CPU, not ", w.device());
  TORCH_CHECK(w.scalar_type() == at::kByte, "w must be uint8, not ", w.scalar_type());
  TORCH_CHECK(w.dim() == 2, "w must be 2-D [n, row_bytes], not ", w.sizes());
  const int64_t row_bytes = k / bt.block_size * bt.block_bytes;
  TORCH_CHECK(w.size(1) == row_bytes, "w has ", w.size(1), " bytes per row; k = ", k,
              " needs ", row_bytes);
  TORCH_CHECK(w.stride(1) == 1 || w.size(1) <= 1, "w's rows must be contiguous (stride(1) ",
              w.stride(1), ")");
}

// x: float32 [m, k] activations on CPU, k a positive multiple of 32; returns x with unit
// stride along k (a copy only when it had none).
inline at::Tensor checked_float_rows(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu(), "x must be on the CPU, not ", x.device());
  TORCH_CHECK(x.scalar_type() == at::kFloat, "x must be float32, not ", x.scalar_type());
  TORCH_CHECK(x.dim() == 2, "x must be 2-D [m, k], not ", x.sizes());
  TORCH_CHECK(x.size(1) > 0 && x.size(1) % 32 == 0, "x's k (", x.size(1),
              ") must be a positive multiple of 32");
  return x.stride(1) == 1 ? x : x.contiguous();
}

// ids / rows: int64 [t] on CPU, every value in [0, n).
inline void check_indices(const at::Tensor& ids, const char* name, int64_t n) {
  TORCH_CHECK(ids.device().is_cpu(), name, " must be on the CPU, not ", ids.device());
  TORCH_CHECK(ids.scalar_type() == at::kLong, name, " must be int64, not ", ids.scalar_type());
  TORCH_CHECK(ids.dim() == 1, name, " must be 1-D, not ", ids.sizes());
  if (ids.numel() == 0) return;
  const at::Tensor c = ids.contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  int64_t lo = p[0], hi = p[0];
  for (int64_t i = 1; i < c.numel(); ++i) {
    lo = p[i] < lo ? p[i] : lo;
    hi = p[i] > hi ? p[i] : hi;
  }
  TORCH_CHECK(lo >= 0 && hi < n, name, " out of range: values span [", lo, ", ", hi,
              "] but w has ", n, " rows");
}

}  // namespace folio_cpu::quant
