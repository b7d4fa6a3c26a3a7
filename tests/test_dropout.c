/* Dropout: rate, scaling, determinism, independence from the work-group size, and the modes.
 * Hidden pre-activations are made exactly 1 (W1 = 0, b1 = 1, identity) so the hidden tensor
 * read back is the scaled mask itself. */
#include "common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct mask_setup {
    clffn_context *ctx;
    clffn_ffn *ffn;
    clffn_config c;
    float *x, *y, *h;
    size_t T;
} mask_setup;

static void mask_setup_make(mask_setup *m, size_t T, size_t D, size_t F, float p, int gated) {
    memset(m, 0, sizeof *m);
    m->ctx = test_context();
    m->T = T;
    m->c = clffn_config_default(D, F);
    m->c.activation = CLFFN_ACT_IDENTITY;
    m->c.gated = gated;
    m->c.dropout = p;
    float *w1 = calloc(D * F, sizeof *w1), *w2 = calloc(D * F, sizeof *w2);
    float *b1 = malloc(F * sizeof *b1), *b2 = calloc(D, sizeof *b2);
    float *v = calloc(D * F, sizeof *v), *bv = malloc(F * sizeof *bv);
    cr_assert(w1 && w2 && b1 && b2 && v && bv);
    for (size_t j = 0; j < F; ++j) { b1[j] = bv[j] = 1.0f; }
    const clffn_host_weights hw = {w1, b1, v, bv, w2, b2};
    ASSERT_OK(clffn_ffn_create(m->ctx, &m->c, &m->ffn));
    ASSERT_OK(clffn_ffn_upload_weights(m->ffn, CLFFN_LAYOUT_OUT_IN, &hw));
    free(w1), free(w2), free(b1), free(b2), free(v), free(bv);
    m->x = calloc(T * D, sizeof *m->x);
    m->y = malloc(T * D * sizeof *m->y);
    m->h = malloc(T * F * sizeof *m->h);
    cr_assert(m->x && m->y && m->h);
    fill_uniform(m->x, T * D, -1.0f, 1.0f, 3);
}

static void mask_run(mask_setup *m) {
    ASSERT_OK(
        clffn_forward_host(m->ffn, m->T, m->x, m->T * m->c.d_model, m->y, m->T * m->c.d_model));
    ASSERT_OK(clffn_ffn_read_hidden(m->ffn, CLFFN_HIDDEN_OUT, m->h, m->T * m->c.d_ff, NULL));
}

static void mask_setup_free(mask_setup *m) {
    clffn_ffn_destroy(m->ffn);
    clffn_context_destroy(m->ctx);
    free(m->x), free(m->y), free(m->h);
}

/* Dropped fraction within 3σ of p over 2^20 elements; every kept value is exactly 1/(1−p). */
static void check_rate(float p) {
    mask_setup m;
    mask_setup_make(&m, 1024, 8, 1024, p, 0);
    ASSERT_OK(clffn_ffn_set_training(m.ffn, 1));
    ASSERT_OK(clffn_ffn_set_rng(m.ffn, 2024, 0));
    mask_run(&m);
    const size_t n = m.T * m.c.d_ff;
    const float scale = 1.0f / (1.0f - p);
    size_t dropped = 0;
    for (size_t i = 0; i < n; ++i) {
        if (m.h[i] == 0.0f) {
            ++dropped;
        } else {
            cr_assert(m.h[i] == scale, "kept value %zu is %.9g, want %.9g", i, (double)m.h[i],
                      (double)scale);
        }
    }
    const double mean = (double)n * p, sigma = sqrt((double)n * p * (1.0 - p));
    cr_assert(fabs((double)dropped - mean) <= 3.0 * sigma,
              "p=%g: dropped %zu of %zu, expected %.0f ± %.0f (3σ)", (double)p, dropped, n, mean,
              3.0 * sigma);
    mask_setup_free(&m);
}

Test(dropout, rate_and_scaling_p01, .timeout = 120) { check_rate(0.1f); }
Test(dropout, rate_and_scaling_p05, .timeout = 120) { check_rate(0.5f); }
Test(dropout, rate_and_scaling_p09, .timeout = 120) { check_rate(0.9f); }

/* The device mask equals the host's clffn_dropout_keep() for every element, on a d_ff that is
 * not a multiple of 4 (the per-element path) and one that is (the float4 path). */
static void check_matches_host(size_t F, int gated) {
    mask_setup m;
    const float p = 0.3f;
    mask_setup_make(&m, 37, 5, F, p, gated);
    ASSERT_OK(clffn_ffn_set_training(m.ffn, 1));
    ASSERT_OK(clffn_ffn_set_rng(m.ffn, 0x0123456789abcdefull, 1000003));
    mask_run(&m);
    const float scale = 1.0f / (1.0f - p);
    for (size_t e = 0; e < m.T * F; ++e) {
        const int keep = clffn_dropout_keep(p, 0x0123456789abcdefull, 1000003, e);
        cr_assert(m.h[e] == (keep ? scale : 0.0f), "F=%zu element %zu: got %g, host says keep=%d",
                  F, e, (double)m.h[e], keep);
    }
    mask_setup_free(&m);
}

Test(dropout, matches_host_unaligned) { check_matches_host(1023, 0); }
Test(dropout, matches_host_aligned) { check_matches_host(1024, 0); }
Test(dropout, matches_host_gated) { check_matches_host(515, 1); }

Test(dropout, same_seed_same_mask_other_seed_other_mask) {
    mask_setup m;
    mask_setup_make(&m, 64, 4, 512, 0.5f, 0);
    const size_t n = m.T * m.c.d_ff;
    float *first = malloc(n * sizeof *first);
    cr_assert(first);
    ASSERT_OK(clffn_ffn_set_training(m.ffn, 1));
    ASSERT_OK(clffn_ffn_set_rng(m.ffn, 7, 0));
    mask_run(&m);
    memcpy(first, m.h, n * sizeof *first);
    ASSERT_OK(clffn_ffn_set_rng(m.ffn, 7, 0));
    mask_run(&m);
    cr_assert(memcmp(first, m.h, n * sizeof *first) == 0, "same seed and offset, other mask");
    ASSERT_OK(clffn_ffn_set_rng(m.ffn, 8, 0));
    mask_run(&m);
    size_t diff = 0;
    for (size_t i = 0; i < n; ++i) { diff += first[i] != m.h[i]; }
    /* two independent masks of p = 0.5 disagree on half the elements */
    cr_assert(diff > n / 2 - n / 10 && diff < n / 2 + n / 10, "other seed: %zu of %zu differ", diff,
              n);
    free(first);
    mask_setup_free(&m);
}

Test(dropout, offset_advances_between_forwards) {
    mask_setup m;
    mask_setup_make(&m, 10, 4, 30, 0.5f, 0);
    const size_t n = m.T * m.c.d_ff;
    float *first = malloc(n * sizeof *first);
    cr_assert(first);
    ASSERT_OK(clffn_ffn_set_training(m.ffn, 1));
    ASSERT_OK(clffn_ffn_set_rng(m.ffn, 5, 40));
    mask_run(&m);
    memcpy(first, m.h, n * sizeof *first);
    uint64_t seed = 0, offset = 0;
    ASSERT_OK(clffn_ffn_get_rng(m.ffn, &seed, &offset));
    cr_assert_eq(seed, 5);
    cr_assert_eq(offset, 40 + (n + 3) / 4, "offset %llu", (unsigned long long)offset);
    mask_run(&m);
    cr_assert(memcmp(first, m.h, n * sizeof *first) != 0, "second forward reused the mask");
    for (size_t e = 0; e < n; ++e) { /* and it is exactly the mask at the advanced offset */
        cr_assert((m.h[e] != 0.0f) == clffn_dropout_keep(0.5f, 5, offset, e));
    }
    free(first);
    mask_setup_free(&m);
}

Test(dropout, independent_of_work_group_size) {
    const size_t sizes[] = {0, 1, 3, 8, 64}; /* 0: the runtime's choice */
    for (int aligned = 0; aligned < 2; ++aligned) {
        mask_setup m;
        mask_setup_make(&m, 19, 4, aligned ? 256 : 253, 0.4f, 0);
        const size_t n = m.T * m.c.d_ff;
        float *first = malloc(n * sizeof *first);
        cr_assert(first);
        ASSERT_OK(clffn_ffn_set_training(m.ffn, 1));
        ASSERT_OK(clffn_ffn_set_rng(m.ffn, 99, 0));
        mask_run(&m);
        memcpy(first, m.h, n * sizeof *first);
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
            m.ctx->programs.local_size = sizes[i];
            ASSERT_OK(clffn_ffn_set_rng(m.ffn, 99, 0));
            mask_run(&m);
            cr_assert(memcmp(first, m.h, n * sizeof *first) == 0,
                      "mask changed with local size %zu (aligned=%d)", sizes[i], aligned);
        }
        free(first);
        mask_setup_free(&m);
    }
}

Test(dropout, inference_is_identity) {
    mask_setup m;
    mask_setup_make(&m, 16, 4, 100, 0.5f, 0);
    ASSERT_OK(clffn_ffn_set_rng(m.ffn, 1, 0));
    mask_run(&m); /* training is off by default */
    for (size_t i = 0; i < m.T * m.c.d_ff; ++i) { cr_assert(m.h[i] == 1.0f); }
    uint64_t offset = 1;
    ASSERT_OK(clffn_ffn_get_rng(m.ffn, NULL, &offset));
    cr_assert_eq(offset, 0, "inference must not consume random numbers");
    mask_setup_free(&m);
}

Test(dropout, p0_keeps_all_p1_drops_all) {
    mask_setup m;
    mask_setup_make(&m, 16, 4, 100, 0.0f, 0);
    ASSERT_OK(clffn_ffn_set_training(m.ffn, 1));
    mask_run(&m);
    for (size_t i = 0; i < m.T * m.c.d_ff; ++i) { cr_assert(m.h[i] == 1.0f, "p=0 changed %zu", i); }
    ASSERT_OK(clffn_ffn_set_dropout(m.ffn, 1.0f));
    mask_run(&m);
    for (size_t i = 0; i < m.T * m.c.d_ff; ++i) { cr_assert(m.h[i] == 0.0f, "p=1 kept %zu", i); }
    /* with nothing left in the hidden layer the output is b2 alone (zero here) */
    for (size_t i = 0; i < m.T * m.c.d_model; ++i) { cr_assert(m.y[i] == 0.0f); }
    mask_setup_free(&m);
}

/* A whole FFN in training mode against the reference with the same mask. */
Test(dropout, training_forward_matches_reference) {
    clffn_context *ctx = test_context();
    for (int gated = 0; gated < 2; ++gated) {
        clffn_config c = clffn_config_default(24, 90);
        c.activation = CLFFN_ACT_GELU;
        c.gated = gated;
        c.dropout = 0.25f;
        const size_t T = 21, D = c.d_model;
        test_weights w;
        test_weights_make(&w, &c, CLFFN_LAYOUT_OUT_IN, 4);
        float *x = malloc(T * D * sizeof *x), *y = malloc(T * D * sizeof *y);
        double *ref = malloc(T * D * sizeof *ref);
        cr_assert(x && y && ref);
        fill_uniform(x, T * D, -1.0f, 1.0f, 8);
        clffn_ffn *ffn = NULL;
        ASSERT_OK(clffn_ffn_create(ctx, &c, &ffn));
        ASSERT_OK(clffn_ffn_upload_weights(ffn, CLFFN_LAYOUT_OUT_IN, &w.host));
        ASSERT_OK(clffn_ffn_set_training(ffn, 1));
        ASSERT_OK(clffn_ffn_set_rng(ffn, 31337, 17));
        ASSERT_OK(clffn_forward_host(ffn, T, x, T * D, y, T * D));
        ASSERT_OK(clffn_reference_forward(&c, CLFFN_LAYOUT_OUT_IN, &w.host, T, x, 1, 31337, 17, ref,
                                          NULL));
        assert_close(y, ref, T * D, TOL_RTOL, gated ? "gated training" : "plain training");
        clffn_ffn_destroy(ffn);
        free(x), free(y), free(ref);
        test_weights_free(&w);
    }
    clffn_context_destroy(ctx);
}
