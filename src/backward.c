/* The backward pass: every product a linear-layer SGEMM, the rest in backward.cl.
 *
 *   dh[T,F]   = dy·W2                              (layer 2, backward_input)
 *   dW2       = dyᵀ·h                              (layer 2, backward_weight; β = 1 accumulates)
 *   db2       = Σ_t dy                             (column sums)
 *   dz[T,N1]  = epilogue 1 backward(dh, z, b1, bv, the forward's mask)
 *   db1, dbv  = Σ_t dz                             (column sums)
 *   dW1|dV    = dzᵀ·x                              (layer 1, backward_weight; one when stacked)
 *   dx        = dz·[W1|V] (+ dy)                   (layer 1, backward_input)
 *
 * What the forward keeps: z = x·[W1|V] without biases and h (the input of W2) in the FFN's
 * workspace, and the dropout it used. z rather than the activation because act'(a) needs a; h
 * because dW2 needs it and storing T·F floats costs less than recomputing the gate and the mask
 * twice. x is the caller's, so it is passed again. */
#include "ffn.h"

#include "launch.h"

/* The caller's gradient buffers, checked before anything is enqueued (sizes fit: the forward
 * ran on them). */
static clffn_status check_backward(clffn_ffn *ffn, size_t T, clffn_matrix x, clffn_matrix dy,
                                   clffn_matrix dx, const clffn_device_weights *g) {
    const clffn_config *c = &ffn->cfg;
    const size_t D = c->d_model, F = c->d_ff;
    const bool stacked_g = c->gated && !g->v.mem;
    /* weights kept compressed have no weight gradients: their buffers must be NULL */
    const bool weights = ffn->w1.dtype == CLFFN_DTYPE_F32;
    if (!weights && (g->w1.mem || g->v.mem || g->w2.mem)) {
        return clffn__refuse_compressed_grads(ffn);
    }
    if (c->gated && g->v.mem && !g->w1.mem) { return CLFFN_ERROR_INVALID_ARGUMENT; }
    const struct {
        cl_mem mem;
        size_t off, count;
        bool needed;
    } checks[] = {
        {x.mem, x.off, T * D, true},
        {dy.mem, dy.off, T * D, true},
        {dx.mem, dx.off, T * D, dx.mem != NULL},
        /* a NULL gradient buffer skips that gradient */
        {g->w1.mem, g->w1.offset, (stacked_g ? 2 * F : F) * D, g->w1.mem != NULL},
        {g->b1.mem, g->b1.offset, F, c->bias1 && g->b1.mem},
        {g->v.mem, g->v.offset, F * D, c->gated && g->v.mem},
        {g->bv.mem, g->bv.offset, F, c->gated && c->bias_gate && g->bv.mem},
        {g->w2.mem, g->w2.offset, D * F, g->w2.mem != NULL},
        {g->b2.mem, g->b2.offset, D, c->bias2 && g->b2.mem},
    };
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; ++i) {
        if (!checks[i].needed) { continue; }
        const clffn_status st =
            clffn__check_buffer(ffn->ctx, checks[i].mem, checks[i].off, checks[i].count);
        if (st != CLFFN_SUCCESS) { return st; }
    }
    return CLFFN_SUCCESS;
}

/* Layer 2's products: dh = dy·W2, dW2 (+)= dyᵀ·h. */
static cl_int layer2_gemms(clffn_ffn *ffn, const clffn_gemm_env *env, size_t T, clffn_matrix dy,
                           const clffn_device_weights *g, float beta) {
    const clffn_config *c = &ffn->cfg;
    const clffn_matrix h = {ffn->ws.h, 0, c->d_ff}, dh = {ffn->ws.dh, 0, c->d_ff};
    clffn_linear dw2 = ffn->w2; /* W2's shape, in the caller's layout */
    dw2.mem = g->w2.mem;
    dw2.offset = g->w2.offset;
    dw2.layout = ffn->grad_layout;
    dw2.dtype = CLFFN_DTYPE_F32;
    cl_int err = clffn__linear_backward_input(env, &ffn->w2, T, dy, 0.0f, dh);
    if (err == CL_SUCCESS && dw2.mem) {
        err = clffn__linear_backward_weight(env, &dw2, T, dy, h, beta);
    }
    return err;
}

/* Layer 1's weight gradients: dW1|dV (+)= dzᵀ·x, in the weights' shapes, stacked when the
 * caller left v.mem NULL. */
static cl_int layer1_weight_gemms(clffn_ffn *ffn, const clffn_gemm_env *env, size_t T,
                                  clffn_matrix x, const clffn_device_weights *g, float beta) {
    const clffn_config *c = &ffn->cfg;
    const size_t F = c->d_ff;
    const clffn_matrix dz = {ffn->ws.dz, 0, clffn__n1(c)};
    const bool stacked_g = c->gated && !g->v.mem;
    if (!g->w1.mem) { return CL_SUCCESS; } /* not asked for (compressed weights have none) */
    const clffn_linear dw1 = {g->w1.mem,        g->w1.offset,   c->d_model, stacked_g ? 2 * F : F,
                              ffn->grad_layout, CLFFN_DTYPE_F32};
    const clffn_linear dv = {g->v.mem, g->v.offset,      c->d_model,
                             F,        ffn->grad_layout, CLFFN_DTYPE_F32};
    clffn_part parts[2];
    const size_t n = clffn__first_layer(c->gated, stacked_g, &dw1, &dv, parts);
    cl_int err = CL_SUCCESS;
    for (size_t i = 0; i < n && err == CL_SUCCESS; ++i) {
        const clffn_matrix dzi = {dz.mem, parts[i].col, dz.ld};
        err = clffn__linear_backward_weight(env, &parts[i].w, T, dzi, x, beta);
    }
    return err;
}

/* Layer 1's input gradient: dx = dz·[W1|V] (+ β·dx, β = 1 after the residual's copy). */
static cl_int layer1_input_gemms(clffn_ffn *ffn, const clffn_gemm_env *env, size_t T,
                                 clffn_matrix dx, float beta) {
    const clffn_config *c = &ffn->cfg;
    const clffn_matrix dz = {ffn->ws.dz, 0, clffn__n1(c)};
    clffn_part parts[2];
    const size_t n = clffn__first_layer(c->gated, ffn->stacked, &ffn->w1, &ffn->v, parts);
    cl_int err = CL_SUCCESS;
    for (size_t i = 0; i < n && err == CL_SUCCESS; ++i) {
        const clffn_matrix dzi = {dz.mem, parts[i].col, dz.ld};
        err = clffn__linear_backward_input(env, &parts[i].w, T, dzi, i ? 1.0f : beta, dx);
    }
    return err;
}

/* The biases' gradients from dz: db1, dbv (+)= Σ_t dz. */
static cl_int layer1_bias_sums(clffn_ffn *ffn, size_t T, const clffn_device_weights *g, int acc,
                               cl_command_queue queue) {
    const clffn_config *c = &ffn->cfg;
    const size_t F = c->d_ff;
    const clffn_matrix dz = {ffn->ws.dz, 0, clffn__n1(c)};
    cl_int err = CL_SUCCESS;
    if (c->bias1 && g->b1.mem) { err = clffn__column_sums(ffn, dz, T, F, &g->b1, acc, queue); }
    if (err == CL_SUCCESS && c->gated && c->bias_gate && g->bv.mem) {
        const clffn_matrix dz2 = {dz.mem, F, dz.ld};
        err = clffn__column_sums(ffn, dz2, T, F, &g->bv, acc, queue);
    }
    return err;
}

/* Every product of the pass, recorded (not run) so that the GEMM scratch grows once, before the
 * first is enqueued: a failing allocation leaves every gradient as it was. */
static cl_int reserve_backward(clffn_ffn *ffn, const clffn_gemm_env *env, size_t T, clffn_matrix x,
                               clffn_matrix dy, clffn_matrix dx, const clffn_device_weights *g,
                               float beta) {
    clffn__env_plan(env);
    cl_int err = layer2_gemms(ffn, env, T, dy, g, beta);
    if (err == CL_SUCCESS) { err = layer1_weight_gemms(ffn, env, T, x, g, beta); }
    if (err == CL_SUCCESS && dx.mem) { err = layer1_input_gemms(ffn, env, T, dx, 0.0f); }
    const cl_int reserved = clffn__env_reserve(env);
    return err == CL_SUCCESS ? reserved : err;
}

/* The pass in order: layer 2 (dh, dW2, db2), epilogue 1 backward (dz), layer 1 (db1, dbv, dW1|dV,
 * dx, with dy added first for the residual). */
static cl_int enqueue_backward(clffn_ffn *ffn, const clffn_gemm_env *env, size_t T, clffn_matrix x,
                               clffn_matrix dy, clffn_matrix dx, const clffn_device_weights *g,
                               float beta) {
    const clffn_config *c = &ffn->cfg;
    cl_command_queue q = *env->queue;
    const int acc = beta != 0.0f;
    cl_int err = layer2_gemms(ffn, env, T, dy, g, beta);
    if (err == CL_SUCCESS && c->bias2 && g->b2.mem) {
        err = clffn__column_sums(ffn, dy, T, c->d_model, &g->b2, acc, q);
    }
    if (err == CL_SUCCESS) { err = clffn__epilogue1_backward(ffn, T, q); }
    if (err == CL_SUCCESS) { err = layer1_bias_sums(ffn, T, g, acc, q); }
    if (err == CL_SUCCESS) { err = layer1_weight_gemms(ffn, env, T, x, g, beta); }
    if (err != CL_SUCCESS || !dx.mem) { return err; }
    float b = 0.0f;
    if (c->residual) {
        err = clEnqueueCopyBuffer(q, dy.mem, dx.mem, dy.off * sizeof(float), dx.off * sizeof(float),
                                  T * c->d_model * sizeof(float), 0, NULL, NULL);
        b = 1.0f;
    }
    return err == CL_SUCCESS ? layer1_input_gemms(ffn, env, T, dx, b) : err;
}

clffn_status clffn_backward(clffn_ffn *ffn, size_t tokens, cl_mem x, size_t x_offset, cl_mem dy,
                            size_t dy_offset, cl_mem dx, size_t dx_offset,
                            const clffn_device_weights *g, int accumulate, cl_command_queue queue,
                            cl_event *event) {
    if (!ffn || !x || !dy || !g || !queue) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if (!ffn->has_weights) { return CLFFN_ERROR_NO_WEIGHTS; }
    if (tokens == 0 || tokens != ffn->last_tokens) { return CLFFN_ERROR_NO_FORWARD; }
    clffn_status st = clffn__check_queue(ffn->ctx, queue);
    if (st != CLFFN_SUCCESS) { return st; }
    const size_t D = ffn->cfg.d_model;
    const clffn_matrix X = {x, x_offset, D}, DY = {dy, dy_offset, D}, DX = {dx, dx_offset, D};
    if ((st = check_backward(ffn, tokens, X, DY, DX, g)) != CLFFN_SUCCESS) { return st; }
    if ((st = clffn__workspace_backward(&ffn->ws, ffn->ctx, &ffn->cfg, tokens, queue)) !=
        CLFFN_SUCCESS) {
        return st;
    }

    const float beta = accumulate ? 1.0f : 0.0f;
    const clffn_gemm_env env = clffn__gemm_env(ffn, &queue);
    cl_int err = reserve_backward(ffn, &env, tokens, X, DY, DX, g, beta);
    if (err == CL_SUCCESS) { err = enqueue_backward(ffn, &env, tokens, X, DY, DX, g, beta); }
    cl_event end = NULL; /* the pass's end, for the caller and clffn_ffn_destroy() */
    if (err == CL_SUCCESS) { err = clEnqueueMarkerWithWaitList(queue, 0, NULL, &end); }
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    if (event) {
        clRetainEvent(end);
        *event = end;
    }
    clffn__keep_tail(ffn, end);
    return CLFFN_SUCCESS;
}
