// wide.h's format in plain C++: quantizing activation rows, unpacking weight rows, and
// the portable (and AVX2) tile kernel. Included by every ISA file after its target
// pragma, like unpack.h, so its fixed-trip loops vectorize for that ISA.
#pragma once

#include <cstdint>
#include <cstring>

#include "layout.h"
#include "unpack.h"
#include "wide.h"

namespace folio_cpu::quant {

namespace {

// Word (j, l) <- elements 2j, 2j + 1 of block l, for the 8 blocks of one Group in lanes
// 8h..8h + 7 (v: the Group's 256 values in file order).
inline void interleave_wide(const int16_t* v, int h, int16_t* q) {
  for (int b = 0; b < 8; ++b)
    for (int j = 0; j < 16; ++j) {
      const int w = 16 * j + 8 * h + b;
      q[2 * w] = v[32 * b + 2 * j];
      q[2 * w + 1] = v[32 * b + 2 * j + 1];
    }
}

// x[k] -> out[wide_chunks(k)]. The same IEEE float32 operations as quantize_row_impl
// (act_row.h) with 16383 for 127, so every ISA's copy is bit-identical.
inline void quantize_wide_impl(const float* x, int64_t k, WideChunk* out) {
  const int64_t chunks = wide_chunks(k);
  std::memset(static_cast<void*>(out), 0, static_cast<size_t>(chunks) * sizeof(WideChunk));
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: rounds to nearest, ties to even
  int16_t v[256];
  for (int64_t c = 0; c < chunks; ++c) {
    WideChunk& o = out[c];
    for (int h = 0; h < 2; ++h) {
      std::memset(v, 0, sizeof(v));
      for (int b = 0; b < 8; ++b) {
        const int64_t start = c * kWideChunk + 256 * h + 32 * b;
        if (start >= k) break;
        const float* xb = x + start;
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
          v[32 * b + i] = static_cast<int16_t>(r);
          sum[i / 16] += static_cast<int32_t>(r);
        }
        o.d[8 * h + b] = db;
        o.m0[8 * h + b] = db * static_cast<float>(sum[0]);
        o.m1[8 * h + b] = db * static_cast<float>(sum[0] + sum[1]);
      }
      interleave_wide(v, h, o.q);
    }
  }
}

// One unpacked Group into lanes 8h..8h + 7 of a weight chunk.
inline void wide_from_group(const Group& g, int type, int h, WideChunk& out) {
  const bool fold = wide_folds(type), signed_q = type == kQ8_0;
  int16_t v[256];
  for (int i = 0; i < 256; ++i) {
    const int q = signed_q ? static_cast<int8_t>(g.q[i]) : g.q[i];
    v[i] = static_cast<int16_t>(g.s[i / 16] * q - (fold ? g.o[i / 16] : 0));
  }
  interleave_wide(v, h, out.q);
  for (int b = 0; b < 8; ++b) {
    out.d[8 * h + b] = g.d[b];
    out.m0[8 * h + b] = fold ? 0.0f : g.m[b] * static_cast<float>(g.o[2 * b] - g.o[2 * b + 1]);
    out.m1[8 * h + b] = fold ? 0.0f : g.m[b] * static_cast<float>(g.o[2 * b + 1]);
  }
}

// A weight row's chunks [c0, c0 + count) (row: the file bytes of the whole row, k
// weights) -> out[count], padding past k zero.
inline void unpack_wide_impl(int type, const uint8_t* row, int64_t k, int64_t c0,
                             int64_t count, WideChunk* out) {
  const BlockType bt = block_type(type);
  std::memset(static_cast<void*>(out), 0, static_cast<size_t>(count) * sizeof(WideChunk));
  Group g;
  for (int64_t c = 0; c < count; ++c)
    for (int h = 0; h < 2; ++h) {
      const int64_t start = (c0 + c) * kWideChunk + kGroup * h;
      if (start >= k) break;
      const int64_t n = k - start < kGroup ? k - start : kGroup;
      unpack_row_impl(type, row + start / bt.block_size * bt.block_bytes, n, &g);
      wide_from_group(g, type, h, out[c]);
    }
}

// acc[i * nr + r] += w[r] . x[i] over `chunks` chunks (w[r], x[i]: each row's first chunk
// of the range), in plain C++ the compiler vectorizes: the portable and AVX2 paths.
inline void dot_wide_impl(const WideChunk* const* w, int nr, const WideChunk* const* x,
                          int mr, int64_t chunks, int min_terms, float* acc) {
  for (int i = 0; i < mr; ++i)
    for (int r = 0; r < nr; ++r) {
      float lane[16] = {};
      for (int64_t c = 0; c < chunks; ++c) {
        const WideChunk& a = w[r][c];
        const WideChunk& b = x[i][c];
        int32_t s[16] = {};
        for (int j = 0; j < 16; ++j)
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
      acc[i * nr + r] += total;
    }
}

}  // namespace
}  // namespace folio_cpu::quant
