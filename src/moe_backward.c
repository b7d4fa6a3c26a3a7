/* The mixture-of-experts backward (cl/moe.cl's backward kernels and each expert's own):
 *
 *   dy[T,D] ─scatter─► dyg[T·k, D] = weights·dy ─expert e's backward on its rows─► dxg, its grads
 *   dy, yg ─router_backward─► dlogit[T, E] ─router_grads─► dWr, dbr      (reads x)
 *   dxs (the shared expert's), dxg, dlogit ─dx─► dx[T, D]                  (last: dx may be x)
 *
 * What the forward left in the layer's workspace (probabilities, choices, slots, xg, yg) and in
 * each expert's (its own forward of its rows) is what this differentiates. */
#include "moe.h"

#include "launch.h"

#include <stdlib.h>
#include <string.h>

static clffn_status grow_backward(clffn_moe *moe, size_t T, cl_command_queue queue) {
    if (T <= moe->bwd_tokens) { return CLFFN_SUCCESS; }
    const size_t E = moe->cfg.experts, k = moe->cfg.top_k, D = moe->cfg.expert.d_model;
    const size_t f = sizeof(float), R = moe->router_rows;
    const size_t sizes[5] = {T * k * D * f, T * k * D * f, moe->cfg.shared_expert ? T * D * f : f,
                             T * R * f, R > E ? T * D * f : f};
    cl_mem m[5] = {NULL};
    cl_int err = CL_SUCCESS;
    for (size_t i = 0; i < 5 && err == CL_SUCCESS; ++i) {
        m[i] = clffn__buffer(moe->ctx, CL_MEM_READ_WRITE, sizes[i], &err);
    }
    if (err != CL_SUCCESS) {
        for (size_t i = 0; i < 5; ++i) {
            if (m[i]) { clReleaseMemObject(m[i]); }
        }
        return (clffn_status)err;
    }
    cl_mem *mine[5] = {&moe->dyg, &moe->dxg, &moe->dxs, &moe->dlogit, &moe->dys};
    for (size_t i = 0; i < 5; ++i) {
        if (*mine[i]) { clffn__release_when_done(queue, *mine[i]); }
        *mine[i] = m[i];
    }
    moe->bwd_tokens = T;
    return CLFFN_SUCCESS;
}

/* The floats each gradient of an expert takes (w1, b1, v, bv, w2, b2), as clffn_backward()
 * writes them: W1 and V stacked in w1 when v.mem is NULL; 0 where the config has none. */
static void grad_counts(const clffn_config *c, const clffn_device_weights *g, size_t n[6]) {
    const size_t D = c->d_model, F = c->d_ff;
    n[0] = (c->gated && !g->v.mem ? 2 : 1) * F * D;
    n[1] = c->bias1 ? F : 0;
    n[2] = c->gated && g->v.mem ? F * D : 0;
    n[3] = c->gated && c->bias_gate ? F : 0;
    n[4] = D * F;
    n[5] = c->bias2 ? D : 0;
}

static void grad_list(const clffn_device_weights *g, const clffn_buffer *b[6]) {
    b[0] = &g->w1, b[1] = &g->b1, b[2] = &g->v, b[3] = &g->bv, b[4] = &g->w2, b[5] = &g->b2;
}

/* The caller's gradient buffers, each where it is given and large enough (a weight gradient
 * may be skipped with a NULL mem, as for compressed weights; the expert's backward decides). */
static clffn_status check_grads(const clffn_moe *moe, const clffn_moe_grads *g) {
    const size_t R = moe->router_rows, D = moe->cfg.expert.d_model;
    clffn_status st = CLFFN_SUCCESS;
    if (g->router.mem) {
        st = clffn__check_buffer(moe->ctx, g->router.mem, g->router.offset, R * D);
        if (st == CLFFN_SUCCESS && moe->cfg.router_bias) {
            st = clffn__check_buffer(moe->ctx, g->router_bias.mem, g->router_bias.offset, R);
        }
    }
    for (size_t e = 0; g->experts && e < moe->n_ffn && st == CLFFN_SUCCESS; ++e) {
        size_t n[6];
        const clffn_buffer *b[6];
        grad_counts(&moe->ffn[e]->cfg, &g->experts[e], n);
        grad_list(&g->experts[e], b);
        /* compressed experts have no weight gradients; f32 ones need theirs */
        const bool weights = moe->ffn[e]->w1.dtype == CLFFN_DTYPE_F32;
        for (int i = 0; i < 6 && st == CLFFN_SUCCESS; ++i) {
            const bool matrix = i == 0 || i == 2 || i == 4;
            if (matrix && !weights && b[i]->mem) {
                st = clffn__refuse_compressed_grads(moe->ffn[e]);
            } else if (n[i] && (!matrix || weights)) {
                st = clffn__check_buffer(moe->ctx, b[i]->mem, b[i]->offset, n[i]);
            }
        }
    }
    return st;
}

static clffn_status check_backward(clffn_moe *moe, size_t T, cl_mem x, size_t xo, cl_mem dy,
                                   size_t dyo, cl_mem dx, size_t dxo, const clffn_moe_grads *g,
                                   cl_command_queue queue) {
    const size_t D = moe->cfg.expert.d_model, n = T * D; /* fitted the forward */
    if (!moe->router) { return CLFFN_ERROR_NO_WEIGHTS; }
    if (T == 0 || T != moe->last_tokens) { return CLFFN_ERROR_NO_FORWARD; }
    if (g && g->experts && clffn__moe_split(moe)) { /* buffers of one context for all */
        return CLFFN_ERROR_INVALID_ARGUMENT;
    }
    clffn_status st;
    if ((st = clffn__check_queue(moe->ctx, queue)) != CLFFN_SUCCESS ||
        (st = clffn__check_buffer(moe->ctx, x, xo, n)) != CLFFN_SUCCESS ||
        (st = clffn__check_buffer(moe->ctx, dy, dyo, n)) != CLFFN_SUCCESS ||
        (dx && (st = clffn__check_buffer(moe->ctx, dx, dxo, n)) != CLFFN_SUCCESS) ||
        (g && (st = check_grads(moe, g)) != CLFFN_SUCCESS)) {
        return st;
    }
    const cl_mem ins[2] = {x, dy};
    const size_t offs[2] = {xo, dyo};
    for (int i = 0; dx && i < 2; ++i) {
        if (ins[i] == dx && offs[i] != dxo && offs[i] < dxo + n && dxo < offs[i] + n) {
            return CLFFN_ERROR_BUFFER_OVERLAP;
        }
    }
    return CLFFN_SUCCESS;
}

/* Where expert e's gradients go: the caller's, the expert's own buffers (own: the host-level
 * backward, which downloads them), or nowhere (every mem NULL: dx alone). */
static clffn_device_weights expert_grads(const clffn_moe *moe, const clffn_moe_grads *g, int own,
                                         size_t e) {
    clffn_device_weights none;
    memset(&none, 0, sizeof none);
    if (g && g->experts) { return g->experts[e]; }
    return own ? clffn__host_grads_device(moe->ffn[e]) : none;
}

/* An unchosen expert's gradient buffers (the caller's), zeroed. */
static clffn_status zero_grads(clffn_moe *moe, size_t e, const clffn_device_weights *ge,
                               cl_command_queue q) {
    size_t cnt[6];
    const clffn_buffer *b[6];
    grad_counts(&moe->ffn[e]->cfg, ge, cnt);
    grad_list(ge, b);
    clffn_status st = CLFFN_SUCCESS;
    for (int i = 0; i < 6 && st == CLFFN_SUCCESS; ++i) {
        if (cnt[i] && b[i]->mem) {
            st = (clffn_status)clffn__zero_floats(&moe->ctx->programs, q, b[i]->mem, b[i]->offset,
                                                  cnt[i]);
        }
    }
    return st;
}

/* Each chosen expert's backward on its rows (and the shared one's on every token); an unchosen
 * expert's gradients are zeroed unless they accumulate. The experts on other contexts (a split
 * layer) run on their own threads meanwhile. */
static clffn_status experts_backward(clffn_moe *moe, cl_uint T, cl_mem x, size_t xo, cl_mem dy,
                                     size_t dyo, const clffn_moe_grads *g, int own, int accumulate,
                                     cl_command_queue q) {
    const clffn_moe_config *c = &moe->cfg;
    const size_t D = c->expert.d_model;
    const bool given = g && g->experts;
    clffn_remote_pass rp;
    clffn_status st = clffn__moe_remote_pass(moe, T, true, &rp);
    rp.own = own, rp.accumulate = accumulate;
    if (st == CLFFN_SUCCESS) { st = clffn__remote_start(&rp, q); }
    if (st == CLFFN_SUCCESS && c->shared_expert && moe->router_rows > c->experts) {
        const cl_uint Du = (cl_uint)D; /* a gated shared expert: its dy is gate·dy */
        const cl_ulong dyo_l = dyo;
        clffn_args a = clffn__args(moe->scale_dy);
        CLFFN_ARG(a, dy), CLFFN_ARG(a, dyo_l), CLFFN_ARG(a, moe->gate), CLFFN_ARG(a, Du);
        CLFFN_ARG(a, T), CLFFN_ARG(a, moe->dys);
        cl_int err = clffn__args_end(&a);
        if (err == CL_SUCCESS) { err = clffn__moe_enqueue(moe, q, moe->scale_dy, D, T); }
        st = (clffn_status)err;
        dy = moe->dys, dyo = 0;
    }
    if (st == CLFFN_SUCCESS && c->shared_expert) {
        const clffn_device_weights gs = expert_grads(moe, g, own, c->experts);
        st = clffn_backward(moe->ffn[c->experts], T, x, xo, dy, dyo, moe->dxs, 0, &gs, accumulate,
                            q, NULL);
    }
    size_t row0 = 0;
    for (size_t e = 0; e < c->experts && st == CLFFN_SUCCESS; ++e) {
        const size_t n = moe->host_counts[e], off = row0 * D;
        const clffn_device_weights ge = expert_grads(moe, g, own, e);
        if (n && !clffn__moe_remote(moe, e)) {
            st = clffn_backward(moe->ffn[e], n, moe->xg, off, moe->dyg, off, moe->dxg, off, &ge,
                                accumulate, q, NULL);
        } else if (!n && given && !accumulate) {
            st = zero_grads(moe, e, &ge, q);
        }
        row0 += n;
    }
    const clffn_status fin = clffn__remote_finish(&rp, q);
    free(rp.jobs);
    return st != CLFFN_SUCCESS ? st : fin;
}

/* For the host-level backward's expert gradients, each expert's own buffers take them (its
 * workspace's, made here, before anything is enqueued). */
static clffn_status own_grads(clffn_moe *moe) {
    clffn_status st = CLFFN_SUCCESS;
    for (size_t e = 0; e < moe->n_ffn && st == CLFFN_SUCCESS; ++e) {
        clffn_ffn *f = moe->ffn[e];
        if (clffn__moe_away(moe, e)) { continue; } /* its holder has them */
        st = clffn__workspace_host_backward(&f->ws, f->ctx, &f->cfg, 0,
                                            f->w1.dtype == CLFFN_DTYPE_F32);
    }
    return st;
}

/* dlogit, then the router's gradients (which read x), then dx (which may be x). */
static cl_int router_and_dx(clffn_moe *moe, cl_uint T, cl_mem x, cl_ulong xo, cl_mem dy,
                            cl_ulong dyo, cl_mem dx, cl_ulong dxo, const clffn_moe_grads *g,
                            cl_int accumulate, cl_command_queue q) {
    const clffn_moe_config *c = &moe->cfg;
    const cl_uint E = (cl_uint)c->experts, k = (cl_uint)c->top_k, D = (cl_uint)c->expert.d_model;
    const cl_uint R = (cl_uint)moe->router_rows;
    const cl_int normalize = c->routing == CLFFN_ROUTING_TOPK_NORMALIZED;
    const cl_int shared = c->shared_expert ? 1 : 0, has_bias = c->router_bias ? 1 : 0;
    clffn_args a = clffn__args(moe->router_backward);
    CLFFN_ARG(a, dy), CLFFN_ARG(a, dyo), CLFFN_ARG(a, moe->yg), CLFFN_ARG(a, moe->slot);
    CLFFN_ARG(a, moe->probs), CLFFN_ARG(a, moe->chosen), CLFFN_ARG(a, moe->weights);
    CLFFN_ARG(a, D), CLFFN_ARG(a, E), CLFFN_ARG(a, k), CLFFN_ARG(a, normalize), CLFFN_ARG(a, T);
    /* the load-balancing loss: α·E·(count_e / T) / T on every expert's probability */
    const cl_float aux_scale =
        (cl_float)((double)c->aux_loss_coef * (double)E / (double)T / (double)T);
    CLFFN_ARG(a, moe->counts), CLFFN_ARG(a, aux_scale), CLFFN_ARG(a, moe->dlogit);
    CLFFN_ARG(a, R), CLFFN_ARG(a, moe->ys), CLFFN_ARG(a, moe->gate);
    cl_int err = clffn__args_end(&a);
    if (err == CL_SUCCESS) { err = clffn__moe_enqueue(moe, q, moe->router_backward, T, 0); }
    if (err == CL_SUCCESS && g && g->router.mem) {
        const cl_ulong ro = g->router.offset, bo = g->router_bias.offset;
        cl_mem bias = has_bias ? g->router_bias.mem : g->router.mem; /* not written without */
        clffn_args r = clffn__args(moe->router_grads);
        CLFFN_ARG(r, moe->dlogit), CLFFN_ARG(r, x), CLFFN_ARG(r, xo), CLFFN_ARG(r, D);
        CLFFN_ARG(r, R), CLFFN_ARG(r, T), CLFFN_ARG(r, accumulate), CLFFN_ARG(r, g->router.mem);
        CLFFN_ARG(r, ro), CLFFN_ARG(r, bias), CLFFN_ARG(r, bo), CLFFN_ARG(r, has_bias);
        if ((err = clffn__args_end(&r)) == CL_SUCCESS) {
            err = clffn__moe_enqueue(moe, q, moe->router_grads, (size_t)D + 1, R);
        }
    }
    if (err == CL_SUCCESS && dx) {
        clffn_args d = clffn__args(moe->dx_kernel);
        CLFFN_ARG(d, moe->dxg), CLFFN_ARG(d, moe->slot), CLFFN_ARG(d, moe->dxs);
        CLFFN_ARG(d, shared), CLFFN_ARG(d, moe->dlogit), CLFFN_ARG(d, moe->router);
        CLFFN_ARG(d, D), CLFFN_ARG(d, R), CLFFN_ARG(d, k), CLFFN_ARG(d, T), CLFFN_ARG(d, dx);
        CLFFN_ARG(d, dxo);
        if ((err = clffn__args_end(&d)) == CL_SUCCESS) {
            err = clffn__moe_enqueue(moe, q, moe->dx_kernel, D, T);
        }
    }
    return err;
}

/* A forward that kept the counts on the device left no counts on the host and each expert's
 * rows at e·T; the backward needs both as a forward with the counts read back leaves them, so
 * the routing and the experts run again that way (same x, same bits; the combine, y, is not
 * redone). Training at decoding sizes pays one forward for this; inference, nothing. */
static clffn_status unpack_counted(clffn_moe *moe, size_t T, cl_mem x, size_t xo,
                                   cl_command_queue q) {
    const bool host = moe->last_host;
    const clffn_status st = clffn__moe_route_and_run(moe, T, x, xo, CLFFN_MOE_ROWS_PACKED, q);
    if (st == CLFFN_SUCCESS) { moe->last_tokens = T, moe->last_host = host; }
    moe->last_counted = false;
    return st;
}

/* clffn_moe_backward, and with own (grads->experts NULL) the experts' gradients into their own
 * buffers, for the host level to download; without own and without grads->experts none. */
static clffn_status moe_backward(clffn_moe *moe, size_t tokens, cl_mem x, size_t x_offset,
                                 cl_mem dy, size_t dy_offset, cl_mem dx, size_t dx_offset,
                                 const clffn_moe_grads *grads, int own, int accumulate,
                                 cl_command_queue queue) {
    if (!moe || !x || !dy || !queue) { return CLFFN_ERROR_NULL_ARGUMENT; }
    clffn_status st =
        check_backward(moe, tokens, x, x_offset, dy, dy_offset, dx, dx_offset, grads, queue);
    if (st == CLFFN_SUCCESS && own) { st = own_grads(moe); }
    if (st == CLFFN_SUCCESS) { st = grow_backward(moe, tokens, queue); }
    if (st == CLFFN_SUCCESS && moe->last_counted) {
        st = unpack_counted(moe, tokens, x, x_offset, queue);
    }
    if (st != CLFFN_SUCCESS) { return st; }
    const clffn_moe_config *c = &moe->cfg;
    const cl_uint T = (cl_uint)tokens, k = (cl_uint)c->top_k, D = (cl_uint)c->expert.d_model;
    const cl_uint n = T * k;
    const cl_ulong dyo = dy_offset;
    clffn_args a = clffn__args(moe->scatter_dy);
    CLFFN_ARG(a, dy), CLFFN_ARG(a, dyo), CLFFN_ARG(a, moe->slot), CLFFN_ARG(a, moe->weights);
    CLFFN_ARG(a, D), CLFFN_ARG(a, n), CLFFN_ARG(a, k), CLFFN_ARG(a, moe->dyg);
    cl_int err = clffn__args_end(&a);
    if (err == CL_SUCCESS) { err = clffn__moe_enqueue(moe, queue, moe->scatter_dy, D, n); }
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    st = experts_backward(moe, T, x, x_offset, dy, dy_offset, grads, own, accumulate, queue);
    if (st != CLFFN_SUCCESS) { return st; }
    return (clffn_status)router_and_dx(moe, T, x, x_offset, dy, dyo, dx, dx_offset, grads,
                                       accumulate ? 1 : 0, queue);
}

clffn_status clffn_moe_backward(clffn_moe *moe, size_t tokens, cl_mem x, size_t x_offset, cl_mem dy,
                                size_t dy_offset, cl_mem dx, size_t dx_offset,
                                const clffn_moe_grads *grads, int accumulate,
                                cl_command_queue queue) {
    return moe_backward(moe, tokens, x, x_offset, dy, dy_offset, dx, dx_offset, grads, 0,
                        accumulate, queue);
}

/* The host-level backward's router gradient buffers, made on first use. */
static clffn_status router_grad_buffers(clffn_moe *moe) {
    const size_t R = moe->router_rows, D = moe->cfg.expert.d_model;
    cl_int err = CL_SUCCESS;
    if (!moe->g_router) {
        moe->g_router = clffn__buffer(moe->ctx, CL_MEM_READ_WRITE, R * D * sizeof(float), &err);
    }
    if (err == CL_SUCCESS && !moe->g_rbias) {
        moe->g_rbias = clffn__buffer(moe->ctx, CL_MEM_READ_WRITE, R * sizeof(float), &err);
    }
    return (clffn_status)err;
}

/* The caller's arrays, checked before anything moves: lengths, and each expert's set. */
static clffn_status check_host(clffn_moe *moe, size_t T, size_t dy_len, const float *dx,
                               size_t dx_len, const clffn_weight_arrays *eg) {
    const size_t n = T * moe->cfg.expert.d_model; /* fitted the forward */
    if (!moe->router) { return CLFFN_ERROR_NO_WEIGHTS; }
    if (T == 0 || T != moe->last_tokens || !moe->last_host) { return CLFFN_ERROR_NO_FORWARD; }
    if (dy_len < n || (dx && dx_len < n)) { return CLFFN_ERROR_BUFFER_TOO_SMALL; }
    clffn_status st = CLFFN_SUCCESS;
    for (size_t e = 0; eg && e < moe->n_ffn && st == CLFFN_SUCCESS; ++e) {
        if (!clffn__moe_away(moe, e)) { st = clffn__host_grads_check(moe->ffn[e], &eg[e]); }
    }
    return st;
}

static cl_int move_router(clffn_moe *moe, int write, float *rg, float *rbg) {
    const size_t R = moe->router_rows, D = moe->cfg.expert.d_model;
    cl_command_queue q = moe->ctx->queue;
    cl_int err =
        write ? clEnqueueWriteBuffer(q, moe->g_router, CL_FALSE, 0, R * D * 4, rg, 0, NULL, NULL)
              : clEnqueueReadBuffer(q, moe->g_router, CL_FALSE, 0, R * D * 4, rg, 0, NULL, NULL);
    if (err == CL_SUCCESS && rbg && moe->cfg.router_bias) {
        err = write ? clEnqueueWriteBuffer(q, moe->g_rbias, CL_FALSE, 0, R * 4, rbg, 0, NULL, NULL)
                    : clEnqueueReadBuffer(q, moe->g_rbias, CL_FALSE, 0, R * 4, rbg, 0, NULL, NULL);
    }
    return err;
}

/* Waits for q and, in a split layer, every other context's queue its experts used. */
static cl_int finish_all(clffn_moe *moe, cl_command_queue q) {
    cl_int fin = clffn__finish(q);
    for (size_t e = 0; e < moe->n_ffn; ++e) {
        const cl_int f = clffn__moe_remote(moe, e) ? clffn__finish(moe->ffn[e]->ctx->queue) : 0;
        if (fin == CL_SUCCESS) { fin = f; }
    }
    return fin;
}

/* The gradients out: dx, the router's, and each chosen expert's from its own buffers (an
 * unchosen one's arrays zeroed, or kept when accumulating). */
static cl_int download_all(clffn_moe *moe, size_t T, float *dx, float *rg, float *rbg,
                           const clffn_weight_arrays *eg, int accumulate) {
    cl_command_queue q = moe->ctx->queue;
    const size_t n = T * moe->cfg.expert.d_model;
    cl_int err =
        dx ? clEnqueueReadBuffer(q, moe->io_dx, CL_FALSE, 0, n * sizeof(float), dx, 0, NULL, NULL)
           : CL_SUCCESS;
    if (err == CL_SUCCESS && rg) { err = move_router(moe, 0, rg, rbg); }
    for (size_t e = 0; eg && e < moe->n_ffn && err == CL_SUCCESS; ++e) {
        if (clffn__moe_away(moe, e)) { continue; } /* the caller's arrays as they are */
        if (e < moe->cfg.experts && moe->host_counts[e] == 0) {
            if (!accumulate) { clffn__host_grads_zero(&moe->cfg.expert, &eg[e]); }
            continue;
        }
        err = clffn__host_grads_download(moe->ffn[e], moe->ffn[e]->ctx->queue, &eg[e]);
    }
    const cl_int fin = finish_all(moe, q);
    return err != CL_SUCCESS ? err : fin;
}

clffn_status clffn_moe_backward_host(clffn_moe *moe, size_t tokens, const float *dy, size_t dy_len,
                                     float *dx, size_t dx_len, float *router_grad,
                                     float *router_bias_grad, const clffn_weight_arrays *eg,
                                     int accumulate) {
    if (!moe || !dy || (router_grad && moe->cfg.router_bias && !router_bias_grad)) {
        return CLFFN_ERROR_NULL_ARGUMENT;
    }
    clffn_status st = check_host(moe, tokens, dy_len, dx, dx_len, eg);
    if (st == CLFFN_SUCCESS && router_grad) { st = router_grad_buffers(moe); }
    if (st == CLFFN_SUCCESS && eg) { st = own_grads(moe); }
    if (st != CLFFN_SUCCESS) { return st; }
    cl_command_queue q = moe->ctx->queue;
    const size_t n = tokens * moe->cfg.expert.d_model;
    cl_int err =
        clEnqueueWriteBuffer(q, moe->io_y, CL_FALSE, 0, n * sizeof(float), dy, 0, NULL, NULL);
    if (err == CL_SUCCESS && accumulate && router_grad) {
        err = move_router(moe, 1, router_grad, router_bias_grad);
    }
    for (size_t e = 0; eg && accumulate && e < moe->n_ffn && err == CL_SUCCESS; ++e) {
        if (clffn__moe_away(moe, e)) { continue; }
        err = clffn__host_grads_upload(moe->ffn[e], moe->ffn[e]->ctx->queue, &eg[e]);
    }
    if (err != CL_SUCCESS) {
        finish_all(moe, q);
        return (clffn_status)err;
    }
    const clffn_moe_grads g = {{router_grad ? moe->g_router : NULL, 0}, {moe->g_rbias, 0}, NULL};
    st = moe_backward(moe, tokens, moe->io_x, 0, moe->io_y, 0, dx ? moe->io_dx : NULL, 0, &g,
                      eg != NULL, accumulate, q);
    if (st != CLFFN_SUCCESS) {
        finish_all(moe, q);
        return st;
    }
    return (clffn_status)download_all(moe, tokens, dx, router_grad, router_bias_grad, eg,
                                      accumulate);
}

clffn_status clffn_moe_aux_loss(clffn_moe *moe, double *loss) {
    if (!moe || !loss) { return CLFFN_ERROR_NULL_ARGUMENT; }
    const size_t T = moe->last_tokens, E = moe->cfg.experts;
    if (T == 0) { return CLFFN_ERROR_NO_FORWARD; }
    float *p = malloc(T * E * sizeof *p);
    if (!p) { return CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
    cl_int err = CL_SUCCESS;
    if (moe->last_counted) { /* the forward never read them */
        err = clffn__read(moe->ctx->queue, moe->counts, 0, E * sizeof(cl_uint), moe->host_counts,
                          moe->last_event ? 1 : 0, moe->last_event ? &moe->last_event : NULL);
    }
    if (err == CL_SUCCESS) {
        err = clffn__read(moe->ctx->queue, moe->probs, 0, T * E * sizeof *p, p, 0, NULL);
    }
    if (err == CL_SUCCESS) {
        /* E · Σ_e (count_e / T) · (Σ_t p[t, e] / T) */
        double sum = 0.0;
        for (size_t e = 0; e < E; ++e) {
            double pe = 0.0;
            for (size_t t = 0; t < T; ++t) { pe += p[t * E + e]; }
            sum += (double)moe->host_counts[e] / (double)T * (pe / (double)T);
        }
        *loss = (double)E * sum;
    }
    free(p);
    return (clffn_status)err;
}
