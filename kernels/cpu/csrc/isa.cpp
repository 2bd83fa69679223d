// Which instruction sets this CPU has, and which kernel path the library runs.
#include <torch/library.h>

#include <cstdint>
#include <string>

#include "isa.h"

namespace folio_cpu {

namespace {

Isa detect() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl");
  if (avx512 && __builtin_cpu_supports("avx512vnni")) return Isa::kAvx512Vnni;
  if (avx512) return Isa::kAvx512;
  // F16C: the AVX2 kernels convert float16 scales and KV blocks with it (every AVX2 CPU
  // has it; a hypervisor could hide it).
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c"))
    return Isa::kAvx2;
#endif
  return Isa::kPortable;
}

Isa g_best = detect();
Isa g_active = g_best;

// The hardware prefetchers keep too few lines in flight for a decode stream interleaved
// with its compute, so each block's bytes this far ahead are requested first. Measured
// (docs/CPU_PERFORMANCE.md): on the 2-core Intel Xeon 2 KiB ahead streamed fastest (4 KiB
// 15% slower, 8 KiB 40%); on AMD Zen 5 the step of a 1B / 3B / 8B model ran 5-12% faster
// at 8 KiB than at 2 KiB.
int default_prefetch() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_is("amd")) return 8192;
#endif
  return 2048;
}

}  // namespace

int g_gemv_prefetch_bytes = default_prefetch();

Isa best_isa() { return g_best; }
Isa active_isa() { return g_active; }

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Vnni: return "avx512vnni";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    case Isa::kPortable: return "portable";
  }
  return "portable";
}

namespace {

std::string isa_op() { return isa_name(g_active); }

std::string best_isa_op() { return isa_name(g_best); }

// Tests force a lower path to compare it with the best one; never above what the CPU has.
void set_isa_op(const std::string& name) {
  for (Isa isa : {Isa::kPortable, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Vnni}) {
    if (name == isa_name(isa)) {
      TORCH_CHECK(static_cast<int>(isa) <= static_cast<int>(g_best), "this CPU lacks ",
                  name, " (best: ", isa_name(g_best), ")");
      g_active = isa;
      return;
    }
  }
  TORCH_CHECK(false, "unknown ISA path ", name);
}

int64_t gemv_prefetch_op() { return g_gemv_prefetch_bytes; }

// For measuring other distances (scripts/bench_gemv_prefetch.py); whole cache lines.
void set_gemv_prefetch_op(int64_t bytes) {
  TORCH_CHECK(bytes >= 0 && bytes <= (1 << 16) && bytes % 64 == 0,
              "bytes must be a multiple of 64 from 0 to 65536, not ", bytes);
  g_gemv_prefetch_bytes = static_cast<int>(bytes);
}

}  // namespace

}  // namespace folio_cpu

TORCH_LIBRARY_FRAGMENT(folio_cpu, m) {
  m.def("isa() -> str", &folio_cpu::isa_op);
  m.def("best_isa() -> str", &folio_cpu::best_isa_op);
  m.def("set_isa(str name) -> ()", &folio_cpu::set_isa_op);
  m.def("gemv_prefetch() -> int", &folio_cpu::gemv_prefetch_op);
  m.def("set_gemv_prefetch(int bytes) -> ()", &folio_cpu::set_gemv_prefetch_op);
}
