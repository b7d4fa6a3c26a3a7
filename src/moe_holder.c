/* clffn_moe_holder: a run of a layer's routed experts in a process that does not hold the layer
 * (clffn_moe_create_partial's other side). It runs each expert through the FFN API on the rows
 * an exchange brings, the same calls a split layer's other contexts make (moe_remote.c), so its
 * outputs and gradients are the bits a whole layer computes on those rows:
 *
 *   forward:  in [Σ n_e, D] ─expert e's host-level forward on its n_e rows─► out   (in kept)
 *   backward: in = dy rows ─clffn_backward_host at the kept rows─► out = dx rows, its grads
 *
 * Above the layer's files: it uses the FFN API, the layer's config checks, and the expert's
 * forward as part of the layer's pass (clffn__forward_host_as_pass, with the pass's tokens that
 * the exchange carries), so its rows sum as the whole layer's. */
#include "reference_moe.h"

#include "ffn.h"

#include <stdlib.h>
#include <string.h>

struct clffn_moe_holder {
    clffn_moe_config cfg;
    size_t first, count;
    clffn_ffn **ffn; /* [count] */
    /* the last forward's rows, for the backward: x [Σ n_e, D] and each expert's n_e */
    float *x;
    size_t x_cap, *last_rows;
    int has_forward;
    clffn_scratch wscratch, gscratch; /* the experts' scratch, one at a time (moe.h) */
};

void clffn_moe_holder_destroy(clffn_moe_holder *h) {
    if (!h) { return; }
    for (size_t i = 0; h->ffn && i < h->count; ++i) { clffn_ffn_destroy(h->ffn[i]); }
    clffn__scratch_release(&h->wscratch);
    clffn__scratch_release(&h->gscratch);
    free(h->ffn), free(h->x), free(h->last_rows);
    free(h);
}

clffn_status clffn_moe_holder_create(clffn_context *ctx, const clffn_moe_config *config,
                                     size_t first, size_t count, clffn_moe_holder **out) {
    if (!ctx || !config || !out) { return CLFFN_ERROR_NULL_ARGUMENT; }
    clffn_status st = clffn__moe_config_check(config);
    if (st != CLFFN_SUCCESS) { return st; }
    if (count == 0 || first > config->experts || count > config->experts - first) {
        return CLFFN_ERROR_INVALID_ARGUMENT;
    }
    clffn_moe_holder *h = calloc(1, sizeof *h);
    if (!h) { return CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
    h->cfg = *config, h->first = first, h->count = count;
    h->ffn = calloc(count, sizeof *h->ffn);
    h->last_rows = calloc(count, sizeof *h->last_rows);
    st = h->ffn && h->last_rows ? CLFFN_SUCCESS : CLFFN_ERROR_OUT_OF_HOST_MEMORY;
    for (size_t i = 0; i < count && st == CLFFN_SUCCESS; ++i) {
        st = clffn_ffn_create(ctx, &config->expert, &h->ffn[i]);
        if (st == CLFFN_SUCCESS) {
            clffn__ffn_share_scratch(h->ffn[i], &h->wscratch, &h->gscratch);
        }
    }
    if (st != CLFFN_SUCCESS) {
        clffn_moe_holder_destroy(h);
        return st;
    }
    *out = h;
    return CLFFN_SUCCESS;
}

clffn_ffn *clffn_moe_holder_expert(clffn_moe_holder *h, size_t e) {
    return h && e >= h->first && e - h->first < h->count ? h->ffn[e - h->first] : NULL;
}

/* The forward's rows kept for the backward (x grown to fit, all or nothing). */
static clffn_status keep_rows(clffn_moe_holder *h, const size_t *rows, const float *in,
                              size_t total) {
    const size_t n = total * h->cfg.expert.d_model;
    if (n > h->x_cap) {
        float *x = malloc(n * sizeof *x);
        if (!x) { return CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
        free(h->x);
        h->x = x, h->x_cap = n;
    }
    if (n) { memcpy(h->x, in, n * sizeof *in); }
    for (size_t i = 0; i < h->count; ++i) { h->last_rows[i] = rows[h->first + i]; }
    h->has_forward = 1;
    return CLFFN_SUCCESS;
}

clffn_status clffn_moe_holder_run(clffn_moe_holder *h, int pass, const size_t *rows,
                                  const float *in, float *out, const clffn_weight_arrays *grads) {
    if (!h || !rows) { return CLFFN_ERROR_NULL_ARGUMENT; }
    const bool backward = pass & CLFFN_MOE_PASS_BACKWARD;
    const bool want = backward && (pass & CLFFN_MOE_PASS_GRADS);
    const int accumulate = want && (pass & CLFFN_MOE_PASS_ACCUMULATE) ? 1 : 0;
    const size_t D = h->cfg.expert.d_model;
    size_t total = 0;
    for (size_t i = 0; i < h->count; ++i) {
        const size_t n = rows[h->first + i];
        if (n > SIZE_MAX / D / sizeof(float) - total) { return CLFFN_ERROR_SIZE_OVERFLOW; }
        total += n;
        if (backward && (!h->has_forward || n != h->last_rows[i])) {
            return CLFFN_ERROR_NO_FORWARD; /* the experts differentiate at the last forward */
        }
    }
    if ((total && (!in || !out)) || (want && !grads)) { return CLFFN_ERROR_NULL_ARGUMENT; }
    clffn_status st = backward ? CLFFN_SUCCESS : keep_rows(h, rows, in, total);
    size_t at = 0;
    for (size_t i = 0; i < h->count && st == CLFFN_SUCCESS; ++i) {
        const size_t n = rows[h->first + i], nd = n * D;
        clffn_ffn *f = h->ffn[i];
        if (!backward && n) {
            st = clffn__forward_host_as_pass(f, n, CLFFN_MOE_PASS_TOKENS(pass), in + at, nd,
                                             out + at, nd);
        } else if (backward && n) {
            st = clffn_backward_host(f, n, h->x + at, nd, in + at, nd, out + at, nd,
                                     want ? &grads[i] : NULL, accumulate);
        } else if (want && !accumulate) {
            clffn__host_grads_zero(&f->cfg, &grads[i]);
        }
        at += nd;
    }
    if (st != CLFFN_SUCCESS && !backward) { h->has_forward = 0; } /* nothing to differentiate */
    return st;
}
