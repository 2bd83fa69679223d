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

// Kernels::quantize_wide: quantize_wide_impl's result (the same float32 operations, so
// bit-identical), a full chunk's 16 blocks quantized in registers and transposed into
// its word order.
void quantize_wide512(const float* x, int64_t k, WideChunk* out) {
  const __m512 lim = _mm512_set1_ps(kWideMax), zero = _mm512_setzero_ps();
  for (int64_t c = 0; c < wide_chunks(k); ++c) {
    WideChunk& o = out[c];
    if (wide_rows(k, c) < 16) {
      quantize_wide_chunk(x, k, c, o);
      continue;
    }
    __m512i blocks[16];
    for (int b = 0; b < 16; ++b) {
      const float* xb = x + c * kWideChunk + 32 * b;
      const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
      const __m512 p0 = _mm512_mul_ps(v0, zero), p1 = _mm512_mul_ps(v1, zero);
      const bool bad = (_mm512_cmp_ps_mask(p0, p0, _CMP_UNORD_Q) |
                        _mm512_cmp_ps_mask(p1, p1, _CMP_UNORD_Q)) != 0;
      const float amax = bad ? __builtin_nanf("")
                             : _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0),
                                                                  _mm512_abs_ps(v1)));
      const float db = amax / kWideMax;
      const __m512 inv = _mm512_set1_ps(db != 0.0f ? 1.0f / db : 0.0f);
      __m512i q[2];
      const __m512 v[2] = {v0, v1};
      for (int h = 0; h < 2; ++h) {
        __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(v[h], inv),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(r, r, _CMP_ORD_Q), r);  // NaN -> 0 first:
        r = _mm512_max_ps(_mm512_min_ps(r, lim), _mm512_sub_ps(zero, lim));  // min/max keep it
        q[h] = _mm512_cvtps_epi32(r);
      }
      blocks[b] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(q[0])),
                                     _mm512_cvtepi32_epi16(q[1]), 1);
      const int32_t s0 = _mm512_reduce_add_epi32(q[0]), s1 = _mm512_reduce_add_epi32(q[1]);
      o.d[b] = db;
      o.m0[b] = db * static_cast<float>(s0);
      o.m1[b] = db * static_cast<float>(s0 + s1);
    }
    __m512i words[16];
    transpose16(blocks, words);
    for (int j = 0; j < 16; ++j) _mm512_store_si512(o.q + 32 * j, words[j]);
  }
}

// Kernels::unpack_wide: unpack_wide_impl's result, full chunks turned from their Groups
// in registers (a tail chunk, at most one per row, in plain C++).
void unpack_wide512(int type, const uint8_t* row, int64_t k, int64_t c0, int64_t count,
                    WideChunk* out) {
  const bool fold = wide_folds(type), signed_q = type == kQ8_0;
  Group g[2];
  for (int64_t c = 0; c < count; ++c) {
    unpack_chunk_groups(type, row, k, c0 + c, g);
    WideChunk& o = out[c];
    if (wide_rows(k, c0 + c) < 16) {
      wide_chunk_from_groups(g, type, k, c0 + c, o);
      continue;
    }
    __m512i blocks[16];
    for (int h = 0; h < 2; ++h) {
      for (int b = 0; b < 8; ++b) blocks[8 * h + b] = group_block16(g[h], b, fold, signed_q);
      for (int b = 0; b < 8; ++b)
        wide_block_scales(g[h], fold, b, o.d[8 * h + b], o.m0[8 * h + b], o.m1[8 * h + b]);
    }
    __m512i words[16];
    transpose16(blocks, words);
    for (int j = 0; j < 16; ++j) _mm512_store_si512(o.q + 32 * j, words[j]);
  }
}

// Kernels::dot_wide (dot_wide_simd): up to 2 weight rows by 4 activation rows per block.
struct Wide512 {
  static constexpr int kMaxRows = 4;

  template <int NR, int MR, int kMin>
  static void run(const WideChunk* const* w, const WideChunk* const* x, int64_t chunks,
                  int last_rows, float* acc);
};

template <int NR, int MR, int kMin>
void Wide512::run(const WideChunk* const* w, const WideChunk* const* x, int64_t chunks,
                  int last_rows, float* acc) {
  __m512 f[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) f[i][r] = _mm512_setzero_ps();
  for (int64_t c = 0; c < chunks; ++c) {
    __m512i s[MR][NR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) s[i][r] = _mm512_setzero_si512();
    const int word_rows = c == chunks - 1 ? last_rows : 16;
#pragma GCC unroll 2
    for (int j = 0; j < word_rows; ++j) {
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

}  // namespace
}  // namespace folio_cpu::quant
