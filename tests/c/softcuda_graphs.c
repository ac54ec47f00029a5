/* softcuda's stream capture and graphs (kernels/cuda/soft/graph.c), checked against the model
 * itself: no NCCL, the driver opened by name (libcuda.so.1, the model's on LD_LIBRARY_PATH).
 *
 * - a capture in the global mode keeps a copy in from page-locked memory, a host function and
 *   a copy out, and runs none of them; its graph, instantiated (and the graph destroyed), runs
 *   them at each of three launches with the values the source holds then; a copy from pageable
 *   memory reads its source at the launch, not at the capture;
 * - a host function run from a graph may make no driver call (CUDA_ERROR_NOT_PERMITTED);
 * - refused on a capturing stream (900) and invalidating it, so that its end gives no graph
 *   (901): an allocation of page-locked memory, a synchronize, an event record; an allocation
 *   made with the thread's mode relaxed is allowed, the mode put back;
 * - another thread's capture: a global one prohibits this thread's allocation in the global
 *   mode, not in the thread-local mode; a relaxed one prohibits nothing;
 * - refused: a capture on the legacy stream, a second capture on a capturing stream, an end
 *   without a capture; cuStreamQuery answers OK once the stream is done;
 * - user objects: one moved (or retained, _v3) into the graph of an open capture, which
 *   cuStreamGetCaptureInfo gives, outlives the capture's end, the graph (an executable graph
 *   holds it) and the executable graph while a launch of it waits; its destructor runs once,
 *   after that launch, and a driver call from it fails; an invalidated capture releases what
 *   its graph held; a stream not capturing has no capture graph; bad arguments are refused.
 *
 * Prints "OK ..." and exits 0 when every check passed; otherwise says what failed, exit 1. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPECT(cond, ...)                                                           \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      fprintf(stderr, "%s:%d: expected %s: ", __FILE__, __LINE__, #cond);           \
      fprintf(stderr, __VA_ARGS__);                                                 \
      fprintf(stderr, "\n");                                                        \
      exit(1);                                                                      \
    }                                                                               \
  } while (0)
/* A driver call that must return `want`. */
#define CU(want, call)                                                              \
  do {                                                                              \
    int r_ = (call);                                                                \
    EXPECT(r_ == (want), "%s returned %d, wanted %d", #call, r_, (int)(want));       \
  } while (0)

enum { GLOBAL = 0, THREAD_LOCAL = 1, RELAXED = 2 };
enum { N = 64 };
typedef unsigned long long cu_ptr;

static struct {
  int (*init)(unsigned);
  int (*device_get)(int *, int);
  int (*primary_retain)(void **, int);
  int (*ctx_set_current)(void *);
  int (*stream_create)(void **, unsigned);
  int (*stream_sync)(void *);
  int (*stream_query)(void *);
  int (*mem_alloc)(cu_ptr *, size_t);
  int (*mem_free)(cu_ptr);
  int (*alloc_host)(void **, size_t);
  int (*free_host)(void *);
  int (*htod_async)(cu_ptr, const void *, size_t, void *);
  int (*dtoh_async)(void *, cu_ptr, size_t, void *);
  int (*host_func)(void *, void (*)(void *), void *);
  int (*event_create)(void **, unsigned);
  int (*event_record)(void *, void *);
  int (*begin)(void *, int);
  int (*end)(void *, void **);
  int (*is_capturing)(void *, int *);
  int (*exchange_mode)(int *);
  int (*instantiate)(void **, void *, unsigned long long);
  int (*launch)(void *, void *);
  int (*exec_destroy)(void *);
  int (*graph_destroy)(void *);
  int (*info_v2)(void *, int *, unsigned long long *, void **, const void ***, size_t *);
  int (*info_v3)(void *, int *, unsigned long long *, void **, const void ***, const void **,
                 size_t *);
  int (*obj_create)(void **, void *, void (*)(void *), unsigned, unsigned);
  int (*obj_retain)(void *, unsigned);
  int (*obj_release)(void *, unsigned);
  int (*graph_retain)(void *, void *, unsigned, unsigned);
  int (*graph_release)(void *, void *, unsigned);
} cu;

static void open_driver(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW);
  EXPECT(lib != NULL, "libcuda.so.1: %s", dlerror());
#define SYM(field, name)                                   \
  do {                                                     \
    *(void **)&cu.field = dlsym(lib, name);                \
    EXPECT(cu.field != NULL, "the driver has no %s", name); \
  } while (0)
  SYM(init, "cuInit");
  SYM(device_get, "cuDeviceGet");
  SYM(primary_retain, "cuDevicePrimaryCtxRetain");
  SYM(ctx_set_current, "cuCtxSetCurrent");
  SYM(stream_create, "cuStreamCreate");
  SYM(stream_sync, "cuStreamSynchronize");
  SYM(stream_query, "cuStreamQuery");
  SYM(mem_alloc, "cuMemAlloc_v2");
  SYM(mem_free, "cuMemFree_v2");
  SYM(alloc_host, "cuMemAllocHost_v2");
  SYM(free_host, "cuMemFreeHost");
  SYM(htod_async, "cuMemcpyHtoDAsync_v2");
  SYM(dtoh_async, "cuMemcpyDtoHAsync_v2");
  SYM(host_func, "cuLaunchHostFunc");
  SYM(event_create, "cuEventCreate");
  SYM(event_record, "cuEventRecord");
  SYM(begin, "cuStreamBeginCapture_v2");
  SYM(end, "cuStreamEndCapture");
  SYM(is_capturing, "cuStreamIsCapturing");
  SYM(exchange_mode, "cuThreadExchangeStreamCaptureMode");
  SYM(instantiate, "cuGraphInstantiateWithFlags");
  SYM(launch, "cuGraphLaunch");
  SYM(exec_destroy, "cuGraphExecDestroy");
  SYM(graph_destroy, "cuGraphDestroy");
  SYM(info_v2, "cuStreamGetCaptureInfo_v2");
  SYM(info_v3, "cuStreamGetCaptureInfo_v3");
  SYM(obj_create, "cuUserObjectCreate");
  SYM(obj_retain, "cuUserObjectRetain");
  SYM(obj_release, "cuUserObjectRelease");
  SYM(graph_retain, "cuGraphRetainUserObject");
  SYM(graph_release, "cuGraphReleaseUserObject");
  EXPECT(dlsym(lib, "cuStreamBeginCapture") != NULL, "the driver has no cuStreamBeginCapture");
#undef SYM
}

/* What the captured host function sees: it counts its runs, checks the first word of the
 * page-locked source, and tries a driver call (refused inside a host function). */
struct host_state {
  int runs;
  const int *watch;
  int want;
  int wrong;
  int driver_call;
};

static void host_fn(void *p) {
  struct host_state *h = p;
  h->runs++;
  if (*h->watch != h->want) h->wrong++;
  h->driver_call = cu.stream_query(NULL);
}

static void *ctx;

/* Another thread's capture, begun in `mode` on its own stream, held open while the main thread
 * makes its calls (between the two barrier waits); its end's result in `end`. */
struct other {
  int mode;
  pthread_barrier_t *bar;
  int end;
};

static void *other_main(void *p) {
  struct other *o = p;
  void *s = NULL, *graph = NULL;
  CU(0, cu.ctx_set_current(ctx));
  CU(0, cu.stream_create(&s, 0));
  CU(0, cu.begin(s, o->mode));
  pthread_barrier_wait(o->bar);
  pthread_barrier_wait(o->bar);
  o->end = cu.end(s, &graph);
  if (graph) CU(0, cu.graph_destroy(graph));
  return NULL;
}

/* An allocation of page-locked memory made on this thread in mode `mode` while another thread
 * holds a capture begun in `other_mode`: its result, and the other capture's end in *end. */
static int beside_capture(int other_mode, int mode, int *end) {
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, 2);
  struct other o = {other_mode, &bar, -1};
  pthread_t t;
  EXPECT(pthread_create(&t, NULL, other_main, &o) == 0, "pthread_create");
  pthread_barrier_wait(&bar);
  int m = mode;
  CU(0, cu.exchange_mode(&m));
  void *p = NULL;
  int r = cu.alloc_host(&p, 64);
  if (r == 0) CU(0, cu.free_host(p));
  CU(0, cu.exchange_mode(&m));
  EXPECT(m == mode, "the mode swapped back is %d, wanted %d", m, mode);
  pthread_barrier_wait(&bar);
  pthread_join(t, NULL);
  pthread_barrier_destroy(&bar);
  *end = o.end;
  return r;
}

/* ---- user objects ---- */

enum { NO_DESTRUCTOR_SYNC = 1, MOVE = 1 };

/* What a user object's destructor saw: its runs, and what a driver call from it returned. */
struct dtor {
  atomic_int runs;
  atomic_int driver_call;
};

static void dtor_fn(void *p) {
  struct dtor *d = p;
  atomic_store(&d->driver_call, cu.stream_query(NULL));
  atomic_fetch_add(&d->runs, 1);
}

/* A host function that holds its stream until the gate opens. */
static atomic_int gate;

static void gate_fn(void *p) {
  (void)p;
  while (!atomic_load(&gate)) sched_yield();
}

/* The graph of the active capture on `s`, through _v2 (`v3` 0) or _v3; its number in *id. */
static void *capture_graph(void *s, int v3, unsigned long long *id) {
  int status = -1;
  void *graph = NULL;
  const void **deps = (const void **)1, *edges = (const void *)1;
  size_t ndeps = 9;
  if (v3) CU(0, cu.info_v3(s, &status, id, &graph, &deps, &edges, &ndeps));
  else CU(0, cu.info_v2(s, &status, id, &graph, &deps, &ndeps));
  EXPECT(status == 1 && graph != NULL && *id != 0, "capture info: status %d graph %p id %llu",
         status, graph, *id);
  EXPECT(deps == NULL && ndeps == 0 && (!v3 || edges == NULL), "capture info gave dependencies");
  return graph;
}

/* Checks that the destructor of `d` ran `want` times, and a driver call from it was refused. */
static void check_dtor(struct dtor *d, int want, const char *when) {
  int runs = atomic_load(&d->runs);
  EXPECT(runs == want, "%s: the destructor ran %d times, wanted %d", when, runs, want);
  if (runs) EXPECT(atomic_load(&d->driver_call) == 800,
                   "%s: a driver call from the destructor returned %d", when,
                   atomic_load(&d->driver_call));
}

/* A user object in the graph of a capture on `s` (a host function that waits for the gate, the
 * graph's only work): through _v2 moved, or through _v3 retained and the caller's reference
 * released. It outlives the capture, the graph and the executable graph while its launch waits;
 * its destructor runs once, after the launch. */
static void object_in_capture(void *s, int v3) {
  struct dtor d = {0, -1};
  void *obj = NULL, *graph = NULL, *exec = NULL;
  unsigned long long id = 0, id2 = 0;
  atomic_store(&gate, 0);
  CU(0, cu.begin(s, GLOBAL));
  CU(0, cu.host_func(s, gate_fn, NULL));
  void *captured = capture_graph(s, v3, &id);
  EXPECT(capture_graph(s, !v3, &id2) == captured && id2 == id, "a second capture info differs");
  CU(0, cu.obj_create(&obj, &d, dtor_fn, 1, NO_DESTRUCTOR_SYNC));
  if (v3) {
    CU(0, cu.graph_retain(captured, obj, 2, 0));
    CU(0, cu.obj_release(obj, 1));
    check_dtor(&d, 0, "the caller's reference released");
    CU(1, cu.obj_release(obj, 1)); /* the caller holds none */
    CU(0, cu.graph_release(captured, obj, 1));
    CU(1, cu.graph_release(captured, obj, 2)); /* the graph holds one */
  } else {
    CU(0, cu.graph_retain(captured, obj, 1, MOVE));
    CU(1, cu.graph_retain(captured, obj, 1, MOVE)); /* the caller holds none */
  }
  CU(401, cu.graph_destroy(captured)); /* not while its capture is open */
  CU(0, cu.end(s, &graph));
  EXPECT(graph == captured, "the capture ended with graph %p, its info gave %p", graph, captured);
  check_dtor(&d, 0, "the capture ended");
  CU(0, cu.instantiate(&exec, graph, 0));
  CU(0, cu.graph_destroy(graph));
  check_dtor(&d, 0, "the graph destroyed, its executable graph not");
  CU(0, cu.launch(exec, s));
  CU(0, cu.exec_destroy(exec));
  struct timespec t = {0, 20 * 1000 * 1000};
  nanosleep(&t, NULL);
  check_dtor(&d, 0, "the executable graph destroyed, its launch pending");
  atomic_store(&gate, 1);
  CU(0, cu.stream_sync(s));
  check_dtor(&d, 1, "the launch ran");
  CU(0, cu.begin(s, GLOBAL));
  capture_graph(s, v3, &id2);
  CU(0, cu.end(s, &graph));
  CU(0, cu.graph_destroy(graph));
  EXPECT(id2 != id, "two captures have the same number %llu", id);
}

static void user_objects(void *s) {
  /* No capture: status 0, no number, no graph. */
  int status = -1;
  unsigned long long id = 7;
  void *graph = (void *)1;
  CU(0, cu.info_v2(s, &status, &id, &graph, NULL, NULL));
  EXPECT(status == 0 && id == 0 && graph == NULL, "no capture: status %d id %llu graph %p", status,
         id, graph);
  CU(0, cu.info_v2(NULL, &status, NULL, NULL, NULL, NULL));
  EXPECT(status == 0, "the legacy stream: status %d", status);
  CU(1, cu.info_v2(s, NULL, &id, &graph, NULL, NULL));

  /* Bad arguments. */
  struct dtor d = {0, -1};
  void *obj = NULL;
  CU(1, cu.obj_create(&obj, &d, dtor_fn, 1, 0));
  CU(1, cu.obj_create(&obj, &d, dtor_fn, 1, 2));
  CU(1, cu.obj_create(&obj, &d, dtor_fn, 0, NO_DESTRUCTOR_SYNC));
  CU(1, cu.obj_create(&obj, &d, NULL, 1, NO_DESTRUCTOR_SYNC));
  CU(1, cu.obj_create(NULL, &d, dtor_fn, 1, NO_DESTRUCTOR_SYNC));
  EXPECT(obj == NULL, "a refused create gave %p", obj);

  /* The caller's own references: the last release destroys, on this thread. */
  CU(0, cu.obj_create(&obj, &d, dtor_fn, 1, NO_DESTRUCTOR_SYNC));
  CU(1, cu.obj_retain(obj, 0));
  CU(0, cu.obj_retain(obj, 2));
  CU(0, cu.obj_release(obj, 2));
  check_dtor(&d, 0, "one reference left");
  CU(0, cu.obj_release(obj, 1));
  check_dtor(&d, 1, "the last reference released");
  CU(0, cu.stream_query(s)); /* the destructor's protection ended with it */

  object_in_capture(s, 0);
  object_in_capture(s, 1);

  /* An invalidated capture releases what its graph held. */
  struct dtor d2 = {0, -1};
  CU(0, cu.begin(s, GLOBAL));
  void *captured = capture_graph(s, 0, &id);
  CU(0, cu.obj_create(&obj, &d2, dtor_fn, 1, NO_DESTRUCTOR_SYNC));
  CU(0, cu.graph_retain(captured, obj, 1, MOVE));
  CU(900, cu.stream_sync(s));
  unsigned long long id2 = 0;
  graph = (void *)1;
  CU(0, cu.info_v2(s, &status, &id2, &graph, NULL, NULL));
  EXPECT(status == 2 && graph == NULL && id2 == id, "invalidated: status %d graph %p id %llu",
         status, graph, id2);
  check_dtor(&d2, 0, "the capture invalidated, not ended");
  CU(901, cu.end(s, &graph));
  EXPECT(graph == NULL, "an invalidated capture gave a graph");
  check_dtor(&d2, 1, "the invalidated capture ended");
}

int main(void) {
  open_driver();
  int dev = -1;
  CU(0, cu.init(0));
  CU(0, cu.device_get(&dev, 0));
  CU(0, cu.primary_retain(&ctx, dev));
  CU(0, cu.ctx_set_current(ctx));
  void *s = NULL;
  CU(0, cu.stream_create(&s, 0));
  cu_ptr d = 0;
  CU(0, cu.mem_alloc(&d, N * sizeof(int)));
  int *src = NULL, *dst = NULL;
  CU(0, cu.alloc_host((void **)&src, N * sizeof(int)));
  CU(0, cu.alloc_host((void **)&dst, N * sizeof(int)));
  for (int k = 0; k < N; k++) src[k] = k, dst[k] = -1;

  /* Capture: copy in, host function, copy out; nothing runs. */
  struct host_state hs = {0, src, 0, 0, -1};
  int status = -1;
  CU(0, cu.is_capturing(s, &status));
  EXPECT(status == 0, "a stream before its capture: status %d", status);
  CU(0, cu.begin(s, GLOBAL));
  CU(0, cu.is_capturing(s, &status));
  EXPECT(status == 1, "a capturing stream: status %d", status);
  CU(401, cu.begin(s, GLOBAL));
  CU(0, cu.htod_async(d, src, N * sizeof(int), s));
  CU(0, cu.host_func(s, host_fn, &hs));
  CU(0, cu.dtoh_async(dst, d, N * sizeof(int), s));
  EXPECT(hs.runs == 0, "the host function ran %d times during the capture", hs.runs);
  for (int k = 0; k < N; k++) EXPECT(dst[k] == -1, "dst[%d] = %d during the capture", k, dst[k]);
  void *graph = NULL, *exec = NULL;
  CU(0, cu.end(s, &graph));
  EXPECT(graph != NULL, "no graph from a valid capture");
  CU(0, cu.is_capturing(s, &status));
  EXPECT(status == 0, "a stream after its capture: status %d", status);
  CU(0, cu.instantiate(&exec, graph, 0));
  CU(0, cu.graph_destroy(graph)); /* the executable graph outlives it */
  EXPECT(hs.runs == 0, "the host function ran %d times before a launch", hs.runs);

  /* Three launches, each with new values in the source. */
  for (int i = 1; i <= 3; i++) {
    for (int k = 0; k < N; k++) src[k] = i * 1000 + k;
    hs.want = i * 1000;
    CU(0, cu.launch(exec, s));
    CU(0, cu.stream_sync(s));
    CU(0, cu.stream_query(s));
    for (int k = 0; k < N; k++)
      EXPECT(dst[k] == i * 1000 + k, "launch %d: dst[%d] = %d, wanted %d", i, k, dst[k], i * 1000 + k);
    EXPECT(hs.runs == i, "launch %d: the host function ran %d times", i, hs.runs);
    EXPECT(hs.wrong == 0, "launch %d: the host function saw the source's old value", i);
    EXPECT(hs.driver_call == 800, "a driver call from the graph's host function returned %d",
           hs.driver_call);
  }
  CU(0, cu.exec_destroy(exec));

  /* From pageable memory: read at the launch, not at the capture. */
  int *pageable = malloc(N * sizeof(int));
  for (int k = 0; k < N; k++) pageable[k] = -2;
  CU(0, cu.begin(s, GLOBAL));
  CU(0, cu.htod_async(d, pageable, N * sizeof(int), s));
  CU(0, cu.dtoh_async(dst, d, N * sizeof(int), s));
  CU(0, cu.end(s, &graph));
  CU(0, cu.instantiate(&exec, graph, 0));
  for (int k = 0; k < N; k++) pageable[k] = 7000 + k;
  CU(0, cu.launch(exec, s));
  CU(0, cu.stream_sync(s));
  for (int k = 0; k < N; k++)
    EXPECT(dst[k] == 7000 + k, "pageable source: dst[%d] = %d, wanted %d", k, dst[k], 7000 + k);
  CU(0, cu.exec_destroy(exec));
  CU(0, cu.graph_destroy(graph));
  free(pageable);

  /* An allocation during a global capture: refused, the capture invalidated. */
  void *p = NULL;
  CU(0, cu.begin(s, GLOBAL));
  CU(0, cu.htod_async(d, src, N * sizeof(int), s));
  CU(900, cu.alloc_host(&p, 64));
  EXPECT(p == NULL, "a refused allocation gave %p", p);
  CU(0, cu.is_capturing(s, &status));
  EXPECT(status == 2, "an invalidated capture: status %d", status);
  CU(901, cu.dtoh_async(dst, d, N * sizeof(int), s));
  graph = (void *)1;
  CU(901, cu.end(s, &graph));
  EXPECT(graph == NULL, "an invalidated capture gave a graph");

  /* ... allowed with the thread's mode relaxed, and the mode put back. */
  CU(0, cu.begin(s, GLOBAL));
  int mode = RELAXED;
  CU(0, cu.exchange_mode(&mode));
  EXPECT(mode == GLOBAL, "the thread's mode was %d, wanted the global mode", mode);
  CU(0, cu.alloc_host(&p, 64));
  EXPECT(p != NULL, "no memory");
  CU(0, cu.free_host(p));
  CU(0, cu.exchange_mode(&mode));
  EXPECT(mode == RELAXED, "the mode swapped back was %d", mode);
  mode = GLOBAL;
  CU(0, cu.exchange_mode(&mode));
  EXPECT(mode == GLOBAL, "the thread's mode is %d after the swap back", mode);
  CU(0, cu.htod_async(d, src, N * sizeof(int), s));
  CU(0, cu.end(s, &graph));
  EXPECT(graph != NULL, "no graph after a relaxed allocation");
  CU(0, cu.graph_destroy(graph));

  /* A synchronize, an event record on a capturing stream: refused, the capture invalidated. */
  CU(0, cu.begin(s, THREAD_LOCAL));
  CU(900, cu.stream_sync(s));
  CU(901, cu.end(s, &graph));
  EXPECT(graph == NULL, "an invalidated capture gave a graph");
  void *ev = NULL;
  CU(0, cu.event_create(&ev, 2));
  CU(0, cu.begin(s, RELAXED));
  CU(900, cu.event_record(ev, s));
  CU(901, cu.end(s, &graph));
  /* A relaxed capture prohibits nothing to its own thread. */
  CU(0, cu.begin(s, RELAXED));
  cu_ptr d2 = 0;
  CU(0, cu.mem_alloc(&d2, 64));
  CU(0, cu.mem_free(d2));
  CU(0, cu.end(s, &graph));
  CU(0, cu.graph_destroy(graph));

  /* Another thread's capture. */
  int end = -1;
  CU(900, beside_capture(GLOBAL, GLOBAL, &end));
  EXPECT(end == 901, "the other thread's global capture ended with %d, wanted 901", end);
  CU(0, beside_capture(GLOBAL, THREAD_LOCAL, &end));
  EXPECT(end == 0, "the other thread's global capture ended with %d, wanted 0", end);
  CU(0, beside_capture(THREAD_LOCAL, GLOBAL, &end));
  EXPECT(end == 0, "the other thread's thread-local capture ended with %d, wanted 0", end);
  CU(0, beside_capture(RELAXED, GLOBAL, &end));
  EXPECT(end == 0, "the other thread's relaxed capture ended with %d, wanted 0", end);

  /* Refused: a capture on the legacy stream, an end without a capture. */
  CU(900, cu.begin(NULL, GLOBAL));
  CU(900, cu.begin((void *)1, GLOBAL));
  CU(401, cu.end(s, &graph));
  CU(0, cu.stream_sync(s));

  user_objects(s);

  CU(0, cu.free_host(src));
  CU(0, cu.free_host(dst));
  CU(0, cu.mem_free(d));
  printf("OK captured work ran at each of 3 launches; refused calls invalidated their captures; "
         "user objects lived as long as their graphs\n");
  return 0;
}
