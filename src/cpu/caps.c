/* CPU capability detection, done once per process: which instruction sets the CPU has
 * (CPUID), which register state the OS saves on context switches (XGETBV), and whether the
 * kernel lets this process use AMX tiles (arch_prctl). A feature counts only when all the
 * layers agree, because executing an instruction whose state the OS does not manage faults.
 *
 * LOWP_CPU_DISABLE masks features off, for testing the portable paths on a machine that has
 * the fast ones: a comma-separated list of lowp_caps_describe names ("avx512f", "amx_tile",
 * "avx2", ...) or the groups "avx512" (every AVX-512 bit), "amx" (every AMX bit; the AMX
 * permission is then not even requested) and "all". Unknown words are ignored, since the
 * library cannot print a warning. Example: LOWP_CPU_DISABLE=avx512,amx lowp info */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <unistd.h>

#include "cpu.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#endif

#define CAP_AVX512_ALL                                                                             \
    (LOWP_CAP_AVX512F | LOWP_CAP_AVX512BW | LOWP_CAP_AVX512VL | LOWP_CAP_AVX512DQ |                \
     LOWP_CAP_AVX512_BF16 | LOWP_CAP_AVX512_FP16 | LOWP_CAP_AVX512_VBMI)
#define CAP_AMX_ALL (LOWP_CAP_AMX_TILE | LOWP_CAP_AMX_BF16 | LOWP_CAP_AMX_PERMITTED)

static lowp_caps g_caps;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* The bits LOWP_CPU_DISABLE asks to mask. */
static uint32_t disabled_by_env(void) {
    const char *env = getenv("LOWP_CPU_DISABLE");
    if (!env) return 0;
    uint32_t mask = 0;
    const char *p = env;
    while (*p) {
        size_t len = strcspn(p, ", ");
        if (len == 6 && strncasecmp(p, "avx512", 6) == 0)
            mask |= CAP_AVX512_ALL;
        else if (len == 3 && strncasecmp(p, "amx", 3) == 0)
            mask |= CAP_AMX_ALL;
        else if (len == 3 && strncasecmp(p, "all", 3) == 0)
            mask |= ~0u;
        else if (len > 0)
            mask |= lowp_cap_from_name(p, len);
        p += len;
        if (*p) p++;
    }
    return mask;
}

#if defined(__x86_64__)
static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    /* The instruction, not the _xgetbv intrinsic, so that this file needs no -mxsave. */
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t) hi << 32) | lo;
}

static int bit(uint32_t reg, int n) {
    return (reg >> n) & 1u;
}

static uint32_t detect_x86(char *name, size_t name_size) {
    uint32_t a, b, c, d, flags = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    int osxsave = bit(c, 27), fma = bit(c, 12), avx = bit(c, 28);
    /* XCR0 says which register state the OS saves: 1 SSE, 2 YMM upper halves, 5 opmask,
     * 6 ZMM0-15 upper halves, 7 ZMM16-31, 17 TILECFG, 18 TILEDATA. */
    uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    int os_avx = (xcr0 & 0x6) == 0x6;
    int os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;
    int os_amx = (xcr0 & 0x60000) == 0x60000;

    if (avx && os_avx && fma) flags |= LOWP_CAP_FMA;
    uint32_t max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf >= 7) {
        uint32_t a7, b7, c7, d7;
        __cpuid_count(7, 0, a7, b7, c7, d7);
        if (os_avx && bit(b7, 5)) flags |= LOWP_CAP_AVX2;
        if (os_avx512 && bit(b7, 16)) {
            flags |= LOWP_CAP_AVX512F;
            if (bit(b7, 30)) flags |= LOWP_CAP_AVX512BW;
            if (bit(b7, 31)) flags |= LOWP_CAP_AVX512VL;
            if (bit(b7, 17)) flags |= LOWP_CAP_AVX512DQ;
            if (bit(c7, 1)) flags |= LOWP_CAP_AVX512_VBMI;
            if (bit(d7, 23)) flags |= LOWP_CAP_AVX512_FP16;
            if (a7 >= 1) { /* a7 = the highest subleaf of leaf 7 */
                uint32_t a71, b71, c71, d71;
                __cpuid_count(7, 1, a71, b71, c71, d71);
                if (bit(a71, 5)) flags |= LOWP_CAP_AVX512_BF16;
            }
        }
        if (os_amx && bit(d7, 24)) {
            flags |= LOWP_CAP_AMX_TILE;
            if (bit(d7, 22)) flags |= LOWP_CAP_AMX_BF16;
        }
    }

    uint32_t max_ext = __get_cpuid_max(0x80000000u, NULL);
    if (max_ext >= 0x80000004u) {
        uint32_t brand[12];
        for (uint32_t i = 0; i < 3; i++)
            __cpuid(0x80000002u + i, brand[4 * i], brand[4 * i + 1], brand[4 * i + 2],
                    brand[4 * i + 3]);
        char s[49];
        memcpy(s, brand, 48);
        s[48] = '\0';
        /* Vendors pad the string with spaces on either side. */
        char *p = s;
        while (*p == ' ') p++;
        size_t n = strlen(p);
        while (n > 0 && p[n - 1] == ' ') p[--n] = '\0';
        if (n > 0) snprintf(name, name_size, "%s", p);
    }
    return flags;
}

/* Linux grants AMX tile data (XFEATURE_XTILEDATA = 18) per process, on request
 * (ARCH_REQ_XCOMP_PERM = 0x1023, since Linux 5.16); without it the first tile instruction
 * faults with SIGILL. */
static int request_amx(void) {
#if defined(SYS_arch_prctl)
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
    return 0;
#endif
}
#endif

static void detect(void) {
    lowp_caps caps;
    memset(&caps, 0, sizeof caps);
    snprintf(caps.name, sizeof caps.name, "generic CPU");
    uint32_t off = disabled_by_env();
#if defined(__x86_64__)
    caps.flags = detect_x86(caps.name, sizeof caps.name) & ~off;
    /* Masking a base feature masks what builds on it. */
    if (!(caps.flags & LOWP_CAP_AVX512F)) caps.flags &= ~CAP_AVX512_ALL;
    if (!(caps.flags & LOWP_CAP_AMX_TILE)) caps.flags &= ~CAP_AMX_ALL;
    if ((caps.flags & LOWP_CAP_AMX_TILE) && !(off & LOWP_CAP_AMX_PERMITTED) && request_amx())
        caps.flags |= LOWP_CAP_AMX_PERMITTED;
#else
    (void) off;
#endif
    long procs = sysconf(_SC_NPROCESSORS_ONLN);
    caps.cores = procs > 0 ? (int32_t) procs : 1;
    long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page_size > 0) caps.mem_bytes = (uint64_t) pages * (uint64_t) page_size;
    g_caps = caps;
}

const lowp_caps *lowp_cpu_caps(void) {
    pthread_once(&g_once, detect);
    return &g_caps;
}
