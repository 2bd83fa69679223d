// The per-ISA kernel table: each ISA file compiles, for its instruction set, activation
// quantization, the block unpackers (unpack.h), the generic integer tile kernel and the
// decode kernels; act.cpp and matmul.cpp pick one table at run time (active_isa()).
#pragma once

#include <cstdint>

#include "isa.h"
#include "layout.h"
#include "wide.h"

namespace folio_cpu::quant {

// Most activation rows one dot call multiplies (register blocking).
constexpr int kMaxRows = 4;
// The wide tile kernel's register blocking: weight rows by activation rows.
constexpr int kWideCols = 2;
constexpr int kWideRows = 6;
// The most activation rows any ISA's gemv takes (each ISA says where its tiles take over).
constexpr int64_t kGemvRows = 16;

struct Kernels {
  // x[k] -> out[act_row_bytes(k)] (bit-identical on every ISA).
  void (*quantize_row)(const float* x, int64_t k, uint8_t* out);
  // row: one weight row's file bytes (k weights) -> out[padded_k(k) / 256].
  void (*unpack_row)(int type, const uint8_t* row, int64_t k, Group* out);
  // out[i] = sum over `groups` groups of w . x[i] for i < mr <= kMaxRows; signed_q for the
  // signed_weights types (Q8_0, MXFP4).
  void (*dot)(const Group* w, int64_t groups, const ActRow* x, int mr, bool signed_q,
              float* out);
  // out[i * n + j] = w_row(j) . x[i] for j0 <= j < j1, i < m <= kGemvRows, straight from
  // the weight rows' file bytes (row j is rows[j], or j without rows); null where the ISA
  // has none (the tiles then serve every m).
  void (*gemv)(int type, const uint8_t* w, int64_t w_stride, const int64_t* rows, int64_t j0,
               int64_t j1, int64_t k, const ActRow* x, int64_t m, float* out, int64_t n);
  // The order `dot` wants the 256 q bytes of each group in, applied in place to both the
  // unpacked weights and a copy of the activations (the same permutation of both keeps
  // every dot product); null for the file order.
  void (*interleave)(uint8_t* q, int64_t groups);
  // Up to this many activation rows (<= kGemvRows) the products go through gemv, beyond
  // through the tiles. AVX2 and AVX-512 take gemv as far as it goes (16 rows: 8 decode
  // rows as (row, residual) pairs): on a Zen 5, a 1B's decode step of 6 / 8 rows took
  // 38 / 52 ms through gemv against 70 / 79 through the wide tiles (which unpack every
  // weight chunk for so few rows), and 8 rows on the AVX2 path 90 against 148 ms through
  // the 8-bit tiles.
  int64_t gemv_max_rows;
  // The wide (16-bit) tiles of float activations (wide.h). x[k] -> out[wide_chunks(k)]
  // (bit-identical on every ISA).
  void (*quantize_wide)(const float* x, int64_t k, WideChunk* out);
  // Chunks [c0, c0 + count) of one weight row (its file bytes, k weights) -> out[count].
  void (*unpack_wide)(int type, const uint8_t* row, int64_t k, int64_t c0, int64_t count,
                      WideChunk* out);
  // acc[i * acc_stride + r] += w[r] . x[i] over `chunks` chunks, the last of last_rows
  // word rows (wide_rows), for every r < nr (kWideCols weight rows a register block) and
  // i < mr <= kWideRows (min_terms: wide_min_terms of the type).
  void (*dot_wide)(const WideChunk* const* w, int nr, const WideChunk* const* x, int mr,
                   int64_t chunks, int last_rows, int min_terms, float* acc,
                   int64_t acc_stride);
  // From this many float rows (and past gemv_max_rows) quant_matmul_stack takes the wide
  // tiles instead of the 8-bit tiles: where they are at least as fast, measured (AVX-512:
  // from the first tile; AVX2, whose unpacking costs more, from 128 rows; the portable
  // path's plain C++ never).
  int64_t wide_min_rows;
  // gemv over (x, residual) pairs (quantize_activations_residual's rows 2i, 2i + 1; m
  // pairs, 2m rows): out[i * n + j] = the sum of pair i's two products, their integer
  // dots combined before the float work (PairLaneGroup, gemv256.h). Null where the ISA
  // has no gemv (the tiles then sum each pair).
  void (*gemv_pairs)(int type, const uint8_t* w, int64_t w_stride, const int64_t* rows,
                     int64_t j0, int64_t j1, int64_t k, const ActRow* x, int64_t m,
                     float* out, int64_t n);
  // x[k] -> a pair's two rows, high (quantize_row's) and low (the residual's at 1/256 of
  // each block's step), each act_row_bytes(k) (bit-identical on every ISA).
  void (*quantize_residual)(const float* x, int64_t k, uint8_t* high, uint8_t* low);
};

const Kernels& portable_kernels();
const Kernels& avx2_kernels();    // portable_kernels() off x86
const Kernels& avx512_kernels();       // AVX-512 F/BW/VL
const Kernels& avx512_vnni_kernels();  // the same with VNNI's vpdpwssd

inline const Kernels& kernels_for(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Vnni: return avx512_vnni_kernels();
    case Isa::kAvx512: return avx512_kernels();
    case Isa::kAvx2: return avx2_kernels();
    default: return portable_kernels();
  }
}

}  // namespace folio_cpu::quant
