// Plain data shared by the attention planner (paged_attention.cpp) and the per-ISA
// kernels (attend_*.cpp): no functions here, so that the ISA files can include it before
// their `#pragma GCC target` without compiling anything under a foreign target.
#pragma once

#include <cstdint>

namespace folio_cpu::attention {

// What a pool row holds (kernels/kv_format.py, the one definition): hd float32 or float16
// values, or bytes: int8 / fp8 (e4m3) codes then one float16 scale, or int4. An int4 value
// row is Hadamard-rotated values as packed nibbles q + 8 (element 2i low), then a float16
// scale per group, then zeros; an int4 key row is a block's channel codes (nibbles 0..15),
// the block's per-channel parameters strung over its rows' remaining bytes
// (kernels/kv_key_channels.py).
enum class KvKind : int { kF32 = 0, kF16 = 1, kI8 = 2, kFp8 = 3, kI4 = 4 };

// An int4 key block's parameters per KV head (kv_key_channels): float16 M and W, then the
// bit string of each channel's 6-bit midpoint code (m + 31), then each one's 5-bit
// half-width code s. They need this many rows of a block, so int4 pools have at least as
// many slots a block.
constexpr int64_t kInt4KeyMinBlock = 32;
constexpr int64_t kInt4KeyParamHead = 4;  // M, W
constexpr int64_t kInt4KeyMidBits = 6, kInt4KeyHalfBits = 5;
constexpr float kInt4KeyMidCodes = 31.0f, kInt4KeyLevels = 15.0f;
// kv_key_channels.HALF_SCALES: float32(2^(-s / 8)), s = 0..31, as literals so that every
// reader decodes the same bits as the Python codec (a test holds the two equal).
constexpr float kInt4KeyHalfScales[32] = {
    0x1p+0f, 0x1.d5818ep-1f, 0x1.ae89fap-1f, 0x1.8ace54p-1f,
    0x1.6a09e6p-1f, 0x1.4bfdaep-1f, 0x1.306fep-1f, 0x1.172b84p-1f,
    0x1p-1f, 0x1.d5818ep-2f, 0x1.ae89fap-2f, 0x1.8ace54p-2f,
    0x1.6a09e6p-2f, 0x1.4bfdaep-2f, 0x1.306fep-2f, 0x1.172b84p-2f,
    0x1p-2f, 0x1.d5818ep-3f, 0x1.ae89fap-3f, 0x1.8ace54p-3f,
    0x1.6a09e6p-3f, 0x1.4bfdaep-3f, 0x1.306fep-3f, 0x1.172b84p-3f,
    0x1p-3f, 0x1.d5818ep-4f, 0x1.ae89fap-4f, 0x1.8ace54p-4f,
    0x1.6a09e6p-4f, 0x1.4bfdaep-4f, 0x1.306fep-4f, 0x1.172b84p-4f,
};

// An int8 key block's centers per KV head (kv_key_centers): the spare bytes after each
// row's scale, strung in row order, hold each channel's int8 center code; the sign bits of
// rows 0..15's float16 scales the 16 bits of the float16 M (a scale itself is never
// negative: its magnitude is the scale). A code per channel and M's bits need this many
// rows, so int8 pools have at least as many slots a block.
constexpr int64_t kInt8KeyMinBlock = 64;
constexpr int64_t kInt8KeyUnitRows = 16;
constexpr float kInt8KeyCenterCodes = 127.0f;

// Spare bytes of an int8 row after its scale (kv_key_centers.spare_bytes).
inline int64_t int8_key_spare_bytes(int64_t hd) {
  return (hd + kInt8KeyMinBlock - 1) / kInt8KeyMinBlock;
}

// One step's batch as the kernels read it; all strides in elements.
struct AttentionArgs {
  const float* query;  // [num_tokens, nq, hd], dim stride 1
  int64_t q_token_stride, q_head_stride;
  // [num_blocks, block_size, nkv, row], row dim stride 1: kv_kind says what a row holds
  // (float16: the native backend's default pool, half the bytes each decode step reads;
  // the quantized kinds a half or a quarter of that again). Strides in pool elements
  // (bytes for the quantized kinds).
  const void* k_cache;
  const void* v_cache;  // same strides and dtype as k_cache
  KvKind kv_kind;
  int64_t kv_block_stride, kv_slot_stride, kv_head_stride;
  float* out;  // [num_tokens, nq, hd] contiguous
  const int32_t* query_start_loc;  // [num_seqs + 1]
  const int32_t* seq_lens;         // [num_seqs]
  const int32_t* block_tables;     // [num_seqs, max_blocks]
  int64_t block_table_stride;
  int64_t block_size, head_size, num_q_heads, num_kv_heads;
  int64_t row_len;  // pool elements per row: head_size, or a quantized row's bytes
  float scale;
  float softcap;   // 0: none
  int64_t window;  // 0: none; else the query at p sees keys p - window + 1 .. p
  // nullptr: none; else [nq] logits in each row's softmax denominator that weigh no value
  // (attention sinks), folded in where a row's output is normalized.
  const float* sinks = nullptr;
  // nullptr: causal; else [num_tokens] each query row's key limit: row t (position p)
  // sees keys < key_ends[t] (>= p + 1: the keys past p are the step's own tokens, a
  // bidirectional run such as Gemma 3's image), from p - window + 1 on under a window.
  const int32_t* key_ends = nullptr;
};

// The last key position query row `token` (at position `pos`) sees.
inline int64_t last_key(const AttentionArgs& a, int64_t token, int64_t pos) {
  return a.key_ends == nullptr ? pos : static_cast<int64_t>(a.key_ends[token]) - 1;
}

// The element types of the quantized pools (one byte each, so that element strides are
// byte strides): distinct types, so that the kernels pick a row's decoding by overload.
struct Int8Kv { int8_t code; };
struct Fp8Kv { uint8_t bits; };   // e4m3fn
struct Int4Kv { uint8_t pair; };  // two nibbles

// One unit of work: some query tokens of one sequence, the query heads of one KV head,
// against the keys [key_begin, key_end) of that sequence (one split of its context).
struct AttentionTask {
  int32_t seq;
  int32_t kv_head;
  int32_t token_begin, token_end;  // rows of the query (absolute)
  int64_t key_begin, key_end;      // key positions read; each row masks its own range
  // -1: the task covers every key its rows see, so it writes the normalized output.
  // Else: the first of its rows' slots in the partial buffers (rows in token-major,
  // head-minor order), merged by log-sum-exp afterwards.
  int64_t partial;
};

// Split-K partial softmax state: for slot i, max score, sum of exp and the unnormalized
// weighted values [hd].
struct Partials {
  float* max_score;  // [slots]
  float* sum_exp;    // [slots]
  float* acc;        // [slots, hd]
};

}  // namespace folio_cpu::attention
