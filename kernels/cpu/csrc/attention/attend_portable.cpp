// The attention kernel for any CPU: what the compiler's baseline target vectorizes.
#include <c10/util/Half.h>

#include "attention/attend_isa.h"

namespace folio_cpu::attention::portable {
namespace {

inline void floats_from_halves(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = c10::detail::fp16_ieee_to_fp32_value(src[i]);
}

}  // namespace

void halves_from_floats(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = c10::detail::fp16_ieee_from_fp32_value(src[i]);
}

}  // namespace folio_cpu::attention::portable

#define FOLIO_ISA_NS portable
#define FOLIO_KV_FLOAT_KINDS 1
#include "attention/attend_kernel.inc"
