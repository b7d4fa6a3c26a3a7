/* What the host spends enqueueing a forward, for a program that times forwards as clffn-bench
 * does (each forward, then a marker waited on, then clFinish). Preloaded, it wraps the OpenCL
 * calls below and, at each clFinish that follows kernel launches, writes one line: the launches
 * since the last such clFinish, the time spent inside clEnqueueNDRangeKernel, clSetKernelArg
 * (calls and time) and clWaitForEvents, and the time since the last clFinish returned. Where the enqueueing
 * takes most of a forward's time, the device waits on the host, and fewer launches, not faster
 * kernels, shorten it.
 *
 *   cc -O2 -shared -fPIC -o /tmp/cl-host-costs.so scripts/cl-host-costs.c -ldl
 *   CL_HOST_COSTS=/tmp/costs.txt LD_PRELOAD=/tmp/cl-host-costs.so clffn-bench ...
 *
 * (on a GPU machine with a bundled build, after gpu-env.sh: the bundled ICD loader is found
 * through LD_LIBRARY_PATH). Lines go to stderr without CL_HOST_COSTS. Not thread-safe: one
 * thread enqueueing, as clffn-bench's forwards do. */
#define _GNU_SOURCE
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

static int launches, arg_calls;
static double enqueue_us, arg_us, wait_us, last_finish_us;

/* the next definition of name after this library's, as a function pointer of type T */
#define REAL(T, name) \
    static T real;    \
    if (!real) { *(void **)&real = dlsym(RTLD_NEXT, name); }

typedef cl_int (*nd_range_fn)(cl_command_queue, cl_kernel, cl_uint, const size_t *, const size_t *,
                              const size_t *, cl_uint, const cl_event *, cl_event *);
typedef cl_int (*set_arg_fn)(cl_kernel, cl_uint, size_t, const void *);
typedef cl_int (*wait_fn)(cl_uint, const cl_event *);
typedef cl_int (*finish_fn)(cl_command_queue);

cl_int clEnqueueNDRangeKernel(cl_command_queue q, cl_kernel k, cl_uint dims, const size_t *offset,
                              const size_t *global, const size_t *local, cl_uint n,
                              const cl_event *wait, cl_event *event) {
    REAL(nd_range_fn, "clEnqueueNDRangeKernel");
    const double t0 = now_us();
    const cl_int err = real(q, k, dims, offset, global, local, n, wait, event);
    enqueue_us += now_us() - t0;
    ++launches;
    return err;
}

cl_int clSetKernelArg(cl_kernel k, cl_uint index, size_t size, const void *value) {
    REAL(set_arg_fn, "clSetKernelArg");
    const double t0 = now_us();
    const cl_int err = real(k, index, size, value);
    arg_us += now_us() - t0;
    ++arg_calls;
    return err;
}

cl_int clWaitForEvents(cl_uint n, const cl_event *events) {
    REAL(wait_fn, "clWaitForEvents");
    const double t0 = now_us();
    const cl_int err = real(n, events);
    wait_us += now_us() - t0;
    return err;
}

cl_int clFinish(cl_command_queue q) {
    REAL(finish_fn, "clFinish");
    static FILE *out;
    if (!out) {
        const char *path = getenv("CL_HOST_COSTS");
        out = path ? fopen(path, "w") : NULL;
        if (!out) { out = stderr; }
    }
    const double t0 = now_us();
    const cl_int err = real(q);
    const double t1 = now_us();
    if (launches) {
        fprintf(out,
                "launches %d enqueue_us %.1f set_arg_calls %d set_arg_us %.1f wait_us %.1f "
                "finish_us %.1f since_last_us %.1f\n",
                launches, enqueue_us, arg_calls, arg_us, wait_us, t1 - t0,
                last_finish_us ? t1 - last_finish_us : 0.0);
        fflush(out);
    }
    last_finish_us = t1;
    launches = arg_calls = 0;
    enqueue_us = arg_us = wait_us = 0.0;
    return err;
}
