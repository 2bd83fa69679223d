// The attention kernel for AVX2 + FMA CPUs (dispatched by active_isa()).
#include "attention/attend_isa.h"

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define FOLIO_ISA_NS avx2
#include "attention/attend_kernel.inc"
#pragma GCC pop_options
#endif
