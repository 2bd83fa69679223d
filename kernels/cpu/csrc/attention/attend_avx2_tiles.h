// AVX2 score and value tiles of the attention kernel, shared by attend_avx2.cpp (float32
// and float16 pools) and attend_avx2_quant.cpp (quantized pools). Include it after their
// `#pragma GCC target`: its functions are internal to each including file.
#pragma once

// How the tiles are inlined: GCC's choice in attend_<isa>.cpp (float32 / float16 pools,
// as tuned); forced in attend_<isa>_quant.cpp, where with the quantized pools' many
// instantiations GCC stopped inlining them, and decode over int8 ran 1.8x slower.
#ifndef FOLIO_TILE_INLINE
#define FOLIO_TILE_INLINE inline
#endif

namespace folio_cpu::attention::avx2 {
namespace {

// 8 floats of a float32 or float16 row.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// An int8 pool's codes, unscaled (attend_kernel.inc folds the row's scale in).
inline __m256 load8(const Int8Kv* p) {
  const __m128i codes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes));
}

// R rows' scores against J keys (R * J <= 8 accumulators), hd a multiple of 8: each key
// chunk loaded once for every row, FMAs into one vector per (row, key), then the lanes of
// all R * J vectors summed in one tree of horizontal adds (where a dot per score paid its
// own horizontal sum and serial adds). out[r][j0 + j] = q_r . key_{j0 + j}.
template <int R, int J, typename Kv>
FOLIO_TILE_INLINE void key_tile(const float* const* q, const Kv* keys, int64_t slot_stride,
                     int64_t hd, int j0, float (*out)[16]) {
  static_assert(R * J <= 8, "one lane tree of 8 vectors");
  __m256 acc[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t d = 0; d < hd; d += 8) {
    __m256 key[J];
#pragma GCC unroll 8
    for (int j = 0; j < J; ++j) key[j] = load8(keys + (j0 + j) * slot_stride + d);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 qd = _mm256_loadu_ps(q[r] + d);
#pragma GCC unroll 8
      for (int j = 0; j < J; ++j) acc[r * J + j] = _mm256_fmadd_ps(qd, key[j], acc[r * J + j]);
    }
  }
  // Vector i's lane sum lands in lane i (lanes past R * J hold zeros' sums).
  const __m256 t0 = _mm256_hadd_ps(acc[0], acc[1]), t1 = _mm256_hadd_ps(acc[2], acc[3]);
  const __m256 t2 = _mm256_hadd_ps(acc[4], acc[5]), t3 = _mm256_hadd_ps(acc[6], acc[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  alignas(32) float sums[8];
  _mm256_store_ps(sums, _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                                      _mm256_permute2f128_ps(u0, u1, 0x31)));
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < J; ++j) out[r][j0 + j] = sums[r * J + j];
}

// out[r][j] = q_r . key_j for a block's 16 keys (rows slot_stride apart, float32 or
// float16 read in place) and nrows <= 4 decode rows: the AVX2 form of attend_avx512.cpp's
// key_scores16.
template <typename Kv>
FOLIO_TILE_INLINE void key_scores16(const float* const* q, int nrows, const Kv* keys,
                         int64_t slot_stride, int64_t hd, float (*out)[16]) {
  switch (nrows) {
    case 1:
      for (int j0 = 0; j0 < 16; j0 += 8) key_tile<1, 8>(q, keys, slot_stride, hd, j0, out);
      return;
    case 2:
      for (int j0 = 0; j0 < 16; j0 += 4) key_tile<2, 4>(q, keys, slot_stride, hd, j0, out);
      return;
    case 3:
      for (int j0 = 0; j0 < 16; j0 += 2) key_tile<3, 2>(q, keys, slot_stride, hd, j0, out);
      return;
    default:
      for (int j0 = 0; j0 < 16; j0 += 2) key_tile<4, 2>(q, keys, slot_stride, hd, j0, out);
      return;
  }
}

// acc[r][d] += sum_j p[r][j] * value_j[d] over slots [j_begin, j_end) (rows slot_stride
// apart, float32 or float16 read in place), for R rows, W vectors of every row's
// accumulator in registers at a time: each value chunk is loaded once for all rows, and
// R * W independent FMA chains hide the FMA's latency.
template <int R, int W, typename Kv>
inline void value_tile(const float* const* p, const Kv* values, int64_t slot_stride,
                       int64_t j_begin, int64_t j_end, int64_t hd, float* const* acc) {
  for (int64_t d = 0; d < hd; d += 8 * W) {
    __m256 sum[R][W];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int w = 0; w < W; ++w) sum[r][w] = _mm256_loadu_ps(acc[r] + d + 8 * w);
    for (int64_t j = j_begin; j < j_end; ++j) {
      __m256 v[W];
#pragma GCC unroll 4
      for (int w = 0; w < W; ++w) v[w] = load8(values + j * slot_stride + d + 8 * w);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256 pr = _mm256_broadcast_ss(p[r] + j);
#pragma GCC unroll 4
        for (int w = 0; w < W; ++w) sum[r][w] = _mm256_fmadd_ps(pr, v[w], sum[r][w]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int w = 0; w < W; ++w) _mm256_storeu_ps(acc[r] + d + 8 * w, sum[r][w]);
  }
}

// The value pass of nrows <= 4 decode rows over one block, hd a multiple of 16.
template <typename Kv>
FOLIO_TILE_INLINE void value_rows(const float* const* p, int nrows, const Kv* values,
                       int64_t slot_stride, int64_t j_begin, int64_t j_end, int64_t hd,
                       float* const* acc) {
  const bool wide = hd % 32 == 0;  // 4 vectors a row where few rows leave chains idle
  switch (nrows) {
    case 1:
      if (wide) value_tile<1, 4>(p, values, slot_stride, j_begin, j_end, hd, acc);
      else value_tile<1, 2>(p, values, slot_stride, j_begin, j_end, hd, acc);
      return;
    case 2:
      if (wide) value_tile<2, 4>(p, values, slot_stride, j_begin, j_end, hd, acc);
      else value_tile<2, 2>(p, values, slot_stride, j_begin, j_end, hd, acc);
      return;
    case 3: value_tile<3, 2>(p, values, slot_stride, j_begin, j_end, hd, acc); return;
    default: value_tile<4, 2>(p, values, slot_stride, j_begin, j_end, hd, acc); return;
  }
}

// attend_kernel.inc's nibble_floats: 16 bytes' nibbles at a time, split, interleaved back
// into channel order by byte unpacks, widened to int32 and converted.
#define FOLIO_NIBBLE_FLOATS 1
inline void nibble_floats(const uint8_t* pairs, int64_t n, int bias, float* dst) {
  const __m128i low4 = _mm_set1_epi8(0x0f);
  const __m256i b = _mm256_set1_epi32(bias);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i p = _mm_loadu_si128(reinterpret_cast<const __m128i*>(pairs + i));
    const __m128i lo = _mm_and_si128(p, low4), hi = _mm_and_si128(_mm_srli_epi16(p, 4), low4);
    const __m128i codes[2] = {_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi)};
    for (int k = 0; k < 4; ++k) {
      const __m128i eight = k % 2 == 0 ? codes[k / 2] : _mm_srli_si128(codes[k / 2], 8);
      _mm256_storeu_ps(dst + 2 * i + 8 * k,
                       _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(eight), b)));
    }
  }
  for (; i < n; ++i) {
    dst[2 * i] = static_cast<float>(static_cast<int>(pairs[i] & 0x0fu) - bias);
    dst[2 * i + 1] = static_cast<float>(static_cast<int>(pairs[i] >> 4) - bias);
  }
}

inline void floats_from_halves(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(
                                  reinterpret_cast<const __m128i*>(src + i))));
  if (i == n) return;
  const int64_t rest = n - i < 8 ? n - i : 8;  // the tail, through 8-wide buffers
  uint16_t tail[8] = {};
  float out[8];
  for (int64_t j = 0; j < rest; ++j) tail[j] = src[i + j];
  _mm256_storeu_ps(out, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tail))));
  for (int64_t j = 0; j < rest; ++j) dst[i + j] = out[j];
}

}  // namespace

}  // namespace folio_cpu::attention::avx2
