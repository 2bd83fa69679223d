// The AVX2 path: the fused decode kernels (gemv_lanes256.h, gemv256.h), the 8-bit tile
// kernel below, and the wide (16-bit) tiles for prefill batches of 128 rows or more
// (wide256.h).
//
// Tile kernel: both operands of a group are first interleaved (interleave()) so that
// int32 lane b of every 32-byte chunk p holds 4 weights of block b (bytes 4p..4p+3 of
// it; chunks 0-3 are its first 16-weight sub-block, 4-7 the second). Products then sum
// in int32 lanes across the whole group, and the float scaling (dx_b * D_b) happens once
// per group instead of once per block. u8 x s8 pairs via maddubs (at most 2 * 63 * 127,
// or 2 * 128 * 127 for Q8_0's |q| with the sign trick: never saturating), then madd with
// the int16 sub-block scales.
#include "kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>  // before the target pragma: gemv_lanes256.h uses it

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define FOLIO_QUANT_F16C 1
#define FOLIO_QUANT_AVX2 1

namespace folio_cpu::quant {
namespace {
constexpr int64_t kGemvBlockRows = 4;
inline __m256i dot4(__m256i q, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), _mm256_set1_epi16(1));
}
}  // namespace
}  // namespace folio_cpu::quant

#include "gemv256.h"
#include "gemv_lanes256.h"
#include "wide256.h"  // the wide tiles
#include "act_row.h"
#include "unpack.h"

namespace folio_cpu::quant {
namespace {

// q[groups][256], in place: dword u of block b moves to dword b of chunk u (an 8 x 8
// transpose of dwords per group).
void interleave(uint8_t* q, int64_t groups) {
  for (int64_t g = 0; g < groups; ++g) {
    __m256i* p = reinterpret_cast<__m256i*>(q + g * kGroup);
    __m256i r[8], t[8], u[8];
    for (int b = 0; b < 8; ++b) r[b] = _mm256_loadu_si256(p + b);
    for (int b = 0; b < 8; b += 2) {
      t[b] = _mm256_unpacklo_epi32(r[b], r[b + 1]);
      t[b + 1] = _mm256_unpackhi_epi32(r[b], r[b + 1]);
    }
    for (int h = 0; h < 8; h += 4) {
      u[h] = _mm256_unpacklo_epi64(t[h], t[h + 2]);
      u[h + 1] = _mm256_unpackhi_epi64(t[h], t[h + 2]);
      u[h + 2] = _mm256_unpacklo_epi64(t[h + 1], t[h + 3]);
      u[h + 3] = _mm256_unpackhi_epi64(t[h + 1], t[h + 3]);
    }
    for (int c = 0; c < 4; ++c) {
      _mm256_storeu_si256(p + c, _mm256_permute2x128_si256(u[c], u[c + 4], 0x20));
      _mm256_storeu_si256(p + c + 4, _mm256_permute2x128_si256(u[c], u[c + 4], 0x31));
    }
  }
}

template <int MR, bool kSigned>
void dot_rows(const Group* w, int64_t groups, const ActRow* x, float* out) {
  __m256 acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_ps();
  // int16 lane l of a product is int32 lane l / 2 = block l / 2 (in both 128-bit halves).
  const __m256i even = _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13,
                                        0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13);
  const __m256i odd = _mm256_add_epi8(even, _mm256_set1_epi8(2));
  for (int64_t g = 0; g < groups; ++g) {
    const Group& wg = w[g];
    // s = [s0..s7 | s8..s15]: block b's scales s_2b, s_2b+1 sit in the half holding lane b.
    const __m256i s = _mm256_load_si256(reinterpret_cast<const __m256i*>(wg.s));
    const __m256i sc[2] = {_mm256_shuffle_epi8(s, even), _mm256_shuffle_epi8(s, odd)};
    const __m256 d8 = _mm256_load_ps(wg.d), m8 = _mm256_load_ps(wg.m);
    const __m256i o16 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wg.o));
    __m256i isum[MR];
    for (int r = 0; r < MR; ++r) isum[r] = _mm256_setzero_si256();
    // Chunk pairs share their sub-block scales; unsigned q (<= 63) lets a pair's maddubs
    // results add in int16 first (at most 4 * 63 * 127 = 32004) and take one madd.
    for (int c = 0; c < 8; c += 2) {
      __m256i wq[2], wsign[2];
      for (int e = 0; e < 2; ++e) {
        wq[e] = wsign[e] = _mm256_load_si256(reinterpret_cast<const __m256i*>(wg.q + 32 * (c + e)));
        if constexpr (kSigned) wq[e] = _mm256_abs_epi8(wq[e]);
      }
      for (int r = 0; r < MR; ++r) {
        const int8_t* xp = x[r].q + g * kGroup + 32 * c;
        __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xp));
        __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xp + 32));
        if constexpr (kSigned) {
          x0 = _mm256_sign_epi8(x0, wsign[0]);
          x1 = _mm256_sign_epi8(x1, wsign[1]);
        }
        const __m256i p0 = _mm256_maddubs_epi16(wq[0], x0), p1 = _mm256_maddubs_epi16(wq[1], x1);
        if constexpr (kSigned) {
          isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(_mm256_madd_epi16(p0, sc[c / 4]),
                                                               _mm256_madd_epi16(p1, sc[c / 4])));
        } else {
          isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(_mm256_add_epi16(p0, p1), sc[c / 4]));
        }
      }
    }
    for (int r = 0; r < MR; ++r) {
      const __m256 dx8 = _mm256_loadu_ps(x[r].d + g * 8);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(dx8, d8), acc[r]);
      // Lane b: o_2b * xsum_2b + o_2b+1 * xsum_2b+1 = O_b.
      const __m256i xs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[r].sum + g * 16));
      const __m256 o = _mm256_cvtepi32_ps(_mm256_madd_epi16(o16, xs));
      acc[r] = _mm256_fnmadd_ps(o, _mm256_mul_ps(dx8, m8), acc[r]);
    }
  }
  for (int r = 0; r < MR; ++r) out[r] = hsum256(acc[r]);
}

}  // namespace
}  // namespace folio_cpu::quant

#include "dot_dispatch.h"

namespace folio_cpu::quant {
namespace {

const Kernels kAvx2{quantize_row_avx2, unpack_row_impl, dot, gemv_lanes256, interleave, 16,
                    quantize_wide_impl, unpack_wide256, dot_wide_simd<Wide256>, 128,
                    gemv_lanes256_pairs, quantize_residual_avx2};

}  // namespace

const Kernels& avx2_kernels() { return kAvx2; }

}  // namespace folio_cpu::quant
#pragma GCC pop_options

#else
namespace folio_cpu::quant {
const Kernels& avx2_kernels() { return portable_kernels(); }
}  // namespace folio_cpu::quant
#endif
