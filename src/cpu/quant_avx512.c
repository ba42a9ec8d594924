/* STUB: AVX-512 quantization kernels (none yet: every job goes to the reference). */
#include "quant_kernels.h"
int lowp_cpu_quant_avx512_supports(const lowp_quant_job *j) { (void) j; return 0; }
void lowp_cpu_quant_avx512(const lowp_quant_job *j, int64_t r0, int64_t r1) { lowp_cpu_quant_ref(j, r0, r1); }
