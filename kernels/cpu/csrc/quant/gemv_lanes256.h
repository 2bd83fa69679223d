// The AVX2 decode kernels for every type but Q8_0 (whose signed q stays on gemv256.h): the
// lane layout of gemv512.h in 256-bit registers, for the same reason (gemv256.h pays a
// madd, conversion, broadcast and fma per block and activation row; here each extra row
// costs its integer products, one conversion and two fmas per 8 sub-blocks).
//
// A group is two halves h of 8 sub-blocks; in half h, int32 lane l of chunk u (u < 4)
// holds weights 4u..4u+3 of sub-block 8h + kLaneSub[l]. Sources are the 8 blocks as 32
// bytes (sub-blocks 2b, 2b + 1 in the 128-bit halves: gemv256.h's k_quant_q, or a 32-block
// type's nibbles); 4 unpacklo/hi_epi32 and 4 unpacklo/hi_epi64 per half put them in lanes.
// The activations are laid out to match once per call. Arithmetic: gemv512.h's.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "gemv256.h"

namespace folio_cpu::quant {
namespace {

constexpr int kLaneSub[8] = {0, 2, 4, 6, 1, 3, 5, 7};  // what unpack_epi32 / epi64 yield

// The activations' lane layout (gemv256.h's LaneGroup): in half h, lane l is sub-block
// 8h + kLaneSub[l], its chunk u at bytes 128h + 32u + 4l.
constexpr LaneOrder make_lane_order256() {
  LaneOrder o{};
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 8; ++l) {
      o.sub[8 * h + l] = 8 * h + kLaneSub[l];
      o.at[8 * h + l] = 128 * h + 4 * l;
    }
  o.u_stride = 32;
  return o;
}
inline constexpr LaneOrder kLaneOrder256 = make_lane_order256();

template <int T>
constexpr bool kBlock32Type = T == kQ4_0 || T == kQ4_1 || T == kQ5_0 || T == kQ5_1;
template <int T>
constexpr int kGroupBytes256 = T == kQ4_0 ? 144 : T == kQ4_1 ? 160 : T == kQ5_0 ? 176
                               : T == kQ5_1 ? 192 : T == kQ2_K ? 84 : T == kQ3_K ? 110
                               : T == kQ4_K ? 144 : T == kQ5_K ? 176 : 210;

// Block b of a group as 32 unsigned bytes (0 past nb blocks).
template <int T>
inline __m256i block_q256(const uint8_t* blk, int b, int nb) {
  if constexpr (kBlock32Type<T>) {
    constexpr int kBytes = kGroupBytes256<T> / 8, kQs = kBytes - 16;
    if (b >= nb) return _mm256_setzero_si256();
    const uint8_t* p = blk + b * kBytes;
    const __m128i n = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kQs));
    __m256i q = lo4(_mm256_inserti128_si256(_mm256_castsi128_si256(n), _mm_srli_epi16(n, 4), 1));
    if constexpr (T == kQ5_0 || T == kQ5_1) q = _mm256_or_si256(q, bits32_to16(load32(p + kQs - 4)));
    return q;
  } else {
    return k_quant_q<T>(blk, b);
  }
}

// Load j's shuffle for block_halves: its low 128 bits hold block 2j's bytes 0-3, which go
// to bytes 2j, 2j + 1 and 8 + 2j, 9 + 2j; its high 128 bits block 2j + 1's, from byte
// kBytes - 16 on, to the same places; every other byte 0.
struct HeadShuffles {
  alignas(32) int8_t ctl[4][32];
};
template <int kBytes>
constexpr HeadShuffles make_head_shuffles() {
  HeadShuffles s{};
  for (int j = 0; j < 4; ++j)
    for (int i = 0; i < 32; ++i) {
      const int lane = i / 16, at = lane ? kBytes - 16 : 0, pos = i % 16;
      const int rel = pos - 2 * j;  // 0, 1: D's bytes; 8, 9: the second half's
      s.ctl[j][i] = static_cast<int8_t>(rel == 0 || rel == 1 ? at + rel
                                        : rel == 8 || rel == 9 ? at + rel - 6 : -1);
    }
  return s;
}
template <int kBytes>
inline constexpr HeadShuffles kHeadShuffles = make_head_shuffles<kBytes>();

// A group's 8 block heads (each block's first two halves: D, then M's or the q bytes)
// as 16-bit values, D of blocks 0, 2, 4, 6, 1, 3, 5, 7 in the low 128 bits and the second
// halves in that order in the high 128 bits; 0 past nb blocks. Load j, at block 2j, holds
// block 2j + 1's head in its high 128 bits too (kBytes <= 28), so 4 loads and shuffles
// do what a gather did (on Zen 3 the gather and what waited on it were about a quarter of
// the starter's k = 576 rows). A last block 2j reads 16 bytes only: the row may end there.
template <int kBytes>
inline __m256i block_halves(const uint8_t* blk, int nb) {
  static_assert(kBytes >= 18 && kBytes <= 28, "heads of blocks 2j and 2j + 1 in one load");
  const HeadShuffles& s = kHeadShuffles<kBytes>;
  const auto place = [&](int j, __m256i v) {
    return _mm256_shuffle_epi8(v, _mm256_load_si256(reinterpret_cast<const __m256i*>(s.ctl[j])));
  };
  const auto load = [&](int j) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2 * j * kBytes));
  };
  __m256i acc;
  if (nb == 8) {
    acc = _mm256_or_si256(_mm256_or_si256(place(0, load(0)), place(1, load(1))),
                          _mm256_or_si256(place(2, load(2)), place(3, load(3))));
  } else {
    acc = _mm256_setzero_si256();
    for (int j = 0; 2 * j < nb; ++j)
      acc = _mm256_or_si256(acc, place(j, 2 * j + 1 < nb ? load(j) : _mm256_zextsi128_si256(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2 * j * kBytes)))));
  }
  // Quadwords: lane 0's D, lane 1's D, lane 0's second halves, lane 1's.
  return _mm256_permute4x64_epi64(acc, _MM_SHUFFLE(3, 1, 2, 0));
}

// ds[h] lane l = D s of its sub-block, mo[h] = M o, in kLaneSub order.
template <int T>
inline void scales256(const uint8_t* blk, int nb, __m256* ds, __m256* mo) {
  if constexpr (kBlock32Type<T>) {
    const __m256i halves = block_halves<kGroupBytes256<T> / 8>(blk, nb);
    const __m256 dv = _mm256_cvtph_ps(_mm256_castsi256_si128(halves));
    // unpack.h: Q4_0 / Q5_0 offset 8 / 16 with M = d; Q4_1 / Q5_1 offset 1, M = -min.
    __m256 ov;
    if constexpr (T == kQ4_0 || T == kQ5_0)
      ov = _mm256_mul_ps(dv, _mm256_set1_ps(T == kQ4_0 ? 8.0f : 16.0f));
    else
      ov = _mm256_xor_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(halves, 1)), _mm256_set1_ps(-0.0f));
    // Lane l of half h: block (8h + kLaneSub[l]) / 2, at its place in block_halves' order.
    const __m256i idx[2] = {_mm256_setr_epi32(0, 4, 1, 5, 0, 4, 1, 5),
                            _mm256_setr_epi32(2, 6, 3, 7, 2, 6, 3, 7)};
    for (int h = 0; h < 2; ++h) {
      ds[h] = _mm256_permutevar8x32_ps(dv, idx[h]);
      mo[h] = _mm256_permutevar8x32_ps(ov, idx[h]);
    }
  } else {
    const __m256i lane_sub = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    __m256i sv, ov;
    float d, m;
    k_quant_scales<T>(blk, sv, ov, d, m);
    for (int h = 0; h < 2; ++h) {
      const __m128i s = h ? _mm256_extracti128_si256(sv, 1) : _mm256_castsi256_si128(sv);
      const __m128i o = h ? _mm256_extracti128_si256(ov, 1) : _mm256_castsi256_si128(ov);
      ds[h] = _mm256_permutevar8x32_ps(
          _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(s)), _mm256_set1_ps(d)), lane_sub);
      mo[h] = _mm256_permutevar8x32_ps(
          _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(o)), _mm256_set1_ps(m)), lane_sub);
    }
  }
}

// out[r] = w_row . x[r] for r < MR; G a LaneGroup or a PairLaneGroup (gemv256.h).
template <int T, int MR, class G>
inline void lanes256_row(const uint8_t* row, int64_t k, const G* xl, int64_t groups,
                         float* out) {
  // Largest q: 4 maddubs sums fit int16 up to q = 31 (4 * 2 * 31 * 127); Q6_K's 63 takes
  // two madds per half.
  constexpr bool kSum4 = T != kQ6_K;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_ps();
  const int64_t full = kBlock32Type<T> ? k / kGroup : groups;
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* blk = row + g * kGroupBytes256<T>;
    prefetch_ahead(blk, kGroupBytes256<T>);
    const int nb = g < full ? 8 : static_cast<int>(k % kGroup / 32);
    __m256 ds[2], mo[2];
    scales256<T>(blk, nb, ds, mo);
    // A row's last group of a 32-block type may end in its first half (the starter's
    // k = 576: 2 of 8 blocks); the other half's blocks and activations are zeros.
    const int live_halves = nb > 4 ? 2 : 1;
    for (int h = 0; h < live_halves; ++h) {
      __m256i s[4], c[4];
      for (int i = 0; i < 4; ++i) s[i] = block_q256<T>(blk, 4 * h + i, nb);
      const __m256i t0 = _mm256_unpacklo_epi32(s[0], s[1]), t1 = _mm256_unpackhi_epi32(s[0], s[1]);
      const __m256i t2 = _mm256_unpacklo_epi32(s[2], s[3]), t3 = _mm256_unpackhi_epi32(s[2], s[3]);
      c[0] = _mm256_unpacklo_epi64(t0, t2);
      c[1] = _mm256_unpackhi_epi64(t0, t2);
      c[2] = _mm256_unpacklo_epi64(t1, t3);
      c[3] = _mm256_unpackhi_epi64(t1, t3);
      // The lane sums of one 8-bit row's 128 bytes in this half.
      const auto lane_dots = [&](const int8_t* q) {
        const __m256i* xq = reinterpret_cast<const __m256i*>(q + 128 * h);
        const __m256i p01 = _mm256_add_epi16(_mm256_maddubs_epi16(c[0], _mm256_load_si256(xq)),
                                             _mm256_maddubs_epi16(c[1], _mm256_load_si256(xq + 1)));
        const __m256i p23 = _mm256_add_epi16(_mm256_maddubs_epi16(c[2], _mm256_load_si256(xq + 2)),
                                             _mm256_maddubs_epi16(c[3], _mm256_load_si256(xq + 3)));
        return kSum4 ? _mm256_madd_epi16(_mm256_add_epi16(p01, p23), ones)
                     : _mm256_add_epi32(_mm256_madd_epi16(p01, ones), _mm256_madd_epi16(p23, ones));
      };
      for (int r = 0; r < MR; ++r) {
        const G& x = xl[r * groups + g];
        __m256i si = lane_dots(x.q);
        if constexpr (std::is_same_v<G, PairLaneGroup>)  // 256 S_q + S_lo, exact in int32
          si = _mm256_add_epi32(_mm256_slli_epi32(si, 8), lane_dots(x.lo));
        const __m256 f = _mm256_mul_ps(_mm256_load_ps(x.dx + 8 * h), ds[h]);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), f, acc[r]);
        acc[r] = _mm256_fnmadd_ps(mo[h], _mm256_load_ps(x.xs + 8 * h), acc[r]);
      }
    }
  }
  for (int r = 0; r < MR; ++r) out[r] = hsum256(acc[r]);
}

// G LaneGroup: the m rows of x; PairLaneGroup: the m pairs of x's 2m rows.
template <int T, class G>
void lanes256_type(const uint8_t* w, int64_t w_stride, const int64_t* rows, int64_t j0,
                   int64_t j1, int64_t k, const ActRow* x, int64_t m, float* out, int64_t n) {
  const int64_t groups = padded_k(k) / kGroup;
  std::vector<G> xl(static_cast<size_t>(m * groups));  // [m][groups]
  prepare_lanes(x, m, groups, kLaneOrder256, xl.data());
  const int64_t passes = (m + 3) / 4;  // passes of equal size, as gemv256.h's
  const int64_t per_pass = (m + passes - 1) / passes;
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* row = w + (rows ? rows[j] : j) * w_stride;
    for (int64_t i0 = 0; i0 < m; i0 += per_pass) {
      float part[4];
      const int64_t mr = m - i0 < per_pass ? m - i0 : per_pass;
      const G* xi = xl.data() + i0 * groups;
      switch (mr) {
        case 1: lanes256_row<T, 1, G>(row, k, xi, groups, part); break;
        case 2: lanes256_row<T, 2, G>(row, k, xi, groups, part); break;
        case 3: lanes256_row<T, 3, G>(row, k, xi, groups, part); break;
        default: lanes256_row<T, 4, G>(row, k, xi, groups, part); break;
      }
      for (int64_t i = 0; i < mr; ++i) out[(i0 + i) * n + j] = part[i];
    }
  }
}

// Every type but Q8_0 (false: the caller's other kernel).
template <class G>
bool lanes256(int type, const uint8_t* w, int64_t w_stride, const int64_t* rows, int64_t j0,
              int64_t j1, int64_t k, const ActRow* x, int64_t m, float* out, int64_t n) {
  switch (type) {
    case kQ4_0: lanes256_type<kQ4_0, G>(w, w_stride, rows, j0, j1, k, x, m, out, n); return true;
    case kQ4_1: lanes256_type<kQ4_1, G>(w, w_stride, rows, j0, j1, k, x, m, out, n); return true;
    case kQ5_0: lanes256_type<kQ5_0, G>(w, w_stride, rows, j0, j1, k, x, m, out, n); return true;
    case kQ5_1: lanes256_type<kQ5_1, G>(w, w_stride, rows, j0, j1, k, x, m, out, n); return true;
    case kQ2_K: lanes256_type<kQ2_K, G>(w, w_stride, rows, j0, j1, k, x, m, out, n); return true;
    case kQ3_K: lanes256_type<kQ3_K, G>(w, w_stride, rows, j0, j1, k, x, m, out, n); return true;
    case kQ4_K: lanes256_type<kQ4_K, G>(w, w_stride, rows, j0, j1, k, x, m, out, n); return true;
    case kQ5_K: lanes256_type<kQ5_K, G>(w, w_stride, rows, j0, j1, k, x, m, out, n); return true;
    case kQ6_K: lanes256_type<kQ6_K, G>(w, w_stride, rows, j0, j1, k, x, m, out, n); return true;
  }
  return false;
}

void gemv_lanes256(int type, const uint8_t* w, int64_t w_stride, const int64_t* rows,
                   int64_t j0, int64_t j1, int64_t k, const ActRow* x, int64_t m, float* out,
                   int64_t n) {
  // One row goes to gemv256.h where it measured faster: Q4_K / Q5_K (its 4 fma chains,
  // no transpose) and past k = 4096, where the lane rows (384 bytes per group and row,
  // against 256 read straight from the activations) fall out of L1. Decode's pairs
  // (x and its residual) stay here at every k: on Zen 3, an AVX2-only CPU, the lane
  // layout ran pairs at k = 8192 / 14336 19-24% faster than gemv256.h.
  const bool k_quant45 = type == kQ4_K || type == kQ5_K;
  if (m == 1 && (k_quant45 || padded_k(k) > 4096)) {
    gemv(type, w, w_stride, rows, j0, j1, k, x, m, out, n);
    return;
  }
  if (!lanes256<LaneGroup>(type, w, w_stride, rows, j0, j1, k, x, m, out, n))
    gemv(type, w, w_stride, rows, j0, j1, k, x, m, out, n);
}

void gemv_lanes256_pairs(int type, const uint8_t* w, int64_t w_stride, const int64_t* rows,
                         int64_t j0, int64_t j1, int64_t k, const ActRow* x, int64_t m,
                         float* out, int64_t n) {
  if (!lanes256<PairLaneGroup>(type, w, w_stride, rows, j0, j1, k, x, m, out, n))
    gemv_pairs_as_rows(gemv, type, w, w_stride, rows, j0, j1, k, x, m, out, n);
}

}  // namespace
}  // namespace folio_cpu::quant
