// write_kv (scatter each new token's K/V to its slot; slot -1 skipped) and
// rotary_write_kv (the rotary step on q and k in place, then the same scatter), so that
// a layer's rope and KV write are one op instead of about ten. A float16 pool takes
// float32 K/V rounded as torch's .to(torch.float16) rounds them; an int8, fp8 or int4
// pool takes them quantized as kernels/kv_format.py's encode does (rotated first),
// in the same op. An int8 or int4 pool takes the values only: its key rows are encoded
// from the whole block's keys (kernels/kv_key_centers.py, kernels/kv_key_channels.py),
// which a token's write does not have; the caller writes them a block at a time
// (kernels/key_stage.py), and these ops leave them as they are.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "attention/attend_isa.h"
#include "attention/kv_rows.h"
#include "ops.h"

namespace folio_cpu::attention {

namespace {

// The largest head size a quantized row is rotated for on the stack.
constexpr int64_t kMaxRotatedHead = 1024;

// hd float32 values (rotated) -> e4m3 codes (x / scale clamped to +-448, rounded as
// torch's float8_e4m3fn conversion) and the scale after them.
void encode_fp8(const float* x, int64_t hd, uint8_t* row) {
  const Scale s = scale_for(x, hd, 448.0f);
  for (int64_t d = 0; d < hd; ++d)
    row[d] = c10::Float8_e4m3fn(std::clamp(x[d] * s.inv, -448.0f, 448.0f)).x;
  std::memcpy(row + hd, &s.bits, 2);
}

// hd float32 values (rotated) -> per group of int4_group(hd) codes q + 8 (q in [-8, 7])
// packed two a byte (element 2i low), then the groups' scales, then zeros to row_len (the
// key rows' length, kv_format.row_len). As q4_0 (and kernels/kv_format.py): the scale is
// the group's largest-magnitude element (the positive one on a tie) over -8, a signed
// float16, so that element codes as -8 exactly.
void encode_int4(const float* r, int64_t hd, int64_t row_len, uint8_t* row) {
  const int64_t group = int4_group(hd);
  for (int64_t g0 = 0; g0 < hd; g0 += group) {
    float top = r[g0], bottom = r[g0];
    for (int64_t i = g0; i < g0 + group; ++i) {
      top = std::max(top, r[i]);
      bottom = std::min(bottom, r[i]);
    }
    const float signed_max = top >= -bottom ? top : bottom;
    const uint16_t bits = c10::detail::fp16_ieee_from_fp32_value(signed_max / -8.0f);
    const float scale = c10::detail::fp16_ieee_to_fp32_value(bits);
    const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
    for (int64_t i = g0; i < g0 + group; i += 2) {
      const float lo = std::min(round_in(r[i] * inv, -8.0f, 8.0f), 7.0f) + 8.0f;
      const float hi = std::min(round_in(r[i + 1] * inv, -8.0f, 8.0f), 7.0f) + 8.0f;
      row[i / 2] = static_cast<uint8_t>(static_cast<int>(lo) | (static_cast<int>(hi) << 4));
    }
    std::memcpy(row + hd / 2 + 2 * (g0 / group), &bits, 2);
  }
  const int64_t used = hd / 2 + 2 * (hd / group);
  std::memset(row + used, 0, row_len - used);
}

// The slots a token's K/V go to, and the pool's geometry, in elements.
struct Scatter {
  const int64_t* slots;
  int64_t block_size, block_stride, slot_stride, head_stride, num_kv_heads, head_size;
  int64_t src_bytes, dst_bytes;  // an element of key / value, of the pool
  int64_t row_len;               // pool elements per row
  HalvesFromFloats to_halves;    // float32 rows into a float16 pool; nullptr: copied as is
  KvKind kind;                   // a quantized kind: float32 rows encoded into it
  char* k_base;
  char* v_base;

  void put(const char* src, char* dst) const {
    const float* x = reinterpret_cast<const float*>(src);
    if (rotated(kind)) {  // every quantized row: rotated, then encoded
      float r[kMaxRotatedHead];
      std::memcpy(r, x, head_size * sizeof(float));
      hadamard_rotate(r, head_size);
      uint8_t* row = reinterpret_cast<uint8_t*>(dst);
      switch (kind) {
        case KvKind::kI8:
          encode_int8(r, head_size, row);
          std::memset(row + head_size + 2, 0, row_len - head_size - 2);
          return;
        case KvKind::kFp8: encode_fp8(r, head_size, row); return;
        default: encode_int4(r, head_size, row_len, row); return;
      }
    }
    if (to_halves != nullptr)
      to_halves(x, reinterpret_cast<uint16_t*>(dst), head_size);
    else
      std::memcpy(dst, src, head_size * dst_bytes);
  }

  // Token t's [nkv, hd] key and value rows (dim stride 1) to its slot.
  void write(int64_t t, const char* key, int64_t key_head_stride, const char* value,
             int64_t value_head_stride) const {
    const int64_t slot = slots[t];
    if (slot < 0) return;
    const int64_t offset = (slot / block_size) * block_stride + (slot % block_size) * slot_stride;
    const bool keys = !keys_by_block(kind);  // int8 and int4 keys: a block at a time
    for (int64_t h = 0; h < num_kv_heads; ++h) {
      const int64_t dst = (offset + h * head_stride) * dst_bytes;
      if (keys) put(key + h * key_head_stride * src_bytes, k_base + dst);
      put(value + h * value_head_stride * src_bytes, v_base + dst);
    }
  }
};

Scatter scatter_for(const at::Tensor& key, const at::Tensor& value, at::Tensor& k_cache,
                    at::Tensor& v_cache, const at::Tensor& slot_mapping) {
  TORCH_CHECK(key.dim() == 3 && value.sizes() == key.sizes() && key.stride(2) == 1 &&
                  value.stride(2) == 1,
              "key and value must be [num_tokens, nkv, hd] with contiguous heads");
  const KvKind kind = kv_kind_of(k_cache.scalar_type());
  const int64_t hd = key.size(2);
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.strides() == v_cache.strides() &&
                  k_cache.sizes() == v_cache.sizes() && k_cache.stride(3) == 1 &&
                  k_cache.size(2) == key.size(1) && k_cache.size(3) == row_len(kind, hd),
              "k_cache and v_cache must be [num_blocks, block_size, nkv, row] like key, a "
              "row ", row_len(kind, hd), " elements for head size ", hd, " in a ",
              k_cache.scalar_type(), " pool");
  const bool encode = quantized(kind);
  const bool to_half = key.scalar_type() == at::kFloat && k_cache.scalar_type() == at::kHalf;
  TORCH_CHECK((encode ? key.scalar_type() == at::kFloat
                      : to_half || key.scalar_type() == k_cache.scalar_type()) &&
                  key.scalar_type() == value.scalar_type() &&
                  k_cache.scalar_type() == v_cache.scalar_type(),
              "key and value must share a dtype, and the caches theirs, or float16 or a "
              "quantized pool for float32 K/V");
  TORCH_CHECK(!encode || (hd % 2 == 0 && hd <= kMaxRotatedHead),
              "a quantized pool needs an even head size up to ", kMaxRotatedHead, ", not ", hd);
  TORCH_CHECK(k_cache.size(1) >= min_block_size(kind), "an ", k_cache.scalar_type(),
              " pool's blocks hold at least ", min_block_size(kind), " slots (its key "
              "blocks keep their parameters in their rows), not ", k_cache.size(1));
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous() &&
                  slot_mapping.numel() == key.size(0),
              "slot_mapping must be contiguous int64 [num_tokens]");
  return {slot_mapping.data_ptr<int64_t>(), k_cache.size(1), k_cache.stride(0),
          k_cache.stride(1), k_cache.stride(2), k_cache.size(2), hd,
          static_cast<int64_t>(key.element_size()), static_cast<int64_t>(k_cache.element_size()),
          k_cache.size(3),
          to_half ? kernels_for_active_isa().halves_from_floats : nullptr, kind,
          static_cast<char*>(k_cache.data_ptr()), static_cast<char*>(v_cache.data_ptr())};
}

void write_kv(const at::Tensor& key, const at::Tensor& value, at::Tensor k_cache,
              at::Tensor v_cache, const at::Tensor& slot_mapping) {
  const Scatter scatter = scatter_for(key, value, k_cache, v_cache, slot_mapping);
  const char* k = static_cast<const char*>(key.data_ptr());
  const char* v = static_cast<const char*>(value.data_ptr());
  const int64_t es = key.element_size();
  at::parallel_for(0, key.size(0), 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      scatter.write(t, k + t * key.stride(0) * es, key.stride(1), v + t * value.stride(0) * es,
                    value.stride(1));
  });
}

// Rotate-half on the leading `rotary` dims of one head in place: x * cos + swap(x) * sin,
// with sin's first half negated (engine/layers/rotary.py's tables); the rest pass through.
void rotate_head(float* __restrict x, const float* __restrict cos, const float* __restrict sin,
                 int64_t rotary) {
  const int64_t half = rotary / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    x[i] = a * cos[i] + b * sin[i];
    x[i + half] = b * cos[i + half] + a * sin[i + half];
  }
}

void rotate_heads(at::Tensor& x, int64_t t, const float* cos, const float* sin, int64_t rotary) {
  float* row = x.data_ptr<float>() + t * x.stride(0);
  for (int64_t h = 0; h < x.size(1); ++h) rotate_head(row + h * x.stride(1), cos, sin, rotary);
}

void check_rotary(const at::Tensor& query, const at::Tensor& key, const at::Tensor& cos,
                  const at::Tensor& sin) {
  TORCH_CHECK(query.scalar_type() == at::kFloat && key.scalar_type() == at::kFloat &&
                  query.dim() == 3 && key.dim() == 3 && query.stride(2) == 1 &&
                  key.stride(2) == 1 && query.size(0) == key.size(0) &&
                  query.size(2) == key.size(2),
              "query [T, nq, hd] and key [T, nkv, hd] must be float32 with contiguous heads");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat &&
                  cos.sizes() == sin.sizes() && cos.strides() == sin.strides() &&
                  cos.stride(-1) == 1 && cos.size(0) == query.size(0) &&
                  cos.numel() == cos.size(0) * cos.size(-1) && cos.size(-1) <= query.size(2) &&
                  cos.size(-1) % 2 == 0,
              "cos and sin must be float32 [T, (1,) rotary_dim] with an even rotary_dim");
}

// query, key: rotated in place by each token's cos/sin rows ([T, rot] or [T, 1, rot]).
void rotary(at::Tensor query, at::Tensor key, const at::Tensor& cos, const at::Tensor& sin) {
  check_rotary(query, key, cos, sin);
  const float* c = cos.data_ptr<float>();
  const float* s = sin.data_ptr<float>();
  const int64_t rot = cos.size(-1), table_stride = cos.stride(0);
  at::parallel_for(0, query.size(0), 32, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      rotate_heads(query, t, c + t * table_stride, s + t * table_stride, rot);
      rotate_heads(key, t, c + t * table_stride, s + t * table_stride, rot);
    }
  });
}

}  // namespace

void rotary_write_kv(at::Tensor query, at::Tensor key, const at::Tensor& value,
                     const at::Tensor& cos, const at::Tensor& sin, at::Tensor k_cache,
                     at::Tensor v_cache, const at::Tensor& slot_mapping) {
  check_rotary(query, key, cos, sin);
  const Scatter scatter = scatter_for(key, value, k_cache, v_cache, slot_mapping);
  const float* c = cos.data_ptr<float>();
  const float* s = sin.data_ptr<float>();
  const int64_t rot = cos.size(-1), table_stride = cos.stride(0);
  const char* k = static_cast<const char*>(key.data_ptr());
  const char* v = static_cast<const char*>(value.data_ptr());
  at::parallel_for(0, query.size(0), 32, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      rotate_heads(query, t, c + t * table_stride, s + t * table_stride, rot);
      rotate_heads(key, t, c + t * table_stride, s + t * table_stride, rot);
      scatter.write(t, k + t * key.stride(0) * 4, key.stride(1), v + t * value.stride(0) * 4,
                    value.stride(1));
    }
  });
}

}  // namespace folio_cpu::attention

TORCH_LIBRARY_FRAGMENT(folio_cpu, m) {
  m.def("write_kv(Tensor key, Tensor value, Tensor(a!) k_cache, Tensor(b!) v_cache, "
        "Tensor slot_mapping) -> ()",
        &folio_cpu::attention::write_kv);
  m.def("rotary(Tensor(a!) query, Tensor(b!) key, Tensor cos, Tensor sin) -> ()",
        &folio_cpu::attention::rotary);
  m.def("rotary_write_kv(Tensor(a!) query, Tensor(b!) key, Tensor value, Tensor cos, "
        "Tensor sin, Tensor(c!) k_cache, Tensor(d!) v_cache, Tensor slot_mapping) -> ()",
        &folio_cpu::attention::rotary_write_kv);
}
