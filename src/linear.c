/* Linear-layer products (see linear.h), each one clffn__sgemm. */
#include "linear.h"

static bool out_in(const clffn_linear *w) { return w->layout == CLFFN_LAYOUT_OUT_IN; }

/* W as a row-major operand: [out, in] rows in apart, or [in, out] rows out apart. */
static clffn_matrix weight(const clffn_linear *w) {
    const clffn_matrix m = {w->mem, w->offset, out_in(w) ? w->in : w->out};
    return m;
}

/* y = x·Wᵀ: B = W [out, in] transposed, or W [in, out] as it is. */
cl_int clffn__linear_forward(const clffn_gemm_env *env, const clffn_linear *w, size_t tokens,
                             clffn_matrix x, float beta, clffn_matrix y) {
    const clffn_gemm_op op = {CLFFN_NO_TRANS, out_in(w) ? CLFFN_TRANS : CLFFN_NO_TRANS,
                              tokens,         w->out,
                              w->in,          1.0f,
                              beta,           x,
                              weight(w),      y};
    return clffn__sgemm(env->ctx, env->scratch, &op, env->queue, NULL);
}

/* dx = dy·W: B = W [out, in] as it is, or W [in, out] transposed. */
cl_int clffn__linear_backward_input(const clffn_gemm_env *env, const clffn_linear *w, size_t tokens,
                                    clffn_matrix dy, float beta, clffn_matrix dx) {
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
