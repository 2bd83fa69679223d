// wide.h's format in plain C++: quantizing activation rows, unpacking weight rows (and the
// SIMD paths' tail chunks), the dispatch of the SIMD tile kernels and the portable one.
// Included by every ISA file after its target pragma, like unpack.h, so its fixed-trip
// loops vectorize for that ISA.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "layout.h"
#include "unpack.h"
#include "wide.h"

namespace folio_cpu::quant {

namespace {

// A chunk's block-major values (v[b][i], blocks b < nb) -> q in its word order, for a
// chunk of nb word rows (wide.h): lane l = b p + u holds elements u 2nb + 2j, +1 of block
// b in word row j; the word rows past nb zero.
inline void place_wide(const int16_t (*v)[32], int nb, int16_t* q) {
  const int p = 16 / nb;
  for (int b = 0; b < nb; ++b)
    for (int u = 0; u < p; ++u)
      for (int j = 0; j < nb; ++j) {
        const int16_t* src = v[b] + u * 2 * nb + 2 * j;
        int16_t* dst = q + 2 * (16 * j + b * p + u);
        dst[0] = src[0];
        dst[1] = src[1];
      }
  std::memset(q + 32 * nb, 0, static_cast<size_t>(16 - nb) * 32 * sizeof(int16_t));
}

// Per-block scales -> per-lane ones: d in every lane of its block, m0 and m1 in every
// lane (activations) or the first (weights, whose offsets must count once).
inline void place_scales(const float* d, const float* m0, const float* m1, int nb,
                         bool first_lane_offsets, WideChunk& o) {
  const int p = 16 / nb;
  for (int l = 0; l < 16; ++l) {
    const bool offsets = !first_lane_offsets || l % p == 0;
    o.d[l] = d[l / p];
    o.m0[l] = offsets ? m0[l / p] : 0.0f;
    o.m1[l] = offsets ? m1[l / p] : 0.0f;
  }
}

// One block of 32 activations -> v[32], its d and offset sums; IEEE float32 operations
// as quantize_row_impl (act_row.h) with 16383 for 127, which the SIMD copies repeat.
inline void quantize_wide_block(const float* xb, int16_t* v, float& d, float& m0, float& m1) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: rounds to nearest, ties to even
  float mx[8] = {}, bad[8] = {};
  for (int j = 0; j < 32; j += 8)
    for (int l = 0; l < 8; ++l) {
      const float a = __builtin_fabsf(xb[j + l]);
      mx[l] = a > mx[l] ? a : mx[l];
      bad[l] += xb[j + l] * 0.0f;  // NaN exactly when some x is NaN or infinite
    }
  float amax = 0.0f, probe = 0.0f;
  for (int l = 0; l < 8; ++l) {
    amax = mx[l] > amax ? mx[l] : amax;
    probe += bad[l];
  }
  if (probe != 0.0f) amax = probe;  // NaN: d = NaN carries it into the products
  const float db = amax / kWideMax;
  const float inv = db != 0.0f ? 1.0f / db : 0.0f;
  int32_t sum[2] = {0, 0};
  for (int i = 0; i < 32; ++i) {
    float r = (xb[i] * inv + kRound) - kRound;
    r = r > kWideMax ? kWideMax : (r < -kWideMax ? -kWideMax : r);
    r = r == r ? r : 0.0f;
    v[i] = static_cast<int16_t>(r);
    sum[i / 16] += static_cast<int32_t>(r);
  }
  d = db;
  m0 = db * static_cast<float>(sum[0]);
  m1 = db * static_cast<float>(sum[0] + sum[1]);
}

// Chunk c of an activation row of k elements -> o (any chunk, tails included).
inline void quantize_wide_chunk(const float* x, int64_t k, int64_t c, WideChunk& o) {
  int16_t v[16][32] = {};
  float d[16] = {}, m0[16] = {}, m1[16] = {};
  for (int b = 0; b < 16 && c * kWideChunk + 32 * b < k; ++b)
    quantize_wide_block(x + c * kWideChunk + 32 * b, v[b], d[b], m0[b], m1[b]);
  const int nb = wide_rows(k, c);
  place_wide(v, nb, o.q);
  place_scales(d, m0, m1, nb, false, o);
}

// x[k] -> out[wide_chunks(k)], bit-identical on every ISA.
inline void quantize_wide_impl(const float* x, int64_t k, WideChunk* out) {
  for (int64_t c = 0; c < wide_chunks(k); ++c) quantize_wide_chunk(x, k, c, out[c]);
}

// Block b of an unpacked Group's scale and offset terms as a weight chunk keeps them
// (wide.h): D, M (o_2b - o_2b+1), M o_2b+1; no offsets where the type folds them.
inline void wide_block_scales(const Group& g, bool fold, int b, float& d, float& m0,
                              float& m1) {
  d = g.d[b];
  m0 = fold ? 0.0f : g.m[b] * static_cast<float>(g.o[2 * b] - g.o[2 * b + 1]);
  m1 = fold ? 0.0f : g.m[b] * static_cast<float>(g.o[2 * b + 1]);
}

// The SIMD paths' Kernels::dot_wide from a register-blocked kernel
// Block::run<NR, MR, kMin>(w, x, chunks, last_rows, acc, acc_stride) (NR <= kWideCols
// weight rows, MR <= Block::kMaxRows activation rows, its sums added into acc): the
// weight rows in blocks of kWideCols, each over the activation rows in passes of
// kMaxRows, the variant picked once per call.
template <typename Block, int kMin>
void dot_wide_rows(const WideChunk* const* w, int nr, const WideChunk* const* x, int mr,
                   int64_t chunks, int last_rows, float* acc, int64_t stride) {
  using Run = void (*)(const WideChunk* const*, const WideChunk* const*, int64_t, int, float*,
                       int64_t);
  const auto pick = [](int rows, auto cols) -> Run {
    constexpr int NR = decltype(cols)::value;
    switch (rows) {
      case 1: return &Block::template run<NR, 1, kMin>;
      case 2: return &Block::template run<NR, 2, kMin>;
      case 3: if constexpr (Block::kMaxRows >= 3) return &Block::template run<NR, 3, kMin>;
              break;
      case 4: if constexpr (Block::kMaxRows >= 4) return &Block::template run<NR, 4, kMin>;
              break;
      case 5: if constexpr (Block::kMaxRows >= 5) return &Block::template run<NR, 5, kMin>;
              break;
      default: break;
    }
    return &Block::template run<NR, Block::kMaxRows, kMin>;
  };
  static_assert(kWideCols == 2, "pairs of weight rows, then a last single one");
  for (int i0 = 0; i0 < mr; i0 += Block::kMaxRows) {
    const int rows = mr - i0 < Block::kMaxRows ? mr - i0 : Block::kMaxRows;
    const Run two = pick(rows, std::integral_constant<int, 2>{});
    float* a = acc + i0 * stride;
    int r = 0;
    for (; r + 2 <= nr; r += 2) two(w + r, x + i0, chunks, last_rows, a + r, stride);
    if (r < nr)
      pick(rows, std::integral_constant<int, 1>{})(w + r, x + i0, chunks, last_rows, a + r,
                                                  stride);
  }
}

template <typename Block>
void dot_wide_simd(const WideChunk* const* w, int nr, const WideChunk* const* x, int mr,
                   int64_t chunks, int last_rows, int min_terms, float* acc,
                   int64_t stride) {
  if (min_terms == 0) dot_wide_rows<Block, 0>(w, nr, x, mr, chunks, last_rows, acc, stride);
  else if (min_terms == 1) dot_wide_rows<Block, 1>(w, nr, x, mr, chunks, last_rows, acc, stride);
  else dot_wide_rows<Block, 2>(w, nr, x, mr, chunks, last_rows, acc, stride);
}

// The first nb blocks of an unpacked Group as blocks 8h.. of a weight chunk: values
// s_j q'_i (- o_j where the type folds), D, and the offset terms M (o_2b - o_2b+1),
// M o_2b+1; the other blocks zero.
inline void wide_values(const Group& g, int type, int h, int nb, int16_t (*v)[32], float* d,
                        float* m0, float* m1) {
  const bool fold = wide_folds(type), signed_q = signed_weights(type);
  std::memset(v[8 * h], 0, 8 * sizeof(v[0]));
  for (int i = 0; i < 32 * nb; ++i) {
    const int q = signed_q ? static_cast<int8_t>(g.q[i]) : g.q[i];
    v[8 * h + i / 32][i % 32] = static_cast<int16_t>(g.s[i / 16] * q - (fold ? g.o[i / 16] : 0));
  }
  for (int b = 0; b < 8; ++b)
    wide_block_scales(g, fold, b, d[8 * h + b], m0[8 * h + b], m1[8 * h + b]);
}

// The two Groups of chunk c of a weight row (its file bytes, k weights), zero past k.
inline void unpack_chunk_groups(int type, const uint8_t* row, int64_t k, int64_t c,
                                Group* g) {
  const BlockType bt = block_type(type);
  for (int h = 0; h < 2; ++h) {
    const int64_t start = c * kWideChunk + kGroup * h;
    if (start >= k) {
      std::memset(static_cast<void*>(&g[h]), 0, sizeof(Group));
      continue;
    }
    const int64_t n = k - start < kGroup ? k - start : kGroup;
    unpack_row_impl(type, row + start / bt.block_size * bt.block_bytes, n, &g[h]);
  }
}

// Chunk c of a weight row from its Groups, in plain C++ (any chunk, tails included).
inline void wide_chunk_from_groups(const Group* g, int type, int64_t k, int64_t c,
                                   WideChunk& out) {
  int16_t v[16][32];
  float d[16], m0[16], m1[16];
  const int64_t blocks = k / 32 - 16 * c;  // in this chunk, if below 16
  for (int h = 0; h < 2; ++h) {
    const int64_t present = blocks - 8 * h;
    wide_values(g[h], type, h, static_cast<int>(present < 0 ? 0 : present > 8 ? 8 : present),
                v, d, m0, m1);
  }
  const int nb = wide_rows(k, c);
  place_wide(v, nb, out.q);
  place_scales(d, m0, m1, nb, true, out);
}

// A weight row's chunks [c0, c0 + count) (row: the file bytes of the whole row, k
// weights) -> out[count], padding past k zero.
inline void unpack_wide_impl(int type, const uint8_t* row, int64_t k, int64_t c0,
                             int64_t count, WideChunk* out) {
  Group g[2];
  for (int64_t c = 0; c < count; ++c) {
    unpack_chunk_groups(type, row, k, c0 + c, g);
    wide_chunk_from_groups(g, type, k, c0 + c, out[c]);
  }
}

// acc[i * stride + r] += w[r] . x[i] over `chunks` chunks (w[r], x[i]: each row's first
// chunk of the range; the last of them has last_rows word rows), in plain C++: the
// portable path's.
inline void dot_wide_impl(const WideChunk* const* w, int nr, const WideChunk* const* x,
                          int mr, int64_t chunks, int last_rows, int min_terms, float* acc,
                          int64_t stride) {
  for (int i = 0; i < mr; ++i)
    for (int r = 0; r < nr; ++r) {
      float lane[16] = {};
      for (int64_t c = 0; c < chunks; ++c) {
        const WideChunk& a = w[r][c];
        const WideChunk& b = x[i][c];
        int32_t s[16] = {};
        const int word_rows = c == chunks - 1 ? last_rows : 16;
        for (int j = 0; j < word_rows; ++j)
          for (int l = 0; l < 16; ++l) {
            const int p = 32 * j + 2 * l;
            s[l] += a.q[p] * b.q[p] + a.q[p + 1] * b.q[p + 1];
          }
        for (int l = 0; l < 16; ++l) {
          lane[l] += static_cast<float>(s[l]) * (a.d[l] * b.d[l]);
          if (min_terms) lane[l] -= a.m0[l] * b.m0[l] + a.m1[l] * b.m1[l];
        }
      }
      float total = 0.0f;
      for (int l = 0; l < 16; ++l) total += lane[l];
      acc[i * stride + r] += total;
    }
}

}  // namespace
}  // namespace folio_cpu::quant
