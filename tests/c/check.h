/* Checks shared by the C programs of the C ABI tests: CHECK fails the process on any result
 * other than ncclSuccess, EXPECT on a false condition, EXPECT_ERR unless a call returns the
 * given code with a last error naming the given word. Messages carry the rank (g_rank). */
#ifndef FERROCCL_TEST_CHECK_H
#define FERROCCL_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int g_rank = -1;

/* FERROCCL_TEST_TRACE set: CHECK names each call on stderr before making it, so a program
 * that hangs shows where. */
static inline int trace_calls(void) {
  static int on = -1;
  if (on < 0) on = getenv("FERROCCL_TEST_TRACE") != NULL;
  return on;
}

#define CHECK(call)                                                                      \
  do {                                                                                   \
    if (trace_calls()) fprintf(stderr, "rank %d: %s:%d: %s\n", g_rank, __FILE__, __LINE__, \
                               #call);                                                   \
    ncclResult_t r_ = (call);                                                            \
    if (r_ != ncclSuccess) {                                                             \
      fprintf(stderr, "rank %d: %s:%d: %s returned %d (%s): %s\n", g_rank, __FILE__,     \
              __LINE__, #call, (int)r_, ncclGetErrorString(r_), ncclGetLastError(NULL)); \
      exit(2);                                                                           \
    }                                                                                    \
  } while (0)

#define EXPECT(cond, ...)                                                          \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      fprintf(stderr, "rank %d: %s:%d: expected %s: ", g_rank, __FILE__, __LINE__, \
              #cond);                                                              \
      fprintf(stderr, __VA_ARGS__);                                                \
      fprintf(stderr, "\n");                                                       \
      exit(3);                                                                     \
    }                                                                              \
  } while (0)

#define EXPECT_ERR(call, code, word)                                                         \
  do {                                                                                       \
    ncclResult_t r_ = (call);                                                                \
    const char *m_ = ncclGetLastError(NULL);                                                 \
    EXPECT(r_ == (code), "%s returned %d, wanted %d (%s)", #call, (int)r_, (int)(code), m_); \
    EXPECT(strstr(m_, (word)) != NULL, "last error \"%s\" names \"%s\"", m_, (word));        \
  } while (0)

/* Runs rank_main(rank, n, id, arg) in n forked processes, each exiting with what it returns
 * (it may exit itself). Rank 0 makes the unique id and sends it to the others by pipe; with
 * own_ids every rank makes its own (NCCL_COMM_ID names the root). Returns 1 where a process
 * could not start or did not exit 0, else 0; the caller prints the verdict. */
static inline int fork_ranks(int n, int own_ids, int (*rank_main)(int, int, ncclUniqueId, void *),
                             void *arg) {
  int (*pipes)[2] = calloc(n, sizeof *pipes);
  if (pipes == NULL) return 1;
  for (int r = 0; r < n; r++)
    if (pipe(pipes[r]) != 0) return 1;
  fflush(stdout);
  for (int r = 0; r < n; r++) {
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid > 0) continue;
    ncclUniqueId id;
    g_rank = r;
    if (own_ids || r == 0) {
      CHECK(ncclGetUniqueId(&id));
      if (!own_ids)
        for (int q = 1; q < n; q++)
          if (write(pipes[q][1], &id, sizeof id) != (ssize_t)sizeof id) _exit(4);
    } else if (read(pipes[r][0], &id, sizeof id) != (ssize_t)sizeof id) {
      _exit(4);
    }
    int rc = rank_main(r, n, id, arg);
    fflush(stdout);
    _exit(rc);
  }
  int failed = 0;
  for (int r = 0; r < n; r++) {
    int status = 0;
    if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
  }
  free(pipes);
  return failed;
}

#endif
