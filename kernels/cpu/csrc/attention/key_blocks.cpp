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

#include "attention/key_block_codecs.inc"

// StagePlan.carry's markers (kernels/key_stage.py): no earlier rows, or the pool's.
constexpr int64_t kNoRows = -1, kPoolRows = -2;

// Fetches `rows` rows of `row_bytes` bytes, `stride` bytes apart, into the cache. Kept out
// of GCC's interprocedural analysis: it finds a function of prefetches alone free of side
// effects and drops the calls.
[[gnu::noipa]] void prefetch_rows(const void* first, int64_t rows, int64_t stride,
                                  int64_t row_bytes) {
  const char* row = static_cast<const char*>(first);
  for (int64_t j = 0; j < rows; ++j, row += stride)
    for (int64_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(row + b, 0, 3);
}

void check_plan_tensor(const at::Tensor& t, const char* name, int64_t n) {
  TORCH_CHECK(t.scalar_type() == at::kLong && t.device().is_cpu() && t.is_contiguous() &&
                  t.dim() == 1 && (n < 0 || t.numel() == n),
              name, " must be a contiguous int64 CPU tensor", n < 0 ? "" : " of one per block");
}

// One step's write, as its tasks (one per written block and KV head) read it: the plan
// (checked), each block's first token and first new row, and the tensors' pointers and
// strides in elements.
struct KeyStep {
  const int64_t *tok, *dst, *blk, *fill, *from, *first, *start;
  const float* keys;
  int64_t key_token, key_head;
  uint8_t* pool;
  int64_t pool_block, pool_slot, pool_head, row_len;
  const uint16_t* exact;  // float16 bits
  int64_t ex_slot, ex_row, ex_head;
  float* rows;  // [blocks, nkv, bs, hd] float32, the gathered rows
  int64_t nkv, bs, hd;
  bool int4;
};

// A task's earlier rows in its slot of exact keys: rows of hd halves, a slot row (all
// heads) apart. Between two steps the weights' reads have evicted them, and read in order
// each row's miss waits for the one before.
void prefetch_exact(const KeyStep& s, int64_t task) {
  const int64_t i = task / s.nkv, h = task % s.nkv;
  if (s.from[i] >= 0)
    prefetch_rows(s.exact + s.from[i] * s.ex_slot + h * s.ex_head, s.start[i], s.ex_row * 2,
                  s.hd * 2);
}

// Task `task`'s block rows for its head gathered (the rows before its first new one from
// its slot or decoded from the pool), its new keys put in rotated and rounded to float16,
// and the block encoded into the pool. Cloned per instruction set with the helpers
// inlined (flatten): the same operations in the same order at each clone's vector width
// (no contraction: -ffp-contract=off), so the same bytes.
__attribute__((target_clones("avx512f", "avx2", "default"), flatten))
void write_task(const KeyStep& s, int64_t task, Channels& ch, Centers& centers) {
  const int64_t i = task / s.nkv, h = task % s.nkv, bs = s.bs, hd = s.hd, rl = s.row_len;
  const int64_t* start = s.start;
  const int64_t* from = s.from;
  float* x = s.rows + task * bs * hd;  // [bs, hd]
  uint8_t* block_rows = s.pool + s.blk[i] * s.pool_block + h * s.pool_head;
  if (from[i] >= 0) {
    const uint16_t* slot = s.exact + from[i] * s.ex_slot + h * s.ex_head;
    for (int64_t j = 0; j < start[i]; ++j)
      for (int64_t c = 0; c < hd; ++c)
        x[j * hd + c] = c10::detail::fp16_ieee_to_fp32_value(slot[j * s.ex_row + c]);
  } else if (from[i] == kPoolRows && !s.int4) {
    // The block's rows as kv_key_centers.decode_key_block gives them: center + code *
    // scale.
    const Int8Kv* coded = reinterpret_cast<const Int8Kv*>(block_rows);
    int8_key_centers(coded, s.pool_slot, hd, centers.center.data());
    int8_key_rows(coded, s.pool_slot, hd, 0, start[i], centers.center.data(), x);
  } else if (from[i] == kPoolRows) {
    // The block's rows as kv_key_channels.decode_key_block gives them: low + code * step.
    const Int4Kv* coded = reinterpret_cast<const Int4Kv*>(block_rows);
    int4_key_params(coded, s.pool_slot, hd, rl, ch.region.data(), ch.low.data(),
                    ch.step.data());
    for (int64_t j = 0; j < start[i]; ++j) {
      const uint8_t* codes = block_rows + j * s.pool_slot;
      for (int64_t c = 0; c < hd; ++c) {
        const uint32_t code = (codes[c / 2] >> (4 * (c % 2))) & 0x0fu;
        x[j * hd + c] = ch.low[c] + static_cast<float>(code) * ch.step[c];
      }
    }
  }
  for (int64_t t = s.first[i]; t < s.first[i + 1]; ++t) {
    float* r = x + (s.dst[t] % bs) * hd;
    std::memcpy(r, s.keys + s.tok[t] * s.key_token + h * s.key_head, hd * sizeof(float));
    hadamard_rotate(r, hd);
    // float16 as the slots keep them, so that a block encodes to the same bytes whether
    // its rows came in one write or over many.
    for (int64_t c = 0; c < hd; ++c) r[c] = to_half(r[c]);
  }
  if (s.int4)
    encode_block(x, s.fill[i], bs, hd, rl, block_rows, s.pool_slot, ch);
  else
    encode_centers_block(x, s.fill[i], bs, hd, rl, block_rows, s.pool_slot, centers);
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
  const KeyStep step{
      tok, dst, blk, fill, from, first.data(), start.data(),
      key.data_ptr<float>(), key.stride(0), key.stride(1),
      static_cast<uint8_t*>(k_cache.data_ptr()), k_cache.stride(0), k_cache.stride(1),
      k_cache.stride(2), rl,
      reinterpret_cast<const uint16_t*>(exact.data_ptr<at::Half>()), exact.stride(0),
      exact.stride(1), exact.stride(2),
      gathered.data_ptr<float>(), nkv, bs, hd, kind == KvKind::kI4};

  // Fetched a few tasks ahead: a decode step's whole share of a thread (half a layer's
  // heads), so that their rows arrive together (prefetch_exact).
  constexpr int64_t kTasksAhead = 4;
  at::parallel_for(0, num_blocks * nkv, 1, [&](int64_t begin, int64_t end) {
    Channels ch(step.int4 ? hd : 0, step.int4 ? bs * (rl - hd / 2) : 0);
    Centers centers(step.int4 ? 0 : hd);
    for (int64_t task = begin; task < std::min(end, begin + kTasksAhead); ++task)
      prefetch_exact(step, task);
    for (int64_t task = begin; task < end; ++task) {
      if (task + kTasksAhead < end) prefetch_exact(step, task + kTasksAhead);
      write_task(step, task, ch, centers);
    }
  });
  // In one thread: only open blocks are kept (one per sequence at most), and of them only
  // the rows not in their slot already: a decode step's one row per head costs less than
  // a parallel region's start and join, and a prefill's block per sequence little beside
  // the rest of its step.
  at::Half* ex = exact.data_ptr<at::Half>();
  for (int64_t task = 0; task < num_blocks * nkv; ++task) {
    const int64_t i = task / nkv, h = task % nkv;
    if (keep[i] < 0) continue;
    const float* x = step.rows + task * bs * hd;
    at::Half* slot = ex + keep[i] * step.ex_slot + h * step.ex_head;
    // Kept where they came from, the earlier rows are there already (float16 to float32
    // and back is exact): only the step's new rows go in.
    const int64_t j0 = keep[i] == from[i] ? start[i] : 0;
    for (int64_t j = j0; j < fill[i]; ++j)
      for (int64_t c = 0; c < hd; ++c)
        slot[j * step.ex_row + c] = static_cast<at::Half>(x[j * hd + c]);
  }
}

}  // namespace folio_cpu::attention

TORCH_LIBRARY_FRAGMENT(folio_cpu, m) {
  m.def("write_key_blocks(Tensor key, Tensor(a!) k_cache, Tensor(b!) exact, Tensor tokens, "
        "Tensor dest, Tensor blocks, Tensor filled, Tensor carry, Tensor keep_slot) -> ()",
        &folio_cpu::attention::write_key_blocks);
}
