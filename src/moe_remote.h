/* An expert FFN that runs on another context than its mixture-of-experts layer (moe_remote.c):
 * its forward and backward on rows of the layer's buffers, moved through the host. Below the
 * layer (moe.c), which decides where each expert runs. */
#ifndef CLFFN_MOE_REMOTE_H
#define CLFFN_MOE_REMOTE_H

#include "ffn.h"

/* y rows [row0, row0 + n) = f(x rows [row0, row0 + n)), x and y [·, d_model] on the layer's
 * queue q (blocking): the rows read to the host, f's host-level forward on its own context
 * (which keeps them as its x for the backward), its outputs written back. */
clffn_status clffn__remote_forward(clffn_ffn *f, size_t n, cl_mem x, cl_mem y, size_t row0,
                                   cl_command_queue q);

/* dx rows = f's backward of dy rows (the same rows) at the x of its last host-level forward,
 * which must have been of n rows (else NO_FORWARD); own: f's weight and bias gradients into its
 * own buffers (added with accumulate), for the host level to download; else none. Blocking. */
clffn_status clffn__remote_backward(clffn_ffn *f, size_t n, cl_mem dy, cl_mem dx, size_t row0,
                                    int own, int accumulate, cl_command_queue q);

#endif
