// The two in-memory formats every quantized product goes through.
//
// 1. Quantized activations (the rows quantize_activations returns). k is padded to
//    K256 = 256 * ceil(k / 256) so that kernels always work on whole 256-element groups
//    (the padding is zeros, which contribute nothing). One row, act_row_bytes(k) =
//    320 * K256 / 256 bytes, every part 32-byte aligned within the row:
//      int8    q[K256]          q_i = clamp(nearbyint(x_i / d_b), -127, 127)
//      float   d[K256 / 32]     d_b = amax_b / 127 of block b (32 elements)
//      int16   sum[K256 / 16]   sum_j = sum of q over the 16 elements of sub-block j
//    Rows are 64-byte multiples, so a contiguous [m, act_row_bytes] tensor keeps every
//    row aligned like its base.
//
// 2. An unpacked weight group (Group): 256 weights of any block type rewritten as
//    w_i = D[b] * s[j] * q_i - M[b] * o[j]    (b = i / 32, j = i / 16)
//    with q unsigned (0..63; Q8_0 and MXFP4 store signed int8) and integer s, o. Each block
//    type is unpacked from its file layout once per tile; one generic integer kernel per
//    ISA then multiplies any type. 32-element block types fill 8 blocks per group.
#pragma once

#include <cstdint>

namespace folio_cpu::quant {

constexpr int64_t kGroup = 256;

inline int64_t padded_k(int64_t k) { return (k + kGroup - 1) / kGroup * kGroup; }
inline int64_t act_row_bytes(int64_t k) { return padded_k(k) / kGroup * 320; }

// Views of one activation row's three parts.
struct ActRow {
  const int8_t* q;     // [K256]
  const float* d;      // [K256 / 32]
  const int16_t* sum;  // [K256 / 16]
};

inline ActRow act_row(const uint8_t* row, int64_t k) {
  const int64_t kp = padded_k(k);
  return {reinterpret_cast<const int8_t*>(row), reinterpret_cast<const float*>(row + kp),
          reinterpret_cast<const int16_t*>(row + kp + kp / 8)};
}

struct alignas(64) Group {
  uint8_t q[256];   // Q8_0: int8 bit patterns
  int16_t s[16];    // sub-block scale, per 16 weights
  int16_t o[16];    // sub-block offset, per 16 weights
  float d[8];       // D per 32 weights
  float m[8];       // M per 32 weights
};
static_assert(sizeof(Group) == 384);  // six cache lines, no padding

enum TypeId : int {
  kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kMXFP4 = 39,
};

// Types whose unpacked q are signed int8 (no offset): Q8_0, and MXFP4 (mxfp4.h).
inline bool signed_weights(int type) { return type == kQ8_0 || type == kMXFP4; }

struct BlockType {
  int block_size;   // weights per block
  int block_bytes;  // bytes per block in the file
};

// {0, 0} for an unknown id.
inline BlockType block_type(int64_t id) {
  switch (id) {
    case kQ4_0: return {32, 18};
    case kQ4_1: return {32, 20};
    case kQ5_0: return {32, 22};
    case kQ5_1: return {32, 24};
    case kQ8_0: return {32, 34};
    case kQ2_K: return {256, 84};
    case kQ3_K: return {256, 110};
    case kQ4_K: return {256, 144};
    case kQ5_K: return {256, 176};
    case kQ6_K: return {256, 210};
    case kMXFP4: return {32, 17};
    default: return {0, 0};
  }
}

}  // namespace folio_cpu::quant
