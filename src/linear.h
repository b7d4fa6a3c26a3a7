/* A linear layer's products, with the weight layout decided here once (llm.c's
 * matmul_forward / matmul_backward), so the forward and the backward read as the math:
 *
 *   forward          y[T, out]  = x[T, in] · Wᵀ     (+ β·y)
 *   backward_input   dx[T, in]  = dy[T, out] · W    (+ β·dx)
 *   backward_weight  dW         = dyᵀ · x           (+ β·dW), stored in W's layout
 *
 * W is [out, in] (CLFFN_LAYOUT_OUT_IN, leading dimension in) or [in, out] (IN_OUT, leading
 * dimension out), in f32 or a stored type (clffn_dtype). A product over few tokens runs clffn's
 * own kernels (wmatrix.h) when the context's crossover for its type says so; over more, f32
 * runs CLBlast, and other types dequantize blocks of W along the inner dimension into f32
 * scratch, each block one SGEMM summed into the output. */
#ifndef CLFFN_LINEAR_H
#define CLFFN_LINEAR_H

#include "gemm.h"
#include "wmatrix.h"

/* A weight matrix and its shape. mem is retained by whoever holds the linear; offset counts
 * floats for f32 (bound weights may sit anywhere) and bytes for the other types. */
typedef struct clffn_linear {
    cl_mem mem;
    size_t offset;
    size_t in, out;
    clffn_layout layout;
    clffn_dtype dtype;
} clffn_linear;

/* Where the products run: the context (its K-block, its crossovers), the owner's GEMM scratch
 * and its weight kernels (with their dequantization scratch); count (NULL but in a
 * mixture-of-experts layer's decoding) keeps the forward's token count on the device, where
 * every forward product must then run clffn's own kernels (wmatrix.h); capacity (0 but in a
 * mixture-of-experts layer's expert) has those kernels run as built for that many tokens, so
 * an expert's rows sum alike whether the layer kept its count on the device or not. */
typedef struct clffn_gemm_env {
    const clffn_context *ctx;
    clffn_scratch *scratch;
    clffn_wkernels *wk;
    cl_command_queue *queue;
    const clffn_wcount *count;
    size_t capacity;
} clffn_gemm_env;

/* A pass's products are planned before the first is enqueued (clffn_scratch, clffn_wkernels):
 * between these two they record what they need (and build what they will run) without
 * enqueueing; reserve then grows both scratch buffers, or returns the allocation's error. */
void clffn__env_plan(const clffn_gemm_env *env);
cl_int clffn__env_reserve(const clffn_gemm_env *env);

/* The most tokens a forward product over w runs clffn's kernels for: the context's crossover
 * for w's clffn_kernel_class (quantized inputs where the context rounds them for w's type and
 * w is kept [out, in], which the kernels then take along its rows; else, for compressed
 * weights, the large products' crossover where w has at least the context's large weights). */
size_t clffn__kernel_max_tokens(const clffn_context *ctx, const clffn_linear *w);

cl_int clffn__linear_forward(const clffn_gemm_env *env, const clffn_linear *w, size_t tokens,
                             clffn_matrix x, float beta, clffn_matrix y);
/* Whether y = x·Wᵀ over `tokens` runs clffn's kernels along W's rows with an epilogue
 * (clffn__wgemv_takes_ep): few tokens, W kept [out, in]; with pairs, V is v (NULL: stacked
 * into W after W1's rows, or none), which must then be of W's type, layout and shape. */
bool clffn__linear_takes_ep(const clffn_gemm_env *env, const clffn_linear *w, const clffn_linear *v,
                            size_t tokens, bool pairs);

/* y = x·Wᵀ with ep applied as y is written (clffn__wgemv_ep; ep's V is set here from v or W),
 * where clffn__linear_takes_ep says so (else CLFFN_ERROR_INVALID_ARGUMENT); event (NULL: none)
 * receives its launch's. */
cl_int clffn__linear_forward_ep(const clffn_gemm_env *env, const clffn_linear *w,
                                const clffn_linear *v, size_t tokens, clffn_matrix x,
                                clffn_matrix y, const clffn_wepi *ep, cl_event *event);

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
