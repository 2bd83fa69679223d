// quant_matmul_grouped: a mixture of experts' product in one call. Route r multiplies
// activation row r / (R / m) of x [m, k] by expert experts[r]'s matrices (each expert a
// stack of `per_expert` matrices as they lie in the file, like quant_matmul_stack's), so
// a layer's gate/up takes the tokens themselves (each read by its k routes) and its down
// product the k rows per token of the activation.
//
// An expert whose routes fit the decode kernels (Kernels::gemv: rows, or pairs of rows,
// up to gemv_max_rows) is multiplied with the other such experts in one parallel region
// over (expert, block of weight rows) items, the activations quantized once for all of
// them: a decode token's k experts cost one barrier, not k. An expert with more rows
// (prefill) takes quant_matmul_stack over its rows, so it picks the wide or 8-bit tiles
// exactly as a dense matrix of that many rows does.
//
// With route_weights [T, kk] (R = T * kk), output row t is the weighted sum of its kk
// routes' products (the down projection's combine); without, output row r is route r's.
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "act.h"
#include "checks.h"
#include "kernels.h"
#include "matmul.h"

namespace folio_cpu::quant {
namespace {

// Weight rows per work item: 8 of gemv's row blocks, enough items for the threads even
// for one expert's matrix, few enough that each call's activation setup is amortized.
constexpr int64_t kItemRows = 64;
// Output columns per item of the combine.
constexpr int64_t kCombineCols = 256;

using RowList = c10::List<std::optional<at::Tensor>>;

at::Tensor dense_stack(const at::Tensor& x, at::TensorList ws, at::IntArrayRef types,
                       int64_t k, const RowList& rows, bool pairs) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("folio_cpu::quant_matmul_stack", "")
          .typed<at::Tensor(const at::Tensor&, at::TensorList, at::IntArrayRef, int64_t,
                            const RowList&, bool)>();
  return op.call(x, ws, types, k, rows, pairs);
}

// One small expert's part of the region: its activation rows and where its product lands
// ([rows][n], matrix j at column cols[j]).
struct ExpertRows {
  int64_t expert;
  std::vector<ActRow> x;
  float* out;
};

struct Item {
  int64_t group, mat, j0, j1;
};

void check_experts(const at::Tensor& experts, int64_t num_experts) {
  TORCH_CHECK(experts.device().is_cpu() && experts.scalar_type() == at::kLong &&
                  experts.dim() == 1,
              "experts must be a CPU int64 [R] tensor, not ", experts.scalar_type(), " ",
              experts.sizes(), " on ", experts.device());
  const int64_t* p = experts.data_ptr<int64_t>();
  for (int64_t r = 0; r < experts.numel(); ++r)
    TORCH_CHECK(p[r] >= 0 && p[r] < num_experts, "experts[", r, "] = ", p[r],
                " is not an expert of the ", num_experts, " given");
}

at::Tensor quant_matmul_grouped(const at::Tensor& x_in, at::TensorList ws,
                                at::IntArrayRef type_ids, int64_t k, const RowList& rows,
                                int64_t per_expert, const at::Tensor& experts_in,
                                const std::optional<at::Tensor>& route_weights, bool pairs) {
  TORCH_CHECK(per_expert >= 1 && !ws.empty() && ws.size() % per_expert == 0, "ws must hold ",
              "per_expert (", per_expert, ") matrices for each expert, not ", ws.size());
  TORCH_CHECK(type_ids.size() == ws.size() && rows.size() == ws.size(), "ws, type_ids and ",
              "rows must have one entry per matrix, not ", ws.size(), ", ", type_ids.size(),
              " and ", rows.size());
  const int64_t num_experts = static_cast<int64_t>(ws.size()) / per_expert;
  std::vector<Matrix> mats;
  std::vector<int64_t> cols(per_expert + 1, 0);  // expert 0's column offsets
  for (size_t i = 0; i < ws.size(); ++i) {
    mats.push_back(checked_matrix(ws[i], type_ids[i], k, rows.get(i)));
    const int64_t j = static_cast<int64_t>(i) % per_expert;
    if (static_cast<int64_t>(i) < per_expert) cols[j + 1] = cols[j] + mats.back().n;
    TORCH_CHECK(mats.back().n == mats[j].n, "matrix ", j, " of expert ", i / per_expert,
                " has ", mats.back().n, " rows but expert 0's has ", mats[j].n);
  }
  const int64_t n = cols[per_expert];
  const at::Tensor x = checked_float_rows(x_in);
  TORCH_CHECK(x.size(1) == k, "x has ", x.size(1), " columns but k is ", k);
  const at::Tensor experts = experts_in.contiguous();
  check_experts(experts, num_experts);
  const int64_t m = x.size(0), routes = experts.numel();
  TORCH_CHECK(m > 0 ? routes % m == 0 : routes == 0, "experts must hold a whole number of ",
              "routes per row of x (", m, " rows), not ", routes);
  const int64_t fan = m > 0 ? routes / m : 1;  // routes per row of x
  at::Tensor weights;
  int64_t out_rows = routes, kk = 1;
  if (route_weights.has_value()) {
    weights = route_weights->contiguous();
    TORCH_CHECK(weights.scalar_type() == at::kFloat && weights.dim() == 2 &&
                    weights.numel() == routes,
                "route_weights must be float32 [T, kk] with T * kk = ", routes,
                " routes, not ", weights.scalar_type(), " ", weights.sizes());
    out_rows = weights.size(0);
    kk = weights.size(1);
  }
  at::Tensor out = at::empty({out_rows, n}, x.options());
  if (routes == 0 || n == 0) return out.zero_();

  // The routes of each expert, in route order (a counting sort).
  const int64_t* ex = experts.data_ptr<int64_t>();
  std::vector<int64_t> start(num_experts + 1, 0), order(routes);
  for (int64_t r = 0; r < routes; ++r) ++start[ex[r] + 1];
  for (int64_t e = 0; e < num_experts; ++e) start[e + 1] += start[e];
  {
    std::vector<int64_t> next(start.begin(), start.end() - 1);
    for (int64_t r = 0; r < routes; ++r) order[next[ex[r]]++] = r;
  }

  const Kernels& kern = kernels_for(active_isa());
  const int64_t step = pairs ? 2 : 1;
  std::vector<const float*> src(routes);  // where route r's product lies
  std::vector<int64_t> small;
  std::vector<at::Tensor> big_outs;  // kept alive until the combine
  std::vector<float> scratch;        // the small experts' products
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t count = start[e + 1] - start[e];
    if (count == 0) continue;
    if (kern.gemv != nullptr && count * step <= kern.gemv_max_rows) {
      small.push_back(e);
      continue;
    }
    at::Tensor idx = at::empty({count}, experts.options());
    int64_t* ip = idx.data_ptr<int64_t>();
    for (int64_t i = 0; i < count; ++i) ip[i] = order[start[e] + i] / fan;
    std::vector<at::Tensor> ew(ws.begin() + e * per_expert, ws.begin() + (e + 1) * per_expert);
    RowList er;
    for (int64_t j = 0; j < per_expert; ++j) er.push_back(rows.get(e * per_expert + j));
    const at::Tensor y = dense_stack(x.index_select(0, idx), ew,
                                     type_ids.slice(e * per_expert, per_expert), k, er, pairs);
    for (int64_t i = 0; i < count; ++i) src[order[start[e] + i]] = y.data_ptr<float>() + i * n;
    big_outs.push_back(y);
  }

  if (!small.empty()) {
    const at::Tensor act = pairs ? quantize_activations_residual(x) : quantize_activations(x);
    const uint8_t* ap = act.data_ptr<uint8_t>();
    const int64_t as = act.stride(0);
    int64_t total = 0;
    for (int64_t e : small) total += start[e + 1] - start[e];
    scratch.resize(static_cast<size_t>(total * n));
    std::vector<ExpertRows> groups;
    std::vector<Item> items;
    float* next = scratch.data();
    for (int64_t e : small) {
      ExpertRows g{e, {}, next};
      for (int64_t i = start[e]; i < start[e + 1]; ++i) {
        const int64_t r = order[i];
        for (int64_t s = 0; s < step; ++s) g.x.push_back(act_row(ap + (r / fan * step + s) * as, k));
        src[r] = next;  // a pair's sum (gemv_pairs)
        next += n;
      }
      for (int64_t j = 0; j < per_expert; ++j)
        for (int64_t j0 = 0; j0 < mats[e * per_expert + j].n; j0 += kItemRows)
          items.push_back({static_cast<int64_t>(groups.size()), j, j0,
                           std::min(j0 + kItemRows, mats[e * per_expert + j].n)});
      groups.push_back(std::move(g));
    }
    at::parallel_for(0, static_cast<int64_t>(items.size()), 1, [&](int64_t lo, int64_t hi) {
      // A thread's consecutive items of one matrix go in one gemv call, which then sets its
      // activations up once.
      for (int64_t i = lo; i < hi;) {
        const Item& first = items[i];
        int64_t j1 = first.j1;
        for (++i; i < hi && items[i].group == first.group && items[i].mat == first.mat; ++i)
          j1 = items[i].j1;
        const ExpertRows& g = groups[first.group];
        const Matrix& mat = mats[g.expert * per_expert + first.mat];
        gemv_range(kern, pairs, mat, first.j0, j1, k, g.x.data(),
                   static_cast<int64_t>(g.x.size()) / step, g.out + cols[first.mat], n);
      }
    });
  }

  // Each output row from its routes' products (weighted where asked).
  const int64_t col_items = (n + kCombineCols - 1) / kCombineCols;
  const float* wp = weights.defined() ? weights.data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / (kCombineCols * kk));
  at::parallel_for(0, out_rows * col_items, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t it = lo; it < hi; ++it) {
      const int64_t t = it / col_items, c0 = it % col_items * kCombineCols;
      const int64_t c1 = std::min(n, c0 + kCombineCols);
      float* o = op + t * n;
      for (int64_t j = 0; j < kk; ++j) {
        const float* y = src[t * kk + j];
        const float w = wp ? wp[t * kk + j] : 1.0f;
        for (int64_t c = c0; c < c1; ++c) {
          o[c] = j == 0 ? (wp ? w * y[c] : y[c]) : o[c] + w * y[c];
        }
      }
    }
  });
  return out;
}

}  // namespace
}  // namespace folio_cpu::quant

TORCH_LIBRARY_FRAGMENT(folio_cpu, m) {
  m.def("quant_matmul_grouped(Tensor x, Tensor[] ws, int[] type_ids, int k, Tensor?[] rows, "
        "int per_expert, Tensor experts, Tensor? route_weights, bool pairs) -> Tensor",
        &folio_cpu::quant::quant_matmul_grouped);
}
