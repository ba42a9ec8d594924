/* Tests of the device layer: the registry, the CPU backend and its capabilities, the plugin
 * loader (with the asynchronous "testdev" plugin and the wrong-version "badver" one), memory
 * and copies across devices, per-device synchronization, and argument errors.
 *
 * ctest passes the plugins' paths in LOWP_TEST_PLUGIN and LOWP_TEST_PLUGIN_BADVER. The
 * registry reads LOWP_BACKEND_PATH once per process, so those tests run in a child process:
 * this program re-executes itself with --child-env (or --child-cpu-disable for
 * LOWP_CPU_DISABLE) and a prepared environment. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/internal.h"
#include "lowp/lowp.h"

extern char **environ;

static int g_pass, g_fail;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (cond) {                                                                                \
            g_pass++;                                                                              \
        } else {                                                                                   \
            g_fail++;                                                                              \
            fprintf(stderr, "FAIL %s:%d: %s (last error: \"%s\")\n", __FILE__, __LINE__, #cond,    \
                    lowp_last_error());                                                            \
        }                                                                                          \
    } while (0)

/* A call that must fail with `want` and leave a message. */
#define CHECK_FAIL(call, want)                                                                     \
    do {                                                                                           \
        lowp_clear_error();                                                                        \
        lowp_status got_ = (call);                                                                 \
        if (got_ == (want) && lowp_last_error()[0]) {                                              \
            g_pass++;                                                                              \
        } else {                                                                                   \
            g_fail++;                                                                              \
            fprintf(stderr, "FAIL %s:%d: %s gave %s, want %s (last error: \"%s\")\n", __FILE__,    \
                    __LINE__, #call, lowp_status_str(got_), lowp_status_str(want),                 \
                    lowp_last_error());                                                            \
        }                                                                                          \
    } while (0)

#define CHECK_OK(call) CHECK((call) == LOWP_OK)
#define ERR_HAS(s)     (strstr(lowp_last_error(), (s)) != NULL)

/* The testdev hooks, from our own dlopen handle of the plugin the library loaded. */
static struct {
    int (*sync_count)(int);
    int (*queued)(int);
    int (*cast_count)(int);
    long (*live_allocs)(int);
    int (*hold)(int, int);
    void (*set_delay_us)(int);
    int (*contexts)(void);
} td;

static void *sym(void *h, const char *name) {
    void *p = dlsym(h, name);
    if (!p) fprintf(stderr, "dlsym %s: %s\n", name, dlerror());
    return p;
}

static int load_hooks(const char *path) {
    /* RTLD_NOLOAD: the handle of the copy the library already loaded, never a second one. */
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (!h) return 0;
        /* POSIX function pointers from void *: copy the bits (ISO C has no such conversion). */
#define HOOK(field, name)                                                                          \
    do {                                                                                           \
        void *p_ = sym(h, name);                                                                   \
        if (!p_) return 0;                                                                         \
        memcpy(&td.field, &p_, sizeof p_);                                                         \
    } while (0)
    HOOK(sync_count, "testdev_sync_count");
    HOOK(queued, "testdev_queued");
    HOOK(cast_count, "testdev_cast_count");
    HOOK(live_allocs, "testdev_live_allocs");
    HOOK(hold, "testdev_hold");
    HOOK(set_delay_us, "testdev_set_delay_us");
    HOOK(contexts, "testdev_contexts");
#undef HOOK
    return 1; /* the handle stays open with the library's */
}

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char) (seed * 131u + i * 7u + (i >> 8));
}

static int all_zero(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

/* ---- CPU --------------------------------------------------------------------------------- */

static void test_cpu(void) {
    int32_t type = -1, count = 0;
    CHECK_OK(lowp_backend_find("cpu", &type));
    CHECK(type == LOWP_DEVICE_CPU);
    CHECK_OK(lowp_device_count(LOWP_DEVICE_CPU, &count));
    CHECK(count == 1);

    lowp_caps caps;
    CHECK_OK(lowp_device_caps(LOWP_DEVICE_HOST, &caps));
    CHECK(caps.name[0] != '\0');
    CHECK(caps.cores >= 1);
    CHECK(caps.mem_bytes > 0);
    CHECK(!(caps.flags & LOWP_CAP_ASYNC_QUEUE));
    /* Derived bits never appear without their base. */
    if (caps.flags &
        (LOWP_CAP_AVX512BW | LOWP_CAP_AVX512VL | LOWP_CAP_AVX512_BF16 | LOWP_CAP_AVX512_FP16))
        CHECK(caps.flags & LOWP_CAP_AVX512F);
    if (caps.flags & (LOWP_CAP_AMX_BF16 | LOWP_CAP_AMX_PERMITTED))
        CHECK(caps.flags & LOWP_CAP_AMX_TILE);
#if defined(__x86_64__) && defined(__GNUC__)
    /* The compiler's own detection (CPUID plus XGETBV) must agree with ours. */
    if (!getenv("LOWP_CPU_DISABLE")) {
        __builtin_cpu_init();
        CHECK(!!(caps.flags & LOWP_CAP_AVX512F) == !!__builtin_cpu_supports("avx512f"));
        CHECK(!!(caps.flags & LOWP_CAP_AVX512BW) == !!__builtin_cpu_supports("avx512bw"));
        CHECK(!!(caps.flags & LOWP_CAP_AVX512VL) == !!__builtin_cpu_supports("avx512vl"));
        CHECK(!!(caps.flags & LOWP_CAP_AVX2) == !!__builtin_cpu_supports("avx2"));
        CHECK(!!(caps.flags & LOWP_CAP_FMA) == !!__builtin_cpu_supports("fma"));
    }
#endif
    char desc[256];
    CHECK_OK(lowp_caps_describe(&caps, desc, sizeof desc));
    CHECK(!!strstr(desc, "avx512f") == !!(caps.flags & LOWP_CAP_AVX512F));
    printf("cpu: %s, %d cores, %llu bytes, flags: %s\n", caps.name, (int) caps.cores,
           (unsigned long long) caps.mem_bytes, desc);

    /* Memory: 64-byte aligned, 0 bytes allowed, copies are immediate. */
    void *a = NULL, *b = NULL, *z = NULL;
    CHECK_OK(lowp_malloc(LOWP_DEVICE_HOST, 1000, &a));
    CHECK_OK(lowp_malloc(LOWP_DEVICE_HOST, 1000, &b));
    CHECK(a && ((uintptr_t) a % 64) == 0);
    CHECK_OK(lowp_malloc(LOWP_DEVICE_HOST, 0, &z));
    CHECK(z != NULL);
    if (a && b) {
        fill(a, 1000, 1);
        memset(b, 0, 1000);
        CHECK_OK(lowp_memcpy(LOWP_DEVICE_HOST, b, LOWP_DEVICE_HOST, a, 1000));
        CHECK(memcmp(a, b, 1000) == 0);
    }
    CHECK_OK(lowp_device_synchronize(LOWP_DEVICE_HOST));
    CHECK_OK(lowp_free(LOWP_DEVICE_HOST, a));
    CHECK_OK(lowp_free(LOWP_DEVICE_HOST, b));
    CHECK_OK(lowp_free(LOWP_DEVICE_HOST, z));
    CHECK_OK(lowp_free(LOWP_DEVICE_HOST, NULL));
}

/* "hg" (MADV_HUGEPAGE) among the VmFlags of the mapping that holds p: 1 yes, 0 no, -1 when
 * /proc/self/smaps cannot tell (not Linux). */
static int advised_huge(const void *p) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[1024];
    int in = 0, found = -1;
    const uintptr_t a = (uintptr_t) p;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) {
            in = a >= lo && a < hi;
        } else if (in && strncmp(line, "VmFlags:", 8) == 0) {
            found = strstr(line, " hg") != NULL;
            break;
        }
    }
    fclose(f);
    return found;
}

/* Whether this kernel gives huge pages to advised regions: THP built in and not "never". */
static int thp_available(void) {
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f) return 0;
    char line[256] = {0};
    const int ok = fgets(line, sizeof line, f) != NULL && strstr(line, "[never]") == NULL;
    fclose(f);
    return ok;
}

/* Large host buffers (issue 14): from 4 MiB up 2 MiB aligned and advised MADV_HUGEPAGE,
 * smaller ones not; LOWP_HUGEPAGES=0 turns the advice off. The data is ordinary memory
 * either way. */
static void test_hugepages(void) {
    const size_t big = (size_t) 8 << 20, small = (size_t) 1 << 20;
    void *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(lowp_malloc(LOWP_DEVICE_HOST, big + 100, &a));
    CHECK_OK(lowp_malloc(LOWP_DEVICE_HOST, small, &b));
    CHECK(a && (uintptr_t) a % ((size_t) 2 << 20) == 0);
    CHECK(b && (uintptr_t) b % 64 == 0);
    if (a) {
        fill(a, big + 100, 7);
        const int h = advised_huge(a);
        if (h >= 0 && thp_available()) CHECK(h == 1);
    }
    setenv("LOWP_HUGEPAGES", "0", 1);
    CHECK_OK(lowp_malloc(LOWP_DEVICE_HOST, big, &c));
    unsetenv("LOWP_HUGEPAGES");
    CHECK(c && (uintptr_t) c % 64 == 0);
    if (c) {
        fill(c, big, 3);
        const int h = advised_huge(c);
        if (h >= 0) CHECK(h == 0);
    }
    CHECK_OK(lowp_free(LOWP_DEVICE_HOST, a));
    CHECK_OK(lowp_free(LOWP_DEVICE_HOST, b));
    CHECK_OK(lowp_free(LOWP_DEVICE_HOST, c));
}

/* The cache of released host blocks (hostmem.c, issue 14): a block lowp_host_free keeps is
 * handed to the next lowp_host_alloc of about its size (at most a quarter smaller) and to no
 * larger or much smaller one; a huge-page request gets a cached block only on a 2 MiB
 * boundary, advised; with LOWP_HUGEPAGES=0 nothing is cached or taken. Off glibc, or with
 * LOWP_HOST_CACHE_MB=0, lowp_host_free frees, so only the sizes and alignments are checked. */
static void test_host_cache(void) {
    const char *env = getenv("LOWP_HOST_CACHE_MB");
#ifdef __GLIBC__
    const int cached = !(env && strcmp(env, "0") == 0) && lowp_hugepages_enabled();
#else
    const int cached = 0;
    (void) env;
#endif
    const size_t n = (size_t) 3 << 20, big = (size_t) 8 << 20;
    lowp_host_empty_cache();
    unsigned char *a = lowp_host_alloc(n);
    CHECK(a && (uintptr_t) a % 64 == 0);
    if (!a) return;
    fill(a, n, 5);
    lowp_host_free(a);
    CHECK(cached ? lowp_host_cache_bytes() >= n : lowp_host_cache_bytes() == 0);
    unsigned char *b = lowp_host_alloc(n - 4096); /* about the size: the cached block */
    CHECK(b && (uintptr_t) b % 64 == 0);
    if (cached) CHECK(b == a);
    fill(b, n - 4096, 6);
    lowp_host_free(b);
    unsigned char *small = lowp_host_alloc(n / 2); /* would waste half of it */
    unsigned char *large = lowp_host_alloc(n + ((size_t) 1 << 20));
    CHECK(small && large && small != b && large != b);
    if (small) fill(small, n / 2, 7);
    if (large) fill(large, n + ((size_t) 1 << 20), 8);
    lowp_host_free(small);
    lowp_host_free(large);
    lowp_host_free(NULL);
    if (cached) CHECK(lowp_host_cache_bytes() >= n);
    lowp_host_empty_cache(); /* the public call: nothing left */
    CHECK(lowp_host_cache_bytes() == 0);

    /* a huge-page block released and asked for again: 2 MiB aligned and advised */
    unsigned char *h = lowp_host_alloc(big);
    CHECK(h && (uintptr_t) h % ((size_t) 2 << 20) == 0);
    if (!h) return;
    fill(h, big, 9);
    lowp_host_free(h);
    unsigned char *h2 = lowp_host_alloc(big - 100);
    CHECK(h2 && (uintptr_t) h2 % ((size_t) 2 << 20) == 0);
    if (cached) CHECK(h2 == h);
    if (h2) {
        fill(h2, big - 100, 10);
        const int adv = advised_huge(h2);
        if (adv >= 0 && thp_available() && lowp_hugepages_enabled()) CHECK(adv == 1);
    }
    lowp_host_free(h2);
    /* without huge pages the cache is not used: a fresh block, not advised */
    setenv("LOWP_HUGEPAGES", "0", 1);
    unsigned char *p = lowp_host_alloc(big - 100);
    CHECK(p && p != h2);
    if (p) {
        fill(p, big - 100, 11);
        if (advised_huge(p) >= 0) CHECK(advised_huge(p) == 0);
    }
    lowp_host_free(p);
    unsigned char *p2 = lowp_host_alloc(big - 100);
    CHECK(p2 && (cached ? p2 != h2 : 1));
    lowp_host_free(p2);
    lowp_host_empty_cache();
    /* a plain block of a huge-page size, released with the advice on, is cached, but a
     * huge-page request does not take it */
    unsigned char *q = lowp_host_alloc(big);
    unsetenv("LOWP_HUGEPAGES");
    CHECK(q != NULL);
    const int q_aligned = q && (uintptr_t) q % ((size_t) 2 << 20) == 0;
    lowp_host_free(q);
    unsigned char *r = lowp_host_alloc(big);
    CHECK(r && (uintptr_t) r % ((size_t) 2 << 20) == 0);
    if (!q_aligned) CHECK(r != q);
    lowp_host_free(r);
    lowp_host_empty_cache();
}

static void test_describe(void) {
    char buf[512];
    lowp_caps c;
    memset(&c, 0, sizeof c);
    CHECK_OK(lowp_caps_describe(&c, buf, sizeof buf));
    CHECK(strcmp(buf, "") == 0);

    c.flags = LOWP_CAP_AVX2 | LOWP_CAP_FMA | LOWP_CAP_ASYNC_QUEUE;
    CHECK_OK(lowp_caps_describe(&c, buf, sizeof buf));
    CHECK(strcmp(buf, "avx2 fma async_queue") == 0);

    c.flags = LOWP_CAP_AVX512F | LOWP_CAP_AVX512BW | LOWP_CAP_AVX512VL | LOWP_CAP_AVX512_BF16 |
              LOWP_CAP_AVX512_FP16 | LOWP_CAP_AMX_TILE | LOWP_CAP_AMX_BF16 |
              LOWP_CAP_AMX_PERMITTED | LOWP_CAP_AVX2 | LOWP_CAP_FMA | LOWP_CAP_ASYNC_QUEUE |
              LOWP_CAP_FP8_MATH | LOWP_CAP_MX_MATH;
    CHECK_OK(lowp_caps_describe(&c, buf, sizeof buf));
    CHECK(strcmp(buf, "avx512f avx512bw avx512vl avx512_bf16 avx512_fp16 amx_tile amx_bf16 "
                      "amx_permitted avx2 fma async_queue fp8_math mx_math") == 0);

    c.flags = 1u << 20; /* no name yet */
    CHECK_OK(lowp_caps_describe(&c, buf, sizeof buf));
    CHECK(strcmp(buf, "bit20") == 0);

    /* Too small: truncated, terminated, and the message says how much is needed. */
    c.flags = LOWP_CAP_AVX2 | LOWP_CAP_FMA;
    char small[6];
    CHECK_FAIL(lowp_caps_describe(&c, small, sizeof small), LOWP_ERR_INVALID_ARG);
    CHECK(strcmp(small, "avx2 ") == 0);
    CHECK(ERR_HAS("needed (9)"));
    CHECK_FAIL(lowp_caps_describe(NULL, buf, sizeof buf), LOWP_ERR_INVALID_ARG);
    CHECK_FAIL(lowp_caps_describe(&c, NULL, sizeof buf), LOWP_ERR_INVALID_ARG);
    CHECK_FAIL(lowp_caps_describe(&c, buf, 0), LOWP_ERR_INVALID_ARG);
}

/* ---- the testdev plugin ------------------------------------------------------------------ */

static int32_t test_load(const char *path) {
    int32_t type = -1, found = -1, n = 0, types[LOWP_DEVICE_MAX_TYPES];
    CHECK_OK(lowp_backend_load(path, &type));
    CHECK(type >= LOWP_DEVICE_PLUGIN_FIRST && type < LOWP_DEVICE_MAX_TYPES);
    CHECK_OK(lowp_backend_find("testdev", &found));
    CHECK(found == type);
    const char *name = NULL;
    CHECK_OK(lowp_backend_name(type, &name));
    CHECK(name && strcmp(name, "testdev") == 0);

    CHECK_OK(lowp_backend_list(types, LOWP_DEVICE_MAX_TYPES, &n));
    int has_cpu = 0, has_td = 0;
    for (int32_t i = 0; i < n; i++) {
        has_cpu |= types[i] == LOWP_DEVICE_CPU;
        has_td |= types[i] == type;
        if (i) CHECK(types[i] > types[i - 1]);
    }
    CHECK(has_cpu && has_td);
    int32_t one[1], m = 0;
    CHECK_OK(lowp_backend_list(one, 1, &m)); /* truncated list, full count */
    CHECK(m == n && one[0] == LOWP_DEVICE_CPU);

    int32_t count = 0;
    CHECK_OK(lowp_device_count(type, &count));
    CHECK(count == 2);
    lowp_caps caps;
    CHECK_OK(lowp_device_caps((lowp_device){type, 1}, &caps));
    CHECK(caps.flags & LOWP_CAP_ASYNC_QUEUE);
    char desc[128];
    CHECK_OK(lowp_caps_describe(&caps, desc, sizeof desc));
    CHECK(strcmp(desc, "async_queue") == 0);
    CHECK(strstr(caps.name, "testdev 1") != NULL);

    const lowp_backend_iface *iface = NULL;
    void *ctx = NULL;
    CHECK_OK(lowp_backend_get(type, &iface, &ctx));
    CHECK(iface && iface->cast && ctx);
    return type;
}

/* host -> dev0 -> dev1 -> host, with dev1's queue held so that the result is provably not
 * there before the synchronize. */
static void test_roundtrip(int32_t type) {
    enum { N = 4096 };
    lowp_device d0 = {type, 0}, d1 = {type, 1};
    unsigned char *in = malloc(N), *out = calloc(1, N);
    void *b0 = NULL, *b1 = NULL;
    long a0 = td.live_allocs(0), a1 = td.live_allocs(1);
    CHECK_OK(lowp_malloc(d0, N, &b0));
    CHECK_OK(lowp_malloc(d1, N, &b1));
    CHECK(td.live_allocs(0) == a0 + 1 && td.live_allocs(1) == a1 + 1);
    if (!in || !out || !b0 || !b1) {
        CHECK(!"allocation failed");
        goto done;
    }
    fill(in, N, 7);
    int s0 = td.sync_count(0), s1 = td.sync_count(1);

    CHECK(td.hold(1, 1) == 0);
    CHECK_OK(lowp_memcpy(d0, b0, LOWP_DEVICE_HOST, in, N));
    CHECK_OK(lowp_memcpy(d1, b1, d0, b0, N));
    CHECK_OK(lowp_memcpy(LOWP_DEVICE_HOST, out, d1, b1, N));
    CHECK(td.queued(1) == 2);
    CHECK(all_zero(out, N)); /* queued, not done */
    CHECK(td.hold(1, 0) == 0);
    CHECK_OK(lowp_device_synchronize(d1));
    CHECK(td.queued(1) == 0);
    CHECK(memcmp(in, out, N) == 0);
    CHECK(td.sync_count(1) == s1 + 1);
    CHECK(td.sync_count(0) == s0); /* dev1's copy waited for dev0 by itself */

    /* Same device d2d, and a copy back the other way. */
    memset(out, 0, N);
    CHECK_OK(lowp_memcpy(d1, (unsigned char *) b1 + 2048, d1, b1, 64));
    CHECK_OK(lowp_memcpy(d0, b0, d1, b1, N));
    CHECK_OK(lowp_memcpy(LOWP_DEVICE_HOST, out, d0, b0, N));
    CHECK_OK(lowp_device_synchronize(d0));
    CHECK(memcmp(out, in, 2048) == 0 && memcmp(out + 2048, in, 64) == 0 &&
          memcmp(out + 2112, in + 2112, N - 2112) == 0);

done:
    CHECK_OK(lowp_free(d0, b0));
    CHECK_OK(lowp_free(d1, b1));
    CHECK(td.live_allocs(0) == a0 && td.live_allocs(1) == a1);
    free(in);
    free(out);
}

/* Synchronizing device 1 must neither wait for nor count as a synchronize of device 0. */
static void test_sync_isolation(int32_t type) {
    enum { N = 256 };
    lowp_device d0 = {type, 0}, d1 = {type, 1};
    unsigned char in[N];
    fill(in, N, 3);
    unsigned char *b0 = NULL;
    CHECK_OK(lowp_malloc(d0, N, (void **) &b0));
    if (!b0) return;
    memset(b0, 0, N); /* testdev memory is host memory: the test may look at it directly */

    int s0 = td.sync_count(0), s1 = td.sync_count(1);
    td.hold(0, 1);
    CHECK_OK(lowp_memcpy(d0, b0, LOWP_DEVICE_HOST, in, N));
    CHECK_OK(lowp_device_synchronize(d1));
    CHECK(td.sync_count(1) == s1 + 1);
    CHECK(td.sync_count(0) == s0);
    CHECK(td.queued(0) == 1);
    CHECK(all_zero(b0, N));
    td.hold(0, 0);
    CHECK_OK(lowp_device_synchronize(d0));
    CHECK(td.sync_count(0) == s0 + 1);
    CHECK(td.queued(0) == 0);
    CHECK(memcmp(b0, in, N) == 0);

    /* Out of range for this backend, with the exact message. */
    CHECK_FAIL(lowp_device_synchronize((lowp_device){type, 2}), LOWP_ERR_NOT_FOUND);
    CHECK(strcmp(lowp_last_error(),
                 "lowp_device_synchronize: dev.index (2) >= device count (2) of \"testdev\"") == 0);
    CHECK(td.sync_count(0) == s0 + 1 && td.sync_count(1) == s1 + 1);

    /* Freeing on the wrong device is the plugin's refusal, reported with a message. */
    CHECK_FAIL(lowp_free(d1, b0), LOWP_ERR_INVALID_ARG);
    CHECK(ERR_HAS("testdev") && ERR_HAS("free"));
    CHECK_OK(lowp_free(d0, b0));
}

static void test_cast_dispatch(int32_t type) {
    enum { R = 4, C = 8 };
    lowp_device d1 = {type, 1};
    float in[R * C], out[R * C];
    for (int i = 0; i < R * C; i++) in[i] = (float) i * 0.5f - 3.0f;
    memset(out, 0, sizeof out);
    void *s = NULL, *d = NULL;
    CHECK_OK(lowp_malloc(d1, sizeof in, &s));
    CHECK_OK(lowp_malloc(d1, sizeof in, &d));
    CHECK_OK(lowp_memcpy(d1, s, LOWP_DEVICE_HOST, in, sizeof in));
    lowp_tensor src = {LOWP_FORMAT_F32, R, C, s, d1};
    lowp_tensor dst = {LOWP_FORMAT_F32, R, C, d, d1};
    int c0 = td.cast_count(0), c1 = td.cast_count(1);
    CHECK_OK(lowp_cast(&src, &dst, NULL));
    CHECK(td.cast_count(1) == c1 + 1 && td.cast_count(0) == c0);
    CHECK_OK(lowp_memcpy(LOWP_DEVICE_HOST, out, d1, d, sizeof out));
    CHECK_OK(lowp_device_synchronize(d1));
    CHECK(memcmp(in, out, sizeof in) == 0);

    /* testdev has no FP8 kernel: its refusal comes back through lowp_cast. */
    lowp_tensor q = {LOWP_FORMAT_E4M3, R, C, d, d1};
    CHECK(lowp_cast(&src, &q, NULL) == LOWP_ERR_UNSUPPORTED);
    CHECK(td.cast_count(1) == c1 + 1);
    CHECK_OK(lowp_free(d1, s));
    CHECK_OK(lowp_free(d1, d));
}

/* ---- an in-process backend: synchronous host memory, no caps, no d2d --------------------- */

static lowp_status ip_count(void *ctx, int32_t *count) {
    (void) ctx;
    *count = 1;
    return LOWP_OK;
}
static lowp_status ip_sync(void *ctx, int32_t index) {
    (void) ctx;
    (void) index;
    return LOWP_OK;
}
static lowp_status ip_alloc(void *ctx, int32_t index, size_t n, void **p) {
    (void) ctx;
    (void) index;
    *p = malloc(n ? n : 1);
    return *p ? LOWP_OK : LOWP_ERR_OUT_OF_MEMORY;
}
static lowp_status ip_free(void *ctx, int32_t index, void *p) {
    (void) ctx;
    (void) index;
    free(p);
    return LOWP_OK;
}
static lowp_status ip_copy(void *ctx, int32_t index, void *dst, const void *src, size_t n) {
    (void) ctx;
    (void) index;
    memcpy(dst, src, n);
    return LOWP_OK;
}

static void test_inproc_and_staging(int32_t td_type) {
    lowp_backend_iface f = {.device_count = ip_count,
                            .synchronize = ip_sync,
                            .alloc = ip_alloc,
                            .free = ip_free,
                            .memcpy_h2d = ip_copy,
                            .memcpy_d2h = ip_copy};
    lowp_backend_reg reg = {LOWP_BACKEND_API_VERSION, sizeof reg, "inproc", &f, NULL};
    int32_t type = -1;
    CHECK_OK(lowp_backend_register(&reg, &type));
    CHECK(type > td_type && type < LOWP_DEVICE_MAX_TYPES);
    CHECK_FAIL(lowp_backend_register(&reg, NULL), LOWP_ERR_INVALID_ARG);
    CHECK(ERR_HAS("already registered"));
    reg.name = "cpu";
    CHECK_FAIL(lowp_backend_register(&reg, NULL), LOWP_ERR_INVALID_ARG);
    CHECK(ERR_HAS("\"cpu\" is already registered (type 0)"));

    lowp_device ip = {type, 0}, t0 = {td_type, 0}, t1 = {td_type, 1};
    lowp_caps caps;
    CHECK_FAIL(lowp_device_caps(ip, &caps), LOWP_ERR_UNSUPPORTED);
    CHECK(ERR_HAS("inproc") && ERR_HAS("caps"));

    enum { N = 1000 };
    unsigned char in[N], out[N];
    fill(in, N, 11);
    memset(out, 0, N);
    void *pi = NULL, *p0 = NULL, *p1 = NULL;
    f.alloc = NULL; /* the registry copied the vtable: changing ours must not matter */
    CHECK_OK(lowp_malloc(ip, N, &pi));
    f.alloc = ip_alloc;
    CHECK_OK(lowp_malloc(t0, N, &p0));
    CHECK_OK(lowp_malloc(t1, N, &p1));
    if (!pi || !p0 || !p1) return;
    /* testdev -> inproc goes through the host, synchronizing the source device (and the
     * copy into testdev before it is still queued: the staged copy must wait for it). */
    int s0 = td.sync_count(0), s1 = td.sync_count(1);
    CHECK_OK(lowp_memcpy(t0, p0, LOWP_DEVICE_HOST, in, N));
    CHECK_OK(lowp_memcpy(ip, pi, t0, p0, N));
    CHECK(memcmp(pi, in, N) == 0);
    CHECK(td.sync_count(0) == s0 + 1 && td.sync_count(1) == s1);
    /* inproc -> testdev: synchronous too, the destination is synchronized. */
    CHECK_OK(lowp_memcpy(t1, p1, ip, pi, N));
    CHECK(memcmp(p1, in, N) == 0);
    CHECK(td.sync_count(1) == s1 + 1);
    CHECK_OK(lowp_memcpy(LOWP_DEVICE_HOST, out, ip, pi, N));
    CHECK(memcmp(out, in, N) == 0);
    CHECK_FAIL(lowp_memcpy(ip, pi, ip, pi, N), LOWP_ERR_UNSUPPORTED);
    CHECK(ERR_HAS("memcpy_d2d"));
    CHECK_OK(lowp_free(ip, pi));
    CHECK_OK(lowp_free(t0, p0));
    CHECK_OK(lowp_free(t1, p1));
}

/* ---- registration errors ----------------------------------------------------------------- */

static void test_register_errors(void) {
    lowp_backend_iface f = {
        .device_count = ip_count, .synchronize = ip_sync, .alloc = ip_alloc, .free = ip_free};
    lowp_backend_reg reg = {LOWP_BACKEND_API_VERSION, sizeof reg, "regtest", &f, NULL};
    char want[128];

    CHECK_FAIL(lowp_backend_register(NULL, NULL), LOWP_ERR_INVALID_ARG);
    reg.api_version = LOWP_BACKEND_API_VERSION + 1;
    CHECK_FAIL(lowp_backend_register(&reg, NULL), LOWP_ERR_VERSION);
    snprintf(want, sizeof want, "reg.api_version (%u) != LOWP_BACKEND_API_VERSION (%u)",
             LOWP_BACKEND_API_VERSION + 1, LOWP_BACKEND_API_VERSION);
    CHECK(ERR_HAS(want));
    reg.api_version = LOWP_BACKEND_API_VERSION;
    reg.struct_size = 8;
    CHECK_FAIL(lowp_backend_register(&reg, NULL), LOWP_ERR_VERSION);
    CHECK(ERR_HAS("struct_size (8)"));
    reg.struct_size = sizeof reg;

    const char *bad_names[] = {NULL, "", "two words", "quote\"",
                               "a-name-that-is-much-too-long-xyz"};
    for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++) {
        reg.name = bad_names[i];
        CHECK_FAIL(lowp_backend_register(&reg, NULL), LOWP_ERR_INVALID_ARG);
        CHECK(ERR_HAS("reg.name"));
    }
    reg.name = "regtest";
    reg.iface = NULL;
    CHECK_FAIL(lowp_backend_register(&reg, NULL), LOWP_ERR_INVALID_ARG);
    reg.iface = &f;
    f.synchronize = NULL;
    CHECK_FAIL(lowp_backend_register(&reg, NULL), LOWP_ERR_INVALID_ARG);
    CHECK(ERR_HAS("synchronize"));
    f.synchronize = ip_sync;
    f.free = NULL;
    CHECK_FAIL(lowp_backend_register(&reg, NULL), LOWP_ERR_INVALID_ARG);
    CHECK(ERR_HAS("free"));
    int32_t t;
    CHECK(lowp_backend_find("regtest", &t) == LOWP_ERR_NOT_FOUND);
}

static void test_badver(const char *path) {
    CHECK_FAIL(lowp_backend_load(path, NULL), LOWP_ERR_VERSION);
    char want[128];
    snprintf(want, sizeof want, "api_version (%u) != LOWP_BACKEND_API_VERSION (%u)",
             LOWP_BACKEND_API_VERSION + 1, LOWP_BACKEND_API_VERSION);
    CHECK(ERR_HAS(want));
    CHECK(ERR_HAS(path));
    int32_t t;
    CHECK(lowp_backend_find("badver", &t) == LOWP_ERR_NOT_FOUND);
}

static void test_duplicate(const char *path, int32_t type) {
    CHECK(td.contexts() == 1);
    CHECK_FAIL(lowp_backend_load(path, NULL), LOWP_ERR_INVALID_ARG);
    CHECK(ERR_HAS("already registered") && ERR_HAS(path));
    CHECK(td.contexts() == 1); /* the refused registration's context was destroyed */
    int32_t found = -1;
    CHECK_OK(lowp_backend_find("testdev", &found));
    CHECK(found == type);
    int s = td.sync_count(0);
    CHECK_OK(lowp_device_synchronize((lowp_device){type, 0}));
    CHECK(td.sync_count(0) == s + 1); /* the hooks still see the registered context */
}

/* ---- argument errors --------------------------------------------------------------------- */

static void test_bad_args(void) {
    int32_t t, c, n;
    const char *name;
    const lowp_backend_iface *iface;
    void *ctx, *p = (void *) 1;
    char byte = 0;

    CHECK_FAIL(lowp_backend_load(NULL, &t), LOWP_ERR_INVALID_ARG);
    CHECK_FAIL(lowp_backend_load("", &t), LOWP_ERR_INVALID_ARG);
    CHECK_FAIL(lowp_backend_load("/nonexistent/dir/liblowp_nope.so", &t), LOWP_ERR_NOT_FOUND);
    CHECK(ERR_HAS("/nonexistent/dir/liblowp_nope.so"));
    /* A shared object without the entry symbol. */
    CHECK_FAIL(lowp_backend_load("libm.so.6", &t), LOWP_ERR_NOT_FOUND);
    CHECK(ERR_HAS(LOWP_BACKEND_ENTRY_SYMBOL) && ERR_HAS("libm.so.6"));
    /* A file that is not a shared object. */
    char junk[] = "/tmp/lowp_test_junk_XXXXXX";
    int fd = mkstemp(junk);
    if (fd >= 0) {
        CHECK(write(fd, "not an ELF file\n", 16) == 16);
        close(fd);
        CHECK_FAIL(lowp_backend_load(junk, &t), LOWP_ERR_IO);
        CHECK(ERR_HAS(junk));
        unlink(junk);
    }

    CHECK_FAIL(lowp_device_count(99, &c), LOWP_ERR_INVALID_ARG);
    CHECK_FAIL(lowp_device_count(-1, &c), LOWP_ERR_INVALID_ARG);
    CHECK_FAIL(lowp_device_count(7, &c), LOWP_ERR_NOT_FOUND);
    CHECK(strcmp(lowp_last_error(),
                 "lowp_device_count: type (7) is not a registered device type") == 0);
    CHECK_FAIL(lowp_device_count(0, NULL), LOWP_ERR_INVALID_ARG);
    CHECK_FAIL(lowp_backend_name(7, &name), LOWP_ERR_NOT_FOUND);
    CHECK_FAIL(lowp_backend_name(0, NULL), LOWP_ERR_INVALID_ARG);
    CHECK_FAIL(lowp_backend_find("nope", &t), LOWP_ERR_NOT_FOUND);
    CHECK(ERR_HAS("\"nope\"") && ERR_HAS("cpu"));
    CHECK_FAIL(lowp_backend_find(NULL, &t), LOWP_ERR_INVALID_ARG);
    CHECK_FAIL(lowp_backend_find("cpu", NULL), LOWP_ERR_INVALID_ARG);
    CHECK_OK(lowp_backend_list(NULL, 0, &n));
    CHECK(n >= 1);
    CHECK_FAIL(lowp_backend_list(NULL, 1, &n), LOWP_ERR_INVALID_ARG);
    CHECK_FAIL(lowp_backend_list(&t, -1, &n), LOWP_ERR_INVALID_ARG);
    CHECK_FAIL(lowp_backend_list(&t, 1, NULL), LOWP_ERR_INVALID_ARG);
    CHECK_FAIL(lowp_backend_get(-1, &iface, &ctx), LOWP_ERR_INVALID_ARG);
    CHECK_FAIL(lowp_backend_get(7, &iface, &ctx), LOWP_ERR_NOT_FOUND);
    CHECK_FAIL(lowp_backend_get(0, NULL, &ctx), LOWP_ERR_INVALID_ARG);

    CHECK_FAIL(lowp_device_synchronize((lowp_device){0, 1}), LOWP_ERR_NOT_FOUND);
    CHECK(strcmp(lowp_last_error(),
                 "lowp_device_synchronize: dev.index (1) >= device count (1) of \"cpu\"") == 0);
    CHECK_FAIL(lowp_device_synchronize((lowp_device){0, -1}), LOWP_ERR_INVALID_ARG);
    CHECK_FAIL(lowp_device_synchronize((lowp_device){40, 0}), LOWP_ERR_INVALID_ARG);
    CHECK(ERR_HAS("dev.type (40)"));
    CHECK_FAIL(lowp_device_synchronize((lowp_device){9, 0}), LOWP_ERR_NOT_FOUND);
    CHECK_FAIL(lowp_device_caps(LOWP_DEVICE_HOST, NULL), LOWP_ERR_INVALID_ARG);
    CHECK_FAIL(lowp_device_caps((lowp_device){0, 3}, &(lowp_caps){0}), LOWP_ERR_NOT_FOUND);

    CHECK_FAIL(lowp_malloc(LOWP_DEVICE_HOST, 16, NULL), LOWP_ERR_INVALID_ARG);
    CHECK_FAIL(lowp_malloc((lowp_device){9, 0}, 16, &p), LOWP_ERR_NOT_FOUND);
    CHECK(p == NULL); /* cleared even on failure */
    CHECK_FAIL(lowp_malloc(LOWP_DEVICE_HOST, SIZE_MAX - 8, &p), LOWP_ERR_OUT_OF_MEMORY);
    CHECK_FAIL(lowp_free((lowp_device){0, 2}, &byte), LOWP_ERR_NOT_FOUND);

    CHECK_FAIL(lowp_memcpy(LOWP_DEVICE_HOST, NULL, LOWP_DEVICE_HOST, &byte, 1),
               LOWP_ERR_INVALID_ARG);
    CHECK(ERR_HAS("dst"));
    CHECK_FAIL(lowp_memcpy(LOWP_DEVICE_HOST, &byte, LOWP_DEVICE_HOST, NULL, 1),
               LOWP_ERR_INVALID_ARG);
    CHECK_OK(lowp_memcpy(LOWP_DEVICE_HOST, NULL, LOWP_DEVICE_HOST, NULL, 0));
    CHECK_FAIL(lowp_memcpy((lowp_device){9, 0}, &byte, LOWP_DEVICE_HOST, &byte, 1),
               LOWP_ERR_NOT_FOUND);
    CHECK(ERR_HAS("dst_dev.type (9)"));
    CHECK_FAIL(lowp_memcpy(LOWP_DEVICE_HOST, &byte, (lowp_device){0, 5}, &byte, 1),
               LOWP_ERR_NOT_FOUND);
    CHECK(ERR_HAS("src_dev.index (5)"));

    /* A successful device call does not erase the report of an earlier failure. */
    CHECK_FAIL(lowp_backend_find("nope", &t), LOWP_ERR_NOT_FOUND);
    char before[256];
    snprintf(before, sizeof before, "%s", lowp_last_error());
    CHECK_OK(lowp_device_synchronize(LOWP_DEVICE_HOST));
    char other = 1;
    CHECK_OK(lowp_memcpy(LOWP_DEVICE_HOST, &byte, LOWP_DEVICE_HOST, &other, 1));
    CHECK_OK(lowp_device_count(0, &c));
    CHECK(strcmp(before, lowp_last_error()) == 0);
}

/* ---- child processes: LOWP_BACKEND_PATH and LOWP_CPU_DISABLE ----------------------------- */

static const char *g_plugin, *g_badver;

/* Re-run this program with `mode` and `extra` added to the environment; 1 if it passed. */
static int run_child(const char *mode, const char *extra) {
    size_t count = 0;
    while (environ[count]) count++;
    /* Built before fork: the child of a threaded process may only exec. */
    char **envp = calloc(count + 2, sizeof *envp);
    if (!envp) return 0;
    size_t k = 0;
    size_t eq = strcspn(extra, "=");
    for (size_t i = 0; i < count; i++)
        if (strncmp(environ[i], extra, eq + 1) != 0) envp[k++] = environ[i];
    envp[k++] = (char *) extra;
    envp[k] = NULL;
    char *argv[] = {(char *) "test_device", (char *) mode, NULL};
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        execve("/proc/self/exe", argv, envp);
        _exit(127);
    }
    free(envp);
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return 0;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static void *child_find(void *arg) {
    int *ok = arg;
    /* Leave a message, then race the other threads to the registry's first use: whichever
     * runs the setup must not lose its message to the LOWP_BACKEND_PATH failures. */
    lowp_cast_cfg_init(NULL);
    char before[256];
    snprintf(before, sizeof before, "%s", lowp_last_error());
    int32_t t = -1;
    *ok = lowp_backend_find("testdev", &t) == LOWP_OK && t == LOWP_DEVICE_PLUGIN_FIRST &&
          before[0] && strcmp(before, lowp_last_error()) == 0;
    return NULL;
}

typedef struct reg_arg {
    char name[16];
    int32_t type;
    lowp_status st;
} reg_arg;

static void *child_register(void *p) {
    reg_arg *a = p;
    static const lowp_backend_iface f = {
        .device_count = ip_count, .synchronize = ip_sync, .alloc = ip_alloc, .free = ip_free};
    lowp_backend_reg reg = {LOWP_BACKEND_API_VERSION, sizeof reg, a->name, &f, NULL};
    a->st = lowp_backend_register(&reg, &a->type);
    return NULL;
}

static int child_env(void) {
    enum { T = 8 };
    pthread_t th[T];
    int ok[T];
    for (int i = 0; i < T; i++) CHECK(pthread_create(&th[i], NULL, child_find, &ok[i]) == 0);
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        CHECK(ok[i]);
    }
    const char *errs = lowp_backend_env_errors();
    CHECK(strstr(errs, "/nonexistent/liblowp_missing.so") != NULL);
    CHECK(strstr(errs, g_badver) != NULL && strstr(errs, "api_version") != NULL);
    int lines = errs[0] ? 1 : 0;
    for (const char *p = errs; *p; p++) lines += *p == '\n';
    CHECK(lines == 2); /* the empty entries were skipped, not reported */
    int32_t t;
    CHECK(lowp_backend_find("badver", &t) == LOWP_ERR_NOT_FOUND);

    /* Concurrent registrations get distinct ids. */
    reg_arg args[T];
    for (int i = 0; i < T; i++) {
        snprintf(args[i].name, sizeof args[i].name, "conc%d", i);
        CHECK(pthread_create(&th[i], NULL, child_register, &args[i]) == 0);
    }
    for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < T; i++) {
        CHECK(args[i].st == LOWP_OK);
        CHECK(args[i].type > LOWP_DEVICE_PLUGIN_FIRST && args[i].type < LOWP_DEVICE_MAX_TYPES);
        for (int j = 0; j < i; j++) CHECK(args[i].type != args[j].type);
    }
    return g_fail == 0;
}

static int child_cpu_disable(void) {
    lowp_caps caps;
    CHECK_OK(lowp_device_caps(LOWP_DEVICE_HOST, &caps));
    CHECK(!(caps.flags & (LOWP_CAP_AVX512F | LOWP_CAP_AVX512BW | LOWP_CAP_AVX512VL |
                          LOWP_CAP_AVX512_BF16 | LOWP_CAP_AVX512_FP16 | LOWP_CAP_AMX_TILE |
                          LOWP_CAP_AMX_BF16 | LOWP_CAP_AMX_PERMITTED | LOWP_CAP_FMA)));
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    CHECK(!!(caps.flags & LOWP_CAP_AVX2) == !!__builtin_cpu_supports("avx2"));
#endif
    /* The portable cast path still works with AVX-512 masked. */
    float x[3] = {1.0f, -2.5f, 448.0f}, y[3] = {0};
    uint8_t q[3];
    lowp_tensor src = {LOWP_FORMAT_F32, 1, 3, x, LOWP_DEVICE_HOST};
    lowp_tensor mid = {LOWP_FORMAT_E4M3, 1, 3, q, LOWP_DEVICE_HOST};
    lowp_tensor dst = {LOWP_FORMAT_F32, 1, 3, y, LOWP_DEVICE_HOST};
    CHECK_OK(lowp_cast(&src, &mid, NULL));
    CHECK_OK(lowp_cast(&mid, &dst, NULL));
    CHECK(memcmp(x, y, sizeof x) == 0);
    return g_fail == 0;
}

int main(int argc, char **argv) {
    g_plugin = getenv("LOWP_TEST_PLUGIN");
    g_badver = getenv("LOWP_TEST_PLUGIN_BADVER");
    if (argc > 1 && strcmp(argv[1], "--child-env") == 0) {
        int ok = g_badver && child_env();
        printf("child --child-env: %d passed, %d failed\n", g_pass, g_fail);
        return ok ? 0 : 1;
    }
    if (argc > 1 && strcmp(argv[1], "--child-cpu-disable") == 0) {
        int ok = child_cpu_disable();
        printf("child --child-cpu-disable: %d passed, %d failed\n", g_pass, g_fail);
        return ok ? 0 : 1;
    }
    /* This process loads the plugins itself; one from the caller's environment would take
     * the name "testdev" first. */
    unsetenv("LOWP_BACKEND_PATH");
    if (!g_plugin || !g_badver) {
        fprintf(stderr, "LOWP_TEST_PLUGIN and LOWP_TEST_PLUGIN_BADVER must name the plugins\n");
        return 1;
    }

    test_cpu();
    test_hugepages();
    test_host_cache();
    test_describe();
    CHECK(strcmp(lowp_backend_env_errors(), "") == 0);
    test_register_errors();
    test_bad_args();
    int32_t type = test_load(g_plugin);
    if (!load_hooks(g_plugin)) {
        CHECK(!"cannot reach the testdev hooks");
    } else {
        test_roundtrip(type);
        test_sync_isolation(type);
        test_cast_dispatch(type);
        test_inproc_and_staging(type);
        test_badver(g_badver);
        test_duplicate(g_plugin, type);
    }

    char env[4096];
    snprintf(env, sizeof env, "LOWP_BACKEND_PATH=%s::/nonexistent/liblowp_missing.so:%s:", g_plugin,
             g_badver);
    CHECK(run_child("--child-env", env));
    CHECK(run_child("--child-cpu-disable", "LOWP_CPU_DISABLE=avx512,AMX,fma"));

    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
