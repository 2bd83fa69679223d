// The AVX2 wide tile kernels (wide.h's format), included by dot_avx2.cpp under its target:
// the AVX-512 ones (wide512.h) on 256-bit registers. A chunk's word rows are 64 bytes, so
// each is two registers (lanes 0-7, 8-15), taken one half after the other; madd + add
// stand for vpdpwssd. Register blocking: 2 weight rows x 2 activation rows (4 int32 and
// 4 float accumulators, both halves of a chunk into the same floats: only their sum is
// read), within AVX2's 16 registers.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "wide_impl.h"

namespace folio_cpu::quant {
namespace {

// A transpose of 8 x 8 int32 words in registers: out[j] word i = r[i] word j.
inline void transpose8(const __m256i* r, __m256i* out) {
  __m256i a[8], b[8];
  for (int i = 0; i < 4; ++i) {
    a[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    b[4 * i] = _mm256_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 1] = _mm256_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 2] = _mm256_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
    b[4 * i + 3] = _mm256_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
  }
  // b[4i + e], 128-bit half q: word 4q + e of rows 4i..4i + 3.
  for (int e = 0; e < 4; ++e) {
    out[e] = _mm256_permute2x128_si256(b[e], b[4 + e], 0x20);
    out[4 + e] = _mm256_permute2x128_si256(b[e], b[4 + e], 0x31);
  }
}

// Kernels::unpack_wide: unpack_wide_impl's result, full chunks turned from their Groups in
// registers (a tail chunk in plain C++).
void unpack_wide256(int type, const uint8_t* row, int64_t k, int64_t c0, int64_t count,
                    WideChunk* out) {
  const bool fold = wide_folds(type), signed_q = signed_weights(type);
  Group g[2];
  for (int64_t c = 0; c < count; ++c) {
    unpack_chunk_groups(type, row, k, c0 + c, g);
    WideChunk& o = out[c];
    if (wide_rows(k, c0 + c) < 16) {
      wide_chunk_from_groups(g, type, k, c0 + c, o);
      continue;
    }
    // halves[u][b]: words 8u..8u + 7 of block b (its values 16u..16u + 15).
    __m256i halves[2][16];
    for (int h = 0; h < 2; ++h) {
      const Group& gh = g[h];
      for (int b = 0; b < 8; ++b) {
        for (int u = 0; u < 2; ++u) {
          const __m128i q8 = _mm_load_si128(reinterpret_cast<const __m128i*>(gh.q + 32 * b + 16 * u));
          const __m256i q = signed_q ? _mm256_cvtepi8_epi16(q8) : _mm256_cvtepu8_epi16(q8);
          __m256i v = _mm256_mullo_epi16(q, _mm256_set1_epi16(gh.s[2 * b + u]));
          if (fold) v = _mm256_sub_epi16(v, _mm256_set1_epi16(gh.o[2 * b + u]));
          halves[u][8 * h + b] = v;
        }
        wide_block_scales(gh, fold, b, o.d[8 * h + b], o.m0[8 * h + b], o.m1[8 * h + b]);
      }
    }
    // Word row j, lanes 8v..8v + 7: word j of blocks 8v..8v + 7.
    for (int u = 0; u < 2; ++u)
      for (int v = 0; v < 2; ++v) {
        __m256i words[8];
        transpose8(halves[u] + 8 * v, words);
        for (int i = 0; i < 8; ++i)
          _mm256_store_si256(reinterpret_cast<__m256i*>(o.q + 32 * (8 * u + i) + 16 * v), words[i]);
      }
  }
}

// Kernels::dot_wide (dot_wide_simd): up to 2 weight rows by 2 activation rows per block
// (AVX2's 16 registers), more rows in passes.
struct Wide256 {
  static constexpr int kMaxRows = 2;

  template <int NR, int MR, int kMin>
  static void run(const WideChunk* const* w, const WideChunk* const* x, int64_t chunks,
                  int last_rows, float* acc, int64_t stride);
};

template <int NR, int MR, int kMin>
void Wide256::run(const WideChunk* const* w, const WideChunk* const* x, int64_t chunks,
                  int last_rows, float* acc, int64_t stride) {
  __m256 f[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) f[i][r] = _mm256_setzero_ps();
  for (int64_t c = 0; c < chunks; ++c) {
    const int word_rows = c == chunks - 1 ? last_rows : 16;
    for (int h = 0; h < 2; ++h) {  // lanes 8h..8h + 7
      __m256i s[MR][NR];
      for (int i = 0; i < MR; ++i)
        for (int r = 0; r < NR; ++r) s[i][r] = _mm256_setzero_si256();
      for (int j = 0; j < word_rows; ++j) {
        __m256i xv[MR];
        for (int i = 0; i < MR; ++i)
          xv[i] = _mm256_load_si256(reinterpret_cast<const __m256i*>(x[i][c].q + 32 * j + 16 * h));
        for (int r = 0; r < NR; ++r) {
          const __m256i wv =
              _mm256_load_si256(reinterpret_cast<const __m256i*>(w[r][c].q + 32 * j + 16 * h));
          for (int i = 0; i < MR; ++i)
            s[i][r] = _mm256_add_epi32(s[i][r], _mm256_madd_epi16(wv, xv[i]));
        }
      }
      for (int r = 0; r < NR; ++r) {
        const __m256 wd = _mm256_load_ps(w[r][c].d + 8 * h);
        for (int i = 0; i < MR; ++i) {
          const __m256 scale = _mm256_mul_ps(wd, _mm256_load_ps(x[i][c].d + 8 * h));
          f[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[i][r]), scale, f[i][r]);
          if constexpr (kMin == 2)
            f[i][r] = _mm256_fnmadd_ps(_mm256_load_ps(w[r][c].m0 + 8 * h),
                                       _mm256_load_ps(x[i][c].m0 + 8 * h), f[i][r]);
          if constexpr (kMin >= 1)
            f[i][r] = _mm256_fnmadd_ps(_mm256_load_ps(w[r][c].m1 + 8 * h),
                                       _mm256_load_ps(x[i][c].m1 + 8 * h), f[i][r]);
        }
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) acc[i * stride + r] += hsum256(f[i][r]);
}

}  // namespace
}  // namespace folio_cpu::quant
