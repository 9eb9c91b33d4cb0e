/*
 * A program linked against the driver the ordinary way (libcuda.so.1 in DT_NEEDED), the case
 * LD_PRELOAD interposition is made for. Prints what it saw, one `key=value` per line.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stddef.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;

CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemFree_v2(CUdeviceptr dptr);

int main(void)
{
    CUdeviceptr a = 0, b = 0;
    cuCtxSetCurrent((CUcontext)0x1000);
    printf("alloc_a=%d ptr_a=0x%llx\n", cuMemAlloc_v2(&a, 1 << 20), a);
    printf("alloc_b=%d ptr_b=0x%llx\n", cuMemAlloc_v2(&b, 3000), b);
    printf("free_a=%d\n", cuMemFree_v2(a));
    /* The control API is found the way the agent finds it: in the global scope. */
    unsigned long long (*resident)(void) =
        (unsigned long long (*)(void))dlsym(RTLD_DEFAULT, "hearth_shim_resident_bytes");
    int (*prefetch)(int) = (int (*)(int))dlsym(RTLD_DEFAULT, "hearth_shim_prefetch");
    if (resident == NULL || prefetch == NULL) {
        printf("shim=absent\n");
        return 0;
    }
    printf("shim=present resident=%llu prefetch=%d\n", resident(), prefetch(0));
    return 0;
}
