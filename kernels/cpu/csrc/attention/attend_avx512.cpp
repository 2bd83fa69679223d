// The attention kernel for AVX-512 CPUs (dispatched by active_isa()); 512-bit vectors
// so one key row of 64 floats is four loads.
#include "attention/attend_isa.h"

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,prefer-vector-width=512")
#define FOLIO_ISA_NS avx512
#include "attention/attend_kernel.inc"
#pragma GCC pop_options
#endif
