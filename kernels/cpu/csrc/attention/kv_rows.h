// What a KV pool's row holds, for the ops that check pools and write rows
// (paged_attention.cpp, kv_write.cpp): the pool's kind from its dtype, a row's length, and
// the normalized Walsh-Hadamard transform an int4 pool's rows are rotated by. The one
// definition is kernels/kv_format.py; these follow it. Baseline-target code only (the ISA
// kernels decode rows themselves, attend_kernel.inc).
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "attention/attention_task.h"

namespace folio_cpu::attention {

// The pool's kind from its storage dtype (kv_format.format_stored_as).
inline KvKind kv_kind_of(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Float: return KvKind::kF32;
    case c10::ScalarType::Half: return KvKind::kF16;
    case c10::ScalarType::Char: return KvKind::kI8;
    case c10::ScalarType::Float8_e4m3fn: return KvKind::kFp8;
    case c10::ScalarType::Byte: return KvKind::kI4;
    default: break;
  }
  TORCH_CHECK(false, "a KV pool must be float32, float16, int8, float8_e4m3fn or uint8 "
              "(int4), not ", dtype);
}

inline bool quantized(KvKind kind) { return kind != KvKind::kF32 && kind != KvKind::kF16; }

// Whether a pool's keys are written a block at a time through its key stage (int4 per
// channel, int8 around the block's centers: kv_format.KVFormat.keys_by_block), not as rows.
inline bool keys_by_block(KvKind kind) { return kind == KvKind::kI4 || kind == KvKind::kI8; }

// The fewest slots a block of the pool holds (kv_format.KVFormat.min_block_size).
inline int64_t min_block_size(KvKind kind) {
  return kind == KvKind::kI4 ? kInt4KeyMinBlock : kind == KvKind::kI8 ? kInt8KeyMinBlock : 1;
}

// Elements of an int4 row's group per float16 scale (kv_format.int4_group).
inline int64_t int4_group(int64_t hd) { return hd % 64 == 0 ? 64 : hd; }

// Every quantized kind keeps its rows Hadamard-rotated (kv_format.KVFormat.rotated).
inline bool rotated(KvKind kind) {
  return kind == KvKind::kI8 || kind == KvKind::kFp8 || kind == KvKind::kI4;
}

// Bytes of an int4 key block's parameters for one KV head (kv_key_channels.param_bytes).
inline int64_t int4_key_param_bytes(int64_t hd) {
  return kInt4KeyParamHead + ((kInt4KeyMidBits + kInt4KeyHalfBits) * hd + 7) / 8;
}

// Bytes an int4 key row keeps beside its codes so that kInt4KeyMinBlock rows hold the
// parameters and one byte more, which a reader's two-byte field load may touch
// (kv_key_channels.spare_bytes).
inline int64_t int4_key_spare_bytes(int64_t hd) {
  return (int4_key_param_bytes(hd) + 1 + kInt4KeyMinBlock - 1) / kInt4KeyMinBlock;
}

// Pool elements per row of a head of hd values (kv_format.KVFormat.row_len): an int4
// pool's key and value rows share the longer of their two lengths; an int8 pool's rows
// keep the bytes its key blocks' centers take.
inline int64_t row_len(KvKind kind, int64_t hd) {
  switch (kind) {
    case KvKind::kI8: return hd + 2 + int8_key_spare_bytes(hd);
    case KvKind::kFp8: return hd + 2;
    case KvKind::kI4: {
      const int64_t value_row = hd / 2 + 2 * (hd / int4_group(hd));
      const int64_t key_row = hd / 2 + int4_key_spare_bytes(hd);
      return value_row > key_row ? value_row : key_row;
    }
    default: return hd;
  }
}

// The head size whose rows are `len` elements long, or 0 where none is.
inline int64_t head_size_of(KvKind kind, int64_t len) {
  switch (kind) {
    case KvKind::kFp8: return len > 2 ? len - 2 : 0;
    case KvKind::kI8:
    case KvKind::kI4:
      for (int64_t hd = 2; hd <= 2 * len; hd += 2)
        if (row_len(kind, hd) == len) return hd;
      return 0;
    default: return len;
  }
}

// x clamped to [lo, hi] (integers) and rounded half to even as torch.round (rounding the
// clamped value gives the same integer as clamping the rounded one): adding and taking
// away 1.5 * 2^23 leaves no fraction bits (round to nearest even, the default mode).
// Plain arithmetic that vectorizes, where nearbyint is a libm call on the baseline target.
inline float round_in(float x, float lo, float hi) {
  constexpr float kShift = 12582912.0f;  // 1.5 * 2^23
  return (std::clamp(x, lo, hi) + kShift) - kShift;
}

// absmax / max_code as a float16 scale (the row's stored bits) and the reciprocal the
// codes are taken with: 1 / the rounded scale, so that decoding agrees (0 for a zero row).
struct Scale {
  uint16_t bits;
  float inv;
};

inline Scale scale_for(const float* x, int64_t n, float max_code) {
  float absmax = 0.0f;
  // A max in any order is the same max: lanes of running maxima, where one running max
  // is a chain of dependent scalar instructions.
#pragma omp simd reduction(max : absmax)
  for (int64_t i = 0; i < n; ++i) absmax = std::max(absmax, std::fabs(x[i]));
  const uint16_t bits = c10::detail::fp16_ieee_from_fp32_value(absmax / max_code);
  const float scale = c10::detail::fp16_ieee_to_fp32_value(bits);
  return {bits, scale > 0.0f ? 1.0f / scale : 0.0f};
}

// hd float32 values (rotated; an int8 key row's, less its block's centers) -> int8 codes
// (round half to even, +-127) and the scale after them (kv_write.cpp's rows,
// key_blocks.cpp's key rows).
inline void encode_int8(const float* x, int64_t hd, uint8_t* row) {
  const Scale s = scale_for(x, hd, 127.0f);
  for (int64_t d = 0; d < hd; ++d)
    row[d] = static_cast<uint8_t>(static_cast<int8_t>(round_in(x[d] * s.inv, -127.0f, 127.0f)));
  std::memcpy(row + hd, &s.bits, 2);
}

// x [hd] times the block-diagonal normalized Hadamard matrix, in place: a fast
// Walsh-Hadamard transform over each run of hd & -hd elements (kv_format.rotate). Its own
// inverse, so it rotates a quantized pool's queries into the rows' space and the output
// back. Defined in hadamard.cpp (built for each vector width the CPU may have).
void hadamard_rotate(float* x, int64_t hd);

}  // namespace folio_cpu::attention
