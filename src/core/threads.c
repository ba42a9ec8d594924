/* The thread-count rule of lowp/threads.h, used by the CPU dispatchers (cast, quantize, GEMM),
 * the model's own loops, the optimizer and the `lowp` command. */
#include <omp.h>

#include "internal.h"
#include "lowp/threads.h"

int32_t lowp_thread_count(int32_t threads) {
    int64_t n = threads > 0 ? threads : omp_get_num_procs();
    if (n > LOWP_MAX_THREADS) n = LOWP_MAX_THREADS;
    const int64_t limit = omp_get_thread_limit();
    if (limit > 0 && n > limit) n = limit;
    return n < 1 ? 1 : (int32_t) n;
}
