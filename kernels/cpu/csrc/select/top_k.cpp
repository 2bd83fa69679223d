// top_k_indices: the indices of each row's k largest values, largest first; equal values
// by lower index, NaN above every number (as torch.topk ranks it). The LM head recomputes
// its top logits each decode step (engine/layers/lm_head.py), and torch.topk sorts a
// whole vocabulary row to find 32 of them. Here one vectorized pass takes each chunk's
// largest value; the k-th largest of those is a floor the k-th largest value reaches (k
// chunks hold a value at least that high), so only the chunks reaching it are read
// again, and of their values only those reaching it are sorted.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

namespace folio_cpu {

namespace {

constexpr int64_t kChunk = 64;

struct Entry {
  float value;
  int64_t index;
};

// a ranks above b: NaN above every number, then the larger value, then the lower index.
inline bool above(const Entry& a, const Entry& b) {
  const bool an = std::isnan(a.value), bn = std::isnan(b.value);
  if (an != bn) return an;
  if (!an && a.value != b.value) return a.value > b.value;
  return a.index < b.index;
}

// maxima[c] = the largest of x[64c .. min(n, 64c + 64)), +infinity where one is NaN (so
// a chunk holding a NaN reaches every floor), for every chunk of the n values. An explicit
// simd reduction (GCC leaves the plain loop scalar), cloned per instruction set as
// gated_activation.cpp's loop.
#if defined(__x86_64__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void chunk_maxima(const float* __restrict x, int64_t n, float* __restrict maxima) {
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int64_t len = std::min(kChunk, n - c0);
    float m = -INFINITY;
    int nan = 0;
#pragma omp simd reduction(max : m) reduction(| : nan)
    for (int64_t j = 0; j < len; ++j) {
      m = x[c0 + j] > m ? x[c0 + j] : m;
      nan |= x[c0 + j] != x[c0 + j];
    }
    maxima[c0 / kChunk] = nan ? INFINITY : m;
  }
}

void row_top_k(const float* x, int64_t n, int64_t k, int64_t* out) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<Entry> picked;
  if (chunks <= k) {
    for (int64_t i = 0; i < n; ++i) picked.push_back({x[i], i});
  } else {
    std::vector<float> maxima(static_cast<size_t>(chunks));
    chunk_maxima(x, n, maxima.data());
    // The floor: the k-th largest chunk maximum (nth_element reorders a copy).
    std::vector<float> tops(maxima);
    std::nth_element(tops.begin(), tops.begin() + (k - 1), tops.end(), std::greater<float>());
    const float floor = tops[k - 1];
    for (int64_t c = 0; c < chunks; ++c) {
      if (maxima[c] < floor) continue;
      for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i)
        if (x[i] >= floor || x[i] != x[i]) picked.push_back({x[i], i});
    }
  }
  std::partial_sort(picked.begin(), picked.begin() + k, picked.end(), above);
  for (int64_t j = 0; j < k; ++j) out[j] = picked[j].index;
}

at::Tensor top_k_indices(const at::Tensor& values, int64_t k) {
  TORCH_CHECK(values.device().is_cpu() && values.scalar_type() == at::kFloat &&
                  values.dim() == 2,
              "values must be a float32 [rows, n] CPU tensor, not ", values.scalar_type(),
              " ", values.sizes());
  const int64_t rows = values.size(0), n = values.size(1);
  TORCH_CHECK(k >= 1 && k <= n, "k must be in [1, ", n, "] (the row length), not ", k);
  const at::Tensor x = values.stride(1) == 1 ? values : values.contiguous();
  at::Tensor out = at::empty({rows, k}, x.options().dtype(at::kLong));
  const float* src = x.data_ptr<float>();
  int64_t* dst = out.data_ptr<int64_t>();
  const int64_t stride = x.stride(0);
  // A decode step has a few rows: grain 8 keeps them on the calling thread.
  at::parallel_for(0, rows, 8, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) row_top_k(src + r * stride, n, k, dst + r * k);
  });
  return out;
}

}  // namespace

}  // namespace folio_cpu

TORCH_LIBRARY_FRAGMENT(folio_cpu, m) {
  m.def("top_k_indices(Tensor values, int k) -> Tensor", &folio_cpu::top_k_indices);
}
