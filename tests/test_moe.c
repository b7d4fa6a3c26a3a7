/* The mixture-of-experts layer against the double reference (clffn_moe_reference_forward):
 * outputs, the chosen experts and their weights, for every routing mode, 1 to 200 tokens, 1 to
 * 16 experts and k from 1 to E, ties, experts no token chose, every token sent to one expert,
 * and bad input.
 *
 * The router's inputs are dyadic (x in steps of 1/64, router weights in steps of 1/64, bias in
 * steps of 1/8), so every logit is exact in float as in double, and the device and the
 * reference see the same order of experts, ties included: the choice is a comparison, and an
 * ulp of rounding would otherwise decide near-ties differently on the two sides. */
#include "common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct moe_case {
    size_t tokens, experts, k;
    clffn_routing routing;
    int shared, router_bias, gated;
    clffn_activation act;
} moe_case;

/* A layer's host data: x, the router, and E (+1) expert weight sets. */
typedef struct moe_data {
    clffn_moe_config c;
    float *x, *router, *bias;
    test_weights *w;
    clffn_host_weights *hw;
    size_t n_w;
} moe_data;

static uint64_t next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* Values m / den for integers m in [-range, range]. */
static void fill_dyadic(float *a, size_t n, int range, float den, uint64_t seed) {
    for (size_t i = 0; i < n; ++i) {
        a[i] = (float)((int)(next(&seed) % (uint64_t)(2 * range + 1)) - range) / den;
    }
}

static void data_make(moe_data *m, const moe_case *mc, size_t D, size_t F, uint64_t seed) {
    memset(m, 0, sizeof *m);
    m->c = clffn_moe_config_default(D, F, mc->experts, mc->k);
    m->c.expert.activation = mc->act;
    m->c.expert.gated = mc->gated;
    m->c.expert.bias1 = m->c.expert.bias2 = m->c.expert.bias_gate = !mc->gated;
    m->c.routing = mc->routing;
    m->c.shared_expert = mc->shared;
    m->c.router_bias = mc->router_bias;
    const size_t T = mc->tokens, E = mc->experts;
    m->x = malloc((T * D + 1) * sizeof *m->x);
    m->router = malloc(E * D * sizeof *m->router);
    m->bias = malloc(E * sizeof *m->bias);
    m->n_w = E + (mc->shared ? 1 : 0);
    m->w = calloc(m->n_w, sizeof *m->w);
    m->hw = calloc(m->n_w, sizeof *m->hw);
    cr_assert(m->x && m->router && m->bias && m->w && m->hw);
    fill_dyadic(m->x, T * D, 64, 64.0f, seed);
    fill_dyadic(m->router, E * D, 16, 64.0f, seed + 1);
    fill_dyadic(m->bias, E, 16, 8.0f, seed + 2);
    for (size_t e = 0; e < m->n_w; ++e) {
        test_weights_make(&m->w[e], &m->c.expert, CLFFN_LAYOUT_OUT_IN, seed + 10 * (e + 1));
        m->hw[e] = m->w[e].host;
    }
}

static void data_free(moe_data *m) {
    for (size_t e = 0; e < m->n_w; ++e) { test_weights_free(&m->w[e]); }
    free(m->w);
    free(m->hw);
    free(m->x);
    free(m->router);
    free(m->bias);
}

/* A layer with m's weights, uploaded. */
static clffn_moe *moe_make(clffn_context *ctx, const moe_data *m) {
    clffn_moe *moe = NULL;
    ASSERT_OK(clffn_moe_create(ctx, &m->c, &moe));
    ASSERT_OK(clffn_moe_upload_router(moe, m->router, m->c.router_bias ? m->bias : NULL));
    for (size_t e = 0; e < m->n_w; ++e) {
        ASSERT_OK(
            clffn_ffn_upload_weights(clffn_moe_expert(moe, e), CLFFN_LAYOUT_OUT_IN, &m->hw[e]));
    }
    return moe;
}

/* Runs m's tokens and checks y, the choice and the weights against the reference. */
static void check_against_reference(clffn_moe *moe, const moe_data *m, size_t T, const char *what) {
    const size_t D = m->c.expert.d_model, k = m->c.top_k;
    float *y = malloc(T * D * sizeof *y), *wt = malloc(T * k * sizeof *wt);
    double *ref = malloc(T * D * sizeof *ref), *rwt = malloc(T * k * sizeof *rwt);
    int32_t *ch = malloc(T * k * sizeof *ch), *rch = malloc(T * k * sizeof *rch);
    cr_assert(y && wt && ref && rwt && ch && rch);
    ASSERT_OK(clffn_moe_forward_host(moe, T, m->x, T * D, y, T * D, ch, wt));
    ASSERT_OK(clffn_moe_reference_forward(&m->c, CLFFN_LAYOUT_OUT_IN, m->router,
                                          m->c.router_bias ? m->bias : NULL, m->hw, T, m->x, ref,
                                          rch, rwt));
    for (size_t i = 0; i < T * k; ++i) {
        cr_assert(ch[i] == rch[i], "%s: token %zu's choice %zu is expert %d, the reference's %d",
                  what, i / k, i % k, (int)ch[i], (int)rch[i]);
        cr_assert(fabs(wt[i] - rwt[i]) <= 1e-6 * fabs(rwt[i]) + 1e-7,
                  "%s: token %zu's weight %zu is %.9g, the reference's %.9g", what, i / k, i % k,
                  (double)wt[i], rwt[i]);
    }
    assert_close(y, ref, T * D, TOL_RTOL, what);
    assert_mostly_nonzero(ref, T * D, 0.9, what);
    free(y), free(wt), free(ref), free(rwt), free(ch), free(rch);
}

static const moe_case cases[] = {
    {1, 8, 2, CLFFN_ROUTING_TOPK_NORMALIZED, 0, 0, 1, CLFFN_ACT_SILU},
    {7, 4, 1, CLFFN_ROUTING_TOPK, 0, 1, 0, CLFFN_ACT_RELU},
    {33, 16, 4, CLFFN_ROUTING_TOPK_NORMALIZED, 1, 1, 1, CLFFN_ACT_GELU},
    {200, 3, 3, CLFFN_ROUTING_TOPK, 1, 0, 0, CLFFN_ACT_GELU_TANH},
    {64, 1, 1, CLFFN_ROUTING_TOPK_NORMALIZED, 0, 1, 1, CLFFN_ACT_SIGMOID},
    {100, 16, 16, CLFFN_ROUTING_TOPK_NORMALIZED, 0, 0, 0, CLFFN_ACT_IDENTITY},
    {2, 5, 2, CLFFN_ROUTING_TOPK, 1, 1, 1, CLFFN_ACT_SILU},
};

Test(moe, forward_matches_the_double_reference, .timeout = 300) {
    clffn_context *ctx = test_context();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        const moe_case *mc = &cases[i];
        moe_data m;
        data_make(&m, mc, 64, 96, 100 + i);
        clffn_moe *moe = moe_make(ctx, &m);
        char what[96];
        snprintf(what, sizeof what, "T %zu, E %zu, k %zu, %s%s", mc->tokens, mc->experts, mc->k,
                 mc->routing == CLFFN_ROUTING_TOPK ? "top-k" : "normalised",
                 mc->shared ? ", shared expert" : "");
        check_against_reference(moe, &m, mc->tokens, what);
        /* fewer tokens on the same layer: the grown workspace serves a smaller pass */
        check_against_reference(moe, &m, 1 + mc->tokens / 3, what);
        clffn_moe_destroy(moe);
        data_free(&m);
    }
    clffn_context_destroy(ctx);
}

/* All logits equal (a zero router): every token takes experts 0..k-1, in that order, each with
 * weight 1/k (normalised) or 1/E (top-k as it is). */
Test(moe, ties_go_to_the_lower_index) {
    clffn_context *ctx = test_context();
    for (int mode = 0; mode < 2; ++mode) {
        const moe_case mc = {5, 6, 3, (clffn_routing)mode, 0, 0, 1, CLFFN_ACT_SILU};
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

/* A router bias far above the logits sends every token to the same experts: those run on
 * every token, the others not at all (no forward: NO_FORWARD from read_hidden), and y is the
 * reference's. */
Test(moe, experts_no_token_chose_are_not_run, .timeout = 120) {
    clffn_context *ctx = test_context();
    for (size_t k = 1; k <= 2; ++k) {
        const moe_case mc = {40, 8, k, CLFFN_ROUTING_TOPK_NORMALIZED, 0, 1, 1, CLFFN_ACT_SILU};
        moe_data m;
        data_make(&m, &mc, 32, 64, 11);
        m.bias[5] = 64.0f, m.bias[2] = 48.0f; /* logits stay within ±8 */
        clffn_moe *moe = moe_make(ctx, &m);
        check_against_reference(moe, &m, 40, k == 1 ? "every token to expert 5" : "to 5 and 2");
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
    const moe_case mc = {4, 6, 2, CLFFN_ROUTING_TOPK_NORMALIZED, 0, 0, 1, CLFFN_ACT_SILU};
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
