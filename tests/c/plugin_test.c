/* "testdev": an out-of-tree backend for the tests, built as its own shared object from the
 * public headers only (it does not link liblowp), the way a vendor backend would be.
 *
 * It has TD_DEVICES devices whose memory is ordinary host memory, but whose queues are
 * asynchronous like a GPU stream: every copy and cast is appended to the device's FIFO and
 * returns at once, and a worker thread per device runs the work later, after a delay
 * (testdev_set_delay_us, 2 ms by default). Reading a result without lowp_device_synchronize
 * therefore sees stale bytes, and synchronizing the wrong device does not help, which is what
 * the tests of "synchronize the device where the tensor lives" need.
 *
 * Ordering: work on one device runs in FIFO order. A device-to-device copy runs on the
 * destination's queue, after everything that was queued on the source before it (a recorded
 * event, in GPU terms). An op only ever waits for ops queued before it, so two queues cannot
 * wait for each other.
 *
 * Memory: lowp_free releases at once, without waiting for the queue (a strict device): the
 * caller must synchronize first, and ASan reports the worker's use-after-free if it did not.
 *
 * Test hooks, found with dlsym on a dlopen handle of this same file, act on the oldest live
 * context (the one registered, as long as the library loaded this file once):
 *   int  testdev_sync_count(int index)    completed synchronize calls on device `index`
 *   int  testdev_queued(int index)        ops queued and not yet finished
 *   int  testdev_cast_count(int index)    casts queued
 *   long testdev_live_allocs(int index)   allocations not yet freed
 *   int  testdev_hold(int index, int on)  on: the worker starts nothing until released.
 *                                         Synchronizing a held device waits forever.
 *   void testdev_set_delay_us(int us)     delay before each op (all contexts)
 *   int  testdev_contexts(void)           live contexts (entry calls minus destroys)
 * The int-returning hooks return -1 when there is no live context or the index is bad. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lowp/cast.h"
#include "lowp/device.h"

#define TD_DEVICES 2
#define TD_HEADER  64 /* in front of each allocation; keeps the user pointer 64-byte aligned */
#define TD_MAGIC   0x74446576416c6c63ull

#define TD_API __attribute__((visibility("default")))

typedef struct td_op {
    void *dst;
    const void *src;
    size_t n;
    int wait_dev;      /* -1, or a device whose ops up to wait_seq must finish first */
    uint64_t wait_seq; /* that device's `enqueued` when this op was queued */
    struct td_op *next;
} td_op;

typedef struct td_queue {
    td_op *head, *tail;
    uint64_t enqueued, completed; /* op counts; queued = enqueued - completed */
    int hold;
    int sync_count;
    int cast_count;
    long live_allocs;
    pthread_t thread;
    int started;
} td_queue;

typedef struct td_ctx {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* broadcast on every change: new op, op done, hold released, stop */
    int stop;
    td_queue q[TD_DEVICES];
    struct td_ctx *next_live;
} td_ctx;

typedef struct td_worker_arg {
    td_ctx *ctx;
    int index;
} td_worker_arg;

typedef struct td_header {
    uint64_t magic;
    int32_t index;
} td_header;

static atomic_int g_delay_us = 2000;
static pthread_mutex_t g_live_mu = PTHREAD_MUTEX_INITIALIZER;
static td_ctx *g_live; /* oldest first */

static int bad_index(int32_t index) {
    return index < 0 || index >= TD_DEVICES;
}

static int op_ready(const td_ctx *c, const td_queue *q) {
    const td_op *op = q->head;
    if (!op || q->hold) return 0;
    return op->wait_dev < 0 || c->q[op->wait_dev].completed >= op->wait_seq;
}

static void *worker(void *p) {
    td_worker_arg arg = *(td_worker_arg *) p;
    free(p);
    td_ctx *c = arg.ctx;
    td_queue *q = &c->q[arg.index];
    pthread_mutex_lock(&c->mu);
    for (;;) {
        if (op_ready(c, q)) {
            td_op *op = q->head;
            q->head = op->next;
            if (!q->head) q->tail = NULL;
            pthread_mutex_unlock(&c->mu);
            int delay = atomic_load(&g_delay_us);
            if (delay > 0) usleep((useconds_t) delay);
            if (op->n) memcpy(op->dst, op->src, op->n);
            free(op);
            pthread_mutex_lock(&c->mu);
            q->completed++;
            pthread_cond_broadcast(&c->cv);
            continue;
        }
        /* Stop only once drained; destroy releases every hold first. */
        if (c->stop && !q->head) break;
        pthread_cond_wait(&c->cv, &c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

static lowp_status enqueue(td_ctx *c, int index, void *dst, const void *src, size_t n,
                           int wait_dev) {
    td_op *op = malloc(sizeof *op);
    if (!op) return LOWP_ERR_OUT_OF_MEMORY;
    op->dst = dst;
    op->src = src;
    op->n = n;
    op->next = NULL;
    pthread_mutex_lock(&c->mu);
    op->wait_dev = wait_dev == index ? -1 : wait_dev;
    op->wait_seq = op->wait_dev >= 0 ? c->q[op->wait_dev].enqueued : 0;
    td_queue *q = &c->q[index];
    if (q->tail)
        q->tail->next = op;
    else
        q->head = op;
    q->tail = op;
    q->enqueued++;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return LOWP_OK;
}

/* ---- the vtable -------------------------------------------------------------------------- */

static lowp_status td_device_count(void *ctx, int32_t *count) {
    (void) ctx;
    *count = TD_DEVICES;
    return LOWP_OK;
}

static lowp_status td_caps(void *ctx, int32_t index, lowp_caps *out) {
    (void) ctx;
    if (bad_index(index)) return LOWP_ERR_INVALID_ARG;
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "testdev %d (async, host memory)", (int) index);
    out->flags = LOWP_CAP_ASYNC_QUEUE;
    out->cores = 1;
    out->mem_bytes = 0; /* it borrows host memory: no size of its own */
    return LOWP_OK;
}

static lowp_status td_synchronize(void *ctx, int32_t index) {
    td_ctx *c = ctx;
    if (bad_index(index)) return LOWP_ERR_INVALID_ARG;
    pthread_mutex_lock(&c->mu);
    td_queue *q = &c->q[index];
    /* Wait for what was queued before this call; later work belongs to later syncs. */
    uint64_t target = q->enqueued;
    while (q->completed < target) pthread_cond_wait(&c->cv, &c->mu);
    q->sync_count++;
    pthread_mutex_unlock(&c->mu);
    return LOWP_OK;
}

static lowp_status td_alloc(void *ctx, int32_t index, size_t nbytes, void **ptr) {
    td_ctx *c = ctx;
    if (bad_index(index)) return LOWP_ERR_INVALID_ARG;
    if (nbytes > SIZE_MAX - TD_HEADER) return LOWP_ERR_OUT_OF_MEMORY;
    unsigned char *p =
        aligned_alloc(TD_HEADER, (TD_HEADER + nbytes + TD_HEADER - 1) / TD_HEADER * TD_HEADER);
    if (!p) return LOWP_ERR_OUT_OF_MEMORY;
    td_header h = {TD_MAGIC, index};
    memcpy(p, &h, sizeof h);
    pthread_mutex_lock(&c->mu);
    c->q[index].live_allocs++;
    pthread_mutex_unlock(&c->mu);
    *ptr = p + TD_HEADER;
    return LOWP_OK;
}

static lowp_status td_free(void *ctx, int32_t index, void *ptr) {
    td_ctx *c = ctx;
    if (bad_index(index)) return LOWP_ERR_INVALID_ARG;
    unsigned char *p = (unsigned char *) ptr - TD_HEADER;
    td_header h;
    memcpy(&h, p, sizeof h);
    /* Memory of the other device, or not ours at all: a routing bug in the caller. */
    if (h.magic != TD_MAGIC || h.index != index) return LOWP_ERR_INVALID_ARG;
    h.magic = 0;
    memcpy(p, &h, sizeof h);
    free(p);
    pthread_mutex_lock(&c->mu);
    c->q[index].live_allocs--;
    pthread_mutex_unlock(&c->mu);
    return LOWP_OK;
}

static lowp_status td_h2d(void *ctx, int32_t index, void *dst, const void *src, size_t n) {
    if (bad_index(index)) return LOWP_ERR_INVALID_ARG;
    return enqueue(ctx, index, dst, src, n, -1);
}

static lowp_status td_d2d(void *ctx, int32_t dst_index, void *dst, int32_t src_index,
                          const void *src, size_t n) {
    if (bad_index(dst_index) || bad_index(src_index)) return LOWP_ERR_INVALID_ARG;
    return enqueue(ctx, dst_index, dst, src, n, src_index);
}

/* Only F32 -> F32 (a copy): enough to prove that lowp_cast reaches this backend. */
static lowp_status td_cast(void *ctx, int32_t index, const lowp_tensor *src, lowp_tensor *dst,
                           const lowp_cast_cfg *cfg) {
    td_ctx *c = ctx;
    (void) cfg;
    if (bad_index(index)) return LOWP_ERR_INVALID_ARG;
    if (src->format != LOWP_FORMAT_F32 || dst->format != LOWP_FORMAT_F32)
        return LOWP_ERR_UNSUPPORTED;
    if (src->rows < 0 || src->cols < 0 || src->rows != dst->rows || src->cols != dst->cols)
        return LOWP_ERR_INVALID_ARG;
    size_t n = (size_t) src->rows * (size_t) src->cols * sizeof(float);
    lowp_status st = enqueue(c, index, dst->data, src->data, n, -1);
    if (st == LOWP_OK) {
        pthread_mutex_lock(&c->mu);
        c->q[index].cast_count++;
        pthread_mutex_unlock(&c->mu);
    }
    return st;
}

static void td_destroy(void *ctx) {
    td_ctx *c = ctx;
    pthread_mutex_lock(&g_live_mu);
    for (td_ctx **pp = &g_live; *pp; pp = &(*pp)->next_live) {
        if (*pp == c) {
            *pp = c->next_live;
            break;
        }
    }
    pthread_mutex_unlock(&g_live_mu);

    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    for (int i = 0; i < TD_DEVICES; i++) c->q[i].hold = 0;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < TD_DEVICES; i++)
        if (c->q[i].started) pthread_join(c->q[i].thread, NULL);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static const lowp_backend_iface k_iface = {
    .device_count = td_device_count,
    .caps = td_caps,
    .synchronize = td_synchronize,
    .alloc = td_alloc,
    .free = td_free,
    .memcpy_h2d = td_h2d,
    .memcpy_d2h = td_h2d, /* host memory either way: only the queue matters */
    .memcpy_d2d = td_d2d,
    .cast = td_cast,
    .destroy = td_destroy,
};

/* Each call makes a fresh context with its own workers: the library destroys it again when
 * it refuses the registration (a second load of this file under the same name). */
TD_API lowp_status lowp_backend_entry(lowp_backend_reg *reg) {
    td_ctx *c = calloc(1, sizeof *c);
    if (!c) return LOWP_ERR_OUT_OF_MEMORY;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    for (int i = 0; i < TD_DEVICES; i++) {
        td_worker_arg *arg = malloc(sizeof *arg);
        if (arg) *arg = (td_worker_arg){c, i};
        if (!arg || pthread_create(&c->q[i].thread, NULL, worker, arg) != 0) {
            free(arg);
            td_destroy(c); /* joins the workers already started */
            return LOWP_ERR_DEVICE;
        }
        c->q[i].started = 1;
    }
    pthread_mutex_lock(&g_live_mu);
    td_ctx **pp = &g_live;
    while (*pp) pp = &(*pp)->next_live;
    *pp = c;
    pthread_mutex_unlock(&g_live_mu);

    reg->api_version = LOWP_BACKEND_API_VERSION;
    reg->struct_size = sizeof *reg;
    reg->name = "testdev";
    reg->iface = &k_iface;
    reg->ctx = c;
    return LOWP_OK;
}

/* ---- test hooks -------------------------------------------------------------------------- */

/* Run `read` on the oldest live context's queue `index` under its lock. */
static long hook(int index, long (*read)(td_queue *q, long arg), long arg) {
    if (bad_index(index)) return -1;
    pthread_mutex_lock(&g_live_mu);
    td_ctx *c = g_live;
    long v = -1;
    if (c) {
        pthread_mutex_lock(&c->mu);
        v = read(&c->q[index], arg);
        pthread_cond_broadcast(&c->cv); /* a hold may have changed */
        pthread_mutex_unlock(&c->mu);
    }
    pthread_mutex_unlock(&g_live_mu);
    return v;
}

static long read_sync(td_queue *q, long arg) {
    (void) arg;
    return q->sync_count;
}
static long read_queued(td_queue *q, long arg) {
    (void) arg;
    return (long) (q->enqueued - q->completed);
}
static long read_casts(td_queue *q, long arg) {
    (void) arg;
    return q->cast_count;
}
static long read_allocs(td_queue *q, long arg) {
    (void) arg;
    return q->live_allocs;
}
static long set_hold(td_queue *q, long on) {
    q->hold = on != 0;
    return 0;
}

TD_API int testdev_sync_count(int index) {
    return (int) hook(index, read_sync, 0);
}
TD_API int testdev_queued(int index) {
    return (int) hook(index, read_queued, 0);
}
TD_API int testdev_cast_count(int index) {
    return (int) hook(index, read_casts, 0);
}
TD_API long testdev_live_allocs(int index) {
    return hook(index, read_allocs, 0);
}
TD_API int testdev_hold(int index, int on) {
    return (int) hook(index, set_hold, on);
}
TD_API void testdev_set_delay_us(int us) {
    atomic_store(&g_delay_us, us < 0 ? 0 : us);
}

TD_API int testdev_contexts(void) {
    pthread_mutex_lock(&g_live_mu);
    int n = 0;
    for (td_ctx *c = g_live; c; c = c->next_live) n++;
    pthread_mutex_unlock(&g_live_mu);
    return n;
}
