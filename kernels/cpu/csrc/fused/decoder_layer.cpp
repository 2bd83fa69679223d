// DecoderLayer: a pre-norm decoder layer's whole step in one call from Python (RMSNorm,
// the stacked q/k/v product and its bias, the q/k norms, rotary + KV write, paged attention
// with its window, soft-cap and sinks, the o product and its bias, residual add + RMSNorm,
// the stacked gate/up product, SiLU(gate) * up, the down product and the residual add).
// It runs the library's own ops in the order the layer modules run them (engine/layers),
// so its result is theirs bit for bit; what it saves is the Python between them, which on
// a small model's decode step costs more than some of the ops
// (engine/layers/native_layer.py builds one per eligible layer and calls it).
#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "ops.h"
#include "quant/matmul.h"

namespace folio_cpu {
namespace {

// One stacked product's matrices, checked once (quant_matmul_stack checks them per call).
class Stack {
 public:
  Stack(std::vector<at::Tensor> ws, const std::vector<int64_t>& type_ids,
        const c10::List<std::optional<at::Tensor>>& rows, int64_t k)
      : ws_(std::move(ws)), k_(k) {
    TORCH_CHECK(!ws_.empty() && type_ids.size() == ws_.size() && rows.size() == ws_.size(),
                "a product needs one type id and one row order per matrix");
    // mats_ refer to ws_'s elements, which stay put: the vector is never resized.
    for (size_t j = 0; j < ws_.size(); ++j)
      mats_.push_back(quant::checked_matrix(ws_[j], type_ids[j], k_, rows.get(j)));
  }
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;

  at::Tensor operator()(const at::Tensor& x, bool pairs) const {
    return quant::multiply_stack(x, mats_, k_, pairs);
  }

 private:
  std::vector<at::Tensor> ws_;
  std::vector<quant::Matrix> mats_;
  int64_t k_;
};

enum Product : int64_t { kQkv = 0, kO = 1, kGateUp = 2, kDown = 3, kProducts = 4 };

// A prefill's MLP runs over equal chunks of at most this many rows: a 512-token chunk's
// gate/up product for a 1B or 3B model (512 x 16,384 floats) is 32 MiB, at glibc's
// largest mmap threshold (engine/runner/heap.py), so until the heap had grown a free
// piece that large, each layer faulted a fresh mapping's 8,192 pages in: a process's
// first prompt, which under page-cache pressure took seconds longer.
// The wide tiles split rows the same way (kMaxTileM, matmul_wide.cpp), so the chunks
// unpack no weight twice and their results are the unchunked product's.
constexpr int64_t kMlpRows = 256;

}  // namespace

struct DecoderLayer : torch::CustomClassHolder {
  DecoderLayer(at::Tensor input_norm, at::Tensor post_norm, double input_eps, double post_eps,
               double norm_offset, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
               double scale)
      : input_norm_(std::move(input_norm)), post_norm_(std::move(post_norm)),
        input_eps_(input_eps), post_eps_(post_eps), offset_(norm_offset), nq_(num_heads),
        nkv_(num_kv_heads), hd_(head_dim), scale_(scale) {
    TORCH_CHECK(nq_ > 0 && nkv_ > 0 && nq_ % nkv_ == 0 && hd_ > 0,
                "num_heads must be a positive multiple of num_kv_heads");
  }

  // which: 0 q/k/v, 1 o, 2 gate/up, 3 down; the matrices as quant_matmul_stack takes them.
  void set_product(int64_t which, std::vector<at::Tensor> ws, std::vector<int64_t> type_ids,
                   c10::List<std::optional<at::Tensor>> rows, int64_t k) {
    TORCH_CHECK(which >= 0 && which < kProducts, "which must be 0-3, not ", which);
    products_[which] = std::make_unique<Stack>(std::move(ws), type_ids, rows, k);
  }

  // The attention's options, where the layer has them (none by default): RMSNorms over
  // each q and k head (weights [head_dim], both or neither), a sliding window (0: none),
  // a logit soft-cap (0: none) and per-head sink logits (float32 [num_heads]).
  void set_attention(std::optional<at::Tensor> q_norm, std::optional<at::Tensor> k_norm,
                     double qk_eps, double qk_offset, int64_t window, double softcap,
                     std::optional<at::Tensor> sinks) {
    TORCH_CHECK(q_norm.has_value() == k_norm.has_value(), "q_norm and k_norm go together");
    TORCH_CHECK(window >= 0 && softcap >= 0.0, "window and softcap must be >= 0 (0: none)");
    TORCH_CHECK(!sinks || (sinks->scalar_type() == at::kFloat && sinks->is_contiguous() &&
                           sinks->numel() == nq_),
                "sinks must be contiguous float32 [num_heads]");
    q_norm_ = std::move(q_norm);
    k_norm_ = std::move(k_norm);
    qk_eps_ = qk_eps;
    qk_offset_ = qk_offset;
    window_ = window;
    softcap_ = softcap;
    sinks_ = std::move(sinks);
  }

  // The q/k/v and o products' biases ([nq + 2 nkv heads x head_dim], [hidden]), where the
  // layer has them: added to the product's output, as StackedLinear does.
  void set_biases(std::optional<at::Tensor> qkv_bias, std::optional<at::Tensor> o_bias) {
    qkv_bias_ = std::move(qkv_bias);
    o_bias_ = std::move(o_bias);
  }

  // hidden float32 [T, hidden] -> the layer's output [T, hidden]; the metadata as
  // paged_attention and rotary_write_kv take it, max_seq_len the longest sequence's (a
  // window that hides nothing is no window, as the backends' effective_window);
  // `pairs` as quant_matmul_stack's.
  at::Tensor step(const at::Tensor& hidden, const at::Tensor& cos, const at::Tensor& sin,
                  const at::Tensor& k_cache, const at::Tensor& v_cache,
                  const at::Tensor& slot_mapping, const at::Tensor& query_start_loc,
                  const at::Tensor& seq_lens, const at::Tensor& block_tables,
                  int64_t max_seq_len, bool pairs) {
    return run(hidden, cos, sin, k_cache, v_cache, slot_mapping, query_start_loc, seq_lens,
               block_tables, max_seq_len, pairs, nullptr);
  }

  // step over an int8 or int4 pool, whose key rows rotary_write_kv leaves alone: the
  // keys are written a block at a time (write_key_blocks, key_blocks.cpp) before the
  // attention reads them, from this layer's slots of exact keys ([slots, bs, nkv, hd]
  // float16) by the step's StagePlan (kernels/key_stage.py: tokens, dest, blocks, filled,
  // carry, keep_slot).
  at::Tensor step_key_blocks(const at::Tensor& hidden, const at::Tensor& cos,
                             const at::Tensor& sin, const at::Tensor& k_cache,
                             const at::Tensor& v_cache, const at::Tensor& slot_mapping,
                             const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
                             const at::Tensor& block_tables, int64_t max_seq_len, bool pairs,
                             const at::Tensor& exact, const at::Tensor& tokens,
                             const at::Tensor& dest, const at::Tensor& blocks,
                             const at::Tensor& filled, const at::Tensor& carry,
                             const at::Tensor& keep_slot) {
    const KeyPlan keys{exact, tokens, dest, blocks, filled, carry, keep_slot};
    return run(hidden, cos, sin, k_cache, v_cache, slot_mapping, query_start_loc, seq_lens,
               block_tables, max_seq_len, pairs, &keys);
  }

 private:
  struct KeyPlan {
    const at::Tensor &exact, &tokens, &dest, &blocks, &filled, &carry, &keep_slot;
  };

  at::Tensor run(const at::Tensor& hidden, const at::Tensor& cos, const at::Tensor& sin,
                 const at::Tensor& k_cache, const at::Tensor& v_cache,
                 const at::Tensor& slot_mapping, const at::Tensor& query_start_loc,
                 const at::Tensor& seq_lens, const at::Tensor& block_tables, int64_t max_seq_len,
                 bool pairs, const KeyPlan* keys) {
    for (const auto& p : products_) TORCH_CHECK(p, "DecoderLayer: a product was never set");
    const int64_t t = hidden.size(0);
    const at::Tensor x = rms_norm(hidden, input_norm_, input_eps_, offset_);
    at::Tensor qkv = (*products_[kQkv])(x, pairs);
    if (qkv_bias_) qkv.add_(*qkv_bias_);
    qkv = qkv.view({t, nq_ + 2 * nkv_, hd_});
    at::Tensor query = qkv.narrow(1, 0, nq_), key = qkv.narrow(1, nq_, nkv_);
    if (q_norm_) {
      query = rms_norm(query, *q_norm_, qk_eps_, qk_offset_);
      key = rms_norm(key, *k_norm_, qk_eps_, qk_offset_);
    }
    attention::rotary_write_kv(query, key, qkv.narrow(1, nq_ + nkv_, nkv_), cos, sin, k_cache,
                               v_cache, slot_mapping);
    if (keys != nullptr)
      attention::write_key_blocks(key, k_cache, keys->exact, keys->tokens, keys->dest,
                                 keys->blocks, keys->filled, keys->carry, keys->keep_slot);
    const at::Tensor attn = attention::paged_attention(
        query, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale_,
        window_ < max_seq_len ? window_ : 0, softcap_, sinks_);
    // The o product becomes the residual stream: add_rms_norm sums the input into it.
    at::Tensor residual = (*products_[kO])(attn.view({t, nq_ * hd_}), pairs);
    if (o_bias_) residual.add_(*o_bias_);
    const at::Tensor normed = add_rms_norm(residual, hidden, post_norm_, post_eps_, offset_);
    const int64_t chunks = std::max<int64_t>(1, (t + kMlpRows - 1) / kMlpRows);
    const int64_t rows = (t + chunks - 1) / chunks;
    for (int64_t r0 = 0; r0 < t; r0 += rows) {
      const int64_t n = std::min(rows, t - r0);
      residual.narrow(0, r0, n).add_(mlp(normed.narrow(0, r0, n), pairs));
    }
    return residual;
  }

  at::Tensor mlp(const at::Tensor& normed, bool pairs) const {
    return (*products_[kDown])(silu_mul((*products_[kGateUp])(normed, pairs)), pairs);
  }

  at::Tensor input_norm_, post_norm_;
  double input_eps_, post_eps_, offset_;
  int64_t nq_, nkv_, hd_;
  double scale_;
  std::unique_ptr<Stack> products_[kProducts];
  std::optional<at::Tensor> q_norm_, k_norm_, sinks_, qkv_bias_, o_bias_;
  double qk_eps_ = 0.0, qk_offset_ = 0.0, softcap_ = 0.0;
  int64_t window_ = 0;
};

}  // namespace folio_cpu

TORCH_LIBRARY_FRAGMENT(folio_cpu, m) {
  m.class_<folio_cpu::DecoderLayer>("DecoderLayer")
      .def(torch::init<at::Tensor, at::Tensor, double, double, double, int64_t, int64_t,
                       int64_t, double>())
      .def("set_product", &folio_cpu::DecoderLayer::set_product)
      .def("set_attention", &folio_cpu::DecoderLayer::set_attention)
      .def("set_biases", &folio_cpu::DecoderLayer::set_biases)
      .def("step", &folio_cpu::DecoderLayer::step)
      .def("step_key_blocks", &folio_cpu::DecoderLayer::step_key_blocks);
}
