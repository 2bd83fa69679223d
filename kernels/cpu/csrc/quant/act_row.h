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

// x[k] -> out[act_row_bytes(k)].
inline void quantize_row_impl(const float* x, int64_t k, uint8_t* out) {
  const int64_t kp = padded_k(k);
  std::memset(out, 0, static_cast<size_t>(act_row_bytes(k)));
  int8_t* q = reinterpret_cast<int8_t*>(out);               // [kp]
  float* d = reinterpret_cast<float*>(out + kp);             // [kp / 32]
  int16_t* sum = reinterpret_cast<int16_t*>(out + kp + kp / 8);  // [kp / 16]
  // Adding and subtracting 1.5 * 2^23 rounds |v| < 2^22 to the nearest integer, ties to
  // even (what nearbyint does in the default mode), in a loop the compiler vectorizes.
  constexpr float kRound = 12582912.0f;
  for (int64_t b = 0; b < k / 32; ++b) {
    const float* xb = x + 32 * b;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) {
      // __builtin_fabsf, not <cmath>: its inline functions would take this file's target.
      const float a = __builtin_fabsf(xb[i]);
      amax = a > amax ? a : amax;
    }
    const float db = amax / 127.0f;
    const float inv = db != 0.0f ? 1.0f / db : 0.0f;
    int8_t* qb = q + 32 * b;
    for (int i = 0; i < 32; ++i) {
      float v = (xb[i] * inv + kRound) - kRound;
      v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
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

}  // namespace
}  // namespace folio_cpu::quant
