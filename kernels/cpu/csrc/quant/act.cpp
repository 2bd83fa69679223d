// quantize_activations: each row once to int8 blocks of 32 with a float scale and int16
// sums per 16 (layout.h), so every weight type's offset term is one small integer dot.
#include "act.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>

#include "layout.h"

namespace folio_cpu::quant {

void quantize_row(const float* x, int64_t k, uint8_t* out) {
  const int64_t kp = padded_k(k);
  std::memset(out, 0, static_cast<size_t>(act_row_bytes(k)));
  int8_t* q = reinterpret_cast<int8_t*>(out);               // [kp]
  float* d = reinterpret_cast<float*>(out + kp);             // [kp / 32]
  int16_t* sum = reinterpret_cast<int16_t*>(out + kp + kp / 8);  // [kp / 16]
  // Adding and subtracting 1.5 * 2^23 rounds |v| < 2^22 to the nearest integer, ties to
  // even (what nearbyint does in the default mode), in a loop the compiler vectorizes.
  constexpr float kRound = 12582912.0f;
  for (int64_t b = 0; b < k / 32; ++b) {
    const float* xb = x + 32 * b;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) {
      const float a = std::fabs(xb[i]);
      amax = a > amax ? a : amax;
    }
    const float db = amax / 127.0f;
    const float inv = db != 0.0f ? 1.0f / db : 0.0f;
    int8_t* qb = q + 32 * b;
    for (int i = 0; i < 32; ++i) {
      float v = (xb[i] * inv + kRound) - kRound;
      v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
      qb[i] = static_cast<int8_t>(v);
    }
    d[b] = db;
    for (int h = 0; h < 2; ++h) {
      int s = 0;
      for (int i = 16 * h; i < 16 * h + 16; ++i) s += qb[i];
      sum[2 * b + h] = static_cast<int16_t>(s);
    }
  }
}

at::Tensor quantize_activations(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu(), "x must be on the CPU, not ", x.device());
  TORCH_CHECK(x.scalar_type() == at::kFloat, "x must be float32, not ", x.scalar_type());
  TORCH_CHECK(x.dim() == 2, "x must be 2-D [m, k], not ", x.sizes());
  const int64_t m = x.size(0), k = x.size(1);
  TORCH_CHECK(k > 0 && k % 32 == 0, "x's k (", k, ") must be a positive multiple of 32");
  const at::Tensor xr = x.stride(1) == 1 ? x : x.contiguous();
  const int64_t row_bytes = act_row_bytes(k);
  at::Tensor out = at::empty({m, row_bytes}, x.options().dtype(at::kByte));
  const float* xp = xr.data_ptr<float>();
  const int64_t xstride = xr.stride(0);
  uint8_t* op = out.data_ptr<uint8_t>();
  at::parallel_for(0, m, (1 << 15) / k + 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) quantize_row(xp + i * xstride, k, op + i * row_bytes);
  });
  return out;
}

}  // namespace folio_cpu::quant

TORCH_LIBRARY_FRAGMENT(folio_cpu, m) {
  m.def("quantize_activations(Tensor x) -> Tensor", &folio_cpu::quant::quantize_activations);
}
