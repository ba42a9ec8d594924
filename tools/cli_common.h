/* What every `lowp` subcommand shares: one option parser, one way to print an error, one map
 * from a library status to the exit status, and the integers of the small flat JSON files the
 * tool writes (`lowp quantize`'s OUT.json; their strings: lowp_json_find in src/io/json.h).
 *
 *   typedef struct my_opts { int64_t steps; const char *out; int verbose; } my_opts;
 *   static const lowp_cli_opt OPTS[] = {
 *       LOWP_CLI_INT("--steps", my_opts, steps, 1, INT32_MAX),
 *       LOWP_CLI_STR("--out", my_opts, out),
 *       LOWP_CLI_FLAG("--verbose", my_opts, verbose),
 *   };
 *   my_opts o = {0};
 *   lowp_cli_args a = {"mycmd", USAGE, OPTS, 3, &o};
 *   int rc = lowp_cli_parse(&a, argc, argv);   // -1: go on; else the exit status
 *   if (rc >= 0) return rc;
 *   ... a.seen[k] marks OPTS[k] given; a.pos[0 .. a.npos-1] are the positional arguments ...
 *
 * Options are `--name VALUE` or `--name=VALUE`; flags take no value; `--` ends the options;
 * `-h` and `--help` print the usage (on stdout) and give exit status 0. Every failure prints
 * one line "lowp CMD: ..." on stderr that names the option and the value, and gives 2.
 */
#ifndef LOWP_TOOLS_CLI_COMMON_H
#define LOWP_TOOLS_CLI_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "lowp/status.h"

#if defined(__GNUC__)
#define LOWP_CLI_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define LOWP_CLI_PRINTF(a, b)
#endif

/* "lowp CMD: message\n" on stderr. */
void lowp_cli_error(const char *cmd, const char *fmt, ...) LOWP_CLI_PRINTF(2, 3);
/* lowp_cli_error(cmd, fmt, ...) and return `status` (for `return lowp_cli_fail(cmd, 2, ...)`). */
int lowp_cli_fail(const char *cmd, int status, const char *fmt, ...) LOWP_CLI_PRINTF(3, 4);

/* The exit status for a library failure: 2 when the input was at fault (a bad argument or
 * file: INVALID_ARG, CORRUPT, VERSION, IO, NOT_FOUND, UNSUPPORTED), 1 for anything else. */
int lowp_cli_exit_status(lowp_status st);
/* Prints lowp_last_error() as one line and returns lowp_cli_exit_status(st). */
int lowp_cli_lib_fail(const char *cmd, lowp_status st);

typedef enum lowp_cli_kind {
    LOWP_CLI_KIND_INT,   /* int64_t field, decimal, in [lo, hi] */
    LOWP_CLI_KIND_I32,   /* int32_t field, decimal, in [lo, hi] */
    LOWP_CLI_KIND_U64,   /* uint64_t field, decimal or 0x-hexadecimal */
    LOWP_CLI_KIND_FLOAT, /* float field, finite, >= lo */
    LOWP_CLI_KIND_STR,   /* const char * field (points into argv) */
    LOWP_CLI_KIND_FLAG,  /* int field set to 1; takes no value */
} lowp_cli_kind;

typedef struct lowp_cli_opt {
    const char *name; /* "--steps" */
    lowp_cli_kind kind;
    size_t off; /* of the field in the caller's struct */
    long long lo, hi;
} lowp_cli_opt;

#define LOWP_CLI_INT(name, type, field, lo, hi)                                                    \
    { name, LOWP_CLI_KIND_INT, offsetof(type, field), lo, hi }
#define LOWP_CLI_I32(name, type, field, lo, hi)                                                    \
    { name, LOWP_CLI_KIND_I32, offsetof(type, field), lo, hi }
#define LOWP_CLI_U64(name, type, field)                                                            \
    { name, LOWP_CLI_KIND_U64, offsetof(type, field), 0, 0 }
#define LOWP_CLI_FLOAT(name, type, field, lo)                                                      \
    { name, LOWP_CLI_KIND_FLOAT, offsetof(type, field), lo, 0 }
#define LOWP_CLI_STR(name, type, field)                                                            \
    { name, LOWP_CLI_KIND_STR, offsetof(type, field), 0, 0 }
#define LOWP_CLI_FLAG(name, type, field)                                                           \
    { name, LOWP_CLI_KIND_FLAG, offsetof(type, field), 0, 0 }

#define LOWP_CLI_MAX_OPTS 64
#define LOWP_CLI_MAX_POS  8

typedef struct lowp_cli_args {
    const char *cmd;          /* "train": messages start "lowp train: " */
    const char *usage;        /* printed for --help */
    const lowp_cli_opt *opts; /* [nopts] */
    int nopts;
    void *dst; /* the struct the offsets point into */
    /* filled by lowp_cli_parse */
    int seen[LOWP_CLI_MAX_OPTS];
    const char *pos[LOWP_CLI_MAX_POS];
    int npos;
} lowp_cli_args;

/* Parse argv[1 .. argc-1]. Returns -1 when the command should go on, else the exit status
 * (0 after --help, 2 after a message on stderr). At most LOWP_CLI_MAX_POS positional arguments
 * are accepted; the caller checks how many it wants. */
int lowp_cli_parse(lowp_cli_args *a, int argc, char **argv);
/* Whether the option called `name` was given. */
int lowp_cli_given(const lowp_cli_args *a, const char *name);
/* A decimal or 0x-hexadecimal unsigned integer, the whole string: 1 on success. */
int lowp_cli_parse_u64(const char *s, uint64_t *out);

/* The flat JSON object files the tool writes (OUT.json, the training log's lines): the value
 * of "key" at the top level as a non-negative decimal integer: 1 on success. For other values,
 * lowp_json_find (src/io/json.h). */
int lowp_cli_json_int(const char *text, const char *key, int64_t *out);
/* The whole text file at `path` (at most max_bytes), NUL-terminated and malloc'd; NULL with one
 * line in err on failure. */
char *lowp_cli_read_text(const char *path, size_t max_bytes, char *err, size_t err_size);

/* "PREFIX" + "SUFFIX" in a malloc'd string (NULL when out of memory). */
char *lowp_cli_join(const char *prefix, const char *suffix);

#endif
