/*
 * softcuda's virtual memory management (see softcuda.c for the model): a range of addresses
 * reserved (cuMemAddressReserve), physical allocations made apart from it (cuMemCreate) and
 * mapped into it piece by piece (cuMemMap), access granted per device (cuMemSetAccess), as
 * PyTorch's expandable segments use them.
 *
 * A reservation is host address space with no access (an `alloc` of kind RESERVED); a
 * physical allocation is a memory file; a mapped piece maps the file at its place in the
 * reservation (an `alloc` of kind PIECE, found before the reservation that holds it), so a
 * buffer across two pieces is one run of host addresses, as it is one run of device addresses
 * on a GPU. Pointer queries answer a piece as device memory of its allocation's device whose
 * range (RANGE_START_ADDR, RANGE_SIZE) is the whole reservation, not capable of legacy IPC;
 * an unmapped address of a reservation answers only its range and MAPPED = 0, and
 * cuMemGetAddressRange answers the one piece. A kernel reaches a piece only from a device it
 * was granted to: access is not peer access, and the owning device needs it too.
 */
#include "softcuda.h"

/* The granularity of every size and offset here (what an H100 answers). */
#define GRANULARITY (2u << 20)

struct phys {
    int fd;
    size_t size;
    int device;
    int mapped;   /* pieces mapping it */
    int released; /* cuMemRelease called: closed once no piece maps it */
};

/* The allocation properties this model reads (cuda.h's CUmemAllocationProp, its start). */
struct alloc_prop {
    int type;          /* CU_MEM_ALLOCATION_TYPE_PINNED = 1 */
    int handle_types;
    int location_type; /* CU_MEM_LOCATION_TYPE_DEVICE = 1 */
    int location_id;
};

struct access_desc {
    int location_type;
    int location_id;
    int flags; /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3 */
};

static int aligned(uint64_t v) { return v % GRANULARITY == 0; }

static void drop_phys(struct phys* p) {
    if (p->released && p->mapped == 0) {
        close(p->fd);
        free(p);
    }
}

CUresult cuMemGetAllocationGranularity(size_t* g_out, const void* prop, int option) {
    COUNT();
    CALL_CHECK();
    const struct alloc_prop* pr = prop;
    if (!g_out || !pr || option < 0 || option > 1) return E_INVALID_VALUE;
    if (pr->type != 1 || pr->location_type != 1) return E_INVALID_VALUE;
    if (pr->location_id < 0 || pr->location_id >= g.ndev) return E_INVALID_DEVICE;
    *g_out = GRANULARITY;
    return OK;
}

CUresult cuMemAddressReserve(CUdeviceptr* out, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
    COUNT();
    CALL_CHECK();
    (void)addr; /* a hint only */
    if (!out || size == 0 || !aligned(size) || flags != 0) return E_INVALID_VALUE;
    if (alignment != 0 && (alignment & (alignment - 1))) return E_INVALID_VALUE;
    size_t align = alignment > GRANULARITY ? alignment : GRANULARITY;
    /* Address space only, aligned by over-reserving and giving back the ends. */
    uint8_t* raw = mmap(NULL, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                        -1, 0);
    if (raw == MAP_FAILED) return E_OUT_OF_MEMORY;
    uintptr_t start = ((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1);
    if (start > (uintptr_t)raw) munmap(raw, start - (uintptr_t)raw);
    uintptr_t end = (uintptr_t)raw + size + align;
    if (end > start + size) munmap((void*)(start + size), end - (start + size));
    struct alloc* a = calloc(1, sizeof *a);
    a->base = start;
    a->size = size;
    a->kind = KIND_RESERVED;
    a->device = -1;
    a->fd = -1;
    a->range_base = start;
    a->range_size = size;
    add_alloc(a);
    *out = start;
    return OK;
}

/* The reservation holding all of [p, p + len) (locked). */
static struct alloc* reservation_locked(uint64_t p, uint64_t len) {
    for (struct alloc* a = g.allocs; a; a = a->next)
        if (a->kind == KIND_RESERVED && p >= a->base && p + len <= a->base + a->size) return a;
    return NULL;
}

CUresult cuMemAddressFree(CUdeviceptr p, size_t size) {
    COUNT();
    CALL_CHECK();
    pthread_mutex_lock(&g.mu);
    struct alloc** link = &g.allocs;
    int pieces = 0;
    for (struct alloc* a = g.allocs; a; a = a->next)
        if (a->kind == KIND_PIECE && a->range_base == p) pieces++;
    while (*link && !((*link)->kind == KIND_RESERVED && (*link)->base == p && (*link)->size == size))
        link = &(*link)->next;
    struct alloc* a = *link;
    if (!a || pieces) { /* unknown, or pieces still mapped in it */
        pthread_mutex_unlock(&g.mu);
        return E_INVALID_VALUE;
    }
    *link = a->next;
    pthread_mutex_unlock(&g.mu);
    unmap_alloc(a);
    return OK;
}

CUresult cuMemCreate(unsigned long long* handle, size_t size, const void* prop,
                     unsigned long long flags) {
    COUNT();
    CALL_CHECK();
    const struct alloc_prop* pr = prop;
    if (!handle || !pr || size == 0 || !aligned(size) || flags != 0) return E_INVALID_VALUE;
    if (pr->type != 1 || pr->location_type != 1) return E_INVALID_VALUE;
    if (pr->location_id < 0 || pr->location_id >= g.ndev) return E_INVALID_DEVICE;
    int fd = memory_file("softcuda-vmm", size);
    if (fd < 0) return E_OUT_OF_MEMORY;
    struct phys* ph = calloc(1, sizeof *ph);
    ph->fd = fd;
    ph->size = size;
    ph->device = pr->location_id;
    *handle = (unsigned long long)(uintptr_t)ph;
    return OK;
}

CUresult cuMemRelease(unsigned long long handle) {
    COUNT();
    CALL_CHECK();
    struct phys* ph = (struct phys*)(uintptr_t)handle;
    if (!ph || ph->released) return E_INVALID_VALUE;
    pthread_mutex_lock(&g.mu);
    ph->released = 1;
    drop_phys(ph);
    pthread_mutex_unlock(&g.mu);
    return OK;
}

CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, unsigned long long handle,
                  unsigned long long flags) {
    COUNT();
    CALL_CHECK();
    struct phys* ph = (struct phys*)(uintptr_t)handle;
    if (!ph || ph->released || size == 0 || !aligned(p) || !aligned(size) || !aligned(offset) ||
        flags != 0 || offset + size > ph->size)
        return E_INVALID_VALUE;
    pthread_mutex_lock(&g.mu);
    struct alloc* r = reservation_locked(p, size);
    int taken = 0;
    for (struct alloc* a = g.allocs; a; a = a->next)
        if (a->kind == KIND_PIECE && p < a->base + a->size && a->base < p + size) taken = 1;
    if (!r || taken) {
        pthread_mutex_unlock(&g.mu);
        return E_INVALID_VALUE;
    }
    void* m = mmap((void*)(uintptr_t)p, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                   ph->fd, (off_t)offset);
    if (m == MAP_FAILED) {
        pthread_mutex_unlock(&g.mu);
        return E_OUT_OF_MEMORY;
    }
    ph->mapped++;
    struct alloc* a = calloc(1, sizeof *a);
    a->base = p;
    a->size = size;
    a->kind = KIND_PIECE;
    a->device = ph->device;
    a->fd = -1;
    a->range_base = r->base;
    a->range_size = r->size;
    a->phys = ph;
    a->id = g.next_id++;
    a->next = g.allocs;
    g.allocs = a;
    pthread_mutex_unlock(&g.mu);
    return OK;
}

CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
    COUNT();
    CALL_CHECK();
    if (size == 0 || !aligned(p) || !aligned(size)) return E_INVALID_VALUE;
    pthread_mutex_lock(&g.mu);
    if (!reservation_locked(p, size)) {
        pthread_mutex_unlock(&g.mu);
        return E_INVALID_VALUE;
    }
    struct alloc** link = &g.allocs;
    while (*link) {
        struct alloc* a = *link;
        if (a->kind == KIND_PIECE && a->base >= p && a->base + a->size <= p + size) {
            *link = a->next;
            /* Back to address space with no access, as the reservation holds it. */
            mmap((void*)(uintptr_t)a->base, a->size, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
            struct phys* ph = a->phys;
            ph->mapped--;
            drop_phys(ph);
            free(a);
        } else {
            link = &a->next;
        }
    }
    pthread_mutex_unlock(&g.mu);
    return OK;
}

CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const void* desc, size_t count) {
    COUNT();
    CALL_CHECK();
    const struct access_desc* d = desc;
    if (!d || count == 0 || size == 0) return E_INVALID_VALUE;
    for (size_t i = 0; i < count; i++)
        if (d[i].location_type != 1 || d[i].location_id < 0 || d[i].location_id >= g.ndev)
            return E_INVALID_DEVICE;
    pthread_mutex_lock(&g.mu);
    /* Every byte of the range must be mapped: the pieces inside it must cover it. */
    uint64_t covered = 0;
    for (struct alloc* a = g.allocs; a; a = a->next)
        if (a->kind == KIND_PIECE && a->base >= p && a->base + a->size <= p + size)
            covered += a->size;
    if (covered != size) {
        pthread_mutex_unlock(&g.mu);
        return E_INVALID_VALUE;
    }
    for (struct alloc* a = g.allocs; a; a = a->next) {
        if (a->kind != KIND_PIECE || a->base < p || a->base + a->size > p + size) continue;
        for (size_t i = 0; i < count; i++) {
            unsigned bit = 1u << d[i].location_id;
            if (d[i].flags == 3) a->access |= bit;
            else if (d[i].flags == 0) a->access &= ~bit;
        }
    }
    pthread_mutex_unlock(&g.mu);
    return OK;
}
