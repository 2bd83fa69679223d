// The attention kernel for AVX2 + FMA CPUs (dispatched by active_isa()).
#include "attention/attend_isa.h"

#if defined(__x86_64__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace folio_cpu::attention::avx2 {
namespace {

inline void floats_from_halves(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(
                                  reinterpret_cast<const __m128i*>(src + i))));
  if (i == n) return;
  const int64_t rest = n - i < 8 ? n - i : 8;  // the tail, through 8-wide buffers
  uint16_t tail[8] = {};
  float out[8];
  for (int64_t j = 0; j < rest; ++j) tail[j] = src[i + j];
  _mm256_storeu_ps(out, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tail))));
  for (int64_t j = 0; j < rest; ++j) dst[i + j] = out[j];
}

}  // namespace

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

#define FOLIO_ISA_NS avx2
#include "attention/attend_kernel.inc"
#pragma GCC pop_options
#endif
