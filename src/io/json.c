/* The io layer's JSON reader (json.h): tokens for the safetensors header parser, and the
 * flat-object lookup of the `lowp` tool. */
#include "io/json.h"

#include <stdlib.h>
#include <string.h>

/* ---- UTF-8 ---- */

size_t lowp_json_utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    uint32_t cp, min;
    if ((c & 0xE0) == 0xC0)
        len = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0)
        len = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0)
        len = 4, cp = c & 0x07, min = 0x10000;
    else
        return 0;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

/* ---- Tokens ---- */

lowp_status lowp_json_fail(const lowp_json *j, const char *why) {
    return lowp_fail(LOWP_ERR_CORRUPT, "%s: %s: malformed %s: %s at byte %zu", j->fn, j->src,
                     j->what, why, j->i);
}

void lowp_json_ws(lowp_json *p) {
    while (p->i < p->n &&
           (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

int lowp_json_peek(lowp_json *p, unsigned char c) {
    lowp_json_ws(p);
    return p->i < p->n && p->s[p->i] == c;
}

int lowp_json_eat(lowp_json *p, unsigned char c) {
    if (!lowp_json_peek(p, c)) return 0;
    p->i++;
    return 1;
}

static int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int read_hex4(lowp_json *p, uint32_t *out) {
    if (p->n - p->i < 4) return 0;
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexval(p->s[p->i + (size_t) k]);
        if (h < 0) return 0;
        v = (v << 4) | (uint32_t) h;
    }
    p->i += 4;
    *out = v;
    return 1;
}

static void put_utf8(char *o, size_t *k, uint32_t cp) {
    if (cp < 0x80) {
        o[(*k)++] = (char) cp;
    } else if (cp < 0x800) {
        o[(*k)++] = (char) (0xC0 | (cp >> 6));
        o[(*k)++] = (char) (0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        o[(*k)++] = (char) (0xE0 | (cp >> 12));
        o[(*k)++] = (char) (0x80 | ((cp >> 6) & 0x3F));
        o[(*k)++] = (char) (0x80 | (cp & 0x3F));
    } else {
        o[(*k)++] = (char) (0xF0 | (cp >> 18));
        o[(*k)++] = (char) (0x80 | ((cp >> 12) & 0x3F));
        o[(*k)++] = (char) (0x80 | ((cp >> 6) & 0x3F));
        o[(*k)++] = (char) (0x80 | (cp & 0x3F));
    }
}

/* The escape after a backslash (the cursor just past it), decoded into o[*k ..] when o is not
 * NULL: a \u escape takes 6 bytes (12 for a pair) and decodes to at most 4. */
static lowp_status read_escape(lowp_json *p, char *o, size_t *k) {
    if (p->i >= p->n) return lowp_json_fail(p, "unterminated escape");
    unsigned char e = p->s[p->i++];
    char simple = 0;
    switch (e) {
    case '"': simple = '"'; break;
    case '\\': simple = '\\'; break;
    case '/': simple = '/'; break;
    case 'b': simple = '\b'; break;
    case 'f': simple = '\f'; break;
    case 'n': simple = '\n'; break;
    case 'r': simple = '\r'; break;
    case 't': simple = '\t'; break;
    case 'u': break;
    default: return lowp_json_fail(p, "bad escape in a string");
    }
    if (simple) {
        if (o) o[(*k)++] = simple;
        return LOWP_OK;
    }
    uint32_t cp;
    if (!read_hex4(p, &cp)) return lowp_json_fail(p, "bad \\u escape");
    if (cp >= 0xDC00 && cp <= 0xDFFF) return lowp_json_fail(p, "lone low surrogate");
    if (cp >= 0xD800 && cp <= 0xDBFF) {
        uint32_t lo;
        if (p->n - p->i < 2 || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u')
            return lowp_json_fail(p, "lone high surrogate");
        p->i += 2;
        if (!read_hex4(p, &lo) || lo < 0xDC00 || lo > 0xDFFF)
            return lowp_json_fail(p, "bad surrogate pair");
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    }
    if (cp == 0) return lowp_json_fail(p, "\\u0000 in a string");
    if (o) put_utf8(o, k, cp);
    return LOWP_OK;
}

/* The string's bytes after the opening quote, up to and past the closing one, checked and
 * decoded into o (when not NULL; *k bytes). */
static lowp_status read_chars(lowp_json *p, char *o, size_t *k) {
    for (;;) {
        if (p->i >= p->n) return lowp_json_fail(p, "unterminated string");
        unsigned char c = p->s[p->i];
        if (c == '"') {
            p->i++;
            return LOWP_OK;
        }
        if (c < 0x20) return lowp_json_fail(p, "control character in a string");
        if (c == '\\') {
            p->i++;
            lowp_status st = read_escape(p, o, k);
            if (st != LOWP_OK) return st;
            continue;
        }
        size_t len = lowp_json_utf8_seq(p->s + p->i, p->n - p->i);
        if (!len) return lowp_json_fail(p, "invalid UTF-8");
        if (o) memcpy(o + *k, p->s + p->i, len), *k += len;
        p->i += len;
    }
}

lowp_status lowp_json_string(lowp_json *p, char **out) {
    if (!lowp_json_eat(p, '"')) return lowp_json_fail(p, "expected a string");
    /* The decoded string is never longer than its encoding. */
    size_t start = p->i;
    char *o = NULL;
    size_t k = 0;
    if (out) {
        size_t end = start;
        while (end < p->n && p->s[end] != '"') end += (p->s[end] == '\\') ? 2 : 1;
        size_t cap = (end > p->n ? p->n : end) - start + 1;
        o = malloc(cap);
        if (!o) return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: out of memory", p->fn);
    }
    lowp_status st = read_chars(p, o, &k);
    if (st != LOWP_OK) {
        free(o);
        return st;
    }
    if (o) {
        o[k] = '\0';
        *out = o;
    }
    return LOWP_OK;
}

lowp_status lowp_json_uint(lowp_json *p, uint64_t *out) {
    lowp_json_ws(p);
    if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9')
        return lowp_json_fail(p, "expected a non-negative integer");
    if (p->s[p->i] == '0' && p->i + 1 < p->n && p->s[p->i + 1] >= '0' && p->s[p->i + 1] <= '9')
        return lowp_json_fail(p, "leading zero in a number");
    uint64_t v = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        unsigned d = p->s[p->i] - '0';
        if (v > (UINT64_MAX - d) / 10) return lowp_json_fail(p, "integer too large");
        v = v * 10 + d;
        p->i++;
    }
    if (p->i < p->n && (p->s[p->i] == '.' || p->s[p->i] == 'e' || p->s[p->i] == 'E'))
        return lowp_json_fail(p, "expected an integer");
    *out = v;
    return LOWP_OK;
}

lowp_status lowp_json_skip(lowp_json *p, int depth) {
    if (depth > LOWP_JSON_MAX_DEPTH) return lowp_json_fail(p, "nesting too deep");
    lowp_json_ws(p);
    if (p->i >= p->n) return lowp_json_fail(p, "expected a value");
    unsigned char c = p->s[p->i];
    lowp_status st;
    if (c == '"') return lowp_json_string(p, NULL);
    if (c == '{' || c == '[') {
        unsigned char close = c == '{' ? '}' : ']';
        p->i++;
        if (lowp_json_eat(p, close)) return LOWP_OK;
        for (;;) {
            if (c == '{') {
                if ((st = lowp_json_string(p, NULL)) != LOWP_OK) return st;
                if (!lowp_json_eat(p, ':')) return lowp_json_fail(p, "expected ':'");
            }
            if ((st = lowp_json_skip(p, depth + 1)) != LOWP_OK) return st;
            if (lowp_json_eat(p, ',')) continue;
            if (lowp_json_eat(p, close)) return LOWP_OK;
            return lowp_json_fail(p, c == '{' ? "expected ',' or '}'" : "expected ',' or ']'");
        }
    }
    static const char *const words[] = {"true", "false", "null"};
    for (int w = 0; w < 3; w++) {
        size_t wl = strlen(words[w]);
        if (p->n - p->i >= wl && memcmp(p->s + p->i, words[w], wl) == 0) {
            p->i += wl;
            return LOWP_OK;
        }
    }
    /* A number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
    size_t i = p->i;
    if (i < p->n && p->s[i] == '-') i++;
    if (i >= p->n || p->s[i] < '0' || p->s[i] > '9') return lowp_json_fail(p, "expected a value");
    if (p->s[i] == '0')
        i++;
    else
        while (i < p->n && p->s[i] >= '0' && p->s[i] <= '9') i++;
    if (i < p->n && p->s[i] == '.') {
        i++;
        if (i >= p->n || p->s[i] < '0' || p->s[i] > '9') return lowp_json_fail(p, "bad number");
        while (i < p->n && p->s[i] >= '0' && p->s[i] <= '9') i++;
    }
    if (i < p->n && (p->s[i] == 'e' || p->s[i] == 'E')) {
        i++;
        if (i < p->n && (p->s[i] == '+' || p->s[i] == '-')) i++;
        if (i >= p->n || p->s[i] < '0' || p->s[i] > '9') return lowp_json_fail(p, "bad number");
        while (i < p->n && p->s[i] >= '0' && p->s[i] <= '9') i++;
    }
    p->i = i;
    return LOWP_OK;
}

/* ---- Flat objects ---- */

/* The bare token at the cursor (a number, true, false, null), as written: the bytes up to a
 * delimiter, like the tool's files have always been read. 0 when empty or it does not fit. */
static int bare_token(lowp_json *p, char *out, size_t size) {
    size_t n = 0;
    int fits = 1;
    while (p->i < p->n) {
        unsigned char c = p->s[p->i];
        if (c == ',' || c == '}' || c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == '"')
            break;
        if (n + 1 < size)
            out[n++] = (char) c;
        else
            fits = 0;
        p->i++;
    }
    out[n] = '\0';
    return n > 0 && fits;
}

int lowp_json_find(const char *text, const char *key, char *out, size_t size) {
    if (size == 0) return 0;
    lowp_json j = {
        (const unsigned char *) text, strlen(text), 0, "lowp_json_find", "<text>", "JSON"};
    if (!lowp_json_eat(&j, '{') || lowp_json_peek(&j, '}')) return 0;
    for (;;) {
        char *k = NULL;
        if (lowp_json_string(&j, &k) != LOWP_OK) return 0;
        const int match = strcmp(k, key) == 0;
        free(k);
        if (!lowp_json_eat(&j, ':')) return 0;
        lowp_json_ws(&j);
        if (match) {
            if (lowp_json_peek(&j, '"')) {
                char *v = NULL;
                if (lowp_json_string(&j, &v) != LOWP_OK) return 0;
                const size_t vl = strlen(v);
                if (vl < size) memcpy(out, v, vl + 1);
                free(v);
                return vl < size;
            }
            if (lowp_json_peek(&j, '{') || lowp_json_peek(&j, '[')) return 0;
            return bare_token(&j, out, size);
        }
        if (lowp_json_peek(&j, '"') || lowp_json_peek(&j, '{') || lowp_json_peek(&j, '[')) {
            if (lowp_json_skip(&j, 1) != LOWP_OK) return 0;
        } else {
            char skip[2];
            size_t at = j.i;
            bare_token(&j, skip, sizeof skip);
            if (j.i == at) return 0;
        }
        if (!lowp_json_eat(&j, ',')) return 0;
    }
}
