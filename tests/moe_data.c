/* The mixture-of-experts suites' cases and layers: moe_data.h. */
#include "moe_data.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

void data_make(moe_data *m, const moe_case *mc, size_t D, size_t F, uint64_t seed) {
    memset(m, 0, sizeof *m);
    m->c = clffn_moe_config_default(D, F, mc->experts, mc->k);
    m->c.expert.activation = mc->act;
    m->c.expert.gated = mc->gated;
    m->c.expert.bias1 = m->c.expert.bias2 = m->c.expert.bias_gate = !mc->gated;
    m->c.routing = mc->routing;
    m->c.shared_expert = mc->shared;
    m->c.router_bias = mc->router_bias;
    m->c.shared_gate = mc->shared_gate;
    m->c.shared_d_ff = mc->shared_d_ff;
    const size_t T = mc->tokens, E = mc->experts + (mc->shared_gate ? 1 : 0); /* the rows */
    m->x = malloc((T * D + 1) * sizeof *m->x);
    m->router = malloc(E * D * sizeof *m->router);
    m->bias = malloc(E * sizeof *m->bias);
    m->n_w = mc->experts + (mc->shared ? 1 : 0);
    m->w = calloc(m->n_w, sizeof *m->w);
    m->hw = calloc(m->n_w, sizeof *m->hw);
    cr_assert(m->x && m->router && m->bias && m->w && m->hw);
    fill_dyadic(m->x, T * D, 64, 64.0f, seed);
    fill_dyadic(m->router, E * D, 16, 64.0f, seed + 1);
    fill_dyadic(m->bias, E, 16, 8.0f, seed + 2);
    clffn_config sc = m->c.expert;
    if (mc->shared_d_ff) { sc.d_ff = mc->shared_d_ff; }
    for (size_t e = 0; e < m->n_w; ++e) {
        test_weights_make(&m->w[e], e < mc->experts ? &m->c.expert : &sc, CLFFN_LAYOUT_OUT_IN,
                          seed + 10 * (e + 1));
        m->hw[e] = m->w[e].host;
    }
}

clffn_config expert_config(const moe_data *m, size_t e) {
    clffn_config c = m->c.expert;
    if (e == m->c.experts && m->c.shared_d_ff) { c.d_ff = m->c.shared_d_ff; }
    return c;
}

void data_free(moe_data *m) {
    for (size_t e = 0; e < m->n_w; ++e) { test_weights_free(&m->w[e]); }
    free(m->w);
    free(m->hw);
    free(m->x);
    free(m->router);
    free(m->bias);
}

clffn_moe *moe_make(clffn_context *ctx, const moe_data *m) {
    clffn_moe *moe = NULL;
    ASSERT_OK(clffn_moe_create(ctx, &m->c, &moe));
    ASSERT_OK(clffn_moe_upload_router(moe, m->router, m->c.router_bias ? m->bias : NULL));
    for (size_t e = 0; e < m->n_w; ++e) {
        ASSERT_OK(
            clffn_ffn_upload_weights(clffn_moe_expert(moe, e), CLFFN_LAYOUT_OUT_IN, &m->hw[e]));
    }
    return moe;
}

void check_against_reference(clffn_moe *moe, const moe_data *m, size_t T, const char *what) {
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

size_t f32_kernel_max = SIZE_MAX;

void each_case(const moe_case *cs, size_t n, size_t D, size_t F, uint64_t seed, case_check check) {
    clffn_context *ctx = test_context();
    if (f32_kernel_max != SIZE_MAX) {
        ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, 0, f32_kernel_max));
    }
    for (size_t i = 0; i < n; ++i) {
        const moe_case *mc = &cs[i];
        moe_data m;
        data_make(&m, mc, D, F, seed + i);
        clffn_moe *moe = moe_make(ctx, &m);
        char what[96];
        snprintf(what, sizeof what, "T %zu, E %zu, k %zu, %s%s%s", mc->tokens, mc->experts, mc->k,
                 mc->routing == CLFFN_ROUTING_TOPK ? "top-k" : "normalised",
                 mc->shared ? ", shared expert" : "", mc->shared_gate ? " behind a gate" : "");
        check(moe, &m, mc, what);
        clffn_moe_destroy(moe);
        data_free(&m);
    }
    clffn_context_destroy(ctx);
}
