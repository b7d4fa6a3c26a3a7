/* Tensor-parallel slices of an FFN's hidden layer, on the host: which columns a shard holds, and
 * the copies between a layer's full weights and one shard's slice of them.
 *
 * Megatron-LM's split: shard i holds hidden units [f0, f1), i.e. rows f0..f1 of W1 and V (and
 * b1, bv) and columns f0..f1 of W2. In OUT_IN layout ([out, in]) W1's slice is a block of whole
 * rows and W2's a column band; in IN_OUT it is the other way round. Both are one strided block
 * copy. */
#include "common.h"

#include <string.h>

clffn_status clffn_shard_range(size_t d_ff, int index, int count, size_t *f0, size_t *f1) {
    if (!f0 || !f1) { return CLFFN_ERROR_NULL_ARGUMENT; }
    /* whole float4 groups where d_ff allows it: each shard then keeps the kernels' float4 path
     * and its rows start on Philox blocks (cl/epilogue.cl) */
    const size_t unit = d_ff % 4 == 0 ? 4 : 1, units = d_ff / unit;
    if (count < 1 || index < 0 || index >= count || (size_t)count > units) {
        return CLFFN_ERROR_INVALID_ARGUMENT;
    }
    const size_t n = (size_t)count, i = (size_t)index, base = units / n, extra = units % n;
    /* the first `extra` shards take one unit more */
    *f0 = unit * (i * base + (i < extra ? i : extra));
    *f1 = *f0 + unit * (base + (i < extra ? 1 : 0));
    return CLFFN_SUCCESS;
}

/* dst[r·dst_ld + c] (+)= src[r·src_ld + c] for r < rows, c < cols */
static void copy_block(float *dst, size_t dst_ld, const float *src, size_t src_ld, size_t rows,
                       size_t cols, int accumulate) {
    for (size_t r = 0; r < rows; ++r) {
        float *d = dst + r * dst_ld;
        const float *s = src + r * src_ld;
        if (accumulate) {
            for (size_t c = 0; c < cols; ++c) { d[c] += s[c]; }
        } else {
            memcpy(d, s, cols * sizeof *d);
        }
    }
}

/* Moves a [F, D]-or-[D, F] matrix's slice between the full matrix and the slice's own array:
 * rows of the hidden dimension when it is the outer one (hidden_outer), else a column band.
 * to_full: slice → full (added when accumulate), else full → slice. */
static void move_matrix(float *full, float *slice, size_t F, size_t D, size_t f0, size_t S,
                        int hidden_outer, int to_full, int accumulate) {
    if (hidden_outer) { /* [F, D]: rows f0 … f0 + S, contiguous */
        if (to_full) {
            copy_block(full + f0 * D, D, slice, D, S, D, accumulate);
        } else {
            copy_block(slice, D, full + f0 * D, D, S, D, 0);
        }
    } else { /* [D, F]: in each of the D rows, columns f0 … f0 + S */
        if (to_full) {
            copy_block(full + f0, F, slice, S, D, S, accumulate);
        } else {
            copy_block(slice, S, full + f0, F, D, S, 0);
        }
    }
}

static clffn_status check(const clffn_config *c, clffn_layout layout, size_t f0, size_t f1) {
    if (!c) { return CLFFN_ERROR_NULL_ARGUMENT; }
    clffn_status st = clffn_config_validate(c);
    if (st != CLFFN_SUCCESS) { return st; }
    if (layout != CLFFN_LAYOUT_OUT_IN && layout != CLFFN_LAYOUT_IN_OUT) {
        return CLFFN_ERROR_INVALID_LAYOUT;
    }
    if (f0 >= f1 || f1 > c->d_ff) { return CLFFN_ERROR_INVALID_ARGUMENT; }
    return CLFFN_SUCCESS;
}

/* Whether every array the config needs is there: W1, W2 always; b1, V, bv by the flags. b2 is
 * not needed (it belongs to one shard); it moves when both sides have it. */
static bool complete(const clffn_config *c, const clffn_weight_arrays *a) {
    return a && a->w1 && a->w2 && (!c->bias1 || a->b1) &&
           (!c->gated || (a->v && (!c->bias_gate || a->bv)));
}

/* Every tensor of the slice [f0, f1) between the full arrays and the slice's: to_full writes
 * (or adds, accumulate) the slice into the full ones, else the full ones are only read. */
static clffn_status move_all(const clffn_config *c, clffn_layout layout, size_t f0, size_t f1,
                             const clffn_weight_arrays *full, const clffn_weight_arrays *slice,
                             int to_full, int accumulate) {
    clffn_status st = check(c, layout, f0, f1);
    if (st != CLFFN_SUCCESS) { return st; }
    if (!complete(c, full) || !complete(c, slice)) { return CLFFN_ERROR_NULL_ARGUMENT; }
    const size_t F = c->d_ff, D = c->d_model, S = f1 - f0;
    const int out_in = layout == CLFFN_LAYOUT_OUT_IN;
    move_matrix(full->w1, slice->w1, F, D, f0, S, out_in, to_full, accumulate);
    if (c->gated) { move_matrix(full->v, slice->v, F, D, f0, S, out_in, to_full, accumulate); }
    move_matrix(full->w2, slice->w2, F, D, f0, S, !out_in, to_full, accumulate);
    /* a bias is an [F, 1] matrix whose rows are the hidden units */
    if (c->bias1) { move_matrix(full->b1, slice->b1, F, 1, f0, S, 1, to_full, accumulate); }
    if (c->gated && c->bias_gate) {
        move_matrix(full->bv, slice->bv, F, 1, f0, S, 1, to_full, accumulate);
    }
    if (c->bias2 && full->b2 && slice->b2) { /* b2 is whole in both */
        move_matrix(full->b2, slice->b2, D, 1, 0, D, 1, to_full, accumulate);
    }
    return CLFFN_SUCCESS;
}

clffn_status clffn_shard_weights(const clffn_config *c, clffn_layout layout, size_t f0, size_t f1,
                                 const clffn_host_weights *full, const clffn_weight_arrays *out) {
    if (!full) { return CLFFN_ERROR_NULL_ARGUMENT; }
    /* read only (to_full = 0): the casts let one mover serve both directions */
    const clffn_weight_arrays src = {(float *)full->w1, (float *)full->b1, (float *)full->v,
                                     (float *)full->bv, (float *)full->w2, (float *)full->b2};
    return move_all(c, layout, f0, f1, &src, out, 0, 0);
}

clffn_status clffn_shard_place(const clffn_config *c, clffn_layout layout, size_t f0, size_t f1,
                               const clffn_weight_arrays *slice, const clffn_weight_arrays *full,
                               int accumulate) {
    return move_all(c, layout, f0, f1, full, slice, 1, accumulate);
}
