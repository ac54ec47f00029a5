/* Device buffers through the C ABI: a non-NULL stream means the buffers are device memory of
 * the communicator's device. ncclMemAlloc'd buffers, every collective (all-reduce, broadcast,
 * reduce, all-gather, reduce-scatter, all-to-all) with a distinct value in every element, a
 * pre-multiplied sum with its scalar in device memory, page-locked host buffers with the
 * stream, a group of two calls, send/recv in a group, gather, scatter, a host pointer refused,
 * ncclMemFree; with one process per rank, a group of long sends and receives (several pieces
 * each where FERRO_DEVICE_SLICE_BYTES is small) beside a short one and messages to self, and
 * a group whose receive buffers overlap refused.
 *
 *   streams NRANKS           ranks are processes (fork); rank 0 sends the id by pipe
 *   streams NDEV all         one process, ncclCommInitAll, one thread driving every
 *                            communicator through groups (host stand-in only)
 *   streams NRANKS mixed     as above, even ranks stream-ordered, odd ranks blocking
 *   streams NRANKS windows   ranks are processes; send and receive buffers registered as
 *                            windows (ncclCommWindowRegister), allreduces of whole buffers and
 *                            of ranges inside them, a broadcast, then deregistered and freed
 *   streams NRANKS repeat K  ranks are processes; K allreduces of 8 bytes between buffers
 *                            registered as windows, back to back on the stream, then one check
 *                            (the driver calls of a small call: scripts/driver-calls.sh)
 *   streams NRANKS comms K   ranks are processes; K communicators split from the first one
 *                            after another, each twice registering windows, one allreduce on
 *                            the stream, deregistering before the result is read, checked
 *                            (what a communicator leaves open in the driver:
 *                            scripts/driver-calls.sh)
 *   streams 1 nodriver       no stand-in and no driver: a non-NULL stream and ncclMemAlloc fail
 *                            with ncclSystemError and the driver's message, no crash
 *
 * With FERRO_DEVICE_PROVIDER=host (the test stand-in) ncclMemAlloc's "device memory" is host
 * heap memory, so to_dev / from_dev below are plain memcpy after a synchronize of the stream
 * (calls with a stream complete in stream order, after they return), and the stream is the
 * made-up handle (cudaStream_t)0x1. Otherwise (a GPU) they are the driver's copies (libcuda.so.1,
 * opened at run time, so this program builds without CUDA) and the stream is created with
 * cuStreamCreate; the upload is queued on that stream, so the collective must wait for it.
 *
 * Exit status 0 when every check passed. */
#include <dlfcn.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

/* The stand-in's stream synchronize and copy (exported by ferroccl's libnccl.so.2 for tests). */
int ferrocclStreamSynchronize(cudaStream_t stream);
int ferrocclMemcpyAsync(void *dst, const void *src, size_t bytes, cudaStream_t stream);
/* Page-locked host memory through the device provider (the stand-in's, or cuMemAllocHost). */
int ferrocclMemAllocHost(void **ptr, size_t bytes);
int ferrocclMemFreeHost(void *ptr);

static int g_standin = 0;
static cudaStream_t g_stream = (cudaStream_t)0x1;

typedef int (*cu_init_t)(unsigned);
typedef int (*cu_htod_t)(unsigned long long, const void *, size_t, void *);
typedef int (*cu_dtoh_t)(void *, unsigned long long, size_t);
typedef int (*cu_stream_create_t)(void **, unsigned);
static cu_htod_t cu_htod_async;
static cu_dtoh_t cu_dtoh;
/* cuStreamSynchronize, used before a download when FERROCCL_TEST_SYNC_FIRST is set. */
static int (*cu_sync)(void *);

/* Opens the driver's copy calls (not with the stand-in). */
static void open_driver(void) {
  if (g_standin) return;
  void *lib = dlopen("libcuda.so.1", RTLD_NOW);
  EXPECT(lib != NULL, "libcuda.so.1: %s", dlerror());
  cu_init_t init = (cu_init_t)dlsym(lib, "cuInit");
  cu_htod_async = (cu_htod_t)dlsym(lib, "cuMemcpyHtoDAsync_v2");
  cu_dtoh = (cu_dtoh_t)dlsym(lib, "cuMemcpyDtoH_v2");
  cu_stream_create_t create = (cu_stream_create_t)dlsym(lib, "cuStreamCreate");
  cu_sync = (int (*)(void *))dlsym(lib, "cuStreamSynchronize");
  EXPECT(init && cu_htod_async && cu_dtoh && create, "driver symbols");
  EXPECT(init(0) == 0, "cuInit");
  void *s = NULL;
  /* ncclMemAlloc made the device's primary context current on this thread. */
  EXPECT(create(&s, 0) == 0, "cuStreamCreate");
  g_stream = (cudaStream_t)s;
}

/* Host bytes to device memory, ordered on the stream (the stand-in: host-addressable). */
static void to_dev(void *dev, const void *host, size_t bytes) {
  if (g_standin) {
    /* after the work queued on the stream; stand-in device memory is host memory */
    EXPECT(ferrocclStreamSynchronize(g_stream) == 0, "stream sync: %s", ncclGetLastError(NULL));
    memcpy(dev, host, bytes);
    return;
  }
  EXPECT(cu_htod_async((unsigned long long)(uintptr_t)dev, host, bytes, g_stream) == 0,
         "cuMemcpyHtoDAsync");
}

/* Device memory to host bytes, after the work queued on the stream (on a GPU the legacy
 * stream's copy waits for the blocking stream g_stream). */
static void from_dev(void *host, const void *dev, size_t bytes) {
  if (g_standin) {
    EXPECT(ferrocclStreamSynchronize(g_stream) == 0, "stream sync: %s", ncclGetLastError(NULL));
    memcpy(host, dev, bytes); /* stand-in device memory is host memory */
    return;
  }
  if (cu_sync && getenv("FERROCCL_TEST_SYNC_FIRST"))
    EXPECT(cu_sync(g_stream) == 0, "cuStreamSynchronize");
  EXPECT(cu_dtoh(host, (unsigned long long)(uintptr_t)dev, bytes) == 0, "cuMemcpyDtoH");
}

static void *dev_alloc(size_t bytes) {
  void *p = NULL;
  CHECK(ncclMemAlloc(&p, bytes));
  EXPECT(p != NULL, "ncclMemAlloc gave NULL");
  return p;
}

enum { C = 1000 };

static void collectives(ncclComm_t comm) {
  int n, rank;
  CHECK(ncclCommCount(comm, &n));
  CHECK(ncclCommUserRank(comm, &rank));
  g_rank = rank;
  size_t big = sizeof(int64_t) * C * n;
  void *d_send = dev_alloc(big), *d_recv = dev_alloc(big);
  open_driver();
  float *fs = malloc(big), *fr = malloc(big);

  /* all-reduce, sum of float: element i of rank r is r * C + i */
  for (int i = 0; i < C; i++) fs[i] = (float)(rank * C + i);
  to_dev(d_send, fs, sizeof(float) * C);
  CHECK(ncclAllReduce(d_send, d_recv, C, ncclFloat, ncclSum, comm, g_stream));
  from_dev(fr, d_recv, sizeof(float) * C);
  for (int i = 0; i < C; i++) {
    float want = (float)(C * n * (n - 1) / 2 + n * i);
    EXPECT(fr[i] == want, "allreduce sum [%d] = %f, want %f", i, fr[i], want);
  }

  /* in place, max of int32: element i is largest on rank i % n */
  int32_t *is = (int32_t *)fs, *ir = (int32_t *)fr;
  for (int i = 0; i < C; i++) is[i] = (i % n == rank) ? 1000000 + i : -i;
  to_dev(d_recv, is, sizeof(int32_t) * C);
  CHECK(ncclAllReduce(d_recv, d_recv, C, ncclInt32, ncclMax, comm, g_stream));
  from_dev(ir, d_recv, sizeof(int32_t) * C);
  for (int i = 0; i < C; i++) EXPECT(ir[i] == 1000000 + i, "allreduce max [%d] = %d", i, ir[i]);

  /* broadcast of int32 from the last rank, out of place */
  int root = n - 1;
  for (int i = 0; i < C; i++) is[i] = rank == root ? 3 * i + 7 : -1;
  to_dev(d_send, is, sizeof(int32_t) * C);
  CHECK(ncclBroadcast(d_send, d_recv, C, ncclInt32, root, comm, g_stream));
  from_dev(ir, d_recv, sizeof(int32_t) * C);
  for (int i = 0; i < C; i++) EXPECT(ir[i] == 3 * i + 7, "broadcast [%d] = %d", i, ir[i]);

  /* all-gather of int64: element i of rank r is r * 100000 + i */
  int64_t *ls = (int64_t *)fs, *lr = (int64_t *)fr;
  for (int i = 0; i < C; i++) ls[i] = (int64_t)rank * 100000 + i;
  to_dev(d_send, ls, sizeof(int64_t) * C);
  CHECK(ncclAllGather(d_send, d_recv, C, ncclInt64, comm, g_stream));
  from_dev(lr, d_recv, sizeof(int64_t) * C * n);
  for (int r = 0; r < n; r++)
    for (int i = 0; i < C; i++)
      EXPECT(lr[r * C + i] == (int64_t)r * 100000 + i, "allgather [%d][%d] = %lld", r, i,
             (long long)lr[r * C + i]);

  /* all-gather in place: the input is block `rank` of the output */
  for (int i = 0; i < C; i++) ls[i] = (int64_t)rank * 7000 + 3 * i;
  to_dev((int64_t *)d_recv + (size_t)rank * C, ls, sizeof(int64_t) * C);
  CHECK(ncclAllGather((int64_t *)d_recv + (size_t)rank * C, d_recv, C, ncclInt64, comm,
                      g_stream));
  from_dev(lr, d_recv, sizeof(int64_t) * C * n);
  for (int r = 0; r < n; r++)
    for (int i = 0; i < C; i++)
      EXPECT(lr[r * C + i] == (int64_t)r * 7000 + 3 * i, "allgather in place [%d][%d] = %lld",
             r, i, (long long)lr[r * C + i]);

  /* reduce-scatter, sum of double: block b element i of rank r is r + b * 10000 + i */
  double *ds = (double *)fs, *dr = (double *)fr;
  for (int b = 0; b < n; b++)
    for (int i = 0; i < C; i++) ds[b * C + i] = (double)(rank + b * 10000 + i);
  to_dev(d_send, ds, sizeof(double) * C * n);
  CHECK(ncclReduceScatter(d_send, d_recv, C, ncclDouble, ncclSum, comm, g_stream));
  from_dev(dr, d_recv, sizeof(double) * C);
  for (int i = 0; i < C; i++) {
    double want = (double)(n * (n - 1) / 2) + (double)n * (rank * 10000 + i);
    EXPECT(dr[i] == want, "reducescatter [%d] = %f, want %f", i, dr[i], want);
  }

  /* reduce-scatter in place: the result lands in block `rank` of the input */
  to_dev(d_send, ds, sizeof(double) * C * n);
  CHECK(ncclReduceScatter(d_send, (double *)d_send + (size_t)rank * C, C, ncclDouble, ncclSum,
                          comm, g_stream));
  from_dev(dr, (double *)d_send + (size_t)rank * C, sizeof(double) * C);
  for (int i = 0; i < C; i++) {
    double want = (double)(n * (n - 1) / 2) + (double)n * (rank * 10000 + i);
    EXPECT(dr[i] == want, "reducescatter in place [%d] = %f, want %f", i, dr[i], want);
  }

  /* reduce, sum of int64 to rank n / 2: element i of rank r is r * 100000 + i */
  for (int i = 0; i < C; i++) ls[i] = (int64_t)rank * 100000 + i;
  to_dev(d_send, ls, sizeof(int64_t) * C);
  root = n / 2;
  CHECK(ncclReduce(d_send, d_recv, C, ncclInt64, ncclSum, root, comm, g_stream));
  if (rank == root) {
    from_dev(lr, d_recv, sizeof(int64_t) * C);
    for (int i = 0; i < C; i++) {
      int64_t want = (int64_t)100000 * n * (n - 1) / 2 + (int64_t)n * i;
      EXPECT(lr[i] == want, "reduce [%d] = %lld", i, (long long)lr[i]);
    }
  }

  /* all-to-all: block p of rank r holds r * 1000000 + p * 1000 + i */
  for (int p = 0; p < n; p++)
    for (int i = 0; i < C; i++) is[p * C + i] = rank * 1000000 + p * 1000 + i;
  to_dev(d_send, is, sizeof(int32_t) * C * n);
  CHECK(ncclAlltoAll(d_send, d_recv, C, ncclInt32, comm, g_stream));
  from_dev(ir, d_recv, sizeof(int32_t) * C * n);
  for (int p = 0; p < n; p++)
    for (int i = 0; i < C; i++)
      EXPECT(ir[p * C + i] == p * 1000000 + rank * 1000 + i, "alltoall [%d][%d] = %d", p, i,
             ir[p * C + i]);

  /* a pre-multiplied sum whose scalar (2) lives in device memory (ncclScalarDevice) */
  float two = 2.0f;
  void *d_scalar = dev_alloc(sizeof two);
  to_dev(d_scalar, &two, sizeof two);
  ncclRedOp_t premul;
  CHECK(ncclRedOpCreatePreMulSum(&premul, d_scalar, ncclFloat, ncclScalarDevice, comm));
  for (int i = 0; i < C; i++) fs[i] = (float)(rank + i);
  to_dev(d_send, fs, sizeof(float) * C);
  CHECK(ncclAllReduce(d_send, d_recv, C, ncclFloat, premul, comm, g_stream));
  from_dev(fr, d_recv, sizeof(float) * C);
  for (int i = 0; i < C; i++) {
    float want = 2.0f * (float)(n * (n - 1) / 2 + n * i);
    EXPECT(fr[i] == want, "premulsum [%d] = %f, want %f", i, fr[i], want);
  }
  /* page-locked host buffers (cudaMallocHost) with the stream: the call runs on them as host
   * buffers once the stream's earlier work is done, and is done when it returns; the device
   * scalar of the pre-multiplied sum is read from the device */
  float *h_send = NULL, *h_recv = NULL;
  CHECK(ferrocclMemAllocHost((void **)&h_send, sizeof(float) * C));
  CHECK(ferrocclMemAllocHost((void **)&h_recv, sizeof(float) * C));
  for (int i = 0; i < C; i++) h_send[i] = (float)(rank * 7 + i);
  CHECK(ncclAllReduce(h_send, h_recv, C, ncclFloat, premul, comm, g_stream));
  for (int i = 0; i < C; i++) {
    float want = 2.0f * (float)(7 * n * (n - 1) / 2 + n * i);
    EXPECT(h_recv[i] == want, "page-locked premulsum [%d] = %f, want %f", i, h_recv[i], want);
  }
  CHECK(ncclAllReduce(h_recv, h_recv, C, ncclFloat, ncclMax, comm, g_stream));
  for (int i = 0; i < C; i++) {
    float want = 2.0f * (float)(7 * n * (n - 1) / 2 + n * i);
    EXPECT(h_recv[i] == want, "page-locked in-place max [%d] = %f, want %f", i, h_recv[i], want);
  }
  /* beside device memory in one call: refused, saying so */
  EXPECT_ERR(ncclAllReduce(h_send, d_recv, C, ncclFloat, ncclSum, comm, g_stream),
             ncclInvalidArgument, "page-locked host memory beside device memory");
  CHECK(ferrocclMemFreeHost(h_send));
  CHECK(ferrocclMemFreeHost(h_recv));
  CHECK(ncclRedOpDestroy(premul, comm));
  CHECK(ncclMemFree(d_scalar));

  /* a group of two calls on the stream: an in-place sum and a broadcast from rank 0 */
  int32_t *gs = malloc(sizeof(int32_t) * C);
  for (int i = 0; i < C; i++) { is[i] = rank * C + i; gs[i] = rank == 0 ? -i : 5; }
  to_dev(d_recv, is, sizeof(int32_t) * C);
  to_dev(d_send, gs, sizeof(int32_t) * C);
  CHECK(ncclGroupStart());
  CHECK(ncclAllReduce(d_recv, d_recv, C, ncclInt32, ncclSum, comm, g_stream));
  CHECK(ncclBcast(d_send, C, ncclInt32, 0, comm, g_stream));
  CHECK(ncclGroupEnd());
  from_dev(ir, d_recv, sizeof(int32_t) * C);
  from_dev(gs, d_send, sizeof(int32_t) * C);
  for (int i = 0; i < C; i++) {
    EXPECT(ir[i] == C * n * (n - 1) / 2 + n * i, "group allreduce [%d] = %d", i, ir[i]);
    EXPECT(gs[i] == -i, "group bcast [%d] = %d", i, gs[i]);
  }

  /* send/recv around the ring both ways, in one group */
  int right = (rank + 1) % n, left = (rank + n - 1) % n;
  for (int i = 0; i < C; i++) { is[i] = rank * C + i; is[C + i] = -(rank * C + i); }
  to_dev(d_send, is, sizeof(int32_t) * 2 * C);
  CHECK(ncclGroupStart());
  CHECK(ncclSend(d_send, C, ncclInt32, right, comm, g_stream));
  CHECK(ncclSend((int32_t *)d_send + C, C, ncclInt32, left, comm, g_stream));
  CHECK(ncclRecv(d_recv, C, ncclInt32, left, comm, g_stream));
  CHECK(ncclRecv((int32_t *)d_recv + C, C, ncclInt32, right, comm, g_stream));
  CHECK(ncclGroupEnd());
  from_dev(ir, d_recv, sizeof(int32_t) * 2 * C);
  for (int i = 0; i < C; i++) {
    EXPECT(ir[i] == left * C + i, "recv from left [%d] = %d", i, ir[i]);
    EXPECT(ir[C + i] == -(right * C + i), "recv from right [%d] = %d", i, ir[C + i]);
  }

  /* gather to rank 0: block r holds r * C + i */
  for (int i = 0; i < C; i++) is[i] = rank * C + i;
  to_dev(d_send, is, sizeof(int32_t) * C);
  CHECK(ncclGather(d_send, d_recv, C, ncclInt32, 0, comm, g_stream));
  if (rank == 0) {
    from_dev(ir, d_recv, sizeof(int32_t) * C * n);
    for (int r = 0; r < n; r++)
      for (int i = 0; i < C; i++)
        EXPECT(ir[r * C + i] == r * C + i, "gather [%d][%d] = %d", r, i, ir[r * C + i]);
  }
  /* scatter from the last rank: block p holds p * 100000 + i */
  for (int p = 0; p < n; p++)
    for (int i = 0; i < C; i++) is[p * C + i] = rank == n - 1 ? p * 100000 + i : -1;
  to_dev(d_send, is, sizeof(int32_t) * C * n);
  CHECK(ncclScatter(d_send, d_recv, C, ncclInt32, n - 1, comm, g_stream));
  from_dev(ir, d_recv, sizeof(int32_t) * C);
  for (int i = 0; i < C; i++)
    EXPECT(ir[i] == rank * 100000 + i, "scatter [%d] = %d", i, ir[i]);

  /* a host pointer with a non-NULL stream: refused, naming the call, argument and space */
  EXPECT_ERR(ncclAllReduce(fs, d_recv, C, ncclFloat, ncclSum, comm, g_stream),
             ncclInvalidArgument, "ncclAllReduce on rank");
  EXPECT(strstr(ncclGetLastError(NULL), "sendbuff") != NULL &&
             strstr(ncclGetLastError(NULL), "host memory") != NULL,
         "argument and space in \"%s\"", ncclGetLastError(NULL));
  EXPECT_ERR(ncclAllGather(d_send, fr, C, ncclInt64, comm, g_stream), ncclInvalidArgument,
             "recvbuff");
  /* a buffer running past its allocation is refused, saying so */
  EXPECT_ERR(ncclAllReduce(d_send, d_recv, C * n * 2 + 1, ncclFloat, ncclSum, comm, g_stream),
             ncclInvalidArgument, "runs past the allocation");
  /* the refused calls ran nothing: the communicator still works, host buffers too */
  for (int i = 0; i < C; i++) fs[i] = 1.0f;
  CHECK(ncclAllReduce(fs, fr, C, ncclFloat, ncclSum, comm, NULL));
  for (int i = 0; i < C; i++) EXPECT(fr[i] == (float)n, "host allreduce [%d] = %f", i, fr[i]);
  EXPECT_ERR(ncclSend(fs, 4, ncclInt32, 0, comm, g_stream), ncclInvalidArgument,
             "ncclSend on rank");
  /* device buffers with a NULL stream: NCCL's legacy default stream. The call waits for work
   * queued before it (the stand-in: a copy queued on stream 0 and not synchronized, which a
   * host-buffer call would not wait for) and is done when it returns. */
  for (int i = 0; i < C; i++) fs[i] = (float)((rank + 1) * i);
  if (g_standin)
    CHECK(ferrocclMemcpyAsync(d_send, fs, sizeof(float) * C, NULL));
  else
    to_dev(d_send, fs, sizeof(float) * C);
  CHECK(ncclAllReduce(d_send, d_recv, C, ncclFloat, ncclSum, comm, NULL));
  from_dev(fr, d_recv, sizeof(float) * C);
  for (int i = 0; i < C; i++) {
    float want = (float)(n * (n + 1) / 2 * i);
    EXPECT(fr[i] == want, "NULL-stream device allreduce [%d] = %f, want %f", i, fr[i], want);
  }

  CHECK(ncclMemFree(d_send));
  CHECK(ncclMemFree(d_recv));
  EXPECT_ERR(ncclMemFree(d_send), ncclInvalidArgument, "not allocated by ncclMemAlloc");
  free(fs);
  free(fr);
  free(gs);
}

enum { L = 40013 }; /* int32: 160,052 bytes, 3 pieces of 64 KiB */

/* One group on the stream: a long message to the right and to itself, a short one to the left,
 * an empty one (NULL) to the right, and the matching receives, every element distinct. */
static void long_sendrecv(ncclComm_t comm) {
  int n, rank;
  CHECK(ncclCommCount(comm, &n));
  CHECK(ncclCommUserRank(comm, &rank));
  int right = (rank + 1) % n, left = (rank + n - 1) % n;
  size_t lb = sizeof(int32_t) * L, sb = sizeof(int32_t) * 7;
  int32_t *a = dev_alloc(lb), *b = dev_alloc(sb), *x = dev_alloc(lb), *y = dev_alloc(sb),
          *z = dev_alloc(lb);
  int32_t *h = malloc(lb);
  for (int i = 0; i < L; i++) h[i] = rank * 10000000 + i;
  to_dev(a, h, lb);
  for (int i = 0; i < 7; i++) h[i] = -(rank * 100 + i) - 1;
  to_dev(b, h, sb);
  CHECK(ncclGroupStart());
  CHECK(ncclSend(a, L, ncclInt32, right, comm, g_stream));
  CHECK(ncclSend(b, 7, ncclInt32, left, comm, g_stream));
  CHECK(ncclSend(a, L, ncclInt32, rank, comm, g_stream));
  CHECK(ncclSend(NULL, 0, ncclInt32, right, comm, g_stream)); /* empty, NULL */
  CHECK(ncclRecv(x, L, ncclInt32, left, comm, g_stream));
  CHECK(ncclRecv(y, 7, ncclInt32, right, comm, g_stream));
  CHECK(ncclRecv(z, L, ncclInt32, rank, comm, g_stream));
  CHECK(ncclRecv(NULL, 0, ncclInt32, left, comm, g_stream));
  CHECK(ncclGroupEnd());
  from_dev(h, x, lb);
  for (int i = 0; i < L; i++)
    EXPECT(h[i] == left * 10000000 + i, "long recv from left [%d] = %d", i, h[i]);
  from_dev(h, y, sb);
  for (int i = 0; i < 7; i++)
    EXPECT(h[i] == -(right * 100 + i) - 1, "short recv from right [%d] = %d", i, h[i]);
  from_dev(h, z, lb);
  for (int i = 0; i < L; i++)
    EXPECT(h[i] == rank * 10000000 + i, "long recv from self [%d] = %d", i, h[i]);
  /* A long allreduce and long messages in one group: on a stream, the allreduce is queued
   * slice by slice, then the messages round by round, the order in which a blocking rank runs
   * such a group (its collectives, then its sends and receives). */
  for (int i = 0; i < L; i++) h[i] = rank * 100000 + i;
  to_dev(z, h, lb);
  for (int i = 0; i < L; i++) h[i] = rank * 10000000 + 2 * i;
  to_dev(a, h, lb);
  CHECK(ncclGroupStart());
  CHECK(ncclSend(a, L, ncclInt32, right, comm, g_stream));
  CHECK(ncclAllReduce(z, z, L, ncclInt32, ncclSum, comm, g_stream));
  CHECK(ncclRecv(x, L, ncclInt32, left, comm, g_stream));
  CHECK(ncclGroupEnd());
  from_dev(h, z, lb);
  for (int i = 0; i < L; i++)
    EXPECT(h[i] == 100000 * n * (n - 1) / 2 + n * i, "allreduce beside messages [%d] = %d", i,
           h[i]);
  from_dev(h, x, lb);
  for (int i = 0; i < L; i++)
    EXPECT(h[i] == left * 10000000 + 2 * i, "recv beside an allreduce [%d] = %d", i, h[i]);
  /* Host and device buffers in one group: a long host send (NULL stream) to the right, a long
   * device receive from the left. */
  for (int i = 0; i < L; i++) h[i] = -(rank * 10000000 + i);
  CHECK(ncclGroupStart());
  CHECK(ncclSend(h, L, ncclInt32, right, comm, NULL));
  CHECK(ncclRecv(z, L, ncclInt32, left, comm, g_stream));
  CHECK(ncclGroupEnd());
  from_dev(h, z, lb);
  for (int i = 0; i < L; i++)
    EXPECT(h[i] == -(left * 10000000 + i), "host to device recv from left [%d] = %d", i, h[i]);
  /* A long gather to the last rank (out of place) and a long scatter from rank 0 (in place at
   * the root). */
  int32_t *all = dev_alloc(lb * n), *ha = malloc(lb * n);
  for (int i = 0; i < L; i++) h[i] = rank * 10000000 + i;
  to_dev(a, h, lb);
  CHECK(ncclGather(a, all, L, ncclInt32, n - 1, comm, g_stream));
  if (rank == n - 1) {
    from_dev(ha, all, lb * n);
    for (int r = 0; r < n; r++)
      for (int i = 0; i < L; i++)
        EXPECT(ha[(size_t)r * L + i] == r * 10000000 + i, "long gather [%d][%d] = %d", r, i,
               ha[(size_t)r * L + i]);
  }
  if (rank == 0) {
    for (int r = 0; r < n; r++)
      for (int i = 0; i < L; i++) ha[(size_t)r * L + i] = -(r * 1000000 + i) - 7;
    to_dev(all, ha, lb * n);
  }
  CHECK(ncclScatter(all, rank == 0 ? all : x, L, ncclInt32, 0, comm, g_stream));
  from_dev(h, rank == 0 ? all : x, lb);
  for (int i = 0; i < L; i++)
    EXPECT(h[i] == -(rank * 1000000 + i) - 7, "long scatter [%d] = %d", i, h[i]);
  CHECK(ncclMemFree(all));
  free(ha);
  /* A receive overlapping another buffer of the group is refused before anything moves (sends
   * to itself only, so no peer waits for this group). */
  for (int i = 0; i < L; i++) h[i] = 3 * i + 1;
  to_dev(x, h, lb);
  CHECK(ncclGroupStart());
  CHECK(ncclSend(a, L, ncclInt32, rank, comm, g_stream));
  CHECK(ncclSend(b, 7, ncclInt32, rank, comm, g_stream));
  CHECK(ncclRecv(x, L, ncclInt32, rank, comm, g_stream));
  CHECK(ncclRecv(x + 1, 7, ncclInt32, rank, comm, g_stream));
  EXPECT_ERR(ncclGroupEnd(), ncclInvalidArgument, "overlap");
  from_dev(h, x, lb);
  for (int i = 0; i < L; i++)
    EXPECT(h[i] == 3 * i + 1, "after the refused group [%d] = %d", i, h[i]);
  int32_t *bufs[] = {a, b, x, y, z};
  for (int i = 0; i < 5; i++) CHECK(ncclMemFree(bufs[i]));
  free(h);
}

/* Collectives on buffers in windows: with ranks that are processes of one host over the p2p
 * transport they go straight between the ranks' buffers (the test counts them in the traces). */
static void windows(ncclComm_t comm, int rank, int n) {
  enum { W = 100003 };
  const size_t bytes = sizeof(float) * W;
  float *h = malloc(bytes);
  void *send = dev_alloc(bytes), *recv = dev_alloc(bytes);
  open_driver();
  ncclWindow_t ws = NULL, wr = NULL;
  /* Inside a group the exchange would wait for ranks the thread has yet to reach: refused. */
  CHECK(ncclGroupStart());
  EXPECT_ERR(ncclCommWindowRegister(comm, send, bytes, &ws, 0), ncclInvalidUsage,
             "outside the group");
  CHECK(ncclGroupEnd());
  CHECK(ncclCommWindowRegister(comm, send, bytes, &ws, NCCL_WIN_COLL_SYMMETRIC));
  CHECK(ncclCommWindowRegister(comm, recv, bytes, &wr, NCCL_WIN_COLL_SYMMETRIC));
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < W; i++) h[i] = (float)(rank * W + i + round);
    to_dev(send, h, bytes);
    CHECK(ncclAllReduce(send, recv, W, ncclFloat, ncclSum, comm, g_stream));
    from_dev(h, recv, bytes);
    for (int i = 0; i < W; i++) {
      float want = (float)(W * n * (n - 1) / 2 + n * (i + round));
      EXPECT(h[i] == want, "round %d: allreduce [%d] = %g, want %g", round, i, h[i], want);
    }
    /* A range inside each window, at different offsets. */
    CHECK(ncclAllReduce((float *)send + 7, (float *)recv + 11, W - 20, ncclFloat, ncclSum, comm,
                        g_stream));
    from_dev(h, recv, bytes);
    for (int i = 0; i < W - 20; i++) {
      float want = (float)(W * n * (n - 1) / 2 + n * (i + 7 + round));
      EXPECT(h[11 + i] == want, "round %d: allreduce of a range [%d] = %g", round, i, h[11 + i]);
    }
  }
  CHECK(ncclBroadcast(recv, recv, W, ncclFloat, n - 1, comm, g_stream));
  from_dev(h, recv, bytes);
  /* Element 5 of the last round's whole allreduce (the ranges start at 11). */
  EXPECT(h[5] == (float)(W * n * (n - 1) / 2 + n * (5 + 2)), "broadcast [5] = %g", h[5]);
  CHECK(ncclCommWindowDeregister(comm, ws));
  CHECK(ncclCommWindowDeregister(comm, wr));
  CHECK(ncclMemFree(send));
  CHECK(ncclMemFree(recv));
  free(h);
}

/* Mode repeat: the number of allreduces. */
static int g_repeat = 100;

static void repeat(ncclComm_t comm, int rank, int n) {
  enum { E = 2 };
  float h[E];
  void *send = dev_alloc(sizeof h), *recv = dev_alloc(sizeof h);
  open_driver();
  ncclWindow_t ws = NULL, wr = NULL;
  CHECK(ncclCommWindowRegister(comm, send, sizeof h, &ws, NCCL_WIN_COLL_SYMMETRIC));
  CHECK(ncclCommWindowRegister(comm, recv, sizeof h, &wr, NCCL_WIN_COLL_SYMMETRIC));
  for (int i = 0; i < E; i++) h[i] = (float)(rank + 1 + i);
  to_dev(send, h, sizeof h);
  for (int k = 0; k < g_repeat; k++)
    CHECK(ncclAllReduce(send, recv, E, ncclFloat, ncclSum, comm, g_stream));
  from_dev(h, recv, sizeof h);
  for (int i = 0; i < E; i++)
    EXPECT(h[i] == (float)(n * (n + 1) / 2 + n * i), "allreduce [%d] = %g", i, h[i]);
  CHECK(ncclCommWindowDeregister(comm, ws));
  CHECK(ncclCommWindowDeregister(comm, wr));
  CHECK(ncclMemFree(send));
  CHECK(ncclMemFree(recv));
}

/* Mode comms: g_repeat communicators split from `comm`, one after another. */
static void comms(ncclComm_t comm, int rank, int n) {
  enum { E = 2 };
  float h[E];
  void *send = dev_alloc(sizeof h), *recv = dev_alloc(sizeof h);
  open_driver();
  for (int k = 0; k < g_repeat; k++) {
    ncclComm_t c = NULL;
    CHECK(ncclCommSplit(comm, 0, rank, &c, NULL));
    /* Twice on each: registering again after the last window went exchanges new marks. */
    for (int round = 0; round < 2; round++) {
      ncclWindow_t ws = NULL, wr = NULL;
      CHECK(ncclCommWindowRegister(c, send, sizeof h, &ws, NCCL_WIN_COLL_SYMMETRIC));
      CHECK(ncclCommWindowRegister(c, recv, sizeof h, &wr, NCCL_WIN_COLL_SYMMETRIC));
      for (int i = 0; i < E; i++) h[i] = (float)(rank + 1 + i + k + round);
      to_dev(send, h, sizeof h);
      CHECK(ncclAllReduce(send, recv, E, ncclFloat, ncclSum, c, g_stream));
      /* Deregistered while the call may still be queued on the stream (the last one lets go
       * of the shared marks: no stream may be left waiting for another process's), read
       * after. */
      CHECK(ncclCommWindowDeregister(c, ws));
      CHECK(ncclCommWindowDeregister(c, wr));
      from_dev(h, recv, sizeof h);
      for (int i = 0; i < E; i++)
        EXPECT(h[i] == (float)(n * (n + 1) / 2 + n * (i + k + round)),
               "communicator %d, round %d: [%d] = %g", k, round, i, h[i]);
    }
    CHECK(ncclCommDestroy(c));
  }
  CHECK(ncclMemFree(send));
  CHECK(ncclMemFree(recv));
}

static int run_rank(int rank, int n, ncclUniqueId id, const char *mode) {
  g_rank = rank;
  if (g_standin) {
    /* Each rank's current device: the communicator binds to it at init. */
    char dev[8];
    snprintf(dev, sizeof dev, "%d", rank % 4);
    setenv("FERRO_DEVICE", dev, 1);
  }
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, n, id, rank));
  int dev = -1;
  CHECK(ncclCommCuDevice(comm, &dev));
  if (g_standin) EXPECT(dev == rank % 4, "bound to device %d, want %d", dev, rank % 4);
  if (strcmp(mode, "windows") == 0) {
    windows(comm, rank, n);
    CHECK(ncclCommDestroy(comm));
    return 0;
  }
  if (strcmp(mode, "repeat") == 0) {
    repeat(comm, rank, n);
    CHECK(ncclCommDestroy(comm));
    return 0;
  }
  if (strcmp(mode, "comms") == 0) {
    comms(comm, rank, n);
    CHECK(ncclCommDestroy(comm));
    return 0;
  }
  collectives(comm);
  long_sendrecv(comm);
  CHECK(ncclCommDestroy(comm));
  return 0;
}

/* One thread, n communicators on stand-in devices 0..n-1: calls on several communicators from
 * one thread go in a group, which runs them together at ncclGroupEnd (no deadlock). */
static int run_all(int n) {
  ncclComm_t *comms = calloc(n, sizeof(ncclComm_t));
  void **bufs = calloc(n, sizeof(void *));
  CHECK(ncclCommInitAll(comms, n, NULL));
  enum { A = 257 };
  int32_t *h = malloc(sizeof(int32_t) * A);
  for (int r = 0; r < n; r++) {
    char dev[8];
    snprintf(dev, sizeof dev, "%d", r);
    setenv("FERRO_DEVICE", dev, 1); /* the stand-in's cudaSetDevice(r) */
    bufs[r] = dev_alloc(sizeof(int32_t) * A);
    for (int i = 0; i < A; i++) h[i] = r * A + i;
    to_dev(bufs[r], h, sizeof(int32_t) * A);
  }
  CHECK(ncclGroupStart());
  for (int r = 0; r < n; r++)
    CHECK(ncclAllReduce(bufs[r], bufs[r], A, ncclInt32, ncclSum, comms[r], g_stream));
  for (int r = 0; r < n; r++) CHECK(ncclBcast(bufs[r], 3, ncclInt32, n - 1, comms[r], g_stream));
  CHECK(ncclGroupEnd());
  for (int r = 0; r < n; r++) {
    from_dev(h, bufs[r], sizeof(int32_t) * A);
    for (int i = 0; i < A; i++)
      EXPECT(h[i] == A * n * (n - 1) / 2 + n * i, "comm %d allreduce [%d] = %d", r, i, h[i]);
  }
  if (n > 1) /* device 0's memory on the communicator of device 1 */
    EXPECT_ERR(ncclAllReduce(bufs[0], bufs[1], A, ncclInt32, ncclSum, comms[1], g_stream),
               ncclInvalidArgument, "memory of host device 0");
  for (int r = 0; r < n; r++) {
    CHECK(ncclMemFree(bufs[r]));
    CHECK(ncclCommDestroy(comms[r]));
  }
  printf("OK %d communicators in one thread\n", n);
  return 0;
}

/* No stand-in and no driver (FERROCCL_CUDA_DRIVER names a missing library). */
static int run_nodriver(void) {
  g_rank = 0;
  ncclUniqueId id;
  ncclComm_t comm;
  CHECK(ncclGetUniqueId(&id));
  CHECK(ncclCommInitRank(&comm, 1, id, 0));
  void *p = (void *)0x1234;
  EXPECT_ERR(ncclMemAlloc(&p, 4096), ncclSystemError, "ncclMemAlloc: device buffers need an NVIDIA driver (libcuda.so.1 not found)");
  float buf[4] = {1, 2, 3, 4};
  EXPECT_ERR(ncclAllReduce(buf, buf, 4, ncclFloat, ncclSum, comm, (cudaStream_t)0x1),
             ncclSystemError, "ncclAllReduce: device buffers need an NVIDIA driver");
  EXPECT(strstr(ncclGetLastError(NULL), "libcuda") != NULL, "libcuda in \"%s\"",
         ncclGetLastError(NULL));
  /* host buffers with a NULL stream still work */
  CHECK(ncclAllReduce(buf, buf, 4, ncclFloat, ncclSum, comm, NULL));
  EXPECT(buf[3] == 4.0f, "host allreduce %f", buf[3]);
  CHECK(ncclCommDestroy(comm));
  printf("OK no driver: clear errors\n");
  return 0;
}

/* One rank of the mode `arg` names. */
static int rank_main(int r, int n, ncclUniqueId id, void *arg) {
  const char *mode = arg;
  /* Mode mixed: even ranks complete in stream order, odd ones block; they must exchange the
   * same messages (read once per process, before the first call). */
  if (strcmp(mode, "mixed") == 0) setenv("FERRO_STREAM_WAITS", r % 2 ? "0" : "1", 1);
  int rc = run_rank(r, n, id, mode);
  /* Modes repeat and comms end through exit, whose handlers write softcuda's counts. */
  if (strcmp(mode, "repeat") == 0 || strcmp(mode, "comms") == 0) {
    fflush(stdout);
    exit(rc);
  }
  return rc;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2;
  const char *mode = argc > 2 ? argv[2] : "pipe";
  const char *prov = getenv("FERRO_DEVICE_PROVIDER");
  g_standin = prov != NULL && strcmp(prov, "host") == 0;
  if (n < 1) return 1;
  if (argc > 3) g_repeat = atoi(argv[3]);
  if (strcmp(mode, "nodriver") == 0) return run_nodriver();
  if (strcmp(mode, "all") == 0) {
    EXPECT(g_standin, "mode all needs FERRO_DEVICE_PROVIDER=host");
    return run_all(n);
  }
  int failed = fork_ranks(n, 0, rank_main, (void *)mode);
  printf(failed ? "FAILED\n" : "OK %d ranks\n", n);
  return failed;
}
