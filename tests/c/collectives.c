/* Runs every collective of nccl.h on host buffers with NULL streams, across ranks that are
 * processes (fork), and checks exact results; then checks argument errors.
 *
 *   collectives NRANKS          rank 0 creates the id and sends it to the others by pipe
 *   collectives NRANKS commid   every rank calls ncclGetUniqueId itself (NCCL_COMM_ID set)
 *   collectives NDEV all        one process, ncclCommInitAll, one thread driving every comm
 *   collectives NRANKS mismatch ranks disagree on a count: every rank gets an error naming the
 *                               counts (no hang), the async error stays set, abort succeeds
 *   collectives NRANKS rootmismatch  ranks disagree on a gather's root: every rank gets an error
 *   collectives NRANKS shared   allreduce and sends of buffers from ferrocclMemAllocShared
 *                               (ferroccl.h; built against another header, the mode is absent)
 *
 * Exit status 0 when every check passed. */
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

#if __has_include(<ferroccl.h>)
#include <ferroccl.h>
#define HAVE_FERROCCL_H 1
#endif

/* Every collective, on one communicator. */
static void collectives(ncclComm_t comm) {
  int n, rank, v;
  CHECK(ncclCommCount(comm, &n));
  CHECK(ncclCommUserRank(comm, &rank));
  g_rank = rank;
  CHECK(ncclGetVersion(&v));
  EXPECT(v == NCCL_VERSION(2, 32, 3), "version %d", v);

  enum { C = 1000 };
  /* all-reduce, sum of float: element i of rank r is r * C + i */
  float *fs = malloc(sizeof(float) * C), *fr = malloc(sizeof(float) * C);
  for (int i = 0; i < C; i++) fs[i] = (float)(rank * C + i);
  CHECK(ncclAllReduce(fs, fr, C, ncclFloat, ncclSum, comm, NULL));
  for (int i = 0; i < C; i++) {
    float want = (float)(C * n * (n - 1) / 2 + n * i);
    EXPECT(fr[i] == want, "allreduce sum [%d] = %f, want %f", i, fr[i], want);
  }
  /* in place, max of int32 */
  int32_t *ib = malloc(sizeof(int32_t) * C);
  for (int i = 0; i < C; i++) ib[i] = (i % n == rank) ? 1000000 + i : -i;
  CHECK(ncclAllReduce(ib, ib, C, ncclInt32, ncclMax, comm, NULL));
  for (int i = 0; i < C; i++) EXPECT(ib[i] == 1000000 + i, "allreduce max [%d] = %d", i, ib[i]);
  /* avg of double */
  double *db = malloc(sizeof(double) * C);
  for (int i = 0; i < C; i++) db[i] = 2.0 * rank + i;
  CHECK(ncclAllReduce(db, db, C, ncclDouble, ncclAvg, comm, NULL));
  for (int i = 0; i < C; i++) EXPECT(db[i] == (double)(n - 1) + i, "avg [%d] = %f", i, db[i]);

  /* broadcast from the last rank, and ncclBcast from rank 0 */
  int root = n - 1;
  for (int i = 0; i < C; i++) { db[i] = rank == root ? 0.5 * i + 7 : -1; }
  CHECK(ncclBroadcast(db, db, C, ncclFloat64, root, comm, NULL));
  for (int i = 0; i < C; i++) EXPECT(db[i] == 0.5 * i + 7, "broadcast [%d] = %f", i, db[i]);
  for (int i = 0; i < C; i++) ib[i] = rank == 0 ? 3 * i + 1 : 0;
  CHECK(ncclBcast(ib, C, ncclInt, 0, comm, NULL));
  for (int i = 0; i < C; i++) EXPECT(ib[i] == 3 * i + 1, "bcast [%d] = %d", i, ib[i]);

  /* reduce, sum of int64 to rank n / 2; recvbuff NULL elsewhere */
  int64_t *ls = malloc(sizeof(int64_t) * C), *lr = malloc(sizeof(int64_t) * C);
  for (int i = 0; i < C; i++) { ls[i] = (int64_t)rank * 100000 + i; lr[i] = -5; }
  root = n / 2;
  CHECK(ncclReduce(ls, rank == root ? lr : NULL, C, ncclInt64, ncclSum, root, comm, NULL));
  if (rank == root)
    for (int i = 0; i < C; i++) {
      int64_t want = (int64_t)100000 * n * (n - 1) / 2 + (int64_t)n * i;
      EXPECT(lr[i] == want, "reduce [%d] = %lld", i, (long long)lr[i]);
    }

  /* all-gather of 7 uint32 per rank, out of place and in place */
  enum { G = 7 };
  uint32_t *gs = malloc(sizeof(uint32_t) * G), *gr = malloc(sizeof(uint32_t) * G * n);
  for (int i = 0; i < G; i++) gs[i] = (uint32_t)(rank * 100 + i);
  CHECK(ncclAllGather(gs, gr, G, ncclUint32, comm, NULL));
  for (int r = 0; r < n; r++)
    for (int i = 0; i < G; i++)
      EXPECT(gr[r * G + i] == (uint32_t)(r * 100 + i), "allgather [%d][%d]", r, i);
  memset(gr, 0, sizeof(uint32_t) * G * n);
  memcpy(gr + rank * G, gs, sizeof(uint32_t) * G);
  CHECK(ncclAllGather(gr + rank * G, gr, G, ncclUint32, comm, NULL));
  for (int r = 0; r < n; r++)
    for (int i = 0; i < G; i++)
      EXPECT(gr[r * G + i] == (uint32_t)(r * 100 + i), "in-place allgather [%d][%d]", r, i);

  /* reduce-scatter, sum of float: block b element i of rank r is r + b * 10 + i */
  enum { R = 5 };
  float *rs = malloc(sizeof(float) * R * n), *rr = malloc(sizeof(float) * R);
  for (int b = 0; b < n; b++)
    for (int i = 0; i < R; i++) rs[b * R + i] = (float)(rank + b * 10 + i);
  CHECK(ncclReduceScatter(rs, rr, R, ncclFloat, ncclSum, comm, NULL));
  for (int i = 0; i < R; i++) {
    float want = (float)(n * (n - 1) / 2 + n * (rank * 10 + i));
    EXPECT(rr[i] == want, "reducescatter [%d] = %f, want %f", i, rr[i], want);
  }

  /* all-to-all: block p of rank r holds r * 1000 + p * 10 + i */
  int32_t *as = malloc(sizeof(int32_t) * 3 * n), *ar = malloc(sizeof(int32_t) * 3 * n);
  for (int p = 0; p < n; p++)
    for (int i = 0; i < 3; i++) as[p * 3 + i] = rank * 1000 + p * 10 + i;
  CHECK(ncclAlltoAll(as, ar, 3, ncclInt32, comm, NULL));
  for (int p = 0; p < n; p++)
    for (int i = 0; i < 3; i++)
      EXPECT(ar[p * 3 + i] == p * 1000 + rank * 10 + i, "alltoall [%d][%d] = %d", p, i,
             ar[p * 3 + i]);

  /* gather to rank 0, scatter from the last rank */
  memset(ar, 0, sizeof(int32_t) * 3 * n);
  CHECK(ncclGather(as, rank == 0 ? ar : NULL, 3, ncclInt32, 0, comm, NULL));
  if (rank == 0)
    for (int p = 0; p < n; p++)
      for (int i = 0; i < 3; i++)
        EXPECT(ar[p * 3 + i] == p * 1000 + i, "gather [%d][%d] = %d", p, i, ar[p * 3 + i]);
  int32_t sc[3] = {0, 0, 0};
  CHECK(ncclScatter(rank == n - 1 ? as : NULL, sc, 3, ncclInt32, n - 1, comm, NULL));
  for (int i = 0; i < 3; i++)
    EXPECT(sc[i] == (n - 1) * 1000 + rank * 10 + i, "scatter [%d] = %d", i, sc[i]);

  /* send/recv around the ring both ways, in one group */
  int right = (rank + 1) % n, left = (rank + n - 1) % n;
  int64_t tor[4], tol[4], fromr[4], froml[4];
  for (int i = 0; i < 4; i++) { tor[i] = rank * 10 + i; tol[i] = -(rank * 10 + i); }
  CHECK(ncclGroupStart());
  CHECK(ncclSend(tor, 4, ncclInt64, right, comm, NULL));
  CHECK(ncclSend(tol, 4, ncclInt64, left, comm, NULL));
  CHECK(ncclRecv(froml, 4, ncclInt64, left, comm, NULL));
  CHECK(ncclRecv(fromr, 4, ncclInt64, right, comm, NULL));
  CHECK(ncclGroupEnd());
  for (int i = 0; i < 4; i++) {
    EXPECT(froml[i] == left * 10 + i, "recv from left [%d] = %lld", i, (long long)froml[i]);
    EXPECT(fromr[i] == -(right * 10 + i), "recv from right [%d]", i);
  }

  /* nested group of two collectives */
  int32_t x[2] = {rank + 1, rank + 2}, y[2];
  CHECK(ncclGroupStart());
  CHECK(ncclGroupStart());
  CHECK(ncclAllReduce(x, x, 2, ncclInt32, ncclProd, comm, NULL));
  CHECK(ncclGroupEnd());
  CHECK(ncclAllReduce(x, y, 2, ncclInt32, ncclMin, comm, NULL));
  CHECK(ncclGroupEnd());
  int32_t p0 = 1, p1 = 1;
  for (int r = 0; r < n; r++) { p0 *= r + 1; p1 *= r + 2; }
  EXPECT(x[0] == p0 && x[1] == p1, "group prod %d %d", x[0], x[1]);
  EXPECT(y[0] == p0 && y[1] == p1, "group min after prod %d %d", y[0], y[1]);

  /* pre-multiplied sum: rank r scales by r + 1 */
  ncclRedOp_t premul;
  float scalar = (float)(rank + 1);
  CHECK(ncclRedOpCreatePreMulSum(&premul, &scalar, ncclFloat, ncclScalarHostImmediate, comm));
  EXPECT(premul >= ncclNumOps, "premul op %d", (int)premul);
  for (int i = 0; i < C; i++) fs[i] = (float)i;
  CHECK(ncclAllReduce(fs, fr, C, ncclFloat, premul, comm, NULL));
  for (int i = 0; i < C; i++) {
    float want = (float)i * (float)(n * (n + 1) / 2);
    EXPECT(fr[i] == want, "premulsum [%d] = %f, want %f", i, fr[i], want);
  }
  CHECK(ncclRedOpDestroy(premul, comm));

  /* registration and memory */
  void *h = NULL, *mem = NULL;
  CHECK(ncclCommRegister(comm, fs, sizeof(float) * C, &h));
  CHECK(ncclCommDeregister(comm, h));
  /* ncclMemAlloc gives device memory (see streams.c); without a driver, a clear error */
  ncclResult_t mr = ncclMemAlloc(&mem, 4096);
  if (mr == ncclSuccess) {
    CHECK(ncclMemFree(mem));
  } else {
    EXPECT(mr == ncclSystemError && strstr(ncclGetLastError(NULL), "ncclMemAlloc") != NULL,
           "ncclMemAlloc returned %d (%s)", (int)mr, ncclGetLastError(NULL));
  }

  /* argument errors name the argument and the value */
  EXPECT_ERR(ncclBroadcast(fs, fr, C, ncclFloat, n + 5, comm, NULL), ncclInvalidArgument, "root");
  char wanted[32];
  snprintf(wanted, sizeof wanted, "%d", n + 5);
  EXPECT(strstr(ncclGetLastError(NULL), wanted) != NULL, "root value in \"%s\"",
         ncclGetLastError(NULL));
  EXPECT_ERR(ncclReduce(fs, fr, C, ncclFloat, ncclSum, -1, comm, NULL), ncclInvalidArgument,
             "root");
  EXPECT_ERR(ncclAllReduce(fs, fr, C, (ncclDataType_t)42, ncclSum, comm, NULL),
             ncclInvalidArgument, "data type 42");
  EXPECT_ERR(ncclAllReduce(fs, fr, C, ncclFloat, (ncclRedOp_t)77, comm, NULL),
             ncclInvalidArgument, "operation 77");
  EXPECT_ERR(ncclAllReduce(NULL, fr, C, ncclFloat, ncclSum, comm, NULL), ncclInvalidArgument,
             "sendbuff");
  EXPECT_ERR(ncclSend(fs, 1, ncclFloat, n, comm, NULL), ncclInvalidArgument, "peer");
  /* a non-NULL stream means device buffers: host memory is refused (or, without a driver,
   * the driver's error); streams.c runs device buffers */
  {
    ncclResult_t sr = ncclAllReduce(fs, fr, C, ncclFloat, ncclSum, comm, (cudaStream_t)0x10);
    const char *m = ncclGetLastError(NULL);
    EXPECT((sr == ncclInvalidArgument && strstr(m, "is host memory") != NULL) ||
               (sr == ncclSystemError && strstr(m, "NVIDIA driver") != NULL),
           "host buffers on a stream returned %d (%s)", (int)sr, m);
  }
  EXPECT_ERR(ncclAllReduce(fs, fr, C, ncclFloat, ncclSum, NULL, NULL), ncclInvalidArgument,
             "comm");
  EXPECT_ERR(ncclGroupEnd(), ncclInvalidUsage, "ncclGroupStart");
  EXPECT_ERR(ncclCommCount(comm, NULL), ncclInvalidArgument, "count");
  EXPECT(strcmp(ncclGetErrorString(ncclInvalidArgument), "") != 0, "error string");
  /* the communicator still works after rejected calls */
  CHECK(ncclAllReduce(fs, fr, 1, ncclFloat, ncclSum, comm, NULL));

  free(fs); free(fr); free(ib); free(db); free(ls); free(lr); free(gs); free(gr);
  free(rs); free(rr); free(as); free(ar);
}

/* Split into even and odd ranks, non-blocking, and all-reduce on the halves. */
static void split_nonblocking(ncclComm_t comm) {
  int n, rank;
  CHECK(ncclCommCount(comm, &n));
  CHECK(ncclCommUserRank(comm, &rank));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t half;
  ncclResult_t state = ncclCommSplit(comm, rank % 2, -rank, &half, &config);
  EXPECT(state == ncclSuccess || state == ncclInProgress, "split returned %d", (int)state);
  state = ncclInProgress;
  while (state == ncclInProgress) CHECK(ncclCommGetAsyncError(half, &state));
  EXPECT(state == ncclSuccess, "split state %d: %s", (int)state, ncclGetLastError(NULL));
  int hn, hr;
  CHECK(ncclCommCount(half, &hn));
  CHECK(ncclCommUserRank(half, &hr));
  EXPECT(hn == (n + 1 - rank % 2) / 2, "half size %d", hn);
  EXPECT(hr == hn - 1 - rank / 2, "half rank %d (key -rank orders backwards)", hr);
  int64_t v[3] = {rank, rank * 2, 1};
  ncclResult_t r = ncclAllReduce(v, v, 3, ncclInt64, ncclSum, half, NULL);
  EXPECT(r == ncclInProgress || r == ncclSuccess, "non-blocking allreduce returned %d", (int)r);
  do CHECK(ncclCommGetAsyncError(half, &state)); while (state == ncclInProgress);
  EXPECT(state == ncclSuccess, "allreduce state %d", (int)state);
  int64_t sum = 0;
  for (int q = rank % 2; q < n; q += 2) sum += q;
  EXPECT(v[0] == sum && v[1] == 2 * sum && v[2] == hn, "half sums %lld %lld %lld",
         (long long)v[0], (long long)v[1], (long long)v[2]);
  r = ncclCommFinalize(half);
  while (r == ncclInProgress) CHECK(ncclCommGetAsyncError(half, &r));
  EXPECT(r == ncclSuccess, "finalize %d", (int)r);
  CHECK(ncclCommDestroy(half));
}

static int run_rank(int rank, int n, ncclUniqueId id) {
  g_rank = rank;
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, n, id, rank));
  collectives(comm);
  split_nonblocking(comm);
  CHECK(ncclCommDestroy(comm));
  EXPECT_ERR(ncclCommDestroy(comm), ncclInvalidArgument, "not a live communicator");
  return 0;
}

/* Rank 0 reduces 1024 floats, the others 4096: an error, not a hang or wrong data. */
static int run_mismatch(int rank, int n, ncclUniqueId id) {
  g_rank = rank;
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, n, id, rank));
  size_t count = rank == 0 ? 1024 : 4096;
  float *buf = calloc(count, sizeof(float));
  ncclResult_t r = ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, NULL);
  const char *m = ncclGetLastError(NULL);
  EXPECT(r == ncclRemoteError, "mismatched allreduce returned %d (%s)", (int)r, m);
  EXPECT(strstr(m, "all_reduce") != NULL, "last error \"%s\" names the operation", m);
  ncclResult_t async = ncclSuccess;
  CHECK(ncclCommGetAsyncError(comm, &async));
  EXPECT(async != ncclSuccess && async != ncclInProgress, "async error %d", (int)async);
  /* Every later call fails the same way. */
  r = ncclAllReduce(buf, buf, 16, ncclFloat, ncclSum, comm, NULL);
  EXPECT(r != ncclSuccess, "a call on a failed communicator returned %d", (int)r);
  CHECK(ncclCommAbort(comm));
  free(buf);
  return 0;
}

/* Ranks disagree on the root of a gather: every rank gets an error at once (not after the
 * timeout) that names the operation and the root (a rank that did not see the mismatch itself
 * passes on the words of the one that did). */
static int run_root_mismatch(int rank, int n, ncclUniqueId id) {
  g_rank = rank;
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, n, id, rank));
  size_t count = 3;
  int root = rank == n - 1 ? 1 : 0;
  float *send = calloc(count, sizeof(float));
  float *recv = calloc(count * n, sizeof(float));
  ncclResult_t r = ncclGather(send, recv, count, ncclFloat, root, comm, NULL);
  const char *m = ncclGetLastError(NULL);
  EXPECT(r == ncclRemoteError, "mismatched roots returned %d (%s)", (int)r, m);
  EXPECT(strstr(m, "ncclGather") != NULL && strstr(m, "root") != NULL,
         "last error \"%s\" names the operation and the root", m);
  CHECK(ncclCommAbort(comm));
  free(send);
  free(recv);
  return 0;
}

/* One process, one thread, every communicator: collectives and a ring of sends in groups. */
static int run_all(int n) {
  g_rank = 0;
  ncclComm_t *comms = calloc(n, sizeof(ncclComm_t));
  int *devs = calloc(n, sizeof(int));
  for (int i = 0; i < n; i++) devs[i] = 10 + i;
  CHECK(ncclCommInitAll(comms, n, devs));
  float(*buf)[64] = calloc(n, sizeof *buf);
  int32_t(*to)[8] = calloc(n, sizeof *to), (*from)[8] = calloc(n, sizeof *from);
  for (int r = 0; r < n; r++) {
    int dev, rank;
    CHECK(ncclCommCuDevice(comms[r], &dev));
    CHECK(ncclCommUserRank(comms[r], &rank));
    EXPECT(dev == 10 + r && rank == r, "comm %d: device %d rank %d", r, dev, rank);
    for (int i = 0; i < 64; i++) buf[r][i] = (float)(r * 64 + i);
    for (int i = 0; i < 8; i++) to[r][i] = r * 8 + i;
  }
  CHECK(ncclGroupStart());
  for (int r = 0; r < n; r++)
    CHECK(ncclAllReduce(buf[r], buf[r], 64, ncclFloat, ncclSum, comms[r], NULL));
  for (int r = 0; r < n; r++) {
    CHECK(ncclSend(to[r], 8, ncclInt32, (r + 1) % n, comms[r], NULL));
    CHECK(ncclRecv(from[r], 8, ncclInt32, (r + n - 1) % n, comms[r], NULL));
  }
  CHECK(ncclGroupEnd());
  for (int r = 0; r < n; r++) {
    for (int i = 0; i < 64; i++) {
      float want = (float)(64 * n * (n - 1) / 2 + n * i);
      EXPECT(buf[r][i] == want, "comm %d allreduce [%d] = %f", r, i, buf[r][i]);
    }
    for (int i = 0; i < 8; i++)
      EXPECT(from[r][i] == ((r + n - 1) % n) * 8 + i, "comm %d recv [%d]", r, i);
  }
  for (int r = 0; r < n; r++) CHECK(ncclCommDestroy(comms[r]));
  free(comms); free(devs); free(buf); free(to); free(from);
  return 0;
}

/* Rank 0 reduces while rank 1 stays alive but never joins, for longer than the deadline
 * (FERRO_TIMEOUT=2): rank 0 gets ncclTimeout, not ncclRemoteError, and the last error names
 * the operation. */
static int run_timeout(int rank, int n, ncclUniqueId id) {
  g_rank = rank;
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, n, id, rank));
  float buf[16] = {0};
  if (rank == 0) {
    ncclResult_t r = ncclAllReduce(buf, buf, 16, ncclFloat, ncclSum, comm, NULL);
    const char *m = ncclGetLastError(NULL);
    EXPECT(r == ncclTimeout, "allreduce past the deadline returned %d (%s)", (int)r, m);
    EXPECT(strstr(m, "all_reduce") != NULL, "last error \"%s\" names the operation", m);
    EXPECT(strcmp(ncclGetErrorString(ncclTimeout), "operation timed out") == 0,
           "error string of ncclTimeout: %s", ncclGetErrorString(ncclTimeout));
  } else {
    sleep(6);
  }
  CHECK(ncclCommAbort(comm));
  return 0;
}

#ifdef HAVE_FERROCCL_H
/* Buffers in shared memory: a 4 MiB allreduce out of place and in place, and a ring of
 * sends, every element checked; then the allocation's argument errors. */
static int run_shared(int rank, int n, ncclUniqueId id) {
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, n, id, rank));
  enum { C = 1 << 20 };
  float *s, *r;
  CHECK(ferrocclMemAllocShared((void **)&s, C * sizeof(float)));
  CHECK(ferrocclMemAllocShared((void **)&r, C * sizeof(float) + 3));
  EXPECT(s[0] == 0 && r[C - 1] == 0, "shared memory starts zeroed");
  for (int i = 0; i < C; i++) s[i] = (float)(rank * 7 + i % 1000);
  CHECK(ncclAllReduce(s, r, C, ncclFloat, ncclSum, comm, NULL));
  for (int i = 0; i < C; i++) {
    float want = (float)(7 * n * (n - 1) / 2 + n * (i % 1000));
    EXPECT(r[i] == want, "shared allreduce [%d] = %f, want %f", i, r[i], want);
  }
  CHECK(ncclAllReduce(r, r, C, ncclFloat, ncclMax, comm, NULL));
  EXPECT(r[C - 1] == (float)(7 * n * (n - 1) / 2 + n * ((C - 1) % 1000)), "in place max");
  if (n > 1) {
    for (int i = 0; i < C; i++) s[i] = (float)(rank + i);
    CHECK(ncclGroupStart());
    CHECK(ncclSend(s, C, ncclFloat, (rank + 1) % n, comm, NULL));
    CHECK(ncclRecv(r, C, ncclFloat, (rank + n - 1) % n, comm, NULL));
    CHECK(ncclGroupEnd());
    int from = (rank + n - 1) % n;
    for (int i = 0; i < C; i++)
      EXPECT(r[i] == (float)(from + i), "shared recv [%d] = %f", i, r[i]);
  }
  CHECK(ferrocclMemFreeShared(s));
  CHECK(ferrocclMemFreeShared(r));
  CHECK(ferrocclMemFreeShared(NULL));
  EXPECT_ERR(ferrocclMemFreeShared(s), ncclInvalidArgument, "ferrocclMemAllocShared");
  int local = 0;
  EXPECT_ERR(ferrocclMemFreeShared(&local), ncclInvalidArgument, "not allocated");
  EXPECT_ERR(ferrocclMemAllocShared(NULL, 8), ncclInvalidArgument, "ptr");
  void *p = NULL;
  EXPECT_ERR(ferrocclMemAllocShared(&p, 0), ncclInvalidArgument, "size is 0");
  CHECK(ncclCommDestroy(comm));
  return 0;
}
#endif

/* One rank of the mode `arg` names. */
static int rank_main(int r, int n, ncclUniqueId id, void *arg) {
  const char *mode = arg;
  if (strcmp(mode, "rootmismatch") == 0) return run_root_mismatch(r, n, id);
  if (strcmp(mode, "timeout") == 0) return run_timeout(r, n, id);
#ifdef HAVE_FERROCCL_H
  if (strcmp(mode, "shared") == 0) return run_shared(r, n, id);
#endif
  return strcmp(mode, "mismatch") == 0 ? run_mismatch(r, n, id) : run_rank(r, n, id);
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2;
  const char *mode = argc > 2 ? argv[2] : "pipe";
  if (n < 1) return 1;
  if (strcmp(mode, "all") == 0) return run_all(n);
  int failed = fork_ranks(n, strcmp(mode, "commid") == 0, rank_main, (void *)mode);
  printf(failed ? "FAILED\n" : "OK %d ranks\n", n);
  return failed;
}
