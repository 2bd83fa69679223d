// The attention kernel for AVX-512 CPUs (dispatched by active_isa()); 512-bit vectors
// so one key row of 64 floats is four loads.
#include "attention/attend_isa.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

#pragma GCC push_options
// GCC 12 flags the deliberately undefined upper lanes of its own cast intrinsics.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c,prefer-vector-width=512")

#include "simd512.h"

#include "attention/attend_avx512_tiles.h"

namespace folio_cpu::attention::avx512 {

void halves_from_floats(const float* src, uint16_t* dst, int64_t n) {
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(src + i), kRound));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm256_mask_storeu_epi16(dst + i, m, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i), kRound));
  }
}

}  // namespace folio_cpu::attention::avx512

#define FOLIO_KEY_SCORES 1
#define FOLIO_KEY_SCORES_ANY_POOL 1
#define FOLIO_INT8_IN_PLACE 1
#define FOLIO_TRANSPOSED_SCORES 1
#define FOLIO_ISA_NS avx512
#define FOLIO_KV_FLOAT_KINDS 1
#include "attention/attend_kernel.inc"
#pragma GCC pop_options
#endif
