/* Subcommands of the `lowp` tool. Each takes argv with argv[0] = the subcommand's name and
 * returns the process exit status: 0 success, 2 bad usage or bad input file, 1 any other
 * failure. Messages go to stderr as one line; results to stdout. */
#ifndef LOWP_CLI_H
#define LOWP_CLI_H

int lowp_cli_info(int argc, char **argv);    /* tools/cli_info.c */
int lowp_cli_cast(int argc, char **argv);    /* tools/cli_cast.c */
int lowp_cli_demo(int argc, char **argv);    /* tools/cli_cast.c */
int lowp_bench_cast(int argc, char **argv);  /* bench/bench_cast.c */
int lowp_bench_gemm(int argc, char **argv);  /* bench/bench_gemm.c */
int lowp_bench_quant(int argc, char **argv); /* bench/bench_quant.c */

int lowp_cli_quantize(int argc, char **argv);   /* tools/cli_quant.c */
int lowp_cli_dequantize(int argc, char **argv); /* tools/cli_quant.c */
int lowp_cli_gemm(int argc, char **argv);       /* tools/cli_gemm.c */

int lowp_cli_train(int argc, char **argv);   /* tools/cli_train.c */
int lowp_cli_compare(int argc, char **argv); /* tools/cli_train.c */
int lowp_bench_train(int argc, char **argv); /* bench/bench_train.c */

#endif
