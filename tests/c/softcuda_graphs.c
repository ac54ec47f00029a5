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
 *   without a capture; cuStreamQuery answers OK once the stream is done.
 *
 * Prints "OK ..." and exits 0 when every check passed; otherwise says what failed, exit 1. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
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

  CU(0, cu.free_host(src));
  CU(0, cu.free_host(dst));
  CU(0, cu.mem_free(d));
  printf("OK captured work ran at each of 3 launches; refused calls invalidated their captures\n");
  return 0;
}
