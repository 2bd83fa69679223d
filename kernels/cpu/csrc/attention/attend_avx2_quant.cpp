// The attention kernel for AVX2 + FMA CPUs over quantized pools (int8, fp8, int4), in a
// unit of its own as attend_avx512_quant.cpp.
#include "attention/attend_isa.h"

#if defined(__x86_64__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#define FOLIO_TILE_INLINE [[gnu::always_inline]] inline
#include "attention/attend_avx2_tiles.h"

#define FOLIO_KEY_SCORES 1
#define FOLIO_KEY_SCORES_ANY_POOL 1
#define FOLIO_INT8_IN_PLACE 1
#define FOLIO_ISA_NS avx2
#define FOLIO_KV_QUANTIZED_KINDS 1
#include "attention/attend_kernel.inc"
#pragma GCC pop_options
#endif
