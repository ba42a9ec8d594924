/* STUB: AVX-512 cast kernels */
#include "cpu.h"
int lowp_cpu_cast_avx512_supports(lowp_format src, lowp_format dst, lowp_rounding rounding) { (void) src; (void) dst; (void) rounding; return 0; }
void lowp_cpu_cast_avx512(const lowp_cast_piece *p) { lowp_cpu_cast_ref(p); }
