/*
 * softcuda's stream capture and graphs (see softcuda.c for the model).
 *
 * A capture (cuStreamBeginCapture_v2 .. cuStreamEndCapture) keeps the kernels, copies and host
 * functions queued on its stream, in order, instead of queuing them: nothing runs and nothing
 * orders against the legacy stream. A copy from pageable host memory is not staged: a graph
 * reads its source when it runs. What the model cannot keep (event records and waits, 32-bit
 * waits and writes, a synchronize or query of the stream, a synchronous copy on it) is refused
 * with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture, whose end then gives
 * no graph (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED); work queued on an invalidated capture fails
 * with that too.
 *
 * Capture interaction modes, as the driver documents them: a thread whose mode (its own,
 * cuThreadExchangeStreamCaptureMode) is GLOBAL may make no potentially unsafe call (memory
 * allocation and freeing, a synchronous copy, cuCtxSynchronize) while it has a capture open
 * that was not begun RELAXED, or another thread has one open that was begun GLOBAL; a thread
 * in THREAD_LOCAL mode only minds its own captures; RELAXED, none. Such a call does nothing,
 * fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the captures that
 * prohibited it.
 *
 * A graph is the list of ops its capture kept; an executable graph is a copy of that list
 * (it outlives its graph), and each launch queues a fresh copy of every op on the stream, as if
 * queued there by hand.
 */
#include "softcuda.h"

enum { MODE_GLOBAL = 0, MODE_THREAD_LOCAL = 1, MODE_RELAXED = 2 };
#define GRAPH_MAGIC 0x48505247u /* "GRPH" */
#define EXEC_MAGIC 0x43455847u  /* "GXEC" */

/* A graph or an executable graph: its ops in order (their `next` unused). */
struct graph {
    unsigned magic;
    struct ctx* ctx;
    struct op* ops;
    size_t n, cap;
};

struct capture {
    struct stream* s;
    int mode;          /* MODE_* at cuStreamBeginCapture */
    pthread_t thread;  /* the thread that began it */
    int invalid;       /* a refused call: its end gives no graph */
    struct graph* gr;  /* the ops kept so far */
    struct capture* next;
};

/* The open captures (begun, not ended), under `cap_mu`; `nopen` counts them so that calls
   outside any capture take no lock. */
static pthread_mutex_t cap_mu = PTHREAD_MUTEX_INITIALIZER;
static struct capture* captures;
static atomic_int nopen;
/* This thread's capture interaction mode (cuThreadExchangeStreamCaptureMode). */
static __thread int thread_mode = MODE_GLOBAL;

static struct capture* capture_of_locked(struct stream* s) {
    for (struct capture* c = captures; c; c = c->next)
        if (c->s == s) return c;
    return NULL;
}

static void free_graph(struct graph* gr) {
    if (!gr) return;
    gr->magic = 0;
    free(gr->ops);
    free(gr);
}

static struct graph* new_graph(unsigned magic, struct ctx* c) {
    struct graph* gr = calloc(1, sizeof *gr);
    gr->magic = magic;
    gr->ctx = c;
    return gr;
}

static void add_op(struct graph* gr, const struct op* o) {
    if (gr->n == gr->cap) {
        gr->cap = gr->cap ? 2 * gr->cap : 8;
        gr->ops = realloc(gr->ops, gr->cap * sizeof *gr->ops);
    }
    gr->ops[gr->n] = *o;
    gr->ops[gr->n].next = NULL;
    gr->ops[gr->n].staged = NULL;
    gr->n++;
}

int capture_op(struct stream* s, struct op* o, CUresult* r) {
    if (!atomic_load(&nopen)) return 0;
    pthread_mutex_lock(&cap_mu);
    struct capture* c = capture_of_locked(s);
    if (c && !c->invalid) add_op(c->gr, o);
    if (c) *r = c->invalid ? E_CAPTURE_INVALIDATED : OK;
    pthread_mutex_unlock(&cap_mu);
    if (!c) return 0;
    free(o); /* kept by value in the capture, or dropped with it */
    return 1;
}

CUresult refuse_capturing(struct stream* s) {
    if (!atomic_load(&nopen)) return OK;
    pthread_mutex_lock(&cap_mu);
    struct capture* c = capture_of_locked(s);
    if (c) c->invalid = 1;
    pthread_mutex_unlock(&cap_mu);
    return c ? E_CAPTURE_UNSUPPORTED : OK;
}

CUresult unsafe_call(void) {
    if (!atomic_load(&nopen) || thread_mode == MODE_RELAXED) return OK;
    pthread_t self = pthread_self();
    int prohibited = 0;
    pthread_mutex_lock(&cap_mu);
    for (struct capture* c = captures; c; c = c->next) {
        int mine = pthread_equal(c->thread, self);
        if ((mine && c->mode != MODE_RELAXED) ||
            (!mine && thread_mode == MODE_GLOBAL && c->mode == MODE_GLOBAL)) {
            c->invalid = 1;
            prohibited = 1;
        }
    }
    pthread_mutex_unlock(&cap_mu);
    return prohibited ? E_CAPTURE_UNSUPPORTED : OK;
}

/* ---- capture ---------------------------------------------------------------------------- */

static CUresult begin_capture(void* h, int mode) {
    CALL_CHECK();
    /* The legacy stream (and CU_STREAM_PER_THREAD, the legacy stream here) cannot capture. */
    if ((uintptr_t)h <= 2) return current ? E_CAPTURE_UNSUPPORTED : E_INVALID_CONTEXT;
    STREAM_CHECK(s, h);
    if (mode < MODE_GLOBAL || mode > MODE_RELAXED) return E_INVALID_VALUE;
    struct capture* c = calloc(1, sizeof *c);
    c->s = s;
    c->mode = mode;
    c->thread = pthread_self();
    c->gr = new_graph(GRAPH_MAGIC, s->ctx);
    pthread_mutex_lock(&cap_mu);
    if (capture_of_locked(s)) {
        pthread_mutex_unlock(&cap_mu);
        free_graph(c->gr);
        free(c);
        return E_ILLEGAL_STATE;
    }
    c->next = captures;
    captures = c;
    atomic_fetch_add(&nopen, 1);
    pthread_mutex_unlock(&cap_mu);
    return OK;
}

CUresult cuStreamBeginCapture_v2(void* h, int mode) {
    COUNT();
    return begin_capture(h, mode);
}

CUresult cuStreamBeginCapture(void* h, int mode) {
    COUNT();
    return begin_capture(h, mode);
}

/* Ends the capture on `h`: its graph, or none (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) if a
   refused call invalidated it. A capture not begun RELAXED ends on the thread that began it. */
CUresult cuStreamEndCapture(void* h, void** graph) {
    COUNT();
    CALL_CHECK();
    if (!graph) return E_INVALID_VALUE;
    if ((uintptr_t)h <= 2) return current ? E_ILLEGAL_STATE : E_INVALID_CONTEXT;
    struct stream* s = h;
    pthread_mutex_lock(&cap_mu);
    struct capture** link = &captures;
    while (*link && (*link)->s != s) link = &(*link)->next;
    struct capture* c = *link;
    if (!c) {
        pthread_mutex_unlock(&cap_mu);
        return E_ILLEGAL_STATE;
    }
    if (c->mode != MODE_RELAXED && !pthread_equal(c->thread, pthread_self())) {
        pthread_mutex_unlock(&cap_mu);
        return E_CAPTURE_WRONG_THREAD;
    }
    *link = c->next;
    atomic_fetch_sub(&nopen, 1);
    pthread_mutex_unlock(&cap_mu);
    CUresult r = OK;
    if (c->invalid) {
        free_graph(c->gr);
        *graph = NULL;
        r = E_CAPTURE_INVALIDATED;
    } else {
        *graph = c->gr;
    }
    free(c);
    return r;
}

/* 0: `h` does not capture; 1: it does; 2: its capture was invalidated (until it ends). */
CUresult cuStreamIsCapturing(void* h, int* status) {
    COUNT();
    CALL_CHECK();
    if ((uintptr_t)h <= 2 && !current) return E_INVALID_CONTEXT;
    if (!status) return E_INVALID_VALUE;
    *status = 0;
    if ((uintptr_t)h <= 2 || !atomic_load(&nopen)) return OK;
    pthread_mutex_lock(&cap_mu);
    struct capture* c = capture_of_locked(h);
    if (c) *status = c->invalid ? 2 : 1;
    pthread_mutex_unlock(&cap_mu);
    return OK;
}

/* Swaps the calling thread's capture interaction mode with *mode. */
CUresult cuThreadExchangeStreamCaptureMode(int* mode) {
    COUNT();
    CALL_CHECK();
    if (!mode || *mode < MODE_GLOBAL || *mode > MODE_RELAXED) return E_INVALID_VALUE;
    int was = thread_mode;
    thread_mode = *mode;
    *mode = was;
    return OK;
}

/* ---- graphs ----------------------------------------------------------------------------- */

static struct graph* graph_of(void* p, unsigned magic) {
    struct graph* gr = p;
    return gr && gr->magic == magic ? gr : NULL;
}

CUresult cuGraphInstantiateWithFlags(void** exec, void* graph, unsigned long long flags) {
    COUNT();
    CALL_CHECK();
    struct graph* gr = graph_of(graph, GRAPH_MAGIC);
    if (!exec || !gr || (flags & ~0xfull)) return E_INVALID_VALUE;
    struct graph* x = new_graph(EXEC_MAGIC, gr->ctx);
    for (size_t i = 0; i < gr->n; i++) add_op(x, &gr->ops[i]);
    *exec = x;
    return OK;
}

/* Queues a copy of every op of `exec` on `h`, in order, as queued by hand. */
CUresult cuGraphLaunch(void* exec, void* h) {
    COUNT();
    STREAM_CHECK(s, h);
    struct graph* x = graph_of(exec, EXEC_MAGIC);
    if (!x) return E_INVALID_VALUE;
    if (x->ctx != s->ctx) return E_INVALID_CONTEXT;
    /* The real driver would capture the launch as a child graph; the model refuses it. */
    NOT_CAPTURING(s);
    for (size_t i = 0; i < x->n; i++) {
        struct op* o = malloc(sizeof *o);
        *o = x->ops[i];
        enqueue(s, o);
    }
    return OK;
}

CUresult cuGraphExecDestroy(void* exec) {
    COUNT();
    CALL_CHECK();
    struct graph* x = graph_of(exec, EXEC_MAGIC);
    if (!x) return E_INVALID_VALUE;
    free_graph(x);
    return OK;
}

CUresult cuGraphDestroy(void* graph) {
    COUNT();
    CALL_CHECK();
    struct graph* gr = graph_of(graph, GRAPH_MAGIC);
    if (!gr) return E_INVALID_VALUE;
    free_graph(gr);
    return OK;
}
