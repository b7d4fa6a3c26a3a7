/* The backward pass: every product a CLBlast SGEMM, the rest in backward.cl.
 *
 *   dh[T,F]   = dy·W2                         (SGEMM)
 *   dW2       = dyᵀ·h  (or hᵀ·dy for IN_OUT)  (SGEMM, β = 1 to accumulate)
 *   db2       = Σ_t dy                        (column sums)
 *   dz[T,N1]  = epilogue 1 backward(dh, z, b1, bv, the forward's mask)
 *   db1, dbv  = Σ_t dz                        (column sums)
 *   dW1|dV    = dzᵀ·x  (or xᵀ·dz)             (one SGEMM when stacked, like the forward)
 *   dx        = dz·[W1|V] (+ dy)              (SGEMM, β = 1 after copying dy for the residual)
 *
 * What the forward keeps: z = x·[W1|V] without biases and h (the input of W2) in the FFN's
 * workspace, and the dropout offset it used. z rather than the activation because act'(a) needs
 * a; h because dW2 needs it and storing T·F floats costs less than recomputing the gate and the
 * mask twice. x is the caller's, so it is passed again. */
#include "internal.h"

#include <clblast_c.h>
#include <stdlib.h>
#include <string.h>

static size_t n1(const clffn_config *c) { return c->gated ? 2 * c->d_ff : c->d_ff; }

/* Rows per chunk of the bias-gradient sums (cl/backward.cl): more means fewer partial sums, but
 * longer walks down the columns. */
enum { COLSUM_ROWS = 64 };

static size_t colsum_chunks(size_t tokens) { return (tokens + COLSUM_ROWS - 1) / COLSUM_ROWS; }

static clffn_status ensure_backward_workspace(clffn_ffn *ffn, size_t tokens) {
    if (tokens <= ffn->bws_tokens) { return CLFFN_SUCCESS; }
    const size_t F = ffn->cfg.d_ff, D = ffn->cfg.d_model;
    const size_t bytes[3] = {tokens * F * sizeof(float), tokens * n1(&ffn->cfg) * sizeof(float),
                             colsum_chunks(tokens) * (F > D ? F : D) * sizeof(float)};
    cl_mem m[3] = {NULL, NULL, NULL};
    cl_int err = CL_SUCCESS;
    for (int i = 0; i < 3 && err == CL_SUCCESS; ++i) {
        m[i] = clffn__buffer(ffn->ctx, CL_MEM_READ_WRITE, bytes[i], &err);
    }
    if (err != CL_SUCCESS) {
        for (int i = 0; i < 3; ++i) {
            if (m[i]) { clReleaseMemObject(m[i]); }
        }
        return (clffn_status)err;
    }
    cl_mem *old[3] = {&ffn->dh, &ffn->dz, &ffn->colsum};
    for (int i = 0; i < 3; ++i) {
        if (*old[i]) { clReleaseMemObject(*old[i]); }
        *old[i] = m[i];
    }
    ffn->bws_tokens = tokens;
    return CLFFN_SUCCESS;
}

/* out (+)= the column sums of m [rows, n] (row stride ld): partial sums of row chunks, then
 * their sums (cl/backward.cl says why two passes). */
static cl_int column_sums(clffn_ffn *ffn, cl_mem m, size_t m_off, size_t ld, size_t rows, size_t n,
                          const clffn_buffer *out, int accumulate, cl_command_queue q) {
    cl_kernel k = ffn->column_partials;
    const cl_ulong mo = m_off, l = ld, r = rows, nn = n, oo = out->offset;
    const cl_ulong chunks = colsum_chunks(rows), chunk_rows = COLSUM_ROWS;
    const cl_uint acc = accumulate != 0;
    cl_int err = CL_SUCCESS;
    SET_ARG(k, 0, m);
    SET_ARG(k, 1, mo);
    SET_ARG(k, 2, l);
    SET_ARG(k, 3, r);
    SET_ARG(k, 4, nn);
    SET_ARG(k, 5, chunk_rows);
    SET_ARG(k, 6, ffn->colsum);
    const size_t global[2] = {(n + 3) / 4, (size_t)chunks};
    if (err == CL_SUCCESS) { err = clEnqueueNDRangeKernel(q, k, 2, NULL, global, NULL, 0, NULL, NULL); }
    k = ffn->column_sums;
    SET_ARG(k, 0, ffn->colsum);
    SET_ARG(k, 1, chunks);
    SET_ARG(k, 2, nn);
    SET_ARG(k, 3, out->mem);
    SET_ARG(k, 4, oo);
    SET_ARG(k, 5, acc);
    const size_t g1 = n;
    if (err == CL_SUCCESS) { err = clEnqueueNDRangeKernel(q, k, 1, NULL, &g1, NULL, 0, NULL, NULL); }
    return err;
}

static cl_int epilogue_backward(clffn_ffn *ffn, size_t tokens, cl_command_queue q) {
    const clffn_config *c = &ffn->cfg;
    const int drop = ffn->last_drop;
    cl_kernel k = drop ? ffn->backward1_train : ffn->backward1;
    const cl_ulong ldz = n1(c);
    cl_int err = k ? CL_SUCCESS : CL_INVALID_KERNEL;
    SET_ARG(k, 0, ffn->dh);
    SET_ARG(k, 1, ffn->z);
    SET_ARG(k, 2, ldz);
    SET_ARG(k, 3, ffn->dz);
    if (err == CL_SUCCESS) {
        err = clffn__set_epilogue1_args(ffn, k, 4, tokens, drop, ffn->last_p, ffn->last_rng_offset);
    }
    const cl_uint vec = (c->d_ff % 4) == 0;
    SET_ARG(k, 15, vec);
    if (err == CL_SUCCESS) { err = clffn__launch(ffn, k, c->d_ff, tokens, q, NULL); }
    return err;
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
    const clffn_config *c = &ffn->cfg;
    const size_t T = tokens, D = c->d_model, F = c->d_ff, N1 = n1(c);
    const bool stacked_g = c->gated && !g->v.mem;
    /* every buffer checked before anything is enqueued (sizes fit: the forward ran on them) */
    struct {
        cl_mem mem;
        size_t off, count;
        bool needed;
    } checks[] = {
        {x, x_offset, T * D, true},
        {dy, dy_offset, T * D, true},
        {dx, dx_offset, T * D, dx != NULL},
        {g->w1.mem, g->w1.offset, (stacked_g ? N1 : F) * D, true},
        {g->b1.mem, g->b1.offset, F, c->bias1 != 0},
        {g->v.mem, g->v.offset, F * D, c->gated && !stacked_g},
        {g->bv.mem, g->bv.offset, F, c->gated && c->bias_gate},
        {g->w2.mem, g->w2.offset, D * F, true},
        {g->b2.mem, g->b2.offset, D, c->bias2 != 0},
    };
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; ++i) {
        if (checks[i].needed &&
            (st = clffn__check_buffer(ffn->ctx, checks[i].mem, checks[i].off, checks[i].count)) !=
                CLFFN_SUCCESS) {
            return st;
        }
    }
    if ((st = ensure_backward_workspace(ffn, T)) != CLFFN_SUCCESS) { return st; }

    const bool oi = ffn->layout == CLFFN_LAYOUT_OUT_IN;
    const float beta = accumulate ? 1.0f : 0.0f;
    const CLBlastTranspose N = CLBlastTransposeNo, Y = CLBlastTransposeYes;
    cl_int err;
    /* dh = dy·W2 (W2 [D, F] OUT_IN, [F, D] IN_OUT) */
    err = clffn__sgemm(ffn, N, oi ? N : Y, T, F, D, 1.0f, dy, dy_offset, D, ffn->w2.mem,
                       ffn->w2.offset, oi ? F : D, 0.0f, ffn->dh, 0, F, &queue, NULL);
    /* dW2 */
    if (err == CL_SUCCESS) {
        err = oi ? clffn__sgemm(ffn, Y, N, D, F, T, 1.0f, dy, dy_offset, D, ffn->h, 0, F, beta,
                                g->w2.mem, g->w2.offset, F, &queue, NULL)
                 : clffn__sgemm(ffn, Y, N, F, D, T, 1.0f, ffn->h, 0, F, dy, dy_offset, D, beta,
                                g->w2.mem, g->w2.offset, D, &queue, NULL);
    }
    if (err == CL_SUCCESS && c->bias2) { err = column_sums(ffn, dy, dy_offset, D, T, D, &g->b2, accumulate, queue); }
    if (err == CL_SUCCESS) { err = epilogue_backward(ffn, T, queue); }
    if (err == CL_SUCCESS && c->bias1) { err = column_sums(ffn, ffn->dz, 0, N1, T, F, &g->b1, accumulate, queue); }
    if (err == CL_SUCCESS && c->gated && c->bias_gate) {
        err = column_sums(ffn, ffn->dz, F, N1, T, F, &g->bv, accumulate, queue);
    }
    /* dW1 and dV: one SGEMM over the stacked dz when the gradients are stacked too */
    if (err == CL_SUCCESS) {
        if (!c->gated || stacked_g) {
            const size_t M = c->gated ? N1 : F;
            err = oi ? clffn__sgemm(ffn, Y, N, M, D, T, 1.0f, ffn->dz, 0, N1, x, x_offset, D, beta,
                                    g->w1.mem, g->w1.offset, D, &queue, NULL)
                     : clffn__sgemm(ffn, Y, N, D, M, T, 1.0f, x, x_offset, D, ffn->dz, 0, N1, beta,
                                    g->w1.mem, g->w1.offset, M, &queue, NULL);
        } else {
            const clffn_buffer *dst[2] = {&g->w1, &g->v};
            for (int h = 0; h < 2 && err == CL_SUCCESS; ++h) {
                err = oi ? clffn__sgemm(ffn, Y, N, F, D, T, 1.0f, ffn->dz, h * F, N1, x, x_offset, D,
                                        beta, dst[h]->mem, dst[h]->offset, D, &queue, NULL)
                         : clffn__sgemm(ffn, Y, N, D, F, T, 1.0f, x, x_offset, D, ffn->dz, h * F, N1,
                                        beta, dst[h]->mem, dst[h]->offset, F, &queue, NULL);
            }
        }
    }
    /* dx = dz·[W1|V] (+ dy) */
    if (err == CL_SUCCESS && dx) {
        float b = 0.0f;
        if (c->residual) {
            err = clEnqueueCopyBuffer(queue, dy, dx, dy_offset * sizeof(float),
                                      dx_offset * sizeof(float), T * D * sizeof(float), 0, NULL, NULL);
            b = 1.0f;
        }
        if (err == CL_SUCCESS && (!c->gated || ffn->stacked)) {
            const size_t K = c->gated ? N1 : F;
            err = clffn__sgemm(ffn, N, oi ? N : Y, T, D, K, 1.0f, ffn->dz, 0, N1, ffn->w1.mem,
                               ffn->w1.offset, oi ? D : K, b, dx, dx_offset, D, &queue, NULL);
        } else if (err == CL_SUCCESS) {
            const clffn_bound *w[2] = {&ffn->w1, &ffn->v};
            for (int h = 0; h < 2 && err == CL_SUCCESS; ++h) {
                err = clffn__sgemm(ffn, N, oi ? N : Y, T, D, F, 1.0f, ffn->dz, h * F, N1, w[h]->mem,
                                   w[h]->offset, oi ? D : F, h ? 1.0f : b, dx, dx_offset, D, &queue,
                                   NULL);
            }
        }
    }
    if (err == CL_SUCCESS && event) { err = clEnqueueMarkerWithWaitList(queue, 0, NULL, event); }
    return (clffn_status)err;
}

/* ------------------------------------------------------------------------------------------ */
/* Host level */

static cl_int upload_to(cl_command_queue q, cl_mem m, const float *src, size_t n) {
    return clEnqueueWriteBuffer(q, m, CL_FALSE, 0, n * sizeof(float), src, 0, NULL, NULL);
}

/* Reads the stacked [N1, D] / [D, N1] weight gradient into separate dW1 and dV arrays. */
static cl_int read_stacked(clffn_ffn *ffn, cl_command_queue q, float *w1, float *v) {
    const size_t D = ffn->cfg.d_model, F = ffn->cfg.d_ff;
    if (ffn->layout == CLFFN_LAYOUT_OUT_IN) {
        cl_int err = clEnqueueReadBuffer(q, ffn->g_w1, CL_FALSE, 0, F * D * 4, w1, 0, NULL, NULL);
        if (err == CL_SUCCESS && v) {
            err = clEnqueueReadBuffer(q, ffn->g_w1, CL_FALSE, F * D * 4, F * D * 4, v, 0, NULL, NULL);
        }
        return err;
    }
    const size_t host_origin[3] = {0, 0, 0}, region[3] = {F * 4, D, 1};
    const size_t o1[3] = {0, 0, 0}, o2[3] = {F * 4, 0, 0};
    const size_t ld = (v ? 2 * F : F) * 4;
    cl_int err = clEnqueueReadBufferRect(q, ffn->g_w1, CL_FALSE, o1, host_origin, region, ld, 0,
                                         F * 4, 0, w1, 0, NULL, NULL);
    if (err == CL_SUCCESS && v) {
        err = clEnqueueReadBufferRect(q, ffn->g_w1, CL_FALSE, o2, host_origin, region, ld, 0, F * 4,
                                      0, v, 0, NULL, NULL);
    }
    return err;
}

static cl_int write_stacked(clffn_ffn *ffn, cl_command_queue q, const float *w1, const float *v) {
    const size_t D = ffn->cfg.d_model, F = ffn->cfg.d_ff;
    if (ffn->layout == CLFFN_LAYOUT_OUT_IN || !v) {
        cl_int err = clEnqueueWriteBuffer(q, ffn->g_w1, CL_FALSE, 0, F * D * 4, w1, 0, NULL, NULL);
        if (err == CL_SUCCESS && v) {
            err = clEnqueueWriteBuffer(q, ffn->g_w1, CL_FALSE, F * D * 4, F * D * 4, v, 0, NULL, NULL);
        }
        return err;
    }
    const size_t host_origin[3] = {0, 0, 0}, region[3] = {F * 4, D, 1};
    const size_t o1[3] = {0, 0, 0}, o2[3] = {F * 4, 0, 0};
    cl_int err = clEnqueueWriteBufferRect(q, ffn->g_w1, CL_FALSE, o1, host_origin, region, 2 * F * 4,
                                          0, F * 4, 0, w1, 0, NULL, NULL);
    if (err == CL_SUCCESS) {
        err = clEnqueueWriteBufferRect(q, ffn->g_w1, CL_FALSE, o2, host_origin, region, 2 * F * 4, 0,
                                       F * 4, 0, v, 0, NULL, NULL);
    }
    return err;
}

static clffn_status ensure_backward_io(clffn_ffn *ffn, size_t tokens) {
    const clffn_config *c = &ffn->cfg;
    const size_t D = c->d_model, F = c->d_ff;
    cl_int err = CL_SUCCESS;
    if (!ffn->g_w1) { /* gradients: allocated once per FFN */
        ffn->g_w1 = clffn__buffer(ffn->ctx, CL_MEM_READ_WRITE, n1(c) * D * 4, &err);
        if (err == CL_SUCCESS) { ffn->g_w2 = clffn__buffer(ffn->ctx, CL_MEM_READ_WRITE, D * F * 4, &err); }
        if (err == CL_SUCCESS) { ffn->g_b1 = clffn__buffer(ffn->ctx, CL_MEM_READ_WRITE, F * 4, &err); }
        if (err == CL_SUCCESS) { ffn->g_bv = clffn__buffer(ffn->ctx, CL_MEM_READ_WRITE, F * 4, &err); }
        if (err == CL_SUCCESS) { ffn->g_b2 = clffn__buffer(ffn->ctx, CL_MEM_READ_WRITE, D * 4, &err); }
        if (err != CL_SUCCESS) {
            cl_mem *gs[] = {&ffn->g_w1, &ffn->g_w2, &ffn->g_b1, &ffn->g_bv, &ffn->g_b2};
            for (int i = 0; i < 5; ++i) {
                if (*gs[i]) { clReleaseMemObject(*gs[i]); }
                *gs[i] = NULL;
            }
            return (clffn_status)err;
        }
    }
    if (tokens > ffn->bio_tokens) {
        cl_mem a = clffn__buffer(ffn->ctx, CL_MEM_READ_WRITE, tokens * D * 4, &err);
        cl_mem b = err == CL_SUCCESS ? clffn__buffer(ffn->ctx, CL_MEM_READ_WRITE, tokens * D * 4, &err) : NULL;
        if (err != CL_SUCCESS) {
            if (a) { clReleaseMemObject(a); }
            return (clffn_status)err;
        }
        if (ffn->io_dy) { clReleaseMemObject(ffn->io_dy); }
        if (ffn->io_dx) { clReleaseMemObject(ffn->io_dx); }
        ffn->io_dy = a, ffn->io_dx = b, ffn->bio_tokens = tokens;
    }
    return CLFFN_SUCCESS;
}

clffn_status clffn_backward_host(clffn_ffn *ffn, size_t tokens, const float *x, size_t x_len,
                                 const float *dy, size_t dy_len, float *dx, size_t dx_len,
                                 const clffn_weight_arrays *g, int accumulate) {
    if (!ffn || !x || !dy || !g) { return CLFFN_ERROR_NULL_ARGUMENT; }
    const clffn_config *c = &ffn->cfg;
    if (!g->w1 || !g->w2 || (c->bias1 && !g->b1) || (c->bias2 && !g->b2) ||
        (c->gated && (!g->v || (c->bias_gate && !g->bv)))) {
        return CLFFN_ERROR_NULL_ARGUMENT;
    }
    if (!ffn->has_weights) { return CLFFN_ERROR_NO_WEIGHTS; }
    if (tokens == 0 || tokens != ffn->last_tokens) { return CLFFN_ERROR_NO_FORWARD; }
    const size_t D = c->d_model, F = c->d_ff, n = tokens * D; /* fitted the forward */
    if (x_len < n || dy_len < n || (dx && dx_len < n)) { return CLFFN_ERROR_BUFFER_TOO_SMALL; }
    clffn_status st = ensure_backward_io(ffn, tokens);
    if (st != CLFFN_SUCCESS) { return st; }
    /* x goes where the host-level forward keeps it; the forward's own x buffer is that one */
    if (!ffn->io_x || ffn->io_tokens < tokens) { return CLFFN_ERROR_NO_FORWARD; }
    cl_command_queue q = ffn->ctx->queue;
    cl_int err = upload_to(q, ffn->io_x, x, n);
    if (err == CL_SUCCESS) { err = upload_to(q, ffn->io_dy, dy, n); }
    if (err == CL_SUCCESS && accumulate) { /* the sums continue from the caller's arrays */
        err = write_stacked(ffn, q, g->w1, c->gated ? g->v : NULL);
        if (err == CL_SUCCESS) { err = upload_to(q, ffn->g_w2, g->w2, D * F); }
        if (err == CL_SUCCESS && c->bias1) { err = upload_to(q, ffn->g_b1, g->b1, F); }
        if (err == CL_SUCCESS && c->gated && c->bias_gate) { err = upload_to(q, ffn->g_bv, g->bv, F); }
        if (err == CL_SUCCESS && c->bias2) { err = upload_to(q, ffn->g_b2, g->b2, D); }
    }
    if (err != CL_SUCCESS) {
        clFinish(q);
        return (clffn_status)err;
    }
    const clffn_device_weights dg = {{ffn->g_w1, 0}, {ffn->g_b1, 0}, {NULL, 0},
                                     {ffn->g_bv, 0}, {ffn->g_w2, 0}, {ffn->g_b2, 0}};
    st = clffn_backward(ffn, tokens, ffn->io_x, 0, ffn->io_dy, 0, dx ? ffn->io_dx : NULL, 0, &dg,
                        accumulate, q, NULL);
    if (st != CLFFN_SUCCESS) {
        clFinish(q);
        return st;
    }
    err = read_stacked(ffn, q, g->w1, c->gated ? g->v : NULL);
    if (err == CL_SUCCESS) { err = clEnqueueReadBuffer(q, ffn->g_w2, CL_FALSE, 0, D * F * 4, g->w2, 0, NULL, NULL); }
    if (err == CL_SUCCESS && c->bias1) { err = clEnqueueReadBuffer(q, ffn->g_b1, CL_FALSE, 0, F * 4, g->b1, 0, NULL, NULL); }
    if (err == CL_SUCCESS && c->gated && c->bias_gate) { err = clEnqueueReadBuffer(q, ffn->g_bv, CL_FALSE, 0, F * 4, g->bv, 0, NULL, NULL); }
    if (err == CL_SUCCESS && c->bias2) { err = clEnqueueReadBuffer(q, ffn->g_b2, CL_FALSE, 0, D * 4, g->b2, 0, NULL, NULL); }
    if (err == CL_SUCCESS && dx) { err = clEnqueueReadBuffer(q, ffn->io_dx, CL_FALSE, 0, n * 4, dx, 0, NULL, NULL); }
    const cl_int fin = clFinish(q);
    return (clffn_status)(err != CL_SUCCESS ? err : fin);
}
