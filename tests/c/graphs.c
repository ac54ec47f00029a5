/* CUDA graph capture through the C ABI: calls made with a stream that is being captured
 * (cuStreamBeginCapture) are recorded into the graph instead of run, and run each time the
 * graph is launched; where a call cannot be captured it is refused and the capture is left
 * intact.
 *
 *   graphs [NRANKS]          ranks are processes (fork; default 2); rank 0 sends the id by pipe.
 *                            Each rank fills every output buffer with a sentinel, captures on a
 *                            cuStreamCreate'd stream an out-of-place allreduce (float sum), an
 *                            in-place allreduce (int32 max), a broadcast from rank 1 % NRANKS,
 *                            an allreduce pre-multiplied by a scalar in device memory (new at
 *                            each launch), a gather to the last rank,
 *                            a reduce-scatter (float sum), an all-gather (int32), an all-to-all
 *                            (int32) and a group of a send to the right and a receive from the
 *                            left (int64), checks
 *                            every output still holds its sentinel (nothing ran at capture),
 *                            instantiates the graph and launches it 3 times, with new inputs
 *                            (uploaded on the stream) each time and every element checked; a
 *                            plain allreduce on the same stream between the 2nd and 3rd launch,
 *                            and one queued on it right after the 2nd launch
 *   graphs NRANKS mixed      as graphs, but odd ranks capture nothing: they make the same calls
 *                            on the stream at each iteration, so recorded calls and ordinary
 *                            ones (cut into the same slices) meet in every collective. With
 *                            FERRO_DEVICE_SLICE_BYTES=128 and 3 ranks the reduce-scatter, the
 *                            all-gather and the all-to-all are cut into slices of every block
 *   graphs NRANKS limits     what no communicator records, refused with ncclInvalidUsage and the
 *                            capture left intact: a group with an operation on another stream,
 *                            page-locked host buffers; then an ordinary call (run with
 *                            FERRO_DEVICE_SLICE_BYTES=256: in slices)
 *   graphs 2 fail            rank 1 records an allreduce and exits; rank 0's launch fails: the
 *                            output is all ones (0xff bytes), ncclCommGetAsyncError names the
 *                            error, and the next call fails
 *   graphs NRANKS lifetime   a recorded call's memory lives as long as its graph: graph 0 is
 *                            kept while graphs 1..3 are each recorded (an allreduce), launched
 *                            twice, checked and destroyed; a destroyed graph's arena becomes a
 *                            spare (ferrocclCommRecordedBytes), the next recording takes it
 *                            instead of allocating, an ordinary call frees the spares but not
 *                            graph 0's, which still runs right; once graph 0 is destroyed too,
 *                            nothing is held; a last graph is destroyed after ncclCommDestroy
 *   graphs NRANKS refuse     where calls cannot be captured (the p2p transport,
 *                            FERRO_TRANSPORTS=p2p): an allreduce on a capturing stream returns
 *                            ncclInvalidUsage naming "graph", the stream is still capturing,
 *                            the capture ends, and a plain allreduce on the stream after it works
 *
 * It runs on a CUDA driver (a GPU, or softcuda, the model of the driver, as libcuda.so.1),
 * opened at run time so this program builds without CUDA, or over the host stand-in
 * (FERRO_DEVICE_PROVIDER=host): its "device memory" is host memory, and its streams and graphs
 * are the stand-in's models, through the test hooks ferroccl's libnccl.so.2 exports
 * (ferrocclStreamBeginCapture and the others, below). Without either it says so and exits 77
 * (skipped). Exit status 0 when every check passed on every rank. */
#include <dlfcn.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

/* The driver calls used, as in cuda.h (CUdeviceptr is 64 bits; 0 is CUDA_SUCCESS). */
typedef int (*cu_init_t)(unsigned);
typedef int (*cu_stream_create_t)(void **, unsigned);
typedef int (*cu_stream_sync_t)(void *);
typedef int (*cu_htod_t)(unsigned long long, const void *, size_t);
typedef int (*cu_dtoh_t)(void *, unsigned long long, size_t);
typedef int (*cu_htod_async_t)(unsigned long long, const void *, size_t, void *);
typedef int (*cu_begin_capture_t)(void *, int);
typedef int (*cu_end_capture_t)(void *, void **);
typedef int (*cu_is_capturing_t)(void *, int *);
typedef int (*cu_instantiate_t)(void **, void *, unsigned long long);
typedef int (*cu_launch_t)(void *, void *);
typedef int (*cu_destroy_t)(void *);
typedef int (*cu_alloc_host_t)(void **, size_t);
typedef int (*cu_exchange_mode_t)(int *);

static cu_init_t cu_init;
static cu_stream_create_t cu_stream_create;
static cu_stream_sync_t cu_sync;
static cu_htod_t cu_htod;
static cu_dtoh_t cu_dtoh;
static cu_htod_async_t cu_htod_async;
static cu_begin_capture_t cu_begin_capture;
static cu_end_capture_t cu_end_capture;
static cu_is_capturing_t cu_is_capturing;
static cu_instantiate_t cu_instantiate;
static cu_launch_t cu_launch;
static cu_destroy_t cu_exec_destroy, cu_graph_destroy;
static cu_alloc_host_t cu_alloc_host;
static cu_exchange_mode_t cu_exchange_mode;
static cu_destroy_t cu_free_host;

enum { CAPTURE_MODE_GLOBAL = 0, CAPTURE_ACTIVE = 1 };

static cudaStream_t g_stream;

/* A driver call that must succeed. */
#define CU(call)                                          \
  do {                                                    \
    int e_ = (call);                                      \
    EXPECT(e_ == 0, "%s returned %d", #call, e_);         \
  } while (0)

/* Looks up the driver's entry points (in the parent, before fork: no cuInit there). 0 when
 * there is no driver. */
static int open_driver(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (lib == NULL) {
    printf("graphs: needs a CUDA driver (%s); skipped\n", dlerror());
    return 0;
  }
#define SYM(var, type, name) \
  EXPECT((var = (type)dlsym(lib, name)) != NULL, "driver symbol %s", name)
  SYM(cu_init, cu_init_t, "cuInit");
  SYM(cu_stream_create, cu_stream_create_t, "cuStreamCreate");
  SYM(cu_sync, cu_stream_sync_t, "cuStreamSynchronize");
  SYM(cu_htod, cu_htod_t, "cuMemcpyHtoD_v2");
  SYM(cu_dtoh, cu_dtoh_t, "cuMemcpyDtoH_v2");
  SYM(cu_htod_async, cu_htod_async_t, "cuMemcpyHtoDAsync_v2");
  SYM(cu_begin_capture, cu_begin_capture_t, "cuStreamBeginCapture_v2");
  SYM(cu_end_capture, cu_end_capture_t, "cuStreamEndCapture");
  SYM(cu_is_capturing, cu_is_capturing_t, "cuStreamIsCapturing");
  SYM(cu_instantiate, cu_instantiate_t, "cuGraphInstantiateWithFlags");
  SYM(cu_launch, cu_launch_t, "cuGraphLaunch");
  SYM(cu_exec_destroy, cu_destroy_t, "cuGraphExecDestroy");
  SYM(cu_graph_destroy, cu_destroy_t, "cuGraphDestroy");
  SYM(cu_alloc_host, cu_alloc_host_t, "cuMemAllocHost_v2");
  SYM(cu_exchange_mode, cu_exchange_mode_t, "cuThreadExchangeStreamCaptureMode");
  SYM(cu_free_host, cu_destroy_t, "cuMemFreeHost");
#undef SYM
  return 1;
}

/* The host stand-in's stream and graph calls (test hooks of ferroccl's libnccl.so.2). */
int ferrocclStreamSynchronize(cudaStream_t stream);
int ferrocclMemcpyAsync(void *dst, const void *src, size_t bytes, cudaStream_t stream);
int ferrocclStreamBeginCapture(cudaStream_t stream);
int ferrocclStreamEndCapture(cudaStream_t stream, void **graph);
int ferrocclStreamIsCapturing(cudaStream_t stream, int *status);
int ferrocclGraphLaunch(void *graph, cudaStream_t stream);
int ferrocclGraphDestroy(void *graph);
int ferrocclMemAllocHost(void **ptr, size_t bytes);
int ferrocclMemFreeHost(void *ptr);
int ferrocclCommRecordedBytes(ncclComm_t comm, size_t *live, size_t *spare);

/* The driver's calls over the stand-in: its device memory is host memory, so a synchronous
 * copy is a memcpy after the stream's earlier work; an instantiated graph is the graph. */
static int si_init(unsigned f) { return (int)f; }
static int si_stream_create(void **s, unsigned f) {
  static uintptr_t next = 0x6a7c;
  *s = (void *)next++;
  return (int)f;
}
static int si_sync(void *s) { return ferrocclStreamSynchronize(s); }
static int si_htod(unsigned long long d, const void *h, size_t n) {
  int e = ferrocclStreamSynchronize(g_stream);
  memcpy((void *)(uintptr_t)d, h, n);
  return e;
}
static int si_dtoh(void *h, unsigned long long d, size_t n) {
  int e = ferrocclStreamSynchronize(g_stream);
  memcpy(h, (const void *)(uintptr_t)d, n);
  return e;
}
static int si_htod_async(unsigned long long d, const void *h, size_t n, void *s) {
  return ferrocclMemcpyAsync((void *)(uintptr_t)d, h, n, s);
}
static int si_begin_capture(void *s, int mode) { return ferrocclStreamBeginCapture(s) + mode; }
static int si_end_capture(void *s, void **g) { return ferrocclStreamEndCapture(s, g); }
static int si_is_capturing(void *s, int *status) { return ferrocclStreamIsCapturing(s, status); }
static int si_instantiate(void **exec, void *g, unsigned long long f) {
  *exec = g;
  return (int)f;
}
static int si_launch(void *exec, void *s) { return ferrocclGraphLaunch(exec, s); }
static int si_exec_destroy(void *exec) { return exec == NULL; }
static int si_graph_destroy(void *g) { return ferrocclGraphDestroy(g); }
/* The stand-in has no capture modes: the thread's stays the global one. */
static int si_exchange_mode(int *mode) { return *mode != CAPTURE_MODE_GLOBAL; }

static void stand_in(void) {
  cu_init = si_init;
  cu_stream_create = si_stream_create;
  cu_sync = si_sync;
  cu_htod = si_htod;
  cu_dtoh = si_dtoh;
  cu_htod_async = si_htod_async;
  cu_begin_capture = si_begin_capture;
  cu_end_capture = si_end_capture;
  cu_is_capturing = si_is_capturing;
  cu_instantiate = si_instantiate;
  cu_launch = si_launch;
  cu_exec_destroy = si_exec_destroy;
  cu_graph_destroy = si_graph_destroy;
  cu_alloc_host = ferrocclMemAllocHost;
  cu_free_host = ferrocclMemFreeHost;
  cu_exchange_mode = si_exchange_mode;
}

/* cuInit and the stream, after ncclMemAlloc made the device's primary context current on this
 * thread. */
static void make_stream(void) {
  CU(cu_init(0));
  void *s = NULL;
  CU(cu_stream_create(&s, 0));
  g_stream = (cudaStream_t)s;
}

static unsigned long long dptr(const void *p) { return (unsigned long long)(uintptr_t)p; }

static void *dev_alloc(size_t bytes) {
  void *p = NULL;
  CHECK(ncclMemAlloc(&p, bytes));
  EXPECT(p != NULL, "ncclMemAlloc gave NULL");
  return p;
}

static int capturing(void) {
  int status = -1;
  CU(cu_is_capturing(g_stream, &status));
  return status;
}

/* Element counts: the all-reduces, the broadcast, per rank of the reduce-scatter and the
 * all-gather, the messages. */
enum { A = 1031, M = 7, B = 257, RS = 61, AG = 13, P = 100, PM = 64, GA = 11, AA = 37 };

/* The buffers of mode graphs: device memory, a host array of the same size, whether it is an
 * input (uploaded before each launch) and an output (checked after). */
enum {
  AR_S, AR_R, MX, BC_S, BC_R, RS_S, RS_R, AG_S, AG_R, SR_S, SR_R, PM_S, PM_R, SC, GA_S, GA_R,
  AA_S, AA_R, X_S, X_R, NB
};
static struct {
  void *dev, *host;
  size_t bytes;
  int in, out;
  const char *name;
} b[NB];

static void buffer(int i, size_t bytes, int in, int out, const char *name) {
  b[i].dev = dev_alloc(bytes);
  b[i].host = malloc(bytes);
  EXPECT(b[i].host != NULL, "malloc");
  b[i].bytes = bytes;
  b[i].in = in;
  b[i].out = out;
  b[i].name = name;
}

/* Every byte of buffer i set to `byte`, synchronously. */
static void fill(int i, int byte) {
  memset(b[i].host, byte, b[i].bytes);
  CU(cu_htod(dptr(b[i].dev), b[i].host, b[i].bytes));
}

/* Output i still holds `byte` in every byte. */
static void expect_fill(int i, int byte) {
  unsigned char *h = b[i].host;
  CU(cu_dtoh(h, dptr(b[i].dev), b[i].bytes));
  for (size_t j = 0; j < b[i].bytes; j++)
    EXPECT(h[j] == (unsigned char)byte, "after the capture, %s byte %zu = 0x%02x, want 0x%02x "
           "(a call ran at capture)", b[i].name, j, h[j], byte);
}

/* Every element of `got` equal to `want` (an expression of i); exact in double for every type
 * here. K: the launch (-1: the plain call). */
#define EXPECT_ALL(k, call, count, got, want)                                              \
  for (int i = 0; i < (count); i++) {                                                      \
    double w_ = (double)(want), g_ = (double)(got)[i];                                     \
    EXPECT(g_ == w_, "iteration %d, %s [%d] = %.17g, want %.17g", k, call, i, g_, w_);     \
  }

/* The inputs of launch k: a distinct value in every element, by rank, element and k, uploaded
 * on the stream (the host arrays are left alone until the stream is synchronized). */
static void inputs(int rank, int n, int k) {
  float *ar = b[AR_S].host, *rs = b[RS_S].host;
  int32_t *mx = b[MX].host, *bc = b[BC_S].host, *ag = b[AG_S].host;
  int64_t *sr = b[SR_S].host;
  for (int i = 0; i < A; i++) ar[i] = (float)(rank * 4096 + i + 17 * k);
  /* element i is largest on rank (i + k) % n */
  for (int i = 0; i < M; i++)
    mx[i] = (i + k) % n == rank ? 1000000 + 1000 * k + i : rank * 100 + i + 10 * k;
  for (int i = 0; i < B; i++) bc[i] = rank * 100000 + 7 * i + 13 * k;
  for (int j = 0; j < n * RS; j++) rs[j] = (float)(rank * 4096 + j + 17 * k);
  for (int i = 0; i < AG; i++) ag[i] = rank * 1000 + 10 * i + k;
  for (int i = 0; i < P; i++) sr[i] = (int64_t)rank * 1000000000 + 1000 * i + k;
  float *pm = b[PM_S].host, *sc = b[SC].host;
  for (int i = 0; i < PM; i++) pm[i] = (float)(rank * 64 + i + k);
  sc[0] = (float)(k + 2); /* the same on every rank, new at each launch */
  int32_t *ga = b[GA_S].host;
  for (int i = 0; i < GA; i++) ga[i] = rank * 100 + i + k;
  int32_t *aa = b[AA_S].host; /* block q goes to rank q */
  for (int j = 0; j < n * AA; j++) aa[j] = rank * 10000 + j + 3 * k;
  for (int i = 0; i < NB; i++)
    if (b[i].in) CU(cu_htod_async(dptr(b[i].dev), b[i].host, b[i].bytes, g_stream));
}

/* The outputs of launch k, downloaded and checked element by element. */
static void check_outputs(int rank, int n, int k) {
  for (int i = 0; i < NB; i++)
    if (b[i].out) CU(cu_dtoh(b[i].host, dptr(b[i].dev), b[i].bytes));
  const float *ar = b[AR_R].host, *rs = b[RS_R].host;
  const int32_t *mx = b[MX].host, *bc = b[BC_R].host, *ag = b[AG_R].host;
  const int64_t *sr = b[SR_R].host;
  int tri = 4096 * n * (n - 1) / 2, root = 1 % n, left = (rank + n - 1) % n;
  EXPECT_ALL(k, "ncclAllReduce sum", A, ar, tri + n * (i + 17 * k));
  EXPECT_ALL(k, "ncclAllReduce max in place", M, mx, 1000000 + 1000 * k + i);
  EXPECT_ALL(k, "ncclBroadcast", B, bc, root * 100000 + 7 * i + 13 * k);
  EXPECT_ALL(k, "ncclReduceScatter", RS, rs, tri + n * (rank * RS + i + 17 * k));
  /* block q of the all-gather is rank q's input */
  EXPECT_ALL(k, "ncclAllGather", n * AG, ag, (i / AG) * 1000 + 10 * (i % AG) + k);
  EXPECT_ALL(k, "ncclRecv from the left", P, sr, (int64_t)left * 1000000000 + 1000 * i + k);
  const float *pm = b[PM_R].host;
  EXPECT_ALL(k, "ncclAllReduce pre-multiplied by a device scalar", PM, pm,
             (k + 2) * (64 * n * (n - 1) / 2 + n * (i + k)));
  /* block q of the gather at its root (the last rank) is rank q's input */
  const int32_t *ga = b[GA_R].host;
  if (rank == n - 1) EXPECT_ALL(k, "ncclGather", n * GA, ga, (i / GA) * 100 + i % GA + k);
  /* block q of the all-to-all is rank q's block for this rank */
  const int32_t *aa = b[AA_R].host;
  EXPECT_ALL(k, "ncclAlltoAll", n * AA, aa, (i / AA) * 10000 + rank * AA + i % AA + 3 * k);
}

/* The calls recorded into the graph (each must be captured, not run). */
/* The pre-multiplied sum of the recorded calls, its scalar in device memory (b[SC]): read at
 * each launch. */
static ncclRedOp_t g_premul;

static void record(ncclComm_t comm, int rank, int n) {
  CHECK(ncclAllReduce(b[AR_S].dev, b[AR_R].dev, A, ncclFloat, ncclSum, comm, g_stream));
  CHECK(ncclAllReduce(b[MX].dev, b[MX].dev, M, ncclInt32, ncclMax, comm, g_stream));
  CHECK(ncclBroadcast(b[BC_S].dev, b[BC_R].dev, B, ncclInt32, 1 % n, comm, g_stream));
  CHECK(ncclReduceScatter(b[RS_S].dev, b[RS_R].dev, RS, ncclFloat, ncclSum, comm, g_stream));
  CHECK(ncclAllGather(b[AG_S].dev, b[AG_R].dev, AG, ncclInt32, comm, g_stream));
  CHECK(ncclAllReduce(b[PM_S].dev, b[PM_R].dev, PM, ncclFloat, g_premul, comm, g_stream));
  CHECK(ncclGather(b[GA_S].dev, b[GA_R].dev, GA, ncclInt32, n - 1, comm, g_stream));
  CHECK(ncclAlltoAll(b[AA_S].dev, b[AA_R].dev, AA, ncclInt32, comm, g_stream));
  CHECK(ncclGroupStart());
  CHECK(ncclSend(b[SR_S].dev, P, ncclInt64, (rank + 1) % n, comm, g_stream));
  CHECK(ncclRecv(b[SR_R].dev, P, ncclInt64, (rank + n - 1) % n, comm, g_stream));
  CHECK(ncclGroupEnd());
}

/* A plain (uncaptured) allreduce on the stream into the buffers of the captured one. */
static void plain_allreduce(ncclComm_t comm, int rank, int n) {
  float *h = b[AR_S].host;
  for (int i = 0; i < A; i++) h[i] = (float)(rank * 4096 + 2 * i + 5000);
  CU(cu_htod_async(dptr(b[AR_S].dev), h, b[AR_S].bytes, g_stream));
  CHECK(ncclAllReduce(b[AR_S].dev, b[AR_R].dev, A, ncclFloat, ncclSum, comm, g_stream));
  CU(cu_sync(g_stream));
  float *got = b[AR_R].host;
  CU(cu_dtoh(got, dptr(b[AR_R].dev), b[AR_R].bytes));
  EXPECT_ALL(-1, "plain ncclAllReduce", A, got, 4096 * n * (n - 1) / 2 + n * (2 * i + 5000));
}

/* An ordinary allreduce queued on the stream right after a launch, before any synchronize:
 * it runs after the launch's calls, in stream order (a recorded call that waited for the
 * communicator's queued work would wait for it forever). Checked by check_after. */
static void queue_after(ncclComm_t comm, int rank) {
  float *h = b[X_S].host;
  for (int i = 0; i < A; i++) h[i] = (float)(rank * 4096 + 3 * i + 77);
  CU(cu_htod_async(dptr(b[X_S].dev), h, b[X_S].bytes, g_stream));
  CHECK(ncclAllReduce(b[X_S].dev, b[X_R].dev, A, ncclFloat, ncclSum, comm, g_stream));
}

static void check_after(int n) {
  float *got = b[X_R].host;
  CU(cu_dtoh(got, dptr(b[X_R].dev), b[X_R].bytes));
  EXPECT_ALL(1, "ncclAllReduce queued after the launch", A, got,
             4096 * n * (n - 1) / 2 + n * (3 * i + 77));
}

static void graphs(ncclComm_t comm, int rank, int n, int capture) {
  buffer(AR_S, sizeof(float) * A, 1, 0, "ncclAllReduce sendbuff");
  buffer(AR_R, sizeof(float) * A, 0, 1, "ncclAllReduce recvbuff");
  buffer(MX, sizeof(int32_t) * M, 1, 1, "in-place ncclAllReduce buff");
  buffer(BC_S, sizeof(int32_t) * B, 1, 0, "ncclBroadcast sendbuff");
  buffer(BC_R, sizeof(int32_t) * B, 0, 1, "ncclBroadcast recvbuff");
  buffer(RS_S, sizeof(float) * RS * n, 1, 0, "ncclReduceScatter sendbuff");
  buffer(RS_R, sizeof(float) * RS, 0, 1, "ncclReduceScatter recvbuff");
  buffer(AG_S, sizeof(int32_t) * AG, 1, 0, "ncclAllGather sendbuff");
  buffer(AG_R, sizeof(int32_t) * AG * n, 0, 1, "ncclAllGather recvbuff");
  buffer(SR_S, sizeof(int64_t) * P, 1, 0, "ncclSend buff");
  buffer(SR_R, sizeof(int64_t) * P, 0, 1, "ncclRecv buff");
  buffer(PM_S, sizeof(float) * PM, 1, 0, "pre-multiplied ncclAllReduce sendbuff");
  buffer(PM_R, sizeof(float) * PM, 0, 1, "pre-multiplied ncclAllReduce recvbuff");
  buffer(SC, sizeof(float), 1, 0, "the pre-multiplied sum's scalar");
  CHECK(ncclRedOpCreatePreMulSum(&g_premul, b[SC].dev, ncclFloat, ncclScalarDevice, comm));
  buffer(GA_S, sizeof(int32_t) * GA, 1, 0, "ncclGather sendbuff");
  buffer(GA_R, sizeof(int32_t) * GA * n, 0, 1, "ncclGather recvbuff");
  buffer(AA_S, sizeof(int32_t) * AA * n, 1, 0, "ncclAlltoAll sendbuff");
  buffer(AA_R, sizeof(int32_t) * AA * n, 0, 1, "ncclAlltoAll recvbuff");
  buffer(X_S, sizeof(float) * A, 0, 0, "sendbuff of the allreduce after a launch");
  buffer(X_R, sizeof(float) * A, 0, 0, "recvbuff of the allreduce after a launch");
  make_stream();

  /* Sentinels: outputs 0xa5, inputs 0x11 (a call run now would change an output), the
   * in-place buffer 0xb0 + rank (its max over the ranks would change every rank's but the
   * last's). */
  void *graph = NULL, *exec = NULL;
  if (!capture) {
    /* The same calls, made at each iteration on the stream instead of launched. */
    for (int k = 0; k < 3; k++) {
      if (k == 2) plain_allreduce(comm, rank, n);
      inputs(rank, n, k);
      record(comm, rank, n);
      if (k == 1) queue_after(comm, rank);
      CU(cu_sync(g_stream));
      check_outputs(rank, n, k);
      if (k == 1) check_after(n);
    }
    goto done;
  }
  for (int i = 0; i < NB; i++) fill(i, i == MX ? 0xb0 + rank : b[i].out ? 0xa5 : 0x11);
  CU(cu_begin_capture(g_stream, CAPTURE_MODE_GLOBAL));
  EXPECT(capturing() == CAPTURE_ACTIVE, "the stream capturing after cuStreamBeginCapture");
  record(comm, rank, n);
  EXPECT(capturing() == CAPTURE_ACTIVE, "the stream still capturing after the calls");
  /* The calls relaxed the thread's capture mode while they ran, and gave it back. */
  int mode = CAPTURE_MODE_GLOBAL;
  CU(cu_exchange_mode(&mode));
  EXPECT(mode == CAPTURE_MODE_GLOBAL, "the thread's capture mode %d after the calls, want %d "
         "(global, the program's)", mode, CAPTURE_MODE_GLOBAL);
  CU(cu_end_capture(g_stream, &graph));
  EXPECT(graph != NULL, "a graph from cuStreamEndCapture");
  for (int i = 0; i < NB; i++)
    if (b[i].out) expect_fill(i, i == MX ? 0xb0 + rank : 0xa5);
  CU(cu_instantiate(&exec, graph, 0));
  EXPECT(exec != NULL, "an executable graph from cuGraphInstantiateWithFlags");

  for (int k = 0; k < 3; k++) {
    /* Between the 2nd and the 3rd launch, an ordinary call on the same stream and
     * communicator. */
    if (k == 2) plain_allreduce(comm, rank, n);
    inputs(rank, n, k);
    CU(cu_launch(exec, g_stream));
    if (k == 1) queue_after(comm, rank);
    CU(cu_sync(g_stream));
    check_outputs(rank, n, k);
    if (k == 1) check_after(n);
  }

  CU(cu_exec_destroy(exec));
  CU(cu_graph_destroy(graph));
done:;
  CHECK(ncclRedOpDestroy(g_premul, comm));
  ncclResult_t async = ncclInternalError;
  CHECK(ncclCommGetAsyncError(comm, &async));
  EXPECT(async == ncclSuccess, "no asynchronous error, got %d (%s)", (int)async,
         ncclGetErrorString(async));
  for (int i = 0; i < NB; i++) {
    CHECK(ncclMemFree(b[i].dev));
    free(b[i].host);
  }
}

/* An ordinary allreduce of A floats on the stream, from send into recv, checked: whatever
 * came before left nothing half queued. `what` names it in a failure. */
static void ordinary_allreduce(ncclComm_t comm, void *send, void *recv, int rank, int n,
                               const char *what) {
  size_t bytes = sizeof(float) * A;
  float *h = malloc(bytes), *got = malloc(bytes);
  EXPECT(h != NULL && got != NULL, "malloc");
  for (int i = 0; i < A; i++) h[i] = (float)(rank * 4096 + i);
  CU(cu_htod_async(dptr(send), h, bytes, g_stream));
  CHECK(ncclAllReduce(send, recv, A, ncclFloat, ncclSum, comm, g_stream));
  CU(cu_sync(g_stream));
  CU(cu_dtoh(got, dptr(recv), bytes));
  EXPECT_ALL(-1, what, A, got, 4096 * n * (n - 1) / 2 + n * i);
  free(h);
  free(got);
}

/* Mode refuse: a call that cannot be captured is refused and leaves the capture intact. */
static void refuse(ncclComm_t comm, int rank, int n) {
  size_t bytes = sizeof(float) * A;
  void *send = dev_alloc(bytes), *recv = dev_alloc(bytes);
  make_stream();
  CU(cu_begin_capture(g_stream, CAPTURE_MODE_GLOBAL));
  EXPECT(capturing() == CAPTURE_ACTIVE, "the stream capturing after cuStreamBeginCapture");
  EXPECT_ERR(ncclAllReduce(send, recv, A, ncclFloat, ncclSum, comm, g_stream), ncclInvalidUsage,
             "graph");
  EXPECT(capturing() == CAPTURE_ACTIVE, "the stream still capturing after the refused call");
  void *graph = NULL;
  CU(cu_end_capture(g_stream, &graph));
  if (graph != NULL) CU(cu_graph_destroy(graph));
  EXPECT(capturing() == 0, "the stream no longer capturing after cuStreamEndCapture");

  ordinary_allreduce(comm, send, recv, rank, n, "ncclAllReduce after the capture");
  ncclResult_t async = ncclInternalError;
  CHECK(ncclCommGetAsyncError(comm, &async));
  EXPECT(async == ncclSuccess, "no asynchronous error, got %d", (int)async);
  CHECK(ncclMemFree(send));
  CHECK(ncclMemFree(recv));
}

/* The pinned bytes comm holds for recorded calls, waiting up to 10 s for `spare` bytes to be
 * spares: a driver may run a destroyed graph's destructors on a thread of its own, later. */
static void recorded_bytes(ncclComm_t comm, size_t *live, size_t *spare, size_t want_spare) {
  for (int t = 0; t < 10000; t++) {
    CHECK(ferrocclCommRecordedBytes(comm, live, spare));
    if (*spare >= want_spare) return;
    usleep(1000);
  }
}

/* Records an allreduce of A floats from send into recv on the stream: a graph, instantiated. */
static void record_allreduce(ncclComm_t comm, void *send, void *recv, void **graph, void **exec) {
  CU(cu_begin_capture(g_stream, CAPTURE_MODE_GLOBAL));
  CHECK(ncclAllReduce(send, recv, A, ncclFloat, ncclSum, comm, g_stream));
  CU(cu_end_capture(g_stream, graph));
  CU(cu_instantiate(exec, *graph, 0));
}

/* Launches exec with new inputs (k: a distinct value in every element) and checks recv. */
static void launch_allreduce(void *exec, void *send, void *recv, int rank, int n, int k) {
  size_t bytes = sizeof(float) * A;
  float *h = malloc(bytes);
  EXPECT(h != NULL, "malloc");
  for (int i = 0; i < A; i++) h[i] = (float)(rank * 4096 + i + 17 * k);
  CU(cu_htod_async(dptr(send), h, bytes, g_stream));
  CU(cu_launch(exec, g_stream));
  CU(cu_sync(g_stream));
  CU(cu_dtoh(h, dptr(recv), bytes));
  EXPECT_ALL(k, "recorded ncclAllReduce", A, h, 4096 * n * (n - 1) / 2 + n * (i + 17 * k));
  free(h);
}

/* The graph of mode lifetime destroyed after its communicator, and its buffers. */
static void *g_late_graph, *g_late_exec, *g_late_send, *g_late_recv;

/* Mode lifetime: a recorded call's arena lives as long as its graph, and is reused. */
static void lifetime(ncclComm_t comm, int rank, int n) {
  size_t bytes = sizeof(float) * A;
  void *send = dev_alloc(bytes), *recv = dev_alloc(bytes);
  make_stream();
  void *kept_graph = NULL, *kept_exec = NULL;
  size_t live = 0, spare = 0, one = 0;
  record_allreduce(comm, send, recv, &kept_graph, &kept_exec);
  recorded_bytes(comm, &one, &spare, 0);
  EXPECT(one > 0 && spare == 0, "after recording graph 0: %zu bytes live, %zu spare", one, spare);
  launch_allreduce(kept_exec, send, recv, rank, n, 0);
  for (int g = 1; g < 4; g++) {
    void *graph = NULL, *exec = NULL;
    record_allreduce(comm, send, recv, &graph, &exec);
    /* Graph g's call took the spare arena of graph g - 1 (none spare, two live). */
    recorded_bytes(comm, &live, &spare, 0);
    EXPECT(live == 2 * one && spare == 0, "after recording graph %d: %zu bytes live, %zu spare; "
           "want %zu live (graphs 0 and %d) and none spare", g, live, spare, 2 * one, g);
    launch_allreduce(exec, send, recv, rank, n, 2 * g);
    launch_allreduce(exec, send, recv, rank, n, 2 * g + 1);
    CU(cu_exec_destroy(exec));
    CU(cu_graph_destroy(graph));
    recorded_bytes(comm, &live, &spare, one);
    EXPECT(live == one && spare == one, "after destroying graph %d: %zu bytes live, %zu spare; "
           "want %zu of each", g, live, spare, one);
  }
  /* An ordinary call frees the spare, not graph 0's arena, which still serves its launches. */
  ordinary_allreduce(comm, send, recv, rank, n, "ncclAllReduce after the graphs");
  CHECK(ferrocclCommRecordedBytes(comm, &live, &spare));
  EXPECT(live == one && spare == 0, "after an ordinary call: %zu bytes live, %zu spare; want "
         "%zu live (graph 0) and none spare", live, spare, one);
  launch_allreduce(kept_exec, send, recv, rank, n, 9);
  CU(cu_exec_destroy(kept_exec));
  CU(cu_graph_destroy(kept_graph));
  recorded_bytes(comm, &live, &spare, one);
  ordinary_allreduce(comm, send, recv, rank, n, "ncclAllReduce after the last graph");
  CHECK(ferrocclCommRecordedBytes(comm, &live, &spare));
  EXPECT(live == 0 && spare == 0, "with no graph left: %zu bytes live, %zu spare", live, spare);
  /* A graph left for after the communicator's end (run_rank destroys it then: NCCL's contract
   * allows that, without a launch after the end). */
  record_allreduce(comm, send, recv, &g_late_graph, &g_late_exec);
  launch_allreduce(g_late_exec, send, recv, rank, n, 10);
  g_late_send = send;
  g_late_recv = recv;
}

/* Mode limits: calls no communicator records are refused, the capture intact. */
static void limits(ncclComm_t comm, int rank, int n) {
  size_t bytes = sizeof(float) * A;
  void *send = dev_alloc(bytes), *recv = dev_alloc(bytes);
  void *locked_s = NULL, *locked_r = NULL;
  make_stream();
  void *other = NULL;
  CU(cu_stream_create(&other, 0));
  /* Allocated before the capture: an allocation during one would invalidate it. */
  CU(cu_alloc_host(&locked_s, bytes));
  CU(cu_alloc_host(&locked_r, bytes));
  CU(cu_begin_capture(g_stream, CAPTURE_MODE_GLOBAL));
  CHECK(ncclGroupStart());
  CHECK(ncclAllReduce(send, recv, A, ncclFloat, ncclSum, comm, g_stream));
  CHECK(ncclAllReduce(send, recv, A, ncclFloat, ncclSum, comm, (cudaStream_t)other));
  EXPECT_ERR(ncclGroupEnd(), ncclInvalidUsage, "not on the stream being captured");
  EXPECT(capturing() == CAPTURE_ACTIVE, "capturing after the refused group");
  EXPECT_ERR(ncclAllReduce(locked_s, locked_r, A, ncclFloat, ncclSum, comm, g_stream),
             ncclInvalidUsage, "page-locked");
  EXPECT(capturing() == CAPTURE_ACTIVE, "capturing after the refused page-locked call");
  void *graph = NULL;
  CU(cu_end_capture(g_stream, &graph));
  EXPECT(graph != NULL, "a graph after the refused calls");
  CU(cu_graph_destroy(graph));
  ordinary_allreduce(comm, send, recv, rank, n, "ncclAllReduce after the refusals");
  CU(cu_free_host(locked_s));
  CU(cu_free_host(locked_r));
  CHECK(ncclMemFree(send));
  CHECK(ncclMemFree(recv));
}

/* Mode fail: rank 1 leaves after recording; rank 0's launch fails visibly. Rank 0 aborts
 * the communicator itself; returns its exit status. */
static int fail(ncclComm_t comm, int rank) {
  size_t bytes = sizeof(float) * A;
  void *send = dev_alloc(bytes), *recv = dev_alloc(bytes);
  unsigned char *got = malloc(bytes);
  EXPECT(got != NULL, "malloc");
  make_stream();
  memset(got, 0x11, bytes);
  CU(cu_htod(dptr(send), got, bytes));
  CU(cu_htod(dptr(recv), got, bytes));
  CU(cu_begin_capture(g_stream, CAPTURE_MODE_GLOBAL));
  CHECK(ncclAllReduce(send, recv, A, ncclFloat, ncclSum, comm, g_stream));
  void *graph = NULL, *exec = NULL;
  CU(cu_end_capture(g_stream, &graph));
  CU(cu_instantiate(&exec, graph, 0));
  if (rank != 0) _exit(0); /* gone without closing its connections */
  CU(cu_launch(exec, g_stream));
  CU(cu_sync(g_stream));
  CU(cu_dtoh(got, dptr(recv), bytes));
  for (size_t j = 0; j < bytes; j++)
    EXPECT(got[j] == 0xff, "the failed launch's output byte %zu = 0x%02x, want 0xff", j, got[j]);
  ncclResult_t async = ncclSuccess;
  CHECK(ncclCommGetAsyncError(comm, &async));
  EXPECT(async != ncclSuccess && async != ncclInProgress,
         "an asynchronous error after the failed launch, got %d", (int)async);
  EXPECT(ncclAllReduce(send, recv, A, ncclFloat, ncclSum, comm, g_stream) != ncclSuccess,
         "a call after the failed launch fails");
  CU(cu_exec_destroy(exec));
  CU(cu_graph_destroy(graph));
  free(got);
  CHECK(ncclCommAbort(comm));
  return 0;
}

static int run_rank(int rank, int n, ncclUniqueId id, const char *mode) {
  g_rank = rank;
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, n, id, rank));
  if (strcmp(mode, "refuse") == 0)
    refuse(comm, rank, n);
  else if (strcmp(mode, "limits") == 0)
    limits(comm, rank, n);
  else if (strcmp(mode, "fail") == 0)
    return fail(comm, rank);
  else if (strcmp(mode, "lifetime") == 0)
    lifetime(comm, rank, n);
  else
    graphs(comm, rank, n, strcmp(mode, "mixed") != 0 || rank % 2 == 0);
  CHECK(ncclCommDestroy(comm));
  if (g_late_graph != NULL) {
    /* The graph outlived its communicator: destroying it now (the release of its recorded
     * call runs after the communicator's end) must be harmless. */
    CU(cu_exec_destroy(g_late_exec));
    CU(cu_graph_destroy(g_late_graph));
    CHECK(ncclMemFree(g_late_send));
    CHECK(ncclMemFree(g_late_recv));
  }
  return 0;
}

static int rank_main(int rank, int n, ncclUniqueId id, void *mode) {
  return run_rank(rank, n, id, mode);
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2;
  const char *mode = argc > 2 ? argv[2] : "graphs";
  const char *modes[] = {"graphs", "mixed", "limits", "fail", "refuse", "lifetime"};
  int known = 0;
  for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) known |= strcmp(mode, modes[m]) == 0;
  if (n < 1 || !known || (strcmp(mode, "fail") == 0 && n != 2)) {
    fprintf(stderr, "usage: graphs [NRANKS [mixed|limits|refuse|lifetime]] | graphs 2 fail\n");
    return 1;
  }
  const char *prov = getenv("FERRO_DEVICE_PROVIDER");
  if (prov != NULL && strcmp(prov, "host") == 0)
    stand_in();
  else if (!open_driver())
    return 77;
  int failed = fork_ranks(n, 0, rank_main, (void *)mode);
  if (failed)
    printf("FAILED\n");
  else if (strcmp(mode, "refuse") == 0 || strcmp(mode, "limits") == 0)
    printf("OK %d ranks (%s): calls on a capturing stream refused, the capture intact\n", n,
           mode);
  else if (strcmp(mode, "fail") == 0)
    printf("OK %d ranks (fail): a failed launch left ones and an asynchronous error\n", n);
  else if (strcmp(mode, "lifetime") == 0)
    printf("OK %d ranks (lifetime): a recorded call's memory lived as long as its graph\n", n);
  else
    printf("OK %d ranks (%s): captured calls ran at each of 3 launches, not at capture\n", n,
           mode);
  return failed;
}
