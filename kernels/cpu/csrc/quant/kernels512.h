// The AVX-512 kernel table, shared by dot_avx512.cpp and dot_avx512vnni.cpp: each defines
// its integer primitives (dot4, accumulate, dot16, wide_acc, kDot16Wide, kGemvBlockRows) under its
// own target pragma, then includes this, which instantiates every kernel with them into
// kKernels; the file exports kKernels under its ISA's name.
#pragma once

#include "gemv256.h"
#include "gemv512.h"
#include "tile512.h"
#include "wide512.h"
#include "act_row.h"
#include "unpack.h"
#include "wide_impl.h"

namespace folio_cpu::quant {
namespace {

const Kernels kKernels{quantize_row_avx2, unpack_row_impl, dot, gemv512, interleave, 16,
                       quantize_wide512, unpack_wide512, dot_wide_simd<Wide512>,
                       0, gemv512_pairs, quantize_residual_avx2};

}  // namespace
}  // namespace folio_cpu::quant
