// AVX-512 score and value tiles of the attention kernel, shared by attend_avx512.cpp
// (float32 and float16 pools) and attend_avx512_quant.cpp (quantized pools). Include it
// after their `#pragma GCC target`: its functions are internal to each including file.
#pragma once

// How the tiles are inlined: GCC's choice in attend_<isa>.cpp (float32 / float16 pools,
// as tuned); forced in attend_<isa>_quant.cpp, where with the quantized pools' many
// instantiations GCC stopped inlining them, and decode over int8 ran 1.8x slower. The
// int8 path's helpers per 16 keys too (lane_sums16_epi32, floats_from_halves): left to
// GCC, the int8 decode attention called lane_sums16_epi32 and simd512.h's lane_sums16
// (their 16 vectors through memory) and took about 9% longer at 4,000 tokens
// (BENCHMARKS.md, "What bounds the int8 decode attention").
#ifndef FOLIO_TILE_INLINE
#define FOLIO_TILE_INLINE inline
#endif

namespace folio_cpu::attention::avx512 {
namespace {

// 16 floats of a float32 or float16 row.
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
// An int8 pool's codes, unscaled (attend_kernel.inc folds the row's scale in).
inline __m512 load16(const Int8Kv* p) {
  const __m128i codes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes));
}

// R rows' scores against J keys (R * J <= 16 accumulators), hd a multiple of 16: each
// key chunk loaded (and converted) once for every row, FMAs into one vector per
// (row, key), the lanes of all of them summed by one lane_sums16.
// out[r][j0 + j] = q_r . key_{j0 + j}.
template <int R, int J, typename Kv>
FOLIO_TILE_INLINE void key_tile(const float* const* q, const Kv* keys, int64_t slot_stride,
                     int64_t hd, int j0, float (*out)[16]) {
  static_assert(R * J <= 16, "one lane tree of 16 vectors");
  __m512 acc[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t d = 0; d < hd; d += 16) {
    __m512 key[J];
#pragma GCC unroll 16
    for (int j = 0; j < J; ++j) key[j] = load16(keys + (j0 + j) * slot_stride + d);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512 qd = _mm512_loadu_ps(q[r] + d);
#pragma GCC unroll 16
      for (int j = 0; j < J; ++j) acc[r * J + j] = _mm512_fmadd_ps(qd, key[j], acc[r * J + j]);
    }
  }
  alignas(64) float sums[16];
  _mm512_store_ps(sums, lane_sums16(acc));
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int j = 0; j < J; ++j) out[r][j0 + j] = sums[r * J + j];
}

// out[r][j] = q_r . key_j for a block's 16 keys (rows slot_stride apart, float32 or
// float16 read in place) and nrows <= 4 rows, hd a multiple of 16.
template <typename Kv>
FOLIO_TILE_INLINE void key_scores16(const float* const* q, int nrows, const Kv* keys,
                         int64_t slot_stride, int64_t hd, float (*out)[16]) {
  switch (nrows) {
    case 1: key_tile<1, 16>(q, keys, slot_stride, hd, 0, out); return;
    case 2: key_tile<2, 8>(q, keys, slot_stride, hd, 0, out); key_tile<2, 8>(q, keys, slot_stride, hd, 8, out); return;
    case 3:
      for (int j0 = 0; j0 < 16; j0 += 4) key_tile<3, 4>(q, keys, slot_stride, hd, j0, out);
      return;
    default:
      for (int j0 = 0; j0 < 16; j0 += 4) key_tile<4, 4>(q, keys, slot_stride, hd, j0, out);
      return;
  }
}

// The lane sums of 16 int32 vectors as the lanes of one, in order (lane_sums16's tree on
// integers; the shuffles move 32-bit lanes whatever they hold).
FOLIO_TILE_INLINE __m512i lane_sums16_epi32(const __m512i* v) {
  __m512 f[16];
#pragma GCC unroll 16
  for (int k = 0; k < 16; ++k) f[k] = _mm512_castsi512_ps(v[k]);
  __m512i t[8], u[4], w[2];
#pragma GCC unroll 8
  for (int p = 0; p < 8; ++p)
    t[p] = _mm512_add_epi32(_mm512_castps_si512(_mm512_unpacklo_ps(f[2 * p], f[2 * p + 1])),
                            _mm512_castps_si512(_mm512_unpackhi_ps(f[2 * p], f[2 * p + 1])));
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {
    const __m512 a = _mm512_castsi512_ps(t[2 * q]), b = _mm512_castsi512_ps(t[2 * q + 1]);
    u[q] = _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(a, b, 0x44)),
                            _mm512_castps_si512(_mm512_shuffle_ps(a, b, 0xEE)));
  }
#pragma GCC unroll 2
  for (int r = 0; r < 2; ++r)
    w[r] = _mm512_add_epi32(_mm512_shuffle_i32x4(u[2 * r], u[2 * r + 1], 0x88),
                            _mm512_shuffle_i32x4(u[2 * r], u[2 * r + 1], 0xDD));
  return _mm512_add_epi32(_mm512_shuffle_i32x4(w[0], w[1], 0x88),
                          _mm512_shuffle_i32x4(w[0], w[1], 0xDD));
}

// key_tile for an int8 pool's codes against queries held as int16 codes (q[r] [hd],
// q_scale[r] their step): 32 products a vpmaddwd, summed exactly in int32 (|q| <= 32767,
// |code| <= 127, hd <= 256), where converting every code to float cost more than the
// products. hd a multiple of 32. out[r][j0 + j] = (q_r . codes_{j0 + j}) * q_scale[r].
template <int R, int J>
FOLIO_TILE_INLINE void int8_key_tile(const int16_t* const* q, const float* q_scale,
                                     const Int8Kv* keys, int64_t slot_stride, int64_t hd,
                                     int j0, float (*out)[16]) {
  static_assert(R * J <= 16 && (J == 4 || J == 8 || J == 16), "one lane tree of 16 vectors");
  __m512i acc[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_si512();
  for (int64_t d = 0; d < hd; d += 32) {
    __m512i key[J];
#pragma GCC unroll 16
    for (int j = 0; j < J; ++j)
      key[j] = _mm512_cvtepi8_epi16(_mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(keys + (j0 + j) * slot_stride + d)));
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512i qd = _mm512_loadu_si512(q[r] + d);
#pragma GCC unroll 16
      for (int j = 0; j < J; ++j)
        acc[r * J + j] = _mm512_add_epi32(acc[r * J + j], _mm512_madd_epi16(qd, key[j]));
    }
  }
  // Lane r * J + j times q_scale[r], each row's J lanes stored as one piece.
  constexpr int kLog2J = J == 16 ? 4 : J == 8 ? 3 : 2;
  const __m512i row_of_lane = _mm512_srli_epi32(
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), kLog2J);
  const __m512 steps = _mm512_permutexvar_ps(
      row_of_lane, _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << R) - 1), q_scale));
  const __m512 sums = _mm512_mul_ps(_mm512_cvtepi32_ps(lane_sums16_epi32(acc)), steps);
  if constexpr (J == 16) {
    _mm512_storeu_ps(out[0] + j0, sums);
  } else if constexpr (J == 8) {
    _mm256_storeu_ps(out[0] + j0, _mm512_castps512_ps256(sums));
    if (R > 1)
      _mm256_storeu_ps(out[1] + j0, _mm256_castpd_ps(
                                        _mm512_extractf64x4_pd(_mm512_castps_pd(sums), 1)));
  } else {
    _mm_storeu_ps(out[0] + j0, _mm512_castps512_ps128(sums));
    if (R > 1) _mm_storeu_ps(out[1] + j0, _mm512_extractf32x4_ps(sums, 1));
    if (R > 2) _mm_storeu_ps(out[2] + j0, _mm512_extractf32x4_ps(sums, 2));
    if (R > 3) _mm_storeu_ps(out[3] + j0, _mm512_extractf32x4_ps(sums, 3));
  }
}

// key_scores16 for an int8 pool's codes (unscaled by their rows' scales) and nrows <= 4
// query rows as int16 codes; hd a multiple of 32.
#define FOLIO_INT8_INTEGER_SCORES 1
FOLIO_TILE_INLINE void int8_key_scores16(const int16_t* const* q, const float* q_scale,
                                         int nrows, const Int8Kv* keys, int64_t slot_stride,
                                         int64_t hd, float (*out)[16]) {
  switch (nrows) {
    case 1: int8_key_tile<1, 16>(q, q_scale, keys, slot_stride, hd, 0, out); return;
    case 2:
      int8_key_tile<2, 8>(q, q_scale, keys, slot_stride, hd, 0, out);
      int8_key_tile<2, 8>(q, q_scale, keys, slot_stride, hd, 8, out);
      return;
    case 3:
      for (int j0 = 0; j0 < 16; j0 += 4) int8_key_tile<3, 4>(q, q_scale, keys, slot_stride, hd, j0, out);
      return;
    default:
      for (int j0 = 0; j0 < 16; j0 += 4) int8_key_tile<4, 4>(q, q_scale, keys, slot_stride, hd, j0, out);
      return;
  }
}

// kt[d * 16 + j] = key_j[d] for a block's 16 slots (rows slot_stride apart, float32 or
// float16 read in place, or an int8 pool's codes unscaled), hd a multiple of 16; slots outside [j_begin, j_end) repeat a
// slot inside it (finite; their scores are masked).
template <typename Kv>
inline void transpose_keys16(const Kv* keys, int64_t slot_stride, int64_t j_begin,
                             int64_t j_end, int64_t hd, float* kt) {
  const Kv* row[16];
  for (int64_t j = 0; j < 16; ++j)
    row[j] = keys + (j < j_begin ? j_begin : j < j_end ? j : j_end - 1) * slot_stride;
  for (int64_t d = 0; d < hd; d += 16) {
    __m512i r[16], t[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) r[j] = _mm512_castps_si512(load16(row[j] + d));
    transpose16(r, t);
#pragma GCC unroll 16
    for (int e = 0; e < 16; ++e) _mm512_storeu_ps(kt + (d + e) * 16, _mm512_castsi512_ps(t[e]));
  }
}

// scores[r][j] = q_r . key_j for nrows <= 4 rows from a block's keys transposed (kt
// [hd, 16]): two accumulators a row (even and odd d), so that even one row keeps two
// FMA chains going.
template <int R>
FOLIO_TILE_INLINE void scores_tile(const float* const* q, const float* kt, int64_t hd, float (*out)[16]) {
  __m512 a[R][2];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) a[r][0] = a[r][1] = _mm512_setzero_ps();
  if (hd % 2 != 0) {  // an odd head size's last d first
    const __m512 k = _mm512_loadu_ps(kt + (hd - 1) * 16);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) a[r][0] = _mm512_mul_ps(_mm512_set1_ps(q[r][hd - 1]), k);
  }
  for (int64_t d = 0; d + 1 < hd; d += 2) {
    const __m512 k0 = _mm512_loadu_ps(kt + d * 16), k1 = _mm512_loadu_ps(kt + (d + 1) * 16);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      a[r][0] = _mm512_fmadd_ps(_mm512_set1_ps(q[r][d]), k0, a[r][0]);
      a[r][1] = _mm512_fmadd_ps(_mm512_set1_ps(q[r][d + 1]), k1, a[r][1]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out[r], _mm512_add_ps(a[r][0], a[r][1]));
}

FOLIO_TILE_INLINE void scores16(const float* const* q, int nrows, const float* kt, int64_t hd,
                     float (*out)[16]) {
  switch (nrows) {
    case 1: scores_tile<1>(q, kt, hd, out); return;
    case 2: scores_tile<2>(q, kt, hd, out); return;
    case 3: scores_tile<3>(q, kt, hd, out); return;
    default: scores_tile<4>(q, kt, hd, out); return;
  }
}

// acc[r][d] += sum_j p[r][j] * value_j[d] over slots [j_begin, j_end) (rows slot_stride
// apart, float32 or float16 read in place), R rows by W vectors of each row's
// accumulator in registers: each value chunk loaded (and converted) once for all rows.
template <int R, int W, typename Kv>
inline void value_tile(const float* const* p, const Kv* values, int64_t slot_stride,
                       int64_t j_begin, int64_t j_end, int64_t hd, float* const* acc) {
  for (int64_t d = 0; d < hd; d += 16 * W) {
    __m512 sum[R][W];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int w = 0; w < W; ++w) sum[r][w] = _mm512_loadu_ps(acc[r] + d + 16 * w);
    for (int64_t j = j_begin; j < j_end; ++j) {
      __m512 v[W];
#pragma GCC unroll 8
      for (int w = 0; w < W; ++w) v[w] = load16(values + j * slot_stride + d + 16 * w);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m512 pr = _mm512_set1_ps(p[r][j]);
#pragma GCC unroll 8
        for (int w = 0; w < W; ++w) sum[r][w] = _mm512_fmadd_ps(pr, v[w], sum[r][w]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int w = 0; w < W; ++w) _mm512_storeu_ps(acc[r] + d + 16 * w, sum[r][w]);
  }
}

// The value pass of nrows <= 4 rows over one block, hd a multiple of 16: four vectors of
// each row at a time where hd allows (16 accumulators at most), else one.
template <typename Kv>
FOLIO_TILE_INLINE void value_rows(const float* const* p, int nrows, const Kv* values,
                       int64_t slot_stride, int64_t j_begin, int64_t j_end, int64_t hd,
                       float* const* acc) {
  const bool wide = hd % 64 == 0;
  switch (nrows) {
    case 1:
      if (wide) value_tile<1, 4>(p, values, slot_stride, j_begin, j_end, hd, acc);
      else value_tile<1, 1>(p, values, slot_stride, j_begin, j_end, hd, acc);
      return;
    case 2:
      if (wide) value_tile<2, 4>(p, values, slot_stride, j_begin, j_end, hd, acc);
      else value_tile<2, 1>(p, values, slot_stride, j_begin, j_end, hd, acc);
      return;
    case 3:
      if (wide) value_tile<3, 4>(p, values, slot_stride, j_begin, j_end, hd, acc);
      else value_tile<3, 1>(p, values, slot_stride, j_begin, j_end, hd, acc);
      return;
    default:
      if (wide) value_tile<4, 4>(p, values, slot_stride, j_begin, j_end, hd, acc);
      else value_tile<4, 1>(p, values, slot_stride, j_begin, j_end, hd, acc);
      return;
  }
}

// attend_kernel.inc's nibble_floats: 16 bytes' nibbles at a time, split, interleaved back
// into channel order by byte unpacks, widened to int32 and converted.
#define FOLIO_NIBBLE_FLOATS 1
inline void nibble_floats(const uint8_t* pairs, int64_t n, int bias, float* dst) {
  const __m128i low4 = _mm_set1_epi8(0x0f);
  const __m512i b = _mm512_set1_epi32(bias);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i p = _mm_loadu_si128(reinterpret_cast<const __m128i*>(pairs + i));
    const __m128i lo = _mm_and_si128(p, low4), hi = _mm_and_si128(_mm_srli_epi16(p, 4), low4);
    const __m128i first = _mm_unpacklo_epi8(lo, hi), second = _mm_unpackhi_epi8(lo, hi);
    _mm512_storeu_ps(dst + 2 * i,
                     _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(first), b)));
    _mm512_storeu_ps(dst + 2 * i + 16,
                     _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(second), b)));
  }
  for (; i < n; ++i) {
    dst[2 * i] = static_cast<float>(static_cast<int>(pairs[i] & 0x0fu) - bias);
    dst[2 * i + 1] = static_cast<float>(static_cast<int>(pairs[i] >> 4) - bias);
  }
}

FOLIO_TILE_INLINE void floats_from_halves(const uint16_t* src, float* dst, int64_t n) {
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

}  // namespace folio_cpu::attention::avx512
