// The attention kernel for AVX2 + FMA CPUs (dispatched by active_isa()).
#include "attention/attend_isa.h"

#if defined(__x86_64__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#include "attention/attend_avx2_tiles.h"

namespace folio_cpu::attention::avx2 {

void halves_from_floats(const float* src, uint16_t* dst, int64_t n) {
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), kRound));
  if (i == n) return;
  const int64_t rest = n - i < 8 ? n - i : 8;
  float tail[8] = {};
  uint16_t out[8];
  for (int64_t j = 0; j < rest; ++j) tail[j] = src[i + j];
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_cvtps_ph(_mm256_loadu_ps(tail), kRound));
  for (int64_t j = 0; j < rest; ++j) dst[i + j] = out[j];
}

}  // namespace folio_cpu::attention::avx2

#define FOLIO_KEY_SCORES 1
#define FOLIO_KEY_SCORES_ANY_POOL 1
#define FOLIO_INT8_IN_PLACE 1
#define FOLIO_ISA_NS avx2
#define FOLIO_KV_FLOAT_KINDS 1
#include "attention/attend_kernel.inc"
#pragma GCC pop_options
#endif
