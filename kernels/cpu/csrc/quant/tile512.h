// The AVX-512 tile kernel, shared by the AVX-512 and AVX512-VNNI files (each compiles it
// under its own target, so the plain AVX-512 copy never holds a VNNI instruction). The
// including file defines accumulate(isum, p16, sc): isum + madd(p16, sc) in int32.
//
// Groups are interleaved so that int32 lanes 2b, 2b+1 of every 64-byte chunk u hold 8
// weights of block b (bytes 8u..8u+7 of it; chunks 0-1 its first 16-weight sub-block,
// 2-3 the second). maddubs pairs (never saturating: at most 2 * 63 * 127, or 2 * 128 * 127
// for Q8_0's |q| with the sign moved onto x), then madd with the int16 scales, summed in
// int32 over the group; the float scaling dx_b * D_b once per group.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "gemv256.h"  // hsum256
#include "kernels.h"

namespace folio_cpu::quant {
namespace {

// q[groups][256], in place: qword u of block b moves to qword b of chunk u.
inline void interleave(uint8_t* q, int64_t groups) {
  // Qword i of chunk p is block 2p + i / 4, qword i % 4. First gather qwords u = 0, 1 (lo)
  // and 2, 3 (hi) of blocks 2p..2p+3 from chunk pairs, then the 128-bit halves.
  const __m512i lo = _mm512_set_epi64(13, 9, 5, 1, 12, 8, 4, 0);
  const __m512i hi = _mm512_set_epi64(15, 11, 7, 3, 14, 10, 6, 2);
  for (int64_t g = 0; g < groups; ++g) {
    uint8_t* p = q + g * kGroup;
    const __m512i r0 = _mm512_loadu_si512(p), r1 = _mm512_loadu_si512(p + 64);
    const __m512i r2 = _mm512_loadu_si512(p + 128), r3 = _mm512_loadu_si512(p + 192);
    const __m512i a_lo = _mm512_permutex2var_epi64(r0, lo, r1);  // u0: b0-3, u1: b0-3
    const __m512i a_hi = _mm512_permutex2var_epi64(r0, hi, r1);
    const __m512i b_lo = _mm512_permutex2var_epi64(r2, lo, r3);  // blocks 4-7
    const __m512i b_hi = _mm512_permutex2var_epi64(r2, hi, r3);
    _mm512_storeu_si512(p, _mm512_shuffle_i64x2(a_lo, b_lo, 0x44));
    _mm512_storeu_si512(p + 64, _mm512_shuffle_i64x2(a_lo, b_lo, 0xEE));
    _mm512_storeu_si512(p + 128, _mm512_shuffle_i64x2(a_hi, b_hi, 0x44));
    _mm512_storeu_si512(p + 192, _mm512_shuffle_i64x2(a_hi, b_hi, 0xEE));
  }
}

template <int MR, bool kSigned>
void dot_rows(const Group* w, int64_t groups, const ActRow* x, float* out) {
  __m512 acc[MR];
  __m256 off[MR];  // the offset terms, per block lane
  for (int r = 0; r < MR; ++r) {
    acc[r] = _mm512_setzero_ps();
    off[r] = _mm256_setzero_ps();
  }
  // int16 lane l is int32 lane l / 2, block l / 4: scale s_2(l/4) (+1 for the second half).
  const __m512i even = _mm512_set_epi16(14, 14, 14, 14, 12, 12, 12, 12, 10, 10, 10, 10, 8, 8, 8, 8,
                                        6, 6, 6, 6, 4, 4, 4, 4, 2, 2, 2, 2, 0, 0, 0, 0);
  const __m512i odd = _mm512_add_epi16(even, _mm512_set1_epi16(1));
  // int32 lane t: block t / 2.
  const __m512i pair = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  for (int64_t g = 0; g < groups; ++g) {
    const Group& wg = w[g];
    const __m512i s = _mm512_castsi256_si512(_mm256_load_si256(reinterpret_cast<const __m256i*>(wg.s)));
    const __m512i sc[2] = {_mm512_permutexvar_epi16(even, s), _mm512_permutexvar_epi16(odd, s)};
    const __m256 d8 = _mm256_load_ps(wg.d), m8 = _mm256_load_ps(wg.m);
    const __m256i o16 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wg.o));
    __m512i isum[MR];
    for (int r = 0; r < MR; ++r) isum[r] = _mm512_setzero_si512();
    // Chunk pairs (0, 1) and (2, 3) share their sub-block scales. Unsigned q (<= 63) lets a
    // pair's maddubs results add in int16 first (at most 4 * 63 * 127 = 32004) and take
    // one madd; Q8_0's |q| <= 128 may not.
    for (int h = 0; h < 2; ++h) {
      __m512i wq[2];
      __mmask64 neg[2] = {0, 0};
      for (int c = 0; c < 2; ++c) {
        wq[c] = _mm512_load_si512(wg.q + 128 * h + 64 * c);
        if constexpr (kSigned) {
          neg[c] = _mm512_movepi8_mask(wq[c]);
          wq[c] = _mm512_abs_epi8(wq[c]);
        }
      }
      for (int r = 0; r < MR; ++r) {
        const int8_t* xp = x[r].q + g * kGroup + 128 * h;
        __m512i x0 = _mm512_loadu_si512(xp), x1 = _mm512_loadu_si512(xp + 64);
        if constexpr (kSigned) {
          x0 = _mm512_mask_sub_epi8(x0, neg[0], _mm512_setzero_si512(), x0);
          x1 = _mm512_mask_sub_epi8(x1, neg[1], _mm512_setzero_si512(), x1);
        }
        const __m512i p0 = _mm512_maddubs_epi16(wq[0], x0), p1 = _mm512_maddubs_epi16(wq[1], x1);
        if constexpr (kSigned) {
          isum[r] = accumulate(accumulate(isum[r], p0, sc[h]), p1, sc[h]);
        } else {
          isum[r] = accumulate(isum[r], _mm512_add_epi16(p0, p1), sc[h]);
        }
      }
    }
    for (int r = 0; r < MR; ++r) {
      const __m256 dx8 = _mm256_loadu_ps(x[r].d + g * 8);
      const __m512 fd = _mm512_permutexvar_ps(pair, _mm512_castps256_ps512(_mm256_mul_ps(dx8, d8)));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), fd, acc[r]);
      // Lane b: o_2b * xsum_2b + o_2b+1 * xsum_2b+1 = O_b.
      const __m256i xs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[r].sum + g * 16));
      off[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(o16, xs)),
                                _mm256_mul_ps(dx8, m8), off[r]);
    }
  }
  for (int r = 0; r < MR; ++r)
    out[r] = _mm512_reduce_add_ps(acc[r]) + hsum256(off[r]);
}

}  // namespace
}  // namespace folio_cpu::quant

#include "dot_dispatch.h"
