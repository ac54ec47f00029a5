/* Just enough of CUDA's runtime header for NVIDIA's nccl.h to compile without CUDA, so that
 * the C tests can be built against NVIDIA's header too, and for the test programs to order
 * their work on a stream: cudaStreamSynchronize and cudaMemcpyAsync go through ferroccl's
 * device provider (exported by its libnccl.so.2 for tests; not part of NCCL's API). With
 * FERRO_DEVICE_PROVIDER=host the stream is the host stand-in's model of one (identified by
 * the cudaStream_t's value): a synchronize runs the copies and completion-flag waits queued
 * on it, in order. With the cuda provider they are cuStreamSynchronize and cuMemcpyAsync. */
#ifndef FERROCCL_TEST_CUDA_RUNTIME_H
#define FERROCCL_TEST_CUDA_RUNTIME_H
#include <stddef.h>
#define CUDART_VERSION 12000
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef int cudaError_t;
#define cudaSuccess 0
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};
int ferrocclStreamSynchronize(cudaStream_t stream);
int ferrocclMemcpyAsync(void *dst, const void *src, size_t bytes, cudaStream_t stream);
static inline cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  return ferrocclStreamSynchronize(stream) == 0 ? cudaSuccess : 1;
}
static inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes,
                                          enum cudaMemcpyKind kind, cudaStream_t stream) {
  (void)kind; /* the provider tells host from device memory itself */
  return ferrocclMemcpyAsync(dst, src, bytes, stream) == 0 ? cudaSuccess : 1;
}
#endif
