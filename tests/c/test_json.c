/* The io layer's JSON reader (src/io/json.c): lowp_json_find, the flat-object lookup the
 * `lowp` tool reads OUT.json with, and the tokens the safetensors header parser is built on
 * (test_safetensors.c tests that parser's messages and refusals). */
#include <string.h>

#include "io/json.h"
#include "testutil.h"

static int found(const char *text, const char *key, const char *want) {
    char v[16];
    return lowp_json_find(text, key, v, sizeof v) == 1 && strcmp(v, want) == 0;
}
static int absent(const char *text, const char *key) {
    char v[16];
    return lowp_json_find(text, key, v, sizeof v) == 0;
}

static void test_find(void) {
    const char *t = "{\n  \"format\": \"e4m3\",\n  \"pow2\": null,\n  \"eps\": 1e-12,\n"
                    "  \"rows\": 3,\n  \"nested\": {\"rows\": 9, \"a\": [1, {\"b\": \"}\"}]},\n"
                    "  \"cols\": 17\n}\n";
    CHECK(found(t, "format", "e4m3"));
    CHECK(found(t, "pow2", "null"));
    CHECK(found(t, "eps", "1e-12"));
    CHECK(found(t, "rows", "3"));
    CHECK(found(t, "cols", "17")); /* after a nested object, skipped whole */
    CHECK(absent(t, "nested"));    /* an object is not a flat value */
    CHECK(absent(t, "b"));         /* keys only at the top level */
    CHECK(absent(t, "row"));       /* keys match whole */
    CHECK(absent(t, "rowsx"));
    CHECK(absent(t, ""));
    /* Escapes are decoded, in keys and values. */
    CHECK(found("{\"k\\u0065y\": \"a\\\"b\\n\\u00e9\"}", "key", "a\"b\n\xc3\xa9"));
    /* A value that does not fit is refused, not cut. */
    CHECK(absent("{\"k\": \"0123456789abcdef\"}", "k"));
    CHECK(found("{\"k\": \"0123456789abcde\"}", "k", "0123456789abcde"));
    /* Malformed up to the key: not found. */
    CHECK(absent("", "k"));
    CHECK(absent("{}", "k"));
    CHECK(absent("[\"k\", 1]", "k"));
    CHECK(absent("{\"a\": , \"k\": 1}", "k"));
    CHECK(absent("{\"a\": 1 \"k\": 1}", "k"));
    CHECK(absent("{\"a\": \"\\x\", \"k\": 1}", "k"));
    CHECK(absent("{\"a\": \"\xff\", \"k\": 1}", "k"));
    CHECK(absent("{\"k\" 1}", "k"));
    /* What follows the key's value is not read. */
    CHECK(found("{\"k\": 5, oops", "k", "5"));
    char z[1];
    CHECK(lowp_json_find("{\"k\": 5}", "k", z, 0) == 0);
}

static void test_tokens(void) {
    const char *text = " [\"a\\ud83d\\ude00\", 18446744073709551615, 01, {\"x\": [true]}] ";
    lowp_json j = {(const unsigned char *) text, strlen(text), 0, "fn", "src", "thing"};
    CHECK(lowp_json_eat(&j, '['));
    char *s = NULL;
    CHECK_OK(lowp_json_string(&j, &s));
    CHECK(s && strcmp(s, "a\xf0\x9f\x98\x80") == 0);
    free(s);
    CHECK(lowp_json_eat(&j, ','));
    uint64_t u = 0;
    CHECK_OK(lowp_json_uint(&j, &u));
    CHECK(u == UINT64_MAX);
    CHECK(lowp_json_eat(&j, ','));
    CHECK_FAIL(lowp_json_uint(&j, &u), LOWP_ERR_CORRUPT, "fn: src: malformed thing: leading zero");
    j.i += 2;
    CHECK(lowp_json_eat(&j, ','));
    CHECK_OK(lowp_json_skip(&j, 1));
    CHECK(lowp_json_eat(&j, ']'));
    lowp_json_ws(&j);
    CHECK(j.i == j.n);
    /* Nesting deeper than LOWP_JSON_MAX_DEPTH is refused. */
    char deep[2 * LOWP_JSON_MAX_DEPTH + 8];
    size_t n = 0;
    for (int d = 0; d <= LOWP_JSON_MAX_DEPTH; d++) deep[n++] = '[';
    for (int d = 0; d <= LOWP_JSON_MAX_DEPTH; d++) deep[n++] = ']';
    lowp_json k = {(const unsigned char *) deep, n, 0, "fn", "src", "thing"};
    CHECK_FAIL(lowp_json_skip(&k, 1), LOWP_ERR_CORRUPT, "nesting too deep");
}

int main(void) {
    test_find();
    test_tokens();
    return testutil_finish();
}
