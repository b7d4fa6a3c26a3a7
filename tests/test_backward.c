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
                        size_t T, const double *x, const double *dy, int training, const char *what) {
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
        ASSERT_OK(clffn__ref_backward_d(&c, (clffn_layout)layout, &p, T, x, dy, training, 11, 5, dx, &g));
        check_param("W1", w1, 20, gw1, &c, (clffn_layout)layout, &p, T, x, dy, training, what);
        check_param("W2", w2, 20, gw2, &c, (clffn_layout)layout, &p, T, x, dy, training, what);
        check_param("x", x, 12, dx, &c, (clffn_layout)layout, &p, T, x, dy, training, what);
        if (b1) { check_param("b1", bb1, 5, gb1, &c, (clffn_layout)layout, &p, T, x, dy, training, what); }
        if (b2) { check_param("b2", bb2, 4, gb2, &c, (clffn_layout)layout, &p, T, x, dy, training, what); }
        if (gated) {
            check_param("V", v, 20, gv, &c, (clffn_layout)layout, &p, T, x, dy, training, what);
            if (bg) { check_param("bv", bbv, 5, gbv, &c, (clffn_layout)layout, &p, T, x, dy, training, what); }
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
    gradcheck(act, gated, 1, 1, 1, 0, 0);  /* all biases */
    gradcheck(act, gated, 0, 1, 1, 0, 0);  /* each flag off */
    gradcheck(act, gated, 1, 0, 1, 0, 0);
    if (gated) { gradcheck(act, gated, 1, 1, 0, 0, 0); }
    gradcheck(act, gated, 1, 1, 1, 1, 0);  /* dropout in training mode: the same mask */
    gradcheck(act, gated, 1, 1, 1, 0, 1);  /* the residual */
}
