/*
 * Hearth CUDA interposition shim (LD_PRELOAD).
 *
 * Turns the program's physical device allocations (cuMemAlloc_v2) into unified-memory ones
 * (cuMemAllocManaged, same size) and records every managed region, so the in-sandbox agent can
 * move a whole sandbox's device memory on the worker's command: prefetch it to the GPU before
 * an invocation, swap it out to host memory when its flow goes idle (thesis §6.3.3, §6.4.1-2).
 *
 * The CUDA driver API is a stable C ABI; the few types and prototypes used are declared here so
 * the shim builds without CUDA headers. The real driver is found lazily with dlsym(RTLD_NEXT)
 * (or in an already loaded libcuda.so.1), never loaded by the shim itself. Nothing here may
 * crash the host process: a missing driver symbol makes the intercepted call return an error.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define HEARTH_EXPORT __attribute__((visibility("default")))

/* ---- the driver ABI (cuda.h, driver API 3.2 and later) ---- */

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned int CUdeviceptr_v1; /* the pre-3.2 32-bit pointer of the legacy cuMemAlloc */
typedef int CUdevice;
typedef struct CUstream_st *CUstream;
typedef struct CUctx_st *CUcontext;
typedef struct {
    int type; /* CUmemLocationType */
    int id;
} CUmemLocation;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CU_DEVICE_CPU (-1)
#define CU_MEM_ATTACH_GLOBAL 0x1
#define CU_MEM_LOCATION_TYPE_DEVICE 0x1
#define CU_MEM_LOCATION_TYPE_HOST 0x2

typedef CUresult (*mem_alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*mem_alloc_v1_fn)(CUdeviceptr_v1 *, unsigned int);
typedef CUresult (*mem_alloc_managed_fn)(CUdeviceptr *, size_t, unsigned int);
typedef CUresult (*mem_free_fn)(CUdeviceptr);
typedef CUresult (*prefetch_fn)(CUdeviceptr, size_t, CUdevice, CUstream);
typedef CUresult (*prefetch_v2_fn)(CUdeviceptr, size_t, CUmemLocation, unsigned int, CUstream);
typedef CUresult (*ctx_sync_fn)(void);
typedef CUresult (*ctx_get_fn)(CUcontext *);
typedef CUresult (*ctx_set_fn)(CUcontext);

/* The real driver entry points; NULL until found. Guarded by `table_lock`. */
static struct {
    mem_alloc_fn mem_alloc;
    mem_alloc_v1_fn mem_alloc_v1;
    mem_alloc_managed_fn mem_alloc_managed;
    mem_free_fn mem_free;
    prefetch_fn prefetch;
    prefetch_v2_fn prefetch_v2;
    ctx_sync_fn ctx_synchronize;
    ctx_get_fn ctx_get_current;
    ctx_set_fn ctx_set_current;
    int complete; /* every symbol resolved: stop looking */
} real;

/* ---- the region table ---- */

/* Most regions recorded at once; an allocation beyond it still succeeds, unmanaged. */
#define MAX_REGIONS 65536
/* Open addressing, linear probing, load factor <= 1/2; a zero pointer marks a free slot. */
#define TABLE_SLOTS (2 * MAX_REGIONS)

struct region {
    CUdeviceptr ptr;
    size_t size;
};

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct region table[TABLE_SLOTS];
static unsigned int live_regions;
static unsigned long long live_bytes;
static unsigned long long unmanaged_allocs;
/* The context the first region was made in: the agent's thread may have none current. */
static CUcontext owner_ctx;

static void *find_symbol(const char *name)
{
    void *sym = dlsym(RTLD_NEXT, name);
    if (sym == NULL) {
        /* A driver dlopen()ed without RTLD_GLOBAL is not in the global scope. */
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (lib != NULL) {
            sym = dlsym(lib, name);
            dlclose(lib); /* drops only the reference RTLD_NOLOAD took */
        }
    }
    return sym;
}

#define RESOLVE(field, type, name)                                                              \
    do {                                                                                        \
        if (real.field == NULL)                                                                 \
            real.field = (type)find_symbol(name);                                               \
        if (real.field == NULL)                                                                 \
            missing = 1;                                                                        \
    } while (0)

/* Looks the driver up until everything is found (it may be loaded after the shim). Locked. */
static void resolve_locked(void)
{
    int missing = 0;
    if (real.complete)
        return;
    RESOLVE(mem_alloc, mem_alloc_fn, "cuMemAlloc_v2");
    RESOLVE(mem_alloc_v1, mem_alloc_v1_fn, "cuMemAlloc");
    RESOLVE(mem_alloc_managed, mem_alloc_managed_fn, "cuMemAllocManaged");
    RESOLVE(mem_free, mem_free_fn, "cuMemFree_v2");
    RESOLVE(ctx_synchronize, ctx_sync_fn, "cuCtxSynchronize");
    RESOLVE(ctx_get_current, ctx_get_fn, "cuCtxGetCurrent");
    RESOLVE(ctx_set_current, ctx_set_fn, "cuCtxSetCurrent");
    /* Either prefetch entry point will do (CUDA 13 headers map the name to _v2). */
    if (real.prefetch == NULL)
        real.prefetch = (prefetch_fn)find_symbol("cuMemPrefetchAsync");
    if (real.prefetch_v2 == NULL)
        real.prefetch_v2 = (prefetch_v2_fn)find_symbol("cuMemPrefetchAsync_v2");
    if (real.prefetch == NULL && real.prefetch_v2 == NULL)
        missing = 1;
    real.complete = !missing;
}

static size_t slot_of(CUdeviceptr ptr)
{
    /* Fibonacci hashing: allocations are aligned, so the low bits alone would cluster. */
    return (size_t)((ptr * 0x9E3779B97F4A7C15ULL) >> 47) & (TABLE_SLOTS - 1);
}

static CUcontext current_ctx_locked(void)
{
    CUcontext ctx = NULL;
    if (real.ctx_get_current != NULL && real.ctx_get_current(&ctx) != CUDA_SUCCESS)
        ctx = NULL;
    return ctx;
}

/* Records a region; a pointer already present (freed behind our back) takes the new size. */
static void record_locked(CUdeviceptr ptr, size_t size)
{
    size_t i = slot_of(ptr);
    while (table[i].ptr != 0 && table[i].ptr != ptr)
        i = (i + 1) & (TABLE_SLOTS - 1);
    if (table[i].ptr == ptr) {
        live_bytes -= table[i].size;
        table[i].size = size;
        live_bytes += size;
        return;
    }
    if (live_regions >= MAX_REGIONS) {
        unmanaged_allocs++;
        return;
    }
    table[i].ptr = ptr;
    table[i].size = size;
    live_regions++;
    live_bytes += size;
    if (owner_ctx == NULL)
        owner_ctx = current_ctx_locked();
}

/* Removes a region if recorded; backward-shift deletion keeps probe chains intact. */
static void forget_locked(CUdeviceptr ptr)
{
    size_t i = slot_of(ptr);
    while (table[i].ptr != ptr) {
        if (table[i].ptr == 0)
            return;
        i = (i + 1) & (TABLE_SLOTS - 1);
    }
    live_regions--;
    live_bytes -= table[i].size;
    size_t hole = i;
    for (size_t j = (i + 1) & (TABLE_SLOTS - 1); table[j].ptr != 0; j = (j + 1) & (TABLE_SLOTS - 1)) {
        size_t home = slot_of(table[j].ptr);
        /* j's entry may fill the hole unless its home lies cyclically in (hole, j]. */
        int stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!stays) {
            table[hole] = table[j];
            hole = j;
        }
    }
    table[hole].ptr = 0;
    table[hole].size = 0;
}

static CUresult alloc_managed(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    pthread_mutex_lock(&table_lock);
    resolve_locked();
    mem_alloc_managed_fn managed = real.mem_alloc_managed;
    pthread_mutex_unlock(&table_lock);
    if (managed == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = managed(dptr, bytesize, flags);
    if (rc == CUDA_SUCCESS && dptr != NULL && *dptr != 0) {
        pthread_mutex_lock(&table_lock);
        record_locked(*dptr, bytesize);
        pthread_mutex_unlock(&table_lock);
    }
    return rc;
}

/* ---- intercepted driver calls ---- */

HEARTH_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    pthread_mutex_lock(&table_lock);
    resolve_locked();
    int have_managed = real.mem_alloc_managed != NULL;
    mem_alloc_fn physical = real.mem_alloc;
    pthread_mutex_unlock(&table_lock);
    if (have_managed)
        return alloc_managed(dptr, bytesize, CU_MEM_ATTACH_GLOBAL);
    /* A driver without unified memory: the program gets what it asked for, unmanaged. */
    if (physical == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = physical(dptr, bytesize);
    if (rc == CUDA_SUCCESS) {
        pthread_mutex_lock(&table_lock);
        unmanaged_allocs++;
        pthread_mutex_unlock(&table_lock);
    }
    return rc;
}

/*
 * The legacy entry point returns a 32-bit pointer, which a unified-memory pointer does not fit
 * in; it is forwarded unchanged and counted as unmanaged.
 */
HEARTH_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    pthread_mutex_lock(&table_lock);
    resolve_locked();
    mem_alloc_v1_fn legacy = real.mem_alloc_v1;
    pthread_mutex_unlock(&table_lock);
    if (legacy == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = legacy(dptr, bytesize);
    if (rc == CUDA_SUCCESS) {
        pthread_mutex_lock(&table_lock);
        unmanaged_allocs++;
        pthread_mutex_unlock(&table_lock);
    }
    return rc;
}

HEARTH_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    return alloc_managed(dptr, bytesize, flags);
}

HEARTH_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    pthread_mutex_lock(&table_lock);
    resolve_locked();
    mem_free_fn free_fn = real.mem_free;
    pthread_mutex_unlock(&table_lock);
    if (free_fn == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = free_fn(dptr);
    if (rc == CUDA_SUCCESS && dptr != 0) {
        /* Only after the driver let go: a refused free leaves the region in use. */
        pthread_mutex_lock(&table_lock);
        forget_locked(dptr);
        pthread_mutex_unlock(&table_lock);
    }
    return rc;
}

/* ---- control API, called by the agent through the process-wide symbols ---- */

static CUresult prefetch_one_locked(CUdeviceptr ptr, size_t size, int device)
{
    if (real.prefetch != NULL)
        return real.prefetch(ptr, size, device, NULL);
    CUmemLocation loc;
    loc.type = device == CU_DEVICE_CPU ? CU_MEM_LOCATION_TYPE_HOST : CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = device == CU_DEVICE_CPU ? 0 : device;
    return real.prefetch_v2(ptr, size, loc, 0, NULL);
}

/*
 * Moves every recorded region to `device` (CU_DEVICE_CPU: host memory) on the default stream,
 * then waits for the moves. Every region is attempted; the first error is returned. The lock
 * is held while the moves are issued (a concurrent free cannot pull a region out from under
 * its prefetch) but not while waiting for them.
 */
HEARTH_EXPORT int hearth_shim_prefetch(int device)
{
    if (device < CU_DEVICE_CPU)
        return 1; /* CUDA_ERROR_INVALID_VALUE */
    pthread_mutex_lock(&table_lock);
    if (live_regions == 0) {
        pthread_mutex_unlock(&table_lock);
        return CUDA_SUCCESS;
    }
    resolve_locked();
    ctx_sync_fn synchronize = real.ctx_synchronize;
    ctx_set_fn set_current = real.ctx_set_current;
    if ((real.prefetch == NULL && real.prefetch_v2 == NULL) || synchronize == NULL) {
        pthread_mutex_unlock(&table_lock);
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    /* The calling thread may have no context current (the handler made it on another one). */
    int borrowed = 0;
    if (owner_ctx != NULL && set_current != NULL && current_ctx_locked() == NULL) {
        CUresult rc = set_current(owner_ctx);
        if (rc != CUDA_SUCCESS) {
            pthread_mutex_unlock(&table_lock);
            return rc;
        }
        borrowed = 1;
    }
    CUresult first = CUDA_SUCCESS;
    for (size_t i = 0; i < TABLE_SLOTS; i++) {
        if (table[i].ptr == 0)
            continue;
        CUresult rc = prefetch_one_locked(table[i].ptr, table[i].size, device);
        if (rc != CUDA_SUCCESS && first == CUDA_SUCCESS)
            first = rc;
    }
    pthread_mutex_unlock(&table_lock);
    /* Waited for even after a failed move: the ones issued must be done when we answer. */
    CUresult rc = synchronize();
    if (rc != CUDA_SUCCESS && first == CUDA_SUCCESS)
        first = rc;
    if (borrowed)
        set_current(NULL);
    return first;
}

HEARTH_EXPORT int hearth_shim_swap_out(void)
{
    return hearth_shim_prefetch(CU_DEVICE_CPU);
}

HEARTH_EXPORT unsigned long long hearth_shim_resident_bytes(void)
{
    pthread_mutex_lock(&table_lock);
    unsigned long long bytes = live_bytes;
    pthread_mutex_unlock(&table_lock);
    return bytes;
}

HEARTH_EXPORT int hearth_shim_regions(void)
{
    pthread_mutex_lock(&table_lock);
    int n = (int)live_regions;
    pthread_mutex_unlock(&table_lock);
    return n;
}

/* Allocations handed out but not recorded (table full, legacy entry point, no unified memory). */
HEARTH_EXPORT unsigned long long hearth_shim_unmanaged_allocs(void)
{
    pthread_mutex_lock(&table_lock);
    unsigned long long n = unmanaged_allocs;
    pthread_mutex_unlock(&table_lock);
    return n;
}
