/* The FFN in plain C with double accumulation, forward and backward side by side: the
 * independent reference for the tests and for the tools' --verify. Slow on purpose: no blocking,
 * no vectors, nothing shared with the device path but the definition of the dropout mask.
 *
 * The core works on double parameters so the finite-difference tests can perturb them by 1e-6;
 * the public calls convert float weights once. Shapes as in clffn.h: x, y, dx [T, D];
 * W1, V [F, D] or [D, F]; W2 [D, F] or [F, D]; hidden [T, F]. */
#include "reference.h"

#include "philox.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double activate(clffn_activation a, double x) {
    switch (a) {
    case CLFFN_ACT_RELU: return x < 0.0 ? 0.0 : x; /* NaN passes through */
    case CLFFN_ACT_GELU: return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case CLFFN_ACT_GELU_TANH: {
        const double k = sqrt(2.0 / 3.14159265358979323846);
        return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
    }
    case CLFFN_ACT_SILU: return x / (1.0 + exp(-x));
    case CLFFN_ACT_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case CLFFN_ACT_IDENTITY:
    default: return x;
    }
}

/* d act / dx, written out from the definitions above. */
static double activate_grad(clffn_activation a, double x) {
    switch (a) {
    case CLFFN_ACT_RELU: return x > 0.0 ? 1.0 : 0.0;
    case CLFFN_ACT_GELU:
        return 0.5 * (1.0 + erf(x / sqrt(2.0))) +
               x * exp(-0.5 * x * x) / sqrt(2.0 * 3.14159265358979323846);
    case CLFFN_ACT_GELU_TANH: {
        const double k = sqrt(2.0 / 3.14159265358979323846), c = 0.044715;
        const double t = tanh(k * (x + c * x * x * x));
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * c * x * x);
    }
    case CLFFN_ACT_SILU: {
        const double s = 1.0 / (1.0 + exp(-x));
        return s * (1.0 + x * (1.0 - s));
    }
    case CLFFN_ACT_SIGMOID: {
        const double s = 1.0 / (1.0 + exp(-x));
        return s * (1.0 - s);
    }
    case CLFFN_ACT_IDENTITY:
    default: return 1.0;
    }
}

/* The uses of an out×in weight W, each in either layout. The loops follow the layout, so W is
 * read along its rows, but each sum adds the same terms in the same order in both: over i
 * (acc[o] += Σ v[i]·W[o, i]; Wᵀ's product is the same with the other layout, see flip()), or one
 * term per element (W[o, i] += u[o]·v[i]). Read down its columns, the [in, out] layout's
 * reference took 8x as long at the seed shape (the cache line of each step thrown away). */
static void add_times(clffn_layout layout, size_t out, size_t in, const double *w, const double *v,
                      double *acc) {
    if (layout == CLFFN_LAYOUT_OUT_IN) {
        for (size_t o = 0; o < out; ++o) {
            double s = acc[o];
            for (size_t i = 0; i < in; ++i) { s += v[i] * w[o * in + i]; }
            acc[o] = s;
        }
        return;
    }
    for (size_t i = 0; i < in; ++i) {
        for (size_t o = 0; o < out; ++o) { acc[o] += v[i] * w[i * out + o]; }
    }
}

/* The other layout: the same bytes read as Wᵀ, an in×out weight. */
static clffn_layout flip(clffn_layout layout) {
    return layout == CLFFN_LAYOUT_OUT_IN ? CLFFN_LAYOUT_IN_OUT : CLFFN_LAYOUT_OUT_IN;
}

static void add_outer(clffn_layout layout, size_t out, size_t in, double *w, const double *u,
                      const double *v) {
    if (layout == CLFFN_LAYOUT_OUT_IN) {
        for (size_t o = 0; o < out; ++o) {
            for (size_t i = 0; i < in; ++i) { w[o * in + i] += u[o] * v[i]; }
        }
        return;
    }
    for (size_t i = 0; i < in; ++i) {
        for (size_t o = 0; o < out; ++o) { w[i * out + o] += u[o] * v[i]; }
    }
}

static clffn_status check_common(const clffn_config *c, clffn_layout layout, size_t tokens) {
    if (!c) { return CLFFN_ERROR_NULL_ARGUMENT; }
    clffn_status st = clffn_config_validate(c);
    if (st != CLFFN_SUCCESS) { return st; }
    if (layout != CLFFN_LAYOUT_OUT_IN && layout != CLFFN_LAYOUT_IN_OUT) {
        return CLFFN_ERROR_INVALID_LAYOUT;
    }
    size_t n;
    if (!clffn__mul_ok(tokens, c->d_ff, &n) || !clffn__mul_ok(tokens, c->d_model, &n)) {
        return CLFFN_ERROR_SIZE_OVERFLOW;
    }
    return CLFFN_SUCCESS;
}

/* The hidden row of token t: pre-activations a (with b1), gate g (with bv), and h (after the
 * activation, the gate and dropout). */
static void hidden_row(const clffn_config *c, clffn_layout layout, const clffn_ref_params *p,
                       const double *xt, size_t t, int drop, double scale, uint64_t seed,
                       uint64_t offset, double *a, double *g, double *h) {
    const size_t D = c->d_model, F = c->d_ff;
    for (size_t j = 0; j < F; ++j) {
        a[j] = c->bias1 ? p->b1[j] : 0.0;
        if (c->gated) { g[j] = c->bias_gate ? p->bv[j] : 0.0; }
    }
    add_times(layout, F, D, p->w1, xt, a);
    if (c->gated) { add_times(layout, F, D, p->v, xt, g); }
    for (size_t j = 0; j < F; ++j) {
        double v = activate(c->activation, a[j]);
        if (c->gated) { v *= g[j]; }
        if (drop) {
            /* times 0, not set to 0: NaN and Inf stay NaN, as in PyTorch's input * mask */
            v *= clffn_dropout_keep(c->dropout, seed, offset, (uint64_t)t * F + j) ? scale : 0.0;
        }
        h[j] = v;
    }
}

static int params_ok(const clffn_config *c, const clffn_ref_params *p) {
    return p && p->w1 && p->w2 && (!c->bias1 || p->b1) && (!c->bias2 || p->b2) &&
           (!c->gated || (p->v && (!c->bias_gate || p->bv)));
}

clffn_status clffn__ref_forward_d(const clffn_config *c, clffn_layout layout,
                                  const clffn_ref_params *p, size_t tokens, const double *x,
                                  int training, uint64_t seed, uint64_t offset, double *y,
                                  double *hidden) {
    clffn_status st = check_common(c, layout, tokens);
    if (st != CLFFN_SUCCESS || tokens == 0) { return st; }
    if (!x || !y || !params_ok(c, p)) { return CLFFN_ERROR_NULL_ARGUMENT; }
    const size_t D = c->d_model, F = c->d_ff;
    double *buf = malloc(3 * F * sizeof *buf);
    if (!buf) { return CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
    double *a = buf, *g = buf + F, *h = buf + 2 * F;
    const int drop = training && c->dropout > 0.0f;
    const double scale = (double)clffn__drop_scale(c->dropout);
    for (size_t t = 0; t < tokens; ++t) {
        const double *xt = x + t * D;
        hidden_row(c, layout, p, xt, t, drop, scale, seed, offset, a, g, h);
        if (hidden) { memcpy(hidden + t * F, h, F * sizeof *h); }
        double *yt = y + t * D; /* output: h·W2 + b2 (+ x) */
        for (size_t o = 0; o < D; ++o) { yt[o] = c->bias2 ? p->b2[o] : 0.0; }
        add_times(layout, D, F, p->w2, h, yt);
        if (c->residual) {
            for (size_t o = 0; o < D; ++o) { yt[o] += xt[o]; }
        }
    }
    free(buf);
    return CLFFN_SUCCESS;
}

/* dx = da·W1 [+ dg·V] (+ dy) of one token, W1's and V's terms taken in turn for each j. */
static void dx_row(const clffn_config *c, clffn_layout layout, const clffn_ref_params *p,
                   const double *dyt, const double *da, const double *dg, double *dxt) {
    const size_t D = c->d_model, F = c->d_ff;
    for (size_t i = 0; i < D; ++i) { dxt[i] = c->residual ? dyt[i] : 0.0; }
    if (!c->gated) {
        add_times(flip(layout), D, F, p->w1, da, dxt); /* dx += da·W1 */
    } else if (layout == CLFFN_LAYOUT_OUT_IN) {
        for (size_t j = 0; j < F; ++j) {
            for (size_t i = 0; i < D; ++i) {
                dxt[i] += da[j] * p->w1[j * D + i];
                dxt[i] += dg[j] * p->v[j * D + i];
            }
        }
    } else {
        for (size_t i = 0; i < D; ++i) {
            double s = dxt[i];
            for (size_t j = 0; j < F; ++j) {
                s += da[j] * p->w1[i * F + j];
                s += dg[j] * p->v[i * F + j];
            }
            dxt[i] = s;
        }
    }
}

clffn_status clffn__ref_backward_d(const clffn_config *c, clffn_layout layout,
                                   const clffn_ref_params *p, size_t tokens, const double *x,
                                   const double *dy, int training, uint64_t seed, uint64_t offset,
                                   double *dx, const clffn_ref_grads *gr) {
    clffn_status st = check_common(c, layout, tokens);
    if (st != CLFFN_SUCCESS) { return st; }
    if (!gr || !gr->w1 || !gr->w2 || (c->bias1 && !gr->b1) || (c->bias2 && !gr->b2) ||
        (c->gated && (!gr->v || (c->bias_gate && !gr->bv))) || !params_ok(c, p)) {
        return CLFFN_ERROR_NULL_ARGUMENT;
    }
    const size_t D = c->d_model, F = c->d_ff;
    if (tokens && (!x || !dy)) { return CLFFN_ERROR_NULL_ARGUMENT; }
    /* taken before the gradients are touched, so a failure leaves them as they were */
    double *buf = malloc(4 * F * sizeof *buf);
    if (!buf) { return CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
    /* gradients are sums over tokens: start from zero */
    memset(gr->w1, 0, D * F * sizeof *gr->w1);
    memset(gr->w2, 0, D * F * sizeof *gr->w2);
    if (c->bias1) { memset(gr->b1, 0, F * sizeof *gr->b1); }
    if (c->bias2) { memset(gr->b2, 0, D * sizeof *gr->b2); }
    if (c->gated) {
        memset(gr->v, 0, D * F * sizeof *gr->v);
        if (c->bias_gate) { memset(gr->bv, 0, F * sizeof *gr->bv); }
    }
    double *a = buf, *g = buf + F, *h = buf + 2 * F, *dh = buf + 3 * F;
    const int drop = training && c->dropout > 0.0f;
    const double scale = (double)clffn__drop_scale(c->dropout);
    for (size_t t = 0; t < tokens; ++t) {
        const double *xt = x + t * D, *dyt = dy + t * D;
        hidden_row(c, layout, p, xt, t, drop, scale, seed, offset, a, g, h);
        /* y = h·W2 + b2 (+ x): dW2 += dyᵀh, db2 += dy, dh = dy·W2 */
        if (c->bias2) {
            for (size_t o = 0; o < D; ++o) { gr->b2[o] += dyt[o]; }
        }
        add_outer(layout, D, F, gr->w2, dyt, h);
        memset(dh, 0, F * sizeof *dh);
        add_times(flip(layout), F, D, p->w2, dyt, dh); /* dh = dy·W2 */
        for (size_t j = 0; j < F; ++j) {
            /* dropout: the same mask, the same scale */
            if (drop) {
                dh[j] *=
                    clffn_dropout_keep(c->dropout, seed, offset, (uint64_t)t * F + j) ? scale : 0.0;
            }
            /* h = act(a) [· g]: da = dh · act'(a) [· g], dg = dh · act(a); da and dg take dh's
             * and h's places, which nothing reads after this */
            const double da = dh[j] * activate_grad(c->activation, a[j]) * (c->gated ? g[j] : 1.0);
            const double dg = c->gated ? dh[j] * activate(c->activation, a[j]) : 0.0;
            if (c->bias1) { gr->b1[j] += da; }
            if (c->gated && c->bias_gate) { gr->bv[j] += dg; }
            dh[j] = da;
            h[j] = dg;
        }
        add_outer(layout, F, D, gr->w1, dh, xt);
        if (c->gated) { add_outer(layout, F, D, gr->v, h, xt); }
        if (dx) { dx_row(c, layout, p, dyt, dh, h, dx + t * D); }
    }
    free(buf);
    return CLFFN_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* The public float-input calls: weights and inputs widened once, then the double core */

typedef struct widened {
    double *block;
    clffn_ref_params p;
} widened;

static double *widen(const float *src, size_t n, double **cursor) {
    if (!src) { return NULL; }
    double *d = *cursor;
    for (size_t i = 0; i < n; ++i) { d[i] = (double)src[i]; }
    *cursor += n;
    return d;
}

static clffn_status widen_all(const clffn_config *c, const clffn_host_weights *w, size_t tokens,
                              const float *x, const float *dy, widened *out, double **xd,
                              double **dyd) {
    const size_t D = c->d_model, F = c->d_ff;
    const size_t total = 3 * D * F + 3 * F + D + (x ? tokens * D : 0) + (dy ? tokens * D : 0);
    out->block = malloc((total ? total : 1) * sizeof(double));
    if (!out->block) { return CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
    double *cur = out->block;
    out->p.w1 = widen(w->w1, D * F, &cur);
    out->p.b1 = c->bias1 ? widen(w->b1, F, &cur) : NULL;
    out->p.v = c->gated ? widen(w->v, D * F, &cur) : NULL;
    out->p.bv = c->gated && c->bias_gate ? widen(w->bv, F, &cur) : NULL;
    out->p.w2 = widen(w->w2, D * F, &cur);
    out->p.b2 = c->bias2 ? widen(w->b2, D, &cur) : NULL;
    *xd = x ? widen(x, tokens * D, &cur) : NULL;
    if (dyd) { *dyd = dy ? widen(dy, tokens * D, &cur) : NULL; }
    return CLFFN_SUCCESS;
}

clffn_status clffn_reference_forward(const clffn_config *c, clffn_layout layout,
                                     const clffn_host_weights *w, size_t tokens, const float *x,
                                     int training, uint64_t seed, uint64_t offset, double *y,
                                     double *hidden) {
    if (!c || !w) { return CLFFN_ERROR_NULL_ARGUMENT; }
    clffn_status st = check_common(c, layout, tokens);
    if (st != CLFFN_SUCCESS || tokens == 0) { return st; }
    if (!x || !y || !w->w1 || !w->w2 || (c->bias1 && !w->b1) || (c->bias2 && !w->b2) ||
        (c->gated && (!w->v || (c->bias_gate && !w->bv)))) {
        return CLFFN_ERROR_NULL_ARGUMENT;
    }
    widened wd;
    double *xd = NULL;
    if ((st = widen_all(c, w, tokens, x, NULL, &wd, &xd, NULL)) != CLFFN_SUCCESS) { return st; }
    st = clffn__ref_forward_d(c, layout, &wd.p, tokens, xd, training, seed, offset, y, hidden);
    free(wd.block);
    return st;
}

clffn_status clffn_reference_backward(const clffn_config *c, clffn_layout layout,
                                      const clffn_host_weights *w, size_t tokens, const float *x,
                                      const float *dy, int training, uint64_t seed, uint64_t offset,
                                      double *dx, const clffn_ref_grads *grads) {
    if (!c || !w || !grads) { return CLFFN_ERROR_NULL_ARGUMENT; }
    clffn_status st = check_common(c, layout, tokens);
    if (st != CLFFN_SUCCESS) { return st; }
    if ((tokens && (!x || !dy)) || !w->w1 || !w->w2 || (c->bias1 && !w->b1) ||
        (c->bias2 && !w->b2) || (c->gated && (!w->v || (c->bias_gate && !w->bv)))) {
        return CLFFN_ERROR_NULL_ARGUMENT;
    }
    widened wd;
    double *xd = NULL, *dyd = NULL;
    if ((st = widen_all(c, w, tokens, x, dy, &wd, &xd, &dyd)) != CLFFN_SUCCESS) { return st; }
    st =
        clffn__ref_backward_d(c, layout, &wd.p, tokens, xd, dyd, training, seed, offset, dx, grads);
    free(wd.block);
    return st;
}
