/* An expert of a mixture-of-experts layer on another context than the layer's
 * (clffn_moe_create_split: the router, the routing, the shared expert and the combine on the
 * first context, each routed expert on the context that owns it). It gets its gathered rows
 * through the host and sends its outputs back the same way (the contexts may share no buffer):
 *
 *   xg rows [o_e, o_e + n_e) ─read─► host ─expert e's host-level forward on its context─► host
 *   ─write─► yg rows [o_e, o_e + n_e)
 *
 * and the backward likewise with dyg and dxg, the expert's x being what its host-level forward
 * kept. It runs the same kernels on the same rows as an unsplit layer, so on devices that
 * compute alike the results are the same bits. */
#include "moe_remote.h"

#include "launch.h"

#include <stdlib.h>
#include <string.h>

clffn_status clffn__remote_forward(clffn_ffn *f, size_t n, cl_mem x, cl_mem y, size_t row0,
                                   cl_command_queue q) {
    const size_t nd = n * f->cfg.d_model, bytes = nd * sizeof(float);
    float *h = malloc(2 * bytes);
    if (!h) { return CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
    const size_t off = row0 * f->cfg.d_model * sizeof(float);
    clffn_status st = (clffn_status)clffn__read(q, x, off, bytes, h, 0, NULL);
    if (st == CLFFN_SUCCESS) { st = clffn_forward_host(f, n, h, nd, h + nd, nd); }
    if (st == CLFFN_SUCCESS) { st = (clffn_status)clffn__write(q, y, off, bytes, h + nd); }
    free(h);
    return st;
}

clffn_status clffn__remote_backward(clffn_ffn *f, size_t n, cl_mem dy, cl_mem dx, size_t row0,
                                    int own, int accumulate, cl_command_queue q) {
    cl_command_queue fq = f->ctx->queue;
    const size_t nd = n * f->cfg.d_model, bytes = nd * sizeof(float);
    if (f->last_tokens != n || !f->ws.io_x || f->ws.io_tokens < n) {
        return CLFFN_ERROR_NO_FORWARD; /* its host-level forward holds x */
    }
    float *h = malloc(bytes);
    if (!h) { return CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
    const size_t off = row0 * f->cfg.d_model * sizeof(float);
    clffn_status st = clffn__workspace_host_backward(&f->ws, f->ctx, &f->cfg, n,
                                                     own && f->w1.dtype == CLFFN_DTYPE_F32);
    if (st == CLFFN_SUCCESS) { st = (clffn_status)clffn__read(q, dy, off, bytes, h, 0, NULL); }
    if (st == CLFFN_SUCCESS) { st = (clffn_status)clffn__write(fq, f->ws.io_dy, 0, bytes, h); }
    clffn_device_weights none;
    memset(&none, 0, sizeof none);
    const clffn_device_weights g = own ? clffn__host_grads_device(f) : none;
    if (st == CLFFN_SUCCESS) {
        st = clffn_backward(f, n, f->ws.io_x, 0, f->ws.io_dy, 0, f->ws.io_dx, 0, &g, accumulate, fq,
                            NULL);
    }
    if (st == CLFFN_SUCCESS) {
        st = (clffn_status)clffn__read(fq, f->ws.io_dx, 0, bytes, h, 0, NULL);
    }
    if (st == CLFFN_SUCCESS) { st = (clffn_status)clffn__write(q, dx, off, bytes, h); }
    if (st != CLFFN_SUCCESS) { clffn__finish(fq); }
    free(h);
    return st;
}
