/* Where a forward's device time goes, kernel by kernel, for a program that times forwards as
 * clffn-bench does (each forward's launches, then clFinish) on a queue made with profiling on,
 * as clffn's contexts make theirs. Preloaded, it gives every kernel launch an event and, at each
 * clFinish, reads the events' start and end times; at exit it writes one line per kernel name:
 * its launches, its mean time on the device, and the mean idle time between the end of the
 * command before it (in the same forward) and its start, which is where the device waited on the
 * host or on the driver. Sampling profilers split a CPU device's time by thread, not by kernel,
 * and miss a slow kernel whose time is spread over the driver's worker threads.
 *
 *   cc -O2 -shared -fPIC -o /tmp/cl-kernel-times.so scripts/cl-kernel-times.c -ldl
 *   LD_PRELOAD=/tmp/cl-kernel-times.so clffn-bench ...
 *
 * Lines go to stderr. Not thread-safe: one thread enqueueing, as clffn-bench's forwards do. */
#define _GNU_SOURCE
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

enum { MAX_PENDING = 4096, MAX_NAMES = 128, NAME = 64 };

typedef struct pending {
    char name[NAME];
    cl_event event;
} pending;

typedef struct per_name {
    char name[NAME];
    long launches;
    double device_us, idle_us;
} per_name;

static pending queue_[MAX_PENDING];
static int n_pending;
static per_name names[MAX_NAMES];
static int n_names;

/* the next definition of name after this library's, as a function pointer of type T */
#define REAL(T, name) \
    static T real;    \
    if (!real) { *(void **)&real = dlsym(RTLD_NEXT, name); }

typedef cl_int (*nd_range_fn)(cl_command_queue, cl_kernel, cl_uint, const size_t *, const size_t *,
                              const size_t *, cl_uint, const cl_event *, cl_event *);
typedef cl_int (*finish_fn)(cl_command_queue);

static per_name *entry(const char *name) {
    for (int i = 0; i < n_names; ++i) {
        if (!strcmp(names[i].name, name)) { return &names[i]; }
    }
    if (n_names == MAX_NAMES) { return &names[MAX_NAMES - 1]; } /* the rest share the last */
    memcpy(names[n_names].name, name, NAME); /* a pending name: NUL-terminated within NAME */
    names[n_names].name[NAME - 1] = '\0';
    return &names[n_names++];
}

cl_int clEnqueueNDRangeKernel(cl_command_queue q, cl_kernel k, cl_uint dims, const size_t *offset,
                              const size_t *global, const size_t *local, cl_uint n_wait,
                              const cl_event *wait, cl_event *event) {
    REAL(nd_range_fn, "clEnqueueNDRangeKernel");
    cl_event own = NULL;
    const cl_int err = real(q, k, dims, offset, global, local, n_wait, wait, event ? event : &own);
    cl_event ev = event ? *event : own;
    if (err == CL_SUCCESS && n_pending < MAX_PENDING) {
        pending *p = &queue_[n_pending++];
        if (clGetKernelInfo(k, CL_KERNEL_FUNCTION_NAME, NAME, p->name, NULL) != CL_SUCCESS) {
            snprintf(p->name, NAME, "?");
        }
        p->event = ev;
        if (!own) { clRetainEvent(ev); } /* the caller's: kept until read */
        own = NULL;
    }
    if (own) { clReleaseEvent(own); }
    return err;
}

cl_int clFinish(cl_command_queue q) {
    REAL(finish_fn, "clFinish");
    const cl_int err = real(q);
    double last_end = 0;
    for (int i = 0; i < n_pending; ++i) {
        cl_ulong start = 0, end = 0;
        if (clGetEventProfilingInfo(queue_[i].event, CL_PROFILING_COMMAND_START, sizeof start,
                                    &start, NULL) == CL_SUCCESS &&
            clGetEventProfilingInfo(queue_[i].event, CL_PROFILING_COMMAND_END, sizeof end, &end,
                                    NULL) == CL_SUCCESS) {
            per_name *e = entry(queue_[i].name);
            e->launches++;
            e->device_us += (double)(end - start) * 1e-3;
            if (last_end > 0 && (double)start * 1e-3 > last_end) {
                e->idle_us += (double)start * 1e-3 - last_end;
            }
            last_end = (double)end * 1e-3;
        }
        clReleaseEvent(queue_[i].event);
    }
    n_pending = 0;
    return err;
}

__attribute__((destructor)) static void report(void) {
    double device = 0, idle = 0;
    for (int i = 0; i < n_names; ++i) {
        const per_name *e = &names[i];
        fprintf(stderr, "%-32s %7ld launches %10.1f us each, idle before %8.1f us each\n", e->name,
                e->launches, e->device_us / (double)e->launches, e->idle_us / (double)e->launches);
        device += e->device_us, idle += e->idle_us;
    }
    if (n_names) {
        fprintf(stderr, "all kernels: %.1f us on the device, %.1f idle\n", device, idle);
    }
}
