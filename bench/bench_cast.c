/* STUB */
#include "cli.h"
int lowp_bench_cast(int argc, char **argv) { (void) argc; (void) argv; return 0; }
