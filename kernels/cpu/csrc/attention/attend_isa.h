// The attention kernel's entry points per instruction set (attend_kernel.inc, compiled by
// attend_portable.cpp, attend_avx2.cpp and attend_avx512.cpp, and their _quant.cpp units
// for the quantized pools).
#pragma once

#include <cstdint>

#include "attention/attention_task.h"

namespace folio_cpu::attention {

// scratch: at least scratch_floats(rows, args) floats for the task's rows.
using RunTask = void (*)(const AttentionArgs&, const AttentionTask&, const Partials&, float*);
// n floats to IEEE float16 bits, rounded to nearest even as torch's .to(torch.float16)
// (past +-65504 they become infinities): a float16 pool's KV write.
using HalvesFromFloats = void (*)(const float* src, uint16_t* dst, int64_t n);

// The kernel's score and value tiles take 16 key slots at a time: a block of a multiple
// of 16 slots (16, the engine's default; int4's 32 or 64; any a user sets) takes them as
// consecutive 16-slot sub-blocks.
constexpr int64_t kSubBlock = 16;
// The online softmax takes whole blocks of such sizes up to this many keys at a time, so
// that a row's max, rescale and sum are paid once per span, not per block; one block of
// any other size.
constexpr int64_t kSpanKeys = 256;

inline int64_t span_blocks_of(int64_t block_size) {
  return block_size % kSubBlock == 0 && block_size < kSpanKeys ? kSpanKeys / block_size : 1;
}

inline int64_t scratch_floats(int64_t rows, const AttentionArgs& args) {
  // Scores of a span, max, sum and acc per row; one block's keys transposed; one block of
  // a float16 pool as float32; an int4 key block's low and step per channel and its
  // parameter bytes (fewer than head_size + row_len floats hold them), or an int8 one's
  // centers; each row's score of those centers (attend_kernel.inc).
  const int64_t span = span_blocks_of(args.block_size) * args.block_size;
  return rows * (span + args.head_size + 3) + 2 * args.head_size * args.block_size +
         3 * args.head_size + args.row_len;
}

// The kernels of one instruction set.
struct IsaKernels {
  RunTask run_task;
  HalvesFromFloats halves_from_floats;
};

// The active instruction set's (folio_cpu::active_isa(), which a test may lower).
IsaKernels kernels_for_active_isa();

namespace portable {
void run_task(const AttentionArgs&, const AttentionTask&, const Partials&, float*);
void run_quantized_task(const AttentionArgs&, const AttentionTask&, const Partials&, float*);
void halves_from_floats(const float*, uint16_t*, int64_t);
}
#if defined(__x86_64__)
namespace avx2 {
void run_task(const AttentionArgs&, const AttentionTask&, const Partials&, float*);
void run_quantized_task(const AttentionArgs&, const AttentionTask&, const Partials&, float*);
void halves_from_floats(const float*, uint16_t*, int64_t);
}
namespace avx512 {
void run_task(const AttentionArgs&, const AttentionTask&, const Partials&, float*);
void run_quantized_task(const AttentionArgs&, const AttentionTask&, const Partials&, float*);
void halves_from_floats(const float*, uint16_t*, int64_t);
}
#endif

}  // namespace folio_cpu::attention
