// The portable path: plain C++ for any CPU, and the arithmetic the SIMD paths reproduce.
// Per activation block b (32 weights): dx_b * (D_b * S_b - M_b * O_b) with the integers
// S_b = sum_j s_j * sum_{i in j} q_i x_i and O_b = sum_j o_j * xsum_j over its two
// 16-weight sub-blocks j.
#include "kernels.h"

#include <cstdint>

#include "act_row.h"
#include "unpack.h"
#include "wide_impl.h"

namespace folio_cpu::quant {
namespace {

void dot(const Group* w, int64_t groups, const ActRow* x, int mr, bool signed_q,
         float* out) {
  for (int r = 0; r < mr; ++r) {
    float acc = 0.0f;
    for (int64_t g = 0; g < groups; ++g) {
      const Group& wg = w[g];
      const int8_t* xq = x[r].q + g * kGroup;  // [256]
      const int16_t* xs = x[r].sum + g * 16;  // [16]
      for (int b = 0; b < 8; ++b) {
        int32_t s_total = 0, o_total = 0;
        for (int j = 2 * b; j < 2 * b + 2; ++j) {
          int32_t dot_j = 0;
          for (int i = 16 * j; i < 16 * j + 16; ++i) {
            const int32_t q = signed_q ? static_cast<int8_t>(wg.q[i]) : wg.q[i];
            dot_j += q * xq[i];
          }
          s_total += wg.s[j] * dot_j;
          o_total += wg.o[j] * xs[j];
        }
        const float dx = x[r].d[g * 8 + b];
        acc += dx * (wg.d[b] * static_cast<float>(s_total) -
                     wg.m[b] * static_cast<float>(o_total));
      }
    }
    out[r] = acc;
  }
}

const Kernels kPortable{quantize_row_impl, unpack_row_impl, dot, nullptr, nullptr, 0,
                        quantize_wide_impl, unpack_wide_impl, dot_wide_impl, INT64_MAX,
                        nullptr, quantize_residual_impl};

}  // namespace

const Kernels& portable_kernels() { return kPortable; }

}  // namespace folio_cpu::quant
