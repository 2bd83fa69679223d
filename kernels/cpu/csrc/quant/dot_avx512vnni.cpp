// The AVX512-VNNI path: the AVX-512 kernels with vpdpwssd fusing the tile kernel's
// madd and add (tile512.h), and the fused decode kernels (gemv256.h).
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
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#define FOLIO_QUANT_F16C 1
#define FOLIO_QUANT_AVX2 1

namespace folio_cpu::quant {
namespace {
constexpr int64_t kGemvBlockRows = 8;
inline __m256i dot4(__m256i q, __m256i x) {
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, x);
}
inline __m512i accumulate(__m512i isum, __m512i p16, __m512i sc) {
  return _mm512_dpwssd_epi32(isum, p16, sc);
}
// acc + int32 lanes of 4 u8 x s8 products (gemv512.h).
inline __m512i dot16(__m512i acc, __m512i q, __m512i x) {
  return _mm512_dpbusd_epi32(acc, q, x);
}
// isum + the int32 pair sums of w * x (wide512.h).
inline __m512i wide_acc(__m512i isum, __m512i w, __m512i x) {
  return _mm512_dpwssd_epi32(isum, w, x);
}
constexpr bool kDot16Wide = true;
}  // namespace
}  // namespace folio_cpu::quant

#include "kernels512.h"

namespace folio_cpu::quant {

const Kernels& avx512_vnni_kernels() { return kKernels; }

}  // namespace folio_cpu::quant
#pragma GCC pop_options

#else
namespace folio_cpu::quant {
const Kernels& avx512_vnni_kernels() { return portable_kernels(); }
}  // namespace folio_cpu::quant
#endif
