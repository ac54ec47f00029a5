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
 * queued there by hand, then an op of its own that marks the launch done.
 *
 * cuStreamGetCaptureInfo_v2/_v3 give a capture's status, its number (unique in the process) and,
 * while it is active, the graph it builds; dependencies are never given (a capture is a list).
 * User objects: a count of references and a destructor. A graph holds references that
 * cuGraphRetainUserObject gives it (its own, or moved from the caller's) and
 * cuGraphReleaseUserObject takes back; the graph of a capture holds them from the start, the
 * end hands them with the graph to the caller, and an invalidated end releases them. An
 * executable graph takes references of its own to every object its graph held when it was
 * instantiated, and releases them when it is destroyed and every launch of it queued so far has
 * run (on the stream of the last one, then). Graphs and executable graphs release theirs when
 * destroyed. The last reference released calls the destructor, once, with the protection of a
 * host function: a driver call from it fails with CUDA_ERROR_NOT_PERMITTED. A release of more
 * references than the caller (or the graph) holds fails with CUDA_ERROR_INVALID_VALUE.
 */
#include "softcuda.h"

enum { MODE_GLOBAL = 0, MODE_THREAD_LOCAL = 1, MODE_RELAXED = 2 };
#define GRAPH_MAGIC 0x48505247u /* "GRPH" */
#define EXEC_MAGIC 0x43455847u  /* "GXEC" */
#define OBJECT_MAGIC 0x4a424f55u /* "UOBJ" */

/* A user object. `refs` counts every reference, `owned` those that graphs and executable
   graphs hold (the rest are the caller's); both under `obj_mu`. */
struct user_object {
    unsigned magic;
    uint64_t refs, owned;
    void* ptr;
    void (*destroy)(void*);
};

/* References that a graph holds to one user object. */
struct held {
    struct user_object* obj;
    uint64_t refs;
};

/* A graph or an executable graph: its ops in order (their `next` unused), and the user objects
   it holds (under `obj_mu`). */
struct graph {
    unsigned magic;
    struct ctx* ctx;
    struct op* ops;
    size_t n, cap;
    struct held* held;
    size_t nheld;
    int open;           /* a graph its capture still builds (under `cap_mu`) */
    uint64_t launches;  /* an executable graph: launches queued and not run (under `obj_mu`) */
    int destroyed;      /* ... destroyed: freed when `launches` is 0 (under `obj_mu`) */
};

struct capture {
    struct stream* s;
    int mode;          /* MODE_* at cuStreamBeginCapture */
    pthread_t thread;  /* the thread that began it */
    int invalid;       /* a refused call: its end gives no graph */
    uint64_t id;       /* unique in the process, from 1 */
    struct graph* gr;  /* the ops kept so far */
    struct capture* next;
};

/* The open captures (begun, not ended), under `cap_mu`; `nopen` counts them so that calls
   outside any capture take no lock. */
static pthread_mutex_t cap_mu = PTHREAD_MUTEX_INITIALIZER;
static struct capture* captures;
static atomic_int nopen;
static uint64_t last_capture_id;
/* User objects' counts and the references graphs hold. */
static pthread_mutex_t obj_mu = PTHREAD_MUTEX_INITIALIZER;
/* This thread's capture interaction mode (cuThreadExchangeStreamCaptureMode). */
static __thread int thread_mode = MODE_GLOBAL;

static struct capture* capture_of_locked(struct stream* s) {
    for (struct capture* c = captures; c; c = c->next)
        if (c->s == s) return c;
    return NULL;
}

/* Calls the destructor of `u`, whose last reference went, as a host function runs, and frees
   it. */
static void destroy_object(struct user_object* u) {
    int was = in_host_fn;
    in_host_fn = 1;
    u->destroy(u->ptr);
    in_host_fn = was;
    free(u);
}

/* Takes `n` of the references of `u` (under `obj_mu`): whether they were its last, so that
   the caller, the lock released, destroys it. */
static int unref_locked(struct user_object* u, uint64_t n) {
    u->refs -= n;
    if (u->refs) return 0;
    u->magic = 0;
    return 1;
}

/* Releases every reference `gr` holds. */
static void release_held(struct graph* gr) {
    pthread_mutex_lock(&obj_mu);
    for (size_t i = 0; i < gr->nheld; i++) {
        struct held* h = &gr->held[i];
        h->obj->owned -= h->refs;
        if (!unref_locked(h->obj, h->refs)) h->obj = NULL;
    }
    pthread_mutex_unlock(&obj_mu);
    for (size_t i = 0; i < gr->nheld; i++)
        if (gr->held[i].obj) destroy_object(gr->held[i].obj);
    free(gr->held);
    gr->held = NULL;
    gr->nheld = 0;
}

static void free_graph(struct graph* gr) {
    if (!gr) return;
    gr->magic = 0;
    release_held(gr);
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
    c->gr->open = 1;
    pthread_mutex_lock(&cap_mu);
    if (capture_of_locked(s)) {
        pthread_mutex_unlock(&cap_mu);
        free_graph(c->gr);
        free(c);
        return E_ILLEGAL_STATE;
    }
    c->id = ++last_capture_id;
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
    c->gr->open = 0;
    atomic_fetch_sub(&nopen, 1);
    pthread_mutex_unlock(&cap_mu);
    CUresult r = OK;
    if (c->invalid) {
        free_graph(c->gr); /* and the references it held */
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

/* The capture on `h`: *status as cuStreamIsCapturing gives it; its number and (active only)
   its graph, where asked for; 0 and NULL without one. */
static CUresult capture_info(void* h, int* status, unsigned long long* id, void** graph) {
    CALL_CHECK();
    if ((uintptr_t)h <= 2 && !current) return E_INVALID_CONTEXT;
    if (!status) return E_INVALID_VALUE;
    struct capture* c = NULL;
    pthread_mutex_lock(&cap_mu);
    if ((uintptr_t)h > 2) c = capture_of_locked(h);
    *status = c ? (c->invalid ? 2 : 1) : 0;
    if (id) *id = c ? c->id : 0;
    if (graph) *graph = c && !c->invalid ? c->gr : NULL;
    pthread_mutex_unlock(&cap_mu);
    return OK;
}

CUresult cuStreamGetCaptureInfo_v2(void* h, int* status, unsigned long long* id, void** graph,
                                   const void*** deps, size_t* ndeps) {
    COUNT();
    CUresult r = capture_info(h, status, id, graph);
    if (r == OK && deps) *deps = NULL;
    if (r == OK && ndeps) *ndeps = 0;
    return r;
}

CUresult cuStreamGetCaptureInfo_v3(void* h, int* status, unsigned long long* id, void** graph,
                                   const void*** deps, const void** edges, size_t* ndeps) {
    COUNT();
    CUresult r = capture_info(h, status, id, graph);
    if (r == OK && deps) *deps = NULL;
    if (r == OK && edges) *edges = NULL;
    if (r == OK && ndeps) *ndeps = 0;
    return r;
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

/* Gives `x` its own references to every user object `gr` holds. */
static void copy_held(struct graph* x, const struct graph* gr) {
    pthread_mutex_lock(&obj_mu);
    x->nheld = gr->nheld;
    x->held = x->nheld ? malloc(x->nheld * sizeof *x->held) : NULL;
    for (size_t i = 0; i < x->nheld; i++) {
        x->held[i] = gr->held[i];
        x->held[i].obj->refs += x->held[i].refs;
        x->held[i].obj->owned += x->held[i].refs;
    }
    pthread_mutex_unlock(&obj_mu);
}

CUresult cuGraphInstantiateWithFlags(void** exec, void* graph, unsigned long long flags) {
    COUNT();
    CALL_CHECK();
    struct graph* gr = graph_of(graph, GRAPH_MAGIC);
    if (!exec || !gr || (flags & ~0xfull)) return E_INVALID_VALUE;
    struct graph* x = new_graph(EXEC_MAGIC, gr->ctx);
    pthread_mutex_lock(&cap_mu); /* a graph still captured grows under it */
    for (size_t i = 0; i < gr->n; i++) add_op(x, &gr->ops[i]);
    pthread_mutex_unlock(&cap_mu);
    copy_held(x, gr);
    *exec = x;
    return OK;
}

/* The last op of a launch of `exec`: one launch fewer pending; a destroyed executable graph
   whose last launch this was releases its references and is freed. */
static void launch_done(void* exec) {
    struct graph* x = exec;
    pthread_mutex_lock(&obj_mu);
    int gone = --x->launches == 0 && x->destroyed;
    pthread_mutex_unlock(&obj_mu);
    if (gone) free_graph(x);
}

/* Queues a copy of every op of `exec` on `h`, in order, as queued by hand, then the launch's
   end (launch_done). */
CUresult cuGraphLaunch(void* exec, void* h) {
    COUNT();
    STREAM_CHECK(s, h);
    struct graph* x = graph_of(exec, EXEC_MAGIC);
    if (!x) return E_INVALID_VALUE;
    if (x->ctx != s->ctx) return E_INVALID_CONTEXT;
    /* The real driver would capture the launch as a child graph; the model refuses it. */
    NOT_CAPTURING(s);
    pthread_mutex_lock(&obj_mu);
    x->launches++;
    pthread_mutex_unlock(&obj_mu);
    for (size_t i = 0; i < x->n; i++) {
        struct op* o = malloc(sizeof *o);
        *o = x->ops[i];
        enqueue(s, o);
    }
    struct op* end = calloc(1, sizeof *end);
    end->kind = OP_HOST_FN;
    end->host = launch_done;
    end->data = x;
    enqueue(s, end);
    return OK;
}

/* Frees `exec` now, or (launches pending) when its last launch has run. */
CUresult cuGraphExecDestroy(void* exec) {
    COUNT();
    CALL_CHECK();
    struct graph* x = graph_of(exec, EXEC_MAGIC);
    if (!x) return E_INVALID_VALUE;
    pthread_mutex_lock(&obj_mu);
    x->magic = 0;
    x->destroyed = 1;
    int gone = x->launches == 0;
    pthread_mutex_unlock(&obj_mu);
    if (gone) free_graph(x);
    return OK;
}

/* A graph is freed with the references it holds; not one its capture still builds. */
CUresult cuGraphDestroy(void* graph) {
    COUNT();
    CALL_CHECK();
    struct graph* gr = graph_of(graph, GRAPH_MAGIC);
    if (!gr) return E_INVALID_VALUE;
    pthread_mutex_lock(&cap_mu);
    int open = gr->open;
    pthread_mutex_unlock(&cap_mu);
    if (open) return E_ILLEGAL_STATE;
    free_graph(gr);
    return OK;
}

/* ---- user objects ----------------------------------------------------------------------- */

static struct user_object* object_of(void* p) {
    struct user_object* u = p;
    return u && u->magic == OBJECT_MAGIC ? u : NULL;
}

/* `flags` must be CU_USER_OBJECT_NO_DESTRUCTOR_SYNC (1), the only flag the driver knows. */
CUresult cuUserObjectCreate(void** obj, void* ptr, void (*destroy)(void*), unsigned refs,
                            unsigned flags) {
    COUNT();
    CALL_CHECK();
    if (!obj || !destroy || refs == 0 || flags != 1) return E_INVALID_VALUE;
    struct user_object* u = calloc(1, sizeof *u);
    u->magic = OBJECT_MAGIC;
    u->refs = refs;
    u->ptr = ptr;
    u->destroy = destroy;
    *obj = u;
    return OK;
}

CUresult cuUserObjectRetain(void* obj, unsigned count) {
    COUNT();
    CALL_CHECK();
    struct user_object* u = object_of(obj);
    if (!u || count == 0) return E_INVALID_VALUE;
    pthread_mutex_lock(&obj_mu);
    u->refs += count;
    pthread_mutex_unlock(&obj_mu);
    return OK;
}

/* Releases `count` of the caller's references (not those graphs hold). */
CUresult cuUserObjectRelease(void* obj, unsigned count) {
    COUNT();
    CALL_CHECK();
    struct user_object* u = object_of(obj);
    if (!u || count == 0) return E_INVALID_VALUE;
    pthread_mutex_lock(&obj_mu);
    int ok = u->refs - u->owned >= count;
    int last = ok && unref_locked(u, count);
    pthread_mutex_unlock(&obj_mu);
    if (last) destroy_object(u);
    return ok ? OK : E_INVALID_VALUE;
}

/* The entry of `gr` for `u` (under `obj_mu`), added (with no reference) if `add`; or NULL. */
static struct held* held_locked(struct graph* gr, struct user_object* u, int add) {
    for (size_t i = 0; i < gr->nheld; i++)
        if (gr->held[i].obj == u) return &gr->held[i];
    if (!add) return NULL;
    gr->held = realloc(gr->held, (gr->nheld + 1) * sizeof *gr->held);
    gr->held[gr->nheld] = (struct held){u, 0};
    return &gr->held[gr->nheld++];
}

/* flags 0: `count` new references, the graph's; CU_GRAPH_USER_OBJECT_MOVE (1): `count` of the
   caller's references become the graph's. `graph` may be one a capture still builds. */
CUresult cuGraphRetainUserObject(void* graph, void* obj, unsigned count, unsigned flags) {
    COUNT();
    CALL_CHECK();
    struct graph* gr = graph_of(graph, GRAPH_MAGIC);
    struct user_object* u = object_of(obj);
    if (!gr || !u || count == 0 || flags > 1) return E_INVALID_VALUE;
    pthread_mutex_lock(&obj_mu);
    int ok = flags == 0 || u->refs - u->owned >= count;
    if (ok) {
        held_locked(gr, u, 1)->refs += count;
        u->owned += count;
        if (flags == 0) u->refs += count;
    }
    pthread_mutex_unlock(&obj_mu);
    return ok ? OK : E_INVALID_VALUE;
}

/* Releases `count` of the references `graph` holds to `obj`. */
CUresult cuGraphReleaseUserObject(void* graph, void* obj, unsigned count) {
    COUNT();
    CALL_CHECK();
    struct graph* gr = graph_of(graph, GRAPH_MAGIC);
    struct user_object* u = object_of(obj);
    if (!gr || !u || count == 0) return E_INVALID_VALUE;
    pthread_mutex_lock(&obj_mu);
    struct held* h = held_locked(gr, u, 0);
    int ok = h && h->refs >= count;
    int last = 0;
    if (ok) {
        h->refs -= count;
        if (!h->refs) *h = gr->held[--gr->nheld];
        u->owned -= count;
        last = unref_locked(u, count);
    }
    pthread_mutex_unlock(&obj_mu);
    if (last) destroy_object(u);
    return ok ? OK : E_INVALID_VALUE;
}
