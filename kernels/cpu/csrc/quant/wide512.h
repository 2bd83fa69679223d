// The AVX-512 wide tile kernel (wide.h's format), shared by the AVX-512 and AVX512-VNNI
// files: each defines wide_acc(isum, w, x) (isum + the int32 pair sums of w * x: madd
// and add, or vpdpwssd) under its own target before including this.
//
// Register blocking: 2 weight rows x 4 activation rows, 8 int32 accumulators per chunk
// and 8 float ones over the range (plus the 6 rows' loads: 22 of the 32 registers), so
// each loaded vector feeds 2 or 4 multiplies.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "wide_impl.h"

namespace folio_cpu::quant {
namespace {

// out[j] = word j of every row: a 16 x 16 transpose of int32 words in registers.
inline void transpose16(const __m512i* r, __m512i* out) {
  __m512i a[16], b[16];
  for (int i = 0; i < 8; ++i) {  // per 128-bit chunk: words 4q..4q+3 of rows 2i, 2i + 1
    a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // b[4i + e], chunk q: word 4q + e of rows 4i..4i + 3
    b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
    b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
  }
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

// Block b of a Group as 32 int16 values s_j q_i (- o_j where the type folds).
inline __m512i group_block16(const Group& g, int b, bool fold, bool signed_q) {
  const __m256i q8 = _mm256_load_si256(reinterpret_cast<const __m256i*>(g.q + 32 * b));
  const __m512i q = signed_q ? _mm512_cvtepi8_epi16(q8) : _mm512_cvtepu8_epi16(q8);
  // int16 lanes 0-15 take sub-block 2b's scale, 16-31 sub-block 2b + 1's.
  const __m512i idx = _mm512_add_epi16(
      _mm512_set_epi64(0x0001000100010001, 0x0001000100010001, 0x0001000100010001,
                       0x0001000100010001, 0, 0, 0, 0),
      _mm512_set1_epi16(static_cast<int16_t>(2 * b)));
  const __m512i s = _mm512_permutexvar_epi16(
      idx, _mm512_castsi256_si512(_mm256_load_si256(reinterpret_cast<const __m256i*>(g.s))));
  __m512i v = _mm512_mullo_epi16(q, s);
  if (fold) {
    const __m512i o = _mm512_permutexvar_epi16(
        idx, _mm512_castsi256_si512(_mm256_load_si256(reinterpret_cast<const __m256i*>(g.o))));
    v = _mm512_sub_epi16(v, o);
  }
  return v;
}

// Kernels::unpack_wide: unpack_wide_impl's result, the Groups turned into chunks in
// registers.
void unpack_wide512(int type, const uint8_t* row, int64_t k, int64_t c0, int64_t count,
                    WideChunk* out) {
  const BlockType bt = block_type(type);
  const bool fold = wide_folds(type), signed_q = type == kQ8_0;
  Group g[2];
  for (int64_t c = 0; c < count; ++c) {
    __m512i blocks[16];
    WideChunk& o = out[c];
    for (int h = 0; h < 2; ++h) {
      const int64_t start = (c0 + c) * kWideChunk + kGroup * h;
      if (start >= k) {
        std::memset(static_cast<void*>(&g[h]), 0, sizeof(Group));
      } else {
        const int64_t n = k - start < kGroup ? k - start : kGroup;
        unpack_row_impl(type, row + start / bt.block_size * bt.block_bytes, n, &g[h]);
      }
      for (int b = 0; b < 8; ++b) blocks[8 * h + b] = group_block16(g[h], b, fold, signed_q);
      for (int b = 0; b < 8; ++b) {
        o.d[8 * h + b] = g[h].d[b];
        const Group& gh = g[h];
        o.m0[8 * h + b] = fold ? 0.0f : gh.m[b] * static_cast<float>(gh.o[2 * b] - gh.o[2 * b + 1]);
        o.m1[8 * h + b] = fold ? 0.0f : gh.m[b] * static_cast<float>(gh.o[2 * b + 1]);
      }
    }
    __m512i words[16];
    transpose16(blocks, words);
    for (int j = 0; j < 16; ++j) _mm512_store_si512(o.q + 32 * j, words[j]);
  }
}

template <int NR, int MR, int kMin>
void wide_rows(const WideChunk* const* w, const WideChunk* const* x, int64_t chunks,
               float* acc) {
  __m512 f[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) f[i][r] = _mm512_setzero_ps();
  for (int64_t c = 0; c < chunks; ++c) {
    __m512i s[MR][NR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) s[i][r] = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int j = 0; j < 16; ++j) {
      __m512i xv[MR];
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) xv[i] = _mm512_load_si512(x[i][c].q + 32 * j);
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) {
        const __m512i wv = _mm512_load_si512(w[r][c].q + 32 * j);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) s[i][r] = wide_acc(s[i][r], wv, xv[i]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      const __m512 wd = _mm512_load_ps(w[r][c].d);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const __m512 scale = _mm512_mul_ps(wd, _mm512_load_ps(x[i][c].d));
        f[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[i][r]), scale, f[i][r]);
        if constexpr (kMin == 2)
          f[i][r] = _mm512_fnmadd_ps(_mm512_load_ps(w[r][c].m0), _mm512_load_ps(x[i][c].m0),
                                     f[i][r]);
        if constexpr (kMin >= 1)
          f[i][r] = _mm512_fnmadd_ps(_mm512_load_ps(w[r][c].m1), _mm512_load_ps(x[i][c].m1),
                                     f[i][r]);
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) acc[i * NR + r] += _mm512_reduce_add_ps(f[i][r]);
}

template <int NR, int kMin>
void wide_mr(const WideChunk* const* w, const WideChunk* const* x, int mr, int64_t chunks,
             float* acc) {
  switch (mr) {
    case 1: wide_rows<NR, 1, kMin>(w, x, chunks, acc); break;
    case 2: wide_rows<NR, 2, kMin>(w, x, chunks, acc); break;
    case 3: wide_rows<NR, 3, kMin>(w, x, chunks, acc); break;
    default: wide_rows<NR, 4, kMin>(w, x, chunks, acc); break;
  }
}

// Kernels::dot_wide: nr <= 2 weight rows, mr <= 4 activation rows.
template <int NR>
void wide_nr(const WideChunk* const* w, const WideChunk* const* x, int mr, int64_t chunks,
             int min_terms, float* acc) {
  switch (min_terms) {
    case 0: wide_mr<NR, 0>(w, x, mr, chunks, acc); break;
    case 1: wide_mr<NR, 1>(w, x, mr, chunks, acc); break;
    default: wide_mr<NR, 2>(w, x, mr, chunks, acc); break;
  }
}

void dot_wide(const WideChunk* const* w, int nr, const WideChunk* const* x, int mr,
              int64_t chunks, int min_terms, float* acc) {
  if (nr == 2) wide_nr<2>(w, x, mr, chunks, min_terms, acc);
  else wide_nr<1>(w, x, mr, chunks, min_terms, acc);
}

}  // namespace
}  // namespace folio_cpu::quant
