/* Kernel sources and the context's program cache. Below the context's creation: it reads and
 * fills the cache in a clffn_context, and calls nothing above it. */
#ifndef CLFFN_PROGRAM_H
#define CLFFN_PROGRAM_H

#include "context.h"

/* Embedded kernel sources (generated at build time from cl/, clffn_defs.h first). */
typedef struct clffn_kernel_source {
    const char *name; /* file name, e.g. "epilogue.cl" */
    const char *text;
} clffn_kernel_source;
extern const clffn_kernel_source clffn_embedded_sources[];
extern const size_t clffn_embedded_source_count;

/* The full source of the kernels, concatenated (embedded or from CLFFN_KERNEL_DIR). Caller
 * frees. Errors: KERNEL_SOURCE (a file unreadable), OUT_OF_HOST_MEMORY. */
clffn_status clffn__kernel_source(char **out);

/* Builds (or finds in the context's cache) the program for key. A failed build leaves the
 * device compiler's log in ctx->build_log. */
clffn_status clffn__get_program(clffn_context *ctx, const clffn_program_key *key, cl_program *out);

/* Enqueues p[off .. off + n) = 0 on queue with cl/fill.cl's kernel, built on first use (its
 * program and kernel are the context's, made and used under ctx->lock, so any thread may call
 * this). */
cl_int clffn__zero_floats(const clffn_context *ctx, cl_command_queue queue, cl_mem p, size_t off,
                          size_t n);

/* Releases every cached program (context destruction). */
void clffn__programs_release(clffn_context *ctx);

/* y[i] = the kernels' own erf of the float whose bits are first + i·stride (mod 2^32), for
 * i < n, run on the device (blocking); form is CLFFN_ERF_PROBE_* bits: VEC for the float4 form
 * (clffn_erf4) over the scalar one, DIV_2ULP for a reciprocal 2 ulp off. For the accuracy
 * tests. Errors: NULL_ARGUMENT, INVALID_ARGUMENT (n = 0, unknown form bits), OpenCL's. */
clffn_status clffn__device_erf(clffn_context *ctx, uint32_t first, uint32_t stride, size_t n,
                               unsigned form, float *y);

/* Runs the device's Philox on one counter/key (blocking), for the known-answer tests. */
clffn_status clffn__device_philox(clffn_context *ctx, const uint32_t counter[4],
                                  const uint32_t key[2], uint32_t out[4]);

#endif
