// quant_matmul: x [m, k] @ W.T for a GGUF-quantized W.
//
// Up to the ISA's gemv_max_rows activation rows (decode), each weight row is read once,
// from its blocks into registers, for all rows (gemv). Beyond, the work is split into
// tiles of kTileN weight rows x tile_m (<= kMaxTileM) activation rows run in parallel
// (m-tile major, so a thread's consecutive tiles share their activations): a tile unpacks
// its weight rows once (Group, layout.h, in the ISA's interleaved order), k-chunk by
// k-chunk, and multiplies each chunk by the tile's activation rows four at a time (each
// set of four interleaved once, for all kTileN weight rows), so unpacking costs
// 1 / tile_m of the products and no shape falls off a cliff between the two paths.
//
// These 8-bit tiles serve quantized (uint8) activations, and float rows where the ISA's
// wide tiles do not (Kernels::wide_min_rows; matmul_wide.cpp).
//
// quant_matmul_stack: several matrices (a layer's stacked q/k/v or gate/up, each as it
// lies in the file) by one set of activations, into the columns of one output; with
// `pairs`, activation rows come as (x_i, residual_i) pairs (quantize_activations_residual)
// and output row i is the sum of the pair's products. Float rows past the decode sizes
// take the wide tiles (16-bit rows, more precise than the pairs at half their work).
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "act.h"
#include "checks.h"
#include "kernels.h"
#include "matmul.h"

namespace folio_cpu::quant {
namespace {

constexpr int64_t kTileN = 16;
// Weights per k-chunk: a tile multiplies chunk by chunk, so the chunk of its kTileN
// unpacked rows (48 KiB) and of four activation rows stay near L1 whatever k is.
constexpr int64_t kChunkGroups = 8;
// Most activation rows per tile: as many as keep a tile's activation chunks within
// ~512 KiB (L2), at most 256: more rows amortize the weights' unpacking.
constexpr int64_t kMaxTileM = std::min<int64_t>(256, (int64_t{512} << 10) / (kChunkGroups * 320));

// Decode-sized m: each weight row read once from the file's blocks for all m rows (with
// pairs, the kernel's gemv_pairs sums each pair), the `count` matrices of a stack (their
// columns side by side in out) in one parallel region: each thread streams one
// contiguous share of the stack's bytes (a Q6_K row weighs about 1.5 Q4_K rows), so a
// layer's q/k/v or gate/up products wait at one barrier, not one per matrix.
void gemv_rows(const Kernels& kern, const uint8_t* act, int64_t act_stride, int64_t m,
               const Matrix* mats, int64_t count, int64_t k, Out out) {
  ActRow x[kGemvRows];
  for (int64_t i = 0; i < m; ++i) x[i] = act_row(act + i * act_stride, k);
  const int64_t out_rows = out.pairs ? m / 2 : m;
  std::vector<int64_t> start(static_cast<size_t>(count) + 1, 0);  // each matrix's first byte
  for (int64_t j = 0; j < count; ++j) start[j + 1] = start[j] + mats[j].n * mats[j].w.size(1);
  const int64_t total = start[count], threads = at::get_num_threads();
  // Matrix j's row at byte b of the stack (rounded): neighbouring shares meet at one row.
  const auto row_at = [&](int64_t j, int64_t b) {
    const int64_t row_bytes = mats[j].w.size(1);
    if (b <= start[j]) return int64_t{0};
    if (b >= start[j + 1]) return mats[j].n;
    return (b - start[j] + row_bytes / 2) / row_bytes;
  };
  at::parallel_for(0, threads, 1, [&](int64_t lo, int64_t hi) {
    const int64_t b0 = total * lo / threads, b1 = total * hi / threads;
    int64_t col = 0;
    for (int64_t j = 0; j < count; ++j) {
      const int64_t r0 = row_at(j, b0), r1 = row_at(j, b1);
      if (r0 < r1)
        gemv_range(kern, out.pairs, mats[j], r0, r1, k, x, out_rows, out.data + col,
                   out.stride);
      col += mats[j].n;
    }
  });
}

void multiply(const uint8_t* act, int64_t act_stride, int64_t m, const Matrix& mat,
              int64_t k, Out out) {
  const Kernels& kern = kernels_for(active_isa());
  if (m <= kern.gemv_max_rows && kern.gemv != nullptr) {
    gemv_rows(kern, act, act_stride, m, &mat, 1, k, out);
    return;
  }
  const uint8_t* w = mat.w.data_ptr<uint8_t>();
  const int64_t w_stride = mat.w.stride(0);
  const int64_t* rows = mat.rows.defined() ? mat.rows.data_ptr<int64_t>() : nullptr;
  const int64_t n = mat.n;
  const int type = mat.type;
  const int64_t groups = padded_k(k) / kGroup;
  // m-tiles of a multiple of 4 rows: a pair never straddles two.
  const TileGrid grid(m, n, kTileN, kMaxTileM, 4);
  const bool signed_q = signed_weights(type);
  // A chunk's bytes in a weight row: whole blocks (a 32-block type's chunk is 8 blocks
  // per group, its last chunk possibly fewer).
  const BlockType bt = block_type(type);
  const int64_t chunk_bytes = kChunkGroups * kGroup / bt.block_size * bt.block_bytes;
  at::parallel_for(0, grid.size(), 1, [&](int64_t lo, int64_t hi) {
    std::vector<Group> wbuf(static_cast<size_t>(kTileN * kChunkGroups));  // [kTileN][chunk]
    std::vector<uint8_t> xbuf;  // [kMaxRows][chunk * 256]: activations' q, interleaved
    if (kern.interleave) xbuf.resize(static_cast<size_t>(kMaxRows * kChunkGroups * kGroup));
    std::vector<float> acc(static_cast<size_t>(grid.tile_m * kTileN));  // [tile m][kTileN]
    for (int64_t t = lo; t < hi; ++t) {
      const TileGrid::Tile tile = grid[t];
      const int64_t m0 = tile.m0, n0 = tile.n0, tm = tile.tm, tn = tile.tn;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t g0 = 0; g0 < groups; g0 += kChunkGroups) {
        const int64_t cg = std::min(kChunkGroups, groups - g0);
        const int64_t ck = std::min(kChunkGroups * kGroup, k - g0 * kGroup);  // weights
        for (int64_t r = 0; r < tn; ++r) {
          Group* g = wbuf.data() + r * kChunkGroups;
          const uint8_t* row = w + (rows ? rows[n0 + r] : n0 + r) * w_stride;
          kern.unpack_row(type, row + g0 / kChunkGroups * chunk_bytes, ck, g);
          if (kern.interleave)
            for (int64_t i = 0; i < cg; ++i) kern.interleave(g[i].q, 1);
        }
        for (int64_t i0 = 0; i0 < tm; i0 += kMaxRows) {
          const int mr = static_cast<int>(std::min<int64_t>(kMaxRows, tm - i0));
          ActRow x[kMaxRows];
          for (int i = 0; i < mr; ++i) {
            const ActRow full = act_row(act + (m0 + i0 + i) * act_stride, k);
            x[i] = {full.q + g0 * kGroup, full.d + g0 * 8, full.sum + g0 * 16};
            if (kern.interleave) {
              uint8_t* q = xbuf.data() + i * kChunkGroups * kGroup;
              std::memcpy(q, x[i].q, static_cast<size_t>(cg * kGroup));
              kern.interleave(q, cg);
              x[i].q = reinterpret_cast<const int8_t*>(q);
            }
          }
          for (int64_t r = 0; r < tn; ++r) {
            float part[kMaxRows];
            kern.dot(wbuf.data() + r * kChunkGroups, cg, x, mr, signed_q, part);
            for (int i = 0; i < mr; ++i) acc[(i0 + i) * kTileN + r] += part[i];
          }
        }
      }
      grid.store(tile, acc.data(), out);
    }
  });
}

// x float32 [m, k] (quantized here: as (x, residual) row pairs with pairs) or quantized
// activations -> the uint8 rows to multiply.
at::Tensor activations(const at::Tensor& x, int64_t k, bool pairs = false) {
  TORCH_CHECK(x.device().is_cpu(), "x must be on the CPU, not ", x.device());
  TORCH_CHECK(x.dim() == 2, "x must be 2-D, not ", x.sizes());
  if (x.scalar_type() == at::kFloat) {
    TORCH_CHECK(x.size(1) == k, "x has ", x.size(1), " columns but k is ", k);
    return pairs ? quantize_activations_residual(x) : quantize_activations(x);
  }
  TORCH_CHECK(x.scalar_type() == at::kByte, "x must be float32 [m, k] or the uint8 ",
              "output of quantize_activations, not ", x.scalar_type());
  TORCH_CHECK(x.size(1) == act_row_bytes(k), "x (quantized activations) has ", x.size(1),
              " bytes per row; k = ", k, " needs act_row_bytes(k) = ", act_row_bytes(k));
  return x.stride(1) == 1 ? x : x.contiguous();
}

void multiply_matrix(const at::Tensor& act, const Matrix& mat, int64_t k, Out out) {
  out.cols = mat.cols.defined() ? mat.cols.data_ptr<int64_t>() : nullptr;
  multiply(act.data_ptr<uint8_t>(), act.stride(0), act.size(0), mat, k, out);
}

at::Tensor quant_matmul(const at::Tensor& x, const at::Tensor& w, int64_t type_id, int64_t k,
                        const std::optional<at::Tensor>& rows) {
  const Matrix mat = checked_matrix(w, type_id, k, rows);
  const at::Tensor act = activations(x, k);
  const int64_t m = act.size(0);
  at::Tensor out = at::empty({m, mat.n}, act.options().dtype(at::kFloat));
  if (m == 0 || mat.n == 0) return out;
  multiply_matrix(act, mat, k, {out.data_ptr<float>(), mat.n, false});
  return out;
}

at::Tensor quant_matmul_stack(const at::Tensor& x, at::TensorList ws,
                              at::IntArrayRef type_ids, int64_t k,
                              const c10::List<std::optional<at::Tensor>>& rows, bool pairs) {
  TORCH_CHECK(!ws.empty(), "ws must hold at least one matrix");
  TORCH_CHECK(type_ids.size() == ws.size() && rows.size() == ws.size(), "ws, type_ids and ",
              "rows must have one entry per matrix, not ", ws.size(), ", ", type_ids.size(),
              " and ", rows.size());
  std::vector<Matrix> mats;
  for (size_t j = 0; j < ws.size(); ++j)
    mats.push_back(checked_matrix(ws[j], type_ids[j], k, rows.get(j)));
  return multiply_stack(x, mats, k, pairs);
}

}  // namespace

at::Tensor multiply_stack(const at::Tensor& x, const std::vector<Matrix>& mats, int64_t k,
                          bool pairs) {
  int64_t n = 0;
  for (const Matrix& mat : mats) n += mat.n;
  // Prefill-sized float rows: the wide tiles, more precise than the pairs at half their
  // work (wide.h).
  const Kernels& kern = kernels_for(active_isa());
  if (x.scalar_type() == at::kFloat && x.dim() == 2 && x.size(0) >= kern.wide_min_rows &&
      (pairs ? 2 : 1) * x.size(0) > kern.gemv_max_rows)
    return multiply_wide_stack(x, mats, k, n);
  const at::Tensor act = activations(x, k, pairs);
  TORCH_CHECK(!pairs || act.size(0) % 2 == 0, "x must hold whole (x, residual) pairs of ",
              "rows with pairs, not ", act.size(0), " rows");
  const int64_t m = pairs ? act.size(0) / 2 : act.size(0);
  at::Tensor out = at::empty({m, n}, act.options().dtype(at::kFloat));
  if (m == 0 || n == 0) return out;
  if (act.size(0) <= kern.gemv_max_rows && kern.gemv != nullptr) {
    gemv_rows(kern, act.data_ptr<uint8_t>(), act.stride(0), act.size(0), mats.data(),
              static_cast<int64_t>(mats.size()), k, {out.data_ptr<float>(), n, pairs});
    return out;
  }
  int64_t col = 0;
  for (const Matrix& mat : mats) {
    multiply_matrix(act, mat, k, {out.data_ptr<float>() + col, n, pairs});
    col += mat.n;
  }
  return out;
}

}  // namespace folio_cpu::quant

TORCH_LIBRARY_FRAGMENT(folio_cpu, m) {
  m.def("quant_matmul(Tensor x, Tensor w, int type_id, int k, Tensor? rows=None) -> Tensor",
        &folio_cpu::quant::quant_matmul);
  m.def("quant_matmul_stack(Tensor x, Tensor[] ws, int[] type_ids, int k, Tensor?[] rows, "
        "bool pairs) -> Tensor",
        &folio_cpu::quant::quant_matmul_stack);
}
