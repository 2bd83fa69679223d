// The attention kernel's entry point per instruction set (attend_kernel.inc, compiled by
// attend_portable.cpp, attend_avx2.cpp and attend_avx512.cpp).
#pragma once

#include "attention/attention_task.h"

namespace folio_cpu::attention {

// scratch: at least scratch_floats(rows, args) floats for the task's rows.
using RunTask = void (*)(const AttentionArgs&, const AttentionTask&, const Partials&, float*);

inline int64_t scratch_floats(int64_t rows, const AttentionArgs& args) {
  // Scores of a span (16 blocks of 16 slots, or one block of another size), max, sum and
  // acc per row; one block's keys transposed (attend_kernel.inc).
  const int64_t span = args.block_size == 16 ? 256 : args.block_size;
  return rows * (span + args.head_size + 2) + args.head_size * args.block_size;
}

namespace portable {
void run_task(const AttentionArgs&, const AttentionTask&, const Partials&, float*);
}
#if defined(__x86_64__)
namespace avx2 {
void run_task(const AttentionArgs&, const AttentionTask&, const Partials&, float*);
}
namespace avx512 {
void run_task(const AttentionArgs&, const AttentionTask&, const Partials&, float*);
}
#endif

}  // namespace folio_cpu::attention
