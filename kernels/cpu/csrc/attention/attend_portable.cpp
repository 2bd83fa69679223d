// The attention kernel for any CPU: what the compiler's baseline target vectorizes.
#include "attention/attend_isa.h"

#define FOLIO_ISA_NS portable
#include "attention/attend_kernel.inc"
