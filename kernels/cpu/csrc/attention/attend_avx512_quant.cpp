// The attention kernel for AVX-512 CPUs over quantized pools (int8, fp8, int4): a unit
// apart from attend_avx512.cpp's float32 / float16 one, whose tiles GCC stopped inlining
// (unit growth) once these instantiations shared its file, slowing float16 decode.
#include "attention/attend_isa.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

#pragma GCC push_options
// GCC 12 flags the deliberately undefined upper lanes of its own cast intrinsics.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c,prefer-vector-width=512")

#include "simd512.h"

#define FOLIO_TILE_INLINE [[gnu::always_inline]] inline
#include "attention/attend_avx512_tiles.h"

#define FOLIO_KEY_SCORES 1
#define FOLIO_KEY_SCORES_ANY_POOL 1
#define FOLIO_INT8_IN_PLACE 1
#define FOLIO_TRANSPOSED_SCORES 1
#define FOLIO_ISA_NS avx512
#define FOLIO_KV_QUANTIZED_KINDS 1
#include "attention/attend_kernel.inc"
#pragma GCC pop_options
#endif
