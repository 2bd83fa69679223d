// MXFP4 (GGUF type 39, gpt-oss's expert weights; ggml-common.h's block_mxfp4): 32 weights
// per 17-byte block, an E8M0 scale byte e then 16 bytes of 4-bit E2M1 codes (weight l < 16
// the low nibble of byte l, weight 16 + l its high nibble). An E2M1 value doubled is a
// small integer (ggml's kvalues_mxfp4: 0, +-1, +-2, +-3, +-4, +-6, +-8, +-12), so a block
// unpacks as signed int8 weights (a table lookup) with the halved scale 2^(e - 128) as its
// D: w = D * q exactly, the products integer like Q8_0's, no sub-block scale or offset.
#pragma once

#include <cstdint>
#include <cstring>

#include "layout.h"

namespace folio_cpu::quant {
namespace {

// The codes' values doubled, as int8 (the AVX2 decode kernel looks them up 32 at a time).
alignas(32) constexpr int8_t kMxfp4Values[32] = {
    0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
    0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// E8M0 byte -> 2^(e - 128) in float32 (ggml_e8m0_to_fp32_half; e < 2 a subnormal).
inline float mxfp4_half_scale(uint8_t e) {
  const uint32_t bits = e < 2 ? uint32_t{0x00200000} << e : static_cast<uint32_t>(e - 1) << 23;
  float d;
  std::memcpy(&d, &bits, 4);
  return d;
}

// One block into slot b of g: signed q (int8 bit patterns), s = 1, o = 0, D the scale.
inline void unpack_mxfp4_block(const uint8_t* blk, Group& g, int b) {
  uint8_t* q = g.q + 32 * b;
  const uint8_t* qs = blk + 1;
  for (int l = 0; l < 16; ++l) {
    q[l] = static_cast<uint8_t>(kMxfp4Values[qs[l] & 0x0F]);
    q[16 + l] = static_cast<uint8_t>(kMxfp4Values[qs[l] >> 4]);
  }
  for (int j = 2 * b; j < 2 * b + 2; ++j) {
    g.s[j] = 1;
    g.o[j] = 0;
  }
  g.d[b] = mxfp4_half_scale(blk[0]);
  g.m[b] = 0.0f;
}

}  // namespace
}  // namespace folio_cpu::quant
