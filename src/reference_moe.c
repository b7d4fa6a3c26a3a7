/* A mixture-of-experts layer in plain C with double accumulation: the independent reference
 * for the MoE tests. Routing from the definition in clffn.h, each expert through
 * clffn_reference_forward(); nothing shared with the device path. Shapes: x, y [T, D],
 * router [E, D], chosen and weights [T, k]. */
#include "reference_moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

clffn_status clffn__moe_config_check(const clffn_moe_config *c) {
    if (!c) { return CLFFN_ERROR_NULL_ARGUMENT; }
    const clffn_status st = clffn_config_validate(&c->expert);
    if (st != CLFFN_SUCCESS) { return st; }
    /* E beyond 2^24 would leave the kernels' uint indices and float counts inexact */
    if (c->experts == 0 || c->experts > (1u << 24) || c->top_k == 0 || c->top_k > c->experts ||
        (c->routing != CLFFN_ROUTING_TOPK_NORMALIZED && c->routing != CLFFN_ROUTING_TOPK) ||
        c->expert.residual) {
        return CLFFN_ERROR_INVALID_ARGUMENT;
    }
    return CLFFN_SUCCESS;
}

/* Token t's choice: chosen[0..k) in the order (logit descending, index ascending; a NaN logit
 * as -inf), and their weights from the softmax over all E logits. */
static double rank(double l) { return isnan(l) ? -INFINITY : l; }

static void route_token(const clffn_moe_config *c, const double *logit, int32_t *chosen,
                        double *weights) {
    const size_t E = c->experts, k = c->top_k;
    double mx = -INFINITY, sum = 0.0, picked = 0.0;
    for (size_t e = 0; e < E; ++e) { mx = fmax(mx, logit[e]); }
    for (size_t e = 0; e < E; ++e) { sum += exp(logit[e] - mx); }
    for (size_t j = 0; j < k; ++j) {
        size_t best = E;
        for (size_t e = 0; e < E; ++e) {
            int taken = 0;
            for (size_t i = 0; i < j; ++i) { taken |= chosen[i] == (int32_t)e; }
            if (!taken && (best == E || rank(logit[e]) > rank(logit[best]))) { best = e; }
        }
        chosen[j] = (int32_t)best;
        weights[j] = exp(logit[best] - mx) / sum;
        picked += weights[j];
    }
    if (c->routing == CLFFN_ROUTING_TOPK_NORMALIZED) {
        for (size_t j = 0; j < k; ++j) { weights[j] /= picked; }
    }
}

/* out[t] += w[t]·expert(x[t]) for the tokens t with use[t] != 0, through the FFN reference on
 * those tokens gathered. */
static clffn_status add_expert(const clffn_config *c, clffn_layout layout,
                               const clffn_host_weights *w, size_t tokens, const float *x,
                               const double *use, double *out) {
    const size_t D = c->d_model;
    size_t n = 0;
    for (size_t t = 0; t < tokens; ++t) { n += use[t] != 0.0; }
    if (n == 0) { return CLFFN_SUCCESS; }
    float *xg = malloc(n * D * sizeof *xg);
    double *yg = malloc(n * D * sizeof *yg);
    clffn_status st = CLFFN_ERROR_OUT_OF_HOST_MEMORY;
    if (xg && yg) {
        for (size_t t = 0, i = 0; t < tokens; ++t) {
            if (use[t] != 0.0) { memcpy(xg + i++ * D, x + t * D, D * sizeof *xg); }
        }
        st = clffn_reference_forward(c, layout, w, n, xg, 0, 0, 0, yg, NULL);
        for (size_t t = 0, i = 0; st == CLFFN_SUCCESS && t < tokens; ++t) {
            if (use[t] == 0.0) { continue; }
            for (size_t d = 0; d < D; ++d) { out[t * D + d] += use[t] * yg[i * D + d]; }
            ++i;
        }
    }
    free(xg);
    free(yg);
    return st;
}

clffn_status clffn_moe_reference_forward(const clffn_moe_config *c, clffn_layout layout,
                                         const float *router, const float *router_bias,
                                         const clffn_host_weights *experts, size_t tokens,
                                         const float *x, double *y, int32_t *chosen,
                                         double *weights) {
    clffn_status st = clffn__moe_config_check(c);
    if (st != CLFFN_SUCCESS) { return st; }
    if (!router || !experts || (c->router_bias && !router_bias) || (tokens && (!x || !y))) {
        return CLFFN_ERROR_NULL_ARGUMENT;
    }
    const size_t D = c->expert.d_model, E = c->experts, k = c->top_k;
    size_t n;
    if (!clffn__mul_ok(tokens, D > E * k ? D : E * k, &n) || !clffn__mul_ok(n, 8, &n)) {
        return CLFFN_ERROR_SIZE_OVERFLOW;
    }
    double *logit = malloc(E * sizeof *logit), *use = malloc((tokens + 1) * sizeof *use);
    int32_t *ch = malloc((tokens * k + 1) * sizeof *ch);
    double *wt = malloc((tokens * k + 1) * sizeof *wt);
    st = logit && use && ch && wt ? CLFFN_SUCCESS : CLFFN_ERROR_OUT_OF_HOST_MEMORY;
    for (size_t t = 0; st == CLFFN_SUCCESS && t < tokens; ++t) {
        for (size_t e = 0; e < E; ++e) {
            double acc = c->router_bias ? router_bias[e] : 0.0;
            for (size_t d = 0; d < D; ++d) { acc += (double)x[t * D + d] * router[e * D + d]; }
            logit[e] = acc;
        }
        route_token(c, logit, ch + t * k, wt + t * k);
    }
    if (st == CLFFN_SUCCESS && tokens) { memset(y, 0, tokens * D * sizeof *y); }
    /* the device's order: the shared expert first, then each token's choices best first */
    if (st == CLFFN_SUCCESS && c->shared_expert) {
        for (size_t t = 0; t < tokens; ++t) { use[t] = 1.0; }
        st = add_expert(&c->expert, layout, &experts[E], tokens, x, use, y);
    }
    for (size_t j = 0; j < k && st == CLFFN_SUCCESS; ++j) {
        for (size_t e = 0; e < E && st == CLFFN_SUCCESS; ++e) {
            for (size_t t = 0; t < tokens; ++t) {
                use[t] = ch[t * k + j] == (int32_t)e ? wt[t * k + j] : 0.0;
            }
            st = add_expert(&c->expert, layout, &experts[e], tokens, x, use, y);
        }
    }
    if (st == CLFFN_SUCCESS && chosen && tokens) { memcpy(chosen, ch, tokens * k * sizeof *ch); }
    if (st == CLFFN_SUCCESS && weights && tokens) { memcpy(weights, wt, tokens * k * sizeof *wt); }
    free(logit);
    free(use);
    free(ch);
    free(wt);
    return st;
}
