/* NaN and Inf: in inputs, weights and output gradients they propagate as IEEE arithmetic on the
 * FFN's formulas says. Nothing masks them: not the activation (relu(NaN) is NaN), not the bias,
 * not dropout (a dropped NaN is NaN · 0 = NaN, as in PyTorch's input * mask), not CLBlast.
 *
 * Each case plants one non-finite value and compares the device result with the double
 * reference element by element: NaN where the reference has NaN, the same infinity where it has
 * one, and the core tolerance on the finite rest. A few cases also assert the expected pattern
 * directly, so the reference cannot be wrong in the same way as the device. */
#include "common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define T 5
#define D 8
#define F 12

/* NaN exactly where ref has NaN, the same infinity where ref has one, and the core tolerance
 * (scaled by the largest finite |ref|) elsewhere. */
static void assert_ieee_match(const float *got, const double *ref, size_t n, const char *what) {
    double max_ref = 0.0;
    for (size_t i = 0; i < n; ++i) {
        if (isfinite(ref[i])) { max_ref = fmax(max_ref, fabs(ref[i])); }
    }
    const double tol = TOL_RTOL * max_ref + TOL_ATOL;
    for (size_t i = 0; i < n; ++i) {
        const double g = (double)got[i], r = ref[i];
        if (isnan(r)) {
            cr_assert(isnan(g), "%s: [%zu] is %.9g, the reference has NaN", what, i, g);
        } else if (isinf(r)) {
            cr_assert(g == r, "%s: [%zu] is %.9g, the reference has %g", what, i, g, r);
        } else {
            cr_assert(fabs(g - r) <= tol, "%s: [%zu] is %.9g, the reference has %.9g", what, i, g,
                      r);
        }
    }
}

static size_t count_nonfinite(const double *a, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; ++i) { k += !isfinite(a[i]); }
    return k;
}

typedef enum where { IN_X, IN_W1, IN_B1, IN_V, IN_BV, IN_W2, IN_B2 } where;

typedef struct plant {
    where at;
    size_t index;
    float value;
    const char *name;
} plant;

static const plant plants[] = {
    {IN_X, 1 * D + 2, NAN, "x NaN"},
    {IN_X, 2 * D + 0, INFINITY, "x +Inf"},
    {IN_X, 3 * D + 1, -INFINITY, "x -Inf"},
    {IN_W1, 5, NAN, "W1 NaN"},
    {IN_W1, 7, INFINITY, "W1 +Inf"},
    {IN_B1, 2, INFINITY, "b1 +Inf"},
    {IN_B1, 4, -INFINITY, "b1 -Inf"},
    {IN_B1, 6, NAN, "b1 NaN"},
    {IN_V, 3, -INFINITY, "V -Inf"},
    {IN_BV, 1, NAN, "bv NaN"},
    {IN_W2, 9, NAN, "W2 NaN"},
    {IN_W2, 11, -INFINITY, "W2 -Inf"},
    {IN_B2, 3, -INFINITY, "b2 -Inf"},
    {IN_B2, 5, NAN, "b2 NaN"},
};

static float *target(test_weights *w, float *x, where at) {
    switch (at) {
    case IN_X: return x;
    case IN_W1: return w->w1;
    case IN_B1: return w->b1;
    case IN_V: return w->v;
    case IN_BV: return w->bv;
    case IN_W2: return w->w2;
    default: return w->b2;
    }
}

/* One forward with one planted value, against the reference; returns how many outputs the
 * reference says are non-finite. training: dropout 0.5 in training mode. */
static size_t forward_case(clffn_context *ctx, clffn_activation act, int gated, const plant *pl,
                           int training) {
    clffn_config c = clffn_config_default(D, F);
    c.activation = act;
    c.gated = gated;
    c.dropout = 0.5f;
    char what[128];
    snprintf(what, sizeof what, "%s%s, %s%s", clffn_activation_name(act), gated ? " gated" : "",
             pl->name, training ? ", dropout 0.5" : "");
    test_weights w;
    test_weights_make(&w, &c, CLFFN_LAYOUT_OUT_IN, 4242);
    float x[T * D], y[T * D], h[T * F];
    double ref[T * D], href[T * F];
    fill_uniform(x, T * D, -1.0f, 1.0f, 99);
    target(&w, x, pl->at)[pl->index] = pl->value;

    clffn_ffn *ffn = NULL;
    ASSERT_OK(clffn_ffn_create(ctx, &c, &ffn));
    ASSERT_OK(clffn_ffn_upload_weights(ffn, CLFFN_LAYOUT_OUT_IN, &w.host));
    ASSERT_OK(clffn_ffn_set_training(ffn, training));
    ASSERT_OK(clffn_ffn_set_rng(ffn, 7, 0));
    ASSERT_OK(
        clffn_reference_forward(&c, CLFFN_LAYOUT_OUT_IN, &w.host, T, x, training, 7, 0, ref, href));
    ASSERT_OK(clffn_forward_host(ffn, T, x, T * D, y, T * D));
    ASSERT_OK(clffn_ffn_read_hidden(ffn, CLFFN_HIDDEN_OUT, h, T * F, NULL));
    assert_ieee_match(h, href, T * F, what);
    assert_ieee_match(y, ref, T * D, what);
    const size_t bad = count_nonfinite(ref, T * D);
    if (pl->at != IN_W2 && pl->at != IN_B2) {
        /* never vacuous: the planted value reaches the linear part it feeds, even where the
         * activation then saturates it to a finite value (relu(-Inf) = 0, sigmoid(±Inf)) */
        const clffn_hidden part =
            pl->at == IN_V || pl->at == IN_BV ? CLFFN_HIDDEN_GATE : CLFFN_HIDDEN_PRE;
        float lin[T * F];
        ASSERT_OK(clffn_ffn_read_hidden(ffn, part, lin, T * F, NULL));
        size_t k = 0;
        for (size_t i = 0; i < T * F; ++i) { k += !isfinite(lin[i]); }
        cr_assert(k > 0, "%s: the planted value did not reach x·W + b", what);
    } else {
        cr_assert(bad > 0, "%s: no output is non-finite", what);
    }

    if (pl->at == IN_X) {
        /* the same FFN on finite input afterwards: nothing of the NaN/Inf run stays behind
         * (CLBlast must not read the old output when beta = 0, and the workspace is rewritten) */
        fill_uniform(x, T * D, -1.0f, 1.0f, 99);
        ASSERT_OK(clffn_ffn_set_rng(ffn, 7, 0));
        ASSERT_OK(clffn_reference_forward(&c, CLFFN_LAYOUT_OUT_IN, &w.host, T, x, training, 7, 0,
                                          ref, href));
        cr_assert_eq(count_nonfinite(ref, T * D), 0);
        ASSERT_OK(clffn_forward_host(ffn, T, x, T * D, y, T * D));
        assert_ieee_match(y, ref, T * D, what);
    }
    clffn_ffn_destroy(ffn);
    test_weights_free(&w);
    return bad;
}

static void all_plants(clffn_activation act, int training) {
    clffn_context *ctx = test_context();
    size_t bad = 0;
    for (int gated = 0; gated < 2; ++gated) {
        for (size_t i = 0; i < sizeof plants / sizeof plants[0]; ++i) {
            if (!gated && (plants[i].at == IN_V || plants[i].at == IN_BV)) { continue; }
            bad += forward_case(ctx, act, gated, &plants[i], training);
        }
    }
    cr_assert(bad > 0, "%s: no case gave a non-finite output", clffn_activation_name(act));
    clffn_context_destroy(ctx);
}

Test(ieee, relu) { all_plants(CLFFN_ACT_RELU, 0); }
Test(ieee, gelu) { all_plants(CLFFN_ACT_GELU, 0); }
Test(ieee, gelu_tanh) { all_plants(CLFFN_ACT_GELU_TANH, 0); }
Test(ieee, silu) { all_plants(CLFFN_ACT_SILU, 0); }
Test(ieee, sigmoid) { all_plants(CLFFN_ACT_SIGMOID, 0); }
Test(ieee, identity) { all_plants(CLFFN_ACT_IDENTITY, 0); }
Test(ieee, relu_dropout) { all_plants(CLFFN_ACT_RELU, 1); }
Test(ieee, silu_dropout) { all_plants(CLFFN_ACT_SILU, 1); }

/* The pattern itself, without the reference: a NaN in one token's input makes that token's
 * hidden row and output row NaN for ReLU, dropped positions included, and leaves the other
 * tokens finite. */
Test(ieee, relu_nan_row_direct) {
    clffn_context *ctx = test_context();
    for (int training = 0; training < 2; ++training) {
        clffn_config c = clffn_config_default(D, F);
        c.dropout = 0.5f;
        test_weights w;
        test_weights_make(&w, &c, CLFFN_LAYOUT_OUT_IN, 5);
        float x[T * D], y[T * D], h[T * F];
        fill_uniform(x, T * D, -1.0f, 1.0f, 3);
        x[2 * D + 4] = NAN;
        clffn_ffn *ffn = NULL;
        ASSERT_OK(clffn_ffn_create(ctx, &c, &ffn));
        ASSERT_OK(clffn_ffn_upload_weights(ffn, CLFFN_LAYOUT_OUT_IN, &w.host));
        ASSERT_OK(clffn_ffn_set_training(ffn, training));
        ASSERT_OK(clffn_forward_host(ffn, T, x, T * D, y, T * D));
        ASSERT_OK(clffn_ffn_read_hidden(ffn, CLFFN_HIDDEN_OUT, h, T * F, NULL));
        size_t zeros = 0;
        for (size_t t = 0; t < T; ++t) {
            for (size_t j = 0; j < F; ++j) {
                const float v = h[t * F + j];
                if (t == 2) {
                    cr_assert(isnan(v), "train=%d h[2, %zu] = %g, want NaN", training, j,
                              (double)v);
                } else {
                    cr_assert(isfinite(v), "train=%d h[%zu, %zu] = %g", training, t, j, (double)v);
                    zeros += v == 0.0f;
                }
            }
            for (size_t o = 0; o < D; ++o) {
                const float v = y[t * D + o];
                cr_assert(t == 2 ? isnan(v) : isfinite(v), "train=%d y[%zu, %zu] = %g", training, t,
                          o, (double)v);
            }
        }
        cr_assert(zeros > 0, "ReLU and dropout left no zero in the finite rows");
        clffn_ffn_destroy(ffn);
        test_weights_free(&w);
    }
    clffn_context_destroy(ctx);
}

/* +Inf through ReLU stays +Inf; -Inf becomes 0 (max(-Inf, 0)), exactly as IEEE comparison says. */
Test(ieee, relu_inf_bias_direct) {
    clffn_context *ctx = test_context();
    clffn_config c = clffn_config_default(D, F);
    test_weights w;
    test_weights_make(&w, &c, CLFFN_LAYOUT_OUT_IN, 6);
    w.b1[0] = INFINITY;
    w.b1[1] = -INFINITY;
    float x[T * D], h[T * F], pre[T * F], y[T * D];
    fill_uniform(x, T * D, -1.0f, 1.0f, 4);
    clffn_ffn *ffn = NULL;
    ASSERT_OK(clffn_ffn_create(ctx, &c, &ffn));
    ASSERT_OK(clffn_ffn_upload_weights(ffn, CLFFN_LAYOUT_OUT_IN, &w.host));
    ASSERT_OK(clffn_forward_host(ffn, T, x, T * D, y, T * D));
    ASSERT_OK(clffn_ffn_read_hidden(ffn, CLFFN_HIDDEN_PRE, pre, T * F, NULL));
    ASSERT_OK(clffn_ffn_read_hidden(ffn, CLFFN_HIDDEN_OUT, h, T * F, NULL));
    for (size_t t = 0; t < T; ++t) {
        cr_assert(pre[t * F] == INFINITY && pre[t * F + 1] == -INFINITY);
        cr_assert(h[t * F] == INFINITY, "relu(+Inf) = %g", (double)h[t * F]);
        cr_assert(h[t * F + 1] == 0.0f, "relu(-Inf) = %g", (double)h[t * F + 1]);
        for (size_t o = 0; o < D; ++o) {
            /* +Inf · W2[o, 0] plus finite terms: an infinity with W2's sign */
            const float w20 = w.w2[o * F + 0];
            cr_assert(y[t * D + o] == (w20 > 0 ? INFINITY : -INFINITY), "y[%zu, %zu] = %g", t, o,
                      (double)y[t * D + o]);
        }
    }
    clffn_ffn_destroy(ffn);
    test_weights_free(&w);
    clffn_context_destroy(ctx);
}

/* The backward: a NaN or Inf in dy, x or a weight reaches dx and the gradients as the reference
 * says. */
static void backward_case(clffn_context *ctx, clffn_activation act, int gated, where at,
                          size_t index, float value, const char *name) {
    clffn_config c = clffn_config_default(D, F);
    c.activation = act;
    c.gated = gated;
    c.dropout = 0.0f;
    char what[128];
    snprintf(what, sizeof what, "backward %s%s, %s", clffn_activation_name(act),
             gated ? " gated" : "", name);
    test_weights w;
    test_weights_make(&w, &c, CLFFN_LAYOUT_OUT_IN, 77);
    float x[T * D], dy[T * D], dx[T * D];
    fill_uniform(x, T * D, -1.0f, 1.0f, 8);
    fill_uniform(dy, T * D, -1.0f, 1.0f, 9);
    if (at == IN_X && index == (size_t)-1) {
        dy[3 * D + 2] = value; /* the output gradient */
    } else {
        target(&w, x, at)[index] = value;
    }
    static float gw1[D * F], gb1[F], gv[D * F], gbv[F], gw2[D * F], gb2[D];
    static double rw1[D * F], rb1[F], rv[D * F], rbv[F], rw2[D * F], rb2[D], rdx[T * D];
    const clffn_weight_arrays g = {gw1, gb1, gated ? gv : NULL, gated ? gbv : NULL, gw2, gb2};
    const clffn_ref_grads rg = {rw1, rb1, gated ? rv : NULL, gated ? rbv : NULL, rw2, rb2};

    clffn_ffn *ffn = NULL;
    ASSERT_OK(clffn_ffn_create(ctx, &c, &ffn));
    ASSERT_OK(clffn_ffn_upload_weights(ffn, CLFFN_LAYOUT_OUT_IN, &w.host));
    ASSERT_OK(clffn_ffn_set_training(ffn, 1));
    float y[T * D];
    ASSERT_OK(clffn_forward_host(ffn, T, x, T * D, y, T * D));
    ASSERT_OK(clffn_backward_host(ffn, T, x, T * D, dy, T * D, dx, T * D, &g, 0));
    ASSERT_OK(
        clffn_reference_backward(&c, CLFFN_LAYOUT_OUT_IN, &w.host, T, x, dy, 1, 0, 0, rdx, &rg));
    assert_ieee_match(dx, rdx, T * D, what);
    assert_ieee_match(gw1, rw1, D * F, what);
    assert_ieee_match(gb1, rb1, F, what);
    assert_ieee_match(gw2, rw2, D * F, what);
    assert_ieee_match(gb2, rb2, D, what);
    if (gated) {
        assert_ieee_match(gv, rv, D * F, what);
        assert_ieee_match(gbv, rbv, F, what);
    }
    cr_assert(count_nonfinite(rw2, D * F) + count_nonfinite(rdx, T * D) > 0,
              "%s: nothing non-finite", what);
    clffn_ffn_destroy(ffn);
    test_weights_free(&w);
}

Test(ieee, backward) {
    clffn_context *ctx = test_context();
    for (int a = 0; a < CLFFN_ACT_COUNT_; ++a) {
        for (int gated = 0; gated < 2; ++gated) {
            backward_case(ctx, (clffn_activation)a, gated, IN_X, (size_t)-1, NAN, "dy NaN");
            backward_case(ctx, (clffn_activation)a, gated, IN_X, (size_t)-1, INFINITY, "dy +Inf");
            backward_case(ctx, (clffn_activation)a, gated, IN_X, 1 * D + 3, NAN, "x NaN");
            backward_case(ctx, (clffn_activation)a, gated, IN_W2, 4, -INFINITY, "W2 -Inf");
            backward_case(ctx, (clffn_activation)a, gated, IN_B1, 2, NAN, "b1 NaN");
        }
    }
    clffn_context_destroy(ctx);
}
