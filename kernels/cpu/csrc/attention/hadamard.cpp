// The normalized Walsh-Hadamard transform every quantized KV row, query and output goes
// through (kv_rows.h). A prefill chunk rotates each query and output row of every head,
// where the scalar butterflies took as long as a tenth of an int8 pool's attention; here
// a run of 16 elements does its first four stages in one vector (a lane's partner is its
// index xor h) and the later stages pair whole vectors. Each output element is the same
// sum or difference as the scalar transform's, in the same order, so the bits are the
// same on every path; GCC builds the vector code once per listed target and picks one at
// load (the bits do not depend on which, so it follows the CPU rather than active_isa).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "attention/kv_rows.h"

namespace folio_cpu::attention {
namespace {

typedef float Floats16 __attribute__((vector_size(64)));
typedef int32_t Lanes16 __attribute__((vector_size(64)));

// Stage h (< 16) of the transform within one run of 16: lane j becomes v[j] + v[j ^ h]
// where j & h is 0, else v[j ^ h] - v[j]. (By reference: GCC notes an ABI change for
// 64-byte vectors passed by value.)
template <int kH>
inline void butterfly(Floats16& v) {
  constexpr Lanes16 partner = {0 ^ kH, 1 ^ kH, 2 ^ kH, 3 ^ kH, 4 ^ kH, 5 ^ kH, 6 ^ kH, 7 ^ kH,
                               8 ^ kH, 9 ^ kH, 10 ^ kH, 11 ^ kH, 12 ^ kH, 13 ^ kH, 14 ^ kH, 15 ^ kH};
  constexpr Floats16 sign = {(0 & kH) ? -1.f : 1.f, (1 & kH) ? -1.f : 1.f, (2 & kH) ? -1.f : 1.f,
                             (3 & kH) ? -1.f : 1.f, (4 & kH) ? -1.f : 1.f, (5 & kH) ? -1.f : 1.f,
                             (6 & kH) ? -1.f : 1.f, (7 & kH) ? -1.f : 1.f, (8 & kH) ? -1.f : 1.f,
                             (9 & kH) ? -1.f : 1.f, (10 & kH) ? -1.f : 1.f, (11 & kH) ? -1.f : 1.f,
                             (12 & kH) ? -1.f : 1.f, (13 & kH) ? -1.f : 1.f, (14 & kH) ? -1.f : 1.f,
                             (15 & kH) ? -1.f : 1.f};
  v = __builtin_shuffle(v, partner) + sign * v;
}

void rotate_scalar(float* v, int64_t n) {
  for (int64_t h = 1; h < n; h *= 2)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const float a = v[j], c = v[j + h];
        v[j] = a + c;
        v[j + h] = a - c;
      }
}

// n a multiple of 16.
void rotate_vectors(float* v, int64_t n) {
  for (int64_t k = 0; k < n; k += 16) {
    Floats16 x;
    std::memcpy(&x, v + k, sizeof x);
    butterfly<1>(x);
    butterfly<2>(x);
    butterfly<4>(x);
    butterfly<8>(x);
    std::memcpy(v + k, &x, sizeof x);
  }
  for (int64_t h = 16; h < n; h *= 2)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; j += 16) {
        Floats16 a, c;
        std::memcpy(&a, v + j, sizeof a);
        std::memcpy(&c, v + j + h, sizeof c);
        const Floats16 sum = a + c, difference = a - c;
        std::memcpy(v + j, &sum, sizeof sum);
        std::memcpy(v + j + h, &difference, sizeof difference);
      }
}

}  // namespace

// flatten: the helpers are inlined into each clone, so they take its vector width too.
__attribute__((target_clones("avx512f", "avx2", "default"), flatten))
void hadamard_rotate(float* x, int64_t hd) {
  const int64_t n = hd & -hd;
  const float norm = 1.0f / std::sqrt(static_cast<float>(n));
  for (int64_t b = 0; b < hd; b += n) {
    float* v = x + b;
    if (n % 16 == 0)
      rotate_vectors(v, n);
    else
      rotate_scalar(v, n);
    for (int64_t i = 0; i < n; ++i) v[i] *= norm;
  }
}

}  // namespace folio_cpu::attention
