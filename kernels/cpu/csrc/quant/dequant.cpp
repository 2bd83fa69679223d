// dequantize_rows: the embedding lookup. Float32 results bit-equal to llama.cpp's
// dequantize_row_* (and gguf.quants.dequantize): the same products in the same order,
// from the unpacked Group (weights w = D * s * q - M * o, layout.h), per type.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <vector>

#include "checks.h"
#include "unpack.h"

namespace folio_cpu::quant {
namespace {

// One group's n (<= 256) weights into out[n].
void dequantize_group(int type, const Group& g, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const int b = static_cast<int>(i / 32), j = static_cast<int>(i / 16);
    const float d = g.d[b];
    const int q = g.q[i];
    switch (type) {
      case kQ4_0:
      case kQ5_0: out[i] = d * static_cast<float>(q - g.o[j]); break;
      case kQ8_0:
      case kMXFP4: out[i] = static_cast<float>(static_cast<int8_t>(g.q[i])) * d; break;
      // M holds -m: d * q - (-m) is d * q + m exactly.
      case kQ4_1:
      case kQ5_1: out[i] = d * static_cast<float>(q) - g.m[b]; break;
      case kQ2_K:
      case kQ4_K:
      case kQ5_K:
        out[i] = (d * static_cast<float>(g.s[j])) * static_cast<float>(q) -
                 g.m[b] * static_cast<float>(g.o[j]);
        break;
      case kQ3_K: out[i] = (d * static_cast<float>(g.s[j])) * static_cast<float>(q - 4); break;
      case kQ6_K: out[i] = (d * static_cast<float>(g.s[j])) * static_cast<float>(q - 32); break;
    }
  }
}

at::Tensor dequantize_rows(const at::Tensor& w, const at::Tensor& ids, int64_t type_id,
                           int64_t k) {
  const BlockType bt = check_type(type_id, k);
  check_weight(w, bt, k);
  check_indices(ids, "ids", w.size(0));
  const at::Tensor idc = ids.contiguous();
  const int64_t t = idc.numel();
  at::Tensor out = at::empty({t, k}, w.options().dtype(at::kFloat));
  const int64_t* id = idc.data_ptr<int64_t>();
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const int64_t stride = w.stride(0);
  float* op = out.data_ptr<float>();
  const int64_t groups = padded_k(k) / kGroup;
  const int type = static_cast<int>(type_id);
  at::parallel_for(0, t, (1 << 16) / k + 1, [&](int64_t lo, int64_t hi) {
    std::vector<Group> buf(static_cast<size_t>(groups));
    for (int64_t r = lo; r < hi; ++r) {
      unpack_row_impl(type, wp + id[r] * stride, k, buf.data());
      for (int64_t g = 0; g < groups; ++g)
        dequantize_group(type, buf[g], std::min(kGroup, k - g * kGroup), op + r * k + g * kGroup);
    }
  });
  return out;
}

}  // namespace
}  // namespace folio_cpu::quant

TORCH_LIBRARY_FRAGMENT(folio_cpu, m) {
  m.def("dequantize_rows(Tensor w, Tensor ids, int type_id, int k) -> Tensor",
        &folio_cpu::quant::dequantize_rows);
}
