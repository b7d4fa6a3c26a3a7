/* Internal declarations shared by the host layer's files and the tests; not installed. */
#ifndef CLFFN_INTERNAL_H
#define CLFFN_INTERNAL_H

#include "clffn.h"

#include <pthread.h>
#include <stdbool.h>

/* Upper bound on distinct epilogue programs one context caches: 6 activations × gated ×
 * dropout = 24, doubled for headroom. */
#define CLFFN_MAX_PROGRAMS 48

/* The options that select an epilogue program; equal keys share one cl_program. */
typedef struct clffn_program_key {
    int activation;
    int gated;
    int dropout;
} clffn_program_key;

typedef struct clffn_program_entry {
    clffn_program_key key;
    cl_program program;
} clffn_program_entry;

struct clffn_context {
    cl_context context;
    cl_device_id device;
    cl_command_queue queue; /* internal, in-order, profiling on */
    cl_ulong max_alloc;     /* CL_DEVICE_MAX_MEM_ALLOC_SIZE */
    int cpu;                /* a CPU device: own buffers take CL_MEM_ALLOC_HOST_PTR */
    pthread_mutex_t lock;   /* guards programs[] and build_log */
    clffn_program_entry programs[CLFFN_MAX_PROGRAMS];
    int n_programs;
    cl_program philox_program; /* built on first use by the known-answer hook */
    char *build_log;
    /* Test hook: local work size of the epilogue kernels along dimension 0; 0 lets the runtime
     * choose. Exists to prove the dropout mask does not depend on it. */
    size_t epilogue_local_size;
    char tuning[1300]; /* which CLBlast profile was applied (clffn_context_tuning) */
    /* clffn__sgemm splits a product's inner dimension into blocks of about this many (0: never)
     * and sums them into C; from the tuning profile's "clffn" section, or
     * clffn_context_set_gemm_k_block() */
    size_t gemm_k_block;
};

/* One weight operand as the GEMMs and kernels see it. */
typedef struct clffn_bound {
    cl_mem mem; /* retained by the FFN (owned or the caller's) */
    size_t offset;
} clffn_bound;

struct clffn_ffn {
    clffn_context *ctx;
    clffn_config cfg;
    cl_kernel epilogue1;       /* no dropout: inference, or p = 0 */
    cl_kernel epilogue1_train; /* with dropout; exists while p > 0 */
    cl_kernel epilogue2;
    cl_kernel backward1;       /* epilogue 1's backward without dropout */
    cl_kernel backward1_train; /* with dropout; exists while p > 0 */
    cl_kernel column_partials; /* the bias gradients' two passes */
    cl_kernel column_sums;

    /* weights */
    bool has_weights;
    clffn_layout layout;
    bool stacked; /* gated with W1 and V in one matrix: one SGEMM */
    clffn_bound w1, b1, v, bv, w2, b2;

    /* dropout state */
    int training;
    uint64_t seed;
    uint64_t rng_offset;

    /* workspace, grown on demand: z [T, N1], h [T, F], u [T, D] */
    size_t ws_tokens;
    cl_mem z, h, u;
    /* host-level forward buffers: x and y [T, D] */
    size_t io_tokens;
    cl_mem io_x, io_y;

    /* backward workspace, grown on demand: dh [T, F], dz [T, N1], and the bias gradients'
     * partial sums [ceil(T / 64), max(F, D)] */
    size_t bws_tokens;
    cl_mem dh, dz, colsum;
    /* host-level backward buffers: dy, dx [T, D] and the gradients (W1 and V stacked) */
    size_t bio_tokens;
    cl_mem io_dy, io_dx;
    cl_mem g_w1, g_b1, g_bv, g_w2, g_b2;

    /* the last forward, for clffn_ffn_read_hidden() and clffn_backward() */
    int last_drop;            /* it applied dropout */
    float last_p;             /* with this p */
    uint64_t last_rng_offset; /* with this offset */
    size_t last_tokens;
    cl_event last_event;         /* completion of epilogue1 of the last forward, or NULL */
    cl_command_queue last_queue; /* its queue (retained), flushed before we wait on it */

    /* CLBlast's scratch for the GEMMs (clffn__sgemm), grown on demand */
    cl_mem gemm_tmp;
    size_t gemm_tmp_bytes;

    /* stage timing (clffn_ffn_set_profiling): a marker before GEMM 1 and epilogue 2's event */
    int profiling;
    cl_event prof_start, prof_end;
};

/* Embedded kernel sources (generated at build time from cl/). */
typedef struct clffn_kernel_source {
    const char *name; /* file name, e.g. "epilogue.cl" */
    const char *text;
} clffn_kernel_source;
extern const clffn_kernel_source clffn_embedded_sources[];
extern const size_t clffn_embedded_source_count;

/* Device capabilities clffn relies on, split out so the decision is testable without a device
 * lacking them. */
typedef struct clffn_device_caps {
    int version_major, version_minor; /* from CL_DEVICE_VERSION "OpenCL M.m ..." */
    int compiler_available;
    int available;
} clffn_device_caps;
clffn_status clffn__device_caps_check(const clffn_device_caps *caps);
clffn_status clffn__device_caps_query(cl_device_id device, clffn_device_caps *caps);

/* Parses "OpenCL M.m ..." into major/minor; returns 0 on failure. */
int clffn__parse_cl_version(const char *s, int *major, int *minor);

/* Builds (or finds in the context's cache) the epilogue program for key. */
clffn_status clffn__get_program(clffn_context *ctx, const clffn_program_key *key, cl_program *out);

/* Runs the device's Philox on one counter/key (blocking), for the known-answer tests. */
clffn_status clffn__device_philox(clffn_context *ctx, const uint32_t counter[4],
                                  const uint32_t key[2], uint32_t out[4]);

/* Tuning profiles (tuning.c): applied when a context opens its device. */
/* OUT_OF_HOST_MEMORY is the only failure: a missing or damaged profile falls back and says so
 * in ctx->tuning. */
clffn_status clffn__apply_tuning(clffn_context *ctx);
const char *clffn__builtin_profile(cl_device_id device);
clffn_status clffn__apply_profile_text(cl_device_id device, const char *json);

/* Sets kernel argument i while err (a cl_int in scope) is still CL_SUCCESS, so a run of them
 * stops at the first failure. Shared by the forward (ffn.c) and the backward (backward.c). */
#define SET_ARG(k, i, v)                                                             \
    do {                                                                             \
        if (err == CL_SUCCESS) { err = clSetKernelArg((k), (i), sizeof(v), &(v)); } \
    } while (0)

/* clCreateBuffer for clffn's own buffers. On a CPU device they are made with
 * CL_MEM_ALLOC_HOST_PTR (all its memory is host memory anyway): POCL then takes the memory at
 * creation, so running out is a status here, where a plain buffer is taken lazily at its first
 * use and POCL aborts the process when that fails. */
cl_mem clffn__buffer(const clffn_context *ctx, cl_mem_flags flags, size_t bytes, cl_int *err);

/* clffn_sgemm() for the FFN's products (ta, tb: CLBlastTranspose values): row-major, called
 * column-major and split along K for the context's block, each block run through
 * CLBlastSgemmWithTempBuffer with the FFN's own scratch
 * buffer (grown with clffn__buffer), so CLBlast allocates nothing behind our back: a padded or
 * transposed copy that does not fit fails here with a status, and no call pays for a
 * temporary allocation. */
cl_int clffn__sgemm(clffn_ffn *ffn, int ta, int tb, size_t m, size_t n, size_t k, float alpha,
                    cl_mem a, size_t a_off, size_t a_ld, cl_mem b, size_t b_off, size_t b_ld,
                    float beta, cl_mem c, size_t c_off, size_t c_ld, cl_command_queue *queue,
                    cl_event *event);

/* Shared by the forward (ffn.c) and the backward (backward.c). */
clffn_status clffn__check_buffer(const clffn_context *ctx, cl_mem mem, size_t offset, size_t count);
clffn_status clffn__check_queue(const clffn_context *ctx, cl_command_queue queue);
/* Sets the arguments epilogue 1 and its backward share: the biases (b1, b1_off, bv, bv_off,
 * flags) from bias_index on, and tokens, d_ff and the dropout state at 9..14. */
cl_int clffn__set_epilogue1_args(clffn_ffn *ffn, cl_kernel k, cl_uint bias_index, size_t tokens,
                                 int drop, float p, uint64_t rng_offset);
/* Enqueues a (columns/4, T) element-wise launch of k. */
cl_int clffn__launch(clffn_ffn *ffn, cl_kernel k, size_t columns, size_t tokens,
                     cl_command_queue queue, cl_event *event);

/* The reference's double core (reference.c), for the finite-difference tests. */
typedef struct clffn_ref_params {
    const double *w1, *b1, *v, *bv, *w2, *b2;
} clffn_ref_params;
clffn_status clffn__ref_forward_d(const clffn_config *c, clffn_layout layout,
                                  const clffn_ref_params *p, size_t tokens, const double *x,
                                  int training, uint64_t seed, uint64_t offset, double *y,
                                  double *hidden);
clffn_status clffn__ref_backward_d(const clffn_config *c, clffn_layout layout,
                                   const clffn_ref_params *p, size_t tokens, const double *x,
                                   const double *dy, int training, uint64_t seed,
                                   uint64_t offset, double *dx, const clffn_ref_grads *gr);

/* Size arithmetic that reports overflow instead of wrapping. */
static inline bool clffn__mul_ok(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) { return false; }
    *out = a * b;
    return true;
}

/* The dropout threshold and scale shared by the device kernels and the reference. */
uint64_t clffn__drop_threshold(float p);
float clffn__drop_scale(float p);

/* A whole text file (smaller than max_bytes), NUL-terminated, or NULL; *oom tells "no memory"
 * apart from "no readable file". Caller frees. Kernel sources and tuning profiles. */
char *clffn__read_text(const char *path, long max_bytes, int *oom);

/* The full source of the kernels, concatenated (embedded or from CLFFN_KERNEL_DIR). Caller frees. */
clffn_status clffn__kernel_source(char **out);

#endif
