/* Tensor parallel: the hidden layer split over 1–4 shards (clffn_shard_*, clffn_ffn_create_shard,
 * clffn_tp_*), each shard on its own context of the test device, as several devices would be.
 *
 * The split layer is checked against the double reference of the unsplit layer (not against the
 * split itself): forward, backward (dx and every gradient), dropout's mask by its definition
 * (clffn_dropout_keep on the layer's hidden index), for every activation, plain and gated, both
 * layouts, d_ff a multiple of 4 (float4 path, slices on Philox blocks) and not (slices starting
 * mid-block), with the residual, and a second pass to show the dropout offsets advance as the
 * unsplit layer's do. */
#include "common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define T 5
#define D 8
#define MAX_SHARDS 4

static const float P_DROP = 0.3f;

typedef struct contexts {
    clffn_context *c[MAX_SHARDS];
} contexts;

static contexts contexts_make(void) {
    contexts cx;
    for (int i = 0; i < MAX_SHARDS; ++i) { cx.c[i] = test_context(); }
    return cx;
}

static void contexts_free(contexts *cx) {
    for (int i = 0; i < MAX_SHARDS; ++i) { clffn_context_destroy(cx->c[i]); }
}

/* Full-size float gradients and their double reference. */
typedef struct grads {
    float *block;
    double *ref_block;
    clffn_weight_arrays g;
    clffn_ref_grads r;
} grads;

static grads grads_make(const clffn_config *c) {
    const size_t n = c->d_ff * D, F = c->d_ff;
    const size_t total = 3 * n + 3 * F + D;
    grads g;
    g.block = calloc(total, sizeof(float));
    g.ref_block = calloc(total, sizeof(double));
    cr_assert(g.block && g.ref_block);
    float *p = g.block;
    double *q = g.ref_block;
    g.g = (clffn_weight_arrays){
        p,         p + 3 * n,        c->gated ? p + n : NULL, c->gated ? p + 3 * n + F : NULL,
        p + 2 * n, p + 3 * n + 2 * F};
    g.r = (clffn_ref_grads){
        q,         q + 3 * n,        c->gated ? q + n : NULL, c->gated ? q + 3 * n + F : NULL,
        q + 2 * n, q + 3 * n + 2 * F};
    if (!c->bias1) { g.g.b1 = NULL, g.r.b1 = NULL; }
    if (!c->bias2) { g.g.b2 = NULL, g.r.b2 = NULL; }
    if (!c->gated || !c->bias_gate) { g.g.bv = NULL, g.r.bv = NULL; }
    return g;
}

static void grads_free(grads *g) {
    free(g->block);
    free(g->ref_block);
}

static void compare_grads(const clffn_config *c, const grads *g, double rtol, const char *what) {
    char w[256];
    const size_t n = c->d_ff * D;
    snprintf(w, sizeof w, "%s: dW1", what);
    assert_close(g->g.w1, g->r.w1, n, rtol, w);
    snprintf(w, sizeof w, "%s: dW2", what);
    assert_close(g->g.w2, g->r.w2, n, rtol, w);
    if (g->g.v) {
        snprintf(w, sizeof w, "%s: dV", what);
        assert_close(g->g.v, g->r.v, n, rtol, w);
    }
    if (g->g.b1) {
        snprintf(w, sizeof w, "%s: db1", what);
        assert_close(g->g.b1, g->r.b1, c->d_ff, rtol, w);
    }
    if (g->g.bv) {
        snprintf(w, sizeof w, "%s: dbv", what);
        assert_close(g->g.bv, g->r.bv, c->d_ff, rtol, w);
    }
    if (g->g.b2) {
        snprintf(w, sizeof w, "%s: db2", what);
        assert_close(g->g.b2, g->r.b2, D, rtol, w);
    }
}

/* One layer split n ways: two forward/backward rounds (the second at the offset the first
 * leaves) against the reference of the unsplit layer. */
static void split_case(contexts *cx, const clffn_config *c, clffn_layout layout, int n,
                       int training) {
    char what[160];
    snprintf(what, sizeof what, "%s%s F=%zu %d shards %s%s%s", clffn_activation_name(c->activation),
             c->gated ? " gated" : "", c->d_ff, n,
             layout == CLFFN_LAYOUT_OUT_IN ? "out_in" : "in_out", training ? " dropout" : "",
             c->residual ? " residual" : "");
    const double rtol = act_rtol(c->activation);
    test_weights w;
    test_weights_make(&w, c, layout, 1000 + c->d_ff);
    clffn_tp *tp = NULL;
    ASSERT_OK(clffn_tp_create(cx->c, n, c, &tp));
    cr_assert_eq(clffn_tp_count(tp), n);
    ASSERT_OK(clffn_tp_upload_weights(tp, layout, &w.host));
    ASSERT_OK(clffn_tp_set_training(tp, training));
    ASSERT_OK(clffn_tp_set_rng(tp, 77, 3));
    uint64_t offset = 3;
    for (int round = 0; round < 2; ++round) {
        float x[T * D], dy[T * D], y[T * D], dx[T * D];
        double ref[T * D], dxref[T * D];
        fill_uniform(x, T * D, -1.0f, 1.0f, 10 + (uint64_t)round);
        fill_uniform(dy, T * D, -1.0f, 1.0f, 20 + (uint64_t)round);
        ASSERT_OK(clffn_tp_forward_host(tp, T, x, T * D, y, T * D));
        ASSERT_OK(
            clffn_reference_forward(c, layout, &w.host, T, x, training, 77, offset, ref, NULL));
        assert_mostly_nonzero(ref, T * D, 0.5, what);
        assert_close(y, ref, T * D, rtol, what);
        grads g = grads_make(c);
        ASSERT_OK(clffn_tp_backward_host(tp, T, x, T * D, dy, T * D, dx, T * D, &g.g, 0));
        ASSERT_OK(clffn_reference_backward(c, layout, &w.host, T, x, dy, training, 77, offset,
                                           dxref, &g.r));
        char bw[200];
        snprintf(bw, sizeof bw, "%s, round %d: dx", what, round);
        assert_close(dx, dxref, T * D, rtol, bw);
        compare_grads(c, &g, rtol, what);
        grads_free(&g);
        /* the unsplit layer's next forward starts past the Philox blocks of this one's T·F */
        if (training) { offset += (T * c->d_ff + 3) / 4; }
    }
    clffn_tp_destroy(tp);
    test_weights_free(&w);
}

static void all_splits(clffn_activation act) {
    contexts cx = contexts_make();
    const size_t widths[2] = {20, 23}; /* 5 float4 units; 23 single columns */
    for (int wi = 0; wi < 2; ++wi) {
        for (int gated = 0; gated < 2; ++gated) {
            for (int layout = 0; layout < 2; ++layout) {
                for (int n = 1; n <= MAX_SHARDS; ++n) {
                    for (int training = 0; training < 2; ++training) {
                        clffn_config c = clffn_config_default(D, widths[wi]);
                        c.activation = act;
                        c.gated = gated;
                        c.dropout = P_DROP;
                        c.residual = layout; /* with IN_OUT: b2 and x added once, by shard 0 */
                        split_case(&cx, &c, layout ? CLFFN_LAYOUT_IN_OUT : CLFFN_LAYOUT_OUT_IN, n,
                                   training);
                    }
                }
            }
        }
    }
    contexts_free(&cx);
}

Test(tp, relu, .timeout = 240) { all_splits(CLFFN_ACT_RELU); }
Test(tp, gelu, .timeout = 240) { all_splits(CLFFN_ACT_GELU); }
Test(tp, gelu_tanh, .timeout = 240) { all_splits(CLFFN_ACT_GELU_TANH); }
Test(tp, silu, .timeout = 240) { all_splits(CLFFN_ACT_SILU); }
Test(tp, sigmoid, .timeout = 240) { all_splits(CLFFN_ACT_SIGMOID); }
Test(tp, identity, .timeout = 240) { all_splits(CLFFN_ACT_IDENTITY); }

/* The mask itself: each shard's hidden output is zero exactly where the layer's dropout, by its
 * definition on the layer's hidden index t·F + f, drops (identity activation with a bias, so a
 * kept value is almost surely not zero). */
Test(tp, shard_masks_are_the_layers) {
    contexts cx = contexts_make();
    const size_t widths[2] = {20, 23};
    for (int wi = 0; wi < 2; ++wi) {
        const size_t F = widths[wi];
        clffn_config c = clffn_config_default(D, F);
        c.activation = CLFFN_ACT_IDENTITY;
        c.dropout = 0.5f;
        test_weights w;
        test_weights_make(&w, &c, CLFFN_LAYOUT_OUT_IN, 5);
        clffn_tp *tp = NULL;
        ASSERT_OK(clffn_tp_create(cx.c, 3, &c, &tp));
        ASSERT_OK(clffn_tp_upload_weights(tp, CLFFN_LAYOUT_OUT_IN, &w.host));
        ASSERT_OK(clffn_tp_set_training(tp, 1));
        ASSERT_OK(clffn_tp_set_rng(tp, 99, 41));
        float x[T * D], y[T * D];
        fill_uniform(x, T * D, -1.0f, 1.0f, 8);
        ASSERT_OK(clffn_tp_forward_host(tp, T, x, T * D, y, T * D));
        size_t dropped = 0, covered = 0;
        for (int s = 0; s < 3; ++s) {
            size_t f0, f1, total;
            ASSERT_OK(clffn_ffn_shard_info(clffn_tp_shard(tp, s), &f0, &f1, &total));
            cr_assert_eq(total, F);
            cr_assert_eq(f0, covered, "shard %d starts at %zu, not %zu", s, f0, covered);
            covered = f1;
            const size_t S = f1 - f0;
            float h[T * 23];
            ASSERT_OK(
                clffn_ffn_read_hidden(clffn_tp_shard(tp, s), CLFFN_HIDDEN_OUT, h, T * S, NULL));
            for (size_t t = 0; t < T; ++t) {
                for (size_t j = 0; j < S; ++j) {
                    const int keep = clffn_dropout_keep(0.5f, 99, 41, t * F + f0 + j);
                    cr_assert_eq(h[t * S + j] != 0.0f, keep, "F=%zu shard %d h[%zu, %zu] = %g", F,
                                 s, t, f0 + j, (double)h[t * S + j]);
                    dropped += !keep;
                }
            }
        }
        cr_assert_eq(covered, F);
        cr_assert(dropped > T * F / 4 && dropped < 3 * T * F / 4, "dropped %zu", dropped);
        clffn_tp_destroy(tp);
        test_weights_free(&w);
    }
    contexts_free(&cx);
}

/* Slices: contiguous, covering, as equal as the unit allows, on float4 units when d_ff is. */
Test(tp, shard_range) {
    for (size_t F = 1; F <= 80; ++F) {
        const size_t unit = F % 4 == 0 ? 4 : 1;
        for (int n = 1; n <= 12; ++n) {
            size_t f0, f1;
            if ((size_t)n > F / unit) {
                ASSERT_STATUS(clffn_shard_range(F, 0, n, &f0, &f1), CLFFN_ERROR_INVALID_ARGUMENT);
                continue;
            }
            size_t at = 0, lo = F, hi = 0;
            for (int i = 0; i < n; ++i) {
                ASSERT_OK(clffn_shard_range(F, i, n, &f0, &f1));
                cr_assert(f0 == at && f1 > f0, "F=%zu n=%d shard %d: [%zu, %zu)", F, n, i, f0, f1);
                cr_assert(f0 % unit == 0 && f1 % unit == 0);
                lo = f1 - f0 < lo ? f1 - f0 : lo;
                hi = f1 - f0 > hi ? f1 - f0 : hi;
                at = f1;
            }
            cr_assert_eq(at, F);
            cr_assert(hi - lo <= unit, "F=%zu n=%d: slices %zu..%zu", F, n, lo, hi);
        }
    }
    size_t f0 = 7, f1 = 7;
    ASSERT_STATUS(clffn_shard_range(8, 2, 2, &f0, &f1), CLFFN_ERROR_INVALID_ARGUMENT);
    ASSERT_STATUS(clffn_shard_range(8, -1, 2, &f0, &f1), CLFFN_ERROR_INVALID_ARGUMENT);
    ASSERT_STATUS(clffn_shard_range(8, 0, 0, &f0, &f1), CLFFN_ERROR_INVALID_ARGUMENT);
    ASSERT_STATUS(clffn_shard_range(8, 0, 1, NULL, &f1), CLFFN_ERROR_NULL_ARGUMENT);
    cr_assert(f0 == 7 && f1 == 7);
}

/* Cutting every slice and placing it back gives the full weights, in both layouts; placing with
 * accumulate adds. */
Test(tp, shard_weights_round_trip) {
    for (int layout = 0; layout < 2; ++layout) {
        const clffn_layout L = layout ? CLFFN_LAYOUT_IN_OUT : CLFFN_LAYOUT_OUT_IN;
        clffn_config c = clffn_config_default(D, 23);
        c.gated = 1;
        test_weights w;
        test_weights_make(&w, &c, L, 3);
        grads back = grads_make(&c), twice = grads_make(&c);
        for (int i = 0; i < 3; ++i) {
            size_t f0, f1;
            ASSERT_OK(clffn_shard_range(c.d_ff, i, 3, &f0, &f1));
            const size_t S = f1 - f0;
            float *s = malloc((3 * S * D + 2 * S + D) * sizeof *s);
            cr_assert(s);
            const clffn_weight_arrays a = {s,
                                           s + 3 * S * D,
                                           s + S * D,
                                           s + 3 * S * D + S,
                                           s + 2 * S * D,
                                           s + 3 * S * D + 2 * S};
            ASSERT_OK(clffn_shard_weights(&c, L, f0, f1, &w.host, &a));
            ASSERT_OK(clffn_shard_place(&c, L, f0, f1, &a, &back.g, 0));
            ASSERT_OK(clffn_shard_place(&c, L, f0, f1, &a, &twice.g, 0));
            ASSERT_OK(clffn_shard_place(&c, L, f0, f1, &a, &twice.g, 1));
            /* a slice that does not fit is refused */
            ASSERT_STATUS(clffn_shard_weights(&c, L, f1, f0, &w.host, &a),
                          CLFFN_ERROR_INVALID_ARGUMENT);
            ASSERT_STATUS(clffn_shard_weights(&c, L, f0, c.d_ff + 1, &w.host, &a),
                          CLFFN_ERROR_INVALID_ARGUMENT);
            free(s);
        }
        const size_t n = c.d_ff * D;
        cr_assert_arr_eq(back.g.w1, w.w1, n * sizeof(float));
        cr_assert_arr_eq(back.g.v, w.v, n * sizeof(float));
        cr_assert_arr_eq(back.g.w2, w.w2, n * sizeof(float));
        cr_assert_arr_eq(back.g.b1, w.b1, c.d_ff * sizeof(float));
        cr_assert_arr_eq(back.g.bv, w.bv, c.d_ff * sizeof(float));
        cr_assert_arr_eq(back.g.b2, w.b2, D * sizeof(float));
        for (size_t i = 0; i < n; ++i) { cr_assert(twice.g.w2[i] == 2.0f * w.w2[i]); }
        grads_free(&back);
        grads_free(&twice);
        test_weights_free(&w);
    }
}

/* Bad input: refused before anything runs, the caller's arrays untouched, nothing leaked. */
Test(tp, errors) {
    contexts cx = contexts_make();
    clffn_config c = clffn_config_default(D, 20);
    clffn_tp *tp = NULL;
    ASSERT_STATUS(clffn_tp_create(NULL, 2, &c, &tp), CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(clffn_tp_create(cx.c, 0, &c, &tp), CLFFN_ERROR_INVALID_ARGUMENT);
    ASSERT_STATUS(clffn_tp_create(cx.c, 6, &c, &tp), CLFFN_ERROR_INVALID_ARGUMENT); /* 5 units */
    clffn_context *with_null[2] = {cx.c[0], NULL};
    ASSERT_STATUS(clffn_tp_create(with_null, 2, &c, &tp), CLFFN_ERROR_NULL_ARGUMENT);
    c.d_model = 0;
    ASSERT_STATUS(clffn_tp_create(cx.c, 2, &c, &tp), CLFFN_ERROR_INVALID_SIZE);
    cr_assert_null(tp);
    c = clffn_config_default(D, 20);
    ASSERT_OK(clffn_tp_create(cx.c, 2, &c, &tp));
    cr_assert_null(clffn_tp_shard(tp, 2));
    cr_assert_null(clffn_tp_shard(tp, -1));
    float x[T * D], y[T * D];
    fill_uniform(x, T * D, -1.0f, 1.0f, 1);
    for (size_t i = 0; i < T * D; ++i) { y[i] = 42.0f; }
    ASSERT_STATUS(clffn_tp_forward_host(tp, T, x, T * D, y, T * D), CLFFN_ERROR_NO_WEIGHTS);
    test_weights w;
    test_weights_make(&w, &c, CLFFN_LAYOUT_OUT_IN, 2);
    ASSERT_OK(clffn_tp_upload_weights(tp, CLFFN_LAYOUT_OUT_IN, &w.host));
    ASSERT_STATUS(clffn_tp_forward_host(tp, T, x, T * D - 1, y, T * D),
                  CLFFN_ERROR_BUFFER_TOO_SMALL);
    ASSERT_STATUS(clffn_tp_forward_host(tp, T, x, T * D, NULL, T * D), CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(clffn_tp_forward_host(tp, (size_t)-1, x, T * D, y, T * D),
                  CLFFN_ERROR_SIZE_OVERFLOW);
    for (size_t i = 0; i < T * D; ++i) { cr_assert(y[i] == 42.0f); }
    /* a backward without its forward: every shard says NO_FORWARD, nothing is written */
    grads g = grads_make(&c);
    g.g.w1[0] = 42.0f;
    ASSERT_STATUS(clffn_tp_backward_host(tp, T, x, T * D, x, T * D, y, T * D, &g.g, 0),
                  CLFFN_ERROR_NO_FORWARD);
    cr_assert(g.g.w1[0] == 42.0f && y[0] == 42.0f);
    grads_free(&g);
    /* a failed upload leaves no weights behind */
    clffn_host_weights bad = w.host;
    bad.w2 = NULL;
    ASSERT_STATUS(clffn_tp_upload_weights(tp, CLFFN_LAYOUT_OUT_IN, &bad),
                  CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(clffn_tp_forward_host(tp, T, x, T * D, y, T * D), CLFFN_ERROR_NO_WEIGHTS);
    ASSERT_STATUS(clffn_tp_set_training(NULL, 1), CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(clffn_tp_set_rng(NULL, 1, 2), CLFFN_ERROR_NULL_ARGUMENT);
    cr_assert_eq(clffn_tp_count(NULL), 0);
    clffn_tp_destroy(tp);
    clffn_tp_destroy(NULL);
    test_weights_free(&w);
    contexts_free(&cx);
}
