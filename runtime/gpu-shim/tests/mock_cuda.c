/*
 * Test-only stand-in for the CUDA driver, built as libcuda.so.1: hands out fake pointers and
 * appends one line per call to the file named by HEARTH_MOCK_CUDA_LOG, e.g.
 *   cuMemAllocManaged ptr=0x700000000000 size=4096 flags=1 ctx=0x1000 rc=0
 * Like the real driver, calls that need a context fail with CUDA_ERROR_INVALID_CONTEXT when the
 * calling thread has none. mock_cuda_fail() makes one entry point return a chosen error.
 * cuGetProcAddress(_v2) answer by base name and version as the driver documents it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned int CUdeviceptr_v1;
typedef int CUdevice;
typedef unsigned long long cuuint64_t;
typedef int CUdriverProcAddressQueryResult;
typedef struct CUstream_st *CUstream;
typedef struct CUctx_st *CUcontext;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_NOT_FOUND 500
#define CU_GET_PROC_ADDRESS_SUCCESS 0
#define CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND 1
#define CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT 2
/* The CUDA version this mock driver supports: a cuGetProcAddress for a newer one is refused. */
#define MOCK_DRIVER_VERSION 12080

#define EXPORT __attribute__((visibility("default")))

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int log_fd = -2; /* -2: not opened yet, -1: no log */
static CUdeviceptr next_ptr = 0x700000000000ULL;
static CUdeviceptr_v1 next_ptr_v1 = 0x10000000U;
static unsigned int handed_out;
static int scatter;
static __thread CUcontext current;

enum {
    F_ALLOC,
    F_ALLOC_V1,
    F_MANAGED,
    F_FREE,
    F_FREE_V1,
    F_PREFETCH,
    F_SYNC,
    F_GET_PROC,
    F_GET_PROC_V2,
    F_COUNT
};
static const char *const names[F_COUNT] = {
    "cuMemAlloc_v2",      "cuMemAlloc",       "cuMemAllocManaged", "cuMemFree_v2",
    "cuMemFree",          "cuMemPrefetchAsync", "cuCtxSynchronize", "cuGetProcAddress",
    "cuGetProcAddress_v2",
};
static CUresult forced[F_COUNT];

static void logf_(const char *fmt, ...)
{
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if (n > (int)sizeof line - 2)
        n = (int)sizeof line - 2;
    line[n++] = '\n';
    pthread_mutex_lock(&lock);
    if (log_fd == -2) {
        const char *path = getenv("HEARTH_MOCK_CUDA_LOG");
        log_fd = path ? open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600) : -1;
    }
    if (log_fd >= 0 && write(log_fd, line, (size_t)n) != n)
        log_fd = -1;
    pthread_mutex_unlock(&lock);
}

static CUresult outcome(int which)
{
    pthread_mutex_lock(&lock);
    CUresult rc = forced[which];
    pthread_mutex_unlock(&lock);
    return rc;
}

/* Makes `name` return `rc` from now on (0 restores success); -1 if the name is unknown. */
EXPORT int mock_cuda_fail(const char *name, int rc)
{
    for (int i = 0; i < F_COUNT; i++) {
        if (strcmp(names[i], name) == 0) {
            pthread_mutex_lock(&lock);
            forced[i] = rc;
            pthread_mutex_unlock(&lock);
            return 0;
        }
    }
    return -1;
}

/*
 * Scattered pointers (a bijection of the allocation count, page-aligned, distinct) make the
 * shim's table see collisions; sequential ones hash too evenly to exercise them.
 */
EXPORT void mock_cuda_scatter(int on)
{
    pthread_mutex_lock(&lock);
    scatter = on;
    pthread_mutex_unlock(&lock);
}

static CUdeviceptr take(size_t size)
{
    size_t step = (size + 4095) & ~(size_t)4095;
    pthread_mutex_lock(&lock);
    CUdeviceptr p;
    if (scatter) {
        unsigned int x = handed_out++ * 2654435761U;
        x ^= x >> 15;
        x *= 0x2c1b3c6dU;
        x ^= x >> 12;
        p = 0x100000000000ULL + ((CUdeviceptr)x << 12);
    } else {
        p = next_ptr;
        next_ptr += step ? step : 4096;
    }
    pthread_mutex_unlock(&lock);
    return p;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *ctx)
{
    if (ctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *ctx = current;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    current = ctx;
    logf_("cuCtxSetCurrent ctx=%p rc=0", (void *)ctx);
    return CUDA_SUCCESS;
}

static CUresult alloc_common(int which, CUdeviceptr *dptr, size_t size, unsigned int flags)
{
    CUresult rc = current == NULL ? CUDA_ERROR_INVALID_CONTEXT : outcome(which);
    if (rc == CUDA_SUCCESS && (dptr == NULL || size == 0))
        rc = CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr p = 0;
    if (rc == CUDA_SUCCESS) {
        p = take(size);
        *dptr = p;
    }
    logf_("%s ptr=0x%llx size=%zu flags=%u ctx=%p rc=%d", names[which], p, size, flags,
          (void *)current, rc);
    return rc;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
    return alloc_common(F_ALLOC, dptr, size, 0);
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags)
{
    return alloc_common(F_MANAGED, dptr, size, flags);
}

EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int size)
{
    CUresult rc = current == NULL ? CUDA_ERROR_INVALID_CONTEXT : outcome(F_ALLOC_V1);
    CUdeviceptr_v1 p = 0;
    if (rc == CUDA_SUCCESS) {
        pthread_mutex_lock(&lock);
        p = next_ptr_v1;
        next_ptr_v1 += 4096;
        pthread_mutex_unlock(&lock);
        *dptr = p;
    }
    logf_("cuMemAlloc ptr=0x%x size=%u ctx=%p rc=%d", p, size, (void *)current, rc);
    return rc;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr ptr)
{
    CUresult rc = outcome(F_FREE);
    logf_("cuMemFree_v2 ptr=0x%llx rc=%d", ptr, rc);
    return rc;
}

EXPORT CUresult cuMemPrefetchAsync(CUdeviceptr ptr, size_t count, CUdevice device, CUstream s)
{
    CUresult rc = current == NULL ? CUDA_ERROR_INVALID_CONTEXT : outcome(F_PREFETCH);
    logf_("cuMemPrefetchAsync ptr=0x%llx size=%zu device=%d stream=%p ctx=%p rc=%d", ptr, count,
          device, (void *)s, (void *)current, rc);
    return rc;
}

EXPORT CUresult cuCtxSynchronize(void)
{
    CUresult rc = current == NULL ? CUDA_ERROR_INVALID_CONTEXT : outcome(F_SYNC);
    logf_("cuCtxSynchronize ctx=%p rc=%d", (void *)current, rc);
    return rc;
}

EXPORT CUresult cuMemFree(CUdeviceptr_v1 ptr)
{
    CUresult rc = outcome(F_FREE_V1);
    logf_("cuMemFree ptr=0x%x rc=%d", ptr, rc);
    return rc;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                    cuuint64_t flags, CUdriverProcAddressQueryResult *status);

/*
 * The mock's own functions, by local aliases: its exported names may be interposed (by the
 * shim), and a driver hands out its own entry points, never whatever the global scope holds.
 */
#define LOCAL(local, name)                                                                      \
    extern __typeof(name) local __attribute__((alias(#name), visibility("hidden")))
LOCAL(own_get_proc, cuGetProcAddress);
LOCAL(own_get_proc_v2, cuGetProcAddress_v2);
LOCAL(own_mem_alloc, cuMemAlloc_v2);
LOCAL(own_mem_alloc_v1, cuMemAlloc);
LOCAL(own_mem_free, cuMemFree_v2);
LOCAL(own_mem_free_v1, cuMemFree);
LOCAL(own_mem_alloc_managed, cuMemAllocManaged);
LOCAL(own_prefetch, cuMemPrefetchAsync);
LOCAL(own_ctx_synchronize, cuCtxSynchronize);
LOCAL(own_ctx_get_current, cuCtxGetCurrent);
LOCAL(own_ctx_set_current, cuCtxSetCurrent);

/* Base name, the CUDA version that introduced this ABI of it, the function; newest ABI first. */
static const struct {
    const char *name;
    int since;
    void *fn;
    const char *exported; /* the name the function is exported under */
} procs[] = {
    {"cuGetProcAddress", 12000, (void *)own_get_proc_v2, "cuGetProcAddress_v2"},
    {"cuGetProcAddress", 11030, (void *)own_get_proc, "cuGetProcAddress"},
    {"cuMemAlloc", 3020, (void *)own_mem_alloc, "cuMemAlloc_v2"},
    {"cuMemAlloc", 2000, (void *)own_mem_alloc_v1, "cuMemAlloc"},
    {"cuMemFree", 3020, (void *)own_mem_free, "cuMemFree_v2"},
    {"cuMemFree", 2000, (void *)own_mem_free_v1, "cuMemFree"},
    {"cuMemAllocManaged", 6000, (void *)own_mem_alloc_managed, "cuMemAllocManaged"},
    {"cuMemPrefetchAsync", 8000, (void *)own_prefetch, "cuMemPrefetchAsync"},
    {"cuCtxSynchronize", 2000, (void *)own_ctx_synchronize, "cuCtxSynchronize"},
    {"cuCtxGetCurrent", 4000, (void *)own_ctx_get_current, "cuCtxGetCurrent"},
    {"cuCtxSetCurrent", 4000, (void *)own_ctx_set_current, "cuCtxSetCurrent"},
};

/* The mock's own function exported as `name` (whatever interposes it), for tests to compare. */
EXPORT void *mock_cuda_entry(const char *name)
{
    for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++)
        if (strcmp(procs[i].exported, name) == 0)
            return procs[i].fn;
    return NULL;
}

/* dlsym(name) on the mock's own handle, made from inside it, as a driver wiring itself up would. */
EXPORT void *mock_cuda_dlsym_self(const char *name)
{
    void *self = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (self == NULL)
        return NULL;
    void *sym = dlsym(self, name);
    dlclose(self);
    return sym;
}

/* The driver's search: the newest ABI of `symbol` not newer than `version`. */
static void *find_proc(const char *symbol, int version, CUdriverProcAddressQueryResult *status)
{
    *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
        if (strcmp(procs[i].name, symbol) != 0)
            continue;
        if (version >= procs[i].since) {
            *status = CU_GET_PROC_ADDRESS_SUCCESS;
            return procs[i].fn;
        }
        *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
    }
    return NULL;
}

/*
 * An error forced with mock_cuda_fail() still writes the pointer found, so a caller that acts on
 * the pointer without looking at the result is caught.
 */
static CUresult get_proc(int which, const char *symbol, void **pfn, int version, cuuint64_t flags,
                         CUdriverProcAddressQueryResult *status)
{
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult rc;
    if (symbol == NULL || pfn == NULL || version > MOCK_DRIVER_VERSION) {
        rc = CUDA_ERROR_INVALID_VALUE;
    } else {
        *pfn = find_proc(symbol, version, &found);
        /* Since 12.0 a symbol not found is a success with a NULL pointer; before, an error. */
        rc = which == F_GET_PROC && *pfn == NULL ? CUDA_ERROR_NOT_FOUND : CUDA_SUCCESS;
        if (status != NULL)
            *status = found;
        CUresult forced_rc = outcome(which);
        if (forced_rc != CUDA_SUCCESS)
            rc = forced_rc;
    }
    logf_("%s symbol=%s version=%d flags=%llu found=%d rc=%d", names[which],
          symbol != NULL ? symbol : "(null)", version, flags, found, rc);
    return rc;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    return get_proc(F_GET_PROC, symbol, pfn, cudaVersion, flags, NULL);
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                    cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
    return get_proc(F_GET_PROC_V2, symbol, pfn, cudaVersion, flags, status);
}
