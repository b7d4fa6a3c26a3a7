/* The clffn_context: one device, its queue, its tuning, and the cache of compiled programs. */
#ifndef CLFFN_CONTEXT_H
#define CLFFN_CONTEXT_H

#include "common.h"
#include "tuning.h"

#include <pthread.h>

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
    char *build_log;
    cl_program zero_program; /* cl/fill.cl alone, made on first use; guarded by lock */
    cl_kernel zero_kernel;
    /* Test hook: local work size of the epilogue kernels along dimension 0; 0 lets the runtime
     * choose. Exists to prove the dropout mask does not depend on it. */
    size_t epilogue_local_size;
    clffn_tuning tuning; /* what was applied when the device was opened */
    /* the GEMMs split their inner dimension into blocks of about this many (0: never); from
     * the tuning profile, or clffn_context_set_gemm_k_block() */
    size_t gemm_k_block;
    /* products whose token rows number at most this run as one matrix-vector product per row
     * (clffn__sgemm); from the tuning profile, or clffn_context_set_gemv_max_tokens() */
    size_t gemv_max_tokens;
    /* products over fewer token rows than this are not K-blocked (clffn__sgemm); from the
     * tuning profile, or clffn_context_set_gemm_k_block_min_rows() */
    size_t gemm_k_block_min_rows;
    /* the layout uploads keep W1, V and W2 in; from the tuning profile, or
     * clffn_context_set_weight_layout() */
    clffn_layout weight_layout;
    /* the Xgemm sets products run with: xgemm_few below xgemm_few_rows token rows, xgemm for
     * the rest (clffn__sgemm); from the tuning profile, or clffn_context_set_xgemm() */
    clffn_xgemm_set xgemm, xgemm_few;
    size_t xgemm_few_rows;
};

#endif
