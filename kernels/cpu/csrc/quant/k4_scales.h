// The scales and mins of a Q4_K / Q5_K super-block, unpacked in SSE registers (SSSE3; the
// AVX-512 kernel headers, gemv512.h and wide512.h, include it under their target pragma).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace folio_cpu::quant {
namespace {

// A Q4_K / Q5_K super-block's 6-bit scales (bytes 0-7) and mins (bytes 8-15), from its
// 12 bytes at blk + 4 (q[i]: scale j < 4 is q[j] & 63, j >= 4 (q[j + 4] & 15) |
// (q[j - 4] >> 6) << 4; min j < 4 q[j + 4] & 63, j >= 4 (q[j + 4] >> 4) | (q[j] >> 6) << 4),
// in vector registers. The AVX-512 decode and prefill kernels take them from here: their
// unpacking in general registers (and the moves into vectors) took a fifth of a Q4_K
// decode GEMV's time (docs/CPU_PERFORMANCE.md). gemv256.h's AVX2 kernels, whose vector
// ports are the busier ones, measured 5-10% slower with this and keep k_quant_scales'.
inline __m128i k4_scale_bytes(const uint8_t* blk) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk));  // q[i]: byte 4 + i
  const __m128i low_src = _mm_shuffle_epi8(
      raw, _mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
  const __m128i high_src = _mm_shuffle_epi8(
      raw, _mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11));
  // 16-bit shifts: the masks drop the bits that come in from the next byte.
  const __m128i low_mask =
      _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0);
  const __m128i high_nibbles = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15);
  const __m128i low = _mm_or_si128(_mm_and_si128(low_src, low_mask),
                                   _mm_and_si128(_mm_srli_epi16(low_src, 4), high_nibbles));
  return _mm_or_si128(low, _mm_and_si128(_mm_srli_epi16(high_src, 2), _mm_set1_epi8(0x30)));
}

}  // namespace
}  // namespace folio_cpu::quant
