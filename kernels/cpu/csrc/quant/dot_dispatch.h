// Kernels::dot from an ISA's register-blocked tile kernel dot_rows<MR, kSigned> (MR
// activation rows at a time, up to kMaxRows): included after dot_rows, under the ISA's
// target pragma, by the files that define one (dot_avx2.cpp, tile512.h).
#pragma once

namespace folio_cpu::quant {
namespace {

template <bool kSigned>
void dot_mr(const Group* w, int64_t groups, const ActRow* x, int mr, float* out) {
  switch (mr) {
    case 1: dot_rows<1, kSigned>(w, groups, x, out); break;
    case 2: dot_rows<2, kSigned>(w, groups, x, out); break;
    case 3: dot_rows<3, kSigned>(w, groups, x, out); break;
    default: dot_rows<4, kSigned>(w, groups, x, out); break;
  }
}

void dot(const Group* w, int64_t groups, const ActRow* x, int mr, bool signed_q,
         float* out) {
  if (signed_q) dot_mr<true>(w, groups, x, mr, out);
  else dot_mr<false>(w, groups, x, mr, out);
}

}  // namespace
}  // namespace folio_cpu::quant
