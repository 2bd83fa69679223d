// The 16-bit ("wide") format of the prefill tiles, for weights and activations alike.
//
// A row is cut into chunks of 512 elements (16 blocks b of 32). In a chunk, int32 word
// 16 j + l of q holds elements 2j and 2j + 1 of block l, so one vpdpwssd over word row j
// adds two products of each of the 16 blocks into its own int32 lane, and after the 16
// word rows lane l holds block l's whole integer dot: its scales then apply once, 16
// blocks per instruction. A last chunk of fewer blocks (k = 576: 2) has nb word rows, nb
// the power of two at or above its block count (wide_rows), each block spread over
// p = 16 / nb lanes: word (j, l) holds elements (l % p) 2 nb + 2j, +1 of block l / p, and
// the block's d sits in all its lanes, a weight's m0, m1 in its first lane alone (so
// each offset counts once). The kernels then run nb word rows, not 16, on it: the
// padding costs at most a factor two on the last chunk, not a whole chunk.
//
//   activations: x_i = d_b * q_i,  q_i = clamp(nearbyint(x_i / d_b), -16383, 16383),
//                d_b = amax_b / 16383; m0_b = d_b * (sum of q over the first 16
//                elements of block b), m1_b = d_b * (sum of q over all 32)
//   weights:     w_i = d_b * q_i - M_b o_j, q_i = s_j q'_i (- o_j where the type's M
//                equals its D: folded in, M_b o_j = 0), from the Group of layout.h, j the
//                sub-block; m0_b = M_b (o_2b - o_2b+1), m1_b = M_b o_2b+1
//
// so w . x = sum_b [wd_b xd_b (q . q)_b - wm0_b xm0_b - wm1_b xm1_b] (the offsets of the
// two sub-blocks as one on the whole block and a difference on the first half: only
// Q2_K's differ, so the other types with offsets take one term). Every integer term
// is exact: |q_w| <= 4096 (Q6_K's s (q - 32) at most; Q5_K's unfolded s q <= 1953) and
// |q_x| <= 16383, so a lane's 32 products stay below 32 * 4096 * 16383 < 2^31. 14 bits
// and a sign per activation, against 7 of the 8-bit rows: about what the (x, residual)
// pairs carry, at half their integer work.
#pragma once

#include <cstdint>
#include <cstring>

#include "layout.h"

namespace folio_cpu::quant {

constexpr int64_t kWideChunk = 512;
constexpr float kWideMax = 16383.0f;

inline int64_t wide_chunks(int64_t k) { return (k + kWideChunk - 1) / kWideChunk; }

// Word rows of chunk c of a row of k elements (k a multiple of 32).
inline int wide_rows(int64_t k, int64_t c) {
  const int64_t blocks = k / 32 - 16 * c;
  if (blocks >= 16) return 16;
  int nb = 1;
  while (nb < blocks) nb *= 2;
  return nb;
}

struct alignas(64) WideChunk {
  int16_t q[512];
  float d[16];
  float m0[16];
  float m1[16];
};
static_assert(sizeof(WideChunk) == 1216);  // 19 cache lines, no padding

// Whether a type's unpacked M equals its D block by block (or is zero), so its offsets
// fold into q and its products have no min terms.
inline bool wide_folds(int type) {
  return type == kQ4_0 || type == kQ5_0 || type == kQ8_0 || type == kQ3_K || type == kQ6_K ||
         type == kMXFP4;
}

// How many of a weight type's offset terms (m0, m1) can be non-zero: its m1 only where
// both sub-blocks of a block share their offset, as all but Q2_K's do.
inline int wide_min_terms(int type) { return wide_folds(type) ? 0 : type == kQ2_K ? 2 : 1; }

}  // namespace folio_cpu::quant
