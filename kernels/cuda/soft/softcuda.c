/*
 * softcuda: a software model of the part of the CUDA driver API that ferroccl calls, built as a
 * shared library that ferroccl loads in place of libcuda.so.1 (FERROCCL_CUDA_DRIVER). It lets
 * the CUDA code paths (the CUDA reducer, its marks and interprocess events, the p2p transport's
 * cuda provider, windows through CUDA IPC, the C ABI on streams) run on a machine without a
 * GPU. It is a test model, not a GPU: what passes here still has to pass on one.
 *
 * Model:
 * - devices: SOFTCUDA_DEVICES of them (default 2), compute capability 9.0, 4 SMs; every pair
 *   can access each other (SOFTCUDA_PEER_ACCESS=0: none can);
 * - contexts: one primary context per device, current per thread; calls that need a context
 *   fail with CUDA_ERROR_INVALID_CONTEXT without one, as the driver's do; nothing may be called
 *   before cuInit;
 * - device memory: host memory in a memory file per allocation (so another process can map it
 *   through an IPC handle), its address the device pointer (unified addressing);
 * - streams: a thread each, running its queue in order (kernels, copies, event records and
 *   waits, host functions, 32-bit waits and writes); the legacy stream orders itself against
 *   the blocking streams of its context as CUDA's does; a host function that calls back into
 *   the driver gets CUDA_ERROR_NOT_PERMITTED;
 * - SOFTCUDA_DELAY_US: each stream waits up to that long (at random) before each piece of
 *   work, so that work runs well after the host went on, streams overtake each other, and a
 *   missing wait shows as a wrong result;
 * - events: the number of their last record, and of the last record reached; a wait or query
 *   is for the record that was the last one when it was made; interprocess events keep that
 *   state in a memory file the other process maps;
 * - kernels: the reduce-copy kernels of ferro_reduce.h, run on the host by the stream's thread
 *   (the same loop the GPU runs, as one thread); the module image is not looked at. A kernel
 *   that touches memory of another device whose context has no peer access to it fails the
 *   context (CUDA_ERROR_ILLEGAL_ADDRESS, sticky), as a GPU faults.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../ferro_reduce.h"

typedef int CUresult;
typedef int CUdevice;
typedef uint64_t CUdeviceptr;

enum {
    OK = 0,
    E_INVALID_VALUE = 1,
    E_OUT_OF_MEMORY = 2,
    E_NOT_INITIALIZED = 3,
    E_INVALID_DEVICE = 101,
    E_INVALID_CONTEXT = 201,
    E_INVALID_HANDLE = 400,
    E_NOT_FOUND = 500,
    E_NOT_READY = 600,
    E_ILLEGAL_ADDRESS = 700,
    E_PEER_ACCESS_ALREADY_ENABLED = 704,
    E_PEER_ACCESS_UNSUPPORTED = 217,
    E_NOT_PERMITTED = 800,
    E_NOT_SUPPORTED = 801,
};

#define MAX_DEVICES 8
#define IPC_MAGIC 0x4144554354464f53ull /* "SOFTCUDA" */
#define EVENT_INTERPROCESS 4u
#define EVENT_DISABLE_TIMING 2u
#define STREAM_NON_BLOCKING 1u

/* ---- state ---------------------------------------------------------------------------- */

struct ctx {
    int device;
    int peer[MAX_DEVICES];     /* peer access enabled to device d */
    atomic_int sticky;         /* a fault: every later call fails with it */
    struct stream* legacy;     /* made at first use */
};

struct op;

struct stream {
    struct ctx* ctx;
    unsigned flags;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct op* head;
    struct op* tail;
    uint64_t queued;           /* ops ever queued */
    atomic_uint_fast64_t done; /* ops run */
    int destroyed;
    struct stream* next;       /* in the list of all streams */
};

struct event_state {
    atomic_uint_fast64_t recorded; /* number of the last record */
    atomic_uint_fast64_t reached;  /* number of the last record its stream reached */
    atomic_uint_fast64_t when_ns;  /* when it was reached */
};

struct event {
    struct ctx* ctx;
    unsigned flags;
    struct event_state* st; /* own, or mapped from another process */
    int fd;                 /* interprocess: the memory file holding `st` */
};

struct alloc {
    uint64_t base, size;
    int kind; /* 1 host (page-locked), 2 device */
    int device;
    int fd;
    uint64_t id;
    int opened; /* mapped from another process (IPC): reference count */
    pid_t from_pid;
    uint64_t from_id;
    struct alloc* next;
};

enum op_kind { OP_KERNEL, OP_COPY, OP_RECORD, OP_WAIT_EVENT, OP_HOST_FN, OP_WAIT_VALUE,
               OP_WRITE_VALUE, OP_WAIT_STREAM };

typedef void (*kernel_fn)(struct ferro_rc_args, uint64_t, uint64_t);

struct op {
    enum op_kind kind;
    struct op* next;
    kernel_fn fn;
    struct ferro_rc_args args;
    void* dst;
    const void* src;
    size_t len;
    struct event_state* ev;
    uint64_t seq;
    void (*host)(void*);
    void* data;
    volatile uint32_t* word;
    uint32_t value;
    unsigned wflags;
    struct stream* other;
    void* staged; /* freed with the op */
};

static struct {
    pthread_mutex_t mu;
    int inited;
    int ndev;
    int peer_access;
    struct ctx ctxs[MAX_DEVICES];
    struct alloc* allocs;
    struct stream* streams;
    uint64_t next_id;
    unsigned delay_us;
} g = {PTHREAD_MUTEX_INITIALIZER, 0, 0, 1, {{0}}, NULL, NULL, 1, 0};

static __thread struct ctx* current;
static __thread int in_host_fn;

#define CALL_CHECK()                                \
    do {                                            \
        if (in_host_fn) return E_NOT_PERMITTED;     \
        if (!g.inited) return E_NOT_INITIALIZED;    \
    } while (0)

#define CTX_CHECK()                                                         \
    do {                                                                    \
        CALL_CHECK();                                                       \
        if (!current) return E_INVALID_CONTEXT;                             \
        if (atomic_load(&current->sticky)) return atomic_load(&current->sticky); \
    } while (0)

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* Waits politely: spins a little, then yields, then sleeps. */
static void pause_for(unsigned* tries) {
    if (*tries < 64) {
        (*tries)++;
    } else if (*tries < 2000) {
        (*tries)++;
        sched_yield();
    } else {
        struct timespec t = {0, 50000};
        nanosleep(&t, NULL);
    }
}

/* ---- memory ----------------------------------------------------------------------------- */

static struct alloc* find_alloc_locked(uint64_t p) {
    for (struct alloc* a = g.allocs; a; a = a->next)
        if (p >= a->base && p < a->base + (a->size ? a->size : 1)) return a;
    return NULL;
}

static struct alloc* find_alloc(uint64_t p) {
    pthread_mutex_lock(&g.mu);
    struct alloc* a = find_alloc_locked(p);
    pthread_mutex_unlock(&g.mu);
    return a;
}

static CUresult new_alloc(uint64_t* out, size_t size, int kind, int device) {
    if (size == 0) return E_INVALID_VALUE;
    int fd = memfd_create("softcuda", MFD_CLOEXEC);
    if (fd < 0) return E_OUT_OF_MEMORY;
    if (ftruncate(fd, (off_t)size) != 0) {
        close(fd);
        return E_OUT_OF_MEMORY;
    }
    void* p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return E_OUT_OF_MEMORY;
    }
    struct alloc* a = calloc(1, sizeof *a);
    a->base = (uint64_t)(uintptr_t)p;
    a->size = size;
    a->kind = kind;
    a->device = device;
    a->fd = fd;
    pthread_mutex_lock(&g.mu);
    a->id = g.next_id++;
    a->next = g.allocs;
    g.allocs = a;
    pthread_mutex_unlock(&g.mu);
    *out = a->base;
    return OK;
}

static CUresult free_alloc(uint64_t p, int kind) {
    pthread_mutex_lock(&g.mu);
    struct alloc** link = &g.allocs;
    while (*link && !((*link)->base == p && (*link)->kind == kind && !(*link)->opened))
        link = &(*link)->next;
    struct alloc* a = *link;
    if (!a) {
        pthread_mutex_unlock(&g.mu);
        return E_INVALID_VALUE;
    }
    *link = a->next;
    pthread_mutex_unlock(&g.mu);
    munmap((void*)(uintptr_t)a->base, a->size);
    close(a->fd);
    free(a);
    return OK;
}

/* ---- streams ---------------------------------------------------------------------------- */

static void fault(struct ctx* c, CUresult e) {
    int zero = 0;
    atomic_compare_exchange_strong(&c->sticky, &zero, e);
}

/* Whether a kernel of context `c` may touch [p, p + len): its own device's memory, or another
   device's with peer access; host memory the driver does not know faults. */
static int reaches(struct ctx* c, uint64_t p, uint64_t len) {
    if (len == 0) return 1;
    struct alloc* a = find_alloc(p);
    if (!a || p + len > a->base + a->size) return 0;
    if (a->kind == 1) return 1;
    return a->device == c->device || c->peer[a->device];
}

static uint64_t elem_size(const char* name) {
    const char* dt = strrchr(name, '_');
    if (!dt) return 1;
    dt++;
    if (!strcmp(dt, "i8") || !strcmp(dt, "u8") || !strncmp(dt, "fp8", 3)) return 1;
    if (!strcmp(dt, "f16") || !strcmp(dt, "bf16")) return 2;
    if (!strcmp(dt, "i32") || !strcmp(dt, "u32") || !strcmp(dt, "f32")) return 4;
    return 8;
}

struct kernel {
    const char* name;
    kernel_fn fn;
    uint64_t es;
};

static void run_op(struct stream* s, struct op* o) {
    switch (o->kind) {
    case OP_KERNEL: {
        struct ferro_rc_args* a = &o->args;
        uint64_t bytes = a->count * o->len; /* len holds the element size */
        for (uint32_t i = 0; i < a->nsrc && i < FERRO_RC_MAX_SRCS; i++)
            if (!reaches(s->ctx, a->src[i], bytes)) fault(s->ctx, E_ILLEGAL_ADDRESS);
        for (uint32_t i = 0; i < a->ndst && i < FERRO_RC_MAX_DSTS; i++)
            if (!reaches(s->ctx, a->dst[i], bytes)) fault(s->ctx, E_ILLEGAL_ADDRESS);
        if (!atomic_load(&s->ctx->sticky)) o->fn(*a, 0, 1);
        break;
    }
    case OP_COPY:
        if (o->len) memmove(o->dst, o->src, o->len);
        break;
    case OP_RECORD: {
        atomic_store(&o->ev->when_ns, now_ns());
        uint_fast64_t r = atomic_load(&o->ev->reached);
        while (r < o->seq && !atomic_compare_exchange_weak(&o->ev->reached, &r, o->seq)) {
        }
        break;
    }
    case OP_WAIT_EVENT: {
        unsigned tries = 0;
        while (atomic_load(&o->ev->reached) < o->seq) pause_for(&tries);
        break;
    }
    case OP_HOST_FN:
        in_host_fn = 1;
        o->host(o->data);
        in_host_fn = 0;
        break;
    case OP_WAIT_VALUE: {
        unsigned tries = 0;
        for (;;) {
            uint32_t v = __atomic_load_n(o->word, __ATOMIC_ACQUIRE);
            int ok;
            switch (o->wflags & 3u) {
            case 0: ok = (int32_t)(v - o->value) >= 0; break; /* GEQ */
            case 1: ok = v == o->value; break;                 /* EQ */
            case 2: ok = (v & o->value) != 0; break;           /* AND */
            default: ok = ~(v | ~o->value) != 0; break;        /* NOR */
            }
            if (ok) break;
            pause_for(&tries);
        }
        break;
    }
    case OP_WRITE_VALUE:
        __atomic_store_n(o->word, o->value, __ATOMIC_RELEASE);
        break;
    case OP_WAIT_STREAM: {
        unsigned tries = 0;
        while (atomic_load(&o->other->done) < o->seq) pause_for(&tries);
        break;
    }
    }
}

static void* stream_main(void* arg) {
    struct stream* s = arg;
    uint64_t seed = (uint64_t)(uintptr_t)s ^ now_ns();
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->head && !s->destroyed) pthread_cond_wait(&s->cv, &s->mu);
        struct op* o = s->head;
        if (!o) {
            pthread_mutex_unlock(&s->mu);
            return NULL; /* destroyed and drained: the stream's memory is kept (handles) */
        }
        pthread_mutex_unlock(&s->mu);
        if (g.delay_us) {
            /* Slow streams, each by its own random amount: work queued runs well after the
               host went on, and streams overtake each other, so a missing wait shows as a wrong
               result rather than hiding behind a fast copy. */
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            struct timespec t = {0, (long)((seed >> 33) % (g.delay_us + 1u)) * 1000L};
            nanosleep(&t, NULL);
        }
        run_op(s, o);
        pthread_mutex_lock(&s->mu);
        s->head = o->next;
        if (!s->head) s->tail = NULL;
        atomic_fetch_add(&s->done, 1);
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        free(o->staged);
        free(o);
    }
}

static struct stream* new_stream(struct ctx* c, unsigned flags) {
    struct stream* s = calloc(1, sizeof *s);
    s->ctx = c;
    s->flags = flags;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&at, 1 << 20);
    pthread_create(&s->thread, &at, stream_main, s);
    pthread_attr_destroy(&at);
    pthread_mutex_lock(&g.mu);
    s->next = g.streams;
    g.streams = s;
    pthread_mutex_unlock(&g.mu);
    return s;
}

static uint64_t push(struct stream* s, struct op* o) {
    pthread_mutex_lock(&s->mu);
    o->next = NULL;
    if (s->tail) s->tail->next = o;
    else s->head = o;
    s->tail = o;
    uint64_t n = ++s->queued;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* Queues `o` on `s`, ordered as the legacy stream orders blocking streams: an op on the legacy
   stream after everything queued on the context's blocking streams, an op on a blocking stream
   after everything queued on the legacy stream. */
static void enqueue(struct stream* s, struct op* o) {
    struct stream* legacy = s->ctx->legacy;
    if (s == legacy) {
        pthread_mutex_lock(&g.mu);
        for (struct stream* t = g.streams; t; t = t->next) {
            if (t == s || t->ctx != s->ctx || (t->flags & STREAM_NON_BLOCKING) || t->destroyed)
                continue;
            pthread_mutex_lock(&t->mu);
            uint64_t q = t->queued;
            pthread_mutex_unlock(&t->mu);
            if (atomic_load(&t->done) < q) {
                struct op* w = calloc(1, sizeof *w);
                w->kind = OP_WAIT_STREAM;
                w->other = t;
                w->seq = q;
                push(s, w);
            }
        }
        pthread_mutex_unlock(&g.mu);
    } else if (legacy && !(s->flags & STREAM_NON_BLOCKING)) {
        pthread_mutex_lock(&legacy->mu);
        uint64_t q = legacy->queued;
        pthread_mutex_unlock(&legacy->mu);
        if (atomic_load(&legacy->done) < q) {
            struct op* w = calloc(1, sizeof *w);
            w->kind = OP_WAIT_STREAM;
            w->other = legacy;
            w->seq = q;
            push(s, w);
        }
    }
    push(s, o);
}

/* The stream a handle names: NULL, CU_STREAM_LEGACY (1) and CU_STREAM_PER_THREAD (2) are the
   current context's legacy stream. */
static struct stream* stream_of(void* h) {
    uintptr_t v = (uintptr_t)h;
    if (v <= 2) {
        if (!current) return NULL;
        pthread_mutex_lock(&g.mu);
        int make = !current->legacy;
        pthread_mutex_unlock(&g.mu);
        if (make) {
            struct stream* s = new_stream(current, 0);
            pthread_mutex_lock(&g.mu);
            if (!current->legacy) current->legacy = s;
            else s->destroyed = 1; /* lost a race: unused */
            pthread_mutex_unlock(&g.mu);
        }
        return current->legacy;
    }
    return (struct stream*)h;
}

static void wait_stream(struct stream* s, uint64_t upto) {
    unsigned tries = 0;
    while (atomic_load(&s->done) < upto) pause_for(&tries);
}

static CUresult sync_stream(struct stream* s) {
    pthread_mutex_lock(&s->mu);
    uint64_t q = s->queued;
    pthread_mutex_unlock(&s->mu);
    wait_stream(s, q);
    return atomic_load(&s->ctx->sticky);
}

/* ---- initialization, devices, contexts -------------------------------------------------- */

CUresult cuInit(unsigned flags) {
    if (in_host_fn) return E_NOT_PERMITTED;
    if (flags != 0) return E_INVALID_VALUE;
    pthread_mutex_lock(&g.mu);
    if (!g.inited) {
        const char* n = getenv("SOFTCUDA_DEVICES");
        g.ndev = n ? atoi(n) : 2;
        if (g.ndev < 1) g.ndev = 1;
        if (g.ndev > MAX_DEVICES) g.ndev = MAX_DEVICES;
        const char* p = getenv("SOFTCUDA_PEER_ACCESS");
        g.peer_access = !(p && !strcmp(p, "0"));
        const char* dl = getenv("SOFTCUDA_DELAY_US");
        g.delay_us = dl ? (unsigned)atoi(dl) : 0;
        if (g.delay_us > 999999) g.delay_us = 999999;
        for (int d = 0; d < MAX_DEVICES; d++) g.ctxs[d].device = d;
        g.inited = 1;
    }
    pthread_mutex_unlock(&g.mu);
    return OK;
}

CUresult cuDriverGetVersion(int* v) {
    if (!v) return E_INVALID_VALUE;
    const char* e = getenv("SOFTCUDA_VERSION");
    *v = e ? atoi(e) : 12080;
    return OK;
}

CUresult cuDeviceGetCount(int* n) {
    CALL_CHECK();
    if (!n) return E_INVALID_VALUE;
    *n = g.ndev;
    return OK;
}

CUresult cuDeviceGet(CUdevice* d, int ordinal) {
    CALL_CHECK();
    if (!d) return E_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= g.ndev) return E_INVALID_DEVICE;
    *d = ordinal;
    return OK;
}

CUresult cuDeviceGetAttribute(int* v, int attr, CUdevice d) {
    CALL_CHECK();
    if (!v) return E_INVALID_VALUE;
    if (d < 0 || d >= g.ndev) return E_INVALID_DEVICE;
    switch (attr) {
    case 16: *v = 4; break;  /* multiprocessors */
    case 75: *v = 9; break;  /* compute capability major */
    case 76: *v = 0; break;  /* minor */
    case 19: *v = 1; break;  /* can map host memory */
    case 41: *v = 1; break;  /* unified addressing */
    case 92: *v = 1; break;  /* stream memory ops (v1 opt-in) */
    default: *v = 0; break;
    }
    return OK;
}

CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
    CALL_CHECK();
    if (!name || len <= 0) return E_INVALID_VALUE;
    if (d < 0 || d >= g.ndev) return E_INVALID_DEVICE;
    snprintf(name, (size_t)len, "softcuda device %d (no GPU)", d);
    return OK;
}

CUresult cuDeviceGetPCIBusId(char* id, int len, CUdevice d) {
    CALL_CHECK();
    if (!id || len <= 0) return E_INVALID_VALUE;
    if (d < 0 || d >= g.ndev) return E_INVALID_DEVICE;
    snprintf(id, (size_t)len, "0000:%02x:00.0", 0x10 + d);
    return OK;
}

CUresult cuDeviceGetByPCIBusId(CUdevice* d, const char* id) {
    CALL_CHECK();
    if (!d || !id) return E_INVALID_VALUE;
    unsigned dom = 0, bus = 0, dev = 0, fn = 0;
    if (sscanf(id, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4) return E_INVALID_VALUE;
    int o = (int)bus - 0x10;
    if (dom != 0 || dev != 0 || fn != 0 || o < 0 || o >= g.ndev) return E_INVALID_DEVICE;
    *d = o;
    return OK;
}

CUresult cuDeviceCanAccessPeer(int* can, CUdevice d, CUdevice peer) {
    CALL_CHECK();
    if (!can) return E_INVALID_VALUE;
    if (d < 0 || d >= g.ndev || peer < 0 || peer >= g.ndev) return E_INVALID_DEVICE;
    *can = d != peer && g.peer_access;
    return OK;
}

CUresult cuDevicePrimaryCtxRetain(void** ctx, CUdevice d) {
    CALL_CHECK();
    if (!ctx) return E_INVALID_VALUE;
    if (d < 0 || d >= g.ndev) return E_INVALID_DEVICE;
    *ctx = &g.ctxs[d];
    return OK;
}

CUresult cuCtxSetCurrent(void* ctx) {
    CALL_CHECK();
    struct ctx* c = ctx;
    if (c && (c < &g.ctxs[0] || c >= &g.ctxs[g.ndev])) return E_INVALID_CONTEXT;
    current = c;
    return OK;
}

CUresult cuCtxGetCurrent(void** ctx) {
    CALL_CHECK();
    if (!ctx) return E_INVALID_VALUE;
    *ctx = current;
    return OK;
}

CUresult cuCtxGetDevice(CUdevice* d) {
    CTX_CHECK();
    if (!d) return E_INVALID_VALUE;
    *d = current->device;
    return OK;
}

CUresult cuCtxSynchronize(void) {
    CTX_CHECK();
    for (;;) {
        /* Every stream of the context, as queued now. */
        pthread_mutex_lock(&g.mu);
        struct stream* pending = NULL;
        uint64_t upto = 0;
        for (struct stream* s = g.streams; s && !pending; s = s->next) {
            if (s->ctx != current) continue;
            pthread_mutex_lock(&s->mu);
            if (atomic_load(&s->done) < s->queued) {
                pending = s;
                upto = s->queued;
            }
            pthread_mutex_unlock(&s->mu);
        }
        pthread_mutex_unlock(&g.mu);
        if (!pending) break;
        wait_stream(pending, upto);
    }
    return atomic_load(&current->sticky);
}

CUresult cuCtxEnablePeerAccess(void* peer, unsigned flags) {
    CTX_CHECK();
    struct ctx* p = peer;
    if (flags != 0) return E_INVALID_VALUE;
    if (!p || p < &g.ctxs[0] || p >= &g.ctxs[g.ndev]) return E_INVALID_CONTEXT;
    if (p == current || !g.peer_access) return E_PEER_ACCESS_UNSUPPORTED;
    pthread_mutex_lock(&g.mu);
    int was = current->peer[p->device];
    current->peer[p->device] = 1;
    pthread_mutex_unlock(&g.mu);
    return was ? E_PEER_ACCESS_ALREADY_ENABLED : OK;
}

CUresult cuGetErrorString(CUresult e, const char** s) {
    if (!s) return E_INVALID_VALUE;
    switch (e) {
    case OK: *s = "no error"; break;
    case E_INVALID_VALUE: *s = "invalid argument"; break;
    case E_OUT_OF_MEMORY: *s = "out of memory"; break;
    case E_NOT_INITIALIZED: *s = "initialization error"; break;
    case E_INVALID_DEVICE: *s = "invalid device ordinal"; break;
    case E_INVALID_CONTEXT: *s = "invalid device context"; break;
    case E_INVALID_HANDLE: *s = "invalid resource handle"; break;
    case E_NOT_FOUND: *s = "named symbol not found"; break;
    case E_NOT_READY: *s = "device not ready"; break;
    case E_ILLEGAL_ADDRESS: *s = "an illegal memory access was encountered"; break;
    case E_PEER_ACCESS_UNSUPPORTED: *s = "peer access is not supported between these two devices"; break;
    case E_PEER_ACCESS_ALREADY_ENABLED: *s = "peer access is already enabled"; break;
    case E_NOT_PERMITTED: *s = "operation not permitted"; break;
    case E_NOT_SUPPORTED: *s = "operation not supported"; break;
    default: *s = NULL; return E_INVALID_VALUE;
    }
    return OK;
}

/* ---- memory ----------------------------------------------------------------------------- */

CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t size) {
    CTX_CHECK();
    if (!p) return E_INVALID_VALUE;
    return new_alloc(p, size, 2, current->device);
}

CUresult cuMemFree_v2(CUdeviceptr p) {
    CALL_CHECK();
    return free_alloc(p, 2);
}

CUresult cuMemAllocHost_v2(void** p, size_t size) {
    CTX_CHECK();
    if (!p) return E_INVALID_VALUE;
    uint64_t a = 0;
    CUresult r = new_alloc(&a, size, 1, current->device);
    *p = (void*)(uintptr_t)a;
    return r;
}

CUresult cuMemHostAlloc(void** p, size_t size, unsigned flags) {
    (void)flags;
    return cuMemAllocHost_v2(p, size);
}

CUresult cuMemFreeHost(void* p) {
    CALL_CHECK();
    return free_alloc((uint64_t)(uintptr_t)p, 1);
}

CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* d, void* p, unsigned flags) {
    CTX_CHECK();
    if (!d || flags != 0) return E_INVALID_VALUE;
    struct alloc* a = find_alloc((uint64_t)(uintptr_t)p);
    if (!a || a->kind != 1) return E_INVALID_VALUE;
    *d = (uint64_t)(uintptr_t)p;
    return OK;
}

CUresult cuPointerGetAttribute(void* out, int attr, CUdeviceptr p) {
    CALL_CHECK();
    if (!out) return E_INVALID_VALUE;
    struct alloc* a = find_alloc(p);
    if (!a) return E_INVALID_VALUE; /* pageable host memory: unknown to the driver */
    switch (attr) {
    case 2: *(unsigned*)out = (unsigned)a->kind; break;           /* memory type */
    case 9: *(int*)out = a->device; break;                        /* device ordinal */
    case 10: *(unsigned*)out = a->kind == 2; break;               /* legacy IPC capable */
    case 11: *(CUdeviceptr*)out = a->base; break;                 /* range start */
    case 12: *(size_t*)out = a->size; break;                      /* range size */
    case 13: *(unsigned*)out = 1; break;                          /* mapped */
    default: return E_INVALID_VALUE;
    }
    return OK;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr p) {
    CTX_CHECK();
    struct alloc* a = find_alloc(p);
    if (!a || a->kind != 2) return E_NOT_FOUND;
    if (base) *base = a->base;
    if (size) *size = a->size;
    return OK;
}

/* ---- streams, copies, kernels ----------------------------------------------------------- */

CUresult cuStreamCreate(void** s, unsigned flags) {
    CTX_CHECK();
    if (!s || (flags & ~STREAM_NON_BLOCKING)) return E_INVALID_VALUE;
    *s = new_stream(current, flags);
    return OK;
}

CUresult cuStreamDestroy_v2(void* h) {
    CALL_CHECK();
    if ((uintptr_t)h <= 2) return E_INVALID_HANDLE;
    struct stream* s = h;
    pthread_mutex_lock(&s->mu);
    s->destroyed = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return OK;
}

CUresult cuStreamSynchronize(void* h) {
    CALL_CHECK();
    struct stream* s = stream_of(h);
    if (!s) return E_INVALID_CONTEXT;
    return sync_stream(s);
}

CUresult cuStreamIsCapturing(void* h, int* status) {
    CALL_CHECK();
    if ((uintptr_t)h <= 2 && !current) return E_INVALID_CONTEXT;
    if (!status) return E_INVALID_VALUE;
    *status = 0;
    return OK;
}

/* A call on stream `h`: the legacy stream needs a current context, another stream carries its
   own. Fails with the context's fault, if any. */
#define STREAM_CHECK(s, h)                                         \
    CALL_CHECK();                                                  \
    struct stream* s = stream_of(h);                               \
    if (!s) return E_INVALID_CONTEXT;                              \
    if (atomic_load(&s->ctx->sticky)) return atomic_load(&s->ctx->sticky)

/* A copy on stream `h`, as the driver makes them: from pageable host memory (memory it does
   not know) the bytes are taken at the call (staged), so the caller may reuse them once it
   returns; to pageable host memory the call returns once the copy is done. */
static CUresult copy_on(void* h, void* dst, const void* src, size_t len, int sync) {
    STREAM_CHECK(s, h);
    if (len && (!dst || !src)) return E_INVALID_VALUE;
    struct op* o = calloc(1, sizeof *o);
    o->kind = OP_COPY;
    o->dst = dst;
    o->src = src;
    o->len = len;
    if (len && !find_alloc((uint64_t)(uintptr_t)src)) {
        o->staged = malloc(len);
        memcpy(o->staged, src, len);
        o->src = o->staged;
    }
    if (len && !find_alloc((uint64_t)(uintptr_t)dst)) sync = 1;
    enqueue(s, o);
    if (sync) {
        pthread_mutex_lock(&s->mu);
        uint64_t q = s->queued;
        pthread_mutex_unlock(&s->mu);
        wait_stream(s, q);
    }
    return atomic_load(&s->ctx->sticky);
}

#define DPTR(p) ((void*)(uintptr_t)(p))

CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void* h, size_t n) { return copy_on(NULL, DPTR(d), h, n, 1); }
CUresult cuMemcpyDtoH_v2(void* h, CUdeviceptr d, size_t n) { return copy_on(NULL, h, DPTR(d), n, 1); }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void* h, size_t n, void* s) { return copy_on(s, DPTR(d), h, n, 0); }
CUresult cuMemcpyDtoHAsync_v2(void* h, CUdeviceptr d, size_t n, void* s) { return copy_on(s, h, DPTR(d), n, 0); }
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr src, size_t n, void* s) { return copy_on(s, DPTR(d), DPTR(src), n, 0); }
CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr src, size_t n, void* s) { return copy_on(s, DPTR(d), DPTR(src), n, 0); }

struct module {
    struct ctx* ctx;
};

struct function {
    struct ctx* ctx;
    kernel_fn fn;
    uint64_t es;
};

#define SOFT_KERNEL(OP, DT, N, O) \
    static void soft_##OP##_##DT(struct ferro_rc_args a, uint64_t t, uint64_t n) { ferro_rc_##OP##_##DT(a, t, n); }
FERRO_FOR_EACH_KERNEL(SOFT_KERNEL)
#undef SOFT_KERNEL

#define SOFT_ENTRY(OP, DT, N, O) {"ferro_reduce_copy_" #OP "_" #DT, soft_##OP##_##DT, 0},
static struct kernel kernels[] = {FERRO_FOR_EACH_KERNEL(SOFT_ENTRY){NULL, NULL, 0}};
#undef SOFT_ENTRY

CUresult cuModuleLoadData(void** m, const void* image) {
    CTX_CHECK();
    if (!m || !image) return E_INVALID_VALUE;
    struct module* mod = calloc(1, sizeof *mod);
    mod->ctx = current;
    *m = mod;
    return OK;
}

CUresult cuModuleGetFunction(void** f, void* m, const char* name) {
    CALL_CHECK();
    if (!f || !m || !name) return E_INVALID_VALUE;
    for (struct kernel* k = kernels; k->name; k++) {
        if (strcmp(k->name, name)) continue;
        struct function* fn = calloc(1, sizeof *fn);
        fn->ctx = ((struct module*)m)->ctx;
        fn->fn = k->fn;
        fn->es = elem_size(name);
        *f = fn;
        return OK;
    }
    return E_NOT_FOUND;
}

CUresult cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shmem, void* h, void** params, void** extra) {
    CTX_CHECK();
    (void)shmem;
    struct function* fn = f;
    if (!fn || !params || extra) return E_INVALID_VALUE;
    if (!gx || !gy || !gz || !bx || !by || !bz || (uint64_t)bx * by * bz > 1024) return E_INVALID_VALUE;
    struct stream* s = stream_of(h);
    /* The function's context is current, and the stream is one of it. */
    if (fn->ctx != current || s->ctx != current) return E_INVALID_CONTEXT;
    struct op* o = calloc(1, sizeof *o);
    o->kind = OP_KERNEL;
    o->fn = fn->fn;
    memcpy(&o->args, params[0], sizeof o->args); /* parameters are copied at the launch */
    o->len = fn->es;
    enqueue(s, o);
    return OK;
}

CUresult cuLaunchHostFunc(void* h, void (*fn)(void*), void* data) {
    STREAM_CHECK(s, h);
    if (!fn) return E_INVALID_VALUE;
    struct op* o = calloc(1, sizeof *o);
    o->kind = OP_HOST_FN;
    o->host = fn;
    o->data = data;
    enqueue(s, o);
    return OK;
}

static CUresult value_op(void* h, CUdeviceptr addr, uint32_t value, unsigned flags, int wait) {
    STREAM_CHECK(s, h);
    if (!addr || addr % 4) return E_INVALID_VALUE;
    struct alloc* a = find_alloc(addr);
    if (!a) return E_INVALID_VALUE;
    struct op* o = calloc(1, sizeof *o);
    o->kind = wait ? OP_WAIT_VALUE : OP_WRITE_VALUE;
    o->word = (volatile uint32_t*)(uintptr_t)addr;
    o->value = value;
    o->wflags = flags;
    enqueue(s, o);
    return OK;
}

CUresult cuStreamWaitValue32_v2(void* h, CUdeviceptr a, uint32_t v, unsigned f) { return value_op(h, a, v, f, 1); }
CUresult cuStreamWaitValue32(void* h, CUdeviceptr a, uint32_t v, unsigned f) { return value_op(h, a, v, f, 1); }
CUresult cuStreamWriteValue32_v2(void* h, CUdeviceptr a, uint32_t v, unsigned f) { return value_op(h, a, v, f, 0); }
CUresult cuStreamWriteValue32(void* h, CUdeviceptr a, uint32_t v, unsigned f) { return value_op(h, a, v, f, 0); }

/* ---- events ----------------------------------------------------------------------------- */

static struct event_state* shared_state(int* fd_out) {
    int fd = memfd_create("softcuda-event", MFD_CLOEXEC);
    if (fd < 0) return NULL;
    if (ftruncate(fd, 4096) != 0) {
        close(fd);
        return NULL;
    }
    void* p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return NULL;
    }
    *fd_out = fd;
    return p;
}

CUresult cuEventCreate(void** e, unsigned flags) {
    CTX_CHECK();
    if (!e || (flags & ~7u)) return E_INVALID_VALUE;
    if ((flags & EVENT_INTERPROCESS) && !(flags & EVENT_DISABLE_TIMING)) return E_INVALID_VALUE;
    struct event* ev = calloc(1, sizeof *ev);
    ev->ctx = current;
    ev->flags = flags;
    ev->fd = -1;
    if (flags & EVENT_INTERPROCESS) {
        ev->st = shared_state(&ev->fd);
        if (!ev->st) {
            free(ev);
            return E_OUT_OF_MEMORY;
        }
    } else {
        ev->st = calloc(1, sizeof *ev->st);
    }
    *e = ev;
    return OK;
}

CUresult cuEventDestroy_v2(void* e) {
    CALL_CHECK();
    if (!e) return E_INVALID_HANDLE;
    /* Records and waits still queued may use its state: it is kept. */
    return OK;
}

CUresult cuEventRecord(void* e, void* h) {
    STREAM_CHECK(s, h);
    struct event* ev = e;
    if (!ev) return E_INVALID_HANDLE;
    /* The event and the stream are of one context. */
    if (ev->ctx != s->ctx) return E_INVALID_HANDLE;
    struct op* o = calloc(1, sizeof *o);
    o->kind = OP_RECORD;
    o->ev = ev->st;
    o->seq = atomic_fetch_add(&ev->st->recorded, 1) + 1;
    enqueue(s, o);
    return OK;
}

CUresult cuStreamWaitEvent(void* h, void* e, unsigned flags) {
    STREAM_CHECK(s, h);
    struct event* ev = e;
    if (!ev || flags != 0) return E_INVALID_VALUE;
    uint64_t target = atomic_load(&ev->st->recorded);
    if (atomic_load(&ev->st->reached) >= target) return OK;
    struct op* o = calloc(1, sizeof *o);
    o->kind = OP_WAIT_EVENT;
    o->ev = ev->st;
    o->seq = target;
    enqueue(s, o);
    return OK;
}

CUresult cuEventQuery(void* e) {
    CALL_CHECK();
    struct event* ev = e;
    if (!ev) return E_INVALID_HANDLE;
    if (atomic_load(&ev->ctx->sticky)) return atomic_load(&ev->ctx->sticky);
    return atomic_load(&ev->st->reached) >= atomic_load(&ev->st->recorded) ? OK : E_NOT_READY;
}

CUresult cuEventSynchronize(void* e) {
    CALL_CHECK();
    struct event* ev = e;
    if (!ev) return E_INVALID_HANDLE;
    uint64_t target = atomic_load(&ev->st->recorded);
    unsigned tries = 0;
    while (atomic_load(&ev->st->reached) < target) pause_for(&tries);
    return atomic_load(&ev->ctx->sticky);
}

CUresult cuEventElapsedTime(float* ms, void* a, void* b) {
    CALL_CHECK();
    struct event *x = a, *y = b;
    if (!ms || !x || !y) return E_INVALID_VALUE;
    if ((x->flags | y->flags) & EVENT_DISABLE_TIMING) return E_INVALID_HANDLE;
    if (atomic_load(&x->st->reached) < atomic_load(&x->st->recorded) ||
        atomic_load(&y->st->reached) < atomic_load(&y->st->recorded))
        return E_NOT_READY;
    if (!atomic_load(&x->st->recorded) || !atomic_load(&y->st->recorded)) return E_INVALID_HANDLE;
    *ms = (float)((double)((int64_t)(atomic_load(&y->st->when_ns) - atomic_load(&x->st->when_ns))) / 1e6);
    return OK;
}

/* ---- interprocess memory and events ------------------------------------------------------ */

struct ipc_handle {
    uint64_t magic;
    uint64_t pid;
    uint64_t fd;
    uint64_t size;
    uint64_t id;
    uint64_t device;
    uint64_t kind; /* 1 memory, 2 event */
    uint64_t pad;
};

typedef struct {
    unsigned char bytes[64];
} CUipcHandle;

static int open_from(const struct ipc_handle* h, size_t size, void** out) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%llu/fd/%llu", (unsigned long long)h->pid,
             (unsigned long long)h->fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return -1;
    void* p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return -1;
    *out = p;
    return 0;
}

CUresult cuIpcGetMemHandle(CUipcHandle* out, CUdeviceptr p) {
    CTX_CHECK();
    if (!out) return E_INVALID_VALUE;
    pthread_mutex_lock(&g.mu);
    struct alloc* a = find_alloc_locked(p);
    struct ipc_handle h = {0};
    int ok = a && a->kind == 2 && a->base == p && !a->opened;
    if (ok) {
        h = (struct ipc_handle){IPC_MAGIC, (uint64_t)getpid(), (uint64_t)a->fd, a->size, a->id,
                                (uint64_t)a->device, 1, 0};
    }
    pthread_mutex_unlock(&g.mu);
    if (!ok) return E_INVALID_VALUE;
    memset(out, 0, sizeof *out);
    memcpy(out->bytes, &h, sizeof h);
    return OK;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* p, CUipcHandle handle, unsigned flags) {
    CTX_CHECK();
    struct ipc_handle h;
    memcpy(&h, handle.bytes, sizeof h);
    if (!p || h.magic != IPC_MAGIC || h.kind != 1) return E_INVALID_VALUE;
    if (h.pid == (uint64_t)getpid()) return E_INVALID_CONTEXT; /* not in the exporting process */
    pthread_mutex_lock(&g.mu);
    for (struct alloc* a = g.allocs; a; a = a->next) {
        if (a->opened && a->from_pid == (pid_t)h.pid && a->from_id == h.id) {
            a->opened++;
            *p = a->base;
            pthread_mutex_unlock(&g.mu);
            return OK;
        }
    }
    pthread_mutex_unlock(&g.mu);
    if ((int)h.device != current->device) {
        /* Another device's memory: reachable only through peer access, which the lazy flag
           enables. */
        if (!g.peer_access) return E_PEER_ACCESS_UNSUPPORTED;
        if (!(flags & 1u)) return E_INVALID_VALUE;
        pthread_mutex_lock(&g.mu);
        current->peer[h.device % MAX_DEVICES] = 1;
        pthread_mutex_unlock(&g.mu);
    }
    void* m = NULL;
    if (open_from(&h, h.size, &m) != 0) return E_INVALID_VALUE;
    struct alloc* a = calloc(1, sizeof *a);
    a->base = (uint64_t)(uintptr_t)m;
    a->size = h.size;
    a->kind = 2;
    a->device = (int)h.device;
    a->fd = -1;
    a->opened = 1;
    a->from_pid = (pid_t)h.pid;
    a->from_id = h.id;
    pthread_mutex_lock(&g.mu);
    a->id = g.next_id++;
    a->next = g.allocs;
    g.allocs = a;
    pthread_mutex_unlock(&g.mu);
    *p = a->base;
    return OK;
}

CUresult cuIpcOpenMemHandle(CUdeviceptr* p, CUipcHandle handle, unsigned flags) {
    return cuIpcOpenMemHandle_v2(p, handle, flags);
}

CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
    CTX_CHECK();
    pthread_mutex_lock(&g.mu);
    struct alloc** link = &g.allocs;
    while (*link && !((*link)->base == p && (*link)->opened)) link = &(*link)->next;
    struct alloc* a = *link;
    if (!a) {
        pthread_mutex_unlock(&g.mu);
        return E_INVALID_VALUE;
    }
    if (--a->opened > 0) {
        pthread_mutex_unlock(&g.mu);
        return OK;
    }
    *link = a->next;
    pthread_mutex_unlock(&g.mu);
    munmap((void*)(uintptr_t)a->base, a->size);
    free(a);
    return OK;
}

CUresult cuIpcGetEventHandle(CUipcHandle* out, void* e) {
    CTX_CHECK();
    struct event* ev = e;
    if (!out || !ev || !(ev->flags & EVENT_INTERPROCESS)) return E_INVALID_VALUE;
    struct ipc_handle h = {IPC_MAGIC, (uint64_t)getpid(), (uint64_t)ev->fd, 4096, 0,
                           (uint64_t)ev->ctx->device, 2, 0};
    memset(out, 0, sizeof *out);
    memcpy(out->bytes, &h, sizeof h);
    return OK;
}

CUresult cuIpcOpenEventHandle(void** e, CUipcHandle handle) {
    CTX_CHECK();
    struct ipc_handle h;
    memcpy(&h, handle.bytes, sizeof h);
    if (!e || h.magic != IPC_MAGIC || h.kind != 2) return E_INVALID_VALUE;
    if (h.pid == (uint64_t)getpid()) return E_INVALID_CONTEXT; /* not in the exporting process */
    void* m = NULL;
    if (open_from(&h, 4096, &m) != 0) return E_INVALID_VALUE;
    struct event* ev = calloc(1, sizeof *ev);
    ev->ctx = current;
    ev->flags = EVENT_INTERPROCESS | EVENT_DISABLE_TIMING;
    ev->st = m;
    ev->fd = -1;
    *e = ev;
    return OK;
}
