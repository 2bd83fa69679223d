// The wide tiles: float activations quantized once to 16-bit chunks (wide.h), multiplied
// by tiles of kTileN weight rows x tile_m (<= kMaxTileM) activation rows in parallel.
// A tile unpacks its weight rows kSlice chunks at a time (the slice of its kTileN rows,
// about 150 KiB, stays in L2 while every activation row of the tile passes over it), and
// dot_wide runs kWideCols x kWideRows blocks of the slice. Unpacking costs 1 / tile_m of
// the products, so the tiles take over from gemv at a handful of rows.
#include "matmul.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <vector>

namespace folio_cpu::quant {
namespace {

constexpr int64_t kTileN = 32;
constexpr int64_t kSlice = 4;  // chunks: 2,048 weights of a row
constexpr int64_t kMaxTileM = 256;

}  // namespace

at::Tensor quantize_wide_rows(const Kernels& kern, const at::Tensor& x) {
  const int64_t m = x.size(0), k = x.size(1), chunks = wide_chunks(k);
  const int64_t row_bytes = chunks * static_cast<int64_t>(sizeof(WideChunk));
  // 64 extra bytes: the chunks' 64-byte alignment within an allocation aligned to less.
  at::Tensor buf = at::empty({m * row_bytes + 64}, x.options().dtype(at::kByte));
  const auto base = reinterpret_cast<uintptr_t>(buf.data_ptr<uint8_t>());
  const int64_t skip = static_cast<int64_t>((64 - base % 64) % 64);
  at::Tensor out = buf.narrow(0, skip, m * row_bytes).view({m, row_bytes});
  const float* xp = x.data_ptr<float>();
  const int64_t xs = x.stride(0);
  auto* op = reinterpret_cast<WideChunk*>(out.data_ptr<uint8_t>());
  at::parallel_for(0, m, (1 << 15) / k + 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) kern.quantize_wide(xp + i * xs, k, op + i * chunks);
  });
  return out;
}

void multiply_wide(const Kernels& kern, const at::Tensor& xw, int64_t k, const uint8_t* w,
                   int64_t w_stride, const int64_t* rows, int64_t n, int type, Out out) {
  const int64_t m = xw.size(0), chunks = wide_chunks(k);
  const auto* x = reinterpret_cast<const WideChunk*>(xw.data_ptr<uint8_t>());
  const bool has_min = !wide_folds(type);
  const int64_t ntiles = (n + kTileN - 1) / kTileN;
  // Equal m-tiles: a remainder tile would leave a thread idle.
  const int64_t mtiles = (m + kMaxTileM - 1) / kMaxTileM;
  const int64_t tile_m = (m + mtiles - 1) / mtiles;
  at::parallel_for(0, ntiles * mtiles, 1, [&](int64_t lo, int64_t hi) {
    std::vector<WideChunk> wbuf(static_cast<size_t>(kTileN * kSlice));  // [kTileN][kSlice]
    std::vector<float> acc(static_cast<size_t>(tile_m * kTileN));      // [tile m][kTileN]
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t m0 = t / ntiles * tile_m, n0 = t % ntiles * kTileN;
      const int64_t tm = std::min(tile_m, m - m0), tn = std::min(kTileN, n - n0);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t c0 = 0; c0 < chunks; c0 += kSlice) {
        const int64_t cs = std::min(kSlice, chunks - c0);
        for (int64_t r = 0; r < tn; ++r) {
          const uint8_t* row = w + (rows ? rows[n0 + r] : n0 + r) * w_stride;
          kern.unpack_wide(type, row, k, c0, cs, wbuf.data() + r * kSlice);
        }
        for (int64_t i0 = 0; i0 < tm; i0 += kWideRows) {
          const int mr = static_cast<int>(std::min<int64_t>(kWideRows, tm - i0));
          const WideChunk* xr[kWideRows];
          for (int i = 0; i < mr; ++i) xr[i] = x + (m0 + i0 + i) * chunks + c0;
          for (int64_t r0 = 0; r0 < tn; r0 += kWideCols) {
            const int nr = static_cast<int>(std::min<int64_t>(kWideCols, tn - r0));
            const WideChunk* wr[kWideCols];
            for (int r = 0; r < nr; ++r) wr[r] = wbuf.data() + (r0 + r) * kSlice;
            float part[kWideRows * kWideCols] = {};
            kern.dot_wide(wr, nr, xr, mr, cs, has_min, part);
            for (int i = 0; i < mr; ++i)
              for (int r = 0; r < nr; ++r) acc[(i0 + i) * kTileN + r0 + r] += part[i * nr + r];
          }
        }
      }
      for (int64_t i = 0; i < tm; ++i)
        for (int64_t r = 0; r < tn; ++r)
          out.data[(m0 + i) * out.stride + n0 + r] = acc[i * kTileN + r];
    }
  });
}

}  // namespace folio_cpu::quant
