// The MXFP4 decode kernel (gemv256.h's gemv for type 39; mxfp4.h has the format): each
// block's 16 code bytes split into 32 nibbles, looked up as int8 weights in one shuffle,
// then multiplied as Q8_0's signed weights are (the sign moved onto the activations, |q|
// times x in u8 x s8 pairs: at most 2 * 12 * 127, never saturating), scaled once per
// block by dx_b * D_b. Included by gemv256.h, under each x86 ISA's target pragma, after
// its dot4 and hsum256.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "mxfp4.h"

namespace folio_cpu::quant {
namespace {

template <int MR>
inline void gemv_mxfp4(const uint8_t* w, int64_t k, const ActRow* x, float* out) {
  constexpr int kChains = MR == 1 ? 4 : 1;  // independent fma chains for a lone row
  const __m256i table = _mm256_load_si256(reinterpret_cast<const __m256i*>(kMxfp4Values));
  const __m256i low = _mm256_set1_epi8(0x0F);
  __m256 acc[MR][kChains];
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < kChains; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t i = 0; i < k / 32; ++i) {
    const uint8_t* blk = w + i * 17;
    prefetch_ahead(blk, 1);  // one line per block: a line holds almost four
    const __m128i codes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 1));
    const __m256i both = _mm256_and_si256(
        _mm256_inserti128_si256(_mm256_castsi128_si256(codes), _mm_srli_epi16(codes, 4), 1),
        low);  // weights 0-15: low nibbles, 16-31: high nibbles
    const __m256i q = _mm256_shuffle_epi8(table, both);
    const __m256i qa = _mm256_sign_epi8(q, q);
    const float d = mxfp4_half_scale(blk[0]);
    for (int r = 0; r < MR; ++r) {
      const __m256i xq = _mm256_sign_epi8(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[r].q + 32 * i)), q);
      __m256& a = acc[r][i % kChains];
      a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot4(qa, xq)), _mm256_set1_ps(x[r].d[i] * d), a);
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int c = 1; c < kChains; ++c) acc[r][0] = _mm256_add_ps(acc[r][0], acc[r][c]);
    out[r] = hsum256(acc[r][0]);
  }
}

}  // namespace
}  // namespace folio_cpu::quant
