// The library's ops as C++ functions, for code that strings several of them together
// (fused/decoder_layer.cpp); each is registered as torch.ops.folio_cpu.<name> beside its
// code, with its semantics documented there.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace folio_cpu {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, double offset);
at::Tensor add_rms_norm(at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight,
                        double eps, double offset);
at::Tensor silu_mul(const at::Tensor& gate_up);

}  // namespace folio_cpu

namespace folio_cpu::attention {

void rotary_write_kv(at::Tensor query, at::Tensor key, const at::Tensor& value,
                     const at::Tensor& cos, const at::Tensor& sin, at::Tensor k_cache,
                     at::Tensor v_cache, const at::Tensor& slot_mapping);
at::Tensor paged_attention(const at::Tensor& query, const at::Tensor& k_cache,
                           const at::Tensor& v_cache, const at::Tensor& query_start_loc,
                           const at::Tensor& seq_lens, const at::Tensor& block_tables,
                           double scale, int64_t window, double softcap,
                           const std::optional<at::Tensor>& sinks,
                           const std::optional<at::Tensor>& key_ends = std::nullopt);
void write_key_blocks(const at::Tensor& key, at::Tensor k_cache, at::Tensor exact,
                     const at::Tensor& tokens, const at::Tensor& dest, const at::Tensor& blocks,
                     const at::Tensor& filled, const at::Tensor& carry,
                     const at::Tensor& keep_slot);

}  // namespace folio_cpu::attention
