/* STUB */
#include "cli.h"
int lowp_cli_info(int argc, char **argv) { (void) argc; (void) argv; return 0; }
