// The AVX2 path: u8 x s8 products with maddubs (pairs to int16: at most 2 * 63 * 127, or
// 2 * 128 * 127 for Q8_0's |q| through the sign trick, so never saturating), madd with the
// sub-block scales to int32, and float accumulation per activation block.
#include "kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include "gemv256.h"
#include "unpack.h"

namespace folio_cpu::quant {
namespace {

void unpack_row(int type, const uint8_t* row, int64_t k, Group* out) {
  unpack_row_impl(type, row, k, out);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <int MR, bool kSigned>
void dot_rows(const Group* w, int64_t groups, const ActRow* x, float* out) {
  __m256 acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_ps();
  alignas(32) float fd[MR][8];  // dx_b * D_b of the current group, per row
  for (int64_t g = 0; g < groups; ++g) {
    const Group& wg = w[g];
    const __m256 d8 = _mm256_load_ps(wg.d);
    const __m256 m8 = _mm256_load_ps(wg.m);
    const __m256i o16 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wg.o));
    for (int r = 0; r < MR; ++r) {
      const __m256 dx8 = _mm256_loadu_ps(x[r].d + g * 8);
      _mm256_store_ps(fd[r], _mm256_mul_ps(dx8, d8));
      // Lane b: o_2b * xsum_2b + o_2b+1 * xsum_2b+1 = O_b.
      const __m256i xs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[r].sum + g * 16));
      const __m256 o = _mm256_cvtepi32_ps(_mm256_madd_epi16(o16, xs));
      acc[r] = _mm256_fnmadd_ps(o, _mm256_mul_ps(dx8, m8), acc[r]);
    }
    for (int b = 0; b < 8; ++b) {
      __m256i wq = _mm256_load_si256(reinterpret_cast<const __m256i*>(wg.q + 32 * b));
      // int16 lanes 0-7: s_2b, lanes 8-15: s_2b+1.
      const __m256i sc = _mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_set1_epi32(wg.ss[2 * b])), _mm_set1_epi32(wg.ss[2 * b + 1]),
          1);
      const __m256i wsign = wq;
      if constexpr (kSigned) wq = _mm256_abs_epi8(wq);
      for (int r = 0; r < MR; ++r) {
        __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[r].q + g * kGroup + 32 * b));
        if constexpr (kSigned) xq = _mm256_sign_epi8(xq, wsign);
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wq, xq), sc);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(&fd[r][b]), acc[r]);
      }
    }
  }
  for (int r = 0; r < MR; ++r) out[r] = hsum(acc[r]);
}

template <bool kSigned>
void dot_signed(const Group* w, int64_t groups, const ActRow* x, int mr, float* out) {
  switch (mr) {
    case 1: dot_rows<1, kSigned>(w, groups, x, out); break;
    case 2: dot_rows<2, kSigned>(w, groups, x, out); break;
    case 3: dot_rows<3, kSigned>(w, groups, x, out); break;
    default: dot_rows<4, kSigned>(w, groups, x, out); break;
  }
}

void dot(const Group* w, int64_t groups, const ActRow* x, int mr, bool signed_q,
         float* out) {
  if (signed_q) dot_signed<true>(w, groups, x, mr, out);
  else dot_signed<false>(w, groups, x, mr, out);
}

const Kernels kAvx2{unpack_row, dot, gemv};

}  // namespace

const Kernels& avx2_kernels() { return kAvx2; }

}  // namespace folio_cpu::quant
#pragma GCC pop_options

#else
namespace folio_cpu::quant {
const Kernels& avx2_kernels() { return portable_kernels(); }
}  // namespace folio_cpu::quant
#endif
