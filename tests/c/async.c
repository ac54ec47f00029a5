/* Calls with a stream complete in stream order: they return at once, the collective starts
 * after the work queued on the stream before the call, and work queued on the stream after
 * the call waits for it. One process, ncclCommInitAll, one thread, the host stand-in
 * (FERRO_DEVICE_PROVIDER=host): device memory is host memory and cudaStreamSynchronize /
 * cudaMemcpyAsync come from tests/c/cuda_stub/cuda_runtime.h (the stand-in's stream model).
 *
 *   async N nogroup    N communicators driven from one thread WITHOUT a group: upload on each
 *                      stream, ncclAllReduce, download on the same stream, then synchronize.
 *                      A call that blocked would wait for the other communicators' calls,
 *                      which never come: FERRO_TIMEOUT, an error, exit status 2.
 *   async 2 mismatch   the communicators disagree on a count: both calls return ncclSuccess,
 *                      the streams are released, ncclCommGetAsyncError reports the error
 *                      naming the operation and the rank, and later calls fail with it.
 *   async 2 abort      a call whose peer never comes, then ncclCommAbort: the running job and
 *                      the one queued behind it fail, and the stream is released long before
 *                      FERRO_TIMEOUT.
 *   async 2 destroy    ncclCommDestroy right after the calls (no synchronize): destroy waits
 *                      for the queued collectives, whose results are then in place.
 *   async N pieces     N communicators, a stream each, one thread, groups of long calls (run
 *                      with small FERRO_DEVICE_SLICE_BYTES): an allreduce on every
 *                      communicator, then an allreduce beside sends and receives around the
 *                      ring, then sends and receives alone; each communicator's part of a
 *                      group is queued slice by slice and round by round on its own stream.
 *   async N joined     N communicators, each with a group over TWO streams: a send on one
 *                      stream of a buffer uploaded on the other, the receive and an allreduce
 *                      on the other; the results are read back on both streams. NCCL orders a
 *                      group after the earlier work of all its streams and the later work of
 *                      all of them after the group. Long messages (in pieces) and short ones
 *                      (one job).
 *
 * Exit status 0 when every check passed. */
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"

enum { MAXC = 8, A = 4099 };

static ncclComm_t g_comms[MAXC];
static int32_t *g_dev[MAXC];
static cudaStream_t g_streams[MAXC];

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* n communicators on stand-in devices 0..n-1, a device buffer of A int32 and a stream each. */
static void setup(int n) {
  CHECK(ncclCommInitAll(g_comms, n, NULL));
  for (int r = 0; r < n; r++) {
    char dev[8];
    snprintf(dev, sizeof dev, "%d", r % 4);
    setenv("FERRO_DEVICE", dev, 1); /* the stand-in's cudaSetDevice(r) */
    void *p = NULL;
    CHECK(ncclMemAlloc(&p, sizeof(int32_t) * A));
    g_dev[r] = p;
    g_streams[r] = (cudaStream_t)(uintptr_t)(0x100 + r);
  }
}

static void sync_stream(int r) {
  EXPECT(cudaStreamSynchronize(g_streams[r]) == cudaSuccess, "cudaStreamSynchronize(%d): %s", r,
         ncclGetLastError(NULL));
}

static void teardown(int n) {
  for (int r = 0; r < n; r++) CHECK(ncclMemFree(g_dev[r]));
}

static int run_nogroup(int n) {
  setup(n);
  int32_t *in = malloc(sizeof(int32_t) * A * n), *out = malloc(sizeof(int32_t) * A * n);
  for (int r = 0; r < n; r++)
    for (int i = 0; i < A; i++) {
      in[r * A + i] = r * 100000 + i;
      out[r * A + i] = -1;
    }
  /* The upload is queued on the stream, so the collective must wait for it; the download is
   * queued after the call, so it must wait for the collective. */
  for (int r = 0; r < n; r++)
    EXPECT(cudaMemcpyAsync(g_dev[r], in + r * A, sizeof(int32_t) * A, cudaMemcpyHostToDevice,
                           g_streams[r]) == cudaSuccess,
           "upload %d", r);
  double t0 = now();
  for (int r = 0; r < n; r++)
    CHECK(ncclAllReduce(g_dev[r], g_dev[r], A, ncclInt32, ncclSum, g_comms[r], g_streams[r]));
  double issued = now() - t0;
  for (int r = 0; r < n; r++)
    EXPECT(cudaMemcpyAsync(out + r * A, g_dev[r], sizeof(int32_t) * A, cudaMemcpyDeviceToHost,
                           g_streams[r]) == cudaSuccess,
           "download %d", r);
  for (int r = 0; r < n; r++) sync_stream(r);
  for (int r = 0; r < n; r++)
    for (int i = 0; i < A; i++) {
      int32_t want = 100000 * n * (n - 1) / 2 + n * i;
      EXPECT(out[r * A + i] == want, "comm %d: allreduce [%d] = %d, want %d", r, i,
             out[r * A + i], want);
    }
  for (int r = 0; r < n; r++) {
    ncclResult_t async = ncclInternalError;
    CHECK(ncclCommGetAsyncError(g_comms[r], &async));
    EXPECT(async == ncclSuccess, "comm %d async error %d", r, (int)async);
  }
  /* Host buffers after stream work: ordered after it on the communicator. */
  int32_t h[4] = {1, 2, 3, 4};
  CHECK(ncclGroupStart());
  for (int r = 0; r < n; r++)
    CHECK(ncclAllReduce(g_dev[r], g_dev[r], A, ncclInt32, ncclSum, g_comms[r], g_streams[r]));
  CHECK(ncclGroupEnd());
  int32_t *hb = malloc(sizeof(int32_t) * 4 * n);
  CHECK(ncclGroupStart());
  for (int r = 0; r < n; r++) {
    memcpy(hb + 4 * r, h, sizeof h);
    CHECK(ncclAllReduce(hb + 4 * r, hb + 4 * r, 4, ncclInt32, ncclSum, g_comms[r], NULL));
  }
  CHECK(ncclGroupEnd());
  for (int r = 0; r < n; r++) {
    EXPECT(hb[4 * r + 3] == 4 * n, "host allreduce on comm %d: %d", r, hb[4 * r + 3]);
    sync_stream(r);
    /* stand-in device memory is host memory */
    int32_t want = n * (100000 * n * (n - 1) / 2 + n * 7);
    EXPECT(g_dev[r][7] == want, "grouped allreduce on comm %d: %d, want %d", r, g_dev[r][7], want);
  }
  teardown(n);
  for (int r = 0; r < n; r++) CHECK(ncclCommDestroy(g_comms[r]));
  free(in);
  free(out);
  free(hb);
  printf("OK %d communicators, one thread, no group (calls issued in %.3f s)\n", n, issued);
  return 0;
}

static int run_mismatch(void) {
  setup(2);
  /* comm 0 reduces 1024 elements, comm 1 4096: a peer mismatch, found while the job runs */
  CHECK(ncclAllReduce(g_dev[0], g_dev[0], 1024, ncclInt32, ncclSum, g_comms[0], g_streams[0]));
  CHECK(ncclAllReduce(g_dev[1], g_dev[1], 4096, ncclInt32, ncclSum, g_comms[1], g_streams[1]));
  sync_stream(0);
  sync_stream(1);
  for (int r = 0; r < 2; r++) {
    ncclResult_t async = ncclSuccess;
    CHECK(ncclCommGetAsyncError(g_comms[r], &async));
    const char *m = ncclGetLastError(NULL);
    EXPECT(async != ncclSuccess && async != ncclInProgress, "comm %d async error %d (%s)", r,
           (int)async, m);
    EXPECT(strstr(m, "ncclAllReduce") != NULL, "\"%s\" names the call", m);
    char rank[16];
    snprintf(rank, sizeof rank, "rank %d", r);
    EXPECT(strstr(m, rank) != NULL, "\"%s\" names %s", m, rank);
    /* every later call on the communicator fails with it, at once */
    ncclResult_t res =
        ncclAllReduce(g_dev[r], g_dev[r], 16, ncclInt32, ncclSum, g_comms[r], g_streams[r]);
    EXPECT(res != ncclSuccess, "a call after the failure returned %d", (int)res);
    EXPECT(strstr(ncclGetLastError(NULL), "earlier operation queued on a stream") != NULL,
           "\"%s\"", ncclGetLastError(NULL));
  }
  teardown(2);
  for (int r = 0; r < 2; r++) CHECK(ncclCommAbort(g_comms[r]));
  printf("OK a failing queued collective released its stream and was reported\n");
  return 0;
}

static int run_abort(double limit) {
  setup(2);
  /* comm 1 never calls: the first job waits for its peer; the second queues behind it */
  CHECK(ncclAllReduce(g_dev[0], g_dev[0], 64, ncclInt32, ncclSum, g_comms[0], g_streams[0]));
  CHECK(ncclAllReduce(g_dev[0], g_dev[0], 64, ncclInt32, ncclSum, g_comms[0], g_streams[0]));
  struct timespec pause = {0, 200 * 1000 * 1000};
  nanosleep(&pause, NULL); /* the first job is running by now */
  double t0 = now();
  CHECK(ncclCommAbort(g_comms[0]));
  sync_stream(0);
  double waited = now() - t0;
  EXPECT(waited < limit, "the stream was released after %.2f s (limit %.1f s)", waited, limit);
  CHECK(ncclCommAbort(g_comms[1]));
  teardown(2);
  printf("OK abort released the stream after %.3f s\n", waited);
  return 0;
}

static int run_destroy(void) {
  setup(2);
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < A; i++) g_dev[r][i] = r + i; /* stand-in memory, nothing queued yet */
  for (int r = 0; r < 2; r++)
    CHECK(ncclAllReduce(g_dev[r], g_dev[r], A, ncclInt32, ncclSum, g_comms[r], g_streams[r]));
  for (int r = 0; r < 2; r++) CHECK(ncclCommDestroy(g_comms[r]));
  /* No synchronize: destroy itself waited for the queued collectives. */
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < A; i++)
      EXPECT(g_dev[r][i] == 1 + 2 * i, "comm %d [%d] = %d after destroy", r, i, g_dev[r][i]);
  for (int r = 0; r < 2; r++) sync_stream(r);
  teardown(2);
  printf("OK destroy drained the queue\n");
  return 0;
}

enum { L = 40013 }; /* int32: 3 pieces of 64 KiB */

static int run_pieces(int n) {
  setup(n);
  int32_t *buf[MAXC][3];
  for (int r = 0; r < n; r++)
    for (int b = 0; b < 3; b++) {
      char dev[8];
      snprintf(dev, sizeof dev, "%d", r % 4);
      setenv("FERRO_DEVICE", dev, 1);
      void *p = NULL;
      CHECK(ncclMemAlloc(&p, sizeof(int32_t) * L));
      buf[r][b] = p;
    }
  /* Stand-in device memory is host memory: filled before anything is queued. */
  for (int r = 0; r < n; r++)
    for (int i = 0; i < L; i++) {
      buf[r][0][i] = r * 100000 + i;
      buf[r][1][i] = r * 10000000 + 3 * i;
      buf[r][2][i] = -1;
    }
  CHECK(ncclGroupStart());
  for (int r = 0; r < n; r++)
    CHECK(ncclAllReduce(buf[r][0], buf[r][0], L, ncclInt32, ncclSum, g_comms[r], g_streams[r]));
  CHECK(ncclGroupEnd());
  CHECK(ncclGroupStart());
  for (int r = 0; r < n; r++) {
    int right = (r + 1) % n, left = (r + n - 1) % n;
    CHECK(ncclSend(buf[r][1], L, ncclInt32, right, g_comms[r], g_streams[r]));
    CHECK(ncclAllReduce(buf[r][0], buf[r][0], L, ncclInt32, ncclSum, g_comms[r], g_streams[r]));
    CHECK(ncclRecv(buf[r][2], L, ncclInt32, left, g_comms[r], g_streams[r]));
  }
  CHECK(ncclGroupEnd());
  for (int r = 0; r < n; r++) sync_stream(r);
  for (int r = 0; r < n; r++) {
    int left = (r + n - 1) % n;
    for (int i = 0; i < L; i++) {
      int32_t want = n * (100000 * n * (n - 1) / 2 + n * i);
      EXPECT(buf[r][0][i] == want, "comm %d: two allreduces [%d] = %d, want %d", r, i,
             buf[r][0][i], want);
      EXPECT(buf[r][2][i] == left * 10000000 + 3 * i, "comm %d: recv from %d [%d] = %d", r,
             left, i, buf[r][2][i]);
    }
  }
  /* Sends and receives alone, the other way around the ring. */
  CHECK(ncclGroupStart());
  for (int r = 0; r < n; r++) {
    int right = (r + 1) % n, left = (r + n - 1) % n;
    CHECK(ncclSend(buf[r][1], L, ncclInt32, left, g_comms[r], g_streams[r]));
    CHECK(ncclRecv(buf[r][2], L, ncclInt32, right, g_comms[r], g_streams[r]));
  }
  CHECK(ncclGroupEnd());
  for (int r = 0; r < n; r++) sync_stream(r);
  for (int r = 0; r < n; r++) {
    int right = (r + 1) % n;
    for (int i = 0; i < L; i++)
      EXPECT(buf[r][2][i] == right * 10000000 + 3 * i, "comm %d: recv from %d [%d] = %d", r,
             right, i, buf[r][2][i]);
    ncclResult_t async = ncclInternalError;
    CHECK(ncclCommGetAsyncError(g_comms[r], &async));
    EXPECT(async == ncclSuccess, "comm %d async error %d", r, (int)async);
  }
  for (int r = 0; r < n; r++)
    for (int b = 0; b < 3; b++) CHECK(ncclMemFree(buf[r][b]));
  teardown(n);
  for (int r = 0; r < n; r++) CHECK(ncclCommDestroy(g_comms[r]));
  printf("OK %d communicators, one thread, long calls in groups\n", n);
  return 0;
}

/* One group per communicator over two streams (see the header), messages of `len` int32. */
static void joined_round(int n, int len, int32_t *buf[MAXC][3], int32_t *host[MAXC][3],
                         cudaStream_t other[MAXC]) {
  size_t bytes = sizeof(int32_t) * (size_t)len;
  for (int r = 0; r < n; r++)
    for (int i = 0; i < len; i++) {
      host[r][0][i] = r * 1000003 + 7 * i + len; /* uploaded on the other stream */
      buf[r][0][i] = r * 100 + i;                 /* allreduced in place */
      buf[r][1][i] = -5;                          /* stale until the upload runs */
      buf[r][2][i] = -1;
      host[r][1][i] = host[r][2][i] = -9;
    }
  for (int r = 0; r < n; r++)
    EXPECT(cudaMemcpyAsync(buf[r][1], host[r][0], bytes, cudaMemcpyHostToDevice, other[r]) ==
               cudaSuccess,
           "upload %d", r);
  CHECK(ncclGroupStart());
  for (int r = 0; r < n; r++) {
    int right = (r + 1) % n, left = (r + n - 1) % n;
    CHECK(ncclSend(buf[r][1], len, ncclInt32, right, g_comms[r], g_streams[r]));
    CHECK(ncclRecv(buf[r][2], len, ncclInt32, left, g_comms[r], other[r]));
    CHECK(ncclAllReduce(buf[r][0], buf[r][0], len, ncclInt32, ncclSum, g_comms[r], other[r]));
  }
  CHECK(ncclGroupEnd());
  /* The received message read back on the send's stream, the allreduce on the receive's. */
  for (int r = 0; r < n; r++) {
    EXPECT(cudaMemcpyAsync(host[r][1], buf[r][2], bytes, cudaMemcpyDeviceToHost, g_streams[r]) ==
               cudaSuccess,
           "download %d", r);
    EXPECT(cudaMemcpyAsync(host[r][2], buf[r][0], bytes, cudaMemcpyDeviceToHost, other[r]) ==
               cudaSuccess,
           "download %d", r);
  }
  for (int r = 0; r < n; r++) {
    EXPECT(cudaStreamSynchronize(other[r]) == cudaSuccess, "cudaStreamSynchronize(%d): %s", r,
           ncclGetLastError(NULL));
    sync_stream(r);
  }
  for (int r = 0; r < n; r++) {
    int left = (r + n - 1) % n;
    for (int i = 0; i < len; i++) {
      int32_t want = left * 1000003 + 7 * i + len;
      EXPECT(host[r][1][i] == want, "comm %d, %d int32: recv from %d [%d] = %d, want %d", r, len,
             left, i, host[r][1][i], want);
      want = 100 * n * (n - 1) / 2 + n * i;
      EXPECT(host[r][2][i] == want, "comm %d, %d int32: allreduce [%d] = %d, want %d", r, len, i,
             host[r][2][i], want);
    }
    ncclResult_t async = ncclInternalError;
    CHECK(ncclCommGetAsyncError(g_comms[r], &async));
    EXPECT(async == ncclSuccess, "comm %d async error %d", r, (int)async);
  }
}

static int run_joined(int n) {
  setup(n);
  int32_t *buf[MAXC][3], *host[MAXC][3];
  cudaStream_t other[MAXC];
  for (int r = 0; r < n; r++) {
    other[r] = (cudaStream_t)(uintptr_t)(0x200 + r);
    char dev[8];
    snprintf(dev, sizeof dev, "%d", r % 4);
    setenv("FERRO_DEVICE", dev, 1);
    for (int b = 0; b < 3; b++) {
      void *p = NULL;
      CHECK(ncclMemAlloc(&p, sizeof(int32_t) * L));
      buf[r][b] = p;
      host[r][b] = malloc(sizeof(int32_t) * L);
      EXPECT(host[r][b] != NULL, "malloc");
    }
  }
  joined_round(n, L, buf, host, other);   /* in pieces */
  joined_round(n, 50, buf, host, other); /* one slice, one piece each: one job */
  for (int r = 0; r < n; r++)
    for (int b = 0; b < 3; b++) {
      CHECK(ncclMemFree(buf[r][b]));
      free(host[r][b]);
    }
  teardown(n);
  for (int r = 0; r < n; r++) CHECK(ncclCommDestroy(g_comms[r]));
  printf("OK %d communicators, groups over two streams each\n", n);
  return 0;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 3;
  const char *mode = argc > 2 ? argv[2] : "nogroup";
  const char *prov = getenv("FERRO_DEVICE_PROVIDER");
  EXPECT(prov != NULL && strcmp(prov, "host") == 0, "needs FERRO_DEVICE_PROVIDER=host");
  EXPECT(n >= 1 && n <= MAXC, "1..%d communicators, not %d", MAXC, n);
  g_rank = 0;
  if (strcmp(mode, "nogroup") == 0) return run_nogroup(n);
  if (strcmp(mode, "mismatch") == 0) return run_mismatch();
  if (strcmp(mode, "abort") == 0) {
    const char *t = getenv("FERRO_TIMEOUT");
    double limit = (t ? atof(t) : 30.0) / 2;
    return run_abort(limit);
  }
  if (strcmp(mode, "destroy") == 0) return run_destroy();
  if (strcmp(mode, "pieces") == 0) return run_pieces(n);
  if (strcmp(mode, "joined") == 0) return run_joined(n);
  fprintf(stderr, "unknown mode %s\n", mode);
  return 1;
}
