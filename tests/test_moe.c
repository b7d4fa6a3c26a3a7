/* The mixture-of-experts layer against the double reference (clffn_moe_reference_forward):
 * outputs, the chosen experts and their weights, for every routing mode, 1 to 200 tokens, 1 to
 * 16 experts and k from 1 to E, ties, experts no token chose, every token sent to one expert,
 * a shared expert of its own width behind a sigmoid gate (Qwen2-MoE's), and bad input.
 *
 * The router's inputs are dyadic (x in steps of 1/64, router weights in steps of 1/64, bias in
 * steps of 1/8), so every logit is exact in float as in double, and the device and the
 * reference see the same order of experts, ties included: the choice is a comparison, and an
 * ulp of rounding would otherwise decide near-ties differently on the two sides. */
#include "common.h"
#include "moe.h" /* tiles_any_type */
#include "moe_data.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const moe_case cases[] = {
    {1, 8, 2, CLFFN_ROUTING_TOPK_NORMALIZED, 0, 0, 1, CLFFN_ACT_SILU, 0, 0},
    {7, 4, 1, CLFFN_ROUTING_TOPK, 0, 1, 0, CLFFN_ACT_RELU, 0, 0},
    {33, 16, 4, CLFFN_ROUTING_TOPK_NORMALIZED, 1, 1, 1, CLFFN_ACT_GELU, 0, 0},
    {200, 3, 3, CLFFN_ROUTING_TOPK, 1, 0, 0, CLFFN_ACT_GELU_TANH, 0, 0},
    {64, 1, 1, CLFFN_ROUTING_TOPK_NORMALIZED, 0, 1, 1, CLFFN_ACT_SIGMOID, 0, 0},
    {100, 16, 16, CLFFN_ROUTING_TOPK_NORMALIZED, 0, 0, 0, CLFFN_ACT_IDENTITY, 0, 0},
    {2, 5, 2, CLFFN_ROUTING_TOPK, 1, 1, 1, CLFFN_ACT_SILU, 0, 0},
    {1, 6, 2, CLFFN_ROUTING_TOPK, 1, 0, 1, CLFFN_ACT_SILU, 1, 96},
    {40, 8, 4, CLFFN_ROUTING_TOPK, 1, 1, 1, CLFFN_ACT_SILU, 1, 24},
    {19, 4, 2, CLFFN_ROUTING_TOPK_NORMALIZED, 1, 0, 0, CLFFN_ACT_GELU, 0, 72},
};

static void forward_check(clffn_moe *moe, const moe_data *m, const moe_case *mc, const char *what) {
    check_against_reference(moe, m, mc->tokens, what);
    /* fewer tokens on the same layer: the grown workspace serves a smaller pass */
    check_against_reference(moe, m, 1 + mc->tokens / 3, what);
}

Test(moe, forward_matches_the_double_reference, .timeout = 300) {
    each_case(cases, sizeof cases / sizeof cases[0], 64, 96, 100, forward_check);
}

/* All logits equal (a zero router): every token takes experts 0..k-1, in that order, each with
 * weight 1/k (normalised) or 1/E (top-k as it is). */
Test(moe, ties_go_to_the_lower_index) {
    clffn_context *ctx = test_context();
    for (int mode = 0; mode < 2; ++mode) {
        const moe_case mc = {5, 6, 3, (clffn_routing)mode, 0, 0, 1, CLFFN_ACT_SILU, 0, 0};
        moe_data m;
        data_make(&m, &mc, 32, 48, 7);
        memset(m.router, 0, 6 * 32 * sizeof *m.router);
        clffn_moe *moe = moe_make(ctx, &m);
        float y[5 * 32], wt[5 * 3];
        int32_t ch[5 * 3];
        ASSERT_OK(clffn_moe_forward_host(moe, 5, m.x, 5 * 32, y, 5 * 32, ch, wt));
        const float expect = mode == CLFFN_ROUTING_TOPK ? 1.0f / 6.0f : 1.0f / 3.0f;
        for (size_t i = 0; i < 5 * 3; ++i) {
            cr_assert(ch[i] == (int32_t)(i % 3), "choice %zu of token %zu: %d", i % 3, i / 3,
                      (int)ch[i]);
            cr_assert(fabsf(wt[i] - expect) <= 1e-7f, "weight %g, not %g", (double)wt[i],
                      (double)expect);
        }
        clffn_moe_destroy(moe);
        data_free(&m);
    }
    clffn_context_destroy(ctx);
}

/* A router bias far above the logits sends every token to the same experts, and y is the
 * reference's whichever way the counts go; read back, the chosen experts run on every token,
 * the others not at all (no forward: NO_FORWARD from read_hidden). */
Test(moe, experts_no_token_chose_are_not_run, .timeout = 120) {
    clffn_context *ctx = test_context();
    for (size_t k = 1; k <= 2; ++k) {
        const moe_case mc = {40, 8, k, CLFFN_ROUTING_TOPK_NORMALIZED, 0, 1, 1, CLFFN_ACT_SILU,
                             0,  0};
        moe_data m;
        data_make(&m, &mc, 32, 64, 11);
        m.bias[5] = 64.0f, m.bias[2] = 48.0f; /* logits stay within ±8 */
        clffn_moe *moe = moe_make(ctx, &m);
        const char *what = k == 1 ? "every token to expert 5" : "to 5 and 2";
        check_against_reference(moe, &m, 40, what);
        ASSERT_OK(clffn_moe_set_counts(moe, CLFFN_MOE_COUNTS_HOST));
        check_against_reference(moe, &m, 40, what);
        for (size_t e = 0; e < 8; ++e) {
            size_t T = 0;
            static float hidden[40 * 64];
            const clffn_status st =
                clffn_ffn_read_hidden(clffn_moe_expert(moe, e), CLFFN_HIDDEN_PRE, hidden,
                                      sizeof hidden / sizeof *hidden, &T);
            const int chosen = e == 5 || (k == 2 && e == 2);
            cr_assert(chosen ? st == CLFFN_SUCCESS && T == 40 : st == CLFFN_ERROR_NO_FORWARD,
                      "k %zu, expert %zu: status %d, %zu tokens", k, e, (int)st, T);
        }
        clffn_moe_destroy(moe);
        data_free(&m);
    }
    clffn_context_destroy(ctx);
}

/* Bad configs and calls get their status, and y stays as it was. */
Test(moe, bad_input_changes_nothing) {
    clffn_context *ctx = test_context();
    clffn_moe *moe = NULL;
    clffn_moe_config c = clffn_moe_config_default(32, 48, 4, 2);
    const size_t bad[][2] = {{0, 1}, {4, 0}, {4, 5}};
    for (size_t i = 0; i < 3; ++i) {
        clffn_moe_config b = c;
        b.experts = bad[i][0], b.top_k = bad[i][1];
        cr_assert(clffn_moe_create(ctx, &b, &moe) == CLFFN_ERROR_INVALID_ARGUMENT && !moe);
    }
    clffn_moe_config r = c;
    r.expert.residual = 1;
    cr_assert(clffn_moe_create(ctx, &r, &moe) == CLFFN_ERROR_INVALID_ARGUMENT);
    r = c, r.routing = (clffn_routing)7;
    cr_assert(clffn_moe_create(ctx, &r, &moe) == CLFFN_ERROR_INVALID_ARGUMENT);
    /* a shared expert's width or gate without a shared expert; a width the FFN refuses */
    r = c, r.shared_gate = 1;
    cr_assert(clffn_moe_create(ctx, &r, &moe) == CLFFN_ERROR_INVALID_ARGUMENT && !moe);
    r = c, r.shared_d_ff = 64;
    cr_assert(clffn_moe_create(ctx, &r, &moe) == CLFFN_ERROR_INVALID_ARGUMENT && !moe);
    r = c, r.shared_expert = 1, r.shared_d_ff = (size_t)1 << 62;
    cr_assert(clffn_moe_create(ctx, &r, &moe) == CLFFN_ERROR_SIZE_OVERFLOW && !moe);
    cr_assert(clffn_moe_create(NULL, &c, &moe) == CLFFN_ERROR_NULL_ARGUMENT);
    cr_assert(clffn_moe_create(ctx, NULL, &moe) == CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_OK(clffn_moe_create(ctx, &c, &moe));
    cr_assert(clffn_moe_expert(moe, 4) == NULL && clffn_moe_expert(moe, 3) != NULL);
    float x[3 * 32] = {0}, y[3 * 32];
    for (size_t i = 0; i < 3 * 32; ++i) { y[i] = 7.0f; }
    cr_assert(clffn_moe_forward_host(moe, 3, x, 96, y, 96, NULL, NULL) == CLFFN_ERROR_NO_WEIGHTS);
    cr_assert(clffn_moe_upload_router(moe, NULL, NULL) == CLFFN_ERROR_NULL_ARGUMENT);
    float router[4 * 32] = {0};
    ASSERT_OK(clffn_moe_upload_router(moe, router, NULL));
    /* the experts still have no weights */
    cr_assert(clffn_moe_forward_host(moe, 3, x, 96, y, 96, NULL, NULL) == CLFFN_ERROR_NO_WEIGHTS);
    cr_assert(clffn_moe_forward_host(moe, 3, x, 95, y, 96, NULL, NULL) ==
              CLFFN_ERROR_BUFFER_TOO_SMALL);
    cr_assert(clffn_moe_forward_host(moe, 3, NULL, 96, y, 96, NULL, NULL) ==
              CLFFN_ERROR_NULL_ARGUMENT);
    for (size_t i = 0; i < 3 * 32; ++i) { cr_assert(y[i] == 7.0f, "y[%zu] changed", i); }
    ASSERT_OK(clffn_moe_forward_host(moe, 0, NULL, 0, NULL, 0, NULL, NULL));
    clffn_moe_destroy(moe);
    clffn_moe_destroy(NULL);
    clffn_context_destroy(ctx);
}

/* A NaN in a token's input makes its logits NaN: it still gets k distinct experts in range (a
 * NaN logit ranks as -inf), its output is NaN, and the other tokens' outputs are as they were
 * (to rounding: an expert's row count, and with it its products' path, may change). */
Test(moe, a_nan_token_stays_in_bounds) {
    clffn_context *ctx = test_context();
    const moe_case mc = {4, 6, 2, CLFFN_ROUTING_TOPK_NORMALIZED, 0, 0, 1, CLFFN_ACT_SILU, 0, 0};
    moe_data m;
    data_make(&m, &mc, 32, 48, 5);
    clffn_moe *moe = moe_make(ctx, &m);
    float clean[4 * 32], y[4 * 32];
    ASSERT_OK(clffn_moe_forward_host(moe, 4, m.x, 4 * 32, clean, 4 * 32, NULL, NULL));
    m.x[1 * 32 + 3] = NAN;
    int32_t ch[4 * 2];
    ASSERT_OK(clffn_moe_forward_host(moe, 4, m.x, 4 * 32, y, 4 * 32, ch, NULL));
    for (size_t t = 0; t < 4; ++t) {
        cr_assert(ch[2 * t] >= 0 && ch[2 * t] < 6 && ch[2 * t + 1] >= 0 && ch[2 * t + 1] < 6 &&
                      ch[2 * t] != ch[2 * t + 1],
                  "token %zu: experts %d, %d", t, (int)ch[2 * t], (int)ch[2 * t + 1]);
        for (size_t d = 0; d < 32; ++d) {
            const float v = y[t * 32 + d];
            const float c = clean[t * 32 + d];
            cr_assert(t == 1 ? isnan(v) : fabsf(v - c) <= 1e-5f * (1.0f + fabsf(c)),
                      "token %zu, %zu: %g", t, d, (double)v);
        }
    }
    clffn_moe_destroy(moe);
    data_free(&m);
    clffn_context_destroy(ctx);
}

/* ---- backward ----------------------------------------------------------------------------- */

/* An expert's gradient arrays, float (the device's, filled with 5) and double (the
 * reference's). */
typedef struct grad_set {
    float *f[6];
    double *d[6];
    size_t n[6];
} grad_set;

static void grads_make(grad_set *g, const clffn_config *c) {
    const size_t D = c->d_model, F = c->d_ff;
    const size_t n[6] = {
        F * D, c->bias1 ? F : 0, c->gated ? F * D : 0, c->gated && c->bias_gate ? F : 0,
        D * F, c->bias2 ? D : 0};
    for (int i = 0; i < 6; ++i) {
        g->n[i] = n[i];
        g->f[i] = n[i] ? malloc(n[i] * sizeof(float)) : NULL;
        g->d[i] = n[i] ? calloc(n[i], sizeof(double)) : NULL;
        /* what a backward that does not accumulate must overwrite, unchosen experts' too */
        for (size_t j = 0; j < n[i]; ++j) { g->f[i][j] = 5.0f; }
    }
}

static void grads_free(grad_set *g) {
    for (int i = 0; i < 6; ++i) { free(g->f[i]), free(g->d[i]); }
}

/* The device's backward of m's T tokens against the reference's: dx, the router's gradients,
 * every expert's; with accumulate = 1 on arrays already holding one backward, twice. */
static void check_backward(clffn_moe *moe, const moe_data *m, size_t T, int twice,
                           const char *what) {
    const size_t D = m->c.expert.d_model, ne = m->n_w;
    const size_t E = m->c.experts + (m->c.shared_gate ? 1 : 0); /* the router's rows */
    float *dy = malloc(T * D * sizeof *dy), *y = malloc(T * D * sizeof *y);
    float *dx = malloc(T * D * sizeof *dx), *rg = malloc(E * D * sizeof *rg), rbg[17];
    double *rdx = malloc(T * D * 8), *rrg = malloc(E * D * 8), rrbg[17];
    grad_set *gs = calloc(ne, sizeof *gs);
    clffn_weight_arrays *wa = calloc(ne, sizeof *wa);
    clffn_ref_grads *ra = calloc(ne, sizeof *ra);
    cr_assert(dy && y && dx && rg && rdx && rrg && gs && wa && ra);
    fill_uniform(dy, T * D, -1.0f, 1.0f, 77);
    for (size_t e = 0; e < ne; ++e) {
        const clffn_config ce = expert_config(m, e);
        grads_make(&gs[e], &ce);
        const clffn_weight_arrays a = {gs[e].f[0], gs[e].f[1], gs[e].f[2],
                                       gs[e].f[3], gs[e].f[4], gs[e].f[5]};
        const clffn_ref_grads r = {gs[e].d[0], gs[e].d[1], gs[e].d[2],
                                   gs[e].d[3], gs[e].d[4], gs[e].d[5]};
        wa[e] = a, ra[e] = r;
    }
    ASSERT_OK(clffn_moe_forward_host(moe, T, m->x, T * D, y, T * D, NULL, NULL));
    for (int pass = 0; pass <= twice; ++pass) {
        ASSERT_OK(clffn_moe_backward_host(moe, T, dy, T * D, dx, T * D, rg, rbg, wa, pass));
    }
    ASSERT_OK(clffn_moe_reference_backward(&m->c, CLFFN_LAYOUT_OUT_IN, m->router,
                                           m->c.router_bias ? m->bias : NULL, m->hw, T, m->x, dy,
                                           rdx, rrg, m->c.router_bias ? rrbg : NULL, ra));
    const double times = twice ? 2.0 : 1.0;
    for (size_t i = 0; i < E * D; ++i) { rrg[i] *= times; }
    for (size_t i = 0; i < E; ++i) { rrbg[i] *= times; }
    char msg[160];
    assert_close(dx, rdx, T * D, TOL_RTOL, what);
    snprintf(msg, sizeof msg, "%s: the router's gradient", what);
    assert_close(rg, rrg, E * D, TOL_RTOL, msg);
    if (m->c.router_bias) { assert_close(rbg, rrbg, E, TOL_RTOL, msg); }
    for (size_t e = 0; e < ne; ++e) {
        for (int i = 0; i < 6; ++i) {
            if (!gs[e].n[i]) { continue; }
            for (size_t j = 0; j < gs[e].n[i]; ++j) { gs[e].d[i][j] *= times; }
            snprintf(msg, sizeof msg, "%s: expert %zu's gradient %d", what, e, i);
            assert_close(gs[e].f[i], gs[e].d[i], gs[e].n[i], TOL_RTOL, msg);
        }
        grads_free(&gs[e]);
    }
    free(dy), free(y), free(dx), free(rg), free(rdx), free(rrg), free(gs), free(wa), free(ra);
}

static const moe_case bwd_cases[] = {
    {1, 4, 2, CLFFN_ROUTING_TOPK_NORMALIZED, 0, 0, 1, CLFFN_ACT_SILU, 0, 0},
    {9, 6, 3, CLFFN_ROUTING_TOPK, 1, 1, 0, CLFFN_ACT_GELU, 0, 0},
    {24, 8, 2, CLFFN_ROUTING_TOPK_NORMALIZED, 1, 1, 1, CLFFN_ACT_RELU, 0, 0},
    {5, 3, 1, CLFFN_ROUTING_TOPK_NORMALIZED, 0, 1, 0, CLFFN_ACT_SIGMOID, 0, 0},
    {11, 6, 2, CLFFN_ROUTING_TOPK, 1, 1, 1, CLFFN_ACT_SILU, 1, 72},
    {3, 4, 2, CLFFN_ROUTING_TOPK_NORMALIZED, 1, 0, 0, CLFFN_ACT_GELU, 0, 16},
};

static void backward_check(clffn_moe *moe, const moe_data *m, const moe_case *mc,
                           const char *what) {
    check_backward(moe, m, mc->tokens, 0, what);
    check_backward(moe, m, mc->tokens, 1, what); /* accumulated: twice the gradients */
}

Test(moe, backward_matches_the_double_reference, .timeout = 300) {
    each_case(bwd_cases, sizeof bwd_cases / sizeof bwd_cases[0], 32, 40, 300, backward_check);
}

/* dx alone (no expert gradients asked for) equals the reference's, and no expert, the shared
 * one included, got gradient buffers for its weights: that backward neither computes nor keeps
 * them. */
Test(moe, dx_alone_makes_no_expert_gradients, .timeout = 120) {
    clffn_context *ctx = test_context();
    const moe_case mc = {12, 5, 2, CLFFN_ROUTING_TOPK_NORMALIZED, 1, 1, 1, CLFFN_ACT_SILU, 0, 0};
    const size_t T = mc.tokens, D = 32, E = mc.experts;
    moe_data m;
    data_make(&m, &mc, D, 48, 21);
    clffn_moe *moe = moe_make(ctx, &m);
    float y[12 * 32], dy[12 * 32], dx[12 * 32], rg[5 * 32], rbg[5];
    double rdx[12 * 32];
    fill_uniform(dy, T * D, -1.0f, 1.0f, 3);
    ASSERT_OK(clffn_moe_forward_host(moe, T, m.x, T * D, y, T * D, NULL, NULL));
    ASSERT_OK(clffn_moe_backward_host(moe, T, dy, T * D, dx, T * D, rg, rbg, NULL, 0));
    ASSERT_OK(clffn_moe_reference_backward(&m.c, CLFFN_LAYOUT_OUT_IN, m.router, m.bias, m.hw, T,
                                           m.x, dy, rdx, NULL, NULL, NULL));
    assert_close(dx, rdx, T * D, TOL_RTOL, "dx without expert gradients");
    for (size_t e = 0; e <= E; ++e) {
        const clffn_ffn *f = clffn_moe_expert(moe, e);
        cr_assert(f->ws.g_w1 == NULL && f->ws.g_w2 == NULL, "expert %zu has gradient buffers", e);
    }
    clffn_moe_destroy(moe);
    data_free(&m);
    clffn_context_destroy(ctx);
}

/* L = Σ y·dy of the reference forward. */
static double loss(const moe_data *m, size_t T, const float *dy, int32_t *chosen) {
    const size_t D = m->c.expert.d_model;
    double *y = malloc(T * D * sizeof *y), l = 0.0;
    cr_assert(y);
    ASSERT_OK(clffn_moe_reference_forward(&m->c, CLFFN_LAYOUT_OUT_IN, m->router,
                                          m->c.router_bias ? m->bias : NULL, m->hw, T, m->x, y,
                                          chosen, NULL));
    for (size_t i = 0; i < T * D; ++i) { l += y[i] * dy[i]; }
    free(y);
    return l;
}

/* ∂L/∂v at v by central differences (h = 2^-9), or NAN where the choice moved. */
static double central(const moe_data *m, size_t T, const float *dy, float *v) {
    const size_t k = m->c.top_k;
    int32_t c0[64], cp[64], cm[64];
    const float v0 = *v, h = 1.0f / 512.0f;
    loss(m, T, dy, c0);
    *v = v0 + h;
    const double lp = loss(m, T, dy, cp);
    *v = v0 - h;
    const double lm = loss(m, T, dy, cm);
    *v = v0;
    const int moved = memcmp(c0, cp, T * k * 4) || memcmp(c0, cm, T * k * 4);
    return moved ? NAN : (lp - lm) / (2.0 * (double)h);
}

/* The reference's gradients against central differences of its forward: the router's weights
 * and bias, x, and an expert's W1, for both routing modes, and (mode 2) with the shared expert
 * of its own width behind the router's gate row, which the probes reach too. */
Test(moe, reference_gradients_match_finite_differences, .timeout = 120) {
    for (int mode = 0; mode < 3; ++mode) {
        const moe_case mc = {4,         5,
                             2,         (clffn_routing)(mode & 1),
                             1,         1,
                             1,         CLFFN_ACT_SILU,
                             mode == 2, mode == 2 ? 40 : 0};
        moe_data m;
        data_make(&m, &mc, 16, 24, 500 + mode);
        const size_t T = 4, D = 16, E = 5 + (mode == 2); /* E: the router's rows, experts too */
        float dy[4 * 16];
        fill_uniform(dy, T * D, -1.0f, 1.0f, 9);
        double dx[4 * 16], rg[6 * 16], rbg[6];
        grad_set g[6];
        clffn_ref_grads ra[6];
        for (size_t e = 0; e <= 5; ++e) {
            const clffn_config ce = expert_config(&m, e);
            grads_make(&g[e], &ce);
            const clffn_ref_grads r = {g[e].d[0], g[e].d[1], g[e].d[2],
                                       g[e].d[3], g[e].d[4], g[e].d[5]};
            ra[e] = r;
        }
        ASSERT_OK(clffn_moe_reference_backward(&m.c, CLFFN_LAYOUT_OUT_IN, m.router, m.bias, m.hw, T,
                                               m.x, dy, dx, rg, rbg, ra));
        size_t checked = 0;
        for (size_t i = 0; i < 12; ++i) {
            struct {
                float *v;
                double want;
            } probes[4] = {{&m.router[i * 29 % (E * D)], rg[i * 29 % (E * D)]},
                           {&m.bias[i % E], rbg[i % E]},
                           {&m.x[i * 5 % (T * D)], dx[i * 5 % (T * D)]},
                           {&m.w[i % E].w1[i * 11], g[i % E].d[0][i * 11]}};
            for (int p = 0; p < 4; ++p) {
                const double fd = central(&m, T, dy, probes[p].v);
                if (isnan(fd)) { continue; }
                cr_assert(fabs(fd - probes[p].want) <= 1e-4 * (1.0 + fabs(fd)),
                          "mode %d, probe %d.%zu: finite differences %.8g, the reference %.8g",
                          mode, p, i, fd, probes[p].want);
                ++checked;
            }
        }
        cr_assert(checked >= 40, "only %zu probes kept their choice", checked);
        for (size_t e = 0; e <= 5; ++e) { grads_free(&g[e]); }
        data_free(&m);
    }
}

/* The load-balancing loss: the device's value against the reference's; k exactly for a router
 * that ties everything (experts 0..k-1 chosen, probabilities 1/E); and with aux_loss_coef set,
 * the backward (its gradient through the softmax into the router and x) against the
 * reference's. */
Test(moe, aux_loss_and_its_gradient, .timeout = 120) {
    clffn_context *ctx = test_context();
    const moe_case mc = {12, 6, 2, CLFFN_ROUTING_TOPK_NORMALIZED, 1, 1, 1, CLFFN_ACT_SILU, 0, 0};
    moe_data m;
    data_make(&m, &mc, 32, 40, 900);
    m.c.aux_loss_coef = 0.75f;
    clffn_moe *moe = moe_make(ctx, &m);
    double aux = 0.0, ref = 0.0;
    cr_assert(clffn_moe_aux_loss(moe, &aux) == CLFFN_ERROR_NO_FORWARD);
    check_backward(moe, &m, 12, 0, "aux_loss_coef 0.75");
    ASSERT_OK(clffn_moe_aux_loss(moe, &aux));
    ASSERT_OK(clffn_moe_reference_aux_loss(&m.c, m.router, m.bias, 12, m.x, &ref));
    cr_assert(fabs(aux - ref) <= 1e-6 * ref, "aux %.9g, the reference %.9g", aux, ref);
    clffn_moe_destroy(moe);
    memset(m.router, 0, 6 * 32 * sizeof *m.router);
    memset(m.bias, 0, 6 * sizeof *m.bias);
    moe = moe_make(ctx, &m);
    float y[12 * 32];
    ASSERT_OK(clffn_moe_forward_host(moe, 12, m.x, 12 * 32, y, 12 * 32, NULL, NULL));
    ASSERT_OK(clffn_moe_aux_loss(moe, &aux));
    cr_assert(fabs(aux - 2.0) <= 1e-6, "a tied router: aux %.9g, not k = 2", aux);
    clffn_moe_destroy(moe);
    data_free(&m);
    clffn_context_destroy(ctx);
}

/* Decoding sizes with the counts kept on the device (f32 experts on clffn's own kernels, as a
 * GPU's profile has them): the forward, at the cases' token counts and fewer on the same layer;
 * the backward after such a forward, which runs the routing again with the counts read back;
 * and the load-balancing loss, whose counts the forward never read. */
static const moe_case counted_cases[] = {
    {1, 8, 2, CLFFN_ROUTING_TOPK_NORMALIZED, 0, 0, 1, CLFFN_ACT_SILU, 0, 0},
    {7, 4, 1, CLFFN_ROUTING_TOPK, 0, 1, 0, CLFFN_ACT_RELU, 0, 0},
    {16, 16, 4, CLFFN_ROUTING_TOPK_NORMALIZED, 1, 1, 1, CLFFN_ACT_GELU, 0, 0},
    {2, 5, 2, CLFFN_ROUTING_TOPK, 1, 1, 1, CLFFN_ACT_SILU, 0, 0},
    {3, 6, 2, CLFFN_ROUTING_TOPK, 1, 0, 1, CLFFN_ACT_SILU, 1, 96},
    {9, 3, 3, CLFFN_ROUTING_TOPK, 1, 0, 0, CLFFN_ACT_GELU_TANH, 0, 0},
};

static void counted_aux_check(clffn_moe *moe, const moe_data *m, const moe_case *mc,
                              const char *what) {
    const size_t T = mc->tokens, D = m->c.expert.d_model;
    float *y = malloc(T * D * sizeof *y);
    cr_assert(y);
    ASSERT_OK(clffn_moe_forward_host(moe, T, m->x, T * D, y, T * D, NULL, NULL));
    double aux = 0.0, ref = 0.0;
    ASSERT_OK(clffn_moe_aux_loss(moe, &aux));
    ASSERT_OK(clffn_moe_reference_aux_loss(&m->c, m->router, m->bias, T, m->x, &ref));
    cr_assert(fabs(aux - ref) <= 1e-6 * ref, "%s: aux %.9g, the reference %.9g", what, aux, ref);
    free(y);
}

Test(moe, counts_on_the_device, .timeout = 300) {
    f32_kernel_max = CLFFN_MAX_KERNEL_TOKENS;
    const size_t n = sizeof counted_cases / sizeof counted_cases[0];
    each_case(counted_cases, n, 64, 96, 1000, forward_check);
    each_case(counted_cases, n, 32, 40, 1100, backward_check);
    each_case(counted_cases, n, 32, 40, 1200, counted_aux_check);
}

/* Whether a fresh layer's expert e ran in its last forward: its hidden state is there. */
static int expert_ran(clffn_moe *moe, size_t e) {
    static float hidden[16 * 96];
    size_t T = 0;
    const clffn_status st = clffn_ffn_read_hidden(clffn_moe_expert(moe, e), CLFFN_HIDDEN_PRE,
                                                  hidden, sizeof hidden / sizeof *hidden, &T);
    cr_assert(st == CLFFN_SUCCESS || st == CLFFN_ERROR_NO_FORWARD, "expert %zu: status %d", e,
              (int)st);
    return st == CLFFN_SUCCESS;
}

/* clffn_moe_set_counts: with the counts on the host a few-token forward launches only the
 * chosen experts (the others never ran: no hidden state), on the device all of them grouped
 * (none runs as an FFN of its own); AUTO reads them back where E > T·k. The outputs, choices
 * and weights are the same bits in every mode, and the backward after a forward with host
 * counts matches the reference. */
static void counts_where_check(clffn_moe *moe, const moe_data *m, const moe_case *mc,
                               const char *what) {
    (void)moe;
    const size_t T = mc->tokens, D = m->c.expert.d_model, E = m->c.experts, k = m->c.top_k;
    static const clffn_moe_counts modes[3] = {CLFFN_MOE_COUNTS_DEVICE, CLFFN_MOE_COUNTS_HOST,
                                              CLFFN_MOE_COUNTS_AUTO};
    float *y[3], *wt[3];
    int32_t *ch[3];
    for (int i = 0; i < 3; ++i) {
        clffn_context *ctx = test_context();
        ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, 0, CLFFN_MAX_KERNEL_TOKENS));
        clffn_moe *fresh = moe_make(ctx, m);
        ASSERT_OK(clffn_moe_set_counts(fresh, modes[i]));
        cr_assert_eq(clffn_moe_counts_where(fresh), modes[i]);
        y[i] = malloc(T * D * sizeof *y[i]), wt[i] = malloc(T * k * sizeof *wt[i]);
        ch[i] = malloc(T * k * sizeof *ch[i]);
        cr_assert(y[i] && wt[i] && ch[i]);
        ASSERT_OK(clffn_moe_forward_host(fresh, T, m->x, T * D, y[i], T * D, ch[i], wt[i]));
        const int host =
            modes[i] == CLFFN_MOE_COUNTS_HOST || (modes[i] == CLFFN_MOE_COUNTS_AUTO && E > T * k);
        /* one by one, only the chosen experts; on the device, all in grouped launches */
        cr_assert_eq(clffn_moe_experts_grouped(fresh), !host, "%s, mode %d", what, (int)modes[i]);
        cr_assert_eq(clffn_moe_counts_kept(fresh), !host, "%s, mode %d", what, (int)modes[i]);
        for (size_t e = 0; e < E; ++e) {
            int chosen = 0;
            for (size_t j = 0; j < T * k; ++j) { chosen |= (size_t)ch[i][j] == e; }
            cr_assert_eq(expert_ran(fresh, e), chosen && host,
                         "%s, mode %d: expert %zu (chosen %d) ran %d", what, (int)modes[i], e,
                         chosen, expert_ran(fresh, e));
        }
        if (modes[i] == CLFFN_MOE_COUNTS_HOST) { check_backward(fresh, m, T, 0, what); }
        clffn_moe_destroy(fresh);
        clffn_context_destroy(ctx);
    }
    for (int i = 1; i < 3; ++i) {
        cr_assert(!memcmp(y[i], y[0], T * D * sizeof *y[0]) &&
                      !memcmp(wt[i], wt[0], T * k * sizeof *wt[0]) &&
                      !memcmp(ch[i], ch[0], T * k * sizeof *ch[0]),
                  "%s: mode %d's outputs differ from the device counts'", what, (int)modes[i]);
    }
    for (int i = 0; i < 3; ++i) { free(y[i]), free(wt[i]), free(ch[i]); }
}

Test(moe, counts_on_the_host_on_request, .timeout = 300) {
    static const moe_case few[] = {
        {1, 8, 2, CLFFN_ROUTING_TOPK_NORMALIZED, 0, 0, 1, CLFFN_ACT_SILU, 0, 0},
        {3, 16, 2, CLFFN_ROUTING_TOPK, 1, 1, 0, CLFFN_ACT_GELU, 0, 0},
        {5, 4, 2, CLFFN_ROUTING_TOPK_NORMALIZED, 0, 1, 1, CLFFN_ACT_SILU, 0, 0}, /* AUTO: device */
    };
    each_case(few, sizeof few / sizeof few[0], 32, 40, 1300, counts_where_check);
    clffn_context *ctx = test_context();
    const moe_case mc = {1, 4, 2, CLFFN_ROUTING_TOPK_NORMALIZED, 0, 0, 1, CLFFN_ACT_SILU, 0, 0};
    moe_data m;
    data_make(&m, &mc, 32, 40, 1400);
    clffn_moe *moe = moe_make(ctx, &m);
    cr_assert_eq(clffn_moe_counts_where(moe), CLFFN_MOE_COUNTS_DEVICE, "the default");
    ASSERT_OK(clffn_moe_set_counts(moe, CLFFN_MOE_COUNTS_HOST));
    ASSERT_STATUS(clffn_moe_set_counts(moe, (clffn_moe_counts)3), CLFFN_ERROR_INVALID_ARGUMENT);
    ASSERT_STATUS(clffn_moe_set_counts(moe, (clffn_moe_counts)-1), CLFFN_ERROR_INVALID_ARGUMENT);
    cr_assert_eq(clffn_moe_counts_where(moe), CLFFN_MOE_COUNTS_HOST, "unchanged by a refusal");
    ASSERT_STATUS(clffn_moe_set_counts(NULL, CLFFN_MOE_COUNTS_HOST), CLFFN_ERROR_NULL_ARGUMENT);
    cr_assert_eq(clffn_moe_counts_where(NULL), CLFFN_MOE_COUNTS_DEVICE);
    clffn_moe_destroy(moe);
    data_free(&m);
    clffn_context_destroy(ctx);
}

/* y's bits with the counts where asked. */
static void forward_bits(clffn_moe *moe, const moe_data *m, size_t T, clffn_moe_counts where,
                         float *y) {
    const size_t D = m->c.expert.d_model;
    ASSERT_OK(clffn_moe_set_counts(moe, where));
    ASSERT_OK(clffn_moe_forward_host(moe, T, m->x, T * D, y, T * D, NULL, NULL));
}

/* clffn_moe_counts_kept says what the last forward did, not what the setting asked: with the
 * context's f32 crossover at one pass of clffn's kernels (16 tokens) the counts stay on the
 * device up to 16 tokens and are read back at 17; with the kernels at every count f32 experts
 * still read them back there (tiles pay for q8_0's and q4_0's experts alone), and where tiles
 * are asked for every type they stay at 17 and 40 too. Read back on request, and after a
 * backward, which runs the routing again with them read back. Eight forwards and a backward at
 * five token counts: on rusticl's llvmpipe on a 2-core AVX2 host, with Mesa's shader cache cold,
 * this ran past 120 s. */
Test(moe, counts_kept_says_what_ran, .timeout = 300) {
    clffn_context *ctx = test_context();
    ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, CLFFN_KERNELS_F32, CLFFN_MAX_KERNEL_TOKENS));
    const moe_case mc = {17, 4, 2, CLFFN_ROUTING_TOPK_NORMALIZED, 0, 0, 1, CLFFN_ACT_SILU, 0, 0};
    moe_data m;
    data_make(&m, &mc, 32, 40, 1700);
    clffn_moe *moe = moe_make(ctx, &m);
    cr_assert_eq(clffn_moe_counts_kept(NULL), 0);
    cr_assert_eq(clffn_moe_counts_kept(moe), 0, "no forward yet");
    static float y[17 * 32];
    static const struct {
        size_t tokens;
        clffn_moe_counts where;
        int kept;
    } runs[] = {{16, CLFFN_MOE_COUNTS_DEVICE, 1},
                {17, CLFFN_MOE_COUNTS_DEVICE, 0},
                {3, CLFFN_MOE_COUNTS_HOST, 0},
                {3, CLFFN_MOE_COUNTS_AUTO, 1}, /* E = 4 ≤ T·k */
                {1, CLFFN_MOE_COUNTS_AUTO, 0}};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; ++i) {
        forward_bits(moe, &m, runs[i].tokens, runs[i].where, y);
        cr_assert_eq(clffn_moe_counts_kept(moe), runs[i].kept, "%zu tokens, setting %d",
                     runs[i].tokens, (int)runs[i].where);
    }
    ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, CLFFN_KERNELS_F32, (size_t)1 << 30));
    static float y40[40 * 32];
    const moe_case mc40 = {40, 4, 2, CLFFN_ROUTING_TOPK_NORMALIZED, 0, 0, 1, CLFFN_ACT_SILU, 0, 0};
    moe_data m40;
    data_make(&m40, &mc40, 32, 40, 1700);
    clffn_moe *moe40 = moe_make(ctx, &m40);
    forward_bits(moe40, &m40, 40, CLFFN_MOE_COUNTS_DEVICE, y40);
    cr_assert_eq(clffn_moe_counts_kept(moe40), 0, "40 tokens, f32 experts");
    moe40->group.tiles_any_type = moe->group.tiles_any_type = true;
    forward_bits(moe40, &m40, 40, CLFFN_MOE_COUNTS_DEVICE, y40);
    cr_assert_eq(clffn_moe_counts_kept(moe40), 1, "40 tokens, kernels at every count");
    forward_bits(moe, &m, 17, CLFFN_MOE_COUNTS_DEVICE, y);
    cr_assert_eq(clffn_moe_counts_kept(moe), 1, "17 tokens, kernels at every count");
    forward_bits(moe, &m, 17, CLFFN_MOE_COUNTS_HOST, y);
    cr_assert_eq(clffn_moe_counts_kept(moe), 0, "17 tokens, on request");
    clffn_moe_destroy(moe40);
    data_free(&m40);
    ASSERT_OK(clffn_moe_set_counts(moe, CLFFN_MOE_COUNTS_DEVICE));
    check_backward(moe, &m, 3, 0, "after a forward that kept the counts");
    cr_assert_eq(clffn_moe_counts_kept(moe), 0, "the backward read them back");
    clffn_moe_destroy(moe);
    data_free(&m);
    clffn_context_destroy(ctx);
}

/* With the counts on the device and every expert's weights uploaded alike, the experts run
 * grouped (one launch a stage for all of them), GLU experts with all three biases included, and
 * give the bits that running them one by one (counts on the host) gives, which match the
 * reference. An expert's upload after a forward writes over its slot, and the next forward uses
 * the new weights. An expert bound from the caller's buffers runs on its own (the others too);
 * uploaded again, it is back in the group, with the grouped bits. */
Test(moe, experts_grouped, .timeout = 300) {
    const size_t D = 32, F = 40, E = 6;
    clffn_context *ctx = test_context();
    ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, 0, CLFFN_MAX_KERNEL_TOKENS));
    const moe_case mc = {16, E, 2, CLFFN_ROUTING_TOPK_NORMALIZED, 0, 0, 1, CLFFN_ACT_GELU, 0, 0};
    moe_data m;
    data_make(&m, &mc, D, F, 1500);
    m.c.expert.bias1 = m.c.expert.bias_gate = m.c.expert.bias2 = 1;
    for (size_t e = 0; e < E; ++e) { /* again, with the biases */
        test_weights_free(&m.w[e]);
        test_weights_make(&m.w[e], &m.c.expert, CLFFN_LAYOUT_OUT_IN, 1510 + e);
        m.hw[e] = m.w[e].host;
    }
    clffn_moe *moe = moe_make(ctx, &m);
    cr_assert_eq(clffn_moe_experts_grouped(moe), 0, "no forward yet");
    static float y[16 * 32], y1[16 * 32];
    static const size_t tokens[] = {1, 3, 16};
    for (size_t i = 0; i < 3; ++i) {
        const size_t T = tokens[i];
        char what[64];
        snprintf(what, sizeof what, "grouped, %zu tokens", T);
        forward_bits(moe, &m, T, CLFFN_MOE_COUNTS_HOST, y1);
        cr_assert_eq(clffn_moe_experts_grouped(moe), 0, "%s: counts on the host", what);
        forward_bits(moe, &m, T, CLFFN_MOE_COUNTS_DEVICE, y);
        cr_assert_eq(clffn_moe_experts_grouped(moe), 1, "%s", what);
        cr_assert(!memcmp(y, y1, T * D * sizeof *y), "%s: not one by one's bits", what);
        check_against_reference(moe, &m, T, what);
    }
    /* new weights for expert 2, written over its slot */
    test_weights_free(&m.w[2]);
    test_weights_make(&m.w[2], &m.c.expert, CLFFN_LAYOUT_OUT_IN, 1600);
    m.hw[2] = m.w[2].host;
    ASSERT_OK(clffn_ffn_upload_weights(clffn_moe_expert(moe, 2), CLFFN_LAYOUT_OUT_IN, &m.hw[2]));
    check_against_reference(moe, &m, 16, "expert 2 uploaded again");
    cr_assert_eq(clffn_moe_experts_grouped(moe), 1, "expert 2 uploaded again");
    forward_bits(moe, &m, 16, CLFFN_MOE_COUNTS_DEVICE, y);
    /* expert 4 from the caller's buffers: W1 and V apart, not in the pools */
    const float *src[6] = {m.hw[4].w1, m.hw[4].b1, m.hw[4].v, m.hw[4].bv, m.hw[4].w2, m.hw[4].b2};
    const size_t n[6] = {F * D, F, F * D, F, D * F, D};
    cl_mem mem[6];
    for (size_t i = 0; i < 6; ++i) {
        cl_int err;
        mem[i] =
            clCreateBuffer(clffn_context_cl_context(ctx), CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                           n[i] * sizeof(float), (void *)src[i], &err);
        cr_assert_eq(err, CL_SUCCESS);
    }
    const clffn_device_weights dw = {{mem[0], 0}, {mem[1], 0}, {mem[2], 0},
                                     {mem[3], 0}, {mem[4], 0}, {mem[5], 0}};
    ASSERT_OK(clffn_ffn_bind_weights(clffn_moe_expert(moe, 4), CLFFN_LAYOUT_OUT_IN, &dw));
    check_against_reference(moe, &m, 16, "expert 4 bound"); /* kept [out, in]: other sums */
    cr_assert_eq(clffn_moe_experts_grouped(moe), 0, "an expert bound from the caller's buffers");
    /* one at a time at one token, the experts reading x where it lies (no gather) */
    check_against_reference(moe, &m, 1, "expert 4 bound, one token");
    cr_assert_eq(clffn_moe_experts_grouped(moe), 0, "expert 4 bound, one token");
    ASSERT_OK(clffn_ffn_upload_weights(clffn_moe_expert(moe, 4), CLFFN_LAYOUT_OUT_IN, &m.hw[4]));
    forward_bits(moe, &m, 16, CLFFN_MOE_COUNTS_DEVICE, y1);
    cr_assert_eq(clffn_moe_experts_grouped(moe), 1, "expert 4 uploaded again");
    cr_assert(!memcmp(y, y1, 16 * D * sizeof *y), "uploaded again: not the grouped bits");
    clffn_moe_destroy(moe);
    for (size_t i = 0; i < 6; ++i) { clReleaseMemObject(mem[i]); }
    data_free(&m);
    clffn_context_destroy(ctx);
}

/* Past one pass of the kernels (16 tokens), where every expert's products run clffn's own
 * kernels at every count, the counts stay on the device: each expert's rows go in tiles of 16,
 * each tile a step of the grouped launches. The outputs are the bits of the counts read back
 * (each expert on its rows, in passes of 16), and match the reference (on the dequantized
 * weights), for every stored type; plain and gated experts, with biases, beside a shared
 * expert; every token sent to one expert (full tiles and a part-filled one); k = E; inputs
 * rounded to q8_0; and fewer tokens on the same layer. The backward after such a forward
 * matches the reference. */
static const moe_case tiled_cases[] = {
    {17, 4, 2, CLFFN_ROUTING_TOPK_NORMALIZED, 0, 0, 1, CLFFN_ACT_SILU, 0, 0},
    {40, 8, 3, CLFFN_ROUTING_TOPK, 1, 1, 1, CLFFN_ACT_GELU, 1, 24},
    {100, 16, 16, CLFFN_ROUTING_TOPK_NORMALIZED, 0, 0, 0, CLFFN_ACT_RELU, 0, 0},
    {200, 3, 1, CLFFN_ROUTING_TOPK, 0, 1, 1, CLFFN_ACT_GELU_TANH, 0, 0},
    {40, 4, 1, CLFFN_ROUTING_TOPK_NORMALIZED, 0, 1, 0, CLFFN_ACT_SILU, 0, 0}, /* all to one */
    {48, 1, 1, CLFFN_ROUTING_TOPK_NORMALIZED, 0, 0, 1, CLFFN_ACT_SILU, 0, 0},
};

static void tiled_check(clffn_context *ctx, clffn_dtype type, int qx, const moe_case *mc,
                        size_t ci) {
    const size_t D = 64, F = 96, T = mc->tokens, E = mc->experts;
    moe_data m;
    data_make(&m, mc, D, F, 1900 + 10 * ci + (size_t)type);
    if (ci == 4) { m.bias[2] = 64.0f; } /* every token's one expert: 2 */
    m.c.expert.bias1 = m.c.expert.bias2 = 1, m.c.expert.bias_gate = m.c.expert.gated;
    typed_set *ts = calloc(E, sizeof *ts);
    cr_assert(ts);
    const bool typed = type != CLFFN_DTYPE_F32;
    for (size_t e = 0; e < m.n_w; ++e) { /* again, with the biases; the routed ones typed */
        const clffn_config ce = expert_config(&m, e);
        test_weights_free(&m.w[e]);
        test_weights_make(&m.w[e], &ce, CLFFN_LAYOUT_OUT_IN, 1950 + 7 * e + ci);
        m.hw[e] = m.w[e].host;
        if (typed && e < E) {
            typed_make(&ts[e], &ce, &m.w[e], type, CLFFN_LAYOUT_OUT_IN);
            m.hw[e] = ts[e].ref;
        }
    }
    clffn_moe *moe = NULL;
    ASSERT_OK(clffn_moe_create(ctx, &m.c, &moe));
    ASSERT_OK(clffn_moe_upload_router(moe, m.router, m.c.router_bias ? m.bias : NULL));
    for (size_t e = 0; e < m.n_w; ++e) {
        clffn_ffn *f = clffn_moe_expert(moe, e);
        ASSERT_OK(typed && e < E
                      ? clffn_ffn_upload_weights_typed(f, CLFFN_LAYOUT_OUT_IN, &ts[e].typed)
                      : clffn_ffn_upload_weights(f, CLFFN_LAYOUT_OUT_IN, &m.hw[e]));
    }
    float *y = malloc(T * D * sizeof *y), *y1 = malloc(T * D * sizeof *y1);
    cr_assert(y && y1);
    if (type != CLFFN_DTYPE_Q8_0 && type != CLFFN_DTYPE_Q4_0) { /* tiles pay for those alone */
        forward_bits(moe, &m, T, CLFFN_MOE_COUNTS_DEVICE, y);
        cr_assert_eq(clffn_moe_counts_kept(moe), 0, "%s experts, case %zu: kept",
                     clffn_dtype_name(type), ci);
        moe->group.tiles_any_type = true;
    }
    const size_t counts[2] = {T, 17};
    for (size_t i = 0; i < 2; ++i) {
        const size_t n = counts[i];
        char what[128];
        snprintf(what, sizeof what, "%s experts%s, case %zu, %zu tokens", clffn_dtype_name(type),
                 qx ? ", inputs as q8_0" : "", ci, n);
        forward_bits(moe, &m, n, CLFFN_MOE_COUNTS_HOST, y1);
        cr_assert_eq(clffn_moe_counts_kept(moe), 0, "%s: on request", what);
        forward_bits(moe, &m, n, CLFFN_MOE_COUNTS_DEVICE, y);
        cr_assert_eq(clffn_moe_counts_kept(moe), 1, "%s: not kept", what);
        cr_assert_eq(clffn_moe_experts_grouped(moe), 1, "%s: not grouped", what);
        for (size_t j = 0; j < n * D; ++j) {
            cr_assert(!memcmp(&y[j], &y1[j], sizeof *y), "%s: y[%zu] %.9g, read back %.9g", what, j,
                      (double)y[j], (double)y1[j]);
        }
        if (!qx) { check_against_reference(moe, &m, n, what); }
    }
    if (type == CLFFN_DTYPE_F32) {
        ASSERT_OK(clffn_moe_set_counts(moe, CLFFN_MOE_COUNTS_DEVICE));
        check_backward(moe, &m, T, 0, "the backward after a forward in tiles");
    }
    free(y), free(y1);
    clffn_moe_destroy(moe);
    for (size_t e = 0; typed && e < E; ++e) { typed_free(&ts[e]); }
    free(ts);
    data_free(&m);
}

Test(moe, experts_tiled, .timeout = 600) {
    static const struct {
        clffn_dtype type;
        int qx;
    } kinds[] = {{CLFFN_DTYPE_F32, 0},  {CLFFN_DTYPE_F16, 0},  {CLFFN_DTYPE_BF16, 0},
                 {CLFFN_DTYPE_Q8_0, 0}, {CLFFN_DTYPE_Q4_0, 0}, {CLFFN_DTYPE_Q4_0, 1}};
    for (size_t ki = 0; ki < sizeof kinds / sizeof kinds[0]; ++ki) {
        clffn_context *ctx = test_context();
        for (int c = 0; c < 5; ++c) { /* every class of product: clffn's kernels at any count */
            ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, c, (size_t)1 << 30));
        }
        ASSERT_OK(clffn_context_set_quantized_inputs(ctx, kinds[ki].qx));
        for (size_t ci = 0; ci < sizeof tiled_cases / sizeof tiled_cases[0]; ++ci) {
            tiled_check(ctx, kinds[ki].type, kinds[ki].qx, &tiled_cases[ci], ci);
        }
        clffn_context_destroy(ctx);
    }
}

/* The reference's auxiliary gradient against central differences of Σ y·dy + α·aux in the
 * router's weights. */
Test(moe, reference_aux_gradient_matches_finite_differences, .timeout = 120) {
    const moe_case mc = {6, 4, 2, CLFFN_ROUTING_TOPK, 0, 0, 1, CLFFN_ACT_SILU, 0, 0};
    moe_data m;
    data_make(&m, &mc, 16, 24, 950);
    m.c.aux_loss_coef = 2.0f;
    const size_t T = 6, D = 16, E = 4;
    float dy[6 * 16];
    fill_uniform(dy, T * D, -1.0f, 1.0f, 12);
    double rg[4 * 16];
    ASSERT_OK(clffn_moe_reference_backward(&m.c, CLFFN_LAYOUT_OUT_IN, m.router, NULL, m.hw, T, m.x,
                                           dy, NULL, rg, NULL, NULL));
    size_t checked = 0;
    for (size_t i = 0; i < E * D; i += 5) {
        const float v0 = m.router[i], h = 1.0f / 512.0f;
        double l[2];
        int32_t ch[2][12], c0[12];
        loss(&m, T, dy, c0);
        for (int s = 0; s < 2; ++s) {
            m.router[i] = v0 + (s ? -h : h);
            double aux;
            l[s] = loss(&m, T, dy, ch[s]);
            ASSERT_OK(clffn_moe_reference_aux_loss(&m.c, m.router, NULL, T, m.x, &aux));
            l[s] += 2.0 * aux;
        }
        m.router[i] = v0;
        if (memcmp(ch[0], c0, sizeof c0) || memcmp(ch[1], c0, sizeof c0)) { continue; }
        const double fd = (l[0] - l[1]) / (2.0 * (double)h);
        cr_assert(fabs(fd - rg[i]) <= 1e-4 * (1.0 + fabs(fd)), "router[%zu]: %.8g vs %.8g", i, fd,
                  rg[i]);
        ++checked;
    }
    cr_assert(checked >= 8, "only %zu probes kept their choice", checked);
    data_free(&m);
}
