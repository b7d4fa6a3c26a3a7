/* A mixture-of-experts layer's forward from and to the caller's arrays: x written to the layer's
 * own io buffers, clffn_moe_forward between them, y read back only when all of it succeeded.
 * io_x keeps the x that clffn_moe_backward_host (moe_backward.c) differentiates at. */
#include "moe.h"

#include "launch.h"
#include "transfer.h"

static clffn_status grow_io(clffn_moe *moe, size_t T) {
    if (T <= moe->io_tokens) { return CLFFN_SUCCESS; }
    const size_t bytes = T * moe->cfg.expert.d_model * sizeof(float);
    cl_int err = CL_SUCCESS;
    cl_mem m[3] = {NULL};
    for (size_t i = 0; i < 3 && err == CL_SUCCESS; ++i) {
        m[i] = clffn__buffer(moe->ctx, CL_MEM_READ_WRITE, bytes, &err);
    }
    if (err != CL_SUCCESS) {
        for (size_t i = 0; i < 3; ++i) { clffn__release_mem(&m[i]); }
        return (clffn_status)err;
    }
    /* the old ones after the queue's commands, as an FFN's (src/workspace.c) */
    cl_mem *const old[3] = {&moe->io_x, &moe->io_y, &moe->io_dx};
    for (size_t i = 0; i < 3; ++i) {
        clffn__release_when_done(moe->ctx->queue, *old[i]);
        *old[i] = m[i];
    }
    moe->io_tokens = T;
    return CLFFN_SUCCESS;
}

clffn_status clffn_moe_forward_host(clffn_moe *moe, size_t tokens, const float *x, size_t x_len,
                                    float *y, size_t y_len, int32_t *experts, float *weights) {
    if (!moe || (tokens && (!x || !y))) { return CLFFN_ERROR_NULL_ARGUMENT; }
    const size_t D = moe->cfg.expert.d_model, k = moe->cfg.top_k;
    size_t n;
    if (!clffn__mul_ok(tokens, D, &n)) { return CLFFN_ERROR_SIZE_OVERFLOW; }
    if (x_len < n || y_len < n) { return CLFFN_ERROR_BUFFER_TOO_SMALL; }
    if (tokens == 0) { return CLFFN_SUCCESS; }
    cl_command_queue q = moe->ctx->queue;
    clffn_status st = grow_io(moe, tokens);
    if (st == CLFFN_SUCCESS) {
        st = (clffn_status)clffn__write(q, moe->io_x, 0, n * sizeof(float), x);
    }
    if (st == CLFFN_SUCCESS) { st = clffn_moe_forward(moe, tokens, moe->io_x, 0, moe->io_y, 0, q); }
    if (st == CLFFN_SUCCESS) { st = (clffn_status)clffn__finish(q); }
    if (st != CLFFN_SUCCESS) { return st; }
    moe->last_host = true; /* io_x holds the x a host-level backward differentiates at */
    /* the outputs only now, when all of the forward has succeeded */
    st = (clffn_status)clffn__read(q, moe->io_y, 0, n * sizeof(float), y, 0, NULL);
    if (st == CLFFN_SUCCESS && experts) {
        st = (clffn_status)clffn__read(q, moe->chosen, 0, tokens * k * sizeof(int32_t), experts, 0,
                                       NULL);
    }
    if (st == CLFFN_SUCCESS && weights) {
        st = (clffn_status)clffn__read(q, moe->weights, 0, tokens * k * sizeof(float), weights, 0,
                                       NULL);
    }
    return st;
}
