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

namespace folio_cpu::attention::avx512 {
namespace {

// The 16 lane sums of v[0..15] in one vector (lane i: the sum of v[i]'s lanes), by a
// tree of 15 two-vector steps instead of 16 serial adds per vector.
inline __m512 lane_sums16(const __m512* v) {
  __m512 t[8], u[4], w[2];
  // Per 128-bit lane: [a0 + a2, b0 + b2, a1 + a3, b1 + b3].
#pragma GCC unroll 8
  for (int p = 0; p < 8; ++p)
    t[p] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * p], v[2 * p + 1]),
                         _mm512_unpackhi_ps(v[2 * p], v[2 * p + 1]));
  // Per 128-bit lane: the four vectors 4p..4p+3, each summed over that lane's four floats.
#pragma GCC unroll 4
  for (int p = 0; p < 4; ++p)
    u[p] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * p], t[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(t[2 * p], t[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  // 128-bit lanes pairwise across registers, twice: lane L of the result holds vectors
  // 4L..4L+3 summed over all 16 floats.
#pragma GCC unroll 2
  for (int p = 0; p < 2; ++p)
    w[p] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * p], u[2 * p + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(u[2 * p], u[2 * p + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// out[r][j] = q_r . key_j for a block's 16 keys (rows slot_stride floats apart, read in
// place) and nrows <= 4 rows, hd a multiple of 16: decode rows, too few to pay for the
// transposed keys (scores16). Per row, 16 vector dot products, then one lane_sums16.
inline void key_scores16(const float* const* q, int nrows, const float* keys,
                         int64_t slot_stride, int64_t hd, float (*out)[16]) {
  for (int r = 0; r < nrows; ++r) {
    __m512 v[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) v[j] = _mm512_setzero_ps();
    for (int64_t d = 0; d < hd; d += 16) {
      const __m512 qd = _mm512_loadu_ps(q[r] + d);
#pragma GCC unroll 16
      for (int j = 0; j < 16; ++j)
        v[j] = _mm512_fmadd_ps(qd, _mm512_loadu_ps(keys + j * slot_stride + d), v[j]);
    }
    _mm512_storeu_ps(out[r], lane_sums16(v));
  }
}

inline void floats_from_halves(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(
                                  reinterpret_cast<const __m256i*>(src + i))));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(dst + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src + i)));
  }
}

}  // namespace

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
#define FOLIO_ISA_NS avx512
#include "attention/attend_kernel.inc"
#pragma GCC pop_options
#endif
