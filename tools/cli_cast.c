/* STUB */
#include "cli.h"
int lowp_cli_cast(int argc, char **argv) { (void) argc; (void) argv; return 0; }
int lowp_cli_demo(int argc, char **argv) { (void) argc; (void) argv; return 0; }
