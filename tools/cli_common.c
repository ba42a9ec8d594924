/* The shared pieces of the `lowp` subcommands (cli_common.h): the option parser, the error
 * printer, the status-to-exit map and the flat JSON reader. */
#include "cli_common.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"
#include "lowp/lowp.h"

static void verror(const char *cmd, const char *fmt, va_list ap) {
    fprintf(stderr, "lowp %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

void lowp_cli_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    verror(cmd, fmt, ap);
    va_end(ap);
}

int lowp_cli_fail(const char *cmd, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    verror(cmd, fmt, ap);
    va_end(ap);
    return status;
}

int lowp_cli_exit_status(lowp_status st) {
    switch (st) {
    case LOWP_ERR_INVALID_ARG:
    case LOWP_ERR_UNSUPPORTED:
    case LOWP_ERR_CORRUPT:
    case LOWP_ERR_VERSION:
    case LOWP_ERR_IO:
    case LOWP_ERR_NOT_FOUND: return 2;
    default: return 1;
    }
}

int lowp_cli_lib_fail(const char *cmd, lowp_status st) {
    lowp_cli_error(cmd, "%s", lowp_last_error());
    return lowp_cli_exit_status(st);
}

int lowp_cli_parse_u64(const char *s, uint64_t *out) {
    if (!s || !*s || *s == '-' || *s == '+' || *s == ' ') return 0;
    int base = 10;
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        base = 16;
        s += 2;
        if (!*s) return 0;
    }
    for (const char *p = s; *p; p++) {
        int ok = base == 16 ? ((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f') ||
                               (*p >= 'A' && *p <= 'F'))
                            : (*p >= '0' && *p <= '9');
        if (!ok) return 0;
    }
    errno = 0;
    unsigned long long v = strtoull(s, NULL, base);
    if (errno == ERANGE) return 0;
    *out = (uint64_t) v;
    return 1;
}

static int parse_int(const char *s, long long lo, long long hi, long long *out) {
    if (!s || !*s || *s == ' ' || *s == '+') return 0;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end || errno || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

/* Store `val` into option k's field; 2 after a message, else -1. */
static int store(const lowp_cli_args *a, int k, const char *val) {
    const lowp_cli_opt *o = &a->opts[k];
    char *field = (char *) a->dst + o->off;
    long long v;
    switch (o->kind) {
    case LOWP_CLI_KIND_INT:
    case LOWP_CLI_KIND_I32:
        if (!parse_int(val, o->lo, o->hi, &v))
            return lowp_cli_fail(a->cmd, 2, "%s: '%s' is not an integer from %lld to %lld", o->name,
                                 val, o->lo, o->hi);
        if (o->kind == LOWP_CLI_KIND_INT)
            *(int64_t *) field = (int64_t) v;
        else
            *(int32_t *) field = (int32_t) v;
        return -1;
    case LOWP_CLI_KIND_U64:
        if (!lowp_cli_parse_u64(val, (uint64_t *) field))
            return lowp_cli_fail(a->cmd, 2, "%s: '%s' is not an unsigned 64-bit integer", o->name,
                                 val);
        return -1;
    case LOWP_CLI_KIND_FLOAT: {
        char *end;
        errno = 0;
        float x = strtof(val, &end);
        if (!*val || *end || errno == ERANGE || !isfinite(x) || x < (float) o->lo)
            return lowp_cli_fail(a->cmd, 2, "%s: '%s' is not a finite number >= %lld", o->name, val,
                                 o->lo);
        *(float *) field = x;
        return -1;
    }
    case LOWP_CLI_KIND_STR: *(const char **) field = val; return -1;
    case LOWP_CLI_KIND_FLAG: *(int *) field = 1; return -1;
    }
    return -1;
}

int lowp_cli_parse(lowp_cli_args *a, int argc, char **argv) {
    memset(a->seen, 0, sizeof a->seen);
    a->npos = 0;
    int options_done = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (options_done || arg[0] != '-' || arg[1] == '\0') {
            if (a->npos == LOWP_CLI_MAX_POS)
                return lowp_cli_fail(a->cmd, 2, "too many arguments: '%s'", arg);
            a->pos[a->npos++] = arg;
            continue;
        }
        if (strcmp(arg, "--") == 0) {
            options_done = 1;
            continue;
        }
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            fputs(a->usage, stdout);
            return 0;
        }
        const char *eq = strchr(arg, '=');
        size_t nlen = eq ? (size_t) (eq - arg) : strlen(arg);
        int k = -1;
        for (int j = 0; j < a->nopts && j < LOWP_CLI_MAX_OPTS; j++)
            if (strlen(a->opts[j].name) == nlen && strncmp(arg, a->opts[j].name, nlen) == 0) k = j;
        if (k < 0)
            return lowp_cli_fail(a->cmd, 2, "unknown option '%.*s' (see `lowp %s --help`)",
                                 (int) (nlen > 64 ? 64 : nlen), arg, a->cmd);
        const char *name = a->opts[k].name;
        if (a->seen[k]) return lowp_cli_fail(a->cmd, 2, "%s given twice", name);
        a->seen[k] = 1;
        const char *val = NULL;
        if (a->opts[k].kind == LOWP_CLI_KIND_FLAG) {
            if (eq) return lowp_cli_fail(a->cmd, 2, "%s takes no value", name);
        } else if (eq) {
            val = eq + 1;
        } else if (i + 1 < argc) {
            val = argv[++i];
        } else {
            return lowp_cli_fail(a->cmd, 2, "%s needs a value", name);
        }
        int rc = store(a, k, val);
        if (rc >= 0) return rc;
    }
    return -1;
}

int lowp_cli_given(const lowp_cli_args *a, const char *name) {
    for (int j = 0; j < a->nopts && j < LOWP_CLI_MAX_OPTS; j++)
        if (strcmp(a->opts[j].name, name) == 0) return a->seen[j];
    return 0;
}

/* ---- Flat JSON (the io layer's reader, src/io/json.c) ---- */

int lowp_cli_json_int(const char *text, const char *key, int64_t *out) {
    char v[32];
    long long x;
    if (!lowp_json_find(text, key, v, sizeof v) || !parse_int(v, 0, INT64_MAX, &x)) return 0;
    *out = (int64_t) x;
    return 1;
}

char *lowp_cli_read_text(const char *path, size_t max_bytes, char *err, size_t err_size) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, err_size, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = malloc(max_bytes + 1);
    size_t n = buf ? fread(buf, 1, max_bytes, f) : 0;
    const int big = buf && n == max_bytes && fgetc(f) != EOF;
    fclose(f);
    if (!buf) {
        snprintf(err, err_size, "%s: out of memory", path);
        return NULL;
    }
    if (big) {
        free(buf);
        snprintf(err, err_size, "%s: larger than %zu bytes", path, max_bytes);
        return NULL;
    }
    buf[n] = '\0';
    if (memchr(buf, '\0', n)) {
        free(buf);
        snprintf(err, err_size, "%s: not a text file (holds a NUL byte)", path);
        return NULL;
    }
    return buf;
}

char *lowp_cli_join(const char *prefix, const char *suffix) {
    size_t a = strlen(prefix), b = strlen(suffix);
    char *s = malloc(a + b + 1);
    if (s) {
        memcpy(s, prefix, a);
        memcpy(s + a, suffix, b + 1);
    }
    return s;
}
