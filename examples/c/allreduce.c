/* A plain NCCL program: N processes (fork) share a unique id through a pipe, each sums a host
 * buffer with ncclAllReduce on a NULL stream, and checks the result. Built against ferroccl's
 * nccl.h and linked with ferroccl's libnccl.so.2 instead of NVIDIA's:
 *
 *   scripts/build-capi.sh
 *   gcc -I include examples/c/allreduce.c -L target/release -lnccl -o target/allreduce_c
 *   LD_LIBRARY_PATH=target/release target/allreduce_c 4
 */
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define NCCLCHECK(call)                                                             \
  do {                                                                              \
    ncclResult_t r_ = (call);                                                       \
    if (r_ != ncclSuccess) {                                                        \
      fprintf(stderr, "%s failed: %s (%s)\n", #call, ncclGetErrorString(r_),        \
              ncclGetLastError(NULL));                                              \
      exit(1);                                                                      \
    }                                                                               \
  } while (0)

static int rank_main(int rank, int nranks, ncclUniqueId id) {
  ncclComm_t comm;
  NCCLCHECK(ncclCommInitRank(&comm, nranks, id, rank));
  enum { COUNT = 1 << 20 };
  float *buf = malloc(COUNT * sizeof(float));
  for (int i = 0; i < COUNT; i++) buf[i] = (float)(rank + 1);
  /* A NULL stream: host memory, and the call returns when the result is there. */
  NCCLCHECK(ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL));
  float want = (float)(nranks * (nranks + 1) / 2);
  for (int i = 0; i < COUNT; i++) {
    if (buf[i] != want) {
      fprintf(stderr, "rank %d: element %d is %f, expected %f\n", rank, i, buf[i], want);
      return 1;
    }
  }
  printf("rank %d of %d: allreduce of %d floats ok (%g)\n", rank, nranks, COUNT, want);
  fflush(stdout);
  NCCLCHECK(ncclCommDestroy(comm));
  free(buf);
  return 0;
}

int main(int argc, char **argv) {
  int nranks = argc > 1 ? atoi(argv[1]) : 2;
  int fds[2];
  if (nranks < 1 || pipe(fds) != 0) return 1;
  for (int r = 0; r < nranks; r++) {
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid > 0) continue;
    ncclUniqueId id;
    if (r == 0) {
      NCCLCHECK(ncclGetUniqueId(&id));
      for (int q = 1; q < nranks; q++)
        if (write(fds[1], &id, sizeof id) != (ssize_t)sizeof id) _exit(1);
    } else if (read(fds[0], &id, sizeof id) != (ssize_t)sizeof id) {
      _exit(1);
    }
    fflush(stdout);
    _exit(rank_main(r, nranks, id));
  }
  int failed = 0;
  for (int r = 0; r < nranks; r++) {
    int status;
    if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
  }
  return failed;
}
