/* Device memory mapped piece by piece into one reserved range through the C ABI, on a GPU:
 * what PyTorch's expandable segments make (cuMemAddressReserve, then cuMemCreate + cuMemMap
 * per piece), where cuMemGetAddressRange answers one piece only.
 *
 *   vmm        reserve four pieces of the allocation granularity, map the first two (one
 *              physical allocation each), then on one rank with a non-NULL stream:
 *              - an allreduce out of place from a buffer spanning the two pieces into
 *                ncclMemAlloc'd memory, one back into the spanning buffer, and one in place on
 *                it, every element checked;
 *              - a buffer starting in the second piece and running into the unmapped third:
 *                refused with ncclInvalidArgument, the last error saying it runs past its
 *                memory, and nothing run (the communicator still works).
 *
 * The driver (libcuda.so.1) is opened at run time, so this program builds without CUDA.
 * Without a driver it prints SKIP and exits 77, which does not count as passed. Exit status 0
 * when every check passed. */
#include <dlfcn.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

/* cuda.h's types, as far as this program uses them (CUDA 12 and 13 alike). */
typedef unsigned long long cu_ptr;
typedef unsigned long long cu_handle;
typedef struct {
  int type; /* CU_MEM_LOCATION_TYPE_DEVICE = 1 */
  int id;
} cu_location;
typedef struct {
  int type;                  /* CU_MEM_ALLOCATION_TYPE_PINNED = 1 */
  int requested_handle_types; /* none = 0 */
  cu_location location;
  void *win32_meta;
  struct {
    unsigned char compression_type;
    unsigned char gpu_direct_rdma_capable;
    unsigned short usage;
    unsigned char reserved[4];
  } alloc_flags;
} cu_alloc_prop;
typedef struct {
  cu_location location;
  int flags; /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3 */
} cu_access;

static struct {
  int (*init)(unsigned);
  int (*device_get)(int *, int);
  int (*primary_retain)(void **, int);
  int (*ctx_set_current)(void *);
  int (*stream_create)(void **, unsigned);
  int (*stream_sync)(void *);
  int (*granularity)(size_t *, const cu_alloc_prop *, int);
  int (*reserve)(cu_ptr *, size_t, size_t, cu_ptr, unsigned long long);
  int (*address_free)(cu_ptr, size_t);
  int (*create)(cu_handle *, size_t, const cu_alloc_prop *, unsigned long long);
  int (*release)(cu_handle);
  int (*map)(cu_ptr, size_t, size_t, cu_handle, unsigned long long);
  int (*unmap)(cu_ptr, size_t);
  int (*set_access)(cu_ptr, size_t, const cu_access *, size_t);
  int (*htod)(cu_ptr, const void *, size_t);
  int (*dtoh)(void *, cu_ptr, size_t);
} cu;

#define BIND(field, name)                                   \
  do {                                                      \
    *(void **)&cu.field = dlsym(lib, name);                 \
    EXPECT(cu.field != NULL, "libcuda.so.1 has no %s", name); \
  } while (0)
#define CU(call) EXPECT((call) == 0, "%s", #call)

enum { N = 2048 }; /* floats per buffer: 8 KiB, half on each side of a piece boundary */

/* Fills `n` floats at device address `p` with `base + i`. */
static void fill(cu_ptr p, float base) {
  float *h = malloc(sizeof(float) * N);
  for (int i = 0; i < N; i++) h[i] = base + (float)i;
  CU(cu.htod(p, h, sizeof(float) * N));
  free(h);
}

/* Checks that the `n` floats at `p` read `base + i`, after the stream's work. */
static void expect(cu_ptr p, float base, void *stream, const char *what) {
  float *h = malloc(sizeof(float) * N);
  CU(cu.stream_sync(stream));
  CU(cu.dtoh(h, p, sizeof(float) * N));
  for (int i = 0; i < N; i++)
    EXPECT(h[i] == base + (float)i, "%s: [%d] = %f, want %f", what, i, h[i], base + (float)i);
  free(h);
}

int main(void) {
  g_rank = 0;
  void *lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (lib == NULL) {
    printf("SKIP: no CUDA driver (libcuda.so.1: %s)\n", dlerror());
    return 77;
  }
  BIND(init, "cuInit");
  BIND(device_get, "cuDeviceGet");
  BIND(primary_retain, "cuDevicePrimaryCtxRetain");
  BIND(ctx_set_current, "cuCtxSetCurrent");
  BIND(stream_create, "cuStreamCreate");
  BIND(stream_sync, "cuStreamSynchronize");
  BIND(granularity, "cuMemGetAllocationGranularity");
  BIND(reserve, "cuMemAddressReserve");
  BIND(address_free, "cuMemAddressFree");
  BIND(create, "cuMemCreate");
  BIND(release, "cuMemRelease");
  BIND(map, "cuMemMap");
  BIND(unmap, "cuMemUnmap");
  BIND(set_access, "cuMemSetAccess");
  BIND(htod, "cuMemcpyHtoD_v2");
  BIND(dtoh, "cuMemcpyDtoH_v2");
  CU(cu.init(0));
  int dev = 0;
  void *ctx = NULL, *stream = NULL;
  CU(cu.device_get(&dev, 0));
  CU(cu.primary_retain(&ctx, dev));
  CU(cu.ctx_set_current(ctx));
  CU(cu.stream_create(&stream, 0));

  cu_alloc_prop prop;
  memset(&prop, 0, sizeof prop);
  prop.type = 1;
  prop.location.type = 1;
  prop.location.id = dev;
  size_t piece = 0;
  CU(cu.granularity(&piece, &prop, 0));
  EXPECT(piece >= sizeof(float) * N, "a piece of %zu bytes", piece);
  cu_ptr base = 0;
  CU(cu.reserve(&base, 4 * piece, 0, 0, 0));
  cu_handle h[2];
  for (int i = 0; i < 2; i++) {
    CU(cu.create(&h[i], piece, &prop, 0));
    CU(cu.map(base + i * piece, piece, 0, h[i], 0));
  }
  cu_access access = {{1, dev}, 3};
  CU(cu.set_access(base, 2 * piece, &access, 1));
  printf("reserved 4 x %zu bytes at 0x%llx, the first two pieces mapped\n", piece, base);

  ncclUniqueId id;
  ncclComm_t comm;
  CHECK(ncclGetUniqueId(&id));
  CHECK(ncclCommInitRank(&comm, 1, id, 0));
  cudaStream_t s = (cudaStream_t)stream;
  cu_ptr span = base + piece - sizeof(float) * N / 2; /* half in each mapped piece */
  void *other = NULL;
  CHECK(ncclMemAlloc(&other, sizeof(float) * N));

  fill(span, 1.0f);
  CHECK(ncclAllReduce((void *)(uintptr_t)span, other, N, ncclFloat, ncclSum, comm, s));
  expect((cu_ptr)(uintptr_t)other, 1.0f, stream, "out of place from the spanning buffer");
  fill((cu_ptr)(uintptr_t)other, 5000.0f);
  CHECK(ncclAllReduce(other, (void *)(uintptr_t)span, N, ncclFloat, ncclSum, comm, s));
  expect(span, 5000.0f, stream, "out of place into the spanning buffer");
  fill(span, 9000.0f);
  CHECK(ncclAllReduce((void *)(uintptr_t)span, (void *)(uintptr_t)span, N, ncclFloat, ncclSum,
                      comm, s));
  expect(span, 9000.0f, stream, "in place on the spanning buffer");

  cu_ptr past = base + 2 * piece - sizeof(float) * N / 2; /* half in the unmapped third piece */
  EXPECT_ERR(ncclAllReduce((void *)(uintptr_t)past, other, N, ncclFloat, ncclSum, comm, s),
             ncclInvalidArgument, "runs past");
  EXPECT_ERR(ncclBroadcast(other, (void *)(uintptr_t)past, N, ncclFloat, 0, comm, s),
             ncclInvalidArgument, "recvbuff");
  /* nothing ran: the communicator still works */
  fill(span, 3.0f);
  CHECK(ncclAllReduce((void *)(uintptr_t)span, other, N, ncclFloat, ncclSum, comm, s));
  expect((cu_ptr)(uintptr_t)other, 3.0f, stream, "after the refused calls");

  CHECK(ncclMemFree(other));
  CHECK(ncclCommDestroy(comm));
  CU(cu.stream_sync(stream));
  CU(cu.unmap(base, 2 * piece));
  for (int i = 0; i < 2; i++) CU(cu.release(h[i]));
  CU(cu.address_free(base, 4 * piece));
  printf("OK memory mapped piece by piece: buffers across pieces work, past the mapped ones refused\n");
  return 0;
}
