/*
 * Test-only stand-in for the CUDA driver, built as libcuda.so.1: hands out fake pointers and
 * appends one line per call to the file named by HEARTH_MOCK_CUDA_LOG, e.g.
 *   cuMemAllocManaged ptr=0x700000000000 size=4096 flags=1 ctx=0x1000 rc=0
 * Like the real driver, calls that need a context fail with CUDA_ERROR_INVALID_CONTEXT when the
 * calling thread has none. mock_cuda_fail() makes one entry point return a chosen error.
 */
#define _GNU_SOURCE
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
typedef struct CUstream_st *CUstream;
typedef struct CUctx_st *CUcontext;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_INVALID_CONTEXT 201

#define EXPORT __attribute__((visibility("default")))

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int log_fd = -2; /* -2: not opened yet, -1: no log */
static CUdeviceptr next_ptr = 0x700000000000ULL;
static CUdeviceptr_v1 next_ptr_v1 = 0x10000000U;
static unsigned int handed_out;
static int scatter;
static __thread CUcontext current;

enum { F_ALLOC, F_ALLOC_V1, F_MANAGED, F_FREE, F_PREFETCH, F_SYNC, F_COUNT };
static const char *const names[F_COUNT] = {
    "cuMemAlloc_v2", "cuMemAlloc", "cuMemAllocManaged", "cuMemFree_v2", "cuMemPrefetchAsync",
    "cuCtxSynchronize",
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
