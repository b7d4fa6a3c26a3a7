/* The clffn_moe, owned by moe.c (create, router, forward; moe_host.c the forward from host
 * arrays); moe_backward.c differentiates it.
 * Shapes as in clffn.h: T tokens, D = d_model, E experts, k chosen per token. */
#ifndef CLFFN_MOE_H
#define CLFFN_MOE_H

#include "ffn.h"
#include "moe_grouped.h"
#include "moe_remote.h"

struct clffn_moe {
    clffn_context *ctx;
    clffn_moe_config cfg;
    size_t n_ffn;        /* E, + 1 with a shared expert (the last) */
    clffn_ffn **ffn;     /* [n_ffn] */
    size_t router_rows;  /* R: E, + 1 with a gated shared expert */
    cl_mem router, bias; /* [R, D], [R] (bias NULL without one) */
    cl_kernel logits, route, count, place, gather, combine, route_few; /* forward */
    /* the logits a work-item each (clffn_moe_logits_rows, the same bits as clffn_moe_logits):
     * a CPU device's form; the tests flip it to compare the two */
    cl_kernel logits_rows;
    int router_items;
    cl_kernel scatter_dy, router_backward, dx_kernel, router_grads, scale_dy; /* backward */
    /* route, count and place in one launch (route_few) up to this many choices T·k:
     * CLFFN_MOE_LANES, a choice a lane (cl/moe.cl); the tests move it to compare the two ways */
    size_t few_choices;
    /* the workspace for `tokens` tokens: probs [T, E], chosen, weights, slot [T, k], counts
     * [2E + 1] (E counts, a 0, and the experts with rows: cl/moe.cl's clffn_moe_place),
     * xg and yg [g_rows, D] (T·k rows, or E·T with the counts on the device: moe.c), ys [T, D]
     * (with a shared expert), gate [T] (its scale, with a gated one) */
    size_t tokens, g_rows;
    cl_mem probs, chosen, weights, slot, counts, xg, yg, ys, gate;
    size_t io_tokens; /* the host-level passes' x, y (dy in the backward) and dx [T, D] */
    cl_mem io_x, io_y, io_dx;
    /* the last forward, for the backward: its T (0: none), whether it was host-level, and
     * whether it kept the counts on the device (host_counts then stale, xg and yg by expert) */
    size_t last_tokens;
    bool last_host, last_counted;
    /* the backward's workspace for bwd_tokens tokens: dyg and dxg [T·k, D], dxs [T, D] (with a
     * shared expert), dlogit [T, R], dys [T, D] (a gated shared expert's dy); the host-level
     * backward's router gradients [R, D], [R] */
    size_t bwd_tokens;
    cl_mem dyg, dxg, dxs, dlogit, dys;
    cl_mem g_router, g_rbias;
    cl_uint *host_counts; /* [E] */
    /* a partial layer (clffn_moe_create_partial): experts [held0, held1) here, the others'
     * rows through exchange (NULL for any other layer) */
    clffn_moe_exchange_fn exchange;
    void *exchange_user;
    size_t held0, held1;
    cl_event last_event;           /* the layer's last kernel: clffn_moe_destroy waits for it */
    clffn_moe_counts counts_where; /* clffn_moe_set_counts() */
    /* the routed experts' weights in pools, and the grouped launches (moe_grouped.h); whether
     * the last forward ran them */
    clffn_moe_group group;
    bool last_grouped;
    /* the scratch of the experts on the layer's context (wmatrix.h, gemm.h): they run one at a
     * time */
    clffn_scratch wscratch, gscratch;
};

/* Enqueues one of the layer's kernels over g0 (× g1 when g1 > 0) work-items, keeping its event
 * as last_event. */
cl_int clffn__moe_enqueue(clffn_moe *moe, cl_command_queue q, cl_kernel kernel, size_t g0,
                          size_t g1);

/* Whether expert e is held by another process (a partial layer's, away) or runs on another
 * context than the layer's (a layer made by clffn_moe_create_split); either way it runs
 * through moe_remote.h. Whether any does; and a
 * pass's jobs for those with rows after a forward of T tokens whose counts were read back
 * (p->jobs allocated, for the caller to free after clffn__remote_finish; none for a layer on
 * one context), the forward's (xg into yg) or the backward's (dyg into dxg). */
static inline bool clffn__moe_away(const clffn_moe *moe, size_t e) {
    return moe->exchange && e < moe->cfg.experts && (e < moe->held0 || e >= moe->held1);
}
static inline bool clffn__moe_remote(const clffn_moe *moe, size_t e) {
    return moe->ffn[e]->ctx != moe->ctx || clffn__moe_away(moe, e);
}
bool clffn__moe_split(const clffn_moe *moe);
clffn_status clffn__moe_remote_pass(const clffn_moe *moe, size_t T, bool backward,
                                    clffn_remote_pass *p);

/* How a forward lays out the experts' gathered rows (xg, yg), and so where its counts are:
 *  PACKED:    [T·k, D], each expert's after the lower ones'; the counts read back to the host.
 *  BY_EXPERT: [E·T, D], expert e's from row e·T; the counts stay on the device (one pass of the
 *             kernels: T ≤ CLFFN_MAX_KERNEL_TOKENS).
 *  TILED:     [TILE·S, D], each expert's in tiles of CLFFN_MOE_TILE after the lower ones'
 *             (cl/moe.cl, clffn_moe_tiles); the counts stay on the device (past one pass, the
 *             experts grouped). */
typedef enum clffn_moe_rows {
    CLFFN_MOE_ROWS_PACKED = 0,
    CLFFN_MOE_ROWS_BY_EXPERT,
    CLFFN_MOE_ROWS_TILED
} clffn_moe_rows;

/* Routing and the experts of a forward of T tokens, their rows laid out as `rows` says,
 * without the combine into y: the forward's start, and what the backward runs again (PACKED)
 * after a forward that kept the counts on the device, to have them on the host. */
clffn_status clffn__moe_route_and_run(clffn_moe *moe, size_t T, cl_mem x, size_t xo,
                                      clffn_moe_rows rows, cl_command_queue q);

#endif
