/* ferroccl's additions to the NCCL API. ferroccl's libnccl.so.2 exports these beside every
 * function of nccl.h; a program that uses them links against ferroccl only. */
#ifndef FERROCCL_H_
#define FERROCCL_H_

#include <stddef.h>

#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Host memory in shared memory. Use it for host buffers (NULL stream) like any other memory;
 * ranks on the same host then read large messages (FERRO_SHM_MAPPED_MIN, default 512 KiB)
 * straight from it instead of through the shared-memory transport's rings, one copy fewer
 * per byte. The memory is zero-filled. ncclInvalidArgument for a NULL ptr or a size of 0;
 * ncclSystemError when the system refuses the memory. */
ncclResult_t ferrocclMemAllocShared(void** ptr, size_t size);
ncclResult_t pferrocclMemAllocShared(void** ptr, size_t size);

/* Frees memory from ferrocclMemAllocShared (NULL: nothing). No operation may still use it.
 * ncclInvalidArgument for a pointer that ferrocclMemAllocShared did not return. */
ncclResult_t ferrocclMemFreeShared(void* ptr);
ncclResult_t pferrocclMemFreeShared(void* ptr);

#ifdef __cplusplus
}
#endif

#endif
