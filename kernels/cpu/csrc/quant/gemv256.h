// Decode-sized products (m <= kGemvRows): one weight row against up to kMaxRows activation
// rows, each block unpacked into registers (no Group in memory) and used for every row.
// 256-bit AVX2 code, included after the ISA pragma by the AVX2 and AVX-512 files (Zen 4
// and Intel run 256-bit integer ops at full rate; the weights' memory traffic, not the
// vector width, bounds these shapes). Same arithmetic as the portable dot (layout.h).
// The including file defines dot4(q u8, x s8): int32 lanes of 4 adjacent products each
// (maddubs + madd with ones, or VNNI's vpdpbusd), and kGemvBlockRows: the most rows one
// pass over a weight row takes (4 with AVX2's 16 registers, 8 with AVX-512's 32).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels.h"
#include "layout.h"
#include "unpack.h"

namespace folio_cpu::quant {
namespace {

// Decode reads every weight from memory once, each block's bytes requested
// g_gemv_prefetch_bytes ahead first (isa.cpp: the distance per CPU vendor, measured).
// Prefetches never fault, so reading past a row's or a mapping's end is harmless.
// docs/CPU_PERFORMANCE.md, "Decode prefetch and huge pages".
inline void prefetch_ahead(const uint8_t* blk, int bytes) {
  const char* p = reinterpret_cast<const char*>(blk) + g_gemv_prefetch_bytes;
  for (int b = 0; b < bytes; b += 64) _mm_prefetch(p + b, _MM_HINT_T0);
}

inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// One activation row per group in a GEMV's lane layout (gemv512.h, gemv_lanes256.h):
// lane L (of 16) holds sub-block sub[L], its 4-byte piece u (weights 4u..4u+3) at
// q[at[L] + u_stride * u]; dx[L] the dx_b of that sub-block's block, xs[L] dx_b * its sum.
struct alignas(64) LaneGroup {
  int8_t q[256];
  float dx[16];
  float xs[16];
};

struct LaneOrder {
  int sub[16];
  int at[16];
  int u_stride;
};

// One (x, residual) pair (act_residual.cpp) per group in the same layout: q the x row's,
// lo the residual's, dx the residual's step (the block's dx_b / 256), xs both rows'
// dx * sum. Since the pair is d_lo (256 q + lo), a lane's two integer dots combine as
// 256 S_q + S_lo before the float work: one row's conversions and fmas, and 640 bytes
// where two LaneGroups took 768 (a 7-8B model's down projection then fits L1).
struct alignas(64) PairLaneGroup {
  int8_t q[256];
  int8_t lo[256];
  float dx[16];
  float xs[16];
};

// Group g's 256 bytes of q in the lane layout.
inline void lane_bytes(const int8_t* q, const LaneOrder& order, int8_t* out) {
  for (int l = 0; l < 16; ++l)
    for (int u = 0; u < 4; ++u)
      std::memcpy(out + order.at[l] + order.u_stride * u, q + 16 * order.sub[l] + 4 * u, 4);
}

// The rows x[0..m) in the lane layout, out[r * groups + g] for group g of row r.
inline void prepare_lanes(const ActRow* x, int64_t m, int64_t groups, const LaneOrder& order,
                          LaneGroup* out) {
  for (int64_t r = 0; r < m; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      LaneGroup& lg = out[r * groups + g];
      lane_bytes(x[r].q + g * kGroup, order, lg.q);
      for (int l = 0; l < 16; ++l) {
        const int sb = order.sub[l];
        lg.dx[l] = x[r].d[g * 8 + sb / 2];
        lg.xs[l] = lg.dx[l] * static_cast<float>(x[r].sum[g * 16 + sb]);
      }
    }
}

// The pairs (x[2p], x[2p + 1]) for p < m, out[p * groups + g].
inline void prepare_lanes(const ActRow* x, int64_t m, int64_t groups, const LaneOrder& order,
                          PairLaneGroup* out) {
  for (int64_t p = 0; p < m; ++p)
    for (int64_t g = 0; g < groups; ++g) {
      PairLaneGroup& lg = out[p * groups + g];
      const ActRow &hi = x[2 * p], &lo = x[2 * p + 1];
      lane_bytes(hi.q + g * kGroup, order, lg.q);
      lane_bytes(lo.q + g * kGroup, order, lg.lo);
      for (int l = 0; l < 16; ++l) {
        const int sb = order.sub[l], b = static_cast<int>(g * 8 + sb / 2);
        lg.dx[l] = lo.d[b];
        lg.xs[l] = hi.d[b] * static_cast<float>(hi.sum[g * 16 + sb]) +
                   lo.d[b] * static_cast<float>(lo.sum[g * 16 + sb]);
      }
    }
}

using GemvFn = void (*)(int type, const uint8_t* w, int64_t w_stride, const int64_t* rows,
                        int64_t j0, int64_t j1, int64_t k, const ActRow* x, int64_t m,
                        float* out, int64_t n);

// gemv_pairs (kernels.h) for a type a lane kernel does not fuse: the pair's two rows by
// `gemv`, summed.
inline void gemv_pairs_as_rows(GemvFn gemv, int type, const uint8_t* w, int64_t w_stride,
                               const int64_t* rows, int64_t j0, int64_t j1, int64_t k,
                               const ActRow* x, int64_t m, float* out, int64_t n) {
  const int64_t cols = j1 - j0;
  std::vector<float> buf(static_cast<size_t>(2 * m * cols));  // [2m][cols]
  gemv(type, rows ? w : w + j0 * w_stride, w_stride, rows ? rows + j0 : nullptr, 0, cols, k,
       x, 2 * m, buf.data(), cols);
  for (int64_t p = 0; p < m; ++p)
    for (int64_t j = 0; j < cols; ++j)
      out[p * n + j0 + j] = buf[2 * p * cols + j] + buf[(2 * p + 1) * cols + j];
}

inline uint32_t load32(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
inline uint64_t load64(const uint8_t* p) { uint64_t v; std::memcpy(&v, p, 8); return v; }
inline __m256i lo4(__m256i v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
inline __m256i hi4(__m256i v) { return lo4(_mm256_srli_epi16(v, 4)); }
// Bits `shift`..shift+1 of every byte, as 0..3.
inline __m256i bits2(__m256i v, int shift) {
  return _mm256_and_si256(_mm256_srli_epi16(v, shift), _mm256_set1_epi8(3));
}
// `value` in every byte whose bit `bit` is set, else 0.
inline __m256i bit_to(__m256i v, int bit, int value) {
  const __m256i m = _mm256_set1_epi8(static_cast<char>(1 << bit));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, m), m),
                          _mm256_set1_epi8(static_cast<char>(value)));
}
// The 32 bits of u as 32 bytes of 0 / 16 (byte i: bit i): the 5th bit of Q5_0 / Q5_1.
inline __m256i bits32_to16(uint32_t u) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(u)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i m = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, m), m),
                          _mm256_set1_epi8(16));
}

// The 32 weights of block b of a K-quant super-block as unsigned bytes.
template <int T>
inline __m256i k_quant_q(const uint8_t* blk, int b) {
  if constexpr (T == kQ2_K) {
    return bits2(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * (b / 4))), 2 * (b % 4));
  } else if constexpr (T == kQ3_K) {
    const __m256i ql = bits2(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 + 32 * (b / 4))), 2 * (b % 4));
    return _mm256_or_si256(ql, bit_to(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)), b, 4));
  } else if constexpr (T == kQ4_K || T == kQ5_K) {
    const int off = T == kQ4_K ? 16 : 48;
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + off + 32 * (b / 2)));
    __m256i q = b % 2 ? hi4(v) : lo4(v);
    if constexpr (T == kQ5_K)
      q = _mm256_or_si256(q, bit_to(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16)), b, 16));
    return q;
  } else {  // Q6_K
    const int h = b / 4, t = b % 4;
    const __m256i l = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h + 32 * (t % 2)));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
    return _mm256_or_si256(t < 2 ? lo4(l) : hi4(l), _mm256_slli_epi16(bits2(qh, 2 * t), 4));
  }
}

// A K-quant super-block's int16 sub-block scales sv[16] and offsets ov[16], and D, M.
template <int T>
inline void k_quant_scales(const uint8_t* blk, __m256i& sv, __m256i& ov, float& d, float& m) {
  if constexpr (T == kQ2_K) {
    const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)));
    sv = _mm256_and_si256(v, _mm256_set1_epi16(15));
    ov = _mm256_srli_epi16(v, 4);
    d = half_to_float(blk + 80);
    m = half_to_float(blk + 82);
  } else if constexpr (T == kQ3_K) {
    // Sub-block j's 6-bit scale: low 4 bits from nibble j / 8 of byte j % 8, high 2 bits
    // from bits 2 (j / 4) of byte 8 + j % 4.
    const uint64_t lo = load64(blk + 96);
    const uint64_t h = load32(blk + 104);
    const uint64_t k3 = 0x03030303u;
    const uint64_t hi0 = (h & k3) | (((h >> 2) & k3) << 32);
    const uint64_t hi1 = ((h >> 4) & k3) | (((h >> 6) & k3) << 32);
    const uint64_t k4 = 0x0F0F0F0F0F0F0F0Full;
    const __m128i b = _mm_set_epi64x(static_cast<int64_t>(((lo >> 4) & k4) | (hi1 << 4)),
                                     static_cast<int64_t>((lo & k4) | (hi0 << 4)));
    sv = _mm256_sub_epi16(_mm256_cvtepu8_epi16(b), _mm256_set1_epi16(32));
    ov = _mm256_slli_epi16(sv, 2);
    d = m = half_to_float(blk + 108);
  } else if constexpr (T == kQ4_K || T == kQ5_K) {
    const uint64_t a = load32(blk + 4), bb = load32(blk + 8), c = load32(blk + 12);
    const uint64_t sc = (a & 0x3F3F3F3F) | ((((c & 0x0F0F0F0F) | ((a >> 2) & 0x30303030))) << 32);
    const uint64_t mn = (bb & 0x3F3F3F3F) | (((((c >> 4) & 0x0F0F0F0F) | ((bb >> 2) & 0x30303030))) << 32);
    // Each 32-weight scale twice: one per 16-weight sub-block.
    const __m128i s8 = _mm_set_epi64x(static_cast<int64_t>(mn), static_cast<int64_t>(sc));
    const __m128i dup = _mm_unpacklo_epi8(s8, s8);  // sc0 sc0 sc1 sc1 ...
    const __m128i dupm = _mm_unpackhi_epi8(s8, s8);
    sv = _mm256_cvtepu8_epi16(dup);
    ov = _mm256_cvtepu8_epi16(dupm);
    d = half_to_float(blk);
    m = half_to_float(blk + 2);
  } else {  // Q6_K
    sv = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)));
    ov = _mm256_slli_epi16(sv, 5);
    d = m = half_to_float(blk + 208);
  }
}

// Per block and row: maddubs pairs, madd with the block's int16 sub-block scales (shared
// by the rows), one fma by dx_b into a per-super-block sum, which D scales once.
template <int T, int MR>
inline void gemv_k_quant(const uint8_t* w, int64_t k, const ActRow* x, float* out) {
  constexpr int kBytes = T == kQ2_K ? 84 : T == kQ3_K ? 110 : T == kQ4_K ? 144 : T == kQ5_K ? 176 : 210;
  constexpr bool kPer32 = T == kQ4_K || T == kQ5_K;  // one scale per 32 weights
  // One row alone gets four independent fma chains (blocks round-robin) so the fma
  // latency does not bound it; two or more rows are chains of their own (more
  // accumulators measured slower: spills).
  constexpr int kChains = MR == 1 ? 4 : 1;
  __m256 acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_ps();
  alignas(32) int16_t s[16];
  for (int64_t g = 0; g < k / kGroup; ++g) {
    const uint8_t* blk = w + g * kBytes;
    prefetch_ahead(blk, kBytes);
    __m256i sv, ov;
    float d, m;
    k_quant_scales<T>(blk, sv, ov, d, m);
    _mm256_store_si256(reinterpret_cast<__m256i*>(s), sv);
    __m256 part[MR][kChains];
    for (int r = 0; r < MR; ++r)
      for (int c = 0; c < kChains; ++c) part[r][c] = _mm256_setzero_ps();
    for (int b = 0; b < 8; ++b) {
      const __m256i q = k_quant_q<T>(blk, b);
      const __m256i sc = kPer32 ? _mm256_set1_epi16(s[2 * b])
                                : _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(s[2 * b])),
                                                          _mm_set1_epi16(s[2 * b + 1]), 1);
      for (int r = 0; r < MR; ++r) {
        const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[r].q + g * kGroup + 32 * b));
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(q, xq), sc);
        __m256& a = part[r][b % kChains];
        a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(x[r].d + g * 8 + b), a);
      }
    }
    const __m256 dv = _mm256_set1_ps(d), mv = _mm256_set1_ps(m);
    for (int r = 0; r < MR; ++r) {
      for (int c = 1; c < kChains; ++c) part[r][0] = _mm256_add_ps(part[r][0], part[r][c]);
      acc[r] = _mm256_fmadd_ps(part[r][0], dv, acc[r]);
      // Lane b: o_2b * xsum_2b + o_2b+1 * xsum_2b+1 = O_b.
      const __m256i xs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[r].sum + g * 16));
      const __m256 off = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(ov, xs)),
                                       _mm256_loadu_ps(x[r].d + g * 8));
      acc[r] = _mm256_fnmadd_ps(off, mv, acc[r]);
    }
  }
  for (int r = 0; r < MR; ++r) out[r] = hsum256(acc[r]);
}

// 32-weight block types. Q4_0 / Q5_0 / Q8_0 become signed weights (q - 8, q - 16, q) with
// no offset; Q4_1 / Q5_1 keep unsigned q and add m * sum(x) per block.
template <int T, int MR>
inline void gemv_block32(const uint8_t* w, int64_t k, const ActRow* x, float* out) {
  constexpr int kBytes = T == kQ4_0 ? 18 : T == kQ4_1 ? 20 : T == kQ5_0 ? 22 : T == kQ5_1 ? 24 : 34;
  constexpr bool kSigned = T == kQ4_0 || T == kQ5_0 || T == kQ8_0;
  constexpr int kQs = kBytes - 16;
  constexpr int kChains = MR == 1 ? 4 : 1;  // see gemv_k_quant
  __m256 acc[MR][kChains];
  float off[MR];
  for (int r = 0; r < MR; ++r) {
    for (int c = 0; c < kChains; ++c) acc[r][c] = _mm256_setzero_ps();
    off[r] = 0.0f;
  }
  for (int64_t i = 0; i < k / 32; ++i) {
    const uint8_t* blk = w + i * kBytes;
    prefetch_ahead(blk, 1);  // one line per block: a line holds two to three blocks
    const float d = half_to_float(blk);
    __m256i q;
    if constexpr (T == kQ8_0) {
      q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    } else {
      const __m128i n = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kQs));
      const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(n), _mm_srli_epi16(n, 4), 1);
      q = lo4(both);  // weights 0-15: low nibbles, 16-31: high nibbles
      if constexpr (T == kQ5_0 || T == kQ5_1) q = _mm256_or_si256(q, bits32_to16(load32(blk + kQs - 4)));
      if constexpr (T == kQ4_0) q = _mm256_sub_epi8(q, _mm256_set1_epi8(8));
      if constexpr (T == kQ5_0) q = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
    }
    const __m256i qa = kSigned ? _mm256_sign_epi8(q, q) : q;  // |q| (-128 -> 128 as u8)
    const float mn = kSigned ? 0.0f : half_to_float(blk + 2);
    for (int r = 0; r < MR; ++r) {
      __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[r].q + 32 * i));
      if constexpr (kSigned) xq = _mm256_sign_epi8(xq, q);
      const __m256i p = dot4(qa, xq);
      const float dx = x[r].d[i];
      __m256& a = acc[r][i % kChains];
      a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dx * d), a);
      if constexpr (!kSigned)
        off[r] += dx * mn * static_cast<float>(x[r].sum[2 * i] + x[r].sum[2 * i + 1]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int c = 1; c < kChains; ++c) acc[r][0] = _mm256_add_ps(acc[r][0], acc[r][c]);
    out[r] = hsum256(acc[r][0]) + off[r];
  }
}

}  // namespace
}  // namespace folio_cpu::quant

#include "gemv_mxfp4.h"  // MXFP4's kernel, on this file's hsum256 and the ISA's dot4

namespace folio_cpu::quant {
namespace {

// Rows j0..j1 of the output: out[i * n + j] = w_row(j) . x[i] for i < m, w_row(j) the
// weight row rows[j] (j without rows). One call per thread's share, so the type switch
// and setup happen once, not per row.
template <int T, int MR>
inline void gemv_row(const uint8_t* row, int64_t k, const ActRow* x, float* out) {
  if constexpr (T == kMXFP4)
    gemv_mxfp4<MR>(row, k, x, out);
  else if constexpr (T == kQ4_0 || T == kQ4_1 || T == kQ5_0 || T == kQ5_1 || T == kQ8_0)
    gemv_block32<T, MR>(row, k, x, out);
  else
    gemv_k_quant<T, MR>(row, k, x, out);
}

template <int T>
void gemv_type(const uint8_t* w, int64_t w_stride, const int64_t* rows, int64_t j0,
               int64_t j1, int64_t k, const ActRow* x, int64_t m, float* out, int64_t n) {
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* row = w + (rows ? rows[j] : j) * w_stride;
    // Passes of equal size (9 rows: 5 + 4, not 8 + 1): a pass costs about as much for one
    // row as for several.
    const int64_t passes = (m + kGemvBlockRows - 1) / kGemvBlockRows;
    const int64_t per_pass = (m + passes - 1) / passes;
    for (int64_t i0 = 0; i0 < m; i0 += per_pass) {
      float part[kGemvBlockRows] = {};  // (= {}: GCC cannot see mr <= kGemvBlockRows)
      const int64_t mr = m - i0 < per_pass ? m - i0 : per_pass;
      switch (mr) {
        case 1: gemv_row<T, 1>(row, k, x + i0, part); break;
        case 2: gemv_row<T, 2>(row, k, x + i0, part); break;
        case 3: gemv_row<T, 3>(row, k, x + i0, part); break;
        case 4: gemv_row<T, 4>(row, k, x + i0, part); break;
        // Only where 32 vector registers hold 8 rows' accumulators (AVX-512 files).
        case 5: if constexpr (kGemvBlockRows >= 8) gemv_row<T, 5>(row, k, x + i0, part); break;
        case 6: if constexpr (kGemvBlockRows >= 8) gemv_row<T, 6>(row, k, x + i0, part); break;
        case 7: if constexpr (kGemvBlockRows >= 8) gemv_row<T, 7>(row, k, x + i0, part); break;
        default: if constexpr (kGemvBlockRows >= 8) gemv_row<T, 8>(row, k, x + i0, part); break;
      }
      for (int64_t i = 0; i < mr; ++i) out[(i0 + i) * n + j] = part[i];
    }
  }
}

void gemv(int type, const uint8_t* w, int64_t w_stride, const int64_t* rows, int64_t j0,
          int64_t j1, int64_t k, const ActRow* x, int64_t m, float* out, int64_t n) {
  switch (type) {
    case kQ4_0: gemv_type<kQ4_0>(w, w_stride, rows, j0, j1, k, x, m, out, n); break;
    case kQ4_1: gemv_type<kQ4_1>(w, w_stride, rows, j0, j1, k, x, m, out, n); break;
    case kQ5_0: gemv_type<kQ5_0>(w, w_stride, rows, j0, j1, k, x, m, out, n); break;
    case kQ5_1: gemv_type<kQ5_1>(w, w_stride, rows, j0, j1, k, x, m, out, n); break;
    case kQ8_0: gemv_type<kQ8_0>(w, w_stride, rows, j0, j1, k, x, m, out, n); break;
    case kQ2_K: gemv_type<kQ2_K>(w, w_stride, rows, j0, j1, k, x, m, out, n); break;
    case kQ3_K: gemv_type<kQ3_K>(w, w_stride, rows, j0, j1, k, x, m, out, n); break;
    case kQ4_K: gemv_type<kQ4_K>(w, w_stride, rows, j0, j1, k, x, m, out, n); break;
    case kQ5_K: gemv_type<kQ5_K>(w, w_stride, rows, j0, j1, k, x, m, out, n); break;
    case kQ6_K: gemv_type<kQ6_K>(w, w_stride, rows, j0, j1, k, x, m, out, n); break;
    case kMXFP4: gemv_type<kMXFP4>(w, w_stride, rows, j0, j1, k, x, m, out, n); break;
  }
}

}  // namespace
}  // namespace folio_cpu::quant
