/* Kernel sources and a device's cache of compiled programs. Below the context, which keeps one
 * clffn_programs: every function here takes what it needs (the cache, a queue) as arguments. */
#ifndef CLFFN_PROGRAM_H
#define CLFFN_PROGRAM_H

#include "common.h"
#include "kernels_embedded.h"

#include <pthread.h>

/* Upper bound on distinct programs one cache holds: 6 activations × gated × dropout = 24
 * epilogue programs, and 5 weight types × 5 token counts = 25 weight programs, with headroom. */
#define CLFFN_MAX_PROGRAMS 96

/* The weight kernels' shape parameters (cl/weights.cl): work-items per row and rows per group
 * of the row GEMV, columns per work-item, work-items per column group and column groups per
 * work-group of the column GEMV. */
typedef struct clffn_wgemv_params {
    int row_split, row_rows, col_width, col_split, col_groups;
} clffn_wgemv_params;

/* The options that select a program; equal keys share one cl_program. weights = 0: the
 * epilogue program (every .cl file but weights.cl) for activation, gated and dropout;
 * weights = 1 + a clffn_dtype: cl/weights.cl (after activation.cl) for that type,
 * CLFFN_WTOKENS = tokens, and the shape parameters. */
typedef struct clffn_program_key {
    int activation;
    int gated;
    int dropout;
    int weights;
    int tokens;
    clffn_wgemv_params wgemv;
} clffn_program_key;

typedef struct clffn_program_entry {
    clffn_program_key key;
    cl_program program;
} clffn_program_entry;

/* The local size along dimension 0 of the element-wise kernels on a CPU device. POCL compiles a
 * kernel's work-group function anew for every local size it meets, and left to choose, it picks
 * a divisor of the global size: one compile per tensor shape, hundreds of milliseconds each on
 * a new token count. One fixed size compiles once and measured no slower (docs/PERFORMANCE.md,
 * "Element-wise kernels on a CPU device"). */
#define CLFFN_CPU_ITEMS_LOCAL 64

/* The programs built for one device, and cl/fill.cl's kernel, made on first use; any thread may
 * use the cache (lock guards every field below it). */
typedef struct clffn_programs {
    cl_context context;
    cl_device_id device;
    /* local size along dimension 0 of every element-wise launch (clffn__enqueue_items):
     * CLFFN_CPU_ITEMS_LOCAL on a CPU device, 0 (the runtime's choice) on others; set once at
     * init, and by tests, which prove results do not depend on it */
    size_t local_size;
    /* -DCLFFN_ROW_DIRECT for the weight programs (cl/weights.cl): 1 on CPU devices but Mesa's
     * llvmpipe, whose compiler is slow over that form */
    int row_direct;
    pthread_mutex_t lock;
    clffn_program_entry entries[CLFFN_MAX_PROGRAMS];
    int n;
    char *build_log; /* the device compiler's log of the last failed build, or NULL */
    cl_program zero_program;
    cl_kernel zero_kernel;
} clffn_programs;

/* An empty cache for programs of device in context (neither is retained: the owner holds them
 * longer). Errors: OUT_OF_HOST_MEMORY (the lock). */
clffn_status clffn__programs_init(clffn_programs *p, cl_context context, cl_device_id device);

/* Releases every program and the lock. */
void clffn__programs_release(clffn_programs *p);

/* The last failed build's log, or "". */
const char *clffn__programs_build_log(const clffn_programs *p);

/* The full source of a program, concatenated (embedded or from CLFFN_KERNEL_DIR): clffn_defs.h
 * and, with only NULL, every other .cl file but weights.cl; else clffn_defs.h and `only`
 * (activation.cl before weights.cl, whose fused epilogue computes the activations).
 * Caller frees. Errors: KERNEL_SOURCE (a file unreadable), OUT_OF_HOST_MEMORY. */
clffn_status clffn__kernel_source(const char *only, char **out);

/* Whether the weight kernels on a CPU device may use AVX-512 VNNI and AVX-512 BF16 (cl/weights.cl,
 * CLFFN_QX_VNNI and CLFFN_CPU_BF16): the host's CPU is a CPU device's, and POCL's compiler may
 * target a model without them. -1, the default: each where the host's CPU has it; 0: neither,
 * for the tests of the other forms; 2: neither, and the quantized-input products in their AVX2
 * form where the compiler targets AVX-512 too (CLFFN_QX_AVX512 0), so that a test on an AVX-512
 * host runs what AVX2 CPUs run. Programs built before a change keep theirs. */
void clffn__set_cpu_dot_products(int mode);

/* Builds (or finds in the cache) the program for key. A failed build leaves the device
 * compiler's log in the cache (clffn__programs_build_log). */
clffn_status clffn__get_program(clffn_programs *p, const clffn_program_key *key, cl_program *out);

/* Enqueues an element-wise kernel over global[0] × global[1] (dims 1 or 2) with the cache's
 * local size along dimension 0 (global[0] rounded up to a multiple of it; 1 along dimension 1),
 * or the runtime's choice where that is 0. The kernel must return early for indices at or past
 * the true global[0]. event as clEnqueueNDRangeKernel's. */
cl_int clffn__enqueue_items(const clffn_programs *p, cl_command_queue queue, cl_kernel k,
                            cl_uint dims, const size_t *global, cl_event *event);

/* Enqueues m[off .. off + n) = 0 on queue with cl/fill.cl's kernel, built on first use (under the
 * cache's lock, so any thread may call this; the cache is the owner's mutable state even where
 * the owner is const). */
cl_int clffn__zero_floats(const clffn_programs *p, cl_command_queue queue, cl_mem m, size_t off,
                          size_t n);

/* y[i] = the kernels' own erf of the float whose bits are first + i·stride (mod 2^32), for
 * i < n, run on queue (blocking); form is CLFFN_ERF_PROBE_* bits: VEC for the float4 form
 * (clffn_erf4) over the scalar one, DIV_2ULP for a reciprocal 2 ulp off. For the accuracy
 * tests. Errors: NULL_ARGUMENT, INVALID_ARGUMENT (n = 0, unknown form bits), OpenCL's. */
clffn_status clffn__device_erf(clffn_programs *p, cl_command_queue queue, uint32_t first,
                               uint32_t stride, size_t n, unsigned form, float *y);

/* Runs the device's Philox on one counter/key on queue (blocking), for the known-answer tests. */
clffn_status clffn__device_philox(clffn_programs *p, cl_command_queue queue,
                                  const uint32_t counter[4], const uint32_t key[2],
                                  uint32_t out[4]);

#endif
