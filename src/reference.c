/* The FFN in plain C with double accumulation: the independent reference for the tests and for
 * the tools' --verify. Slow on purpose: no blocking, no vectors, nothing shared with the device
 * path but the definition of the dropout mask. */
#include "internal.h"

#include <math.h>
#include <stdlib.h>

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

/* W[o, i] of an out×in weight in either layout. */
static double weight(const float *w, clffn_layout layout, size_t out, size_t in, size_t o,
                     size_t i) {
    return layout == CLFFN_LAYOUT_OUT_IN ? (double)w[o * in + i] : (double)w[i * out + o];
}

clffn_status clffn_reference_forward(const clffn_config *c, clffn_layout layout,
                                     const clffn_host_weights *w, size_t tokens, const float *x,
                                     int training, uint64_t seed, uint64_t offset, double *y,
                                     double *hidden) {
    if (!c || !w) { return CLFFN_ERROR_NULL_ARGUMENT; }
    clffn_status st = clffn_config_validate(c);
    if (st != CLFFN_SUCCESS) { return st; }
    if (layout != CLFFN_LAYOUT_OUT_IN && layout != CLFFN_LAYOUT_IN_OUT) {
        return CLFFN_ERROR_INVALID_LAYOUT;
    }
    if (tokens == 0) { return CLFFN_SUCCESS; }
    if (!x || !y || !w->w1 || !w->w2 || (c->bias1 && !w->b1) || (c->bias2 && !w->b2) ||
        (c->gated && (!w->v || (c->bias_gate && !w->bv)))) {
        return CLFFN_ERROR_NULL_ARGUMENT;
    }
    const size_t D = c->d_model, F = c->d_ff;
    size_t n;
    if (!clffn__mul_ok(tokens, F, &n) || !clffn__mul_ok(tokens, D, &n)) {
        return CLFFN_ERROR_SIZE_OVERFLOW;
    }
    double *h = malloc(F * sizeof *h);
    if (!h) { return CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
    const int drop = training && c->dropout > 0.0f;
    const double scale = (double)clffn__drop_scale(c->dropout);

    for (size_t t = 0; t < tokens; ++t) {
        const float *xt = x + t * D;
        /* hidden: act(x·W1 + b1) [⊙ (x·V + bv)], then dropout */
        for (size_t j = 0; j < F; ++j) {
            double a = c->bias1 ? (double)w->b1[j] : 0.0;
            for (size_t i = 0; i < D; ++i) { a += (double)xt[i] * weight(w->w1, layout, F, D, j, i); }
            double v = activate(c->activation, a);
            if (c->gated) {
                double g = c->bias_gate ? (double)w->bv[j] : 0.0;
                for (size_t i = 0; i < D; ++i) { g += (double)xt[i] * weight(w->v, layout, F, D, j, i); }
                v *= g;
            }
            if (drop) {
                v = clffn_dropout_keep(c->dropout, seed, offset, (uint64_t)t * F + j) ? v * scale
                                                                                      : 0.0;
            }
            h[j] = v;
            if (hidden) { hidden[t * F + j] = v; }
        }
        /* output: h·W2 + b2 (+ x) */
        for (size_t o = 0; o < D; ++o) {
            double s = c->bias2 ? (double)w->b2[o] : 0.0;
            for (size_t j = 0; j < F; ++j) { s += h[j] * weight(w->w2, layout, D, F, o, j); }
            if (c->residual) { s += (double)xt[o]; }
            y[t * D + o] = s;
        }
    }
    free(h);
    return CLFFN_SUCCESS;
}
