/* A strict JSON reader of the io layer (src/io/json.c): a cursor over a byte buffer that
 * reads one token at a time (RFC 8259: UTF-8 checked, escapes and surrogate pairs decoded,
 * numbers checked). The safetensors header parser (src/io/safetensors.c) walks its header
 * with it, and the `lowp` tool (tools/cli_common.c) finds the keys of its small JSON files
 * with lowp_json_find. Not installed.
 *
 *   lowp_json j = {text, len, 0, "lowp_safetensors_read", path, "header"};
 *   if (!lowp_json_eat(&j, '{')) return lowp_json_fail(&j, "expected '{'");
 *   char *key;
 *   lowp_status st = lowp_json_string(&j, &key);   // malloc'd, NUL-terminated
 *
 * Failures are LOWP_ERR_CORRUPT with "FN: SRC: malformed WHAT: <why> at byte I" (out of memory
 * is LOWP_ERR_OUT_OF_MEMORY, "FN: out of memory"). */
#ifndef LOWP_IO_JSON_H
#define LOWP_IO_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"

/* How deep lowp_json_skip follows nested arrays and objects. */
#define LOWP_JSON_MAX_DEPTH 64

typedef struct lowp_json {
    const unsigned char *s; /* the text, s[0 .. n-1] (need not be NUL-terminated) */
    size_t n, i;            /* its length, and the cursor */
    const char *fn;         /* the public function, for messages */
    const char *src;        /* the file's path (or "<memory>"), for messages */
    const char *what;       /* what the text is ("header"), for messages */
} lowp_json;

/* Length of the valid UTF-8 sequence at s[0 .. n-1] (n >= 1), or 0 when it is not one
 * (overlong forms, surrogates and code points above U+10FFFF are invalid, RFC 3629). */
LOWP_HIDDEN size_t lowp_json_utf8_seq(const unsigned char *s, size_t n);

/* LOWP_ERR_CORRUPT with the message above, the cursor's offset as the byte. */
LOWP_HIDDEN lowp_status lowp_json_fail(const lowp_json *j, const char *why);
/* Skip white space. */
LOWP_HIDDEN void lowp_json_ws(lowp_json *j);
/* After white space, whether the next byte is c (lowp_json_eat also consumes it). */
LOWP_HIDDEN int lowp_json_peek(lowp_json *j, unsigned char c);
LOWP_HIDDEN int lowp_json_eat(lowp_json *j, unsigned char c);
/* A string; *out (malloc'd, NUL-terminated, decoded) when out is not NULL. A string holding
 * "\u0000" is refused: names and values are C strings here. */
LOWP_HIDDEN lowp_status lowp_json_string(lowp_json *j, char **out);
/* A non-negative integer without sign, fraction or exponent. */
LOWP_HIDDEN lowp_status lowp_json_uint(lowp_json *j, uint64_t *out);
/* Any value, checked and skipped; `depth` is the nesting of the value (1 inside the
 * top-level object). */
LOWP_HIDDEN lowp_status lowp_json_skip(lowp_json *j, int depth);

/* The top-level object of a small, flat JSON text (NUL-terminated): the value of "key" as a
 * decoded string without its quotes, or the bare token (number, true, false, null) as
 * written, in out[0 .. size-1]. Returns 1 when found and it fits, 0 when the key is absent,
 * the value is an array or object or does not fit, or the text up to the key is malformed
 * (what follows the key's value is not read). Keys match whole: "rows" is not "nrows". */
LOWP_HIDDEN int lowp_json_find(const char *text, const char *key, char *out, size_t size);

#endif
