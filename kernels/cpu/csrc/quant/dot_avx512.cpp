// The AVX-512 (F/BW/VL) path: the tile kernel on 64 weights per instruction (tile512.h)
// and the fused decode kernels (gemv256.h).
#include "kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>  // before the target pragma: gemv512.h uses it

#pragma GCC push_options
// GCC 12 flags the deliberately undefined upper lanes of its own cast intrinsics.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
#define FOLIO_QUANT_F16C 1
#define FOLIO_QUANT_AVX2 1

namespace folio_cpu::quant {
namespace {
constexpr int64_t kGemvBlockRows = 8;
inline __m256i dot4(__m256i q, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), _mm256_set1_epi16(1));
}
inline __m512i accumulate(__m512i isum, __m512i p16, __m512i sc) {
  return _mm512_add_epi32(isum, _mm512_madd_epi16(p16, sc));
}
// acc + int32 lanes of 4 u8 x s8 products (gemv512.h): maddubs pairs saturate past q = 128, so Q8_0 stays on gemv256.h.
inline __m512i dot16(__m512i acc, __m512i q, __m512i x) {
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(q, x), _mm512_set1_epi16(1)));
}
// isum + the int32 pair sums of w * x (wide512.h).
inline __m512i wide_acc(__m512i isum, __m512i w, __m512i x) {
  return _mm512_add_epi32(isum, _mm512_madd_epi16(w, x));
}
constexpr bool kDot16Wide = false;
}  // namespace
}  // namespace folio_cpu::quant

#include "kernels512.h"

namespace folio_cpu::quant {

const Kernels& avx512_kernels() { return kKernels; }

}  // namespace folio_cpu::quant
#pragma GCC pop_options

#else
namespace folio_cpu::quant {
const Kernels& avx512_kernels() { return portable_kernels(); }
}  // namespace folio_cpu::quant
#endif
