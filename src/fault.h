/* Allocation fault injection, host and device, for the test build only (target clffn_fi_obj).
 *
 * CMake force-includes this header (-include) into every library and loader source of that
 * build, so each malloc, calloc, realloc, strdup and free our code makes goes through the
 * counters in fault.c without the sources naming them. cJSON's allocations are routed through
 * them as well (cJSON_InitHooks), since our code asks cJSON to allocate. The shipped library is
 * built without it and calls the C library directly. */
#ifndef CLFFN_FAULT_H
#define CLFFN_FAULT_H

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

void *clffn__fi_malloc(size_t n);
void *clffn__fi_calloc(size_t n, size_t size);
void *clffn__fi_realloc(void *p, size_t n);
char *clffn__fi_strdup(const char *s);
void clffn__fi_free(void *p);

/* Makes the n-th allocation from now fail (n = 1: the next one); with sticky, that one and every
 * later one until disarmed, like memory that stays exhausted. n = 0 disarms. */
void clffn__fi_arm(long n, int sticky);
/* Allocations refused since the last arm. */
long clffn__fi_failed(void);
/* Blocks allocated through the counters and not yet freed. */
long clffn__fi_live(void);

/* Device buffers have a countdown of their own: the n-th clCreateBuffer from now (n = 1: the
 * next) fails with CL_MEM_OBJECT_ALLOCATION_FAILURE, as a device out of memory does; once, or
 * with sticky every one after it too. n = 0 disarms. */
cl_mem clffn__fi_clCreateBuffer(cl_context context, cl_mem_flags flags, size_t size, void *host,
                                cl_int *err);
void clffn__fi_arm_device(long n, int sticky);
/* Device buffers refused since the last arm. */
long clffn__fi_device_failed(void);

#define malloc(n) clffn__fi_malloc(n)
#define calloc(n, s) clffn__fi_calloc(n, s)
#define realloc(p, n) clffn__fi_realloc(p, n)
#define strdup(s) clffn__fi_strdup(s)
#define free(p) clffn__fi_free(p)
#define clCreateBuffer clffn__fi_clCreateBuffer

#endif
