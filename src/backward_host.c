/* The host-level backward: the caller's arrays through the FFN's own device buffers. */
#include "ffn.h"

#include "launch.h"

#include <string.h>

static cl_int upload_to(cl_command_queue q, cl_mem m, const float *src, size_t n) {
    return clEnqueueWriteBuffer(q, m, CL_FALSE, 0, n * sizeof(float), src, 0, NULL, NULL);
}

static cl_int download(cl_command_queue q, cl_mem m, float *dst, size_t n) {
    return clEnqueueReadBuffer(q, m, CL_FALSE, 0, n * sizeof(float), dst, 0, NULL, NULL);
}

/* Moves dW1 and dV between the caller's separate arrays and the stacked gradient g_w1
 * ([2F, D] OUT_IN, [D, 2F] IN_OUT; [F, D] / [D, F] for a plain FFN, v = NULL). */
static cl_int transfer_stacked(const clffn_ffn *ffn, cl_command_queue q, int write, float *w1,
                               float *v) {
    const size_t D = ffn->cfg.d_model, F = ffn->cfg.d_ff, fd = F * D * sizeof(float);
    const cl_mem g = ffn->ws.g_w1;
    float *const parts[2] = {w1, v};
    if (write && v) {
        const float *const both[2] = {w1, v};
        return clffn__write_weight(q, g, ffn->grad_layout, ffn->grad_layout, F, D, both);
    }
    cl_int err = CL_SUCCESS;
    for (size_t i = 0; i < 2 && parts[i] && err == CL_SUCCESS; ++i) {
        if (ffn->grad_layout == CLFFN_LAYOUT_OUT_IN || !v) { /* whole rows: contiguous */
            err = write ? clEnqueueWriteBuffer(q, g, CL_FALSE, i * fd, fd, parts[i], 0, NULL, NULL)
                        : clEnqueueReadBuffer(q, g, CL_FALSE, i * fd, fd, parts[i], 0, NULL, NULL);
            continue;
        }
        const size_t origin[3] = {i * F * sizeof(float), 0, 0}, host[3] = {0, 0, 0};
        const size_t region[3] = {F * sizeof(float), D, 1}, ld = 2 * F * sizeof(float);
        err = write ? clEnqueueWriteBufferRect(q, g, CL_FALSE, origin, host, region, ld, 0,
                                               F * sizeof(float), 0, parts[i], 0, NULL, NULL)
                    : clEnqueueReadBufferRect(q, g, CL_FALSE, origin, host, region, ld, 0,
                                              F * sizeof(float), 0, parts[i], 0, NULL, NULL);
    }
    return err;
}

cl_int clffn__host_grads_upload(clffn_ffn *ffn, cl_command_queue q, const clffn_weight_arrays *g) {
    const clffn_config *c = &ffn->cfg;
    const clffn_workspace *ws = &ffn->ws;
    const size_t D = c->d_model, F = c->d_ff;
    cl_int err = CL_SUCCESS;
    if (g->w1) { err = transfer_stacked(ffn, q, 1, g->w1, c->gated ? g->v : NULL); }
    if (err == CL_SUCCESS && g->w2) { err = upload_to(q, ws->g_w2, g->w2, D * F); }
    if (err == CL_SUCCESS && c->bias1) { err = upload_to(q, ws->g_b1, g->b1, F); }
    if (err == CL_SUCCESS && c->gated && c->bias_gate) { err = upload_to(q, ws->g_bv, g->bv, F); }
    if (err == CL_SUCCESS && c->bias2) { err = upload_to(q, ws->g_b2, g->b2, D); }
    return err;
}

/* x, dy and (to accumulate) the caller's gradients onto the device. */
static cl_int upload_inputs(clffn_ffn *ffn, size_t n, const float *x, const float *dy,
                            const clffn_weight_arrays *g, int accumulate) {
    cl_command_queue q = ffn->ctx->queue;
    cl_int err = upload_to(q, ffn->ws.io_x, x, n);
    if (err == CL_SUCCESS) { err = upload_to(q, ffn->ws.io_dy, dy, n); }
    /* the sums continue from the caller's arrays */
    if (err == CL_SUCCESS && accumulate) { err = clffn__host_grads_upload(ffn, q, g); }
    return err;
}

cl_int clffn__host_grads_download(clffn_ffn *ffn, cl_command_queue q,
                                  const clffn_weight_arrays *g) {
    const clffn_config *c = &ffn->cfg;
    const clffn_workspace *ws = &ffn->ws;
    const size_t D = c->d_model, F = c->d_ff;
    cl_int err = g->w1 ? transfer_stacked(ffn, q, 0, g->w1, c->gated ? g->v : NULL) : CL_SUCCESS;
    if (err == CL_SUCCESS && g->w2) { err = download(q, ws->g_w2, g->w2, D * F); }
    if (err == CL_SUCCESS && c->bias1) { err = download(q, ws->g_b1, g->b1, F); }
    if (err == CL_SUCCESS && c->gated && c->bias_gate) { err = download(q, ws->g_bv, g->bv, F); }
    if (err == CL_SUCCESS && c->bias2) { err = download(q, ws->g_b2, g->b2, D); }
    return err;
}

void clffn__host_grads_zero(const clffn_config *c, const clffn_weight_arrays *g) {
    const size_t D = c->d_model, F = c->d_ff;
    float *const f[6] = {g->w1, g->b1, g->v, g->bv, g->w2, g->b2};
    const size_t n[6] = {
        F * D, c->bias1 ? F : 0, c->gated ? F * D : 0, c->gated && c->bias_gate ? F : 0,
        D * F, c->bias2 ? D : 0};
    for (int i = 0; i < 6; ++i) {
        if (f[i] && n[i]) { memset(f[i], 0, n[i] * sizeof(float)); }
    }
}

clffn_status clffn__host_grads_check(clffn_ffn *ffn, const clffn_weight_arrays *g) {
    const clffn_config *c = &ffn->cfg;
    /* weights kept compressed have no weight gradients: their arrays must be NULL */
    const bool weights = ffn->w1.dtype == CLFFN_DTYPE_F32;
    if (!weights && (g->w1 || g->v || g->w2)) { return clffn__refuse_compressed_grads(ffn); }
    if ((weights && (!g->w1 || !g->w2 || (c->gated && !g->v))) || (c->bias1 && !g->b1) ||
        (c->bias2 && !g->b2) || (c->gated && c->bias_gate && !g->bv)) {
        return CLFFN_ERROR_NULL_ARGUMENT;
    }
    return CLFFN_SUCCESS;
}

clffn_device_weights clffn__host_grads_device(const clffn_ffn *ffn) {
    const clffn_workspace *ws = &ffn->ws;
    const bool weights = ffn->w1.dtype == CLFFN_DTYPE_F32;
    const clffn_device_weights dg = {
        {weights ? ws->g_w1 : NULL, 0}, {ws->g_b1, 0}, {NULL, 0}, {ws->g_bv, 0},
        {weights ? ws->g_w2 : NULL, 0}, {ws->g_b2, 0}};
    return dg;
}

clffn_status clffn_backward_host(clffn_ffn *ffn, size_t tokens, const float *x, size_t x_len,
                                 const float *dy, size_t dy_len, float *dx, size_t dx_len,
                                 const clffn_weight_arrays *g, int accumulate) {
    if (!ffn || !x || !dy) { return CLFFN_ERROR_NULL_ARGUMENT; }
    const clffn_config *c = &ffn->cfg;
    const bool weights = ffn->w1.dtype == CLFFN_DTYPE_F32 && g; /* g NULL: dx alone */
    clffn_status st = g ? clffn__host_grads_check(ffn, g) : CLFFN_SUCCESS;
    if (st != CLFFN_SUCCESS) { return st; }
    if (!ffn->has_weights) { return CLFFN_ERROR_NO_WEIGHTS; }
    if (tokens == 0 || tokens != ffn->last_tokens) { return CLFFN_ERROR_NO_FORWARD; }
    const size_t n = tokens * c->d_model; /* fitted the forward */
    if (x_len < n || dy_len < n || (dx && dx_len < n)) { return CLFFN_ERROR_BUFFER_TOO_SMALL; }
    st = clffn__workspace_host_backward(&ffn->ws, ffn->ctx, &ffn->cfg, tokens, weights);
    if (st != CLFFN_SUCCESS) { return st; }
    /* x goes where the host-level forward keeps it; the forward's own x buffer is that one */
    const clffn_workspace *ws = &ffn->ws;
    if (!ws->io_x || ws->io_tokens < tokens) { return CLFFN_ERROR_NO_FORWARD; }
    cl_command_queue q = ffn->ctx->queue;
    cl_int err = upload_inputs(ffn, n, x, dy, g, g && accumulate);
    if (err != CL_SUCCESS) {
        clffn__finish(q);
        return (clffn_status)err;
    }
    clffn_device_weights dg;
    memset(&dg, 0, sizeof dg);
    if (g) { dg = clffn__host_grads_device(ffn); }
    st = clffn_backward(ffn, tokens, ws->io_x, 0, ws->io_dy, 0, dx ? ws->io_dx : NULL, 0, &dg,
                        accumulate, q, NULL);
    if (st != CLFFN_SUCCESS) {
        clffn__finish(q);
        return st;
    }
    err = g ? clffn__host_grads_download(ffn, q, g) : CL_SUCCESS;
    if (err == CL_SUCCESS && dx) { err = download(q, ws->io_dx, dx, n); }
    const cl_int fin = clffn__finish(q);
    return (clffn_status)(err != CL_SUCCESS ? err : fin);
}
