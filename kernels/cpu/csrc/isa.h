// The kernel paths, ordered: a path may run on any CPU that has a later one.
#pragma once

namespace folio_cpu {

enum class Isa : int { kPortable = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Vnni = 3 };

Isa best_isa();    // what this CPU supports
Isa active_isa();  // what the kernels run (best_isa unless a test forced a lower one)
const char* isa_name(Isa isa);

// How far ahead of the block it reads a decode kernel requests weight bytes
// (prefetch_ahead, quant/gemv256.h): per CPU vendor, set_gemv_prefetch to measure others.
extern int g_gemv_prefetch_bytes;

}  // namespace folio_cpu
