// The AVX-512 (F/BW/VL) path, also run for AVX512-VNNI: the AVX2 arithmetic (see
// dot_avx2.cpp) on 64 weights per instruction, two activation blocks at once.
#include "kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#pragma GCC push_options
// GCC 12 flags the deliberately undefined upper lanes of its own cast intrinsics.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
#include "gemv256.h"
#include "unpack.h"

namespace folio_cpu::quant {
namespace {

void unpack_row(int type, const uint8_t* row, int64_t k, Group* out) {
  unpack_row_impl(type, row, k, out);
}

template <int MR, bool kSigned>
void dot_rows(const Group* w, int64_t groups, const ActRow* x, float* out) {
  __m512 acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = _mm512_setzero_ps();
  // int32 lane t of a 64-weight product covers weights 4t..4t+3: sub-block 4p + t / 4 of
  // pair p, activation block 2p + t / 8.
  const __m512i sub = _mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 2);
  const __m512i blk = _mm512_srli_epi32(sub, 1);
  __m512 fd[MR];  // lanes 0-7: dx_b * D_b of the current group, per row
  for (int64_t g = 0; g < groups; ++g) {
    const Group& wg = w[g];
    const __m256 d8 = _mm256_load_ps(wg.d);
    const __m256 m8 = _mm256_load_ps(wg.m);
    const __m256i o16 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wg.o));
    const __m512i ss = _mm512_load_si512(wg.ss);
    for (int r = 0; r < MR; ++r) {
      const __m256 dx8 = _mm256_loadu_ps(x[r].d + g * 8);
      fd[r] = _mm512_castps256_ps512(_mm256_mul_ps(dx8, d8));
      // Lane b: o_2b * xsum_2b + o_2b+1 * xsum_2b+1 = O_b, into lanes 0-7 of acc.
      const __m256i xs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[r].sum + g * 16));
      const __m256 o = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(o16, xs)),
                                     _mm256_mul_ps(dx8, m8));
      acc[r] = _mm512_sub_ps(acc[r], _mm512_zextps256_ps512(o));
    }
    for (int p = 0; p < 4; ++p) {
      __m512i wq = _mm512_load_si512(wg.q + 64 * p);
      const __m512i sc = _mm512_permutexvar_epi32(_mm512_add_epi32(sub, _mm512_set1_epi32(4 * p)), ss);
      const __m512i bidx = _mm512_add_epi32(blk, _mm512_set1_epi32(2 * p));
      __mmask64 neg = 0;
      if constexpr (kSigned) {
        neg = _mm512_movepi8_mask(wq);
        wq = _mm512_abs_epi8(wq);
      }
      for (int r = 0; r < MR; ++r) {
        __m512i xq = _mm512_loadu_si512(x[r].q + g * kGroup + 64 * p);
        if constexpr (kSigned) xq = _mm512_mask_sub_epi8(xq, neg, _mm512_setzero_si512(), xq);
        const __m512i prod = _mm512_madd_epi16(_mm512_maddubs_epi16(wq, xq), sc);
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(prod), _mm512_permutexvar_ps(bidx, fd[r]),
                                 acc[r]);
      }
    }
  }
  for (int r = 0; r < MR; ++r) out[r] = _mm512_reduce_add_ps(acc[r]);
}

template <bool kSigned>
void dot_signed(const Group* w, int64_t groups, const ActRow* x, int mr, float* out) {
  switch (mr) {
    case 1: dot_rows<1, kSigned>(w, groups, x, out); break;
    case 2: dot_rows<2, kSigned>(w, groups, x, out); break;
    case 3: dot_rows<3, kSigned>(w, groups, x, out); break;
    default: dot_rows<4, kSigned>(w, groups, x, out); break;
  }
}

void dot(const Group* w, int64_t groups, const ActRow* x, int mr, bool signed_q,
         float* out) {
  if (signed_q) dot_signed<true>(w, groups, x, mr, out);
  else dot_signed<false>(w, groups, x, mr, out);
}

const Kernels kAvx512{unpack_row, dot, gemv};

}  // namespace

const Kernels& avx512_kernels() { return kAvx512; }

}  // namespace folio_cpu::quant
#pragma GCC pop_options

#else
namespace folio_cpu::quant {
const Kernels& avx512_kernels() { return portable_kernels(); }
}  // namespace folio_cpu::quant
#endif
