/* Config defaults and validation, activation names, and the weight initialisers. */
#include "common.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

clffn_config clffn_config_default(size_t d_model, size_t d_ff) {
    clffn_config c;
    memset(&c, 0, sizeof c);
    c.d_model = d_model;
    c.d_ff = d_ff;
    c.activation = CLFFN_ACT_RELU;
    c.gated = 0;
    c.bias1 = 1;
    c.bias2 = 1;
    c.bias_gate = 1;
    c.dropout = 0.1f;
    c.residual = 0;
    return c;
}

clffn_status clffn_config_validate(const clffn_config *c) {
    if (!c) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if (c->d_model == 0 || c->d_ff == 0) { return CLFFN_ERROR_INVALID_SIZE; }
    /* the stacked gated weight holds 2·F·D floats, and kernels index with 64-bit arithmetic */
    size_t n;
    if (!clffn__mul_ok(c->d_model, c->d_ff, &n) || !clffn__mul_ok(n, 2 * sizeof(float), &n) ||
        c->d_ff > SIZE_MAX / 2) {
        return CLFFN_ERROR_SIZE_OVERFLOW;
    }
    if (!(c->dropout >= 0.0f && c->dropout <= 1.0f)) { return CLFFN_ERROR_INVALID_DROPOUT; }
    if ((unsigned)c->activation >= (unsigned)CLFFN_ACT_COUNT_) {
        return CLFFN_ERROR_INVALID_ACTIVATION;
    }
    return CLFFN_SUCCESS;
}

static const char *const act_names[CLFFN_ACT_COUNT_] = {"relu", "gelu",    "gelu_tanh",
                                                        "silu", "sigmoid", "identity"};

const char *clffn_activation_name(clffn_activation a) {
    return (unsigned)a < (unsigned)CLFFN_ACT_COUNT_ ? act_names[a] : NULL;
}

static int name_eq(const char *a, const char *b) {
    for (; *a && *b; ++a, ++b) {
        if (tolower((unsigned char)*a) != tolower((unsigned char)*b)) { return 0; }
    }
    return *a == *b;
}

clffn_status clffn_activation_parse(const char *name, clffn_activation *out, int *gated) {
    static const struct {
        const char *name;
        clffn_activation act;
        int gated;
    } table[] = {
        {"relu", CLFFN_ACT_RELU, 0},           {"gelu", CLFFN_ACT_GELU, 0},
        {"gelu_tanh", CLFFN_ACT_GELU_TANH, 0}, {"gelu_new", CLFFN_ACT_GELU_TANH, 0},
        {"silu", CLFFN_ACT_SILU, 0},           {"swish", CLFFN_ACT_SILU, 0},
        {"sigmoid", CLFFN_ACT_SIGMOID, 0},     {"identity", CLFFN_ACT_IDENTITY, 0},
        {"linear", CLFFN_ACT_IDENTITY, 0},     {"glu", CLFFN_ACT_SIGMOID, 1},
        {"reglu", CLFFN_ACT_RELU, 1},          {"geglu", CLFFN_ACT_GELU, 1},
        {"swiglu", CLFFN_ACT_SILU, 1},         {"bilinear", CLFFN_ACT_IDENTITY, 1},
    };
    if (!name || !out) { return CLFFN_ERROR_NULL_ARGUMENT; }
    for (size_t i = 0; i < sizeof table / sizeof table[0]; ++i) {
        if (name_eq(name, table[i].name)) {
            *out = table[i].act;
            if (gated) { *gated = table[i].gated; }
            return CLFFN_SUCCESS;
        }
    }
    return CLFFN_ERROR_INVALID_ACTIVATION;
}

/* ------------------------------------------------------------------------------------------ */
/* Initialisers. Every tensor draws from its own Philox stream (counter word 2 = tensor id), so
 * a tensor's values do not depend on which other tensors are present. */

enum { STREAM_W1 = 1, STREAM_B1, STREAM_V, STREAM_BV, STREAM_W2, STREAM_B2 };

/* Uniforms in [0, 1) with 24 random bits (exact in float): element i is word i & 3 of the
 * Philox block at counter i >> 2 of the tensor's stream. The fills walk whole blocks, one
 * Philox call per four elements (per element, it was most of an FFN's start-up on the host). */
static void philox_block(uint64_t seed, uint32_t stream, uint64_t block, float u[4]) {
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    const uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), stream, 0};
    uint32_t r[4];
    clffn_philox4x32_10(ctr, key, r);
    for (int k = 0; k < 4; ++k) { u[k] = (float)(r[k] >> 8) * (1.0f / 16777216.0f); }
}

static void fill_uniform(float *a, size_t n, float bound, uint64_t seed, uint32_t stream) {
    for (size_t b = 0; b * 4 < n; ++b) {
        float u[4];
        philox_block(seed, stream, b, u);
        for (size_t k = 0; k < 4 && b * 4 + k < n; ++k) {
            a[b * 4 + k] = bound * (2.0f * u[k] - 1.0f);
        }
    }
}

/* Standard normal by Box–Muller on pairs of uniforms (elements 2j, 2j + 1, in one block); u1
 * is moved into (0, 1] so log is finite. */
static void fill_randn(float *a, size_t n, float scale, uint64_t seed, uint32_t stream) {
    const double two_pi = 6.283185307179586476925;
    for (size_t b = 0; b * 4 < n; ++b) {
        float u[4];
        philox_block(seed, stream, b, u);
        for (size_t k = 0; k < 4 && b * 4 + k < n; k += 2) {
            const size_t i = b * 4 + k;
            const double u1 = 1.0 - (double)u[k];
            const double u2 = (double)u[k + 1];
            const double r = sqrt(-2.0 * log(u1));
            a[i] = (float)(scale * r * cos(two_pi * u2));
            if (i + 1 < n) { a[i + 1] = (float)(scale * r * sin(two_pi * u2)); }
        }
    }
}

/* Matrices are drawn in OUT_IN order and stored transposed for IN_OUT, so a seed gives the
 * same mathematical weights in either layout. */
static void fill_matrix(float *a, float *scratch, size_t out, size_t in, clffn_init scheme,
                        uint64_t seed, uint32_t stream) {
    const size_t n = out * in;
    float *dst = scratch ? scratch : a;
    if (scheme == CLFFN_INIT_TORCH_LINEAR) {
        fill_uniform(dst, n, (float)(1.0 / sqrt((double)in)), seed, stream);
    } else {
        fill_randn(dst, n, 0.01f, seed, stream);
    }
    if (dst != a) {
        for (size_t o = 0; o < out; ++o) {
            for (size_t i = 0; i < in; ++i) { a[i * out + o] = dst[o * in + i]; }
        }
    }
}

static void fill_bias(float *a, size_t n, size_t fan_in, clffn_init scheme, uint64_t seed,
                      uint32_t stream) {
    if (scheme == CLFFN_INIT_TORCH_LINEAR) {
        fill_uniform(a, n, (float)(1.0 / sqrt((double)fan_in)), seed, stream);
    } else {
        memset(a, 0, n * sizeof *a);
    }
}

clffn_status clffn_init_weights_host(const clffn_config *c, clffn_init scheme, uint64_t seed,
                                     clffn_layout layout, const clffn_weight_arrays *w) {
    if (!c || !w) { return CLFFN_ERROR_NULL_ARGUMENT; }
    clffn_status st = clffn_config_validate(c);
    if (st != CLFFN_SUCCESS) { return st; }
    if (scheme != CLFFN_INIT_TORCH_LINEAR && scheme != CLFFN_INIT_NUMPY_RANDN) {
        return CLFFN_ERROR_INVALID_ARGUMENT;
    }
    if (layout != CLFFN_LAYOUT_OUT_IN && layout != CLFFN_LAYOUT_IN_OUT) {
        return CLFFN_ERROR_INVALID_LAYOUT;
    }
    if (!w->w1 || !w->w2 || (c->bias1 && !w->b1) || (c->bias2 && !w->b2) ||
        (c->gated && (!w->v || (c->bias_gate && !w->bv)))) {
        return CLFFN_ERROR_NULL_ARGUMENT;
    }
    const size_t D = c->d_model, F = c->d_ff;
    /* IN_OUT draws into scratch and transposes; it is taken before anything is written so that
     * a failed allocation leaves the caller's arrays as they were */
    float *scratch = NULL;
    if (layout == CLFFN_LAYOUT_IN_OUT && !(scratch = malloc(D * F * sizeof *scratch))) {
        return CLFFN_ERROR_OUT_OF_HOST_MEMORY;
    }
    fill_matrix(w->w1, scratch, F, D, scheme, seed, STREAM_W1);
    if (c->gated) { fill_matrix(w->v, scratch, F, D, scheme, seed, STREAM_V); }
    fill_matrix(w->w2, scratch, D, F, scheme, seed, STREAM_W2);
    free(scratch);
    if (c->bias1) { fill_bias(w->b1, F, D, scheme, seed, STREAM_B1); }
    if (c->gated && c->bias_gate) { fill_bias(w->bv, F, D, scheme, seed, STREAM_BV); }
    if (c->bias2) { fill_bias(w->b2, D, F, scheme, seed, STREAM_B2); }
    return CLFFN_SUCCESS;
}
