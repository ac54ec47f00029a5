/*
 * softcuda's shared state (see softcuda.c): the devices' contexts, allocations, streams and
 * their queues, the checks every entry point makes, and the helpers both files use.
 */
#ifndef SOFTCUDA_H
#define SOFTCUDA_H
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../ferro_reduce.h"

typedef int CUresult;
typedef int CUdevice;
typedef uint64_t CUdeviceptr;

enum {
    OK = 0,
    E_INVALID_VALUE = 1,
    E_OUT_OF_MEMORY = 2,
    E_NOT_INITIALIZED = 3,
    E_INVALID_DEVICE = 101,
    E_INVALID_CONTEXT = 201,
    E_INVALID_HANDLE = 400,
    E_ILLEGAL_STATE = 401,
    E_NOT_FOUND = 500,
    E_NOT_READY = 600,
    E_ILLEGAL_ADDRESS = 700,
    E_PEER_ACCESS_ALREADY_ENABLED = 704,
    E_PEER_ACCESS_UNSUPPORTED = 217,
    E_NOT_PERMITTED = 800,
    E_NOT_SUPPORTED = 801,
    E_CAPTURE_UNSUPPORTED = 900,
    E_CAPTURE_INVALIDATED = 901,
    E_CAPTURE_WRONG_THREAD = 908,
};

#define MAX_DEVICES 8
#define IPC_MAGIC 0x4144554354464f53ull /* "SOFTCUDA" */
#define EVENT_INTERPROCESS 4u
#define EVENT_DISABLE_TIMING 2u
#define STREAM_NON_BLOCKING 1u

#define HIDDEN __attribute__((visibility("hidden")))
/* ---- state ---------------------------------------------------------------------------- */

struct ctx {
    int device;
    int peer[MAX_DEVICES];     /* peer access enabled to device d */
    atomic_int sticky;         /* a fault: every later call fails with it */
    struct stream* legacy;     /* made at first use */
};

struct op;

struct stream {
    struct ctx* ctx;
    unsigned flags;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct op* head;
    struct op* tail;
    uint64_t queued;           /* ops ever queued */
    atomic_uint_fast64_t done; /* ops run */
    int destroyed;
    struct stream* next;       /* in the list of all streams */
};

struct event_state {
    atomic_uint_fast64_t recorded; /* number of the last record */
    atomic_uint_fast64_t reached;  /* number of the last record its stream reached */
    atomic_uint_fast64_t when_ns;  /* when it was reached */
    atomic_int owner_gone;         /* interprocess: its owner destroyed it */
};

struct event {
    struct ctx* ctx;
    unsigned flags;
    struct event_state* st; /* own, or mapped from another process */
    int fd;                 /* interprocess: the memory file holding `st` */
    int opened;             /* opened from another process's handle */
    int destroyed;          /* cuEventDestroy called: any later use is an error */
};

/* Kinds of `alloc`: page-locked host memory, device memory of cuMemAlloc, a reserved range
   of addresses (vmm.c), a piece mapped into one. */
enum { KIND_HOST = 1, KIND_DEVICE = 2, KIND_RESERVED = 3, KIND_PIECE = 4 };

struct phys;

struct alloc {
    uint64_t base, size;
    int kind; /* KIND_* */
    int device;
    int fd;
    uint64_t id;
    int opened; /* mapped from another process (IPC): reference count */
    int exported; /* its IPC handle was taken: other processes may map it */
    pid_t from_pid;
    uint64_t from_id;
    /* A reservation or a piece: the reserved range (RANGE_START_ADDR, RANGE_SIZE); a piece:
       its physical allocation and the devices granted access (bit d: device d). */
    uint64_t range_base, range_size;
    struct phys* phys;
    unsigned access;
    struct alloc* next;
};

enum op_kind { OP_KERNEL, OP_COPY, OP_RECORD, OP_WAIT_EVENT, OP_HOST_FN, OP_WAIT_VALUE,
               OP_WRITE_VALUE, OP_WAIT_STREAM };

typedef void (*kernel_fn)(struct ferro_rc_args, uint64_t, uint64_t);

struct op {
    enum op_kind kind;
    struct op* next;
    kernel_fn fn;
    struct ferro_rc_args args;
    void* dst;
    const void* src;
    size_t len;
    struct event_state* ev;
    uint64_t seq;
    void (*host)(void*);
    void* data;
    volatile uint32_t* word;
    uint32_t value;
    unsigned wflags;
    int opened; /* a wait on an event opened from another process */
    struct stream* other;
    void* staged; /* freed with the op */
};

/* Counts a call of the entry point it opens (SOFTCUDA_COUNTS, softcuda.c): each entry point's
   first statement. */
#define COUNT()                                \
    do {                                       \
        static atomic_int slot_ = -1;          \
        count_call(__func__, &slot_);          \
    } while (0)

/* Every entry point: not from a host function on a stream, not before cuInit. */
#define CALL_CHECK()                                \
    do {                                            \
        if (in_host_fn) return E_NOT_PERMITTED;     \
        if (!g.inited) return E_NOT_INITIALIZED;    \
    } while (0)

/* ... and a current context without a fault. */
#define CTX_CHECK()                                                         \
    do {                                                                    \
        CALL_CHECK();                                                       \
        if (!current) return E_INVALID_CONTEXT;                             \
        if (atomic_load(&current->sticky)) return atomic_load(&current->sticky); \
    } while (0)

/* A call on stream `h`: the legacy stream needs a current context, another stream carries its
   own. Fails with the context's fault, if any. */
#define STREAM_CHECK(s, h)                                         \
    CALL_CHECK();                                                  \
    struct stream* s = stream_of(h);                               \
    if (!s) return E_INVALID_CONTEXT;                              \
    if (atomic_load(&s->ctx->sticky)) return atomic_load(&s->ctx->sticky)

/* A call the model refuses on a capturing stream (graph.c): CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
   and the capture is invalidated. */
#define NOT_CAPTURING(s)                           \
    do {                                           \
        CUresult r_ = refuse_capturing(s);         \
        if (r_ != OK) return r_;                   \
    } while (0)

/* A potentially unsafe call (memory allocation, synchronous copy, context synchronize): refused
   while a capture prohibits it to this thread (graph.c). */
#define SAFE_CALL()                                \
    do {                                           \
        CUresult r_ = unsafe_call();               \
        if (r_ != OK) return r_;                   \
    } while (0)

/* The model's state, one per process. */
struct softcuda {
    pthread_mutex_t mu;
    int inited;
    int ndev;
    int peer_access;
    struct ctx ctxs[MAX_DEVICES];
    struct alloc* allocs;
    struct stream* streams;
    uint64_t next_id;
    unsigned delay_us;
};
extern HIDDEN struct softcuda g;
extern HIDDEN __thread struct ctx* current;
extern HIDDEN __thread int in_host_fn;
/* Events made or opened and not destroyed (written at exit with the counts). */
extern HIDDEN atomic_long live_events;

HIDDEN void count_call(const char* name, atomic_int* slot);
HIDDEN uint64_t now_ns(void);
HIDDEN void pause_for(unsigned* tries);
HIDDEN int memory_file(const char* name, size_t size);
HIDDEN void unmap_alloc(struct alloc* a);
HIDDEN struct alloc* find_alloc_locked(uint64_t p);
HIDDEN struct alloc* find_alloc(uint64_t p);
HIDDEN void add_alloc(struct alloc* a);
HIDDEN CUresult new_alloc(uint64_t* out, size_t size, int kind, int device);
HIDDEN CUresult free_alloc(uint64_t p, int kind);
HIDDEN struct stream* new_stream(struct ctx* c, unsigned flags);
HIDDEN void enqueue(struct stream* s, struct op* o);
HIDDEN struct stream* stream_of(void* h);
HIDDEN uint64_t queued(struct stream* s);
HIDDEN void wait_stream(struct stream* s, uint64_t upto);
HIDDEN CUresult sync_stream(struct stream* s);
/* Stream capture (graph.c). capture_op: whether `s` captures; if so `o` is taken (added to the
   capture, or freed if it was invalidated) and *r is the call's result. */
HIDDEN int capture_op(struct stream* s, struct op* o, CUresult* r);
HIDDEN CUresult refuse_capturing(struct stream* s);
HIDDEN CUresult unsafe_call(void);

#endif /* SOFTCUDA_H */
