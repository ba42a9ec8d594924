/* Large host buffers on transparent huge pages (issue 14).
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
 * and released with free(). */
#define _DEFAULT_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "internal.h"

#define HUGE_PAGE ((size_t) 2 << 20)

int lowp_hugepages_enabled(void) {
    const char *env = getenv("LOWP_HUGEPAGES");
    return !(env && strcmp(env, "0") == 0);
}

void *lowp_host_alloc(size_t nbytes) {
    if (nbytes >= LOWP_HUGE_MIN && nbytes <= SIZE_MAX - HUGE_PAGE && lowp_hugepages_enabled()) {
        const size_t len = (nbytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
        void *p = aligned_alloc(HUGE_PAGE, len);
        if (!p) return NULL;
#ifdef MADV_HUGEPAGE
        (void) madvise(p, len, MADV_HUGEPAGE); /* a hint: a refusal leaves ordinary pages */
#endif
        return p;
    }
    if (nbytes > SIZE_MAX - 63) return NULL;
    const size_t len = nbytes ? (nbytes + 63) / 64 * 64 : 64;
    return aligned_alloc(64, len);
}

void *lowp_host_zalloc(size_t nbytes) {
    void *p = lowp_host_alloc(nbytes);
    if (p) memset(p, 0, nbytes);
    return p;
}
