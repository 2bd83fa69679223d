// exp and tanh as plain float arithmetic, so that loops over them vectorize (libm's expf
// is one call per element); relative error ~2e-7 over the float range.
#pragma once

#include <bit>
#include <cstdint>

namespace folio_cpu {

inline float exp_approx(float x) {
  const float clamped = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float t = clamped * 1.44269504088896341f;  // log2(e)
  // rint (to nearest, ties to even): the rounding that vectorizes (an int cast of t +- 0.5
  // branches, and keeps the loops scalar).
  const float n = __builtin_rintf(t);
  const float r = clamped - n * 0.693145751953125f - n * 1.428606765330187045e-06f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const float scale = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  const float v = p * scale;
  return x < -87.0f ? 0.0f : v;
}

// tanh(y) = 1 - 2 / (e^(2y) + 1): exact limits at both ends, no cancellation worse than
// the float spacing of 1.
inline float tanh_approx(float y) { return 1.0f - 2.0f / (exp_approx(2.0f * y) + 1.0f); }

}  // namespace folio_cpu
