/* Linear-layer products (see linear.h): each a few-token kernel, one clffn__sgemm, or, for
 * compressed weights over many tokens, one clffn__sgemm per dequantized block. */
#include "linear.h"

#include "clffn_defs.h"
#include "dtype.h"

static bool out_in(const clffn_linear *w) { return w->layout == CLFFN_LAYOUT_OUT_IN; }

void clffn__env_plan(const clffn_gemm_env *env) {
    clffn__scratch_plan(env->scratch);
    clffn__wkernels_plan(env->wk);
}

cl_int clffn__env_reserve(const clffn_gemm_env *env) {
    const cl_int err = clffn__scratch_reserve(env->ctx, env->scratch, *env->queue);
    const cl_int werr = clffn__wkernels_reserve(env->wk, env->ctx, *env->queue);
    return err != CL_SUCCESS ? err : werr;
}

/* W as a row-major operand: [out, in] rows in apart, or [in, out] rows out apart (f32). */
static clffn_matrix weight(const clffn_linear *w) {
    const clffn_matrix m = {w->mem, w->offset, out_in(w) ? w->in : w->out};
    return m;
}

/* W as it is stored, for clffn's own kernels: rows of [out, in] or of [in, out]. */
static clffn_wmatrix stored(const clffn_linear *w) {
    const bool oi = out_in(w);
    const size_t cols = oi ? w->in : w->out;
    size_t row_bytes = 0;
    clffn_dtype_bytes(w->dtype, cols, &row_bytes); /* checked when the weights were set */
    const clffn_wmatrix m = {w->mem,
                             w->dtype == CLFFN_DTYPE_F32 ? w->offset * sizeof(float) : w->offset,
                             oi ? w->out : w->in,
                             cols,
                             row_bytes,
                             w->dtype};
    return m;
}

size_t clffn__kernel_max_tokens(const clffn_context *ctx, const clffn_linear *w) {
    if (w->dtype == CLFFN_DTYPE_F32) { return ctx->kernel_max_tokens[CLFFN_KERNELS_F32]; }
    if (out_in(w) && clffn__quantizes_inputs(ctx, w->dtype)) {
        return ctx->kernel_max_tokens[CLFFN_KERNELS_QUANTIZED];
    }
    /* in·out cannot overflow: the weights were allocated */
    if (w->in * w->out >= ctx->kernel_large_weights) {
        return ctx->kernel_max_tokens[CLFFN_KERNELS_COMPRESSED_LARGE];
    }
    return ctx->kernel_max_tokens[clffn__dtype_quantized(w->dtype) ? CLFFN_KERNELS_BLOCKS
                                                                   : CLFFN_KERNELS_COMPRESSED];
}

/* Whether a forward product over `tokens` rows with w runs clffn's few-token kernels. */
static bool few(const clffn_gemm_env *env, const clffn_linear *w, size_t tokens) {
    return tokens <= clffn__kernel_max_tokens(env->ctx, w);
}

/* The inner dimension's block for a dequantized product: the context's K-block where it has
 * one, else all of K, but no block whose f32 copy passes 64 MiB (a multiple of 32, so that
 * quantized blocks are never cut). */
static size_t dequant_block(const clffn_context *ctx, size_t k, size_t other) {
    const size_t cap = ((size_t)16 << 20) / (other ? other : 1) / 32 * 32;
    size_t kb = ctx->gemm_k_block ? (ctx->gemm_k_block + 31) / 32 * 32 : k;
    if (cap && kb > cap) { kb = cap; }
    return kb < 32 ? 32 : kb;
}

/* C[T, n] = A[T, k]·W' + β·C for compressed W over many tokens, W' = W or Wᵀ as [k, n]: each
 * block of K dequantized into scratch and one SGEMM, summed into C. K runs down W's stored rows
 * (k_rows: the block is W[k0 .. k0 + kb, :]) or along them (W[:, k0 .. k0 + kb], which the
 * dequantizer writes transposed). Either way SGEMM gets its B as [kb, n] rows, untransposed:
 * CLBlast copies a transposed B into the orientation its kernel reads on every call, and that
 * orientation is what f32 weights kept [in, out] give it in the forward. */
static cl_int dequant_product(const clffn_gemm_env *env, const clffn_wmatrix *w, bool k_rows,
                              size_t tokens, clffn_matrix a, float beta, clffn_matrix c) {
    const size_t k = k_rows ? w->rows : w->cols, n = k_rows ? w->cols : w->rows;
    const size_t kb = dequant_block(env->ctx, k, n);
    cl_int err = CL_SUCCESS;
    for (size_t k0 = 0; k0 < k && err == CL_SUCCESS; k0 += kb) {
        const size_t len = k - k0 < kb ? k - k0 : kb;
        clffn_matrix s;
        err = k_rows ? clffn__wdequant(env->wk, env->ctx, w, k0, len, 0, n, false, *env->queue, &s)
                     : clffn__wdequant(env->wk, env->ctx, w, 0, n, k0, len, true, *env->queue, &s);
        const clffn_matrix ak = {a.mem, a.off + k0, a.ld};
        const clffn_gemm_op op = {CLFFN_NO_TRANS, CLFFN_NO_TRANS,   tokens, n, len,
                                  1.0f,           k0 ? 1.0f : beta, ak,     s, c};
        if (err == CL_SUCCESS) {
            err = clffn__sgemm(env->ctx, env->scratch, &op, env->queue, NULL);
        }
    }
    return err;
}

/* y = x·Wᵀ: B = W [out, in] transposed, or W [in, out] as it is. */
cl_int clffn__linear_forward(const clffn_gemm_env *env, const clffn_linear *w, size_t tokens,
                             clffn_matrix x, float beta, clffn_matrix y) {
    if (few(env, w, tokens)) {
        const clffn_wmatrix m = stored(w);
        return clffn__wgemv(env->wk, env->ctx, &m, out_in(w), tokens, env->capacity, env->count, x,
                            beta, y, *env->queue);
    }
    if (env->count) { return (cl_int)CLFFN_ERROR_INVALID_SIZE; } /* the caller checks first */
    if (w->dtype != CLFFN_DTYPE_F32) {
        const clffn_wmatrix m = stored(w);
        return dequant_product(env, &m, !out_in(w), tokens, x, beta, y);
    }
    const clffn_gemm_op op = {CLFFN_NO_TRANS, out_in(w) ? CLFFN_TRANS : CLFFN_NO_TRANS,
                              tokens,         w->out,
                              w->in,          1.0f,
                              beta,           x,
                              weight(w),      y};
    return clffn__sgemm(env->ctx, env->scratch, &op, env->queue, NULL);
}

bool clffn__linear_takes_ep(const clffn_gemm_env *env, const clffn_linear *w, const clffn_linear *v,
                            size_t tokens, bool pairs) {
    if (!few(env, w, tokens) || !out_in(w)) { return false; }
    if (v &&
        (v->dtype != w->dtype || v->layout != w->layout || v->in != w->in || v->out != w->out)) {
        return false;
    }
    const clffn_wmatrix m = stored(w);
    return clffn__wgemv_takes_ep(env->ctx, &m, tokens, env->capacity, pairs);
}

cl_int clffn__linear_forward_ep(const clffn_gemm_env *env, const clffn_linear *w,
                                const clffn_linear *v, size_t tokens, clffn_matrix x,
                                clffn_matrix y, const clffn_wepi *ep, cl_event *event) {
    const bool pairs = (ep->flags & CLFFN_EP_PAIRS) != 0;
    if (!clffn__linear_takes_ep(env, w, v, tokens, pairs)) {
        return (cl_int)CLFFN_ERROR_INVALID_ARGUMENT;
    }
    const clffn_wmatrix m = stored(w);
    clffn_wepi e = *ep;
    if (pairs) { /* V's rows: a matrix of their own, or W1's last pair rows' successors */
        const clffn_wmatrix mv = v ? stored(v) : m;
        e.v = mv.mem;
        e.v_offset = v ? mv.offset : m.offset + ep->pair * m.row_bytes;
    }
    return clffn__wgemv_ep(env->wk, env->ctx, &m, tokens, env->capacity, env->count, x, y, &e,
                           *env->queue, event);
}

/* dx = dy·W: B = W [out, in] as it is, or W [in, out] transposed. */
cl_int clffn__linear_backward_input(const clffn_gemm_env *env, const clffn_linear *w, size_t tokens,
                                    clffn_matrix dy, float beta, clffn_matrix dx) {
    /* one pass at most: in passes the column form lost to SGEMM from 64 tokens on (a POCL host,
     * 4096 -> 11008, f16 and q8_0: the backward 1.2x slower at 64 tokens, 2.7x at 256) */
    if (tokens <= CLFFN_MAX_KERNEL_TOKENS && few(env, w, tokens)) {
        const clffn_wmatrix m = stored(w);
        return clffn__wgemv(env->wk, env->ctx, &m, !out_in(w), tokens, 0, NULL, dy, beta, dx,
                            *env->queue);
    }
    if (w->dtype != CLFFN_DTYPE_F32) {
        const clffn_wmatrix m = stored(w);
        return dequant_product(env, &m, out_in(w), tokens, dy, beta, dx);
    }
    const clffn_gemm_op op = {CLFFN_NO_TRANS, out_in(w) ? CLFFN_NO_TRANS : CLFFN_TRANS,
                              tokens,         w->in,
                              w->out,         1.0f,
                              beta,           dy,
                              weight(w),      dx};
    return clffn__sgemm(env->ctx, env->scratch, &op, env->queue, NULL);
}

/* dW [out, in] = dyᵀ·x, or dW [in, out] = xᵀ·dy: both over the T rows. */
cl_int clffn__linear_backward_weight(const clffn_gemm_env *env, const clffn_linear *dw,
                                     size_t tokens, clffn_matrix dy, clffn_matrix x, float beta) {
    const bool oi = out_in(dw);
    const clffn_gemm_op op = {
        CLFFN_TRANS, CLFFN_NO_TRANS, oi ? dw->out : dw->in, oi ? dw->in : dw->out, tokens,
        1.0f,        beta,           oi ? dy : x,           oi ? x : dy,           weight(dw)};
    return clffn__sgemm(env->ctx, env->scratch, &op, env->queue, NULL);
}

size_t clffn__first_layer(bool gated, bool stacked, const clffn_linear *w1, const clffn_linear *v,
                          clffn_part parts[2]) {
    parts[0].w = *w1;
    parts[0].col = 0;
    if (!gated || stacked) { return 1; }
    parts[1].w = *v;
    parts[1].col = w1->out;
    return 2;
}
