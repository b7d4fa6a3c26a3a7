/* The FFN's own device buffers, grown on demand, all of a set or none. Below the FFN: it takes
 * the context and the config it needs as arguments. */
#ifndef CLFFN_WORKSPACE_H
#define CLFFN_WORKSPACE_H

#include "context.h"

/* The FFN's own device buffers, each set grown on demand. Old buffers are released, not reused:
 * commands still queued on them keep them alive, and nothing new can race with them. */
typedef struct clffn_workspace {
    size_t tokens; /* z [T, N1], h [T, F], u [T, D] */
    cl_mem z, h, u;
    size_t io_tokens; /* the host-level forward's x and y [T, D] */
    cl_mem io_x, io_y;
    size_t bwd_tokens; /* dh [T, F], dz [T, N1], colsum [ceil(T / 64), max(F, D)] */
    cl_mem dh, dz, colsum;
    size_t bio_tokens; /* the host-level backward's dy and dx [T, D] */
    cl_mem io_dy, io_dx;
    cl_mem g_w1, g_b1, g_bv, g_w2, g_b2; /* its gradients, W1 and V stacked; made once */
} clffn_workspace;

/* Each grows its set to at least tokens rows (the old buffers are released once what queue, an
 * earlier asynchronous call's, holds is done with them; NULL: none can be), or leaves it as it
 * was and returns the allocation's status. */
/* z [T, N1], h [T, F], u [T, D]: a forward's intermediates */
clffn_status clffn__workspace_forward(clffn_workspace *ws, const clffn_context *ctx,
                                      const clffn_config *c, size_t tokens, cl_command_queue queue);
/* dh [T, F], dz [T, N1], colsum: a backward's */
clffn_status clffn__workspace_backward(clffn_workspace *ws, const clffn_context *ctx,
                                       const clffn_config *c, size_t tokens,
                                       cl_command_queue queue);
/* x, y [T, D]: the host-level forward's */
clffn_status clffn__workspace_host_forward(clffn_workspace *ws, const clffn_context *ctx,
                                           const clffn_config *c, size_t tokens);
/* dy, dx [T, D] and the gradients: the host-level backward's (the weights' only with
 * weight_grads) */
clffn_status clffn__workspace_host_backward(clffn_workspace *ws, const clffn_context *ctx,
                                            const clffn_config *c, size_t tokens,
                                            bool weight_grads);
void clffn__workspace_release(clffn_workspace *ws);

#endif
