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
 *   context (CUDA_ERROR_ILLEGAL_ADDRESS, sticky), as a GPU faults;
 * - virtual memory management (vmm.c): reserved ranges, physical allocations mapped into them
 *   piece by piece, access granted per device;
 * - stream capture and graphs (graph.c): work queued on a capturing stream is kept in the
 *   capture instead of run; a graph instantiated from it queues a copy of that work on a
 *   stream at each launch.
 *
 * SOFTCUDA_COUNTS=FILE: at exit, each process appends to FILE a line per entry point it called,
 * `pid name calls` (the host's work per collective, in driver calls: a count, not a time).
 * With the counts, `pid events_live N`: the events made or opened and not destroyed.
 * SOFTCUDA_TRACE=1: every call of an entry point is written to stderr as it is made.
 */
#include "softcuda.h"

struct softcuda g = {PTHREAD_MUTEX_INITIALIZER, 0, 0, 1, {{0}}, NULL, NULL, 1, 0};
__thread struct ctx* current;
__thread int in_host_fn;
atomic_long live_events;

/* ---- counts of calls ------------------------------------------------------------------- */

#define MAX_COUNTED 96
static struct {
    const char* name;
    atomic_uint_fast64_t calls;
} counted[MAX_COUNTED];
static atomic_int ncounted;
static pthread_mutex_t count_mu = PTHREAD_MUTEX_INITIALIZER;

/* One more call of entry point `name`, whose place in the table `slot` keeps (-1: none yet). */
void count_call(const char* name, atomic_int* slot) {
    static int trace = -1;
    if (trace < 0) {
        const char* t = getenv("SOFTCUDA_TRACE");
        trace = t && !strcmp(t, "1");
    }
    if (trace) fprintf(stderr, "softcuda %d.%ld %s\n", (int)getpid(), (long)syscall(SYS_gettid), name);
    int k = atomic_load_explicit(slot, memory_order_acquire);
    if (k < 0) {
        pthread_mutex_lock(&count_mu);
        k = atomic_load(slot);
        if (k < 0 && atomic_load(&ncounted) < MAX_COUNTED) {
            k = atomic_load(&ncounted);
            counted[k].name = name;
            atomic_store(&ncounted, k + 1);
            atomic_store_explicit(slot, k, memory_order_release);
        }
        pthread_mutex_unlock(&count_mu);
        if (k < 0) return;
    }
    atomic_fetch_add_explicit(&counted[k].calls, 1, memory_order_relaxed);
}

__attribute__((destructor)) static void write_counts(void) {
    const char* path = getenv("SOFTCUDA_COUNTS");
    if (!path || !*path) return;
    FILE* f = fopen(path, "a");
    if (!f) return;
    int n = atomic_load(&ncounted);
    for (int k = 0; k < n; k++)
        fprintf(f, "%d %s %llu\n", (int)getpid(), counted[k].name,
                (unsigned long long)atomic_load(&counted[k].calls));
    fprintf(f, "%d events_live %ld\n", (int)getpid(), atomic_load(&live_events));
    fclose(f);
}

uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* Waits politely: spins a little, then yields, then sleeps. */
void pause_for(unsigned* tries) {
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

struct alloc* find_alloc_locked(uint64_t p) {
    for (struct alloc* a = g.allocs; a; a = a->next)
        if (p >= a->base && p < a->base + (a->size ? a->size : 1)) return a;
    return NULL;
}

struct alloc* find_alloc(uint64_t p) {
    pthread_mutex_lock(&g.mu);
    struct alloc* a = find_alloc_locked(p);
    pthread_mutex_unlock(&g.mu);
    return a;
}

/* Adds `a` to the allocations the driver knows, under a number of its own. */
void add_alloc(struct alloc* a) {
    pthread_mutex_lock(&g.mu);
    a->id = g.next_id++;
    a->next = g.allocs;
    g.allocs = a;
    pthread_mutex_unlock(&g.mu);
}

/* A memory file of `size` bytes (another process maps it through /proc): its descriptor, or
   -1. */
int memory_file(const char* name, size_t size) {
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd >= 0 && ftruncate(fd, (off_t)size) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* Unmaps and frees allocation `a`, taken out of the list already (its memory file, if any,
   closed). */
void unmap_alloc(struct alloc* a) {
    munmap((void*)(uintptr_t)a->base, a->size);
    if (a->fd >= 0) close(a->fd);
    free(a);
}

CUresult new_alloc(uint64_t* out, size_t size, int kind, int device) {
    if (size == 0) return E_INVALID_VALUE;
    int fd = memory_file("softcuda", size);
    if (fd < 0) return E_OUT_OF_MEMORY;
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
    add_alloc(a);
    *out = a->base;
    return OK;
}

CUresult free_alloc(uint64_t p, int kind) {
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
    /* Freed device memory may be anyone's next: another process still reading it through its
       mapping reads garbage (all ones: NaN as a float), not the old contents. */
    if (a->exported) memset((void*)(uintptr_t)a->base, 0xff, a->size);
    unmap_alloc(a);
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
    if (!a || a->kind == KIND_RESERVED) return 0;
    if (a->kind == KIND_PIECE) {
        /* Piece by piece, each granted to this device (access, not peer access). */
        while (len > 0) {
            if (!a || a->kind != KIND_PIECE || !((a->access >> c->device) & 1u)) return 0;
            uint64_t take = a->base + a->size - p;
            if (take > len) take = len;
            p += take;
            len -= take;
            a = len ? find_alloc(p) : a;
        }
        return 1;
    }
    if (p + len > a->base + a->size) return 0;
    if (a->kind == KIND_HOST) return 1;
    return a->device == c->device || c->peer[a->device];
}


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
        while (atomic_load(&o->ev->reached) < o->seq) {
            /* Waiting on another process's event that its owner destroyed: undefined in CUDA;
               here a fault of the waiting context, so that it shows. */
            if (o->opened && atomic_load(&o->ev->owner_gone)) {
                fault(s->ctx, E_ILLEGAL_ADDRESS);
                break;
            }
            pause_for(&tries);
        }
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

struct stream* new_stream(struct ctx* c, unsigned flags) {
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

/* Ops queued on `s` so far. */
uint64_t queued(struct stream* s) {
    pthread_mutex_lock(&s->mu);
    uint64_t q = s->queued;
    pthread_mutex_unlock(&s->mu);
    return q;
}

/* Queues on `s` a wait for what is queued on `other` now, unless `other` has run it. */
static void after(struct stream* s, struct stream* other) {
    uint64_t q = queued(other);
    if (atomic_load(&other->done) >= q) return;
    struct op* w = calloc(1, sizeof *w);
    w->kind = OP_WAIT_STREAM;
    w->other = other;
    w->seq = q;
    push(s, w);
}

/* Queues `o` on `s`, ordered as the legacy stream orders blocking streams: an op on the legacy
   stream after everything queued on the context's blocking streams, an op on a blocking stream
   after everything queued on the legacy stream. */
void enqueue(struct stream* s, struct op* o) {
    struct stream* legacy = s->ctx->legacy;
    if (s == legacy) {
        pthread_mutex_lock(&g.mu);
        for (struct stream* t = g.streams; t; t = t->next)
            if (t != s && t->ctx == s->ctx && !(t->flags & STREAM_NON_BLOCKING) && !t->destroyed)
                after(s, t);
        pthread_mutex_unlock(&g.mu);
    } else if (legacy && !(s->flags & STREAM_NON_BLOCKING)) {
        after(s, legacy);
    }
    push(s, o);
}

/* The stream a handle names: NULL, CU_STREAM_LEGACY (1) and CU_STREAM_PER_THREAD (2) are the
   current context's legacy stream. */
struct stream* stream_of(void* h) {
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

void wait_stream(struct stream* s, uint64_t upto) {
    unsigned tries = 0;
    while (atomic_load(&s->done) < upto) pause_for(&tries);
}

CUresult sync_stream(struct stream* s) {
    wait_stream(s, queued(s));
    return atomic_load(&s->ctx->sticky);
}

/* ---- initialization, devices, contexts -------------------------------------------------- */

CUresult cuInit(unsigned flags) {
    COUNT();
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

/* The driver's private tables, which NVRTC 12.9 asks for when it finds a libcuda.so.1 in the
   process: the model has none (without this entry point NVRTC read a table at NULL). Not
   counted: ferroccl never calls it. */
CUresult cuGetExportTable(const void** table, const void* id) {
    (void)id;
    if (table) *table = NULL;
    return E_NOT_SUPPORTED;
}

CUresult cuDriverGetVersion(int* v) {
    COUNT();
    if (!v) return E_INVALID_VALUE;
    const char* e = getenv("SOFTCUDA_VERSION");
    *v = e ? atoi(e) : 12080;
    return OK;
}

CUresult cuDeviceGetCount(int* n) {
    COUNT();
    CALL_CHECK();
    if (!n) return E_INVALID_VALUE;
    *n = g.ndev;
    return OK;
}

CUresult cuDeviceGet(CUdevice* d, int ordinal) {
    COUNT();
    CALL_CHECK();
    if (!d) return E_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= g.ndev) return E_INVALID_DEVICE;
    *d = ordinal;
    return OK;
}

CUresult cuDeviceGetAttribute(int* v, int attr, CUdevice d) {
    COUNT();
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
    COUNT();
    CALL_CHECK();
    if (!name || len <= 0) return E_INVALID_VALUE;
    if (d < 0 || d >= g.ndev) return E_INVALID_DEVICE;
    snprintf(name, (size_t)len, "softcuda device %d (no GPU)", d);
    return OK;
}

CUresult cuDeviceGetPCIBusId(char* id, int len, CUdevice d) {
    COUNT();
    CALL_CHECK();
    if (!id || len <= 0) return E_INVALID_VALUE;
    if (d < 0 || d >= g.ndev) return E_INVALID_DEVICE;
    snprintf(id, (size_t)len, "0000:%02x:00.0", 0x10 + d);
    return OK;
}

CUresult cuDeviceGetByPCIBusId(CUdevice* d, const char* id) {
    COUNT();
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
    COUNT();
    CALL_CHECK();
    if (!can) return E_INVALID_VALUE;
    if (d < 0 || d >= g.ndev || peer < 0 || peer >= g.ndev) return E_INVALID_DEVICE;
    *can = d != peer && g.peer_access;
    return OK;
}

CUresult cuDevicePrimaryCtxRetain(void** ctx, CUdevice d) {
    COUNT();
    CALL_CHECK();
    if (!ctx) return E_INVALID_VALUE;
    if (d < 0 || d >= g.ndev) return E_INVALID_DEVICE;
    *ctx = &g.ctxs[d];
    return OK;
}

CUresult cuCtxSetCurrent(void* ctx) {
    COUNT();
    CALL_CHECK();
    struct ctx* c = ctx;
    if (c && (c < &g.ctxs[0] || c >= &g.ctxs[g.ndev])) return E_INVALID_CONTEXT;
    current = c;
    return OK;
}

CUresult cuCtxGetCurrent(void** ctx) {
    COUNT();
    CALL_CHECK();
    if (!ctx) return E_INVALID_VALUE;
    *ctx = current;
    return OK;
}

CUresult cuCtxGetDevice(CUdevice* d) {
    COUNT();
    CTX_CHECK();
    if (!d) return E_INVALID_VALUE;
    *d = current->device;
    return OK;
}

CUresult cuCtxSynchronize(void) {
    COUNT();
    CTX_CHECK();
    SAFE_CALL();
    for (;;) {
        /* Every stream of the context, as queued now. */
        pthread_mutex_lock(&g.mu);
        struct stream* pending = NULL;
        uint64_t upto = 0;
        for (struct stream* s = g.streams; s && !pending; s = s->next) {
            uint64_t q = s->ctx == current ? queued(s) : 0;
            if (atomic_load(&s->done) < q) {
                pending = s;
                upto = q;
            }
        }
        pthread_mutex_unlock(&g.mu);
        if (!pending) break;
        wait_stream(pending, upto);
    }
    return atomic_load(&current->sticky);
}

CUresult cuCtxEnablePeerAccess(void* peer, unsigned flags) {
    COUNT();
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
    COUNT();
    if (!s) return E_INVALID_VALUE;
    switch (e) {
    case OK: *s = "no error"; break;
    case E_INVALID_VALUE: *s = "invalid argument"; break;
    case E_OUT_OF_MEMORY: *s = "out of memory"; break;
    case E_NOT_INITIALIZED: *s = "initialization error"; break;
    case E_INVALID_DEVICE: *s = "invalid device ordinal"; break;
    case E_INVALID_CONTEXT: *s = "invalid device context"; break;
    case E_INVALID_HANDLE: *s = "invalid resource handle"; break;
    case E_ILLEGAL_STATE: *s = "the operation cannot be performed in the present state"; break;
    case E_NOT_FOUND: *s = "named symbol not found"; break;
    case E_NOT_READY: *s = "device not ready"; break;
    case E_ILLEGAL_ADDRESS: *s = "an illegal memory access was encountered"; break;
    case E_PEER_ACCESS_UNSUPPORTED: *s = "peer access is not supported between these two devices"; break;
    case E_PEER_ACCESS_ALREADY_ENABLED: *s = "peer access is already enabled"; break;
    case E_NOT_PERMITTED: *s = "operation not permitted"; break;
    case E_NOT_SUPPORTED: *s = "operation not supported"; break;
    case E_CAPTURE_UNSUPPORTED: *s = "operation not permitted when stream is capturing"; break;
    case E_CAPTURE_INVALIDATED: *s = "operation failed due to a previous error during capture"; break;
    case E_CAPTURE_WRONG_THREAD: *s = "attempt to terminate a thread-local capture sequence from another thread"; break;
    default: *s = NULL; return E_INVALID_VALUE;
    }
    return OK;
}

