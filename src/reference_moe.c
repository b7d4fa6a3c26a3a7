/* A mixture-of-experts layer in plain C with double accumulation: the independent reference
 * for the MoE tests. Routing from the definition in clffn.h, each expert through
 * clffn_reference_forward(); nothing shared with the device path. Shapes: x, y [T, D],
 * router [E, D], chosen and weights [T, k]. Also the config's defaults and check, which the layer
 * shares with it. */
#include "reference_moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

clffn_moe_config clffn_moe_config_default(size_t d_model, size_t d_ff, size_t experts,
                                          size_t top_k) {
    clffn_moe_config c;
    c.expert = clffn_config_default(d_model, d_ff);
    c.expert.activation = CLFFN_ACT_SILU;
    c.expert.gated = 1;
    c.expert.bias1 = c.expert.bias2 = c.expert.bias_gate = 0;
    c.expert.dropout = 0.0f;
    c.experts = experts;
    c.top_k = top_k;
    c.routing = CLFFN_ROUTING_TOPK_NORMALIZED;
    c.router_bias = 0;
    c.shared_expert = 0;
    c.aux_loss_coef = 0.0f;
    c.shared_d_ff = 0;
    c.shared_gate = 0;
    return c;
}

clffn_status clffn__moe_config_check(const clffn_moe_config *c) {
    if (!c) { return CLFFN_ERROR_NULL_ARGUMENT; }
    const clffn_status st = clffn_config_validate(&c->expert);
    if (st != CLFFN_SUCCESS) { return st; }
    /* E beyond 2^24 would leave the kernels' uint indices and float counts inexact */
    if (c->experts == 0 || c->experts > (1u << 24) || c->top_k == 0 || c->top_k > c->experts ||
        (c->routing != CLFFN_ROUTING_TOPK_NORMALIZED && c->routing != CLFFN_ROUTING_TOPK) ||
        c->expert.residual || !(c->aux_loss_coef >= 0.0f && c->aux_loss_coef <= 1e30f) ||
        (!c->shared_expert && (c->shared_d_ff || c->shared_gate))) {
        return CLFFN_ERROR_INVALID_ARGUMENT;
    }
    if (c->shared_expert) {
        const clffn_config sc = clffn__moe_shared_config(c);
        return clffn_config_validate(&sc);
    }
    return CLFFN_SUCCESS;
}

clffn_config clffn__moe_shared_config(const clffn_moe_config *c) {
    clffn_config sc = c->expert;
    if (c->shared_d_ff) { sc.d_ff = c->shared_d_ff; }
    return sc;
}

/* Token t's choice: chosen[0..k) in the order (logit descending, index ascending; a NaN logit
 * as -inf), and their weights from the softmax over all E logits. */
static double rank(double l) { return isnan(l) ? -INFINITY : l; }

static void route_token(const clffn_moe_config *c, const double *logit, int32_t *chosen,
                        double *weights, double *probs) {
    const size_t E = c->experts, k = c->top_k;
    double mx = -INFINITY, sum = 0.0, picked = 0.0;
    for (size_t e = 0; e < E; ++e) { mx = fmax(mx, logit[e]); }
    for (size_t e = 0; e < E; ++e) { sum += exp(logit[e] - mx); }
    for (size_t e = 0; e < E; ++e) { probs[e] = exp(logit[e] - mx) / sum; }
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

/* Every token's choice, weights and probabilities, from logits in double; gate [T] (with a
 * shared expert) its scale: 1, or the sigmoid of the router's row E. */
static clffn_status route_all(const clffn_moe_config *c, const float *router,
                              const float *router_bias, size_t tokens, const float *x, int32_t *ch,
                              double *wt, double *probs, double *gate) {
    const size_t D = c->expert.d_model, E = c->experts, k = c->top_k;
    const size_t R = clffn__moe_router_rows(c);
    double *logit = malloc(R * sizeof *logit);
    if (!logit) { return CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
    for (size_t t = 0; t < tokens; ++t) {
        for (size_t e = 0; e < R; ++e) {
            double acc = c->router_bias ? router_bias[e] : 0.0;
            for (size_t d = 0; d < D; ++d) { acc += (double)x[t * D + d] * router[e * D + d]; }
            logit[e] = acc;
        }
        route_token(c, logit, ch + t * k, wt + t * k, probs + t * E);
        if (gate) { gate[t] = R > E ? 1.0 / (1.0 + exp(-logit[E])) : 1.0; }
    }
    free(logit);
    return CLFFN_SUCCESS;
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
    double *use = malloc((tokens + 1) * sizeof *use);
    int32_t *ch = malloc((tokens * k + 1) * sizeof *ch);
    double *wt = malloc((tokens * k + 1) * sizeof *wt), *probs = malloc((tokens * E + 1) * 8);
    st = use && ch && wt && probs ? CLFFN_SUCCESS : CLFFN_ERROR_OUT_OF_HOST_MEMORY;
    if (st == CLFFN_SUCCESS) {
        st = route_all(c, router, router_bias, tokens, x, ch, wt, probs, use);
    }
    if (st == CLFFN_SUCCESS && tokens) { memset(y, 0, tokens * D * sizeof *y); }
    /* the device's order: the shared expert first (use: its gate), then each token's choices
     * best first */
    if (st == CLFFN_SUCCESS && c->shared_expert) {
        const clffn_config sc = clffn__moe_shared_config(c);
        st = add_expert(&sc, layout, &experts[E], tokens, x, use, y);
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
    free(use);
    free(ch);
    free(wt);
    free(probs);
    return st;
}

/* ---- backward ------------------------------------------------------------------------------- */

/* An expert's gradient arrays as a list (w1, b1, v, bv, w2, b2) and their lengths (0 where the
 * config has no such tensor). */
static void grad_fields(const clffn_config *c, const clffn_ref_grads *g, double *f[6],
                        size_t n[6]) {
    const size_t D = c->d_model, F = c->d_ff;
    double *const all[6] = {g->w1, g->b1, g->v, g->bv, g->w2, g->b2};
    const size_t len[6] = {
        F * D, c->bias1 ? F : 0, c->gated ? F * D : 0, c->gated && c->bias_gate ? F : 0,
        D * F, c->bias2 ? D : 0};
    for (int i = 0; i < 6; ++i) { f[i] = len[i] ? all[i] : NULL, n[i] = len[i]; }
}

/* Scratch for one token through one expert: its output and dx [D], and its gradients. */
typedef struct token_scratch {
    double *y, *dx;
    clffn_ref_grads g;
} token_scratch;

/* Token x_t through expert w, backward with dy_t: adds scale·dx to dx_t and scale·(the
 * gradients) to out (NULL: none), and sets *dot = dy_t·expert(x_t). */
static clffn_status token_backward(const clffn_config *c, clffn_layout layout,
                                   const clffn_host_weights *w, const float *xt, const float *dyt,
                                   double scale, double *dxt, const clffn_ref_grads *out,
                                   token_scratch *s, double *dot) {
    clffn_status st = clffn_reference_forward(c, layout, w, 1, xt, 0, 0, 0, s->y, NULL);
    if (st == CLFFN_SUCCESS) {
        st = clffn_reference_backward(c, layout, w, 1, xt, dyt, 0, 0, 0, s->dx, &s->g);
    }
    if (st != CLFFN_SUCCESS) { return st; }
    *dot = 0.0;
    for (size_t d = 0; d < c->d_model; ++d) {
        *dot += (double)dyt[d] * s->y[d];
        if (dxt) { dxt[d] += scale * s->dx[d]; }
    }
    if (out) {
        double *src[6], *dst[6];
        size_t n[6];
        grad_fields(c, &s->g, src, n);
        grad_fields(c, out, dst, n);
        for (int i = 0; i < 6; ++i) {
            for (size_t j = 0; dst[i] && j < n[i]; ++j) { dst[i][j] += scale * src[i][j]; }
        }
    }
    return CLFFN_SUCCESS;
}

/* Token t's router gradient: from g[j] = ∂L/∂weight_j to the logits (dl [R]; dl[E], the shared
 * expert's gate's, given), then into dx_t, the router's weight and bias gradients. */
static void router_backward(const clffn_moe_config *c, const float *router, const float *xt,
                            const int32_t *ch, const double *wt, const double *p, const double *g,
                            const double *aux, double *dl, double *dxt, double *rg, double *rbg) {
    const size_t D = c->expert.d_model, E = c->experts, k = c->top_k;
    const size_t R = clffn__moe_router_rows(c);
    double gw = 0.0, psum = 0.0, pdp = 0.0;
    for (size_t j = 0; j < k; ++j) { gw += g[j] * wt[j], psum += p[ch[j]]; }
    for (size_t e = 0; e < E; ++e) { dl[e] = aux[e]; } /* the auxiliary loss's ∂/∂p */
    for (size_t j = 0; j < k; ++j) {
        dl[ch[j]] += c->routing == CLFFN_ROUTING_TOPK_NORMALIZED ? (g[j] - gw) / psum : g[j];
    }
    for (size_t e = 0; e < E; ++e) { pdp += p[e] * dl[e]; }
    for (size_t e = 0; e < R; ++e) {
        if (e < E) { dl[e] = p[e] * (dl[e] - pdp); }
        for (size_t d = 0; d < D; ++d) {
            if (dxt) { dxt[d] += dl[e] * router[e * D + d]; }
            if (rg) { rg[e * D + d] += dl[e] * xt[d]; }
        }
        if (rbg) { rbg[e] += dl[e]; }
    }
}

/* Zeroes what the backward adds into. */
static void zero_outputs(const clffn_moe_config *c, size_t tokens, double *dx, double *rg,
                         double *rbg, const clffn_ref_grads *eg) {
    const size_t D = c->expert.d_model, E = c->experts, R = clffn__moe_router_rows(c);
    const clffn_config sc = clffn__moe_shared_config(c);
    if (dx) { memset(dx, 0, tokens * D * sizeof *dx); }
    if (rg) { memset(rg, 0, R * D * sizeof *rg); }
    if (rbg) { memset(rbg, 0, R * sizeof *rbg); }
    for (size_t e = 0; eg && e < E + (c->shared_expert ? 1 : 0); ++e) {
        double *f[6];
        size_t n[6];
        grad_fields(e < E ? &c->expert : &sc, &eg[e], f, n);
        for (int i = 0; i < 6; ++i) {
            if (f[i]) { memset(f[i], 0, n[i] * sizeof *f[i]); }
        }
    }
}

clffn_status clffn_moe_reference_backward(const clffn_moe_config *c, clffn_layout layout,
                                          const float *router, const float *router_bias,
                                          const clffn_host_weights *experts, size_t tokens,
                                          const float *x, const float *dy, double *dx,
                                          double *router_grad, double *router_bias_grad,
                                          const clffn_ref_grads *expert_grads) {
    clffn_status st = clffn__moe_config_check(c);
    if (st != CLFFN_SUCCESS) { return st; }
    if (!router || !experts || (c->router_bias && !router_bias) || (tokens && (!x || !dy))) {
        return CLFFN_ERROR_NULL_ARGUMENT;
    }
    const clffn_config sc = clffn__moe_shared_config(c);
    const size_t D = c->expert.d_model, E = c->experts, k = c->top_k;
    const size_t F = sc.d_ff > c->expert.d_ff ? sc.d_ff : c->expert.d_ff; /* the scratch's */
    size_t n;
    if (!clffn__mul_ok(tokens, D > E * k ? D : E * k, &n) || !clffn__mul_ok(n, 8, &n) ||
        !clffn__mul_ok(F, 4 * D + 3, &n)) {
        return CLFFN_ERROR_SIZE_OVERFLOW;
    }
    int32_t *ch = malloc((tokens * k + 1) * sizeof *ch);
    double *wt = malloc((tokens * k + 1) * 8), *p = malloc((tokens * E + 1) * 8);
    double *g = malloc(k * 8), *dl = malloc((E + 1) * 8), *buf = calloc(2 * D + n, 8);
    double *aux = calloc(E, 8), *gate = malloc((tokens + 1) * 8);
    st = ch && wt && p && g && dl && buf && aux && gate ? CLFFN_SUCCESS
                                                        : CLFFN_ERROR_OUT_OF_HOST_MEMORY;
    if (st == CLFFN_SUCCESS) { st = route_all(c, router, router_bias, tokens, x, ch, wt, p, gate); }
    /* the load-balancing loss's ∂/∂p[t, e], the same for every token: α·E·(count_e / T) / T */
    for (size_t i = 0; st == CLFFN_SUCCESS && i < tokens * k; ++i) {
        aux[ch[i]] += (double)c->aux_loss_coef * (double)E / ((double)tokens * (double)tokens);
    }
    /* the scratch gradients, one full set: W1, b1, V, bv, W2, b2 */
    token_scratch s = {buf,
                       buf + D,
                       {buf + 2 * D, buf + 2 * D + F * D, buf + 2 * D + F * D + F,
                        buf + 2 * D + 2 * F * D + F, buf + 2 * D + 2 * F * D + 2 * F,
                        buf + 2 * D + 3 * F * D + 2 * F}};
    if (st == CLFFN_SUCCESS) {
        zero_outputs(c, tokens, dx, router_grad, router_bias_grad, expert_grads);
    }
    for (size_t t = 0; t < tokens && st == CLFFN_SUCCESS; ++t) {
        const float *xt = x + t * D, *dyt = dy + t * D;
        double *dxt = dx ? dx + t * D : NULL, shared_dot = 0.0;
        if (c->shared_expert) {
            st = token_backward(&sc, layout, &experts[E], xt, dyt, gate[t], dxt,
                                expert_grads ? &expert_grads[E] : NULL, &s, &shared_dot);
        }
        /* the gate's logit: ∂L/∂g = dy·shared(x), through the sigmoid's g·(1 − g) */
        dl[E] = gate[t] * (1.0 - gate[t]) * shared_dot;
        for (size_t j = 0; j < k && st == CLFFN_SUCCESS; ++j) {
            const int32_t e = ch[t * k + j];
            st = token_backward(&c->expert, layout, &experts[e], xt, dyt, wt[t * k + j], dxt,
                                expert_grads ? &expert_grads[e] : NULL, &s, &g[j]);
        }
        if (st == CLFFN_SUCCESS) {
            router_backward(c, router, xt, ch + t * k, wt + t * k, p + t * E, g, aux, dl, dxt,
                            router_grad, router_bias_grad);
        }
    }
    free(ch), free(wt), free(p), free(g), free(dl), free(buf), free(aux), free(gate);
    return st;
}

clffn_status clffn_moe_reference_aux_loss(const clffn_moe_config *c, const float *router,
                                          const float *router_bias, size_t tokens, const float *x,
                                          double *loss) {
    clffn_status st = clffn__moe_config_check(c);
    if (st != CLFFN_SUCCESS) { return st; }
    if (!router || !loss || (c->router_bias && !router_bias) || !x || tokens == 0) {
        return CLFFN_ERROR_NULL_ARGUMENT;
    }
    const size_t E = c->experts, k = c->top_k;
    size_t n;
    if (!clffn__mul_ok(tokens, E > k ? E : k, &n) || !clffn__mul_ok(n, 8, &n)) {
        return CLFFN_ERROR_SIZE_OVERFLOW;
    }
    int32_t *ch = malloc(tokens * k * sizeof *ch);
    double *wt = malloc(tokens * k * 8), *p = malloc(tokens * E * 8);
    st = ch && wt && p ? route_all(c, router, router_bias, tokens, x, ch, wt, p, NULL)
                       : CLFFN_ERROR_OUT_OF_HOST_MEMORY;
    if (st == CLFFN_SUCCESS) {
        double sum = 0.0;
        for (size_t e = 0; e < E; ++e) {
            double count = 0.0, pe = 0.0;
            for (size_t i = 0; i < tokens * k; ++i) { count += ch[i] == (int32_t)e; }
            for (size_t t = 0; t < tokens; ++t) { pe += p[t * E + e]; }
            sum += count / (double)tokens * (pe / (double)tokens);
        }
        *loss = (double)E * sum;
    }
    free(ch), free(wt), free(p);
    return st;
}
