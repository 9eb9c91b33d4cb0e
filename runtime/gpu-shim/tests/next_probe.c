/*
 * A library that, like any interposer, finds the next definition of a symbol with
 * dlsym(RTLD_NEXT). Built twice (PROBE_VALUE 1 and 2) and preloaded after the shim: the first
 * copy's probe_next_value() must reach the second copy, wherever dlsym is interposed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

__attribute__((visibility("default"))) int probe_value(void)
{
    return PROBE_VALUE;
}

/* The value of the next probe_value after this library's, 0 if there is none. */
__attribute__((visibility("default"))) int probe_next_value(void)
{
    int (*next)(void) = (int (*)(void))dlsym(RTLD_NEXT, "probe_value");
    return next != NULL ? next() : 0;
}
