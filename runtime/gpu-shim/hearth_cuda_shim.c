/*
 * Hearth CUDA interposition shim (LD_PRELOAD).
 *
 * Turns the program's physical device allocations (cuMemAlloc_v2) into unified-memory ones
 * (cuMemAllocManaged, same size) and records every managed region, so the in-sandbox agent can
 * move a whole sandbox's device memory on the worker's command: prefetch it to the GPU before
 * an invocation, swap it out to host memory when its flow goes idle (thesis §6.3.3, §6.4.1-2).
 *
 * The CUDA runtime (libcudart, hence PyTorch) does not call the driver's exported symbols: it
 * dlopen()s libcuda.so.1 itself, dlsym()s cuGetProcAddress(_v2) from that handle and resolves
 * every other entry point through it. So the shim also wraps cuGetProcAddress(_v2), handing
 * back its own entry points for the calls it manages, and interposes dlsym() for exactly those
 * two names looked up in the driver, so that the runtime is given the wrapped one.
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
#include <string.h>

#define HEARTH_EXPORT __attribute__((visibility("default")))

/*
 * dlsym() is interposed only where its caller can be preserved exactly (see "the dlsym hook"
 * below): glibc on x86_64, whose original dlsym carries the base version GLIBC_2.2.5.
 */
#if defined(__GLIBC__) && defined(__x86_64__)
#define HEARTH_DLSYM_HOOK 1
#define DLSYM_BASE_VERSION "GLIBC_2.2.5"
#endif

/* ---- the driver ABI (cuda.h, driver API 3.2 and later) ---- */

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned int CUdeviceptr_v1; /* the pre-3.2 32-bit pointer of the legacy cuMemAlloc */
typedef int CUdevice;
typedef unsigned long long cuuint64_t;
typedef int CUdriverProcAddressQueryResult; /* an enum: int-sized */
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
/* cuGetProcAddress: the CUDA version from which "cuMemAlloc"/"cuMemFree" mean the _v2 ABI... */
#define CUDA_VERSION_V2_MEM 3020
/* ...and from which "cuGetProcAddress" means cuGetProcAddress_v2 (cudaTypedefs.h, 12.0). */
#define CUDA_VERSION_V2_GET_PROC 12000

typedef CUresult (*mem_alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*mem_alloc_v1_fn)(CUdeviceptr_v1 *, unsigned int);
typedef CUresult (*mem_alloc_managed_fn)(CUdeviceptr *, size_t, unsigned int);
typedef CUresult (*mem_free_fn)(CUdeviceptr);
typedef CUresult (*prefetch_fn)(CUdeviceptr, size_t, CUdevice, CUstream);
typedef CUresult (*prefetch_v2_fn)(CUdeviceptr, size_t, CUmemLocation, unsigned int, CUstream);
typedef CUresult (*ctx_sync_fn)(void);
typedef CUresult (*ctx_get_fn)(CUcontext *);
typedef CUresult (*ctx_set_fn)(CUcontext);
typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*get_proc_v2_fn)(const char *, void **, int, cuuint64_t,
                                   CUdriverProcAddressQueryResult *);

/*
 * The real driver entry points; NULL until found. Each is set once (first writer wins) and read
 * with atomic loads, without a lock: they are looked up with dlsym/dlopen, which take the
 * loader's lock, and a thread holding that lock (a library constructor) may call into the shim.
 */
static struct {
    void *mem_alloc;
    void *mem_alloc_v1;
    void *mem_alloc_managed;
    void *mem_free;
    void *prefetch;
    void *prefetch_v2;
    void *ctx_synchronize;
    void *ctx_get_current;
    void *ctx_set_current;
    void *get_proc;
    void *get_proc_v2;
    int complete; /* every symbol resolve() needs was found: stop looking */
} real;

#define LOAD(field) __atomic_load_n(&real.field, __ATOMIC_ACQUIRE)

/* Sets a still empty entry point; returns whether `fn` is the one now held. */
static int adopt(void **slot, void *fn)
{
    void *expected = NULL;
    if (fn == NULL)
        return 0;
    if (__atomic_compare_exchange_n(slot, &expected, fn, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return 1;
    return expected == fn;
}

/* ---- looking symbols up ---- */

#ifdef HEARTH_DLSYM_HOOK
typedef void *(*dlsym_fn)(void *, const char *);

static dlsym_fn next_dlsym_ptr;
/* Set while this thread looks the real dlsym up: a dlsym call made meanwhile must not recurse. */
static __thread int finding_dlsym __attribute__((tls_model("initial-exec")));

/* The dlsym after the shim's (glibc's, or another interposer's); NULL if it cannot be found. */
static dlsym_fn next_dlsym(void)
{
    dlsym_fn next = __atomic_load_n(&next_dlsym_ptr, __ATOMIC_ACQUIRE);
    if (next != NULL || finding_dlsym)
        return next;
    finding_dlsym = 1;
    next = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", DLSYM_BASE_VERSION);
    finding_dlsym = 0;
    if (next != NULL)
        __atomic_store_n(&next_dlsym_ptr, next, __ATOMIC_RELEASE);
    return next;
}

/* Found before any code of the program runs, so a lookup is never the first to need it. */
__attribute__((constructor)) static void find_next_dlsym(void)
{
    (void)next_dlsym();
}

/* The shim's own lookups skip its dlsym: RTLD_NEXT is then relative to the shim, as intended. */
static void *lookup(void *handle, const char *name)
{
    dlsym_fn next = next_dlsym();
    return next != NULL ? next(handle, name) : NULL;
}
#else
static void *lookup(void *handle, const char *name)
{
    return dlsym(handle, name);
}
#endif

static void *find_symbol(const char *name)
{
    void *sym = lookup(RTLD_NEXT, name);
    if (sym == NULL) {
        /* A driver dlopen()ed without RTLD_GLOBAL is not in the global scope. */
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (lib != NULL) {
            sym = lookup(lib, name);
            dlclose(lib); /* drops only the reference RTLD_NOLOAD took */
        }
    }
    return sym;
}

/* The entry point in `slot`, looked up by `name` when still unknown; NULL if not found. */
static void *entry_point(void **slot, const char *name)
{
    void *fn = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (fn == NULL) {
        adopt(slot, find_symbol(name));
        fn = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    }
    return fn;
}

/* Looks the driver up until everything is found (it may be loaded after the shim). No lock. */
static void resolve(void)
{
    if (__atomic_load_n(&real.complete, __ATOMIC_ACQUIRE))
        return;
    int missing = 0;
    missing |= entry_point(&real.mem_alloc, "cuMemAlloc_v2") == NULL;
    missing |= entry_point(&real.mem_alloc_v1, "cuMemAlloc") == NULL;
    missing |= entry_point(&real.mem_alloc_managed, "cuMemAllocManaged") == NULL;
    missing |= entry_point(&real.mem_free, "cuMemFree_v2") == NULL;
    missing |= entry_point(&real.ctx_synchronize, "cuCtxSynchronize") == NULL;
    missing |= entry_point(&real.ctx_get_current, "cuCtxGetCurrent") == NULL;
    missing |= entry_point(&real.ctx_set_current, "cuCtxSetCurrent") == NULL;
    /* Either prefetch entry point will do (CUDA 13 headers map the name to _v2). */
    void *prefetch = entry_point(&real.prefetch, "cuMemPrefetchAsync");
    void *prefetch_v2 = entry_point(&real.prefetch_v2, "cuMemPrefetchAsync_v2");
    missing |= (prefetch == NULL && prefetch_v2 == NULL);
    if (!missing)
        __atomic_store_n(&real.complete, 1, __ATOMIC_RELEASE);
}

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

static size_t slot_of(CUdeviceptr ptr)
{
    /* Fibonacci hashing: allocations are aligned, so the low bits alone would cluster. */
    return (size_t)((ptr * 0x9E3779B97F4A7C15ULL) >> 47) & (TABLE_SLOTS - 1);
}

static CUcontext current_ctx_locked(void)
{
    CUcontext ctx = NULL;
    ctx_get_fn get = (ctx_get_fn)LOAD(ctx_get_current);
    if (get != NULL && get(&ctx) != CUDA_SUCCESS)
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
    resolve();
    mem_alloc_managed_fn managed = (mem_alloc_managed_fn)LOAD(mem_alloc_managed);
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

static void count_unmanaged(void)
{
    pthread_mutex_lock(&table_lock);
    unmanaged_allocs++;
    pthread_mutex_unlock(&table_lock);
}

/* ---- intercepted driver calls ---- */

HEARTH_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    resolve();
    if (LOAD(mem_alloc_managed) != NULL)
        return alloc_managed(dptr, bytesize, CU_MEM_ATTACH_GLOBAL);
    /* A driver without unified memory: the program gets what it asked for, unmanaged. */
    mem_alloc_fn physical = (mem_alloc_fn)LOAD(mem_alloc);
    if (physical == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = physical(dptr, bytesize);
    if (rc == CUDA_SUCCESS)
        count_unmanaged();
    return rc;
}

/*
 * The legacy entry point returns a 32-bit pointer, which a unified-memory pointer does not fit
 * in; it is forwarded unchanged and counted as unmanaged.
 */
HEARTH_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    resolve();
    mem_alloc_v1_fn legacy = (mem_alloc_v1_fn)LOAD(mem_alloc_v1);
    if (legacy == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = legacy(dptr, bytesize);
    if (rc == CUDA_SUCCESS)
        count_unmanaged();
    return rc;
}

HEARTH_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    return alloc_managed(dptr, bytesize, flags);
}

HEARTH_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    resolve();
    mem_free_fn free_fn = (mem_free_fn)LOAD(mem_free);
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

/* ---- entry points handed out by cuGetProcAddress ---- */

HEARTH_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                        cuuint64_t flags);
HEARTH_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                           cuuint64_t flags,
                                           CUdriverProcAddressQueryResult *symbolStatus);

/*
 * The shim's own addresses of its wrappers. Taking the address of an exported name would go
 * through the global scope, which is the driver's definition when the shim is not first in it.
 */
#define OWN(local, name)                                                                        \
    extern __typeof(name) local __attribute__((alias(#name), visibility("hidden")))
OWN(own_mem_alloc, cuMemAlloc_v2);
OWN(own_mem_alloc_managed, cuMemAllocManaged);
OWN(own_mem_free, cuMemFree_v2);
OWN(own_get_proc, cuGetProcAddress);
OWN(own_get_proc_v2, cuGetProcAddress_v2);

/*
 * What a caller of cuGetProcAddress(_v2) is given for the driver's answer `fn` to `symbol` at
 * `version`: the shim's wrapper with the same ABI, or `fn` itself for a call the shim leaves
 * alone. The symbol is the base name and the version picks the ABI (driver API, "Driver Entry
 * Point Access"): "cuMemAlloc" and "cuMemFree" are the _v2 calls from 3.2 on and the legacy
 * 32-bit ones before, which are not managed; "cuGetProcAddress" is _v2 from 12.0 on. The
 * driver's answer is kept as the shim's own entry point where it has none yet.
 */
static void *wrap_entry(const char *symbol, int version, void *fn)
{
    void *own;
    void **slot;
    if (strcmp(symbol, "cuMemAlloc") == 0 && version >= CUDA_VERSION_V2_MEM) {
        own = (void *)own_mem_alloc;
        slot = &real.mem_alloc;
    } else if (strcmp(symbol, "cuMemFree") == 0 && version >= CUDA_VERSION_V2_MEM) {
        own = (void *)own_mem_free;
        slot = &real.mem_free;
    } else if (strcmp(symbol, "cuMemAllocManaged") == 0) {
        own = (void *)own_mem_alloc_managed;
        slot = &real.mem_alloc_managed;
    } else if (strcmp(symbol, "cuGetProcAddress") == 0 && version >= CUDA_VERSION_V2_GET_PROC) {
        own = (void *)own_get_proc_v2;
        slot = &real.get_proc_v2;
    } else if (strcmp(symbol, "cuGetProcAddress") == 0) {
        own = (void *)own_get_proc;
        slot = &real.get_proc;
    } else {
        return fn;
    }
    if (fn == own)
        return fn; /* never adopt the shim's own wrapper: it would forward to itself */
    adopt(slot, fn);
    return own;
}

/* Forwards to the driver; on success, the calls the shim manages come back wrapped. */
HEARTH_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                           cuuint64_t flags,
                                           CUdriverProcAddressQueryResult *symbolStatus)
{
    get_proc_v2_fn next = (get_proc_v2_fn)entry_point(&real.get_proc_v2, "cuGetProcAddress_v2");
    if (next == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = next(symbol, pfn, cudaVersion, flags, symbolStatus);
    /* Since 12.0 a symbol the driver lacks is a success with a NULL pointer: left as it is. */
    if (rc == CUDA_SUCCESS && symbol != NULL && pfn != NULL && *pfn != NULL)
        *pfn = wrap_entry(symbol, cudaVersion, *pfn);
    return rc;
}

/* The CUDA 11.3-11.8 form, without the status. */
HEARTH_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                        cuuint64_t flags)
{
    get_proc_fn next = (get_proc_fn)entry_point(&real.get_proc, "cuGetProcAddress");
    if (next == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = next(symbol, pfn, cudaVersion, flags);
    if (rc == CUDA_SUCCESS && symbol != NULL && pfn != NULL && *pfn != NULL)
        *pfn = wrap_entry(symbol, cudaVersion, *pfn);
    return rc;
}

/* ---- the dlsym hook ---- */

#ifdef HEARTH_DLSYM_HOOK
/*
 * The runtime finds cuGetProcAddress(_v2) with dlsym on its own handle of libcuda.so.1, which
 * LD_PRELOAD does not reach; dlsym itself is the one place to step in. It is done narrowly:
 * only those two names, only on a real handle (not RTLD_DEFAULT or RTLD_NEXT), only when the
 * answer lies in a libcuda.so* and the caller does not (a driver that loads another driver
 * library and wires it up by dlsym is left to do so), and only when that driver's function is
 * the one the wrapper forwards to. Every other call reaches the real dlsym by a jump, not a call:
 * dlsym reads its caller's return address (RTLD_NEXT, RTLD_DEFAULT's scope), which must be
 * the program's, never the shim's.
 */

/* Whether `addr` lies in a loaded libcuda.so or libcuda.so.N... (the driver, or its mock). */
static int in_libcuda(const void *addr)
{
    Dl_info info;
    if (addr == NULL || dladdr(addr, &info) == 0 || info.dli_fname == NULL)
        return 0;
    const char *base = strrchr(info.dli_fname, '/');
    base = base != NULL ? base + 1 : info.dli_fname;
    return strncmp(base, "libcuda.so", 10) == 0 && (base[10] == '\0' || base[10] == '.');
}

static int is_get_proc_name(const char *symbol)
{
    return symbol != NULL && strncmp(symbol, "cuGetProcAddress", 16) == 0 &&
           (symbol[16] == '\0' || strcmp(symbol + 16, "_v2") == 0);
}

/* Stands in for dlsym when the real one cannot be found (or is being looked up): not found. */
static void *no_dlsym(void *handle, const char *symbol)
{
    (void)handle;
    (void)symbol;
    return NULL;
}

/* dlsym(libcuda handle, "cuGetProcAddress[_v2]"): the shim's wrapper in place of the driver's. */
static void *dlsym_get_proc(void *handle, const char *symbol)
{
    dlsym_fn next = next_dlsym();
    void *sym = next != NULL ? next(handle, symbol) : NULL;
    if (sym == NULL || !in_libcuda(sym))
        return sym;
    if (symbol[16] == '\0')
        return adopt(&real.get_proc, sym) ? (void *)own_get_proc : sym;
    return adopt(&real.get_proc_v2, sym) ? (void *)own_get_proc_v2 : sym;
}

/* Picks the function dlsym jumps to with its arguments unchanged; `caller` is its return address. */
__attribute__((visibility("hidden"))) void *hearth_dlsym_route(void *handle, const char *symbol,
                                                                const void *caller);
__attribute__((visibility("hidden"))) void *hearth_dlsym_route(void *handle, const char *symbol,
                                                                const void *caller)
{
    dlsym_fn next = next_dlsym();
    if (next == NULL)
        return (void *)no_dlsym;
    if (handle == RTLD_DEFAULT || handle == RTLD_NEXT || !is_get_proc_name(symbol) ||
        in_libcuda(caller))
        return (void *)next;
    return (void *)dlsym_get_proc;
}

/*
 * dlsym(handle, symbol): saves the arguments, asks hearth_dlsym_route (passing the return
 * address) where to go, restores them and jumps there, so the target returns straight to the
 * program with the program's return address on the stack.
 */
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym, @function\n"
        ".p2align 4\n"
        "dlsym:\n"
        ".cfi_startproc\n"
#if defined(__CET__) && (__CET__ & 1)
        "endbr64\n"
#endif
        "pushq %rdi\n"
        ".cfi_adjust_cfa_offset 8\n"
        "pushq %rsi\n"
        ".cfi_adjust_cfa_offset 8\n"
        "subq $8, %rsp\n" /* 16-byte alignment at the call */
        ".cfi_adjust_cfa_offset 8\n"
        "movq 24(%rsp), %rdx\n"
        "call hearth_dlsym_route\n"
        "addq $8, %rsp\n"
        ".cfi_adjust_cfa_offset -8\n"
        "popq %rsi\n"
        ".cfi_adjust_cfa_offset -8\n"
        "popq %rdi\n"
        ".cfi_adjust_cfa_offset -8\n"
        "jmp *%rax\n"
        ".cfi_endproc\n"
        ".size dlsym, .-dlsym\n");
#endif

/* ---- control API, called by the agent through the process-wide symbols ---- */

static CUresult prefetch_one_locked(CUdeviceptr ptr, size_t size, int device)
{
    prefetch_fn prefetch = (prefetch_fn)LOAD(prefetch);
    if (prefetch != NULL)
        return prefetch(ptr, size, device, NULL);
    CUmemLocation loc;
    loc.type = device == CU_DEVICE_CPU ? CU_MEM_LOCATION_TYPE_HOST : CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = device == CU_DEVICE_CPU ? 0 : device;
    return ((prefetch_v2_fn)LOAD(prefetch_v2))(ptr, size, loc, 0, NULL);
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
    unsigned int regions = live_regions;
    pthread_mutex_unlock(&table_lock);
    if (regions == 0)
        return CUDA_SUCCESS;
    resolve();
    ctx_sync_fn synchronize = (ctx_sync_fn)LOAD(ctx_synchronize);
    ctx_set_fn set_current = (ctx_set_fn)LOAD(ctx_set_current);
    if ((LOAD(prefetch) == NULL && LOAD(prefetch_v2) == NULL) || synchronize == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&table_lock);
    if (live_regions == 0) {
        pthread_mutex_unlock(&table_lock);
        return CUDA_SUCCESS;
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
