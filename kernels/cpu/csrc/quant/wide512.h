// The AVX-512 wide tile kernel (wide.h's format), shared by the AVX-512 and AVX512-VNNI
// files: each defines wide_acc(isum, w, x) (isum + the int32 pair sums of w * x: madd
// and add, or vpdpwssd) under its own target before including this.
//
// Register blocking: 2 weight rows x 6 activation rows, 12 int32 accumulators per chunk
// and 12 float ones over the range, the two weight words and one activation word at a
// time (27 of the 32 registers): 8 loads per 12 multiplies, and 12 independent chains
// (on Zen 5 vpdpwssd has 4 cycles' latency at two a cycle: 8 chains reach 86% of its
// peak, 12 all of it). Against 2 x 4 (8 chains, each activation word reloaded by both
// weight rows' multiplies) it measured ~10% more multiply-adds per second on the 1B's
// matrices and ~30% more on the 3B's k = 3,072 ones.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "k4_scales.h"
#include "simd512.h"
#include "wide_impl.h"

namespace folio_cpu::quant {
namespace {

// Block b of a Group as 32 int16 values s_j q_i (- o_j where the type folds).
inline __m512i group_block16(const Group& g, int b, bool fold, bool signed_q) {
  const __m256i q8 = _mm256_load_si256(reinterpret_cast<const __m256i*>(g.q + 32 * b));
  const __m512i q = signed_q ? _mm512_cvtepi8_epi16(q8) : _mm512_cvtepu8_epi16(q8);
  // int16 lanes 0-15 take sub-block 2b's scale, 16-31 sub-block 2b + 1's.
  const __m512i idx = _mm512_add_epi16(
      _mm512_set_epi64(0x0001000100010001, 0x0001000100010001, 0x0001000100010001,
                       0x0001000100010001, 0, 0, 0, 0),
      _mm512_set1_epi16(static_cast<int16_t>(2 * b)));
  const __m512i s = _mm512_permutexvar_epi16(
      idx, _mm512_castsi256_si512(_mm256_load_si256(reinterpret_cast<const __m256i*>(g.s))));
  __m512i v = _mm512_mullo_epi16(q, s);
  if (fold) {
    const __m512i o = _mm512_permutexvar_epi16(
        idx, _mm512_castsi256_si512(_mm256_load_si256(reinterpret_cast<const __m256i*>(g.o))));
    v = _mm512_sub_epi16(v, o);
  }
  return v;
}

// Kernels::quantize_wide: quantize_wide_impl's result (the same float32 operations, so
// bit-identical), a full chunk's 16 blocks quantized in registers and transposed into
// its word order.
void quantize_wide512(const float* x, int64_t k, WideChunk* out) {
  const __m512 lim = _mm512_set1_ps(kWideMax), zero = _mm512_setzero_ps();
  for (int64_t c = 0; c < wide_chunks(k); ++c) {
    WideChunk& o = out[c];
    if (wide_rows(k, c) < 16) {
      quantize_wide_chunk(x, k, c, o);
      continue;
    }
    __m512i blocks[16];
    for (int b = 0; b < 16; ++b) {
      const float* xb = x + c * kWideChunk + 32 * b;
      const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
      const __m512 p0 = _mm512_mul_ps(v0, zero), p1 = _mm512_mul_ps(v1, zero);
      const bool bad = (_mm512_cmp_ps_mask(p0, p0, _CMP_UNORD_Q) |
                        _mm512_cmp_ps_mask(p1, p1, _CMP_UNORD_Q)) != 0;
      const float amax = bad ? __builtin_nanf("")
                             : _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0),
                                                                  _mm512_abs_ps(v1)));
      const float db = amax / kWideMax;
      const __m512 inv = _mm512_set1_ps(db != 0.0f ? 1.0f / db : 0.0f);
      __m512i q[2];
      const __m512 v[2] = {v0, v1};
      for (int h = 0; h < 2; ++h) {
        __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(v[h], inv),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(r, r, _CMP_ORD_Q), r);  // NaN -> 0 first:
        r = _mm512_max_ps(_mm512_min_ps(r, lim), _mm512_sub_ps(zero, lim));  // min/max keep it
        q[h] = _mm512_cvtps_epi32(r);
      }
      blocks[b] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(q[0])),
                                     _mm512_cvtepi32_epi16(q[1]), 1);
      const int32_t s0 = _mm512_reduce_add_epi32(q[0]), s1 = _mm512_reduce_add_epi32(q[1]);
      o.d[b] = db;
      o.m0[b] = db * static_cast<float>(s0);
      o.m1[b] = db * static_cast<float>(s0 + s1);
    }
    __m512i words[16];
    transpose16(blocks, words);
    for (int j = 0; j < 16; ++j) _mm512_store_si512(o.q + 32 * j, words[j]);
  }
}

// One Q4_K super-block (144 bytes: d, dmin, 12 scale bytes, qs[128]) as 8 blocks of
// int16 values s q in registers, straight from the file's bytes (no Group): block 2c is
// the low nibbles of qs[32c..], 2c + 1 the high ones; d, m0 = 0 (both halves of a block
// share their offset), m1 = dmin * m per block (unpack.h's Q4_K layout).
inline void q4k_blocks(const uint8_t* blk, __m512i* v, float* d, float* m0, float* m1) {
  const __m128i s8 = k4_scale_bytes(blk);  // scales, then mins
  const __m128 dm = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk)));
  _mm256_storeu_ps(d, _mm256_broadcastss_ps(dm));
  _mm256_storeu_ps(m0, _mm256_setzero_ps());
  const __m256 mins = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(s8, 8)));
  _mm256_storeu_ps(m1, _mm256_mul_ps(mins, _mm256_broadcastss_ps(_mm_movehdup_ps(dm))));
  const __m512i scales = _mm512_cvtepu8_epi16(_mm256_castsi128_si256(s8));  // word b: block b's
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int c = 0; c < 4; ++c) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * c));
    const __m256i halves[2] = {_mm256_and_si256(q, low),
                               _mm256_and_si256(_mm256_srli_epi16(q, 4), low)};
    for (int u = 0; u < 2; ++u) {
      const int b = 2 * c + u;
      const __m512i scale = _mm512_permutexvar_epi16(_mm512_set1_epi16(static_cast<int16_t>(b)),
                                                     scales);
      v[b] = _mm512_mullo_epi16(_mm512_cvtepu8_epi16(halves[u]), scale);
    }
  }
}

// One Q6_K super-block (210 bytes: ql[128], qh[64], int8 scales[16], d) as 8 blocks of
// int16 values s (q - 32) in registers: block 4h + t (weights 128h + 32t..) takes nibble
// t / 2 of ql[64h + 32 (t % 2)..] and bits 2t..2t + 1 of qh[32h..]; its two 16-weight
// halves their own scales; d, no offsets (folded).
inline void q6k_blocks(const uint8_t* blk, __m512i* v, float* d, float* m0, float* m1) {
  const float dd = half_to_float(blk + 208);
  const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
  const __m256i low = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(3);
  for (int h = 0; h < 2; ++h) {
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
    for (int t = 0; t < 4; ++t) {
      const int b = 4 * h + t;
      const __m256i ql = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(blk + 64 * h + 32 * (t % 2)));
      const __m256i lo = _mm256_and_si256(t < 2 ? ql : _mm256_srli_epi16(ql, 4), low);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * t), two);
      const __m256i q = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));  // 0..63
      const __m512i scale = _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_set1_epi16(sc[2 * b])), _mm256_set1_epi16(sc[2 * b + 1]), 1);
      v[b] = _mm512_mullo_epi16(_mm512_sub_epi16(_mm512_cvtepu8_epi16(q), _mm512_set1_epi16(32)),
                                scale);
      d[b] = dd;
      m0[b] = m1[b] = 0.0f;
    }
  }
}

// The first nb (<= 16) 32-weight blocks of Q4_0 (d, qs[16]), Q4_1 (d, m, qs[16]) or Q8_0
// (d, q[32]) as int16 values in registers, the others zero: weight i < 16 the low nibble
// of qs[i], 16 + i its high one; Q4_0's offset 8 folded in, Q4_1's min as m1 (unpack.h's
// layouts).
inline void block32_chunk(int type, const uint8_t* row, __m512i* v, float* d, float* m0,
                          float* m1, int nb = 16) {
  const int bytes = block_type(type).block_bytes;
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int b = 0; b < 16; ++b) {
    const uint8_t* blk = row + b * bytes;
    m0[b] = m1[b] = 0.0f;
    if (b >= nb) {
      v[b] = _mm512_setzero_si512();
      d[b] = 0.0f;
      continue;
    }
    d[b] = half_to_float(blk);
    if (type == kQ8_0) {
      v[b] = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2)));
      continue;
    }
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (type == kQ4_1 ? 4 : 2)));
    const __m256i both = _mm256_and_si256(
        _mm256_inserti128_si256(_mm256_castsi128_si256(qs), _mm_srli_epi16(qs, 4), 1), low);
    v[b] = _mm512_cvtepu8_epi16(both);
    if (type == kQ4_0) v[b] = _mm512_sub_epi16(v[b], _mm512_set1_epi16(8));
    else m1[b] = -half_to_float(blk + 2);  // w = d q + min: M = -min, o = 1
  }
}

// Kernels::unpack_wide: unpack_wide_impl's result, full chunks turned from their Groups
// in registers (Q4_K, Q6_K, Q4_0, Q4_1 and Q8_0 from the file's bytes directly); a tail
// chunk, at most one per row, in plain C++ (a 32-block type's from its blocks in
// registers: a small model's k = 576 rows are half tail).
void unpack_wide512(int type, const uint8_t* row, int64_t k, int64_t c0, int64_t count,
                    WideChunk* out) {
  const bool fold = wide_folds(type), signed_q = signed_weights(type);
  Group g[2];
  for (int64_t c = 0; c < count; ++c) {
    WideChunk& o = out[c];
    __m512i blocks[16];
    const bool full = wide_rows(k, c0 + c) == 16;
    const bool block32 = type == kQ4_0 || type == kQ4_1 || type == kQ8_0;
    const bool direct = type == kQ4_K || type == kQ6_K || block32;
    if (!full && block32) {
      const int nb = static_cast<int>(k / 32 - 16 * (c0 + c));  // blocks present
      float d[16], m0[16], m1[16];
      block32_chunk(type, row + 16 * (c0 + c) * block_type(type).block_bytes, blocks, d, m0,
                    m1, nb);
      alignas(64) int16_t v[16][32];
      for (int b = 0; b < 16; ++b) _mm512_store_si512(v[b], blocks[b]);
      const int rows = wide_rows(k, c0 + c);
      place_wide(v, rows, o.q);
      place_scales(d, m0, m1, rows, true, o);
      continue;
    }
    if (full && direct) {
      if (type == kQ4_K || type == kQ6_K) {
        for (int h = 0; h < 2; ++h) {
          const uint8_t* blk = row + (2 * (c0 + c) + h) * (type == kQ4_K ? 144 : 210);
          (type == kQ4_K ? q4k_blocks : q6k_blocks)(blk, blocks + 8 * h, o.d + 8 * h,
                                                    o.m0 + 8 * h, o.m1 + 8 * h);
        }
      } else {
        block32_chunk(type, row + 16 * (c0 + c) * block_type(type).block_bytes, blocks, o.d,
                      o.m0, o.m1);
      }
    } else {
      unpack_chunk_groups(type, row, k, c0 + c, g);
      if (!full) {
        wide_chunk_from_groups(g, type, k, c0 + c, o);
        continue;
      }
      for (int h = 0; h < 2; ++h) {
        for (int b = 0; b < 8; ++b) blocks[8 * h + b] = group_block16(g[h], b, fold, signed_q);
        for (int b = 0; b < 8; ++b)
          wide_block_scales(g[h], fold, b, o.d[8 * h + b], o.m0[8 * h + b], o.m1[8 * h + b]);
      }
    }
    __m512i words[16];
    transpose16(blocks, words);
    for (int j = 0; j < 16; ++j) _mm512_store_si512(o.q + 32 * j, words[j]);
  }
}

// Kernels::dot_wide (dot_wide_simd): up to 2 weight rows by 6 activation rows per block,
// acc[i * stride + r] += w[r] . x[i].
struct Wide512 {
  static constexpr int kMaxRows = 6;

  template <int NR, int MR, int kMin>
  static void run(const WideChunk* const* w, const WideChunk* const* x, int64_t chunks,
                  int last_rows, float* acc, int64_t stride);
};

// s[i][r] += the int32 pair sums of w[r] . x[i] over the kRows word rows of chunk c. The
// weight rows' words stay in registers and each activation word is loaded once and
// feeds NR multiplies; a constant count unrolls whole, every load at a fixed offset.
template <int NR, int MR, int kRows>
inline void wide_words(const WideChunk* const* w, const WideChunk* const* x, int64_t c,
                       __m512i (&s)[MR][NR]) {
#pragma GCC unroll 16
  for (int j = 0; j < kRows; ++j) {
    __m512i wv[NR];
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      wv[r] = _mm512_load_si512(w[r][c].q + 32 * j);
      __asm__("" : "+v"(wv[r]));  // in a register: GCC would reload it in each multiply
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      __m512i xv = _mm512_load_si512(x[i][c].q + 32 * j);
      __asm__("" : "+v"(xv));  // likewise, one load for its NR multiplies
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) s[i][r] = wide_acc(s[i][r], wv[r], xv);
    }
  }
}

template <int NR, int MR, int kMin>
void Wide512::run(const WideChunk* const* w, const WideChunk* const* x, int64_t chunks,
                  int last_rows, float* acc, int64_t stride) {
  __m512 f[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) f[i][r] = _mm512_setzero_ps();
  for (int64_t c = 0; c < chunks; ++c) {
    __m512i s[MR][NR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) s[i][r] = _mm512_setzero_si512();
    switch (c < chunks - 1 ? 16 : last_rows) {  // wide_rows: a power of two
      case 1: wide_words<NR, MR, 1>(w, x, c, s); break;
      case 2: wide_words<NR, MR, 2>(w, x, c, s); break;
      case 4: wide_words<NR, MR, 4>(w, x, c, s); break;
      case 8: wide_words<NR, MR, 8>(w, x, c, s); break;
      default: wide_words<NR, MR, 16>(w, x, c, s); break;
    }
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      const __m512 wd = _mm512_load_ps(w[r][c].d);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const __m512 scale = _mm512_mul_ps(wd, _mm512_load_ps(x[i][c].d));
        f[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[i][r]), scale, f[i][r]);
        if constexpr (kMin == 2)
          f[i][r] = _mm512_fnmadd_ps(_mm512_load_ps(w[r][c].m0), _mm512_load_ps(x[i][c].m0),
                                     f[i][r]);
        if constexpr (kMin >= 1)
          f[i][r] = _mm512_fnmadd_ps(_mm512_load_ps(w[r][c].m1), _mm512_load_ps(x[i][c].m1),
                                     f[i][r]);
      }
    }
  }
  __m512 v[16];
  for (int i = 0; i < 16; ++i) v[i] = i < MR * NR ? f[i / NR][i % NR] : _mm512_setzero_ps();
  alignas(64) float sums[16];
  _mm512_store_ps(sums, lane_sums16(v));
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) acc[i * stride + r] += sums[i * NR + r];
}

}  // namespace
}  // namespace folio_cpu::quant
