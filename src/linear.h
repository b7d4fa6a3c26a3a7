/* A linear layer's products, with the weight layout decided here once (llm.c's
 * matmul_forward / matmul_backward), so the forward and the backward read as the math:
 *
 *   forward          y[T, out]  = x[T, in] · Wᵀ     (+ β·y)
 *   backward_input   dx[T, in]  = dy[T, out] · W    (+ β·dx)
 *   backward_weight  dW         = dyᵀ · x           (+ β·dW), stored in W's layout
 *
 * W is [out, in] (CLFFN_LAYOUT_OUT_IN, leading dimension in) or [in, out] (IN_OUT, leading
 * dimension out). */
#ifndef CLFFN_LINEAR_H
#define CLFFN_LINEAR_H

#include "gemm.h"

/* A weight matrix and its shape. mem is retained by whoever holds the linear. */
typedef struct clffn_linear {
    cl_mem mem;
    size_t offset;
    size_t in, out;
    clffn_layout layout;
} clffn_linear;

/* Where the products run: the context (its K-block) and the owner's GEMM scratch. */
typedef struct clffn_gemm_env {
    const clffn_context *ctx;
    clffn_scratch *scratch;
    cl_command_queue *queue;
} clffn_gemm_env;

cl_int clffn__linear_forward(const clffn_gemm_env *env, const clffn_linear *w, size_t tokens,
                             clffn_matrix x, float beta, clffn_matrix y);
cl_int clffn__linear_backward_input(const clffn_gemm_env *env, const clffn_linear *w, size_t tokens,
                                    clffn_matrix dy, float beta, clffn_matrix dx);
cl_int clffn__linear_backward_weight(const clffn_gemm_env *env, const clffn_linear *dw,
                                     size_t tokens, clffn_matrix dy, clffn_matrix x, float beta);

/* One product of an FFN's first layer: a weight and the first column of z [T, N1] it covers. */
typedef struct clffn_part {
    clffn_linear w;
    size_t col;
} clffn_part;

/* An FFN's first layer as products over z's columns: one over all of them when it is plain or
 * V is stacked into w1, else W1 into columns [0, F) and V into [F, 2F). Returns the count. */
size_t clffn__first_layer(bool gated, bool stacked, const clffn_linear *w1, const clffn_linear *v,
                          clffn_part parts[2]);

#endif
