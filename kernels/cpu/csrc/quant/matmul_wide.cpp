// The wide tiles: float activations quantized once to 16-bit chunks (wide.h), multiplied
// by tiles of kTileN weight rows x tile_m (<= kMaxTileM) activation rows in parallel.
// A tile unpacks its weight rows kSlice chunks at a time (the slice of its kTileN rows,
// about 150 KiB, stays in L2 while every activation row of the tile passes over it), and
// one dot_wide call runs the slice's kTileN rows by kWideRows activation rows, in
// kWideCols x kWideRows register blocks. Unpacking costs 1 / tile_m of the products, so
// the tiles take over from gemv at a handful of rows.
#include "matmul.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

namespace folio_cpu::quant {
namespace {

constexpr int64_t kTileN = 32;
constexpr int64_t kSlice = 4;  // chunks: 2,048 weights of a row
constexpr int64_t kMaxTileM = 256;

// x float32 [m, k] (unit stride along k) -> uint8 [m, wide_chunks(k) * sizeof(WideChunk)].
at::Tensor quantize_rows(const Kernels& kern, const at::Tensor& x) {
  const int64_t m = x.size(0), k = x.size(1), chunks = wide_chunks(k);
  const int64_t row_bytes = chunks * static_cast<int64_t>(sizeof(WideChunk));
  at::Tensor out = at::empty({m, row_bytes}, x.options().dtype(at::kByte));
  auto* op = reinterpret_cast<WideChunk*>(out.data_ptr<uint8_t>());
  // Every chunk's loads are aligned ones: torch's CPU allocations are 64-byte aligned.
  TORCH_CHECK(reinterpret_cast<uintptr_t>(op) % alignof(WideChunk) == 0,
              "the wide activations' buffer is not 64-byte aligned");
  const float* xp = x.data_ptr<float>();
  const int64_t xs = x.stride(0);
  at::parallel_for(0, m, (1 << 15) / k + 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) kern.quantize_wide(xp + i * xs, k, op + i * chunks);
  });
  return out;
}

// xw (quantize_rows) @ W.T into out's columns.
void multiply_wide(const Kernels& kern, const at::Tensor& xw, int64_t k, const Matrix& mat,
                   Out out) {
  const int64_t m = xw.size(0), chunks = wide_chunks(k), n = mat.n;
  const auto* x = reinterpret_cast<const WideChunk*>(xw.data_ptr<uint8_t>());
  const uint8_t* w = mat.w.data_ptr<uint8_t>();
  const int64_t w_stride = mat.w.stride(0);
  const int64_t* rows = mat.rows.defined() ? mat.rows.data_ptr<int64_t>() : nullptr;
  out.cols = mat.cols.defined() ? mat.cols.data_ptr<int64_t>() : nullptr;
  const int type = mat.type;
  const int min_terms = wide_min_terms(type);
  const TileGrid grid(m, n, kTileN, kMaxTileM, 1);
  at::parallel_for(0, grid.size(), 1, [&](int64_t lo, int64_t hi) {
    std::vector<WideChunk> wbuf(static_cast<size_t>(kTileN * kSlice));    // [kTileN][kSlice]
    std::vector<float> acc(static_cast<size_t>(grid.tile_m * kTileN));  // [tile m][kTileN]
    for (int64_t t = lo; t < hi; ++t) {
      const TileGrid::Tile tile = grid[t];
      const int64_t m0 = tile.m0, n0 = tile.n0, tm = tile.tm, tn = tile.tn;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t c0 = 0; c0 < chunks; c0 += kSlice) {
        const int64_t cs = std::min(kSlice, chunks - c0);
        const int last_rows = wide_rows(k, c0 + cs - 1);
        for (int64_t r = 0; r < tn; ++r) {
          const uint8_t* row = w + (rows ? rows[n0 + r] : n0 + r) * w_stride;
          kern.unpack_wide(type, row, k, c0, cs, wbuf.data() + r * kSlice);
        }
        const WideChunk* wr[kTileN];
        for (int64_t r = 0; r < tn; ++r) wr[r] = wbuf.data() + r * kSlice;
        for (int64_t i0 = 0; i0 < tm; i0 += kWideRows) {
          const int mr = static_cast<int>(std::min<int64_t>(kWideRows, tm - i0));
          const WideChunk* xr[kWideRows];
          for (int i = 0; i < mr; ++i) xr[i] = x + (m0 + i0 + i) * chunks + c0;
          kern.dot_wide(wr, static_cast<int>(tn), xr, mr, cs, last_rows, min_terms,
                        acc.data() + i0 * kTileN, kTileN);
        }
      }
      grid.store(tile, acc.data(), out);
    }
  });
}

at::Tensor quantize_activations_wide(const at::Tensor& x) {
  return quantize_rows(kernels_for(active_isa()), checked_float_rows(x));
}

at::Tensor quant_matmul_wide(const at::Tensor& x, const at::Tensor& w, int64_t type_id,
                             int64_t k, const std::optional<at::Tensor>& rows) {
  const Matrix mat = checked_matrix(w, type_id, k, rows);
  return multiply_wide_stack(x, {mat}, k, mat.n);
}

}  // namespace

at::Tensor multiply_wide_stack(const at::Tensor& x, const std::vector<Matrix>& mats,
                               int64_t k, int64_t n) {
  const at::Tensor xr = checked_float_rows(x);
  TORCH_CHECK(xr.size(1) == k, "x has ", xr.size(1), " columns but k is ", k);
  at::Tensor out = at::empty({xr.size(0), n}, xr.options());
  if (xr.size(0) == 0 || n == 0) return out;
  const Kernels& kern = kernels_for(active_isa());
  const at::Tensor xw = quantize_rows(kern, xr);
  int64_t col = 0;
  for (const Matrix& mat : mats) {
    multiply_wide(kern, xw, k, mat, {out.data_ptr<float>() + col, n, false});
    col += mat.n;
  }
  return out;
}

}  // namespace folio_cpu::quant

TORCH_LIBRARY_FRAGMENT(folio_cpu, m) {
  m.def("quantize_activations_wide(Tensor x) -> Tensor",
        &folio_cpu::quant::quantize_activations_wide);
  m.def("quant_matmul_wide(Tensor x, Tensor w, int type_id, int k, Tensor? rows=None) -> Tensor",
        &folio_cpu::quant::quant_matmul_wide);
}
