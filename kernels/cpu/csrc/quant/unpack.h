// Unpacking of each GGUF block type (llama.cpp's byte layouts, ggml-common.h) into the
// generic Group (layout.h). Included by every ISA file after its `#pragma GCC target`, so
// these fixed-trip loops are vectorized for that ISA; internal linkage keeps each ISA's
// copy its own (no ODR merging of an AVX-512 body into the AVX2 path).
#pragma once

#include <cstdint>
#include <cstring>

#include "layout.h"
#include "mxfp4.h"

namespace folio_cpu::quant {
namespace {

// IEEE half -> float, exact for every value (subnormals, inf, NaN).
inline float half_to_float(const uint8_t* p) {
#if defined(FOLIO_QUANT_F16C)  // set by the ISA files, whose target includes F16C
  uint16_t hv;
  std::memcpy(&hv, p, 2);
  return _cvtsh_ss(hv);
#endif
  const uint32_t h = static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8);
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0) {
    // mant * 2^-24 is exact in float; the sign is applied by bits below.
    float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    std::memcpy(&bits, &v, 4);
    bits |= sign;
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

inline void set_scales(Group& g, int j, int s, int o) {
  g.s[j] = static_cast<int16_t>(s);
  g.o[j] = static_cast<int16_t>(o);
}

// All 16 sub-blocks' scales and offsets at once (a loop the compiler vectorizes), and a
// K-quant's one D and M.
inline void set_all_scales(Group& g, const int16_t* s, const int16_t* o) {
  for (int j = 0; j < 16; ++j) {
    g.s[j] = s[j];
    g.o[j] = o[j];
  }
}

inline void set_dm(Group& g, float d, float m) {
  for (int b = 0; b < 8; ++b) {
    g.d[b] = d;
    g.m[b] = m;
  }
}

// One 32-weight block into slot `b` of g. Q4_0/Q4_1: d, [m], qs[16]; Q5_0/Q5_1: d, [m],
// qh (u32: bit i is weight i's 5th bit), qs[16]; weight i < 16 is the low nibble of qs[i],
// weight 16 + i its high nibble. Q8_0: d, int8 q[32].
inline void unpack_block32(int type, const uint8_t* blk, Group& g, int b) {
  if (type == kMXFP4) {
    unpack_mxfp4_block(blk, g, b);
    return;
  }
  uint8_t* q = g.q + 32 * b;
  const float d = half_to_float(blk);
  int offset = 0;
  float m = d;
  const uint8_t* qs = blk + 2;
  uint32_t qh = 0;
  switch (type) {
    case kQ4_0: offset = 8; break;
    case kQ4_1: offset = 1; m = -half_to_float(blk + 2); qs = blk + 4; break;
    case kQ5_0: offset = 16; std::memcpy(&qh, blk + 2, 4); qs = blk + 6; break;
    case kQ5_1:
      offset = 1; m = -half_to_float(blk + 2); std::memcpy(&qh, blk + 4, 4); qs = blk + 8;
      break;
    case kQ8_0: std::memcpy(q, blk + 2, 32); m = 0.0f; break;
  }
  if (type != kQ8_0) {
    for (int l = 0; l < 16; ++l) {
      q[l] = static_cast<uint8_t>((qs[l] & 0x0F) | (((qh >> l) & 1u) << 4));
      q[16 + l] = static_cast<uint8_t>((qs[l] >> 4) | (((qh >> (l + 16)) & 1u) << 4));
    }
  }
  set_scales(g, 2 * b, 1, offset);
  set_scales(g, 2 * b + 1, 1, offset);
  g.d[b] = d;
  g.m[b] = m;
}

// Q2_K: scales[16] (low nibble s, high nibble m), qs[64], d, dmin. Weight
// 128h + 32t + l is bits 2t..2t+1 of qs[32h + l].
inline void unpack_q2_k(const uint8_t* blk, Group& g) {
  const uint8_t* qs = blk + 16;
  for (int h = 0; h < 2; ++h)
    for (int t = 0; t < 4; ++t)
      for (int l = 0; l < 32; ++l)
        g.q[128 * h + 32 * t + l] = (qs[32 * h + l] >> (2 * t)) & 3;
  int16_t sc[16], mn[16];
  for (int j = 0; j < 16; ++j) {
    sc[j] = blk[j] & 0x0F;
    mn[j] = blk[j] >> 4;
  }
  set_all_scales(g, sc, mn);
  set_dm(g, half_to_float(blk + 80), half_to_float(blk + 82));
}

// Q3_K: hmask[32], qs[64], scales[12], d. Low 2 bits as Q2_K; bit 2 of weight 32j + l is
// bit j of hmask[l]; weight = d * (sc - 32) * (q - 4) with 6-bit sc.
inline void unpack_q3_k(const uint8_t* blk, Group& g) {
  const uint8_t* hm = blk;
  const uint8_t* qs = blk + 32;
  const uint8_t* sc = blk + 96;
  for (int h = 0; h < 2; ++h)
    for (int t = 0; t < 4; ++t) {
      const int j = 4 * h + t;
      for (int l = 0; l < 32; ++l)
        g.q[32 * j + l] = static_cast<uint8_t>(((qs[32 * h + l] >> (2 * t)) & 3) |
                                               (((hm[l] >> j) & 1) << 2));
    }
  int16_t s[16], o[16];
  for (int j = 0; j < 16; ++j) {
    const int lo = (sc[j % 8] >> (4 * (j / 8))) & 0x0F;
    const int hi = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
    s[j] = static_cast<int16_t>((lo | (hi << 4)) - 32);
    o[j] = static_cast<int16_t>(4 * s[j]);
  }
  set_all_scales(g, s, o);
  const float d = half_to_float(blk + 108);
  set_dm(g, d, d);
}

// Q4_K: d, dmin, scales[12], qs[128]; Q5_K adds qh[32] before qs. Weight 64c + l (l < 32)
// is the low nibble of qs[32c + l], weight 64c + 32 + l its high nibble; Q5_K's 5th bit
// of weight 32j + l is bit j of qh[l].
inline void unpack_q45_k(const uint8_t* blk, Group& g, bool five) {
  const uint8_t* qh = blk + 16;
  const uint8_t* qs = blk + (five ? 48 : 16);
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      g.q[64 * c + l] = qs[32 * c + l] & 0x0F;
      g.q[64 * c + 32 + l] = qs[32 * c + l] >> 4;
    }
  if (five)
    for (int j = 0; j < 8; ++j)
      for (int l = 0; l < 32; ++l)
        g.q[32 * j + l] = static_cast<uint8_t>(g.q[32 * j + l] | (((qh[l] >> j) & 1) << 4));
  const uint8_t* p = blk + 4;
  int16_t sc[16], mn[16];
  for (int j = 0; j < 4; ++j) {
    sc[2 * j] = sc[2 * j + 1] = p[j] & 63;
    mn[2 * j] = mn[2 * j + 1] = p[j + 4] & 63;
    sc[2 * j + 8] = sc[2 * j + 9] = static_cast<int16_t>((p[j + 8] & 0x0F) | ((p[j] >> 6) << 4));
    mn[2 * j + 8] = mn[2 * j + 9] = static_cast<int16_t>((p[j + 8] >> 4) | ((p[j + 4] >> 6) << 4));
  }
  set_all_scales(g, sc, mn);
  set_dm(g, half_to_float(blk), half_to_float(blk + 2));
}

// Q6_K: ql[128], qh[64], int8 scales[16], d. Low 4 bits of weight 128h + 64u + l (l < 64)
// are nibble u of ql[64h + l]; its top 2 bits, for weight 128h + 32t + l (l < 32), are
// bits 2t..2t+1 of qh[32h + l]; weight = d * sc * (q - 32).
inline void unpack_q6_k(const uint8_t* blk, Group& g) {
  const uint8_t* ql = blk;
  const uint8_t* qh = blk + 128;
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 64; ++l) {
      g.q[128 * h + l] = ql[64 * h + l] & 0x0F;
      g.q[128 * h + 64 + l] = ql[64 * h + l] >> 4;
    }
    for (int t = 0; t < 4; ++t)
      for (int l = 0; l < 32; ++l)
        g.q[128 * h + 32 * t + l] = static_cast<uint8_t>(
            g.q[128 * h + 32 * t + l] | (((qh[32 * h + l] >> (2 * t)) & 3) << 4));
  }
  int16_t s[16], o[16];
  for (int j = 0; j < 16; ++j) {
    s[j] = static_cast<int8_t>(blk[192 + j]);
    o[j] = static_cast<int16_t>(32 * s[j]);
  }
  set_all_scales(g, s, o);
  const float d = half_to_float(blk + 208);
  set_dm(g, d, d);
}

// One weight row (k weights, the file's bytes) -> padded_k(k) / 256 groups. The padding of
// a 32-block type's last group is zero weights with zero scales.
inline void unpack_row_impl(int type, const uint8_t* row, int64_t k, Group* out) {
  const BlockType bt = block_type(type);
  const int64_t blocks = k / bt.block_size;
  if (bt.block_size == 256) {
    for (int64_t i = 0; i < blocks; ++i) {
      const uint8_t* blk = row + i * bt.block_bytes;
      switch (type) {
        case kQ2_K: unpack_q2_k(blk, out[i]); break;
        case kQ3_K: unpack_q3_k(blk, out[i]); break;
        case kQ4_K: unpack_q45_k(blk, out[i], false); break;
        case kQ5_K: unpack_q45_k(blk, out[i], true); break;
        case kQ6_K: unpack_q6_k(blk, out[i]); break;
      }
    }
    return;
  }
  const int64_t tail = blocks % 8;
  if (tail) std::memset(static_cast<void*>(&out[blocks / 8]), 0, sizeof(Group));
  for (int64_t i = 0; i < blocks; ++i)
    unpack_block32(type, row + i * bt.block_bytes, out[i / 8], static_cast<int>(i % 8));
}

}  // namespace
}  // namespace folio_cpu::quant
