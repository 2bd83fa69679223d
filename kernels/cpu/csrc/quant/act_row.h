// Quantizing one activation row to the layout of layout.h. Included by every ISA file
// after its target pragma (internal linkage, like unpack.h), so the loops vectorize for
// each ISA; the arithmetic is IEEE float32 operations without contraction, so every
// ISA's result is bit-identical.
#pragma once

#include <cstdint>
#include <cstring>

#include "layout.h"

namespace folio_cpu::quant {
namespace {

// A row's three parts (layout.h), zeroed: the padding past k stays zero.
struct RowOut {
  int8_t* q;      // [K256]
  float* d;       // [K256 / 32]
  int16_t* sum;   // [K256 / 16]
};

inline RowOut clear_row(uint8_t* out, int64_t k) {
  const int64_t kp = padded_k(k);
  std::memset(out, 0, static_cast<size_t>(act_row_bytes(k)));
  return {reinterpret_cast<int8_t*>(out), reinterpret_cast<float*>(out + kp),
          reinterpret_cast<int16_t*>(out + kp + kp / 8)};
}

// x[k] -> out[act_row_bytes(k)].
inline void quantize_row_impl(const float* x, int64_t k, uint8_t* out) {
  const auto [q, d, sum] = clear_row(out, k);
  // Adding and subtracting 1.5 * 2^23 rounds |v| < 2^22 to the nearest integer, ties to
  // even (what nearbyint does in the default mode), in a loop the compiler vectorizes.
  constexpr float kRound = 12582912.0f;
  for (int64_t b = 0; b < k / 32; ++b) {
    const float* xb = x + 32 * b;
    // Eight independent lanes (what vectorizes without reassociating a reduction): the
    // largest |x|, and x * 0, which is NaN exactly when some x is NaN or infinite.
    float mx[8] = {}, bad[8] = {};
    for (int j = 0; j < 32; j += 8)
      for (int l = 0; l < 8; ++l) {
        // __builtin_fabsf, not <cmath>: its inline functions would take this file's target.
        const float a = __builtin_fabsf(xb[j + l]);
        mx[l] = a > mx[l] ? a : mx[l];
        bad[l] += xb[j + l] * 0.0f;
      }
    float amax = 0.0f, probe = 0.0f;
    for (int l = 0; l < 8; ++l) {
      amax = mx[l] > amax ? mx[l] : amax;
      probe += bad[l];
    }
    if (probe != 0.0f) amax = probe;  // NaN: d = NaN marks the block, and the products
    const float db = amax / 127.0f;
    const float inv = db != 0.0f ? 1.0f / db : 0.0f;
    int8_t* qb = q + 32 * b;
    for (int i = 0; i < 32; ++i) {
      float v = (xb[i] * inv + kRound) - kRound;
      v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
      v = v == v ? v : 0.0f;  // NaN (a NaN or infinite block) -> 0; its d carries the NaN
      qb[i] = static_cast<int8_t>(v);
    }
    d[b] = db;
    for (int h = 0; h < 2; ++h) {
      int s = 0;
      for (int i = 16 * h; i < 16 * h + 16; ++i) s += qb[i];
      sum[2 * b + h] = static_cast<int16_t>(s);
    }
  }
}

// x[k] -> high[act_row_bytes(k)] (quantize_row_impl: x's 8-bit blocks) and low (the
// residual's at the fixed step d / 256, act_residual.cpp): r = x - d q, then
// nearbyint(r * (256 / d)) clipped to +-127, as plain float32 operations without
// contraction.
inline void quantize_residual_impl(const float* x, int64_t k, uint8_t* high, uint8_t* low) {
  quantize_row_impl(x, k, high);
  const ActRow hi = act_row(high, k);
  const auto [q, d, sum] = clear_row(low, k);
  constexpr float kRound = 12582912.0f;  // nearbyint for |v| < 2^22, as above
  for (int64_t b = 0; b < k / 32; ++b) {
    const float db = hi.d[b];
    // A NaN block (db NaN) gets q 0 here and keeps the NaN in its d.
    const float inv = db != 0.0f ? 256.0f / db : 0.0f;
    for (int64_t i = 32 * b; i < 32 * b + 32; ++i) {
      const float r = x[i] - db * static_cast<float>(hi.q[i]);
      float v = (r * inv + kRound) - kRound;
      v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
      v = v == v ? v : 0.0f;
      q[i] = static_cast<int8_t>(v);
    }
    d[b] = db * (1.0f / 256.0f);
    for (int h = 0; h < 2; ++h) {
      int s = 0;
      for (int64_t i = 32 * b + 16 * h; i < 32 * b + 16 * h + 16; ++i) s += q[i];
      sum[2 * b + h] = static_cast<int16_t>(s);
    }
  }
}

#if defined(FOLIO_QUANT_AVX2)  // set by the ISA files, whose targets include AVX2
// The same row, by AVX2 intrinsics: the same IEEE operations (roundps to nearest even is
// nearbyint), so bit-identical to quantize_row_impl.
inline float hmax256(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline int hsum256_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// A block's 32 values (c[j]: values 8j..8j+7 as int32, within +-127) as its int8 q and
// its two 16-value sums.
inline void store_block(const __m256i (&c)[4], int8_t* q, int16_t* sum) {
  const __m256i p8 = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_permutevar8x32_epi32(p8, order));
  sum[0] = static_cast<int16_t>(hsum256_epi32(_mm256_add_epi32(c[0], c[1])));
  sum[1] = static_cast<int16_t>(hsum256_epi32(_mm256_add_epi32(c[2], c[3])));
}

inline void quantize_row_avx2(const float* x, int64_t k, uint8_t* out) {
  const auto [q, d, sum] = clear_row(out, k);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 lim = _mm256_set1_ps(127.0f), zero = _mm256_setzero_ps();
  for (int64_t b = 0; b < k / 32; ++b) {
    __m256 v[4];
    __m256 mx = zero;
    int bad = 0;
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_loadu_ps(x + 32 * b + 8 * j);
      mx = _mm256_max_ps(mx, _mm256_and_ps(v[j], abs_mask));
      const __m256 probe = _mm256_mul_ps(v[j], zero);  // NaN where x is NaN or infinite
      bad |= _mm256_movemask_ps(_mm256_cmp_ps(probe, probe, _CMP_UNORD_Q));
    }
    const float amax = bad ? __builtin_nanf("") : hmax256(mx);
    const float db = amax / 127.0f;
    const float inv = db != 0.0f ? 1.0f / db : 0.0f;
    const __m256 iv = _mm256_set1_ps(inv);
    __m256i c[4];
    for (int j = 0; j < 4; ++j) {
      __m256 r = _mm256_round_ps(_mm256_mul_ps(v[j], iv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      r = _mm256_max_ps(_mm256_min_ps(r, lim), _mm256_sub_ps(zero, lim));
      r = _mm256_and_ps(r, _mm256_cmp_ps(r, r, _CMP_ORD_Q));  // NaN -> 0
      c[j] = _mm256_cvtps_epi32(r);
    }
    store_block(c, q + 32 * b, sum + 2 * b);
    d[b] = db;
  }
}

// quantize_residual_impl by AVX2 intrinsics: the same IEEE operations, bit-identical.
inline void quantize_residual_avx2(const float* x, int64_t k, uint8_t* high, uint8_t* low) {
  quantize_row_avx2(x, k, high);
  const ActRow hi = act_row(high, k);
  const auto [q, d, sum] = clear_row(low, k);
  const __m256 lim = _mm256_set1_ps(127.0f), zero = _mm256_setzero_ps();
  for (int64_t b = 0; b < k / 32; ++b) {
    const float db = hi.d[b];
    const __m256 dv = _mm256_set1_ps(db);
    const __m256 iv = _mm256_set1_ps(db != 0.0f ? 256.0f / db : 0.0f);
    __m256i c[4];
    for (int j = 0; j < 4; ++j) {
      const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(hi.q + 32 * b + 8 * j));
      const __m256 qf = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
      const __m256 r = _mm256_sub_ps(_mm256_loadu_ps(x + 32 * b + 8 * j), _mm256_mul_ps(dv, qf));
      __m256 v = _mm256_round_ps(_mm256_mul_ps(r, iv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q));  // NaN -> 0
      v = _mm256_max_ps(_mm256_min_ps(v, lim), _mm256_sub_ps(zero, lim));
      c[j] = _mm256_cvtps_epi32(v);
    }
    store_block(c, q + 32 * b, sum + 2 * b);
    d[b] = db * (1.0f / 256.0f);
  }
}
#endif

}  // namespace
}  // namespace folio_cpu::quant
