// write_key_blocks: one layer's key blocks of an int4 or int8 pool written from the
// step's keys, as kernels/key_stage.py's write_keys (the PyTorch KeyWriter) writes them, in
// one op instead of about thirty. Each written block's rows are gathered (the rows before
// its first new one from its slot of exact keys, or decoded from the pool, or none), the
// new keys put in Hadamard-rotated and rounded to float16, the block encoded as the
// format's codec encodes it (int4 per channel: kernels/kv_key_channels.encode_key_block;
// int8 around its centers: kernels/kv_key_centers.encode_key_block; the same float32
// operations in the same order, so the same bytes from the same rows), and an open
// block's rows kept in its slot. The rotation is this library's (kv_rows.h), which can
// differ from torch's matrix product in a value's last bit; the float16 rounding hides
// most of that, and a difference left can move a code by one.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "attention/kv_rows.h"
#include "ops.h"

namespace folio_cpu::attention {

namespace {

inline float half_value(const void* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return c10::detail::fp16_ieee_to_fp32_value(h);
}

#include "attention/int4_key_params.inc"
#include "attention/int8_key_centers.inc"

// StagePlan.carry's markers (kernels/key_stage.py): no earlier rows, or the pool's.
constexpr int64_t kNoRows = -1, kPoolRows = -2;

inline uint16_t half_bits(float x) { return c10::detail::fp16_ieee_from_fp32_value(x); }

// x rounded to float16 (to nearest, ties to even, as torch's .half()), as float32.
inline float to_half(float x) { return c10::detail::fp16_ieee_to_fp32_value(half_bits(x)); }

// x >= 0 rounded up to a float16 (kv_key_channels.float16_up): the nearest one, or the
// next one up where the nearest is below x.
inline uint16_t half_bits_up(float x) {
  const uint16_t h = half_bits(x);
  return c10::detail::fp16_ieee_to_fp32_value(h) < x ? static_cast<uint16_t>(h + 1) : h;
}

// Sets `width` bits of the little-endian bit string at bits from bit `at` to `value`
// (kv_key_channels._pack_params); the string starts zeroed.
inline void put_bits(uint8_t* bits, int64_t at, int64_t width, uint32_t value) {
  for (int64_t i = 0; i < width; ++i)
    bits[(at + i) >> 3] |= static_cast<uint8_t>(((value >> i) & 1u) << ((at + i) & 7));
}

// Each channel's lowest and highest value, low [hd] and high [hd], over rows [filled, hd]
// of x (kv_key_channels.channel_ranges).
void channel_ranges(const float* x, int64_t filled, int64_t hd, float* __restrict low,
                    float* __restrict high) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::fill(low, low + hd, kInf);
  std::fill(high, high + hd, -kInf);
  for (int64_t j = 0; j < filled; ++j)
    for (int64_t c = 0; c < hd; ++c) {
      low[c] = std::min(low[c], x[j * hd + c]);
      high[c] = std::max(high[c], x[j * hd + c]);
    }
}

// Per-channel scratch of one (block, head) encode, hd floats each.
struct Channels {
  std::vector<float> low_x, high_x, mid, need, center, low, step;
  std::vector<uint32_t> mid_code, half_code;
  std::vector<uint8_t> region;  // a block's parameter bytes, bs * spare

  Channels(int64_t hd, int64_t region_bytes)
      : low_x(hd), high_x(hd), mid(hd), need(hd), center(hd), low(hd), step(hd),
        mid_code(hd), half_code(hd), region(region_bytes) {}
};

// One block's key rows for one head from x [bs, hd] (rows before `filled` read): rows
// [bs] of row_len bytes, slot_stride apart (kv_key_channels.encode_key_block, its
// float32 operations in order).
void encode_block(const float* x, int64_t filled, int64_t bs, int64_t hd, int64_t row_len,
                  uint8_t* rows, int64_t slot_stride, Channels& ch) {
  channel_ranges(x, filled, hd, ch.low_x.data(), ch.high_x.data());
  float top = 0.0f;
  for (int64_t c = 0; c < hd; ++c) {
    ch.mid[c] = (ch.low_x[c] + ch.high_x[c]) * 0.5f;
    top = std::max(top, std::fabs(ch.mid[c]));
  }
  const uint16_t top_bits = half_bits(top);  // M
  const float unit = c10::detail::fp16_ieee_to_fp32_value(top_bits) / kInt4KeyMidCodes;
  float widest_need = 0.0f;
  for (int64_t c = 0; c < hd; ++c) {
    const float m = unit > 0.0f ? round_in(ch.mid[c] / unit, -kInt4KeyMidCodes,
                                           kInt4KeyMidCodes)
                                : 0.0f;
    ch.mid_code[c] = static_cast<uint32_t>(static_cast<int>(m) + 31);
    ch.center[c] = m * unit;
    const float half_raw = (ch.high_x[c] - ch.low_x[c]) * 0.5f;
    ch.need[c] = half_raw + std::fabs(ch.mid[c] - ch.center[c]);
    widest_need = std::max(widest_need, ch.need[c]);
  }
  const uint16_t widest_bits = half_bits_up(widest_need);  // W
  const float widest = c10::detail::fp16_ieee_to_fp32_value(widest_bits);
  for (int64_t c = 0; c < hd; ++c) {
    // The narrowest of W's scales that still covers the channel: scales fall with s, so
    // the count of those that cover it (past s = 0) is its index.
    uint32_t s = 0;
    for (int64_t k = 1; k < 32; ++k) s += widest * kInt4KeyHalfScales[k] >= ch.need[c];
    ch.half_code[c] = s;
    const float half = widest * kInt4KeyHalfScales[s];
    ch.step[c] = (half + half) / kInt4KeyLevels;
    ch.low[c] = ch.center[c] - half;
  }
  for (int64_t j = 0; j < bs; ++j) {
    uint8_t* row = rows + j * slot_stride;
    if (j >= filled) {
      std::memset(row, 0, hd / 2);
      continue;
    }
    const float* xj = x + j * hd;
    for (int64_t i = 0; i < hd / 2; ++i) {
      uint32_t pair = 0;
      for (int64_t e = 0; e < 2; ++e) {
        const int64_t c = 2 * i + e;
        const float code = ch.step[c] > 0.0f
                               ? round_in((xj[c] - ch.low[c]) / ch.step[c], 0.0f,
                                          kInt4KeyLevels)
                               : 0.0f;
        pair |= static_cast<uint32_t>(code) << (4 * e);
      }
      row[i] = static_cast<uint8_t>(pair);
    }
  }
  uint8_t* region = ch.region.data();
  std::fill(ch.region.begin(), ch.region.end(), 0);
  std::memcpy(region, &top_bits, 2);  // little-endian hosts, as the Python codec's view
  std::memcpy(region + 2, &widest_bits, 2);
  uint8_t* bits = region + kInt4KeyParamHead;
  for (int64_t c = 0; c < hd; ++c) {
    put_bits(bits, kInt4KeyMidBits * c, kInt4KeyMidBits, ch.mid_code[c]);
    put_bits(bits, kInt4KeyMidBits * hd + kInt4KeyHalfBits * c, kInt4KeyHalfBits,
             ch.half_code[c]);
  }
  const int64_t spare = row_len - hd / 2;
  for (int64_t j = 0; j < bs; ++j)
    std::memcpy(rows + j * slot_stride + hd / 2, region + j * spare, spare);
}

// Per-channel scratch of one (block, head) int8 encode.
struct Centers {
  std::vector<float> low_x, high_x, center, rest;
  std::vector<int8_t> code;

  explicit Centers(int64_t hd) : low_x(hd), high_x(hd), center(hd), rest(hd), code(hd) {}
};

// One block's int8 key rows for one head from x [bs, hd] (rows before `filled` read):
// rows [bs] of row_len bytes, slot_stride apart (kv_key_centers.encode_key_block, its
// float32 operations in order).
void encode_centers_block(const float* x, int64_t filled, int64_t bs, int64_t hd,
                          int64_t row_len, uint8_t* rows, int64_t slot_stride, Centers& ch) {
  channel_ranges(x, filled, hd, ch.low_x.data(), ch.high_x.data());
  float top = 0.0f;
  for (int64_t c = 0; c < hd; ++c) {
    ch.center[c] = (ch.low_x[c] + ch.high_x[c]) * 0.5f;  // the midpoint, until coded
    top = std::max(top, std::fabs(ch.center[c]));
  }
  const uint16_t top_bits = half_bits_up(top);  // M
  const float unit = c10::detail::fp16_ieee_to_fp32_value(top_bits) / kInt8KeyCenterCodes;
  for (int64_t c = 0; c < hd; ++c) {
    const float m = unit > 0.0f ? round_in(ch.center[c] / unit, -kInt8KeyCenterCodes,
                                           kInt8KeyCenterCodes)
                                : 0.0f;
    ch.code[c] = static_cast<int8_t>(m);
    ch.center[c] = m * unit;
  }
  const int64_t spare = row_len - hd - 2;
  for (int64_t j = 0; j < bs; ++j) {
    uint8_t* row = rows + j * slot_stride;
    if (j < filled) {
      const float* xj = x + j * hd;
      for (int64_t c = 0; c < hd; ++c) ch.rest[c] = xj[c] - ch.center[c];
      encode_int8(ch.rest.data(), hd, row);
    } else {
      std::memset(row, 0, hd + 2);
    }
    // M's bit j in the sign bit of row j's scale (the high byte of a little-endian half).
    if (j < kInt8KeyUnitRows) row[hd + 1] |= static_cast<uint8_t>(((top_bits >> j) & 1u) << 7);
    for (int64_t b = 0; b < spare; ++b) {
      const int64_t c = j * spare + b;
      row[hd + 2 + b] = c < hd ? static_cast<uint8_t>(ch.code[c]) : 0;
    }
  }
}

void check_plan_tensor(const at::Tensor& t, const char* name, int64_t n) {
  TORCH_CHECK(t.scalar_type() == at::kLong && t.device().is_cpu() && t.is_contiguous() &&
                  t.dim() == 1 && (n < 0 || t.numel() == n),
              name, " must be a contiguous int64 CPU tensor", n < 0 ? "" : " of one per block");
}

}  // namespace

void write_key_blocks(const at::Tensor& key, at::Tensor k_cache, at::Tensor exact,
                      const at::Tensor& tokens, const at::Tensor& dest, const at::Tensor& blocks,
                      const at::Tensor& filled, const at::Tensor& carry,
                      const at::Tensor& keep_slot) {
  TORCH_CHECK(key.scalar_type() == at::kFloat && key.device().is_cpu() && key.dim() == 3 &&
                  key.stride(2) == 1,
              "key must be float32 [num_tokens, nkv, hd] on the CPU with contiguous heads");
  const int64_t nkv = key.size(1), hd = key.size(2);
  TORCH_CHECK(k_cache.scalar_type() == at::kByte || k_cache.scalar_type() == at::kChar,
              "k_cache must be an int4 (uint8) or int8 pool's key rows, not ",
              k_cache.scalar_type());
  const KvKind kind = kv_kind_of(k_cache.scalar_type());
  TORCH_CHECK(hd % 2 == 0, "a quantized pool's keys need an even head size, not ", hd);
  TORCH_CHECK(k_cache.device().is_cpu() && k_cache.dim() == 4 && k_cache.stride(3) == 1 &&
                  k_cache.size(2) == nkv && k_cache.size(3) == row_len(kind, hd),
              "k_cache must be the pool's key rows [num_blocks, bs, nkv, ", row_len(kind, hd),
              "] for head size ", hd, ", rows contiguous");
  const int64_t bs = k_cache.size(1), rl = k_cache.size(3);
  TORCH_CHECK(bs >= min_block_size(kind), "an ", k_cache.scalar_type(), " pool's blocks hold "
              "at least ", min_block_size(kind), " slots, not ", bs);
  TORCH_CHECK(exact.scalar_type() == at::kHalf && exact.device().is_cpu() && exact.dim() == 4 &&
                  exact.size(1) == bs && exact.size(2) == nkv && exact.size(3) == hd &&
                  exact.stride(3) == 1,
              "exact must be float16 [slots, bs, nkv, hd] like k_cache's blocks");
  const int64_t num_blocks = blocks.numel(), num_tokens = tokens.numel();
  check_plan_tensor(tokens, "tokens", -1);
  check_plan_tensor(dest, "dest", num_tokens);
  check_plan_tensor(blocks, "blocks", -1);
  check_plan_tensor(filled, "filled", num_blocks);
  check_plan_tensor(carry, "carry", num_blocks);
  check_plan_tensor(keep_slot, "keep_slot", num_blocks);
  if (num_blocks == 0) return;
  const int64_t* tok = tokens.data_ptr<int64_t>();
  const int64_t* dst = dest.data_ptr<int64_t>();
  const int64_t* blk = blocks.data_ptr<int64_t>();
  const int64_t* fill = filled.data_ptr<int64_t>();
  const int64_t* from = carry.data_ptr<int64_t>();
  const int64_t* keep = keep_slot.data_ptr<int64_t>();
  const int64_t slots = exact.size(0);

  // Each block's new tokens: a run of the plan's, as StagePlan lays them out (blocks in
  // order, each block's rows one run). first[i]..first[i + 1] are block i's; start[i] its
  // first new row, the rows before it the earlier ones.
  std::vector<int64_t> first(num_blocks + 1, num_tokens), start(num_blocks);
  for (int64_t t = num_tokens - 1; t >= 0; --t) {
    TORCH_CHECK(tok[t] >= 0 && tok[t] < key.size(0) && dst[t] >= 0 &&
                    dst[t] < num_blocks * bs && (t == 0 || dst[t - 1] < dst[t]),
                "tokens and dest must be a StagePlan's: increasing rows of the step's blocks");
    first[dst[t] / bs] = t;
  }
  for (int64_t i = num_blocks - 1; i >= 0; --i) first[i] = std::min(first[i], first[i + 1]);
  for (int64_t i = 0; i < num_blocks; ++i) {
    const bool any = first[i] < first[i + 1];
    start[i] = any ? dst[first[i]] % bs : fill[i];
    TORCH_CHECK(blk[i] >= 0 && blk[i] < k_cache.size(0) && fill[i] >= 1 && fill[i] <= bs &&
                    (!any || dst[first[i + 1] - 1] % bs < fill[i]) &&
                    from[i] >= kPoolRows && from[i] < slots && keep[i] >= -1 && keep[i] < slots &&
                    (from[i] != kNoRows || start[i] == 0),
                "block ", i, " of the plan is not a StagePlan's: block ", blk[i], ", filled ",
                fill[i], ", carry ", from[i], ", keep_slot ", keep[i]);
  }

  // All blocks' rows are gathered before any slot is written: a block that fills gives
  // its slot back, and a later block of the same step may keep its rows there.
  at::Tensor gathered = at::empty({num_blocks, nkv, bs, hd}, key.options());  // float32
  float* rows_all = gathered.data_ptr<float>();
  uint8_t* pool = static_cast<uint8_t*>(k_cache.data_ptr());
  at::Half* ex = exact.data_ptr<at::Half>();
  const float* keys = key.data_ptr<float>();
  const int64_t pool_block = k_cache.stride(0), pool_slot = k_cache.stride(1),
                pool_head = k_cache.stride(2);
  const int64_t ex_slot = exact.stride(0), ex_row = exact.stride(1), ex_head = exact.stride(2);
  const int64_t key_token = key.stride(0), key_head = key.stride(1);
  const bool int4 = kind == KvKind::kI4;

  at::parallel_for(0, num_blocks * nkv, 1, [&](int64_t begin, int64_t end) {
    Channels ch(int4 ? hd : 0, int4 ? bs * (rl - hd / 2) : 0);
    Centers centers(int4 ? 0 : hd);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t i = task / nkv, h = task % nkv;
      float* x = rows_all + task * bs * hd;  // [bs, hd]
      uint8_t* block_rows = pool + blk[i] * pool_block + h * pool_head;
      if (from[i] >= 0) {
        const at::Half* slot = ex + from[i] * ex_slot + h * ex_head;
        for (int64_t j = 0; j < start[i]; ++j)
          for (int64_t c = 0; c < hd; ++c)
            x[j * hd + c] = static_cast<float>(slot[j * ex_row + c]);
      } else if (from[i] == kPoolRows && !int4) {
        // The block's rows as kv_key_centers.decode_key_block gives them: center + code *
        // scale.
        const Int8Kv* coded = reinterpret_cast<const Int8Kv*>(block_rows);
        int8_key_centers(coded, pool_slot, hd, centers.center.data());
        int8_key_rows(coded, pool_slot, hd, 0, start[i], centers.center.data(), x);
      } else if (from[i] == kPoolRows) {
        // The block's rows as kv_key_channels.decode_key_block gives them: low + code * step.
        const Int4Kv* coded = reinterpret_cast<const Int4Kv*>(block_rows);
        int4_key_params(coded, pool_slot, hd, rl, ch.region.data(), ch.low.data(),
                        ch.step.data());
        for (int64_t j = 0; j < start[i]; ++j) {
          const uint8_t* codes = block_rows + j * pool_slot;
          for (int64_t c = 0; c < hd; ++c) {
            const uint32_t code = (codes[c / 2] >> (4 * (c % 2))) & 0x0fu;
            x[j * hd + c] = ch.low[c] + static_cast<float>(code) * ch.step[c];
          }
        }
      }
      for (int64_t t = first[i]; t < first[i + 1]; ++t) {
        float* r = x + (dst[t] % bs) * hd;
        std::memcpy(r, keys + tok[t] * key_token + h * key_head, hd * sizeof(float));
        hadamard_rotate(r, hd);
        // float16 as the slots keep them, so that a block encodes to the same bytes
        // whether its rows came in one write or over many.
        for (int64_t c = 0; c < hd; ++c) r[c] = to_half(r[c]);
      }
      if (int4)
        encode_block(x, fill[i], bs, hd, rl, block_rows, pool_slot, ch);
      else
        encode_centers_block(x, fill[i], bs, hd, rl, block_rows, pool_slot, centers);
    }
  });
  at::parallel_for(0, num_blocks * nkv, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t i = task / nkv, h = task % nkv;
      if (keep[i] < 0) continue;
      const float* x = rows_all + task * bs * hd;
      at::Half* slot = ex + keep[i] * ex_slot + h * ex_head;
      // Kept where they came from, the earlier rows are there already (float16 to float32
      // and back is exact): only the step's new rows go in.
      const int64_t j0 = keep[i] == from[i] ? start[i] : 0;
      for (int64_t j = j0; j < fill[i]; ++j)
        for (int64_t c = 0; c < hd; ++c)
          slot[j * ex_row + c] = static_cast<at::Half>(x[j * hd + c]);
    }
  });
}

}  // namespace folio_cpu::attention

TORCH_LIBRARY_FRAGMENT(folio_cpu, m) {
  m.def("write_key_blocks(Tensor key, Tensor(a!) k_cache, Tensor(b!) exact, Tensor tokens, "
        "Tensor dest, Tensor blocks, Tensor filled, Tensor carry, Tensor keep_slot) -> ()",
        &folio_cpu::attention::write_key_blocks);
}
