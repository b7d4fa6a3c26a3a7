/* The forward pass:
 *
 *   x[T,D] ─linear(W1|V)─► z[T,N1] ─epilogue1─► h[T,F] ─linear(W2)─► u[T,D] ─epilogue2─► y[T,D]
 *
 * N1 = F, or 2F when gated (W1's columns then V's). The second product writes the FFN's own u,
 * not the caller's y, so y is written by one kernel at the very end: a failure anywhere earlier
 * leaves it untouched, and y may be x itself. Where the context fuses epilogues (few tokens
 * along W's rows: fuses() below), the products apply them: the first writes z and h, the
 * second y itself, still the last kernel, reading h alone. */
#include "ffn.h"

#include "clffn_defs.h"
#include "launch.h"

#include <stdlib.h>

/* Every size and buffer the pass touches, checked before anything is enqueued. */
static clffn_status check_forward(clffn_ffn *ffn, size_t tokens, clffn_matrix x, clffn_matrix y) {
    const clffn_config *c = &ffn->cfg;
    size_t nx, nz, bytes;
    if (!clffn__mul_ok(tokens, c->d_model, &nx) || !clffn__mul_ok(tokens, clffn__n1(c), &nz) ||
        !clffn__mul_ok(nz, sizeof(float), &bytes) || (cl_ulong)bytes > ffn->ctx->max_alloc ||
        !clffn__mul_ok(nx, sizeof(float), &bytes) || (cl_ulong)bytes > ffn->ctx->max_alloc) {
        return CLFFN_ERROR_SIZE_OVERFLOW;
    }
    clffn_status st;
    if ((st = clffn__check_buffer(ffn->ctx, x.mem, x.off, nx)) != CLFFN_SUCCESS ||
        (st = clffn__check_buffer(ffn->ctx, y.mem, y.off, nx)) != CLFFN_SUCCESS) {
        return st;
    }
    if (x.mem == y.mem && x.off != y.off && x.off < y.off + nx && y.off < x.off + nx) {
        return CLFFN_ERROR_BUFFER_OVERLAP;
    }
    return CLFFN_SUCCESS;
}

static void remember_forward(clffn_ffn *ffn, size_t tokens, cl_command_queue queue, cl_event ev) {
    if (ffn->last_event) { clReleaseEvent(ffn->last_event); }
    if (ffn->last_queue) { clReleaseCommandQueue(ffn->last_queue); }
    ffn->last_event = ev;
    ffn->last_queue = queue;
    if (queue) { clRetainCommandQueue(queue); }
    ffn->last_tokens = tokens;
}

/* end, this forward's last event, becomes the FFN's tail; the caller gets it with a reference
 * of its own, and so do the stage times when the forward was timed. The stage-timing events
 * replace the last ones (or clear them, when it was not timed, so stale times are never read as
 * this forward's). */
static void keep_events(clffn_ffn *ffn, cl_event start, cl_event end, cl_event *event) {
    if (ffn->prof_start) { clReleaseEvent(ffn->prof_start); }
    if (ffn->prof_end) { clReleaseEvent(ffn->prof_end); }
    ffn->prof_start = start;
    ffn->prof_end = start ? end : NULL;
    if (start) { clRetainEvent(end); }
    if (event) {
        clRetainEvent(end);
        *event = end;
    }
    clffn__keep_tail(ffn, end);
}

/* V where it is a matrix of its own (bound apart from W1), else NULL. */
static const clffn_linear *v_apart(const clffn_ffn *ffn) {
    return ffn->cfg.gated && !ffn->stacked ? &ffn->v : NULL;
}

/* Which epilogues ride on the products (cl/weights.cl, clffn_wgemv_rows_ep, _act, _glu) and so
 * take no launch of their own, where the context fuses them: few tokens along W's rows. Not the
 * first with dropout (epilogue.cl draws the mask), nor the second with a residual (y may be x
 * itself). */
static clffn_fused fuses(const clffn_ffn *ffn, const clffn_gemm_env *env, size_t tokens,
                         const clffn_dropout_use *drop) {
    const clffn_config *c = &ffn->cfg;
    clffn_fused f = {false, false};
    if (!ffn->ctx->fused_epilogues) { return f; }
    f.first = !drop->on && clffn__linear_takes_ep(env, &ffn->w1, v_apart(ffn), tokens, c->gated);
    f.second = !c->residual && clffn__linear_takes_ep(env, &ffn->w2, NULL, tokens, false);
    return f;
}

/* z = x·[W1|V]ᵀ, one product per part of the first layer; fused, h too (epilogue 1), its
 * launch's event in *event. */
static cl_int first_layer(clffn_ffn *ffn, const clffn_gemm_env *env, size_t tokens, clffn_matrix x,
                          bool fused, cl_event *event) {
    const clffn_config *c = &ffn->cfg;
    const clffn_matrix z = {ffn->ws.z, 0, clffn__n1(c)};
    if (fused) {
        const bool bv_on = c->gated && c->bias_gate;
        const cl_uint flags = clffn__epilogue1_fused_flags(ffn);
        const clffn_buffer standin = {ffn->ws.z, 0}; /* a bias that is off: never read */
        const clffn_wepi ep = {flags,
                               (cl_uint)c->activation,
                               c->d_ff,
                               NULL, /* V: set by the linear layer */
                               0,
                               {ffn->ws.h, 0, c->d_ff},
                               c->bias1 ? ffn->b1 : standin,
                               bv_on ? ffn->bv : standin,
                               0,
                               0};
        return clffn__linear_forward_ep(env, &ffn->w1, v_apart(ffn), tokens, x, z, &ep, event);
    }
    clffn_part parts[2];
    const size_t n = clffn__first_layer(c->gated, ffn->stacked, &ffn->w1, &ffn->v, parts);
    cl_int err = CL_SUCCESS;
    for (size_t i = 0; i < n && err == CL_SUCCESS; ++i) {
        const clffn_matrix zi = {z.mem, parts[i].col, z.ld};
        err = clffn__linear_forward(env, &parts[i].w, tokens, x, 0.0f, zi);
    }
    return err;
}

/* u = h·W2ᵀ; fused, y = u + b2 straight into y (epilogue 2), its launch's event in *event. */
static cl_int second_layer(clffn_ffn *ffn, const clffn_gemm_env *env, size_t tokens,
                           const clffn_matrix *fused_y, cl_event *event) {
    const clffn_config *c = &ffn->cfg;
    const clffn_matrix h = {ffn->ws.h, 0, c->d_ff}, u = {ffn->ws.u, 0, c->d_model};
    if (fused_y) {
        const clffn_buffer standin = {ffn->ws.h, 0};
        const clffn_wepi ep = {c->bias2 ? CLFFN_EP_BIAS : 0, 0,       0, NULL, 0,
                               {ffn->ws.u, 0, c->d_model}, /* unread */
                               c->bias2 ? ffn->b2 : standin, standin, 0, 0};
        return clffn__linear_forward_ep(env, &ffn->w2, NULL, tokens, h, *fused_y, &ep, event);
    }
    return clffn__linear_forward(env, &ffn->w2, tokens, h, 0.0f, u);
}

/* The products and kernels of one forward; ev1 receives the event after which h is written,
 * last the forward's last. The GEMM scratch is sized for both products before the first is
 * enqueued. */
static cl_int enqueue_forward(clffn_ffn *ffn, size_t tokens, const clffn_wcount *count,
                              clffn_matrix x, clffn_matrix y, const clffn_dropout_use *drop,
                              cl_command_queue queue, cl_event *ev1, cl_event *last) {
    clffn_gemm_env env = clffn__gemm_env(ffn, &queue);
    env.count = count;
    env.capacity = ffn->kernel_capacity;
    const clffn_fused f = fuses(ffn, &env, tokens, drop);
    const clffn_matrix *fy = f.second ? &y : NULL;
    clffn__env_plan(&env);
    cl_int err = first_layer(ffn, &env, tokens, x, f.first, NULL);
    if (err == CL_SUCCESS) { err = second_layer(ffn, &env, tokens, fy, NULL); }
    const cl_int reserved = clffn__env_reserve(&env);
    if (err == CL_SUCCESS) { err = reserved; }
    if (err == CL_SUCCESS) { err = first_layer(ffn, &env, tokens, x, f.first, ev1); }
    if (err == CL_SUCCESS && !f.first) {
        err = clffn__epilogue1(ffn, tokens, count, drop, queue, ev1);
    }
    if (err == CL_SUCCESS) { err = second_layer(ffn, &env, tokens, fy, last); }
    if (err == CL_SUCCESS && !f.second) {
        err = clffn__epilogue2(ffn, tokens, count, x, y, queue, last);
    }
    ffn->last_fused = f;
    return err;
}

/* clffn_forward(), with the token count on the device where count is not NULL. */
static clffn_status forward(clffn_ffn *ffn, size_t tokens, const clffn_wcount *count, cl_mem x,
                            size_t x_offset, cl_mem y, size_t y_offset, cl_command_queue queue,
                            cl_event *event) {
    if (!ffn || !x || !y || !queue) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if (!ffn->has_weights) { return CLFFN_ERROR_NO_WEIGHTS; }
    clffn_status st = clffn__check_queue(ffn->ctx, queue);
    if (st != CLFFN_SUCCESS) { return st; }
    const clffn_config *c = &ffn->cfg;
    const clffn_matrix X = {x, x_offset, c->d_model}, Y = {y, y_offset, c->d_model};
    if ((st = check_forward(ffn, tokens, X, Y)) != CLFFN_SUCCESS) { return st; }
    if (tokens == 0) { /* CLBlast rejects empty matrices; the caller still gets an event */
        remember_forward(ffn, 0, NULL, NULL);
        return event ? (clffn_status)clEnqueueMarkerWithWaitList(queue, 0, NULL, event)
                     : CLFFN_SUCCESS;
    }
    if ((st = clffn__workspace_forward(&ffn->ws, ffn->ctx, &ffn->cfg, tokens, queue)) !=
        CLFFN_SUCCESS) {
        return st;
    }

    const clffn_dropout_use drop = {ffn->training && c->dropout > 0.0f, c->dropout,
                                    ffn->rng_offset};
    cl_event ev1 = NULL, start = NULL, end = NULL;
    cl_int err = CL_SUCCESS;
    if (ffn->profiling) { err = clEnqueueMarkerWithWaitList(queue, 0, NULL, &start); }
    if (err == CL_SUCCESS) {
        err = enqueue_forward(ffn, tokens, count, X, Y, &drop, queue, &ev1, &end);
    }
    if (err != CL_SUCCESS) {
        if (ev1) { clReleaseEvent(ev1); }
        if (start) { clReleaseEvent(start); }
        if (end) { clReleaseEvent(end); }
        remember_forward(ffn, 0, NULL, NULL);
        return (clffn_status)err;
    }
    remember_forward(ffn, tokens, queue, ev1);
    ffn->last_drop = drop;
    keep_events(ffn, start, end, event);
    if (drop.on) { /* the next forward draws a fresh mask: skip the Philox blocks this one used */
        ffn->rng_offset += ((uint64_t)tokens * ffn->hidden_total + 3) / 4; /* the whole layer's */
    }
    return CLFFN_SUCCESS;
}

clffn_status clffn_forward(clffn_ffn *ffn, size_t tokens, cl_mem x, size_t x_offset, cl_mem y,
                           size_t y_offset, cl_command_queue queue, cl_event *event) {
    return forward(ffn, tokens, NULL, x, x_offset, y, y_offset, queue, event);
}

bool clffn__forward_can_count(const clffn_ffn *ffn, size_t tokens) {
    if (tokens > CLFFN_MAX_KERNEL_TOKENS) { return false; } /* more than one pass of the kernels */
    const clffn_linear *w[3] = {&ffn->w1, &ffn->w2, ffn->cfg.gated ? &ffn->v : &ffn->w1};
    for (int i = 0; i < 3; ++i) {
        if (tokens > clffn__kernel_max_tokens(ffn->ctx, w[i])) { return false; }
    }
    return ffn->has_weights && !(ffn->training && ffn->cfg.dropout > 0.0f);
}

clffn_status clffn__forward_counted(clffn_ffn *ffn, size_t tokens, const clffn_wcount *count,
                                    cl_mem x, size_t x_offset, cl_mem y, size_t y_offset,
                                    cl_command_queue queue) {
    if (!clffn__forward_can_count(ffn, tokens)) { return CLFFN_ERROR_INVALID_ARGUMENT; }
    return forward(ffn, tokens, count, x, x_offset, y, y_offset, queue, NULL);
}

bool clffn__forward_can_tile(const clffn_ffn *ffn, size_t tokens) {
    /* past CLFFN_MOE_PASS_MAX_TOKENS a holder in another process cannot learn the layer's T */
    if (tokens <= CLFFN_MAX_KERNEL_TOKENS || tokens > CLFFN_MOE_PASS_MAX_TOKENS ||
        !clffn__forward_can_count(ffn, CLFFN_MAX_KERNEL_TOKENS)) {
        return false;
    }
    const clffn_linear *w[3] = {&ffn->w1, &ffn->w2, ffn->cfg.gated ? &ffn->v : &ffn->w1};
    for (int i = 0; i < 3; ++i) {
        if (tokens > clffn__kernel_max_tokens(ffn->ctx, w[i])) { return false; }
    }
    return true;
}

/* The kernels' capacity for an expert's rows of a pass of pass_tokens (see ffn.h). */
static size_t pass_capacity(const clffn_ffn *ffn, size_t pass_tokens) {
    if (pass_tokens > CLFFN_MAX_KERNEL_TOKENS) {
        return clffn__forward_can_tile(ffn, pass_tokens) ? CLFFN_MAX_KERNEL_TOKENS : 0;
    }
    return pass_tokens && clffn__forward_can_count(ffn, pass_tokens) ? pass_tokens : 0;
}

clffn_status clffn__forward_as_pass(clffn_ffn *ffn, size_t tokens, size_t pass_tokens, cl_mem x,
                                    size_t x_offset, cl_mem y, size_t y_offset,
                                    cl_command_queue queue) {
    if (!ffn) { return CLFFN_ERROR_NULL_ARGUMENT; }
    ffn->kernel_capacity = pass_capacity(ffn, pass_tokens);
    const clffn_status st = forward(ffn, tokens, NULL, x, x_offset, y, y_offset, queue, NULL);
    ffn->kernel_capacity = 0;
    return st;
}

clffn_status clffn__forward_host_as_pass(clffn_ffn *ffn, size_t tokens, size_t pass_tokens,
                                         const float *x, size_t x_len, float *y, size_t y_len) {
    if (!ffn) { return CLFFN_ERROR_NULL_ARGUMENT; }
    ffn->kernel_capacity = pass_capacity(ffn, pass_tokens);
    const clffn_status st = clffn_forward_host(ffn, tokens, x, x_len, y, y_len);
    ffn->kernel_capacity = 0;
    return st;
}

clffn_status clffn_forward_host(clffn_ffn *ffn, size_t tokens, const float *x, size_t x_len,
                                float *y, size_t y_len) {
    if (!ffn || !x || !y) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if (!ffn->has_weights) { return CLFFN_ERROR_NO_WEIGHTS; }
    size_t n, bytes;
    if (!clffn__mul_ok(tokens, ffn->cfg.d_model, &n) || !clffn__mul_ok(n, sizeof(float), &bytes)) {
        return CLFFN_ERROR_SIZE_OVERFLOW;
    }
    if (x_len < n || y_len < n) { return CLFFN_ERROR_BUFFER_TOO_SMALL; }
    if (tokens == 0) {
        remember_forward(ffn, 0, NULL, NULL);
        return CLFFN_SUCCESS;
    }
    clffn_context *ctx = ffn->ctx;
    /* the workspace too, before any buffer is made for a call that cannot run */
    size_t nz, zbytes;
    if ((cl_ulong)bytes > ctx->max_alloc || !clffn__mul_ok(tokens, clffn__n1(&ffn->cfg), &nz) ||
        !clffn__mul_ok(nz, sizeof(float), &zbytes) || (cl_ulong)zbytes > ctx->max_alloc) {
        return CLFFN_ERROR_SIZE_OVERFLOW;
    }
    clffn_status st = clffn__workspace_host_forward(&ffn->ws, ffn->ctx, &ffn->cfg, tokens);
    if (st != CLFFN_SUCCESS) { return st; }
    const clffn_workspace *ws = &ffn->ws;
    cl_event wrote = NULL; /* the write reads x until it ends, which must be before we return */
    cl_int err = clEnqueueWriteBuffer(ctx->queue, ws->io_x, CL_FALSE, 0, bytes, x, 0, NULL, &wrote);
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    st = clffn_forward(ffn, tokens, ws->io_x, 0, ws->io_y, 0, ctx->queue, NULL);
    if (st != CLFFN_SUCCESS) {
        clffn__wait(CL_SUCCESS, wrote);
        return st;
    }
    clReleaseEvent(wrote); /* the read below comes after it */
    return (clffn_status)clffn__read(ctx->queue, ws->io_y, 0, bytes, y, 0, NULL);
}
