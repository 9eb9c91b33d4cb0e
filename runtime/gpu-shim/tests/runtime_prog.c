/*
 * Reaches the driver the way the CUDA runtime (libcudart) does since CUDA 11.3: it dlopen()s
 * libcuda.so.1 itself, without RTLD_GLOBAL, dlsym()s cuGetProcAddress_v2 from that handle and
 * resolves every entry point it calls through it, at the runtime's CUDA version (argv[1]).
 * Prints what it saw, one `key=value` per line.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef CUresult (*get_proc_v2_fn)(const char *, void **, int, unsigned long long, int *);
typedef CUresult (*ctx_set_fn)(CUcontext);
typedef CUresult (*mem_alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*mem_free_fn)(CUdeviceptr);

static void *entry(get_proc_v2_fn get_proc, const char *symbol, int version)
{
    void *fn = NULL;
    int status = -1;
    CUresult rc = get_proc(symbol, &fn, version, 0, &status);
    printf("lookup_%s=%d status=%d found=%d\n", symbol, rc, status, fn != NULL);
    return rc == 0 ? fn : NULL;
}

int main(int argc, char **argv)
{
    int version = argc > 1 ? atoi(argv[1]) : 12000;
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (driver == NULL) {
        printf("driver=absent\n");
        return 1;
    }
    get_proc_v2_fn get_proc = (get_proc_v2_fn)dlsym(driver, "cuGetProcAddress_v2");
    ctx_set_fn set_current = (ctx_set_fn)entry(get_proc, "cuCtxSetCurrent", version);
    mem_alloc_fn alloc = (mem_alloc_fn)entry(get_proc, "cuMemAlloc", version);
    mem_free_fn release = (mem_free_fn)entry(get_proc, "cuMemFree", version);
    if (set_current == NULL || alloc == NULL || release == NULL)
        return 1;
    CUdeviceptr a = 0, b = 0;
    set_current((CUcontext)0x1000);
    printf("alloc_a=%d ptr_a=0x%llx\n", alloc(&a, 1 << 20), a);
    printf("alloc_b=%d ptr_b=0x%llx\n", alloc(&b, 3000), b);
    printf("free_a=%d\n", release(a));
    int (*regions)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "hearth_shim_regions");
    unsigned long long (*resident)(void) =
        (unsigned long long (*)(void))dlsym(RTLD_DEFAULT, "hearth_shim_resident_bytes");
    if (regions == NULL || resident == NULL) {
        printf("shim=absent\n");
        return 0;
    }
    printf("shim=present regions=%d resident=%llu\n", regions(), resident());
    return 0;
}
