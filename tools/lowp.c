/* The `lowp` command: a table-driven dispatcher to the subcommands of tools/cli.h.
 *
 * A new subcommand is one line in COMMANDS (or in BENCHMARKS for `lowp bench NAME`), plus
 * its declaration in cli.h. Each subcommand receives argv with argv[0] = its own name and
 * returns the exit status (0 ok, 2 bad usage or input, 1 other failure).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "lowp/lowp.h"

typedef struct subcommand {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} subcommand;

static const subcommand COMMANDS[] = {
    {"info", lowp_cli_info, "library version, devices, backends and their capabilities"},
    {"cast", lowp_cli_cast, "encode a float32 .npy into element codes, or decode them back"},
    {"demo", lowp_cli_demo, "a few values in every format, and stochastic rounding"},
    {"quantize", lowp_cli_quantize, "quantize a 2-D float32 .npy: element codes and scales"},
    {"dequantize", lowp_cli_dequantize, "decode the files of `lowp quantize` back to float32"},
    {"gemm", lowp_cli_gemm, "C = A.B^T of two float32 .npy operands, quantized (grouped: --offs)"},
    {"train", lowp_cli_train, "train the MoE model on text with a recipe; checkpoints, resume"},
    {"compare", lowp_cli_compare, "train several recipes; markdown report and SVG loss plot"},
};

static const subcommand BENCHMARKS[] = {
    {"cast", lowp_bench_cast, "throughput of lowp_cast per format and kernel path"},
    {"gemm", lowp_bench_gemm, "GEMM GFLOP/s of lowp's kernels beside oneDNN and OpenBLAS"},
    {"quant", lowp_bench_quant, "quantization GB/s per scaling kind beside memcpy"},
    {"train", lowp_bench_train, "training tokens/s and achieved GFLOP/s per recipe and config"},
};

#define COUNT(a) ((int) (sizeof(a) / sizeof((a)[0])))

static void usage(FILE *f) {
    fprintf(f, "usage: lowp COMMAND [ARGS...]\n\ncommands:\n");
    for (int i = 0; i < COUNT(COMMANDS); i++)
        fprintf(f, "  %-18s %s\n", COMMANDS[i].name, COMMANDS[i].summary);
    for (int i = 0; i < COUNT(BENCHMARKS); i++) {
        char name[64];
        snprintf(name, sizeof name, "bench %s", BENCHMARKS[i].name);
        fprintf(f, "  %-18s %s\n", name, BENCHMARKS[i].summary);
    }
    fprintf(f, "  %-18s %s\n", "help", "this text");
    fprintf(f, "  %-18s %s\n", "--version", "the version of lowp");
    fprintf(f, "\nRun `lowp COMMAND --help` for the options of a command.\n"
               "Exit status: 0 success, 2 bad usage or bad input file, 1 any other failure.\n");
}

static const subcommand *find(const subcommand *table, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(table[i].name, name) == 0) return &table[i];
    return NULL;
}

static void list_names(FILE *f, const subcommand *table, int n) {
    for (int i = 0; i < n; i++) fprintf(f, "%s%s", i ? ", " : "", table[i].name);
}

static int bench(int argc, char **argv) {
    if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
                      strcmp(argv[1], "help") == 0)) {
        printf("usage: lowp bench NAME [OPTIONS]   (`lowp bench NAME --help` for its options)\n\n");
        for (int i = 0; i < COUNT(BENCHMARKS); i++)
            printf("  %-8s %s\n", BENCHMARKS[i].name, BENCHMARKS[i].summary);
        return 0;
    }
    if (argc < 2) {
        fprintf(stderr, "lowp bench: missing benchmark name (one of ");
        list_names(stderr, BENCHMARKS, COUNT(BENCHMARKS));
        fprintf(stderr, ")\n");
        return 2;
    }
    const subcommand *b = find(BENCHMARKS, COUNT(BENCHMARKS), argv[1]);
    if (!b) {
        fprintf(stderr, "lowp bench: unknown benchmark '%s' (one of ", argv[1]);
        list_names(stderr, BENCHMARKS, COUNT(BENCHMARKS));
        fprintf(stderr, ")\n");
        return 2;
    }
    return b->run(argc - 1, argv + 1);
}

/* The OpenMP wait policy is the runtime's default (with libgomp: spin about 300,000 times,
 * then sleep) or what the environment sets. The tool cannot choose it: libgomp reads it in its
 * own initializer, before main, and libc's initializer resets the environment that an
 * executable's .preinit_array could have changed. A setenv here, as this tool did until the
 * twelfth session, changed nothing (OMP_DISPLAY_ENV=verbose shows GOMP_SPINCOUNT). Measured
 * on a 2-core machine (docs/bench-log/train-step.md): the default is about 8% faster than
 * OMP_WAIT_POLICY=passive on an idle machine, and passive 1.1-1.4x faster with another
 * process busy on one core. */
int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stdout);
        fprintf(stderr, "lowp: missing command (run `lowp help` for the list)\n");
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
        printf("lowp %s\n", lowp_version());
        return 0;
    }
    if (strcmp(cmd, "bench") == 0) return bench(argc - 1, argv + 1);
    const subcommand *c = find(COMMANDS, COUNT(COMMANDS), cmd);
    if (!c) {
        fprintf(stderr, "lowp: unknown command '%s' (run `lowp help` for the list)\n", cmd);
        return 2;
    }
    return c->run(argc - 1, argv + 1);
}
