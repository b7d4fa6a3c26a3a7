/* The clffn_ffn and the helpers its passes share. Files above the context, from the bottom up:
 * launch, gemm, linear → workspace, epilogue → forward, backward → ffn (create, weights,
 * dropout state). Shapes as in clffn.h: T tokens, D = d_model, F = d_ff, N1 = F or 2F (gated). */
#ifndef CLFFN_FFN_H
#define CLFFN_FFN_H

#include "gemm.h"
#include "linear.h"

/* What a pass does about dropout: whether it drops, with which p, at which Philox offset. */
typedef struct clffn_dropout_use {
    int on;
    float p;
    uint64_t offset;
} clffn_dropout_use;

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

struct clffn_ffn {
    clffn_context *ctx;
    clffn_config cfg;
    cl_kernel epilogue1;       /* no dropout: inference, or p = 0 */
    cl_kernel epilogue1_train; /* with dropout; exists while p > 0 */
    cl_kernel epilogue2;
    cl_kernel backward1;       /* epilogue 1's backward without dropout */
    cl_kernel backward1_train; /* with dropout; exists while p > 0 */
    cl_kernel column_partials; /* the bias gradients' two passes */
    cl_kernel column_sums;

    /* weights, each mem retained (owned or the caller's) */
    bool has_weights;
    bool stacked;           /* gated with V stacked into w1: one product for both */
    clffn_linear w1, v, w2; /* w1: in D, out N1 when stacked, else F; w2: in F, out D */
    /* the layout the caller handed the weights over in, which gradients are written in; the
     * linears' own layout is how they are kept (clffn_context_set_weight_layout) */
    clffn_layout grad_layout;
    clffn_buffer b1, bv, b2;

    /* a tensor-parallel shard holds the hidden columns [hidden_col0, hidden_col0 + d_ff) of a
     * layer hidden_total wide (0 and d_ff when unsplit): dropout indexes by the layer */
    size_t hidden_col0, hidden_total;

    /* dropout state */
    int training;
    uint64_t seed;
    uint64_t rng_offset;

    clffn_workspace ws;
    clffn_scratch scratch; /* CLBlast's, for every product of the FFN */

    /* the last forward, for clffn_ffn_read_hidden() and clffn_backward() */
    size_t last_tokens;
    clffn_dropout_use last_drop;
    cl_event last_event;         /* completion of epilogue1 of the last forward, or NULL */
    cl_command_queue last_queue; /* its queue (retained), flushed before we wait on it */

    /* stage timing (clffn_ffn_set_profiling): a marker before GEMM 1 and epilogue 2's event */
    int profiling;
    cl_event prof_start, prof_end;
};

static inline size_t clffn__n1(const clffn_config *c) { return c->gated ? 2 * c->d_ff : c->d_ff; }

static inline clffn_gemm_env clffn__gemm_env(clffn_ffn *ffn, cl_command_queue *queue) {
    const clffn_gemm_env env = {ffn->ctx, &ffn->scratch, queue};
    return env;
}

/* workspace.c */
clffn_status clffn__workspace_forward(clffn_ffn *ffn, size_t tokens, cl_command_queue queue);
clffn_status clffn__workspace_backward(clffn_ffn *ffn, size_t tokens, cl_command_queue queue);
clffn_status clffn__workspace_host_forward(clffn_ffn *ffn, size_t tokens);
clffn_status clffn__workspace_host_backward(clffn_ffn *ffn, size_t tokens);
void clffn__workspace_release(clffn_workspace *ws);

/* epilogue.c: clffn's own kernels around the products (cl/epilogue.cl, cl/backward.cl) */
/* h [T, F] = dropout(act(z1 + b1) ⊙ (z2 + bv)) */
cl_int clffn__epilogue1(clffn_ffn *ffn, size_t tokens, const clffn_dropout_use *drop,
                        cl_command_queue queue, cl_event *event);
/* dz [T, N1] from dh [T, F], z and the last forward's dropout */
cl_int clffn__epilogue1_backward(clffn_ffn *ffn, size_t tokens, cl_command_queue queue);
/* y [T, D] = u + b2 (+ x) */
cl_int clffn__epilogue2(clffn_ffn *ffn, size_t tokens, clffn_matrix x, clffn_matrix y,
                        cl_command_queue queue, cl_event *event);
/* out[n] (+)= column sums of m [rows, n] */
cl_int clffn__column_sums(clffn_ffn *ffn, clffn_matrix m, size_t rows, size_t n,
                          const clffn_buffer *out, int accumulate, cl_command_queue queue);

#endif
