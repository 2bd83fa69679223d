// paged_attention: a varlen batch (prefill chunks and decode tokens mixed) over the
// paged KV pool, read in place through the block tables; the semantics of
// kernels/reference/backend.py (causal, GQA, sliding window, logit soft-cap, attention
// sinks, per-row key limits for bidirectional runs).
//
// The batch becomes tasks (attention_task.h): per sequence, per KV head, tiles of query
// tokens; when that gives too few tasks to keep every thread busy (a decode step of one
// sequence has num_kv_heads of them), each tile's keys split into block-aligned ranges
// whose partial softmaxes merge by log-sum-exp. Threads pull tasks from a shared counter
// (costs differ: causal tiles late in a chunk see more keys). A decode step whose
// sequences all start with the same blocks (one prompt's candidates) reads those blocks
// once for every sequence's rows instead (plan_shared_prefix).
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <optional>
#include <vector>

#include "attention/attend_isa.h"
#include "attention/kv_rows.h"
#include "isa.h"
#include "ops.h"

namespace folio_cpu::attention {

namespace {

// A split holds at least this many keys: below it the merge costs more than it saves.
constexpr int64_t kMinSplitKeys = 128;
// A decode step shares its sequences' leading blocks from this many (plan_shared_prefix).
constexpr int64_t kMinSharedBlocks = 2;
// Rows (tokens x query heads) per prefill tile: scores and acc stay in L1/L2.
constexpr int64_t kTileRows = 64;
// Below this many multiply-adds a step runs on the calling thread (fork/join costs more).
constexpr int64_t kSerialWork = int64_t{1} << 16;

struct SplitTile {  // a tile whose keys were split: merged after the tasks ran
  int64_t token_begin, rows, kv_head, first_slot, splits;
  int64_t stride;  // slots from one split's rows to the next's
};

struct Plan {
  std::vector<AttentionTask> tasks;
  std::vector<int64_t> costs;
  std::vector<SplitTile> split_tiles;
  int64_t partial_slots = 0;
  int64_t max_rows = 1;
};

Plan plan_tasks(const AttentionArgs& a, int64_t num_seqs, int64_t threads) {
  const int64_t group = a.num_q_heads / a.num_kv_heads;
  const int64_t tile_tokens = std::max<int64_t>(1, kTileRows / group);
  struct Tile { int32_t seq; int64_t token_begin, token_end, key_begin, key_end; };
  std::vector<Tile> tiles;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t start = a.query_start_loc[s], end = a.query_start_loc[s + 1];
    const int64_t seq_len = a.seq_lens[s];
    TORCH_CHECK(end - start <= seq_len, "sequence ", s, ": query length ", end - start,
                " exceeds its seq_len ", seq_len);
    for (int64_t t = start; t < end; t += tile_tokens) {
      const int64_t t_end = std::min(end, t + tile_tokens);
      const int64_t first_pos = seq_len - (end - start) + (t - start);
      const int64_t key_begin = a.window > 0 ? std::max<int64_t>(0, first_pos - a.window + 1) : 0;
      int64_t key_end = seq_len - (end - t_end);  // the tile's last row's position + 1
      if (a.key_ends != nullptr) {  // a bidirectional run's rows see past their position
        for (int64_t r = t; r < t_end; ++r) {
          TORCH_CHECK(a.key_ends[r] >= first_pos + (r - t) + 1 && a.key_ends[r] <= seq_len,
                      "key_ends[", r, "] = ", a.key_ends[r], " must lie in [position + 1, ",
                      seq_len, "]");
          key_end = std::max<int64_t>(key_end, a.key_ends[r]);
        }
      }
      tiles.push_back({static_cast<int32_t>(s), t, t_end, key_begin, key_end});
    }
  }
  const int64_t base_tasks = static_cast<int64_t>(tiles.size()) * a.num_kv_heads;
  const int64_t wanted = threads > 1 ? 4 * threads : 1;
  Plan plan;
  for (const Tile& tile : tiles) {
    const int64_t rows = (tile.token_end - tile.token_begin) * group;
    plan.max_rows = std::max(plan.max_rows, rows);
    const int64_t keys = tile.key_end - tile.key_begin;
    // Block-aligned split boundaries, so that no block is read by two splits.
    const int64_t first_block = tile.key_begin / a.block_size;
    const int64_t num_blocks = (tile.key_end - 1) / a.block_size + 1 - first_block;
    int64_t splits = 1;
    if (base_tasks < wanted) {
      const int64_t most = std::min(num_blocks, std::max<int64_t>(1, keys / kMinSplitKeys));
      splits = std::min((wanted + base_tasks - 1) / base_tasks, most);
      // Whole rounds for the threads where the keys allow: one sequence's 3 KV heads in 3
      // splits each left one of 2 threads a task more than the other.
      while (splits < most && base_tasks * splits % threads != 0) ++splits;
    }
    const int64_t blocks_per_split = (num_blocks + splits - 1) / splits;
    splits = (num_blocks + blocks_per_split - 1) / blocks_per_split;
    for (int64_t h = 0; h < a.num_kv_heads; ++h) {
      const int64_t first_slot = splits > 1 ? plan.partial_slots : -1;
      for (int64_t i = 0; i < splits; ++i) {
        const int64_t begin = std::max(tile.key_begin, (first_block + i * blocks_per_split) * a.block_size);
        const int64_t end = std::min(tile.key_end,
                                     (first_block + (i + 1) * blocks_per_split) * a.block_size);
        plan.tasks.push_back({tile.seq, static_cast<int32_t>(h),
                              static_cast<int32_t>(tile.token_begin),
                              static_cast<int32_t>(tile.token_end), begin, end,
                              splits > 1 ? first_slot + i * rows : -1});
        plan.costs.push_back((end - begin) * rows * a.head_size);
      }
      if (splits > 1) {
        plan.split_tiles.push_back({tile.token_begin, rows, h, first_slot, splits, rows});
        plan.partial_slots += splits * rows;
      }
    }
  }
  return plan;
}

// A decode step (one token per sequence, no window) whose block tables all start with
// the same blocks, as one prompt's candidates do: per KV head, the shared blocks in key
// splits, each split one task over every sequence's rows (their positions all lie past
// the shared keys, so no row masks any), and per sequence one task over its own blocks
// after them; a row's splits merge by log-sum-exp. Slots per KV head: split i of row r
// (token-major) at base + i * S + r, S = all rows; the own-blocks task last. Without it
// every candidate reads the whole prompt again (the reference's shared_prefix.py).
// An empty plan when the step is not such a one.
Plan plan_shared_prefix(const AttentionArgs& a, int64_t num_seqs, int64_t threads) {
  const int64_t bs = a.block_size;
  if (num_seqs < 2 || a.window != 0 || a.key_ends != nullptr) return {};
  int64_t min_len = a.seq_lens[0];
  for (int64_t s = 0; s < num_seqs; ++s) {
    if (a.query_start_loc[s + 1] - a.query_start_loc[s] != 1) return {};
    min_len = std::min<int64_t>(min_len, a.seq_lens[s]);
  }
  // Each sequence keeps at least its newest token in its own tail.
  int64_t shared = (min_len - 1) / bs;
  for (int64_t s = 1; s < num_seqs && shared > 0; ++s) {
    const int32_t* t0 = a.block_tables, *ts = a.block_tables + s * a.block_table_stride;
    int64_t same = 0;
    while (same < shared && ts[same] == t0[same]) ++same;
    shared = same;
  }
  if (shared < kMinSharedBlocks) return {};
  const int64_t group = a.num_q_heads / a.num_kv_heads, rows = num_seqs * group;
  const int64_t wanted = threads > 1 ? 4 * threads : 1;
  int64_t splits = std::min((wanted + a.num_kv_heads - 1) / a.num_kv_heads,
                            std::max<int64_t>(1, shared * bs / kMinSplitKeys));
  const int64_t per_split = (shared + splits - 1) / splits;  // blocks
  splits = (shared + per_split - 1) / per_split;
  Plan plan;
  plan.max_rows = rows;
  for (int64_t h = 0; h < a.num_kv_heads; ++h) {
    const int64_t base = plan.partial_slots;
    for (int64_t i = 0; i < splits; ++i) {
      const int64_t begin = i * per_split * bs, end = std::min(shared, (i + 1) * per_split) * bs;
      plan.tasks.push_back({0, static_cast<int32_t>(h), 0, static_cast<int32_t>(num_seqs),
                            begin, end, base + i * rows});
      plan.costs.push_back((end - begin) * rows * a.head_size);
    }
    for (int64_t s = 0; s < num_seqs; ++s) {
      const int64_t begin = shared * bs, end = a.seq_lens[s];
      plan.tasks.push_back({static_cast<int32_t>(s), static_cast<int32_t>(h),
                            static_cast<int32_t>(s), static_cast<int32_t>(s + 1), begin, end,
                            base + splits * rows + s * group});
      plan.costs.push_back((end - begin) * group * a.head_size);
      plan.split_tiles.push_back({s, group, h, base + s * group, splits + 1, rows});
    }
    plan.partial_slots += (splits + 1) * rows;
  }
  return plan;
}

// Each split-K tile's rows: out = sum_i acc_i * e^(m_i - M) / sum_i l_i * e^(m_i - M),
// with a sink s one more term e^(s - M) of the denominator (M then covers s too).
void merge_splits(const AttentionArgs& a, const Plan& plan, const Partials& p) {
  const int64_t hd = a.head_size;
  const int64_t group = a.num_q_heads / a.num_kv_heads;
  for (const SplitTile& tile : plan.split_tiles) {
    for (int64_t r = 0; r < tile.rows; ++r) {
      float top = -INFINITY;
      for (int64_t i = 0; i < tile.splits; ++i)
        top = std::max(top, p.max_score[tile.first_slot + i * tile.stride + r]);
      const int64_t token = tile.token_begin + r / group;
      const int64_t head = tile.kv_head * group + r % group;
      const bool seen_any = top > -INFINITY;
      if (a.sinks != nullptr && seen_any) top = std::max(top, a.sinks[head]);
      float* out = a.out + (token * a.num_q_heads + head) * hd;
      std::fill(out, out + hd, 0.0f);
      float total = 0.0f;
      for (int64_t i = 0; i < tile.splits; ++i) {
        const int64_t slot = tile.first_slot + i * tile.stride + r;
        if (p.sum_exp[slot] == 0.0f) continue;  // a split outside this row's window
        const float weight = std::exp(p.max_score[slot] - top);
        total += p.sum_exp[slot] * weight;
        const float* acc = p.acc + slot * hd;
        for (int64_t d = 0; d < hd; ++d) out[d] += acc[d] * weight;
      }
      if (a.sinks != nullptr && seen_any) total += std::exp(a.sinks[head] - top);
      const float inv = total > 0.0f ? 1.0f / total : 0.0f;
      for (int64_t d = 0; d < hd; ++d) out[d] *= inv;
    }
  }
}

// x [T, heads, hd] contiguous: each head's row rotated in place (hadamard_rotate).
void rotate_rows(at::Tensor& x) {
  const int64_t hd = x.size(2), rows = x.size(0) * x.size(1);
  float* data = x.data_ptr<float>();
  at::parallel_for(0, rows, 256, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) hadamard_rotate(data + r * hd, hd);
  });
}

at::Tensor rotated_query(const at::Tensor& query) {
  at::Tensor q = query.contiguous();
  if (q.data_ptr() == query.data_ptr()) q = q.clone();
  rotate_rows(q);
  return q;
}

void check_int32(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kInt && t.is_contiguous(), name,
              " must be a contiguous int32 CPU tensor");
}

}  // namespace

at::Tensor paged_attention(const at::Tensor& query, const at::Tensor& k_cache,
                           const at::Tensor& v_cache, const at::Tensor& query_start_loc,
                           const at::Tensor& seq_lens, const at::Tensor& block_tables,
                           double scale, int64_t window, double softcap,
                           const std::optional<at::Tensor>& sinks,
                           const std::optional<at::Tensor>& key_ends) {
  TORCH_CHECK(query.dim() == 3 && query.scalar_type() == at::kFloat && query.stride(2) == 1,
              "query must be float32 [num_tokens, nq, hd] with contiguous heads");
  const KvKind kind = kv_kind_of(k_cache.scalar_type());
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.stride(3) == 1 &&
                  k_cache.sizes() == v_cache.sizes() && k_cache.strides() == v_cache.strides() &&
                  v_cache.scalar_type() == k_cache.scalar_type(),
              "k_cache and v_cache must be [num_blocks, block_size, nkv, row] with the same "
              "dtype and strides");
  check_int32(query_start_loc, "query_start_loc");
  check_int32(seq_lens, "seq_lens");
  check_int32(block_tables, "block_tables");
  const int64_t num_tokens = query.size(0), nq = query.size(1), hd = query.size(2);
  const int64_t nkv = k_cache.size(2);
  TORCH_CHECK(nq % nkv == 0, "query heads (", nq, ") must be a multiple of KV heads (", nkv,
              ")");
  TORCH_CHECK(k_cache.size(3) == row_len(kind, hd), "a ", k_cache.scalar_type(),
              " pool's rows for head size ", hd, " are ", row_len(kind, hd),
              " elements, not ", k_cache.size(3));
  TORCH_CHECK(k_cache.size(1) >= min_block_size(kind), "an ", k_cache.scalar_type(),
              " pool's blocks hold at least ", min_block_size(kind), " slots (its key "
              "blocks keep their parameters in their rows), not ", k_cache.size(1));
  const int64_t num_seqs = seq_lens.size(0);
  TORCH_CHECK(query_start_loc.size(0) == num_seqs + 1 && block_tables.size(0) == num_seqs,
              "query_start_loc, seq_lens and block_tables disagree on the number of sequences");
  if (sinks.has_value()) {
    TORCH_CHECK(sinks->device().is_cpu() && sinks->scalar_type() == at::kFloat &&
                    sinks->is_contiguous() && sinks->dim() == 1 && sinks->size(0) == nq,
                "sinks must be a contiguous float32 CPU tensor of shape [", nq, "]");
  }
  if (key_ends.has_value()) {
    check_int32(*key_ends, "key_ends");
    TORCH_CHECK(key_ends->dim() == 1 && key_ends->size(0) == num_tokens,
                "key_ends must have one entry per query token (", num_tokens, ")");
  }
  auto out = at::empty({num_tokens, nq, hd}, query.options());
  if (num_tokens == 0 || num_seqs == 0) return out;
  // A quantized pool's rows are rotated: so is the query (a copy; the caller's stays), and the
  // output, attended in the rotated space, rotates back below.
  const at::Tensor q = rotated(kind) ? rotated_query(query) : query;

  AttentionArgs args{q.data_ptr<float>(), q.stride(0), q.stride(1),
                     k_cache.data_ptr(), v_cache.data_ptr(), kind,
                     k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                     out.data_ptr<float>(), query_start_loc.data_ptr<int32_t>(),
                     seq_lens.data_ptr<int32_t>(), block_tables.data_ptr<int32_t>(),
                     block_tables.stride(0), k_cache.size(1), hd, nq, nkv, k_cache.size(3),
                     static_cast<float>(scale), static_cast<float>(softcap), window,
                     sinks.has_value() ? sinks->data_ptr<float>() : nullptr,
                     key_ends.has_value() ? key_ends->data_ptr<int32_t>() : nullptr};
  const int64_t threads = at::get_num_threads();
  Plan plan = plan_shared_prefix(args, num_seqs, threads);
  if (plan.tasks.empty()) plan = plan_tasks(args, num_seqs, threads);
  std::vector<float> partial_buffer(plan.partial_slots * (hd + 2));
  Partials partials{partial_buffer.data(), partial_buffer.data() + plan.partial_slots,
                    partial_buffer.data() + 2 * plan.partial_slots};
  const RunTask run = kernels_for_active_isa().run_task;
  const int64_t scratch_size = scratch_floats(plan.max_rows, args);
  const int64_t num_tasks = static_cast<int64_t>(plan.tasks.size());
  int64_t total_cost = 0;
  for (int64_t c : plan.costs) total_cost += c;

  if (threads == 1 || num_tasks == 1 || total_cost < kSerialWork) {
    std::vector<float> scratch(scratch_size);
    for (const AttentionTask& task : plan.tasks) run(args, task, partials, scratch.data());
  } else {
    // Costliest first, so that the last tasks pulled are short ones.
    std::vector<int64_t> order(num_tasks);
    for (int64_t i = 0; i < num_tasks; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t x, int64_t y) { return plan.costs[x] > plan.costs[y]; });
    std::atomic<int64_t> next{0};
    at::parallel_for(0, std::min(threads, num_tasks), 1, [&](int64_t, int64_t) {
      std::vector<float> scratch(scratch_size);
      for (int64_t i = next.fetch_add(1); i < num_tasks; i = next.fetch_add(1))
        run(args, plan.tasks[order[i]], partials, scratch.data());
    });
  }
  merge_splits(args, plan, partials);
  if (rotated(kind)) rotate_rows(out);
  return out;
}

// The half-width scales the kernels decode int4 keys with (kInt4KeyHalfScales), for the
// tests to hold against kv_key_channels.HALF_SCALES.
at::Tensor int4_key_half_scales() {
  at::Tensor table = at::empty({32}, at::TensorOptions().dtype(at::kFloat));
  std::copy(kInt4KeyHalfScales, kInt4KeyHalfScales + 32, table.data_ptr<float>());
  return table;
}

IsaKernels kernels_for_active_isa() {
#if defined(__x86_64__)
  switch (active_isa()) {
    case Isa::kAvx512Vnni:
    case Isa::kAvx512: return {&avx512::run_task, &avx512::halves_from_floats};
    case Isa::kAvx2: return {&avx2::run_task, &avx2::halves_from_floats};
    case Isa::kPortable: break;
  }
#endif
  return {&portable::run_task, &portable::halves_from_floats};
}

}  // namespace folio_cpu::attention

TORCH_LIBRARY_FRAGMENT(folio_cpu, m) {
  m.def("paged_attention(Tensor query, Tensor k_cache, Tensor v_cache, Tensor query_start_loc, "
        "Tensor seq_lens, Tensor block_tables, float scale, int window, float softcap, "
        "Tensor? sinks=None, Tensor? key_ends=None) -> Tensor",
        &folio_cpu::attention::paged_attention);
  m.def("int4_key_half_scales() -> Tensor", &folio_cpu::attention::int4_key_half_scales);
}
