/* The FFN's device buffers, grown on demand, all of a set or none. */
#include "workspace.h"

#include "clffn_defs.h"
#include "launch.h"

/* Replaces the buffers in slots with new ones of the given sizes, all or none: on a failure
 * the old ones stay and the status is returned. The old ones are released once the commands on
 * queue (an earlier call's, still running) are done with them; NULL: none can be. */
static clffn_status grow(const clffn_context *ctx, size_t n, cl_mem *const slots[],
                         const size_t bytes[], cl_command_queue queue) {
    cl_mem fresh[6] = {NULL};
    cl_int err = CL_SUCCESS;
    for (size_t i = 0; i < n && err == CL_SUCCESS; ++i) {
        fresh[i] = clffn__buffer(ctx, CL_MEM_READ_WRITE, bytes[i], &err);
    }
    for (size_t i = 0; i < n; ++i) {
        if (err != CL_SUCCESS) {
            if (fresh[i]) { clReleaseMemObject(fresh[i]); }
            continue;
        }
        clffn__release_when_done(queue, *slots[i]);
        *slots[i] = fresh[i];
    }
    return (clffn_status)err;
}

clffn_status clffn__workspace_forward(clffn_workspace *ws, const clffn_context *ctx,
                                      const clffn_config *c, size_t tokens,
                                      cl_command_queue queue) {
    if (tokens <= ws->tokens) { return CLFFN_SUCCESS; }
    cl_mem *const slots[3] = {&ws->z, &ws->h, &ws->u};
    const size_t bytes[3] = {tokens * clffn__n1(c) * sizeof(float),
                             tokens * c->d_ff * sizeof(float), tokens * c->d_model * sizeof(float)};
    const clffn_status st = grow(ctx, 3, slots, bytes, queue);
    if (st == CLFFN_SUCCESS) { ws->tokens = tokens; }
    return st;
}

clffn_status clffn__workspace_backward(clffn_workspace *ws, const clffn_context *ctx,
                                       const clffn_config *c, size_t tokens,
                                       cl_command_queue queue) {
    if (tokens <= ws->bwd_tokens) { return CLFFN_SUCCESS; }
    const size_t F = c->d_ff, D = c->d_model;
    const size_t chunks = (tokens + CLFFN_COLSUM_ROWS - 1) / CLFFN_COLSUM_ROWS;
    cl_mem *const slots[3] = {&ws->dh, &ws->dz, &ws->colsum};
    const size_t bytes[3] = {tokens * F * sizeof(float), tokens * clffn__n1(c) * sizeof(float),
                             chunks * (F > D ? F : D) * sizeof(float)};
    const clffn_status st = grow(ctx, 3, slots, bytes, queue);
    if (st == CLFFN_SUCCESS) { ws->bwd_tokens = tokens; }
    return st;
}

clffn_status clffn__workspace_host_forward(clffn_workspace *ws, const clffn_context *ctx,
                                           const clffn_config *c, size_t tokens) {
    if (tokens <= ws->io_tokens) { return CLFFN_SUCCESS; }
    cl_mem *const slots[2] = {&ws->io_x, &ws->io_y};
    const size_t bytes = tokens * c->d_model * sizeof(float);
    const size_t sizes[2] = {bytes, bytes};
    /* the old ones after the context queue's commands: released at once, Oclgrind reported
     * reads of uninitialized values in the next forward's kernels (docs/RELIABILITY.md) */
    const clffn_status st = grow(ctx, 2, slots, sizes, ctx->queue);
    if (st == CLFFN_SUCCESS) { ws->io_tokens = tokens; }
    return st;
}

clffn_status clffn__workspace_host_backward(clffn_workspace *ws, const clffn_context *ctx,
                                            const clffn_config *c, size_t tokens,
                                            bool weight_grads) {
    const size_t D = c->d_model, F = c->d_ff;
    if (!ws->g_b1) { /* the gradients: their size does not depend on T */
        cl_mem *const slots[3] = {&ws->g_b1, &ws->g_bv, &ws->g_b2};
        const size_t bytes[3] = {F * sizeof(float), F * sizeof(float), D * sizeof(float)};
        const clffn_status st = grow(ctx, 3, slots, bytes, NULL);
        if (st != CLFFN_SUCCESS) { return st; }
    }
    if (weight_grads && !ws->g_w1) { /* not for weights kept compressed: those have none */
        cl_mem *const slots[2] = {&ws->g_w1, &ws->g_w2};
        const size_t bytes[2] = {clffn__n1(c) * D * sizeof(float), D * F * sizeof(float)};
        const clffn_status st = grow(ctx, 2, slots, bytes, NULL);
        if (st != CLFFN_SUCCESS) { return st; }
    }
    if (tokens <= ws->bio_tokens) { return CLFFN_SUCCESS; }
    cl_mem *const slots[2] = {&ws->io_dy, &ws->io_dx};
    const size_t bytes = tokens * D * sizeof(float);
    const size_t sizes[2] = {bytes, bytes};
    const clffn_status st = grow(ctx, 2, slots, sizes, ctx->queue); /* as the forward's */
    if (st == CLFFN_SUCCESS) { ws->bio_tokens = tokens; }
    return st;
}

void clffn__workspace_release(clffn_workspace *ws) {
    cl_mem *const bufs[] = {&ws->z,    &ws->h,    &ws->u,      &ws->io_x,  &ws->io_y,
                            &ws->dh,   &ws->dz,   &ws->colsum, &ws->io_dy, &ws->io_dx,
                            &ws->g_w1, &ws->g_b1, &ws->g_bv,   &ws->g_w2,  &ws->g_b2};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i) {
        if (*bufs[i]) { clReleaseMemObject(*bufs[i]); }
        *bufs[i] = NULL;
    }
    ws->tokens = ws->io_tokens = ws->bwd_tokens = ws->bio_tokens = 0;
}
