/* The backward pass. First the CPU reference against central finite differences of its own
 * forward (in double, eps 1e-6, |fd − analytic| ≤ 1e-5 + 1e-3·|fd|), for every activation, plain
 * and gated, each bias flag, with and without dropout and the residual. */
#include "common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fill_d(double *a, size_t n, double lo, double hi, uint64_t seed) {
    float *tmp = malloc(n * sizeof *tmp);
    cr_assert(tmp);
    fill_uniform(tmp, n, (float)lo, (float)hi, seed);
    for (size_t i = 0; i < n; ++i) { a[i] = (double)tmp[i]; }
    free(tmp);
}

/* L = Σ dy ⊙ y, so ∂L/∂θ is what the backward computes for that dy. */
static double loss(const clffn_config *c, clffn_layout layout, const clffn_ref_params *p, size_t T,
                   const double *x, const double *dy, int training) {
    double *y = malloc(T * c->d_model * sizeof *y);
    cr_assert(y);
    ASSERT_OK(clffn__ref_forward_d(c, layout, p, T, x, training, 11, 5, y, NULL));
    double s = 0.0;
    for (size_t i = 0; i < T * c->d_model; ++i) { s += dy[i] * y[i]; }
    free(y);
    return s;
}

static void check_param(const char *name, double *param, size_t n, const double *grad,
                        const clffn_config *c, clffn_layout layout, const clffn_ref_params *p,
                        size_t T, const double *x, const double *dy, int training,
                        const char *what) {
    const double eps = 1e-6;
    for (size_t i = 0; i < n; ++i) {
        const double keep = param[i];
        param[i] = keep + eps;
        const double lp = loss(c, layout, p, T, x, dy, training);
        param[i] = keep - eps;
        const double lm = loss(c, layout, p, T, x, dy, training);
        param[i] = keep;
        const double fd = (lp - lm) / (2 * eps);
        cr_assert(fabs(fd - grad[i]) <= 1e-5 + 1e-3 * fabs(fd),
                  "%s: d%s[%zu] analytic %.9g, finite difference %.9g", what, name, i, grad[i], fd);
    }
}

static void gradcheck(clffn_activation act, int gated, int b1, int b2, int bg, int training,
                      int residual) {
    clffn_config c = clffn_config_default(4, 5);
    c.activation = act, c.gated = gated, c.bias1 = b1, c.bias2 = b2, c.bias_gate = bg;
    c.dropout = 0.3f, c.residual = residual;
    const size_t T = 3;
    char what[96];
    snprintf(what, sizeof what, "%s%s b1=%d b2=%d bg=%d train=%d res=%d",
             clffn_activation_name(act), gated ? " gated" : "", b1, b2, bg, training, residual);
    for (int layout = 0; layout < 2; ++layout) {
        double w1[20], v[20], w2[20], bb1[5], bbv[5], bb2[4], x[12], dy[12], dx[12];
        fill_d(w1, 20, -0.8, 0.8, 1), fill_d(v, 20, -0.8, 0.8, 2), fill_d(w2, 20, -0.8, 0.8, 3);
        fill_d(bb1, 5, -0.5, 0.5, 4), fill_d(bbv, 5, -0.5, 0.5, 5), fill_d(bb2, 4, -0.5, 0.5, 6);
        fill_d(x, 12, -1, 1, 7), fill_d(dy, 12, -1, 1, 8);
        const clffn_ref_params p = {w1, b1 ? bb1 : NULL, gated ? v : NULL, gated && bg ? bbv : NULL,
                                    w2, b2 ? bb2 : NULL};
        double gw1[20], gv[20], gw2[20], gb1[5], gbv[5], gb2[4];
        const clffn_ref_grads g = {gw1, gb1, gv, gbv, gw2, gb2};
        ASSERT_OK(
            clffn__ref_backward_d(&c, (clffn_layout)layout, &p, T, x, dy, training, 11, 5, dx, &g));
        check_param("W1", w1, 20, gw1, &c, (clffn_layout)layout, &p, T, x, dy, training, what);
        check_param("W2", w2, 20, gw2, &c, (clffn_layout)layout, &p, T, x, dy, training, what);
        check_param("x", x, 12, dx, &c, (clffn_layout)layout, &p, T, x, dy, training, what);
        if (b1) {
            check_param("b1", bb1, 5, gb1, &c, (clffn_layout)layout, &p, T, x, dy, training, what);
        }
        if (b2) {
            check_param("b2", bb2, 4, gb2, &c, (clffn_layout)layout, &p, T, x, dy, training, what);
        }
        if (gated) {
            check_param("V", v, 20, gv, &c, (clffn_layout)layout, &p, T, x, dy, training, what);
            if (bg) {
                check_param("bv", bbv, 5, gbv, &c, (clffn_layout)layout, &p, T, x, dy, training,
                            what);
            }
        }
    }
}

ParameterizedTestParameters(backward_reference, finite_differences) {
    static int cases[CLFFN_ACT_COUNT_ * 2];
    for (int i = 0; i < CLFFN_ACT_COUNT_ * 2; ++i) { cases[i] = i; }
    return cr_make_param_array(int, cases, CLFFN_ACT_COUNT_ * 2);
}

ParameterizedTest(int *k, backward_reference, finite_differences) {
    const clffn_activation act = (clffn_activation)(*k / 2);
    const int gated = *k % 2;
    gradcheck(act, gated, 1, 1, 1, 0, 0); /* all biases */
    gradcheck(act, gated, 0, 1, 1, 0, 0); /* each flag off */
    gradcheck(act, gated, 1, 0, 1, 0, 0);
    if (gated) { gradcheck(act, gated, 1, 1, 0, 0, 0); }
    gradcheck(act, gated, 1, 1, 1, 1, 0); /* dropout in training mode: the same mask */
    gradcheck(act, gated, 1, 1, 1, 0, 1); /* the residual */
}

/* ------------------------------------------------------------------------------------------ */
/* The device backward against the reference backward */

typedef struct bvariant {
    clffn_activation act;
    int gated, bias1, bias2, bias_gate;
} bvariant;

typedef struct grads_f {
    float *w1, *b1, *v, *bv, *w2, *b2, *block;
} grads_f;

static grads_f grads_alloc(size_t D, size_t F) {
    grads_f g;
    g.block = calloc(3 * D * F + 3 * F + D, sizeof(float));
    cr_assert(g.block);
    g.w1 = g.block, g.v = g.block + D * F, g.w2 = g.block + 2 * D * F;
    g.b1 = g.w2 + D * F, g.bv = g.b1 + F, g.b2 = g.bv + F;
    return g;
}

typedef struct grads_d {
    double *w1, *b1, *v, *bv, *w2, *b2, *block;
} grads_d;

static grads_d grads_d_alloc(size_t D, size_t F) {
    grads_d g;
    g.block = calloc(3 * D * F + 3 * F + D, sizeof(double));
    cr_assert(g.block);
    g.w1 = g.block, g.v = g.block + D * F, g.w2 = g.block + 2 * D * F;
    g.b1 = g.w2 + D * F, g.bv = g.b1 + F, g.b2 = g.bv + F;
    return g;
}

static void compare_grads(const clffn_config *c, const grads_f *g, const grads_d *r, double rtol,
                          const char *what) {
    const size_t D = c->d_model, F = c->d_ff;
    char w[200];
    snprintf(w, sizeof w, "%s dW1", what), assert_close(g->w1, r->w1, D * F, rtol, w);
    snprintf(w, sizeof w, "%s dW2", what), assert_close(g->w2, r->w2, D * F, rtol, w);
    if (c->bias1) { snprintf(w, sizeof w, "%s db1", what), assert_close(g->b1, r->b1, F, rtol, w); }
    if (c->bias2) { snprintf(w, sizeof w, "%s db2", what), assert_close(g->b2, r->b2, D, rtol, w); }
    if (c->gated) {
        snprintf(w, sizeof w, "%s dV", what), assert_close(g->v, r->v, D * F, rtol, w);
        if (c->bias_gate) {
            snprintf(w, sizeof w, "%s dbv", what), assert_close(g->bv, r->bv, F, rtol, w);
        }
    }
}

/* Forward then backward through the host API, against the reference; training and residual
 * optional. */
static void device_case(clffn_context *ctx, const clffn_config *c, clffn_layout layout, size_t T,
                        int training, const char *what) {
    const size_t D = c->d_model, F = c->d_ff;
    test_weights w;
    test_weights_make(&w, c, layout, 500 + T + D + F);
    float *x = malloc(T * D * sizeof *x), *y = malloc(T * D * sizeof *y);
    float *dy = malloc(T * D * sizeof *dy), *dx = malloc(T * D * sizeof *dx);
    double *rdx = malloc(T * D * sizeof *rdx);
    cr_assert(x && y && dy && dx && rdx);
    fill_uniform(x, T * D, -1, 1, 21 + T);
    fill_uniform(dy, T * D, -1, 1, 22 + T);
    clffn_ffn *ffn = NULL;
    ASSERT_OK(clffn_ffn_create(ctx, c, &ffn));
    ASSERT_OK(clffn_ffn_upload_weights(ffn, layout, &w.host));
    ASSERT_OK(clffn_ffn_set_training(ffn, training));
    ASSERT_OK(clffn_ffn_set_rng(ffn, 77, 3));
    ASSERT_OK(clffn_forward_host(ffn, T, x, T * D, y, T * D));
    grads_f g = grads_alloc(D, F);
    const clffn_weight_arrays ga = {g.w1, g.b1, g.v, g.bv, g.w2, g.b2};
    ASSERT_OK(clffn_backward_host(ffn, T, x, T * D, dy, T * D, dx, T * D, &ga, 0));
    grads_d r = grads_d_alloc(D, F);
    const clffn_ref_grads rg = {r.w1, r.b1, r.v, r.bv, r.w2, r.b2};
    ASSERT_OK(clffn_reference_backward(c, layout, &w.host, T, x, dy, training, 77, 3, rdx, &rg));
    char wx[200];
    snprintf(wx, sizeof wx, "%s dx", what);
    assert_close(dx, rdx, T * D, act_rtol(c->activation), wx);
    compare_grads(c, &g, &r, act_rtol(c->activation), what);

    /* accumulate: a second backward adds the same gradients again */
    ASSERT_OK(clffn_backward_host(ffn, T, x, T * D, dy, T * D, NULL, 0, &ga, 1));
    for (size_t i = 0; i < 3 * D * F + 3 * F + D; ++i) { r.block[i] *= 2.0; }
    snprintf(wx, sizeof wx, "%s accumulated", what);
    compare_grads(c, &g, &r, act_rtol(c->activation), wx);

    clffn_ffn_destroy(ffn);
    free(x), free(y), free(dy), free(dx), free(rdx), free(g.block), free(r.block);
    test_weights_free(&w);
}

static const size_t bshapes[][3] = {{1, 16, 40}, {7, 13, 29}, {18, 37, 61}};

ParameterizedTestParameters(backward_device, variants) {
    static bvariant vs[CLFFN_ACT_COUNT_ * 9];
    size_t n = 0;
    for (int a = 0; a < CLFFN_ACT_COUNT_; ++a) {
        const bvariant plain[] = {
            {a, 0, 1, 1, 1}, {a, 0, 0, 1, 1}, {a, 0, 1, 0, 1}, {a, 0, 0, 0, 0}};
        const bvariant gated[] = {
            {a, 1, 1, 1, 1}, {a, 1, 0, 1, 1}, {a, 1, 1, 0, 1}, {a, 1, 1, 1, 0}, {a, 1, 0, 0, 0}};
        for (size_t i = 0; i < 4; ++i) { vs[n++] = plain[i]; }
        for (size_t i = 0; i < 5; ++i) { vs[n++] = gated[i]; }
    }
    return cr_make_param_array(bvariant, vs, n);
}

ParameterizedTest(bvariant *v, backward_device, variants, .timeout = 120) {
    clffn_context *ctx = test_clblast_context();
    for (size_t k = 0; k < 2 * sizeof bshapes / sizeof bshapes[0]; ++k) {
        const size_t s = k / 2;
        const int side = (int)(k % 2);
        const size_t T = test_side_tokens(side, bshapes[s][0]);
        ASSERT_OK(clffn_context_set_gemv_max_tokens(ctx, test_gemv_sides[side]));
        /* handed over in one layout, kept in either: the gradients come back in the first */
        for (int lk = 0; lk < 4; ++lk) {
            const int layout = lk / 2;
            ASSERT_OK(clffn_context_set_weight_layout(ctx, (clffn_layout)(lk % 2)));
            clffn_config c = clffn_config_default(bshapes[s][1], bshapes[s][2]);
            c.activation = v->act, c.gated = v->gated, c.bias1 = v->bias1, c.bias2 = v->bias2;
            c.bias_gate = v->bias_gate;
            char what[160];
            snprintf(what, sizeof what, "%s%s b1=%d b2=%d bg=%d T=%zu D=%zu F=%zu %s kept %s %s",
                     clffn_activation_name(v->act), v->gated ? " gated" : "", v->bias1, v->bias2,
                     v->bias_gate, T, c.d_model, c.d_ff, layout ? "in_out" : "out_in",
                     lk % 2 ? "in_out" : "out_in", test_gemv_side_name(side));
            device_case(ctx, &c, (clffn_layout)layout, T, 0, what);
        }
    }
    clffn_context_destroy(ctx);
}

/* The backward's input products on CLBlast's fast GEMV kernels (test_forward.c's
 * gemv_fast_kernels says why these sizes): 2 tokens, plain and gated, every handed-over × kept
 * layout. */
Test(backward_device, gemv_fast_kernels) {
    clffn_context *ctx = test_clblast_context();
    ASSERT_OK(clffn_context_set_gemv_max_tokens(ctx, 2));
    for (int k = 0; k < 8; ++k) {
        const int gated = k / 4, layout = (k / 2) % 2, kept = k % 2;
        ASSERT_OK(clffn_context_set_weight_layout(ctx, (clffn_layout)kept));
        clffn_config c = clffn_config_default(256, 512);
        c.activation = CLFFN_ACT_SILU, c.gated = gated;
        char what[80];
        snprintf(what, sizeof what, "%s256 -> 512 %s kept %s", gated ? "gated " : "",
                 layout ? "in_out" : "out_in", kept ? "in_out" : "out_in");
        device_case(ctx, &c, (clffn_layout)layout, 2, 0, what);
    }
    clffn_context_destroy(ctx);
}

/* Two Xgemm sets (clffn_context_set_xgemm): forward and backward at token counts on both sides
 * of the threshold, in turns, each against the reference. The device's set changes once per
 * crossing, never within a pass (the weight gradients go by their token count too) and never
 * while the count stays on one side. */
Test(backward_device, xgemm_sets_by_tokens, .timeout = 180) {
    clffn_context *ctx = test_clblast_context();
    ASSERT_OK(clffn_context_set_gemv_max_tokens(ctx, 0));
    ASSERT_OK(clffn_context_set_gemm_k_block(ctx, 64)); /* blocks of both sets' KWG */
    ASSERT_OK(clffn_context_set_weight_layout(ctx, CLFFN_LAYOUT_OUT_IN));
    ASSERT_OK(
        clffn_context_set_xgemm(ctx, 16, test_xgemm_names, test_xgemm_wide, test_xgemm_narrow, 12));
    clffn_config c = clffn_config_default(40, 136);
    c.activation = CLFFN_ACT_GELU, c.gated = 1;
    const size_t T[] = {3, 3, 25, 25, 3, 11, 12};
    const unsigned long want[] = {1, 0, 1, 0, 1, 0, 1}; /* the first: from whatever was there */
    for (size_t i = 0; i < sizeof T / sizeof T[0]; ++i) {
        const unsigned long before = clffn__xgemm_changes();
        char what[64];
        snprintf(what, sizeof what, "two Xgemm sets, %zu tokens (%zu)", T[i], i);
        device_case(ctx, &c, CLFFN_LAYOUT_OUT_IN, T[i], 0, what);
        const unsigned long changes = clffn__xgemm_changes() - before;
        if (i == 0) {
            cr_assert_leq(changes, want[i], "%s: %lu changes", what, changes);
        } else {
            cr_assert_eq(changes, want[i], "%s: %lu changes, not %lu", what, changes, want[i]);
        }
    }
    clffn_context_destroy(ctx);
}

/* Dropout's backward uses exactly the forward's mask; the residual passes dy through. */
Test(backward_device, dropout_and_residual) {
    clffn_context *ctx = test_clblast_context();
    for (int k = 0; k < 4; ++k) {
        const int gated = k / 2, side = k % 2;
        ASSERT_OK(clffn_context_set_gemv_max_tokens(ctx, test_gemv_sides[side]));
        /* kept [out, in] on one GEMV side and [in, out] on the other, handed over either way */
        ASSERT_OK(clffn_context_set_weight_layout(ctx, (clffn_layout)side));
        clffn_config c = clffn_config_default(20, 44);
        c.activation = CLFFN_ACT_GELU_TANH, c.gated = gated, c.dropout = 0.35f, c.residual = 1;
        char what[80];
        snprintf(what, sizeof what, "%sdropout %s", gated ? "gated " : "",
                 test_gemv_side_name(side));
        device_case(ctx, &c, CLFFN_LAYOUT_OUT_IN, 9, 1, what);
        snprintf(what, sizeof what, "%sdropout in_out %s", gated ? "gated " : "",
                 test_gemv_side_name(side));
        device_case(ctx, &c, CLFFN_LAYOUT_IN_OUT, 9, 1, what);
    }
    clffn_context_destroy(ctx);
}

/* Caller-owned weights and gradients at offsets, V and dV separate (two SGEMMs each way). */
static void separate_gate_case(clffn_context *ctx, size_t T, size_t D, size_t F) {
    clffn_config c = clffn_config_default(D, F);
    c.gated = 1, c.activation = CLFFN_ACT_SILU;
    for (int layout = 0; layout < 2; ++layout) {
        test_weights w;
        test_weights_make(&w, &c, (clffn_layout)layout, 8);
        float *x = malloc(T * D * sizeof *x), *dy = malloc(T * D * sizeof *dy);
        float *dx = malloc(T * D * sizeof *dx);
        double *rdx = malloc(T * D * sizeof *rdx);
        cr_assert(x && dy && dx && rdx);
        fill_uniform(x, T * D, -1, 1, 1), fill_uniform(dy, T * D, -1, 1, 2);
        guarded gw1 = guarded_make(ctx, CANARY, D * F, w.w1),
                gv = guarded_make(ctx, CANARY, D * F, w.v);
        guarded gw2 = guarded_make(ctx, CANARY, D * F, w.w2),
                gb1 = guarded_make(ctx, CANARY, F, w.b1);
        guarded gbv = guarded_make(ctx, CANARY, F, w.bv), gb2 = guarded_make(ctx, CANARY, D, w.b2);
        guarded gx = guarded_make(ctx, CANARY, T * D, x),
                gy = guarded_make(ctx, CANARY, T * D, NULL);
        guarded gdy = guarded_make(ctx, CANARY, T * D, dy),
                gdx = guarded_make(ctx, CANARY + 1, T * D, NULL);
        guarded d1 = guarded_make(ctx, CANARY, D * F, NULL),
                dv = guarded_make(ctx, CANARY, D * F, NULL);
        guarded d2 = guarded_make(ctx, CANARY, D * F, NULL),
                db1 = guarded_make(ctx, CANARY, F, NULL);
        guarded dbv = guarded_make(ctx, CANARY, F, NULL), db2 = guarded_make(ctx, CANARY, D, NULL);
        clffn_ffn *ffn = NULL;
        ASSERT_OK(clffn_ffn_create(ctx, &c, &ffn));
        const clffn_device_weights dwts = {{gw1.mem, CANARY}, {gb1.mem, CANARY}, {gv.mem, CANARY},
                                           {gbv.mem, CANARY}, {gw2.mem, CANARY}, {gb2.mem, CANARY}};
        ASSERT_OK(clffn_ffn_bind_weights(ffn, (clffn_layout)layout, &dwts));
        cl_command_queue q = clffn_context_queue(ctx);
        ASSERT_STATUS(clffn_backward(ffn, T, gx.mem, CANARY, gdy.mem, CANARY, gdx.mem, gdx.offset,
                                     &dwts, 0, q, NULL),
                      CLFFN_ERROR_NO_FORWARD);
        ASSERT_OK(clffn_forward(ffn, T, gx.mem, CANARY, gy.mem, CANARY, q, NULL));
        const clffn_device_weights dg = {{d1.mem, CANARY},  {db1.mem, CANARY}, {dv.mem, CANARY},
                                         {dbv.mem, CANARY}, {d2.mem, CANARY},  {db2.mem, CANARY}};
        ASSERT_STATUS(
            clffn_backward(ffn, T + 1, gx.mem, CANARY, gdy.mem, CANARY, NULL, 0, &dg, 0, q, NULL),
            CLFFN_ERROR_NO_FORWARD);
        cl_event ev = NULL;
        ASSERT_OK(clffn_backward(ffn, T, gx.mem, CANARY, gdy.mem, CANARY, gdx.mem, gdx.offset, &dg,
                                 0, q, &ev));
        ASSERT_OK(clWaitForEvents(1, &ev));
        clReleaseEvent(ev);
        grads_f g = grads_alloc(D, F);
        guarded_read(ctx, &d1, g.w1), guarded_read(ctx, &dv, g.v), guarded_read(ctx, &d2, g.w2);
        guarded_read(ctx, &db1, g.b1), guarded_read(ctx, &dbv, g.bv), guarded_read(ctx, &db2, g.b2);
        guarded_read(ctx, &gdx, dx);
        grads_d r = grads_d_alloc(D, F);
        const clffn_ref_grads rg = {r.w1, r.b1, r.v, r.bv, r.w2, r.b2};
        ASSERT_OK(clffn_reference_backward(&c, (clffn_layout)layout, &w.host, T, x, dy, 0, 0, 0,
                                           rdx, &rg));
        assert_close(dx, rdx, T * D, TOL_RTOL, "device-level dx");
        compare_grads(&c, &g, &r, TOL_RTOL, layout ? "device-level in_out" : "device-level out_in");
        guarded *all[] = {&d1, &dv, &d2, &db1, &dbv, &db2, &gdx};
        for (size_t i = 0; i < 7; ++i) { guarded_assert_canaries(ctx, all[i], "gradient buffer"); }
        clffn_ffn_destroy(ffn);
        guarded *rel[] = {&gw1, &gv,  &gw2, &gb1, &gbv, &gb2, &gx,  &gy,
                          &gdy, &gdx, &d1,  &dv,  &d2,  &db1, &dbv, &db2};
        for (size_t i = 0; i < 16; ++i) { guarded_free(rel[i]); }
        free(g.block), free(r.block), free(x), free(dy), free(dx), free(rdx);
        test_weights_free(&w);
    }
}

Test(backward_device, device_level_separate_gate) {
    clffn_context *ctx = test_clblast_context();
    for (int side = 0; side < 2; ++side) {
        ASSERT_OK(clffn_context_set_gemv_max_tokens(ctx, test_gemv_sides[side]));
        separate_gate_case(ctx, 6, 12, 20);
    }
    clffn_context_destroy(ctx);
}

/* Every backward product split along K (a 64 block: 2-4 CLBlast calls each, the first with the
 * caller's beta, so accumulate mode and the residual's dy must survive the split), stacked and
 * separate gate, both layouts. */
Test(backward_device, k_blocked_gemms, .timeout = 180) {
    clffn_context *ctx = test_clblast_context();
    ASSERT_OK(clffn_context_set_gemm_k_block(ctx, 64));
    ASSERT_OK(clffn_context_set_gemm_k_block_min_rows(ctx, 0)); /* every product */
    const size_t T = 150, D = 131, F = 200;
    clffn_config c = clffn_config_default(D, F);
    c.activation = CLFFN_ACT_GELU;
    /* each handed over in one layout and kept in the other */
    ASSERT_OK(clffn_context_set_weight_layout(ctx, CLFFN_LAYOUT_IN_OUT));
    device_case(ctx, &c, CLFFN_LAYOUT_OUT_IN, T, 0, "k-blocked plain");
    c.gated = 1, c.activation = CLFFN_ACT_SILU, c.residual = 1, c.dropout = 0.2f;
    ASSERT_OK(clffn_context_set_weight_layout(ctx, CLFFN_LAYOUT_OUT_IN));
    device_case(ctx, &c, CLFFN_LAYOUT_IN_OUT, T, 1, "k-blocked gated residual dropout");
    separate_gate_case(ctx, T, D, F);
    clffn_context_destroy(ctx);
}

/* A NULL gradient buffer skips that gradient: dx alone (weights frozen, as a layer below an
 * adapter is), then dW2 and db2 alone, against the reference; the buffers not asked for keep
 * what they held. dV without dW1 is refused. */
Test(backward_device, null_gradient_buffers_are_skipped) {
    clffn_context *ctx = test_clblast_context();
    const size_t T = 5, D = 12, F = 20;
    clffn_config c = clffn_config_default(D, F);
    c.activation = CLFFN_ACT_SILU, c.gated = 1, c.dropout = 0.3f, c.residual = 1;
    test_weights w;
    test_weights_make(&w, &c, CLFFN_LAYOUT_OUT_IN, 91);
    float x[5 * 12], dy[5 * 12], dx[5 * 12], w2[12 * 20], b2[12], keep[20];
    double rdx[5 * 12];
    fill_uniform(x, T * D, -1, 1, 1), fill_uniform(dy, T * D, -1, 1, 2);
    clffn_ffn *ffn = NULL;
    ASSERT_OK(clffn_ffn_create(ctx, &c, &ffn));
    ASSERT_OK(clffn_ffn_upload_weights(ffn, CLFFN_LAYOUT_OUT_IN, &w.host));
    ASSERT_OK(clffn_ffn_set_training(ffn, 1));
    ASSERT_OK(clffn_ffn_set_rng(ffn, 5, 0));
    guarded gx = guarded_make(ctx, CANARY, T * D, x), gy = guarded_make(ctx, CANARY, T * D, NULL);
    guarded gdy = guarded_make(ctx, CANARY, T * D, dy), gdx = guarded_make(ctx, 0, T * D, NULL);
    guarded gw2 = guarded_make(ctx, 0, D * F, NULL), gb2 = guarded_make(ctx, 0, D, NULL);
    for (size_t i = 0; i < F; ++i) { keep[i] = 3.0f; }
    guarded gb1 = guarded_make(ctx, 0, F, keep);
    cl_command_queue q = clffn_context_queue(ctx);
    ASSERT_OK(clffn_forward(ffn, T, gx.mem, CANARY, gy.mem, CANARY, q, NULL));
    clffn_device_weights g;
    memset(&g, 0, sizeof g);
    ASSERT_OK(clffn_backward(ffn, T, gx.mem, CANARY, gdy.mem, CANARY, gdx.mem, 0, &g, 0, q, NULL));
    guarded_read(ctx, &gdx, dx);
    grads_d r = grads_d_alloc(D, F);
    const clffn_ref_grads rg = {r.w1, r.b1, r.v, r.bv, r.w2, r.b2};
    ASSERT_OK(
        clffn_reference_backward(&c, CLFFN_LAYOUT_OUT_IN, &w.host, T, x, dy, 1, 5, 0, rdx, &rg));
    assert_close(dx, rdx, T * D, TOL_RTOL, "dx alone");
    g.w2.mem = gw2.mem, g.b2.mem = gb2.mem;
    ASSERT_OK(clffn_backward(ffn, T, gx.mem, CANARY, gdy.mem, CANARY, NULL, 0, &g, 0, q, NULL));
    guarded_read(ctx, &gw2, w2), guarded_read(ctx, &gb2, b2);
    assert_close(w2, r.w2, D * F, TOL_RTOL, "dW2 alone");
    assert_close(b2, r.b2, D, TOL_RTOL, "db2 alone");
    g.v.mem = gw2.mem, g.b1.mem = gb1.mem; /* dV without dW1 */
    ASSERT_STATUS(clffn_backward(ffn, T, gx.mem, CANARY, gdy.mem, CANARY, NULL, 0, &g, 0, q, NULL),
                  CLFFN_ERROR_INVALID_ARGUMENT);
    float b1[20];
    guarded_read(ctx, &gb1, b1);
    for (size_t i = 0; i < F; ++i) { cr_assert(b1[i] == 3.0f, "db1 written by a refused call"); }
    guarded *all[] = {&gx, &gy, &gdy, &gdx, &gw2, &gb2, &gb1};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) { guarded_free(all[i]); }
    free(r.block);
    clffn_ffn_destroy(ffn);
    test_weights_free(&w);
    clffn_context_destroy(ctx);
}
