// What the two product drivers share: where a product lands, a checked matrix, and the
// wide tiles' entry (matmul_wide.cpp) that quant_matmul_stack (matmul.cpp) calls for
// prefill-sized float activations.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/full.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "checks.h"
#include "kernels.h"

namespace folio_cpu::quant {

// Row i, column j of a product at data[i * stride + j]; with pairs, activation rows 2i and
// 2i + 1 both land in row i, summed. cols: the column of weight row j's product (a
// Matrix's cols), or null for column j.
struct Out {
  float* data;
  int64_t stride;
  bool pairs;
  const int64_t* cols = nullptr;
};

// The tiles of an m x n product, run in parallel: tile_n weight rows by tile_m activation
// rows, the m-tiles of equal height (a multiple of `align` rows, at most about max_m): a
// remainder tile would leave a thread idle. Tile t is m-tile major, so a thread's
// consecutive tiles share their activations.
struct TileGrid {
  struct Tile {
    int64_t m0, n0, tm, tn;
  };

  TileGrid(int64_t m_, int64_t n_, int64_t tile_n_, int64_t max_m, int64_t align)
      : m(m_), n(n_), tile_n(tile_n_), ntiles((n_ + tile_n_ - 1) / tile_n_),
        mtiles((m_ + max_m - 1) / max_m),
        tile_m(((m_ + mtiles - 1) / mtiles + align - 1) / align * align) {}

  int64_t size() const { return ntiles * mtiles; }

  Tile operator[](int64_t t) const {
    const int64_t m0 = t / ntiles * tile_m, n0 = t % ntiles * tile_n;
    return {m0, n0, std::min(tile_m, m - m0), std::min(tile_n, n - n0)};
  }

  // A tile's sums (acc[i * tile_n + r]) into out; with pairs, rows 2i and 2i + 1 into row i.
  void store(const Tile& t, const float* acc, Out out) const {
    const int64_t step = out.pairs ? 2 : 1;
    for (int64_t i = 0; i < t.tm; i += step) {
      float* o = out.data + (t.m0 + i) / step * out.stride;
      const float* a = acc + i * tile_n;
      for (int64_t r = 0; r < t.tn; ++r) {
        const int64_t col = out.cols ? out.cols[t.n0 + r] : t.n0 + r;
        o[col] = out.pairs ? a[r] + a[tile_n + r] : a[r];
      }
    }
  }

  const int64_t m, n, tile_n, ntiles, mtiles, tile_m;
};

// One matrix's output columns (rows given or not), its checks done. Output column j is
// the product of weight row rows[j] (j without rows). Where rows reorder all of w's rows
// (a GGUF file's q/k heads, whose rotary pairs llama.cpp interleaves), the kernels read w
// in file order instead and put row j's product in column cols[j]: in the rows' order
// a decode product read its matrix with gaps, and its prefetch, which runs ahead in
// address order, fetched rows long before their turn (~7% of a decode step's GEMV time).
struct Matrix {
  const at::Tensor& w;
  int type;
  at::Tensor rows;  // int64 [n] or undefined
  int64_t n;
  at::Tensor cols;  // int64 [n] (rows' inverse) or undefined; rows is then undefined
};

inline Matrix checked_matrix(const at::Tensor& w, int64_t type_id, int64_t k,
                             const std::optional<at::Tensor>& rows) {
  const BlockType bt = check_type(type_id, k);
  check_weight(w, bt, k);
  const int type = static_cast<int>(type_id);
  if (!rows.has_value()) return {w, type, at::Tensor(), w.size(0), at::Tensor()};
  check_indices(*rows, "rows", w.size(0));
  at::Tensor rows_c = rows->contiguous();
  const int64_t n = rows_c.numel();
  if (n != w.size(0) || n == 0) return {w, type, rows_c, n, at::Tensor()};
  at::Tensor cols = at::full({n}, -1, rows_c.options());
  const int64_t* r = rows_c.data_ptr<int64_t>();
  int64_t* c = cols.data_ptr<int64_t>();
  for (int64_t j = 0; j < n; ++j) {
    if (c[r[j]] >= 0) return {w, type, rows_c, n, at::Tensor()};  // a row twice
    c[r[j]] = j;
  }
  return {w, type, at::Tensor(), n, cols};
}

// The products of weight rows [j0, j1) of mat by the gemv kernels (pairs: gemv_pairs),
// x's m rows (pairs), into out's rows (n apart) at their columns.
inline void gemv_range(const Kernels& kern, bool pairs, const Matrix& mat, int64_t j0,
                       int64_t j1, int64_t k, const ActRow* x, int64_t m, float* out,
                       int64_t n) {
  const auto gemv = pairs ? kern.gemv_pairs : kern.gemv;
  const uint8_t* w = mat.w.data_ptr<uint8_t>();
  const int64_t stride = mat.w.stride(0);
  if (!mat.cols.defined()) {
    gemv(mat.type, w, stride, mat.rows.defined() ? mat.rows.data_ptr<int64_t>() : nullptr,
         j0, j1, k, x, m, out, n);
    return;
  }
  const int64_t width = j1 - j0;
  std::vector<float> part(static_cast<size_t>(m * width));  // [m][width], file order
  gemv(mat.type, w + j0 * stride, stride, nullptr, 0, width, k, x, m, part.data(), width);
  const int64_t* cols = mat.cols.data_ptr<int64_t>() + j0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < width; ++j) out[i * n + cols[j]] = part[i * width + j];
}

// quant_matmul_stack's product on matrices already checked: x float32 [m, k] (or its
// quantized rows) @ [W_1; W_2; ...].T -> float32 [m, n], n the matrices' columns.
at::Tensor multiply_stack(const at::Tensor& x, const std::vector<Matrix>& mats, int64_t k,
                          bool pairs);

// x float32 [m, k] @ [W_1; W_2; ...].T -> float32 [m, n] (n the matrices' columns), on
// the wide tiles.
at::Tensor multiply_wide_stack(const at::Tensor& x, const std::vector<Matrix>& mats,
                               int64_t k, int64_t n);

}  // namespace folio_cpu::quant
