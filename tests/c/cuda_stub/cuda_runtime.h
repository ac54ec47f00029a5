/* Just enough of CUDA's runtime header for NVIDIA's nccl.h to compile without CUDA, so that
 * the C tests can be built against NVIDIA's header too. */
#ifndef FERROCCL_TEST_CUDA_RUNTIME_H
#define FERROCCL_TEST_CUDA_RUNTIME_H
#include <stddef.h>
#define CUDART_VERSION 12000
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
#endif
