// Which instruction sets this CPU has, and which kernel path the library runs.
#include <torch/library.h>

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

}  // namespace

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

}  // namespace

}  // namespace folio_cpu

TORCH_LIBRARY_FRAGMENT(folio_cpu, m) {
  m.def("isa() -> str", &folio_cpu::isa_op);
  m.def("best_isa() -> str", &folio_cpu::best_isa_op);
  m.def("set_isa(str name) -> ()", &folio_cpu::set_isa_op);
}
