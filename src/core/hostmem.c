/* Large host buffers on transparent huge pages (docs/tuning.md).
 *
 * A training step walks hundreds of MiB of parameters, gradients, moments, activations and
 * quantized copies, much of it a row apart (the columnwise copies of dual-axis quantization,
 * the GEMMs' panels, the attention's head columns): with 4 KiB pages those accesses miss the
 * TLB nearly every time. Linux backs an anonymous region with 2 MiB pages when the region is
 * advised MADV_HUGEPAGE (its common default policy, "madvise", does it for advised regions
 * only). NumPy advises its arrays from 4 MiB up in the same way; PyTorch's CPU allocator does
 * from 2 MiB when THP_MEM_ALLOC_ENABLE is set. Buffers of at least LOWP_HUGE_MIN bytes are
 * therefore 2 MiB aligned, a whole number of 2 MiB pages long (the last page's unused part
 * costs less than 2 MiB: at most half of the smallest such buffer, and a small fraction of the
 * arenas that make up most of them), and advised. The advice is a
 * hint: where the kernel has huge pages off, or off Linux, such a buffer is ordinary memory.
 * LOWP_HUGEPAGES=0 in the environment turns the advice off. Every buffer is 64-byte aligned
 * and may be released with free().
 *
 * Buffers that live for one call or one update (the GEMMs' workspaces, the activations' and
 * gradients' quantized copies: some 170 blocks of 1-2 MiB an update of `medium`) are released
 * with lowp_host_free instead, which keeps blocks from LOWP_HOST_CACHE_MIN bytes up in a small
 * cache for the next lowp_host_alloc of about the same size. Handed back to malloc, such a
 * block went back to the kernel (glibc trims the top of its heap and unmaps its large chunks),
 * and the next update faulted it in again, zeroing 2 MiB pages where the heap lay in advised
 * regions: 5% of a one-thread update in clear_page. A cached block's size is what malloc says
 * it holds (malloc_usable_size), not what its caller asked for. The cache holds at most
 * LOWP_HOST_CACHE_MB MiB (environment, read once; default 512, 0 turns it off) in at most
 * CACHE_SLOTS blocks; a block that does not fit is freed. With LOWP_HUGEPAGES=0 the cache is
 * neither filled nor used (its blocks may be advised). Off glibc, lowp_host_free is free. */
#define _DEFAULT_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#ifdef __GLIBC__
#include <malloc.h>
#define LOWP_HOST_CACHE 1
#else
#define LOWP_HOST_CACHE 0
#endif

#include "internal.h"
#include "lowp/device.h"

#define HUGE_PAGE ((size_t) 2 << 20)

int lowp_hugepages_enabled(void) {
    const char *env = getenv("LOWP_HUGEPAGES");
    return !(env && strcmp(env, "0") == 0);
}

#define CACHE_SLOTS 64
typedef struct cached_block {
    void *p;
    size_t len; /* malloc_usable_size(p) */
} cached_block;

static struct {
    pthread_mutex_t lock;
    pthread_once_t once;
    size_t limit, bytes;
    int count;
    cached_block slot[CACHE_SLOTS];
} g_cache = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_ONCE_INIT, 0, 0, 0, {{0}}};

static void cache_init(void) {
    const char *env = getenv("LOWP_HOST_CACHE_MB");
    long mb = 512;
    if (env && *env) {
        char *end = NULL;
        const long v = strtol(env, &end, 10);
        if (end && *end == '\0' && v >= 0 && v <= (1L << 30)) mb = v; /* else the default */
    }
    g_cache.limit = (size_t) mb << 20;
}

/* A cached block for a request of len bytes, or NULL: the smallest that holds len and
 * wastes at most a quarter of it; for a huge-page request (huge) only one on a 2 MiB
 * boundary, advised again. */
static void *cache_take(size_t len, int huge) {
    if (!LOWP_HOST_CACHE || len < LOWP_HOST_CACHE_MIN || !lowp_hugepages_enabled()) return NULL;
    pthread_once(&g_cache.once, cache_init);
    void *p = NULL;
    pthread_mutex_lock(&g_cache.lock);
    int best = -1;
    for (int i = 0; i < g_cache.count; i++) {
        const cached_block *b = &g_cache.slot[i];
        if (b->len < len || b->len - len > len / 4) continue;
        if (huge && (uintptr_t) b->p % HUGE_PAGE != 0) continue;
        if (best < 0 || b->len < g_cache.slot[best].len) best = i;
    }
    if (best >= 0) {
        p = g_cache.slot[best].p;
        g_cache.bytes -= g_cache.slot[best].len;
        g_cache.slot[best] = g_cache.slot[--g_cache.count];
    }
    pthread_mutex_unlock(&g_cache.lock);
#ifdef MADV_HUGEPAGE
    if (p && huge) (void) madvise(p, len, MADV_HUGEPAGE);
#endif
    return p;
}

void *lowp_host_alloc(size_t nbytes) {
    if (nbytes >= LOWP_HUGE_MIN && nbytes <= SIZE_MAX - HUGE_PAGE && lowp_hugepages_enabled()) {
        const size_t len = (nbytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
        void *p = cache_take(len, 1);
        if (p) return p;
        p = aligned_alloc(HUGE_PAGE, len);
        if (!p) return NULL;
#ifdef MADV_HUGEPAGE
        (void) madvise(p, len, MADV_HUGEPAGE); /* a hint: a refusal leaves ordinary pages */
#endif
        return p;
    }
    if (nbytes > SIZE_MAX - 63) return NULL;
    const size_t len = nbytes ? (nbytes + 63) / 64 * 64 : 64;
    void *p = cache_take(len, 0);
    return p ? p : aligned_alloc(64, len);
}

void lowp_host_free(void *p) {
    if (!p) return;
#if LOWP_HOST_CACHE
    const size_t len = malloc_usable_size(p);
    if (len >= LOWP_HOST_CACHE_MIN && lowp_hugepages_enabled()) {
        pthread_once(&g_cache.once, cache_init);
        pthread_mutex_lock(&g_cache.lock);
        const int keep = g_cache.count < CACHE_SLOTS && g_cache.bytes <= g_cache.limit &&
                         len <= g_cache.limit - g_cache.bytes;
        if (keep) {
            g_cache.slot[g_cache.count++] = (cached_block){p, len};
            g_cache.bytes += len;
        }
        pthread_mutex_unlock(&g_cache.lock);
        if (keep) return;
    }
#endif
    free(p);
}

size_t lowp_host_cache_bytes(void) {
    pthread_mutex_lock(&g_cache.lock);
    const size_t b = g_cache.bytes;
    pthread_mutex_unlock(&g_cache.lock);
    return b;
}

void lowp_host_empty_cache(void) {
    pthread_mutex_lock(&g_cache.lock);
    for (int i = 0; i < g_cache.count; i++) free(g_cache.slot[i].p);
    g_cache.count = 0;
    g_cache.bytes = 0;
    pthread_mutex_unlock(&g_cache.lock);
}

void *lowp_host_zalloc(size_t nbytes) {
    void *p = lowp_host_alloc(nbytes);
    if (p) memset(p, 0, nbytes);
    return p;
}
