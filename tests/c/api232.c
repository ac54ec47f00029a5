/* Calls every function NCCL 2.27 .. 2.32 added, across ranks that are processes (fork), on
 * their working paths and their refusals; builds against ferroccl's header and NVIDIA's.
 *
 *   api232 NRANKS   (NRANKS >= 3) every rank runs every check; the job grows by a process
 *                   that joins with ncclCommGrow; then the last rank dies and the others
 *                   shrink the communicator and carry on without it
 *
 * Exit status 0 when every check passed. */
#define _GNU_SOURCE
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

enum { C = 37 };

/* The nccl*Config collectives, with exact results. */
static void config_collectives(ncclComm_t comm, int rank, int n) {
  ncclCollConfig_t cfg = NCCL_COLLCONFIG_INITIALIZER;
  double send[C * 8], recv[C * 8];
  for (int i = 0; i < C; i++) send[i] = rank * 1000 + i;
  CHECK(ncclAllReduceConfig(send, recv, C, ncclDouble, ncclSum, comm, NULL, NULL));
  for (int i = 0; i < C; i++)
    EXPECT(recv[i] == 1000.0 * n * (n - 1) / 2 + (double)n * i, "allreduce %d: %g", i, recv[i]);
  CHECK(ncclAllReduceConfig(send, recv, C, ncclDouble, ncclMax, comm, NULL, &cfg));
  EXPECT(recv[5] == (n - 1) * 1000 + 5, "max %g", recv[5]);
  CHECK(ncclBroadcastConfig(send, recv, C, ncclDouble, 1, comm, NULL, &cfg));
  EXPECT(recv[3] == 1003, "broadcast %g", recv[3]);
  CHECK(ncclReduceConfig(send, recv, C, ncclDouble, ncclMin, 0, comm, NULL, &cfg));
  if (rank == 0) EXPECT(recv[2] == 2, "reduce %g", recv[2]);
  CHECK(ncclAllGatherConfig(send, recv, C, ncclDouble, comm, NULL, &cfg));
  for (int r = 0; r < n; r++) EXPECT(recv[r * C + 1] == r * 1000 + 1, "allgather %d", r);
  for (int i = 0; i < C * n; i++) send[i] = rank + i;
  CHECK(ncclReduceScatterConfig(send, recv, C, ncclDouble, ncclSum, comm, NULL, &cfg));
  EXPECT(recv[0] == (double)n * (n - 1) / 2 + (double)n * rank * C, "reducescatter %g", recv[0]);
  CHECK(ncclAlltoAllConfig(send, recv, C, ncclDouble, comm, NULL, &cfg));
  for (int r = 0; r < n; r++) EXPECT(recv[r * C] == r + rank * C, "alltoall from %d", r);
  CHECK(ncclGatherConfig(send, recv, C, ncclDouble, 0, comm, NULL, &cfg));
  if (rank == 0)
    for (int r = 0; r < n; r++) EXPECT(recv[r * C + 2] == r + 2, "gather from %d", r);
  CHECK(ncclScatterConfig(send, recv, C, ncclDouble, 0, comm, NULL, &cfg));
  EXPECT(recv[1] == rank * C + 1, "scatter %g", recv[1]);

  /* Refusals: every rank refuses before anything runs, so nothing is left half-done. */
  ncclCollConfig_t bad = cfg;
  bad.magic = 7;
  EXPECT_ERR(ncclAllReduceConfig(send, recv, C, ncclDouble, ncclSum, comm, NULL, &bad),
             ncclInvalidArgument, "NCCL_COLLCONFIG_INITIALIZER");
  bad = cfg;
  bad.launchCompletionEvent = (cudaEvent_t)(uintptr_t)0x10;
  EXPECT_ERR(ncclAllGatherConfig(send, recv, C, ncclDouble, comm, NULL, &bad), ncclInvalidUsage,
             "launchCompletionEvent");
  bad = cfg;
  bad.algSelection = "nvls";
  EXPECT_ERR(ncclAllReduceConfig(send, recv, C, ncclDouble, ncclSum, comm, NULL, &bad),
             ncclInvalidArgument, "nvls");
  bad.algSelection = "ring";
  EXPECT_ERR(ncclGatherConfig(send, recv, C, ncclDouble, 0, comm, NULL, &bad), ncclInvalidUsage,
             "sends and receives");
  bad.forceAlgSelection = 0;
  CHECK(ncclGatherConfig(send, recv, C, ncclDouble, 0, comm, NULL, &bad));
}

static void windows_and_state(ncclComm_t comm) {
  static char buf[8192];
  ncclWindow_t win = NULL;
  void *user = NULL;
  CHECK(ncclCommWindowRegister(comm, buf, sizeof buf, &win, NCCL_WIN_COLL_SYMMETRIC));
  CHECK(ncclWinGetUserPtr(comm, win, &user));
  EXPECT(user == buf, "user pointer %p, buffer %p", user, (void *)buf);
  CHECK(ncclCommWindowDeregister(comm, win));
  EXPECT_ERR(ncclCommWindowDeregister(comm, win), ncclInvalidArgument, "not a registered window");
  EXPECT_ERR(ncclCommWindowRegister(comm, buf, sizeof buf, &win, 0x100), ncclInvalidArgument,
             "winFlags");

  uint64_t v = 99;
  CHECK(ncclCommMemStats(comm, ncclStatGpuMemTotal, &v));
  EXPECT(v == 0, "total %llu", (unsigned long long)v);
  CHECK(ncclCommSuspend(comm, NCCL_SUSPEND_MEM));
  CHECK(ncclCommMemStats(comm, ncclStatGpuMemSuspended, &v));
  EXPECT(v == 1, "suspended %llu", (unsigned long long)v);
  float x = 1;
  EXPECT_ERR(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, NULL), ncclInvalidUsage,
             "suspended");
  CHECK(ncclCommResume(comm));
  EXPECT_ERR(ncclCommResume(comm), ncclInvalidUsage, "not suspended");
  ncclComm_t none = NULL;
  EXPECT_ERR(ncclCommGrow(comm, 8, NULL, 2, &none, NULL), ncclInvalidArgument, "must be -1");
  EXPECT_ERR(ncclCommMemStats(comm, (ncclCommMemStat_t)9, &v), ncclInvalidArgument, "stat 9");

  ncclWaitSignalDesc_t desc = {1, 0, 0, 0};
  EXPECT_ERR(ncclPutSignal(buf, 1, ncclInt8, 0, NULL, 0, 0, 0, 0, comm, NULL), ncclInvalidUsage,
             "not supported");
  EXPECT_ERR(ncclSignal(0, 0, 0, 0, comm, NULL), ncclInvalidUsage, "not supported");
  EXPECT_ERR(ncclWaitSignal(1, &desc, comm, NULL), ncclInvalidUsage, "not supported");
  ncclEncryptionConfig_t enc = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
  CHECK(ncclSetEncryption(&enc));
  enc.mode = NCCL_ENCRYPTION_MODE_PSK;
  enc.psk = "secret";
  EXPECT_ERR(ncclSetEncryption(&enc), ncclInvalidUsage, "pre-shared key");
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  ncclResetDebugInit();
#pragma GCC diagnostic pop
}

/* Sums rank+1 over a communicator of n ranks, with every rank's value in every element. */
static void check_sum(ncclComm_t comm, int rank, int n) {
  int64_t x[C];
  for (int i = 0; i < C; i++) x[i] = (rank + 1) * 1000 + i;
  CHECK(ncclAllReduce(x, x, C, ncclInt64, ncclSum, comm, NULL));
  for (int i = 0; i < C; i++)
    EXPECT(x[i] == 1000LL * n * (n + 1) / 2 + (int64_t)n * i, "sum over %d ranks, %d: %lld", n,
           i, (long long)x[i]);
}

/* The job grows by one process: rank 0 makes the id and hands it to the newcomer by pipe. */
static void grow(ncclComm_t comm, int rank, int n, int to_newcomer) {
  ncclUniqueId id;
  ncclComm_t big = NULL;
  if (rank == 0) {
    CHECK(ncclCommGetUniqueId(comm, &id));
    EXPECT_ERR(ncclCommGetUniqueId(comm, &id), ncclInvalidUsage, "not been used");
    if (write(to_newcomer, &id, sizeof id) != (ssize_t)sizeof id) exit(4);
  }
  EXPECT_ERR(ncclCommGrow(comm, n, rank == 0 ? &id : NULL, -1, &big, NULL), ncclInvalidArgument,
             "nRanks");
  CHECK(ncclCommGrow(comm, n + 1, rank == 0 ? &id : NULL, -1, &big, NULL));
  int count = 0, me = -1;
  CHECK(ncclCommCount(big, &count));
  CHECK(ncclCommUserRank(big, &me));
  EXPECT(count == n + 1 && me == rank, "grown to %d ranks, rank %d", count, me);
  check_sum(big, rank, n + 1);
  CHECK(ncclCommDestroy(big));
}

static int newcomer(int n, int from_rank0) {
  ncclUniqueId id;
  ncclComm_t big = NULL;
  g_rank = n;
  if (read(from_rank0, &id, sizeof id) != (ssize_t)sizeof id) return 4;
  CHECK(ncclCommGrow(NULL, n + 1, &id, n, &big, NULL));
  check_sum(big, n, n + 1);
  CHECK(ncclCommDestroy(big));
  return 0;
}

static void simulate(ncclComm_t comm) {
  enum { BIG = 1 << 18 };
  float *a = malloc(BIG * sizeof *a);
  for (int i = 0; i < BIG; i++) a[i] = 1;
  ncclSimInfo_t small = NCCL_SIM_INFO_INITIALIZER, big = NCCL_SIM_INFO_INITIALIZER;
  CHECK(ncclGroupStart());
  CHECK(ncclAllReduce(a, a, 1024, ncclFloat, ncclSum, comm, NULL));
  CHECK(ncclGroupSimulateEnd(&small));
  CHECK(ncclGroupStart());
  CHECK(ncclAllReduce(a, a, BIG, ncclFloat, ncclSum, comm, NULL));
  CHECK(ncclAllGather(a, a + BIG / 2, BIG / 16, ncclFloat, comm, NULL));
  CHECK(ncclGroupSimulateEnd(&big));
  EXPECT(small.estimatedTime > 0 && big.estimatedTime > small.estimatedTime,
         "estimates %g us, %g us", small.estimatedTime, big.estimatedTime);
  EXPECT(a[0] == 1 && a[BIG - 1] == 1, "a simulated group ran");
  ncclSimInfo_t bad = NCCL_SIM_INFO_INITIALIZER;
  bad.magic = 0;
  CHECK(ncclGroupStart());
  EXPECT_ERR(ncclGroupSimulateEnd(&bad), ncclInvalidArgument, "NCCL_SIM_INFO_INITIALIZER");
  EXPECT_ERR(ncclGroupSimulateEnd(&small), ncclInvalidUsage, "not inside a group");
  free(a);
}

static void params(void) {
  ncclParamHandle_t h;
  int32_t i32 = 0;
  int8_t i8 = 0;
  int16_t i16 = 0;
  int64_t i64 = 0;
  uint8_t u8 = 0;
  uint16_t u16 = 0;
  uint32_t u32 = 0;
  uint64_t u64 = 0;
  CHECK(ncclParamBind(&h, "FERRO_TIMEOUT"));
  CHECK(ncclParamGetI32(h, &i32));
  EXPECT(i32 == 30, "FERRO_TIMEOUT %d", (int)i32);
  CHECK(ncclParamGetI8(h, &i8));
  CHECK(ncclParamGetI16(h, &i16));
  CHECK(ncclParamGetI64(h, &i64));
  CHECK(ncclParamGetU8(h, &u8));
  CHECK(ncclParamGetU16(h, &u16));
  CHECK(ncclParamGetU32(h, &u32));
  CHECK(ncclParamGetU64(h, &u64));
  EXPECT(i8 == 30 && i16 == 30 && i64 == 30 && u8 == 30 && u16 == 30 && u32 == 30 && u64 == 30,
         "widths disagree");
  const char *s = NULL;
  CHECK(ncclParamGetStr(h, &s));
  EXPECT(strcmp(s, "30") == 0, "string %s", s);
  char raw[8];
  int len = 0;
  CHECK(ncclParamGet(h, raw, sizeof raw, &len));
  EXPECT(len == 2 && memcmp(raw, "30", 2) == 0, "raw %d", len);
  EXPECT_ERR(ncclParamGet(h, raw, 1, &len), ncclInvalidArgument, "maxLen");
  CHECK(ncclParamBind(&h, "FERRO_SLICE_BYTES"));
  EXPECT_ERR(ncclParamGetI8(h, &i8), ncclInvalidUsage, "does not fit");
  CHECK(ncclParamBind(&h, "FERRO_TRANSPORTS"));
  EXPECT_ERR(ncclParamGetU32(h, &u32), ncclInvalidUsage, "not a number");
  EXPECT_ERR(ncclParamBind(&h, "NCCL_NO_SUCH_THING"), ncclInvalidArgument, "unknown parameter");
  const char *v = NULL;
  int vlen = -1;
  CHECK(ncclParamGetParameter("NCCL_SHM_DISABLE", &v, &vlen));
  const char *shm_off = getenv("NCCL_SHM_DISABLE");
  const char *want = shm_off && atoi(shm_off) != 0 ? "1" : "0";
  EXPECT(strcmp(v, want) == 0 && vlen == 1, "NCCL_SHM_DISABLE %s, wanted %s", v, want);
  const char **keys = NULL;
  int nkeys = 0;
  CHECK(ncclParamGetAllParameterKeys(&keys, &nkeys));
  int found = 0;
  for (int i = 0; i < nkeys; i++) found += strcmp(keys[i], "FERRO_SPIN_US") == 0;
  EXPECT(nkeys > 10 && found == 1, "%d keys", nkeys);
  ncclParamDumpAll();
}

/* The last rank leaves; the others find the communicator failed, shrink it and go on. */
static int shrink_after_death(ncclComm_t comm, int rank, int n) {
  int64_t x[C];
  if (rank == n - 1) {
    CHECK(ncclCommAbort(comm));
    return 0;
  }
  for (int i = 0; i < C; i++) x[i] = rank + i;
  ncclResult_t r = ncclAllReduce(x, x, C, ncclInt64, ncclSum, comm, NULL);
  EXPECT(r == ncclRemoteError || r == ncclSystemError || r == ncclTimeout,
         "allreduce with a dead rank returned %d: %s", (int)r, ncclGetLastError(NULL));
  int dead = n - 1;
  ncclComm_t small = NULL;
  EXPECT_ERR(ncclCommShrink(comm, &dead, 1, &small, NULL, 0x40), ncclInvalidArgument,
             "shrinkFlags");
  CHECK(ncclCommShrink(comm, &dead, 1, &small, NULL, NCCL_SHRINK_DEFAULT));
  int count = 0, me = -1;
  CHECK(ncclCommCount(small, &count));
  CHECK(ncclCommUserRank(small, &me));
  EXPECT(count == n - 1 && me == rank, "shrunk to %d ranks, rank %d", count, me);
  for (int i = 0; i < C; i++) x[i] = rank * 100 + i;
  CHECK(ncclAllReduce(x, x, C, ncclInt64, ncclSum, small, NULL));
  for (int i = 0; i < C; i++)
    EXPECT(x[i] == 100LL * (n - 1) * (n - 2) / 2 + (int64_t)(n - 1) * i, "shrunk sum %d: %lld", i,
           (long long)x[i]);
  EXPECT_ERR(ncclCommRevoke(comm, 1), ncclInvalidArgument, "revokeFlags");
  CHECK(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT));
  EXPECT_ERR(ncclAllReduce(x, x, C, ncclInt64, ncclSum, comm, NULL), ncclInvalidUsage, "revoked");
  EXPECT_ERR(ncclCommFinalize(comm), ncclInvalidUsage, "revoked");
  CHECK(ncclCommDestroy(comm));
  CHECK(ncclCommDestroy(small));
  return 0;
}

static int run_rank(int rank, int n, ncclUniqueId *ids, int to_newcomer) {
  ncclComm_t comm;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  int v = 0;
  CHECK(ncclGetVersion(&v));
  EXPECT(v == NCCL_VERSION_CODE && v == 23203, "version %d", v);
  EXPECT_ERR(ncclCommInitRankScalable(&comm, n, rank, 0, ids, &cfg), ncclInvalidArgument, "nId");
  CHECK(ncclCommInitRankScalable(&comm, n, rank, 2, ids, &cfg));
  config_collectives(comm, rank, n);
  windows_and_state(comm);
  simulate(comm);
  params();
  grow(comm, rank, n, to_newcomer);
  return shrink_after_death(comm, rank, n);
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 3;
  if (n < 3) return 1;
  /* pipes[n] carries the grow id from rank 0 to the newcomer, process n. */
  int (*pipes)[2] = calloc(n + 1, sizeof *pipes);
  for (int r = 0; r <= n; r++)
    if (pipe(pipes[r]) != 0) return 1;
  for (int r = 0; r <= n; r++) {
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid > 0) continue;
    if (r == n) _exit(newcomer(n, pipes[n][0]));
    ncclUniqueId ids[2];
    g_rank = r;
    if (r == 0) {
      CHECK(ncclGetUniqueId(&ids[0]));
      CHECK(ncclGetUniqueId(&ids[1]));
      for (int q = 1; q < n; q++)
        if (write(pipes[q][1], ids, sizeof ids) != (ssize_t)sizeof ids) _exit(4);
    } else if (read(pipes[r][0], ids, sizeof ids) != (ssize_t)sizeof ids) {
      _exit(4);
    }
    _exit(run_rank(r, n, ids, pipes[n][1]));
  }
  int failed = 0;
  for (int r = 0; r <= n; r++) {
    int status = 0;
    if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
  }
  printf(failed ? "FAILED\n" : "OK %d ranks\n", n);
  return failed;
}
