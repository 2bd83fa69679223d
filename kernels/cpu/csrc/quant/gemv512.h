// The AVX-512 decode kernels for the types that matter most (Q4_K, Q5_K, Q6_K, Q4_0, Q4_1,
// and Q8_0 where the file's dot16 takes 255 * 127 products): gemv256.h serves the rest.
//
// Why a second gemv: gemv256.h pays, per 32-weight block and activation row, a madd, an
// int -> float conversion, a broadcast and an fma, so each extra row (the residual row of
// a pair, more decode candidates) costs nearly as much as the weights' unpacking. Here a
// group's 256 weights are put into a layout where int32 lane l of every 64-byte chunk u
// (u < 4) holds weights 4u..4u+3 of sub-block l (16 weights): the four chunks' integer
// dots then sum per sub-block in one register with no rescaling, so per row and group
// the work is 4 dot16 (VNNI: 4 vpdpbusd), one conversion and two fmas. Everything
// weight-side (unpacking, the 16 -> lane transpose, D * s_l and M * o_l as floats) is
// done once per group for all rows; the activations are put into the same layout once
// per call (prepare_lanes), with dx_b per lane and dx_b * xsum_l precomputed.
//
// Arithmetic: lane l adds float(S_l) * (dx_b * (D_b s_l)) - (M_b o_l) * (dx_b xsum_l),
// S_l the exact integer dot of sub-block l; the same terms as the portable dot (products
// of the same exact integers and fp16-derived scales) up to float32 rounding.
// The including file defines dot16(acc, q u8, x s8): acc + int32 lanes of 4 products, and
// kDot16Wide: whether dot16 takes q up to 255 (vpdpbusd; maddubs would saturate).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "gemv256.h"
#include "k4_scales.h"

namespace folio_cpu::quant {
namespace {

// The 16 -> lane transpose from four source registers whose 128-bit lane i of register r
// holds a sub-block (which one: sb[4r + i], per type): 8 two-source permutes. Level 1
// pairs registers (0, 1) and (2, 3), collecting dwords u = 2h, 2h + 1 of their 8
// sub-blocks (lane 8 (u % 2) + j, j the slot in the pair); level 2 picks dword u of
// sub-block l into lane l of chunk u.
struct Transpose {
  int32_t level1[2][16];  // [h]
  int32_t level2[2][16];  // [u % 2]
};

constexpr Transpose make_transpose(const int (&sb)[16]) {
  Transpose t{};
  for (int h = 0; h < 2; ++h)
    for (int lane = 0; lane < 16; ++lane) {
      const int uu = lane / 8, j = lane % 8;
      t.level1[h][lane] = (j / 4) * 16 + 4 * (j % 4) + 2 * h + uu;
    }
  for (int s = 0; s < 16; ++s) {
    const int r = s / 4, j = (r % 2) * 4 + s % 4;
    for (int uu = 0; uu < 2; ++uu) t.level2[uu][sb[s]] = (r / 2) * 16 + 8 * uu + j;
  }
  return t;
}

constexpr int kFileOrder[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
// Q4_K / Q5_K sources: low and high nibbles of qs[0..63], then of qs[64..127].
constexpr int kNibbleOrder[16] = {0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15};
// 32-weight blocks: register r holds blocks 2r, 2r + 1 as [lo a, lo b, hi a, hi b].
constexpr int kBlock32Order[16] = {0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15};

template <int T>
constexpr const int (&source_order())[16] {
  if constexpr (T == kQ4_K || T == kQ5_K) return kNibbleOrder;
  else if constexpr (T == kQ4_0 || T == kQ4_1) return kBlock32Order;
  else return kFileOrder;
}

template <int T>
inline constexpr Transpose kTranspose = make_transpose(source_order<T>());

inline __m512i lo4z(__m512i v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
inline __m512i hi4z(__m512i v) { return lo4z(_mm512_srli_epi16(v, 4)); }
inline __m512i load256x2(const uint8_t* p) {  // the same 32 bytes in both halves
  return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
// Bits s..s+bits-1 of every byte (s = s0 in the low 256 bits, s1 in the high), moved to
// bit 4 up. 16-bit shifts are exact here: bit 8 of the result is bit 8 + s of the source.
inline __m512i high_bits(__m512i v, int s0, int s1, int mask) {
  const __m512i cnt = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<int16_t>(s0)),
                                         _mm256_set1_epi16(static_cast<int16_t>(s1)), 1);
  return _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(v, cnt),
                                            _mm512_set1_epi8(static_cast<char>(mask))), 4);
}
// Eight fp16 values at p, p + stride, ... as floats (0 from the nb-th on), each twice
// (lane l: value l / 2).
// Gathered in general registers: 8 two-byte stores and one 16-byte load would stall on
// the store forwarding, once per group.
inline __m512 halves_x2(const uint8_t* p, int stride, int nb = 8) {
  uint64_t h[2] = {0, 0};
  for (int i = 0; i < 8; ++i) {  // a fixed count keeps h in registers
    uint16_t v = 0;
    if (i < nb) std::memcpy(&v, p + i * stride, 2);
    h[i / 4] |= static_cast<uint64_t>(v) << (16 * (i % 4));
  }
  const __m256 f = _mm256_cvtph_ps(_mm_set_epi64x(static_cast<int64_t>(h[1]),
                                                  static_cast<int64_t>(h[0])));
  const __m512i pair = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  return _mm512_permutexvar_ps(pair, _mm512_castps256_ps512(f));
}

// One group's weights: src[4] in the type's source order, ds[l] = D_b s_l and
// mo[l] = M_b o_l as floats. kTail: a 32-block type's last group of nb < 8 blocks (never
// read past the row), the missing blocks zero (d = 0); nb is the same for every row, so
// its branches predict.
template <int T, bool kTail = false>
inline void load_group(const uint8_t* blk, int nb, __m512i* src, __m512& ds, __m512& mo) {
  if constexpr (T == kQ4_K || T == kQ5_K || T == kQ6_K) {
    const uint8_t* qs = blk + (T == kQ4_K ? 16 : T == kQ5_K ? 48 : 0);
    const __m512i z0 = _mm512_loadu_si512(qs), z1 = _mm512_loadu_si512(qs + 64);
    src[0] = lo4z(z0); src[1] = hi4z(z0); src[2] = lo4z(z1); src[3] = hi4z(z1);
    if constexpr (T == kQ5_K) {  // 5th bit of weight 32j + l: bit j of qh[l]
      const __m512i qh = load256x2(blk + 16);
      const int js[4][2] = {{0, 2}, {1, 3}, {4, 6}, {5, 7}};
      for (int r = 0; r < 4; ++r)
        src[r] = _mm512_or_si512(src[r], high_bits(qh, js[r][0], js[r][1], 1));
    }
    if constexpr (T == kQ6_K) {  // top 2 bits of weight 128h + 32t + l: bits 2t of qh[32h + l]
      for (int r = 0; r < 4; ++r) {
        const __m512i qh = load256x2(blk + 128 + 32 * (r / 2));
        src[r] = _mm512_or_si512(src[r], high_bits(qh, 4 * (r % 2), 4 * (r % 2) + 2, 3));
      }
    }
    if constexpr (T == kQ6_K) {  // k_quant_scales' values: M o_l = 32 D s_l, exactly
      const __m128i s8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192));
      ds = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(s8)),
                         _mm512_set1_ps(half_to_float(blk + 208)));
      mo = _mm512_mul_ps(ds, _mm512_set1_ps(32.0f));
    } else {  // each 32-weight scale twice, D and M from the first 4 bytes, all in vectors
      const __m128i s8 = k4_scale_bytes(blk);
      const __m128 dm = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk)));
      ds = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(s8, s8))),
                         _mm512_broadcastss_ps(dm));
      mo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(s8, s8))),
                         _mm512_broadcastss_ps(_mm_movehdup_ps(dm)));
    }
  } else if constexpr (T == kQ4_0 || T == kQ4_1) {
    constexpr int kBytes = T == kQ4_0 ? 18 : 20;
    for (int r = 0; r < 4; ++r) {
      const uint8_t* a = blk + 2 * r * kBytes + kBytes - 16;
      __m256i ab;
      if constexpr (kTail) {
        const __m128i z = _mm_setzero_si128();
        ab = _mm256_set_m128i(2 * r + 1 < nb ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + kBytes)) : z,
                              2 * r < nb ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(a)) : z);
      } else {
        ab = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(a + kBytes),
                                 reinterpret_cast<const __m128i*>(a));
      }
      src[r] = lo4z(_mm512_inserti64x4(_mm512_castsi256_si512(ab), _mm256_srli_epi16(ab, 4), 1));
    }
    ds = halves_x2(blk, kBytes, nb);
    // Q4_0: w = d q - 8 d; Q4_1: w = d q + min (unpack.h: M = -min, o = 1).
    mo = T == kQ4_0 ? _mm512_mul_ps(ds, _mm512_set1_ps(8.0f))
                    : _mm512_sub_ps(_mm512_setzero_ps(), halves_x2(blk + 2, kBytes, nb));
  } else {  // Q8_0, as unsigned q + 128 with offset 128: w = d (q + 128) - 128 d
    for (int r = 0; r < 4; ++r) {
      const __m256i z = _mm256_setzero_si256();
      const __m256i a = !kTail || 2 * r < nb ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 68 * r + 2)) : z;
      const __m256i b = !kTail || 2 * r + 1 < nb ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 68 * r + 36)) : z;
      src[r] = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1),
                                _mm512_set1_epi8(static_cast<char>(0x80)));
    }
    ds = halves_x2(blk, 34, nb);
    mo = _mm512_mul_ps(ds, _mm512_set1_ps(128.0f));
  }
}

// The activations' lane layout (gemv256.h's LaneGroup): lane l is sub-block l, its chunk
// u at bytes 64u + 4l.
constexpr LaneOrder make_lane_order512() {
  LaneOrder o{};
  for (int l = 0; l < 16; ++l) {
    o.sub[l] = l;
    o.at[l] = 4 * l;
  }
  o.u_stride = 64;
  return o;
}
inline constexpr LaneOrder kLaneOrder512 = make_lane_order512();

template <int T>
constexpr int kRowGroupBytes = T == kQ4_0 ? 144 : T == kQ4_1 ? 160 : T == kQ8_0 ? 272
                               : T == kQ4_K ? 144 : T == kQ5_K ? 176 : 210;

// Groups g0..g1 of out[r] = w_row . x[r] for r < MR; xl: the rows' lane groups ([MR][groups],
// stride `groups`), G a LaneGroup or a PairLaneGroup (a pair's two dots combined in
// integers, gemv256.h). Between the chunks of a row the accumulators wait in
// state[2 * MR]; the last chunk writes out.
template <int T, int MR, class G>
inline void gemv512_row(const uint8_t* row, int64_t k, int64_t g0, int64_t g1,
                        const G* xl, int64_t groups, __m512* state, float* out) {
  const Transpose& tp = kTranspose<T>;
  const __m512i l1[2] = {_mm512_loadu_si512(tp.level1[0]), _mm512_loadu_si512(tp.level1[1])};
  const __m512i l2[2] = {_mm512_loadu_si512(tp.level2[0]), _mm512_loadu_si512(tp.level2[1])};
  // Two chains per row (product terms, offset terms) while registers allow.
  constexpr bool kSplit = MR <= 4;
  __m512 acc[MR], off[kSplit ? MR : 1];
  for (int r = 0; r < MR; ++r) acc[r] = g0 ? state[r] : _mm512_setzero_ps();
  for (int r = 0; r < (kSplit ? MR : 1); ++r) off[r] = g0 ? state[MR + r] : _mm512_setzero_ps();
  // One group into every row's accumulators.
  auto step = [&]<bool kTail>(const uint8_t* blk, int nb, const G* xg) {
    prefetch_ahead(blk, kRowGroupBytes<T>);
    __m512i src[4], c[4];
    __m512 ds, mo;
    load_group<T, kTail>(blk, nb, src, ds, mo);
    const __m512i a0 = _mm512_permutex2var_epi32(src[0], l1[0], src[1]);
    const __m512i a1 = _mm512_permutex2var_epi32(src[0], l1[1], src[1]);
    const __m512i b0 = _mm512_permutex2var_epi32(src[2], l1[0], src[3]);
    const __m512i b1 = _mm512_permutex2var_epi32(src[2], l1[1], src[3]);
    c[0] = _mm512_permutex2var_epi32(a0, l2[0], b0);
    c[1] = _mm512_permutex2var_epi32(a0, l2[1], b0);
    c[2] = _mm512_permutex2var_epi32(a1, l2[0], b1);
    c[3] = _mm512_permutex2var_epi32(a1, l2[1], b1);
    for (int r = 0; r < MR; ++r) {
      const G& x = xg[r * groups];
      __m512i s = _mm512_setzero_si512();
      for (int u = 0; u < 4; ++u) s = dot16(s, c[u], _mm512_load_si512(x.q + 64 * u));
      if constexpr (std::is_same_v<G, PairLaneGroup>) {  // 256 S_q + S_lo, exact in int32
        // Its own chain: one chain of 8 dependent dots measured slower.
        __m512i lo = _mm512_setzero_si512();
        for (int u = 0; u < 4; ++u) lo = dot16(lo, c[u], _mm512_load_si512(x.lo + 64 * u));
        s = _mm512_add_epi32(_mm512_slli_epi32(s, 8), lo);
      }
      const __m512 f = _mm512_mul_ps(_mm512_load_ps(x.dx), ds);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), f, acc[r]);
      __m512& o = kSplit ? off[r] : acc[r];
      o = _mm512_fnmadd_ps(mo, _mm512_load_ps(x.xs), o);
    }
  };
  constexpr bool kBlock32 = T == kQ4_0 || T == kQ4_1 || T == kQ8_0;
  const int64_t full = kBlock32 ? k / kGroup : groups;
  for (int64_t g = g0; g < (g1 < full ? g1 : full); ++g)
    step.template operator()<false>(row + g * kRowGroupBytes<T>, 8, xl + g);
  if (g0 <= full && full < g1)  // k % 256 of a 32-block type
    step.template operator()<true>(row + full * kRowGroupBytes<T>,
                                   static_cast<int>(k % kGroup / 32), xl + full);
  if (g1 < groups) {
    for (int r = 0; r < MR; ++r) state[r] = acc[r];
    for (int r = 0; r < (kSplit ? MR : 1); ++r) state[MR + r] = off[r];
    return;
  }
  for (int r = 0; r < MR; ++r) {
    if constexpr (kSplit) acc[r] = _mm512_add_ps(acc[r], off[r]);
    out[r] = _mm512_reduce_add_ps(acc[r]);
  }
}

// G LaneGroup: the m rows of x; PairLaneGroup: the m pairs of x's 2m rows.
template <int T, class G>
void gemv512_type(const uint8_t* w, int64_t w_stride, const int64_t* rows, int64_t j0,
                  int64_t j1, int64_t k, const ActRow* x, int64_t m, float* out, int64_t n) {
  const int64_t groups = padded_k(k) / kGroup;
  std::vector<G> xl(static_cast<size_t>(m * groups));  // [m][groups]
  prepare_lanes(x, m, groups, kLaneOrder512, xl.data());
  // Passes of equal size, as gemv256.h's gemv_type (m <= kGemvRows: at most 2).
  int64_t passes = (m + 7) / 8;
  // Two separate rows at long k (two sequences' 8-bit rows; k >= 12288 with Q4_K/Q6_K:
  // 37+ KiB of activations, past L1; a fused pair's 640-byte groups stay within 48 KiB up
  // to k = 19,456) take a pass each instead, over blocks of weight rows small enough to
  // stay in L2 from the first pass to the second: the weights come from memory once, and
  // each pass's activations stay in L1.
  const int64_t row_bytes = int64_t{sizeof(G)} * groups;
  const bool split_pair = std::is_same_v<G, LaneGroup> && m == 2 &&
                          2 * row_bytes > (int64_t{32} << 10) &&
                          row_bytes <= (int64_t{32} << 10);
  if (split_pair) passes = 2;
  const int64_t per_pass = (m + passes - 1) / passes;
  // A pass's activations should stay in L1 (48 KiB) over many weight rows: past 48 KiB
  // (8 rows at k = 8192: 96 KiB, read from L2 for every weight row, cost more than the
  // products) k is cut into chunks of at most 24 KiB, kJ weight rows at a time, read chunk
  // by chunk. Smaller chunks measured slower (the weight rows' reads lose their streams),
  // and so do these from 32 KiB up: two rows at k = 12288 (37 KiB) ran at 14 GB/s
  // chunked, 20 GB/s unchunked, 31 GB/s as the split pair above (k = 14336, a 7-8B
  // model's down projection: 15 -> 25 GB/s), against 40-50 below 32 KiB.
  // The accumulators wait in `state` between chunks, so every float operation and its
  // order are the unchunked loop's: results never depend on kc.
  const int64_t pass_bytes = int64_t{sizeof(G)} * per_pass;
  const int64_t kc = pass_bytes * groups <= (int64_t{48} << 10)
                         ? groups : std::max<int64_t>(1, (int64_t{24} << 10) / pass_bytes);
  constexpr int64_t kStateRows = 4;
  __m512 state[kStateRows][2][16];  // [weight row][pass][2 * MR], for chunked k
  const bool chunked = kc < groups;
  // Weight rows per block: 4 (chunked k), ~256 KiB of them (a split pair), or 1.
  const int64_t kJ = chunked ? kStateRows
                   : split_pair ? std::max<int64_t>(1, (int64_t{256} << 10) /
                                                           (kRowGroupBytes<T> * groups))
                                : 1;
  for (int64_t jb = j0; jb < j1; jb += kJ) {
    const int64_t je = std::min(jb + kJ, j1);
    for (int64_t c0 = 0; c0 < groups; c0 += kc) {
      const int64_t c1 = std::min(c0 + kc, groups);
      for (int64_t i0 = 0, p = 0; i0 < m; i0 += per_pass, ++p) {
        const int64_t mr = m - i0 < per_pass ? m - i0 : per_pass;
        const G* xi = xl.data() + i0 * groups;
        for (int64_t j = jb; j < je; ++j) {
          const uint8_t* row = w + (rows ? rows[j] : j) * w_stride;
          float part[8];
          __m512* st = chunked ? state[j - jb][p] : nullptr;
          switch (mr) {
            case 1: gemv512_row<T, 1, G>(row, k, c0, c1, xi, groups, st, part); break;
            case 2: gemv512_row<T, 2, G>(row, k, c0, c1, xi, groups, st, part); break;
            case 3: gemv512_row<T, 3, G>(row, k, c0, c1, xi, groups, st, part); break;
            case 4: gemv512_row<T, 4, G>(row, k, c0, c1, xi, groups, st, part); break;
            case 5: gemv512_row<T, 5, G>(row, k, c0, c1, xi, groups, st, part); break;
            case 6: gemv512_row<T, 6, G>(row, k, c0, c1, xi, groups, st, part); break;
            case 7: gemv512_row<T, 7, G>(row, k, c0, c1, xi, groups, st, part); break;
            default: gemv512_row<T, 8, G>(row, k, c0, c1, xi, groups, st, part); break;
          }
          if (c1 == groups)
            for (int64_t i = 0; i < mr; ++i) out[(i0 + i) * n + j] = part[i];
        }
      }
    }
  }
}

template <class G>
bool gemv512_lanes(int type, const uint8_t* w, int64_t w_stride, const int64_t* rows,
                   int64_t j0, int64_t j1, int64_t k, const ActRow* x, int64_t m, float* out,
                   int64_t n) {
  switch (type) {
    case kQ4_0: gemv512_type<kQ4_0, G>(w, w_stride, rows, j0, j1, k, x, m, out, n); return true;
    case kQ4_1: gemv512_type<kQ4_1, G>(w, w_stride, rows, j0, j1, k, x, m, out, n); return true;
    case kQ4_K: gemv512_type<kQ4_K, G>(w, w_stride, rows, j0, j1, k, x, m, out, n); return true;
    case kQ5_K: gemv512_type<kQ5_K, G>(w, w_stride, rows, j0, j1, k, x, m, out, n); return true;
    case kQ6_K: gemv512_type<kQ6_K, G>(w, w_stride, rows, j0, j1, k, x, m, out, n); return true;
    case kQ8_0:
      if constexpr (kDot16Wide) {
        gemv512_type<kQ8_0, G>(w, w_stride, rows, j0, j1, k, x, m, out, n);
        return true;
      }
      break;
  }
  return false;
}

void gemv512(int type, const uint8_t* w, int64_t w_stride, const int64_t* rows, int64_t j0,
             int64_t j1, int64_t k, const ActRow* x, int64_t m, float* out, int64_t n) {
  if (!gemv512_lanes<LaneGroup>(type, w, w_stride, rows, j0, j1, k, x, m, out, n))
    gemv(type, w, w_stride, rows, j0, j1, k, x, m, out, n);
}

void gemv512_pairs(int type, const uint8_t* w, int64_t w_stride, const int64_t* rows,
                   int64_t j0, int64_t j1, int64_t k, const ActRow* x, int64_t m, float* out,
                   int64_t n) {
  if (!gemv512_lanes<PairLaneGroup>(type, w, w_stride, rows, j0, j1, k, x, m, out, n))
    gemv_pairs_as_rows(gemv, type, w, w_stride, rows, j0, j1, k, x, m, out, n);
}

}  // namespace
}  // namespace folio_cpu::quant
