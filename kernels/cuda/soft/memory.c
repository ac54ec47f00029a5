/*
 * softcuda's memory, copies, kernels, stream memory operations, events and interprocess
 * handles (see softcuda.c for the model).
 */
#include "softcuda.h"

/* ---- memory ----------------------------------------------------------------------------- */

CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t size) {
    COUNT();
    CTX_CHECK();
    SAFE_CALL();
    if (!p) return E_INVALID_VALUE;
    return new_alloc(p, size, 2, current->device);
}

CUresult cuMemFree_v2(CUdeviceptr p) {
    COUNT();
    CALL_CHECK();
    SAFE_CALL();
    return free_alloc(p, 2);
}

static CUresult host_alloc(void** p, size_t size) {
    CTX_CHECK();
    SAFE_CALL();
    if (!p) return E_INVALID_VALUE;
    uint64_t a = 0;
    CUresult r = new_alloc(&a, size, 1, current->device);
    *p = (void*)(uintptr_t)a;
    return r;
}

CUresult cuMemAllocHost_v2(void** p, size_t size) {
    COUNT();
    return host_alloc(p, size);
}

CUresult cuMemHostAlloc(void** p, size_t size, unsigned flags) {
    COUNT();
    (void)flags;
    return host_alloc(p, size);
}

CUresult cuMemFreeHost(void* p) {
    COUNT();
    CALL_CHECK();
    SAFE_CALL();
    return free_alloc((uint64_t)(uintptr_t)p, 1);
}

CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* d, void* p, unsigned flags) {
    COUNT();
    CTX_CHECK();
    if (!d || flags != 0) return E_INVALID_VALUE;
    struct alloc* a = find_alloc((uint64_t)(uintptr_t)p);
    if (!a || a->kind != 1) return E_INVALID_VALUE;
    *d = (uint64_t)(uintptr_t)p;
    return OK;
}

/* Attribute `attr` of allocation `a` into `out`. An address of a reservation that no piece
   maps answers its range and that it is not mapped, nothing else. */
static CUresult attribute_of(struct alloc* a, void* out, int attr) {
    int vmm = a->kind == KIND_RESERVED || a->kind == KIND_PIECE;
    if (a->kind == KIND_RESERVED && attr != 11 && attr != 12 && attr != 13) return E_INVALID_VALUE;
    switch (attr) {
    case 2: *(unsigned*)out = a->kind == KIND_HOST ? 1u : 2u; break;      /* memory type */
    case 9: *(int*)out = a->device; break;                                /* device ordinal */
    case 10: *(unsigned*)out = a->kind == KIND_DEVICE; break;             /* legacy IPC capable */
    case 11: *(CUdeviceptr*)out = vmm ? a->range_base : a->base; break;   /* range start */
    case 12: *(size_t*)out = vmm ? a->range_size : a->size; break;        /* range size */
    case 13: *(unsigned*)out = a->kind != KIND_RESERVED; break;           /* mapped */
    default: return E_INVALID_VALUE;
    }
    return OK;
}

CUresult cuPointerGetAttribute(void* out, int attr, CUdeviceptr p) {
    COUNT();
    CALL_CHECK();
    if (!out) return E_INVALID_VALUE;
    struct alloc* a = find_alloc(p);
    if (!a) return E_INVALID_VALUE; /* pageable host memory: unknown to the driver */
    return attribute_of(a, out, attr);
}

/* Several attributes at once. An address the driver does not know is no error here, as in the
   driver: every attribute reads as zero (memory type 0: none). */
CUresult cuPointerGetAttributes(unsigned n, int* attrs, void** data, CUdeviceptr p) {
    COUNT();
    CALL_CHECK();
    if (!attrs || !data) return E_INVALID_VALUE;
    /* SOFTCUDA_POINTER_ATTRIBUTES=0: a driver that refuses the call (its callers' fallback). */
    const char* off = getenv("SOFTCUDA_POINTER_ATTRIBUTES");
    if (off && !strcmp(off, "0")) return E_INVALID_VALUE;
    struct alloc* a = find_alloc(p);
    for (unsigned i = 0; i < n; i++) {
        if (!data[i]) return E_INVALID_VALUE;
        if (a && !(a->kind == KIND_RESERVED && attrs[i] != 11 && attrs[i] != 12 && attrs[i] != 13)) {
            CUresult r = attribute_of(a, data[i], attrs[i]);
            if (r != OK) return r;
        } else if (attrs[i] == 11 || attrs[i] == 12) {
            *(uint64_t*)data[i] = 0;
        } else if (attrs[i] == 2 || attrs[i] == 9 || attrs[i] == 10 || attrs[i] == 13) {
            *(unsigned*)data[i] = 0;
        } else {
            return E_INVALID_VALUE;
        }
    }
    return OK;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr p) {
    COUNT();
    CTX_CHECK();
    struct alloc* a = find_alloc(p);
    if (!a || (a->kind != KIND_DEVICE && a->kind != KIND_PIECE)) return E_NOT_FOUND;
    if (base) *base = a->base;
    if (size) *size = a->size;
    return OK;
}

/* ---- streams, copies, kernels ----------------------------------------------------------- */

CUresult cuStreamCreate(void** s, unsigned flags) {
    COUNT();
    CTX_CHECK();
    if (!s || (flags & ~STREAM_NON_BLOCKING)) return E_INVALID_VALUE;
    *s = new_stream(current, flags);
    return OK;
}

CUresult cuStreamDestroy_v2(void* h) {
    COUNT();
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
    COUNT();
    CALL_CHECK();
    struct stream* s = stream_of(h);
    if (!s) return E_INVALID_CONTEXT;
    NOT_CAPTURING(s);
    return sync_stream(s);
}

/* Whether everything queued on stream `h` has run: CUDA_ERROR_NOT_READY while not. */
CUresult cuStreamQuery(void* h) {
    COUNT();
    STREAM_CHECK(s, h);
    NOT_CAPTURING(s);
    return atomic_load(&s->done) >= queued(s) ? atomic_load(&s->ctx->sticky) : E_NOT_READY;
}


/* Whether [p, p + len) holds an address of a reservation that no piece maps (which the
   driver refuses to copy, and the model cannot touch). */
static int unmapped(uint64_t p, uint64_t len) {
    struct alloc* a = find_alloc(p);
    if (!a || (a->kind != KIND_PIECE && a->kind != KIND_RESERVED)) return 0;
    for (uint64_t end = p + len; p < end;) {
        if (!a || a->kind != KIND_PIECE) return 1;
        p = a->base + a->size;
        a = p < end ? find_alloc(p) : a;
    }
    return 0;
}

/* A copy on stream `h`, as the driver makes them: from pageable host memory (memory it does
   not know) the bytes are taken at the call (staged), so the caller may reuse them once it
   returns; to pageable host memory the call returns once the copy is done. On a capturing
   stream an asynchronous copy is kept in the capture, its source read when the graph runs; a
   synchronous one is refused. */
static CUresult copy_on(void* h, void* dst, const void* src, size_t len, int sync) {
    STREAM_CHECK(s, h);
    if (len && (!dst || !src)) return E_INVALID_VALUE;
    if (sync) {
        SAFE_CALL();
        NOT_CAPTURING(s);
    }
    if (len && (unmapped((uint64_t)(uintptr_t)src, len) || unmapped((uint64_t)(uintptr_t)dst, len)))
        return E_INVALID_VALUE;
    struct op* o = calloc(1, sizeof *o);
    o->kind = OP_COPY;
    o->dst = dst;
    o->src = src;
    o->len = len;
    CUresult r;
    if (capture_op(s, o, &r)) return r;
    if (len && !find_alloc((uint64_t)(uintptr_t)src)) {
        o->staged = malloc(len);
        memcpy(o->staged, src, len);
        o->src = o->staged;
    }
    if (len && !find_alloc((uint64_t)(uintptr_t)dst)) sync = 1;
    enqueue(s, o);
    return sync ? sync_stream(s) : atomic_load(&s->ctx->sticky);
}

#define DPTR(p) ((void*)(uintptr_t)(p))

CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void* h, size_t n) {
    COUNT();
    return copy_on(NULL, DPTR(d), h, n, 1);
}
CUresult cuMemcpyDtoH_v2(void* h, CUdeviceptr d, size_t n) {
    COUNT();
    return copy_on(NULL, h, DPTR(d), n, 1);
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void* h, size_t n, void* s) {
    COUNT();
    return copy_on(s, DPTR(d), h, n, 0);
}
CUresult cuMemcpyDtoHAsync_v2(void* h, CUdeviceptr d, size_t n, void* s) {
    COUNT();
    return copy_on(s, h, DPTR(d), n, 0);
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr src, size_t n, void* s) {
    COUNT();
    return copy_on(s, DPTR(d), DPTR(src), n, 0);
}
CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr src, size_t n, void* s) {
    COUNT();
    return copy_on(s, DPTR(d), DPTR(src), n, 0);
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
    COUNT();
    CTX_CHECK();
    if (!m || !image) return E_INVALID_VALUE;
    struct module* mod = calloc(1, sizeof *mod);
    mod->ctx = current;
    *m = mod;
    return OK;
}

CUresult cuModuleGetFunction(void** f, void* m, const char* name) {
    COUNT();
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
    COUNT();
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
    CUresult r;
    if (capture_op(s, o, &r)) return r;
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
    CUresult r;
    if (capture_op(s, o, &r)) return r;
    enqueue(s, o);
    return OK;
}

/* On a capturing stream: refused (the real driver makes nodes of them; the library must not
   queue them inside a captured call, so the model refuses them). */
static CUresult value_op(void* h, CUdeviceptr addr, uint32_t value, unsigned flags, int wait) {
    STREAM_CHECK(s, h);
    NOT_CAPTURING(s);
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

CUresult cuStreamWaitValue32_v2(void* h, CUdeviceptr a, uint32_t v, unsigned f) {
    COUNT();
    return value_op(h, a, v, f, 1);
}
CUresult cuStreamWaitValue32(void* h, CUdeviceptr a, uint32_t v, unsigned f) {
    COUNT();
    return value_op(h, a, v, f, 1);
}
CUresult cuStreamWriteValue32_v2(void* h, CUdeviceptr a, uint32_t v, unsigned f) {
    COUNT();
    return value_op(h, a, v, f, 0);
}
CUresult cuStreamWriteValue32(void* h, CUdeviceptr a, uint32_t v, unsigned f) {
    COUNT();
    return value_op(h, a, v, f, 0);
}

/* ---- events ----------------------------------------------------------------------------- */

static struct event_state* shared_state(int* fd_out) {
    int fd = memory_file("softcuda-event", 4096);
    if (fd < 0) return NULL;
    void* p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return NULL;
    }
    *fd_out = fd;
    return p;
}

CUresult cuEventCreate(void** e, unsigned flags) {
    COUNT();
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
    atomic_fetch_add(&live_events, 1);
    *e = ev;
    return OK;
}

CUresult cuEventDestroy_v2(void* e) {
    COUNT();
    CALL_CHECK();
    struct event* ev = e;
    if (!ev || ev->destroyed) return E_INVALID_HANDLE;
    /* Records and waits still queued may use its state: it is kept. An interprocess event's
       other processes are told (a wait of theirs still pending on it is an error). */
    ev->destroyed = 1;
    if ((ev->flags & EVENT_INTERPROCESS) && !ev->opened) atomic_store(&ev->st->owner_gone, 1);
    atomic_fetch_sub(&live_events, 1);
    return OK;
}

CUresult cuEventRecord(void* e, void* h) {
    COUNT();
    STREAM_CHECK(s, h);
    struct event* ev = e;
    if (!ev || ev->destroyed) return E_INVALID_HANDLE;
    /* The event and the stream are of one context. */
    if (ev->ctx != s->ctx) return E_INVALID_HANDLE;
    /* On a capturing stream, records and waits are refused: the real driver turns them into
       a graph's dependencies or nodes; the library must not queue them inside a captured call,
       so the model refuses them. */
    NOT_CAPTURING(s);
    struct op* o = calloc(1, sizeof *o);
    o->kind = OP_RECORD;
    o->ev = ev->st;
    o->seq = atomic_fetch_add(&ev->st->recorded, 1) + 1;
    enqueue(s, o);
    return OK;
}

CUresult cuStreamWaitEvent(void* h, void* e, unsigned flags) {
    COUNT();
    STREAM_CHECK(s, h);
    struct event* ev = e;
    if (!ev || flags != 0) return E_INVALID_VALUE;
    if (ev->destroyed || (ev->opened && atomic_load(&ev->st->owner_gone))) return E_INVALID_HANDLE;
    NOT_CAPTURING(s); /* as cuEventRecord */
    uint64_t target = atomic_load(&ev->st->recorded);
    if (atomic_load(&ev->st->reached) >= target) return OK;
    struct op* o = calloc(1, sizeof *o);
    o->kind = OP_WAIT_EVENT;
    o->ev = ev->st;
    o->seq = target;
    o->opened = ev->opened;
    enqueue(s, o);
    return OK;
}

CUresult cuEventQuery(void* e) {
    COUNT();
    CALL_CHECK();
    struct event* ev = e;
    if (!ev || ev->destroyed) return E_INVALID_HANDLE;
    if (atomic_load(&ev->ctx->sticky)) return atomic_load(&ev->ctx->sticky);
    return atomic_load(&ev->st->reached) >= atomic_load(&ev->st->recorded) ? OK : E_NOT_READY;
}

CUresult cuEventSynchronize(void* e) {
    COUNT();
    CALL_CHECK();
    struct event* ev = e;
    if (!ev || ev->destroyed) return E_INVALID_HANDLE;
    uint64_t target = atomic_load(&ev->st->recorded);
    unsigned tries = 0;
    while (atomic_load(&ev->st->reached) < target) pause_for(&tries);
    return atomic_load(&ev->ctx->sticky);
}

CUresult cuEventElapsedTime(float* ms, void* a, void* b) {
    COUNT();
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
    COUNT();
    CTX_CHECK();
    if (!out) return E_INVALID_VALUE;
    pthread_mutex_lock(&g.mu);
    struct alloc* a = find_alloc_locked(p);
    struct ipc_handle h = {0};
    int ok = a && a->kind == 2 && a->base == p && !a->opened;
    if (ok) {
        h = (struct ipc_handle){IPC_MAGIC, (uint64_t)getpid(), (uint64_t)a->fd, a->size, a->id,
                                (uint64_t)a->device, 1, 0};
        a->exported = 1;
    }
    pthread_mutex_unlock(&g.mu);
    if (!ok) return E_INVALID_VALUE;
    memset(out, 0, sizeof *out);
    memcpy(out->bytes, &h, sizeof h);
    return OK;
}

static CUresult ipc_open_mem(CUdeviceptr* p, CUipcHandle handle, unsigned flags) {
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
    add_alloc(a);
    *p = a->base;
    return OK;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* p, CUipcHandle handle, unsigned flags) {
    COUNT();
    return ipc_open_mem(p, handle, flags);
}

CUresult cuIpcOpenMemHandle(CUdeviceptr* p, CUipcHandle handle, unsigned flags) {
    COUNT();
    return ipc_open_mem(p, handle, flags);
}

CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
    COUNT();
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
    unmap_alloc(a);
    return OK;
}

CUresult cuIpcGetEventHandle(CUipcHandle* out, void* e) {
    COUNT();
    CTX_CHECK();
    struct event* ev = e;
    if (!out || !ev || ev->destroyed || !(ev->flags & EVENT_INTERPROCESS)) return E_INVALID_VALUE;
    struct ipc_handle h = {IPC_MAGIC, (uint64_t)getpid(), (uint64_t)ev->fd, 4096, 0,
                           (uint64_t)ev->ctx->device, 2, 0};
    memset(out, 0, sizeof *out);
    memcpy(out->bytes, &h, sizeof h);
    return OK;
}

CUresult cuIpcOpenEventHandle(void** e, CUipcHandle handle) {
    COUNT();
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
    ev->opened = 1;
    atomic_fetch_add(&live_events, 1);
    *e = ev;
    return OK;
}
