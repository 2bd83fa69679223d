// rms_norm and add_rms_norm: one op where the layers ran add + norm (+ Gemma's 1 + weight);
// float32 throughout: x * rsqrt(mean(x^2) + eps) * (weight + offset).
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cmath>

#include "ops.h"

namespace folio_cpu {

namespace {

// One row [hidden]: out = x / rms(x) * (weight + offset).
void norm_row(const float* __restrict x, const float* __restrict weight, float* __restrict out,
              int64_t hidden, float eps, float offset) {
  float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
  for (int64_t i = 0; i < hidden; ++i) sum_sq += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(sum_sq / static_cast<float>(hidden) + eps);
#pragma omp simd
  for (int64_t i = 0; i < hidden; ++i) out[i] = x[i] * inv * (weight[i] + offset);
}

// Rows of a 1-3 dim tensor whose last dim is contiguous: row r's first element.
struct Rows {
  const float* base;
  int64_t count, inner, outer_stride, inner_stride;
  const float* row(int64_t r) const {
    return base + (r / inner) * outer_stride + (r % inner) * inner_stride;
  }
};

Rows rows_of(const at::Tensor& x) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu() && x.dim() >= 1 &&
                  x.dim() <= 3 && x.stride(-1) == 1,
              "expected a float32 CPU tensor of 1-3 dims with a contiguous last dim");
  const float* base = x.data_ptr<float>();
  if (x.dim() == 1) return {base, 1, 1, 0, 0};
  if (x.dim() == 2) return {base, x.size(0), 1, x.stride(0), 0};
  return {base, x.size(0) * x.size(1), x.size(1), x.stride(0), x.stride(1)};
}

void check_weight(const at::Tensor& weight, int64_t hidden) {
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.is_contiguous() &&
                  weight.numel() == hidden,
              "weight must be a contiguous float32 [", hidden, "]");
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, double offset) {
  const Rows rows = rows_of(x);
  const int64_t hidden = x.size(-1);
  check_weight(weight, hidden);
  auto out = at::empty(x.sizes(), x.options());
  float* dst = out.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  at::parallel_for(0, rows.count, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      norm_row(rows.row(r), w, dst + r * hidden, hidden, static_cast<float>(eps),
               static_cast<float>(offset));
  });
  return out;
}

// residual += x (in place: the caller's running hidden state), then the norm of it.
at::Tensor add_rms_norm(at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight,
                        double eps, double offset) {
  TORCH_CHECK(residual.is_contiguous() && residual.sizes() == x.sizes(),
              "residual must be contiguous and shaped as x");
  const Rows rows = rows_of(x);
  rows_of(residual);
  const int64_t hidden = x.size(-1);
  check_weight(weight, hidden);
  auto out = at::empty(x.sizes(), x.options());
  float* sum = residual.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  at::parallel_for(0, rows.count, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* __restrict res = sum + r * hidden;
      const float* __restrict add = rows.row(r);
#pragma omp simd
      for (int64_t i = 0; i < hidden; ++i) res[i] += add[i];
      norm_row(res, w, dst + r * hidden, hidden, static_cast<float>(eps),
               static_cast<float>(offset));
    }
  });
  return out;
}

}  // namespace folio_cpu

TORCH_LIBRARY_FRAGMENT(folio_cpu, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps, float offset) -> Tensor",
        &folio_cpu::rms_norm);
  m.def("add_rms_norm(Tensor(a!) residual, Tensor x, Tensor weight, float eps, float offset) "
        "-> Tensor",
        &folio_cpu::add_rms_norm);
}
