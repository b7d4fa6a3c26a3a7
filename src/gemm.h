/* The one SGEMM path: every product clffn runs, and the public clffn_sgemm(), go through
 * clffn__sgemm(): row-major operands issued column-major to CLBlast, split along K for the
 * context's block, with the caller's scratch buffer. */
#ifndef CLFFN_GEMM_H
#define CLFFN_GEMM_H

#include "context.h"

/* A row-major matrix operand: rows start ld floats apart, the first at element off of mem. */
typedef struct clffn_matrix {
    cl_mem mem;
    size_t off, ld;
} clffn_matrix;

/* C[m,n] = α·op(A)·op(B) + β·C: A [m,k] (ta: [k,m]), B [k,n] (tb: [n,k]). */
typedef struct clffn_gemm_op {
    clffn_transpose ta, tb;
    size_t m, n, k;
    float alpha, beta;
    clffn_matrix a, b, c;
} clffn_gemm_op;

/* CLBlast's scratch for padded or transposed copies, owned by whoever runs the products (an
 * FFN). A pass sizes it for all its products before it enqueues the first: between
 * clffn__scratch_plan() and clffn__scratch_reserve(), clffn__sgemm() only records what each
 * product needs and enqueues nothing; reserve grows the buffer once, so a copy that does not fit
 * fails before any output is written. */
typedef struct clffn_scratch {
    cl_mem mem;
    size_t bytes;
    int planning;   /* clffn__sgemm records into planned instead of running */
    size_t planned; /* the most any recorded product needs */
} clffn_scratch;

/* Starts recording the products of a pass (see clffn_scratch). */
void clffn__scratch_plan(clffn_scratch *scratch);

/* Stops recording and grows the scratch to what the recorded products need (the old buffer is
 * released once what queue holds is done with it): CL_SUCCESS, or the allocation's error with
 * the old buffer kept. */
cl_int clffn__scratch_reserve(const clffn_context *ctx, clffn_scratch *scratch,
                              cl_command_queue queue);

/* Enqueues op on *queue (in order), split along K by ctx's block (clffn_gemm_k_split), or, for
 * an A of at most ctx->gemv_max_tokens rows used as stored, as one GEMV per row. An SGEMM runs
 * with ctx's Xgemm set for its token count (clffn_context_set_xgemm), holding the device while
 * it enqueues. With a
 * scratch, every block runs through CLBlastSgemmWithTempBuffer on it, grown first, so CLBlast
 * allocates nothing behind our back: a copy that does not fit fails here with a status, before
 * anything is enqueued, and no call pays for a temporary allocation. Without one (NULL), CLBlast
 * takes its own per call. event (may be NULL) completes with the last block. While the scratch
 * is planning, only records what op needs. */
cl_int clffn__sgemm(const clffn_context *ctx, clffn_scratch *scratch, const clffn_gemm_op *op,
                    cl_command_queue *queue, cl_event *event);

/* Releases the scratch's buffer. */
void clffn__scratch_release(clffn_scratch *scratch);

#endif
