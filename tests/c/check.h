/* Checks shared by the C programs of the C ABI tests: CHECK fails the process on any result
 * other than ncclSuccess, EXPECT on a false condition, EXPECT_ERR unless a call returns the
 * given code with a last error naming the given word. Messages carry the rank (g_rank). */
#ifndef FERROCCL_TEST_CHECK_H
#define FERROCCL_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

#endif
