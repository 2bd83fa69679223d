// quant_matmul: x [m, k] @ W.T for a GGUF-quantized W, one code path from m = 1 to prefill.
//
// Work is split into tiles of kTileN weight rows x kTileM activation rows, run in parallel
// (m-tile major, so a thread's consecutive tiles share their activations). Within a tile,
// the weights are unpacked chunk by chunk along k (kChunk groups, so the chunk of every
// tile row plus four activation rows stays in L1) and each unpacked chunk is multiplied
// by all the tile's activation rows, four at a time: every weight block is read from the
// file once per tile, and for m <= kTileM (decode) once per call.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "act.h"
#include "checks.h"
#include "kernels.h"

namespace folio_cpu::quant {
namespace {

constexpr int64_t kTileN = 8;
constexpr int64_t kTileM = 64;
constexpr int64_t kChunk = 4;  // groups of 256 weights

// Decode-sized m: each weight row read once from the file's blocks for all m rows.
void gemv_rows(const Kernels& kern, const uint8_t* act, int64_t act_stride, int64_t m,
               const uint8_t* w, int64_t w_stride, const int64_t* rows, int64_t n, int type,
               int64_t k, float* out) {
  ActRow x[kGemvRows];
  for (int64_t i = 0; i < m; ++i) x[i] = act_row(act + i * act_stride, k);
  at::parallel_for(0, n, 8, [&](int64_t lo, int64_t hi) {
    for (int64_t j = lo; j < hi; ++j) {
      const uint8_t* row = w + (rows ? rows[j] : j) * w_stride;
      for (int64_t i0 = 0; i0 < m; i0 += kMaxRows) {
        const int mr = static_cast<int>(std::min<int64_t>(kMaxRows, m - i0));
        float part[kMaxRows];
        kern.gemv(type, row, k, x + i0, mr, part);
        for (int i = 0; i < mr; ++i) out[(i0 + i) * n + j] = part[i];
      }
    }
  });
}

void multiply(const uint8_t* act, int64_t act_stride, int64_t m, const uint8_t* w,
              int64_t w_stride, const int64_t* rows, int64_t n, int type, int64_t k,
              float* out) {
  const Kernels& kern = kernels_for(active_isa());
  if (m <= kGemvRows && kern.gemv != nullptr) {
    gemv_rows(kern, act, act_stride, m, w, w_stride, rows, n, type, k, out);
    return;
  }
  const int64_t groups = padded_k(k) / kGroup;
  const int64_t ntiles = (n + kTileN - 1) / kTileN;
  const int64_t mtiles = (m + kTileM - 1) / kTileM;
  const bool signed_q = type == kQ8_0;
  const BlockType bt = block_type(type);
  // The weight bytes of one chunk: whole blocks (a 32-block type's chunk is 8 * kChunk
  // blocks, its last chunk possibly fewer).
  const int64_t chunk_weights = kChunk * kGroup;
  const int64_t chunk_bytes = chunk_weights / bt.block_size * bt.block_bytes;
  at::parallel_for(0, ntiles * mtiles, 1, [&](int64_t lo, int64_t hi) {
    std::vector<Group> buf(static_cast<size_t>(kTileN * kChunk));  // [kTileN][kChunk]
    std::vector<float> acc(static_cast<size_t>(kTileM * kTileN));  // [kTileM][kTileN]
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t m0 = t / ntiles * kTileM, n0 = t % ntiles * kTileN;
      const int64_t tm = std::min(kTileM, m - m0), tn = std::min(kTileN, n - n0);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t g0 = 0; g0 < groups; g0 += kChunk) {
        const int64_t cg = std::min(kChunk, groups - g0);
        const int64_t ck = std::min(chunk_weights, k - g0 * kGroup);  // weights in chunk
        for (int64_t r = 0; r < tn; ++r) {
          const int64_t row = rows ? rows[n0 + r] : n0 + r;
          kern.unpack_row(type, w + row * w_stride + g0 / kChunk * chunk_bytes, ck,
                          buf.data() + r * kChunk);
        }
        for (int64_t i0 = 0; i0 < tm; i0 += kMaxRows) {
          const int mr = static_cast<int>(std::min<int64_t>(kMaxRows, tm - i0));
          ActRow x[kMaxRows];
          for (int i = 0; i < mr; ++i) {
            const ActRow full = act_row(act + (m0 + i0 + i) * act_stride, k);
            x[i] = {full.q + g0 * kGroup, full.d + g0 * 8, full.sum + g0 * 16};
          }
          for (int64_t r = 0; r < tn; ++r) {
            float part[kMaxRows];
            kern.dot(buf.data() + r * kChunk, cg, x, mr, signed_q, part);
            for (int i = 0; i < mr; ++i) acc[(i0 + i) * kTileN + r] += part[i];
          }
        }
      }
      for (int64_t i = 0; i < tm; ++i)
        for (int64_t r = 0; r < tn; ++r) out[(m0 + i) * n + n0 + r] = acc[i * kTileN + r];
    }
  });
}

at::Tensor quant_matmul(const at::Tensor& x, const at::Tensor& w, int64_t type_id, int64_t k,
                        const std::optional<at::Tensor>& rows) {
  const BlockType bt = check_type(type_id, k);
  check_weight(w, bt, k);
  TORCH_CHECK(x.device().is_cpu(), "x must be on the CPU, not ", x.device());
  TORCH_CHECK(x.dim() == 2, "x must be 2-D, not ", x.sizes());
  at::Tensor act;
  if (x.scalar_type() == at::kFloat) {
    TORCH_CHECK(x.size(1) == k, "x has ", x.size(1), " columns but k is ", k);
    act = quantize_activations(x);
  } else {
    TORCH_CHECK(x.scalar_type() == at::kByte, "x must be float32 [m, k] or the uint8 ",
                "output of quantize_activations, not ", x.scalar_type());
    TORCH_CHECK(x.size(1) == act_row_bytes(k), "x (quantized activations) has ", x.size(1),
                " bytes per row; k = ", k, " needs act_row_bytes(k) = ", act_row_bytes(k));
    act = x.stride(1) == 1 ? x : x.contiguous();
  }
  at::Tensor rows_c;
  int64_t n = w.size(0);
  if (rows.has_value()) {
    check_indices(*rows, "rows", w.size(0));
    rows_c = rows->contiguous();
    n = rows_c.numel();
  }
  const int64_t m = act.size(0);
  at::Tensor out = at::empty({m, n}, act.options().dtype(at::kFloat));
  if (m == 0 || n == 0) return out;
  multiply(act.data_ptr<uint8_t>(), act.stride(0), m, w.data_ptr<uint8_t>(), w.stride(0),
           rows.has_value() ? rows_c.data_ptr<int64_t>() : nullptr, n,
           static_cast<int>(type_id), k, out.data_ptr<float>());
  return out;
}

}  // namespace
}  // namespace folio_cpu::quant

TORCH_LIBRARY_FRAGMENT(folio_cpu, m) {
  m.def("quant_matmul(Tensor x, Tensor w, int type_id, int k, Tensor? rows=None) -> Tensor",
        &folio_cpu::quant::quant_matmul);
}
