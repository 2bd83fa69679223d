// Register shuffles of 16 AVX-512 vectors that the attention and the quantized products
// share. Include it under an AVX-512 target pragma: its functions are internal to each
// including file, compiled for that file's target.
#pragma once

#include <immintrin.h>

namespace folio_cpu {
namespace {

// out[j] = word j of every row: a 16 x 16 transpose of 32-bit words in registers (floats
// through _mm512_castps_si512, which costs nothing).
inline void transpose16(const __m512i* r, __m512i* out) {
  __m512i a[16], b[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {  // per 128-bit chunk: words 4q..4q+3 of rows 2i, 2i + 1
    a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {  // b[4i + e], chunk q: word 4q + e of rows 4i..4i + 3
    b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
    b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
  }
#pragma GCC unroll 4
  for (int e = 0; e < 4; ++e) {  // a 4 x 4 transpose of the 128-bit chunks
    const __m512i c0 = _mm512_shuffle_i32x4(b[e], b[4 + e], 0x44);
    const __m512i c1 = _mm512_shuffle_i32x4(b[e], b[4 + e], 0xEE);
    const __m512i c2 = _mm512_shuffle_i32x4(b[8 + e], b[12 + e], 0x44);
    const __m512i c3 = _mm512_shuffle_i32x4(b[8 + e], b[12 + e], 0xEE);
    out[e] = _mm512_shuffle_i32x4(c0, c2, 0x88);
    out[4 + e] = _mm512_shuffle_i32x4(c0, c2, 0xDD);
    out[8 + e] = _mm512_shuffle_i32x4(c1, c3, 0x88);
    out[12 + e] = _mm512_shuffle_i32x4(c1, c3, 0xDD);
  }
}

// The lane sums of v[0..16) as the lanes of one vector, in order (lane i: the sum of
// v[i]'s lanes): a transposing tree of 15 adds (45 instructions, where 16 separate
// reductions take about 130).
inline __m512 lane_sums16(const __m512* v) {
  __m512 t[8], u[4], w[2];
#pragma GCC unroll 8
  for (int p = 0; p < 8; ++p)  // per 128-bit chunk: [a0 + a2, b0 + b2, a1 + a3, b1 + b3]
    t[p] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * p], v[2 * p + 1]),
                         _mm512_unpackhi_ps(v[2 * p], v[2 * p + 1]));
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q)  // chunk c: the chunk-c sums of v[4q], .., v[4q + 3]
    u[q] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * q], t[2 * q + 1], 0x44),
                         _mm512_shuffle_ps(t[2 * q], t[2 * q + 1], 0xEE));
#pragma GCC unroll 2
  for (int r = 0; r < 2; ++r)  // the chunk pairs' sums
    w[r] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * r], u[2 * r + 1], 0x88),
                         _mm512_shuffle_f32x4(u[2 * r], u[2 * r + 1], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x88),
                       _mm512_shuffle_f32x4(w[0], w[1], 0xDD));
}

}  // namespace
}  // namespace folio_cpu
