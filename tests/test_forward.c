/* The forward pass against the double-precision reference: every activation × plain/gated ×
 * each bias flag, on odd shapes, both weight layouts handed over × both kept on the device, the
 * host and the device way in, with non-zero buffer offsets and canaries around every output. */
#include "common.h"
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct variant {
    clffn_activation act;
    int gated, bias1, bias2, bias_gate;
} variant;

/* tokens, d_model, d_ff: one token; the 7 × 13 → 29 odd shape; non-multiples of 16 and of 4 */
static const size_t shapes[][3] = {{1, 16, 40}, {7, 13, 29}, {33, 20, 52}, {18, 37, 61}};

static void run_case(clffn_context *ctx, const variant *v, const size_t shape[3],
                     clffn_layout layout, int side) {
    clffn_config c = clffn_config_default(shape[1], shape[2]);
    c.activation = v->act;
    c.gated = v->gated;
    c.bias1 = v->bias1;
    c.bias2 = v->bias2;
    c.bias_gate = v->bias_gate;
    const size_t T = shape[0], D = c.d_model, F = c.d_ff;
    char what[160];
    const clffn_layout kept = clffn_context_weight_layout(ctx);
    snprintf(what, sizeof what, "%s%s b1=%d b2=%d bg=%d T=%zu D=%zu F=%zu %s kept %s %s",
             clffn_activation_name(v->act), v->gated ? " gated" : "", v->bias1, v->bias2,
             v->bias_gate, T, D, F, layout == CLFFN_LAYOUT_OUT_IN ? "out_in" : "in_out",
             kept == CLFFN_LAYOUT_OUT_IN ? "out_in" : "in_out", test_gemv_side_name(side));

    test_weights w;
    test_weights_make(&w, &c, layout, 1000 + T * 7 + D * 3 + F);
    float *x = malloc(T * D * sizeof *x), *y = malloc(T * D * sizeof *y);
    float *h = malloc(T * F * sizeof *h);
    double *ref = malloc(T * D * sizeof *ref), *href = malloc(T * F * sizeof *href);
    cr_assert(x && y && h && ref && href);
    fill_uniform(x, T * D, -1.0f, 1.0f, 77 + T);
    ASSERT_OK(clffn_reference_forward(&c, layout, &w.host, T, x, 0, 0, 0, ref, href));
    /* ReLU zeroes about half the hidden values; the others keep most */
    assert_mostly_nonzero(href, T * F, v->act == CLFFN_ACT_RELU ? 0.25 : 0.9, what);
    assert_mostly_nonzero(ref, T * D, 0.9, what);

    clffn_ffn *ffn = NULL;
    ASSERT_OK(clffn_ffn_create(ctx, &c, &ffn));
    ASSERT_OK(clffn_ffn_upload_weights(ffn, layout, &w.host));
    /* kept as the context says, whatever layout came in; the caller's stays the gradients' */
    cr_assert(ffn->w1.layout == kept && ffn->w2.layout == kept, "%s", what);
    cr_assert_eq(ffn->grad_layout, layout, "%s", what);

    /* host level */
    ASSERT_OK(clffn_forward_host(ffn, T, x, T * D, y, T * D));
    assert_close(y, ref, T * D, act_rtol(v->act), what);
    ASSERT_OK(clffn_ffn_read_hidden(ffn, CLFFN_HIDDEN_OUT, h, T * F, NULL));
    assert_close(h, href, T * F, act_rtol(v->act), what);

    /* device level, at odd offsets, canaries on both sides of x and y */
    guarded gx = guarded_make(ctx, CANARY + 3, T * D, x);
    guarded gy = guarded_make(ctx, CANARY + 5, T * D, NULL);
    cl_event ev = NULL;
    ASSERT_OK(
        clffn_forward(ffn, T, gx.mem, gx.offset, gy.mem, gy.offset, clffn_context_queue(ctx), &ev));
    cr_assert(ev != NULL);
    ASSERT_OK(clWaitForEvents(1, &ev));
    clReleaseEvent(ev);
    memset(y, 0, T * D * sizeof *y);
    guarded_read(ctx, &gy, y);
    assert_close(y, ref, T * D, act_rtol(v->act), what);
    guarded_assert_canaries(ctx, &gy, what);
    guarded_assert_canaries(ctx, &gx, what);
    float *x_after = malloc(T * D * sizeof *x_after);
    guarded_read(ctx, &gx, x_after);
    cr_assert(memcmp(x, x_after, T * D * sizeof *x) == 0, "%s: x was modified", what);

    free(x_after);
    guarded_free(&gx);
    guarded_free(&gy);
    clffn_ffn_destroy(ffn);
    free(x);
    free(y);
    free(h);
    free(ref);
    free(href);
    test_weights_free(&w);
}

static void run_variant(const variant *v) {
    clffn_context *ctx = test_clblast_context();
    for (int k = 0; k < 4; ++k) { /* the GEMV side × the layout the weights are kept in */
        const int side = k / 2;
        ASSERT_OK(clffn_context_set_gemv_max_tokens(ctx, test_gemv_sides[side]));
        ASSERT_OK(clffn_context_set_weight_layout(ctx, (clffn_layout)(k % 2)));
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s) {
            const size_t shape[3] = {test_side_tokens(side, shapes[s][0]), shapes[s][1],
                                     shapes[s][2]};
            run_case(ctx, v, shape, CLFFN_LAYOUT_OUT_IN, side);
            run_case(ctx, v, shape, CLFFN_LAYOUT_IN_OUT, side);
        }
    }
    clffn_context_destroy(ctx);
}

/* The GEMV path where CLBlast's fast kernels take the products: their tiles (work-group size ×
 * work per item, at most 256 in the built-in profiles) must divide the output count, so the odd
 * shapes above only reach its general kernel. 1 and 2 tokens, plain and gated (the stacked
 * 1024-wide first layer), every handed-over × kept layout, so both XgemvFast and XgemvFastRot
 * run the forward. */
Test(forward, gemv_fast_kernels) {
    clffn_context *ctx = test_clblast_context();
    const variant vs[] = {{CLFFN_ACT_SILU, 0, 1, 1, 1}, {CLFFN_ACT_SILU, 1, 1, 1, 1}};
    const size_t fshapes[][3] = {{1, 256, 512}, {2, 256, 512}};
    ASSERT_OK(clffn_context_set_gemv_max_tokens(ctx, 2));
    for (int kept = 0; kept < 2; ++kept) {
        ASSERT_OK(clffn_context_set_weight_layout(ctx, (clffn_layout)kept));
        for (size_t i = 0; i < 4; ++i) {
            run_case(ctx, &vs[i / 2], fshapes[i % 2], CLFFN_LAYOUT_OUT_IN, 1);
            run_case(ctx, &vs[i / 2], fshapes[i % 2], CLFFN_LAYOUT_IN_OUT, 1);
        }
    }
    clffn_context_destroy(ctx);
}

/* Every activation × {plain, gated} × {all biases, each one off, none}. */
ParameterizedTestParameters(forward, variants) {
    static variant vs[CLFFN_ACT_COUNT_ * 9];
    size_t n = 0;
    for (int a = 0; a < CLFFN_ACT_COUNT_; ++a) {
        const variant plain[] = {
            {a, 0, 1, 1, 1}, {a, 0, 0, 1, 1}, {a, 0, 1, 0, 1}, {a, 0, 0, 0, 0}};
        const variant gated[] = {
            {a, 1, 1, 1, 1}, {a, 1, 0, 1, 1}, {a, 1, 1, 0, 1}, {a, 1, 1, 1, 0}, {a, 1, 0, 0, 0}};
        for (size_t i = 0; i < 4; ++i) { vs[n++] = plain[i]; }
        for (size_t i = 0; i < 5; ++i) { vs[n++] = gated[i]; }
    }
    return cr_make_param_array(variant, vs, n);
}

ParameterizedTest(variant *v, forward, variants, .timeout = 120 + TEST_COLD_GEMM_BUILDS) {
    run_variant(v);
}

/* SGEMMs split along K (clffn_context_set_gemm_k_block): with a 64 block every product of these
 * shapes runs as 2-3 CLBlast calls summed into the output, the last one short; both layouts (so
 * both transposes of the weights), plain and gated. Unsplit shapes would not test it. */
Test(forward, k_blocked_gemms, .timeout = 180 + TEST_COLD_GEMM_BUILDS) {
    clffn_context *ctx = test_clblast_context();
    ASSERT_OK(clffn_context_set_gemm_k_block(ctx, 64));
    ASSERT_OK(clffn_context_set_gemm_k_block_min_rows(ctx, 0)); /* every product */
    const size_t kshapes[][3] = {{37, 200, 333}, {5, 131, 200}};
    const variant vs[] = {{CLFFN_ACT_GELU, 0, 1, 1, 1}, {CLFFN_ACT_SILU, 1, 1, 0, 1}};
    for (size_t s = 0; s < 2; ++s) {
        for (size_t i = 0; i < 2; ++i) {
            ASSERT_OK(clffn_context_set_weight_layout(ctx, (clffn_layout)i));
            run_case(ctx, &vs[i], kshapes[s], CLFFN_LAYOUT_OUT_IN, 0);
            run_case(ctx, &vs[i], kshapes[s], CLFFN_LAYOUT_IN_OUT, 0);
        }
    }
    clffn_context_destroy(ctx);
}

/* The seed tutorials' example, 64 × 10 × 512 → 2048, in the variants users start from. */
static void seed_example(clffn_activation act, int gated, clffn_layout layout, int training) {
    clffn_context *ctx = test_clblast_context();
    clffn_config c = clffn_config_default(512, 2048);
    c.activation = act;
    c.gated = gated;
    const size_t T = 64 * 10, D = 512;
    test_weights w;
    test_weights_make(&w, &c, layout, 99);
    float *x = malloc(T * D * sizeof *x), *y = malloc(T * D * sizeof *y);
    double *ref = malloc(T * D * sizeof *ref);
    cr_assert(x && y && ref);
    fill_uniform(x, T * D, -1.0f, 1.0f, 5);
    ASSERT_OK(clffn_reference_forward(&c, layout, &w.host, T, x, training, 1234, 0, ref, NULL));
    assert_mostly_nonzero(ref, T * D, 0.9, "seed example");
    clffn_ffn *ffn = NULL;
    ASSERT_OK(clffn_ffn_create(ctx, &c, &ffn));
    ASSERT_OK(clffn_ffn_upload_weights(ffn, layout, &w.host));
    ASSERT_OK(clffn_ffn_set_training(ffn, training));
    ASSERT_OK(clffn_ffn_set_rng(ffn, 1234, 0));
    ASSERT_OK(clffn_forward_host(ffn, T, x, T * D, y, T * D));
    assert_close(y, ref, T * D, act_rtol(act), "seed example");
    clffn_ffn_destroy(ffn);
    clffn_context_destroy(ctx);
    free(x);
    free(y);
    free(ref);
    test_weights_free(&w);
}

Test(forward, seed_example_relu, .timeout = 300) {
    seed_example(CLFFN_ACT_RELU, 0, CLFFN_LAYOUT_OUT_IN, 0);
}
Test(forward, seed_example_swiglu_in_out, .timeout = 300) {
    seed_example(CLFFN_ACT_SILU, 1, CLFFN_LAYOUT_IN_OUT, 0);
}
Test(forward, seed_example_gelu_dropout_training, .timeout = 300) {
    seed_example(CLFFN_ACT_GELU, 0, CLFFN_LAYOUT_OUT_IN, 1);
}

static double wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Stage times of a profiled forward, many tokens (CLBlast's GEMMs) and one (clffn's kernels):
 * four positive spans that add up to the total, within the host's span around the forward;
 * profiling changes no bit of y; a forward run without it leaves no stale times behind. */
Test(forward, stage_times, .timeout = 120) {
    clffn_context *ctx = test_clblast_context();
    const int ordered = test_timestamps_ordered(ctx);
    clffn_config c = clffn_config_default(64, 256);
    c.activation = CLFFN_ACT_SILU;
    c.gated = 1;
    const size_t D = c.d_model, T_MAX = 40;
    test_weights w;
    test_weights_make(&w, &c, CLFFN_LAYOUT_OUT_IN, 31);
    float *x = malloc(T_MAX * D * sizeof *x), *y0 = malloc(T_MAX * D * sizeof *y0);
    float *y1 = malloc(T_MAX * D * sizeof *y1);
    cr_assert(x && y0 && y1);
    fill_uniform(x, T_MAX * D, -1.0f, 1.0f, 3);
    clffn_ffn *ffn = NULL;
    ASSERT_OK(clffn_ffn_create(ctx, &c, &ffn));
    ASSERT_OK(clffn_ffn_upload_weights(ffn, CLFFN_LAYOUT_OUT_IN, &w.host));
    clffn_stage_times s;
    cr_assert_eq(clffn_ffn_stage_times(NULL, &s), CLFFN_ERROR_NULL_ARGUMENT);
    cr_assert_eq(clffn_ffn_stage_times(ffn, NULL), CLFFN_ERROR_NULL_ARGUMENT);
    cr_assert_eq(clffn_ffn_set_profiling(NULL, 1), CLFFN_ERROR_NULL_ARGUMENT);
    cr_assert_eq(clffn_ffn_stage_times(ffn, &s), CLFFN_ERROR_NO_FORWARD);
    const size_t counts[] = {T_MAX, 1};
    for (size_t i = 0; i < 2; ++i) {
        const size_t T = counts[i];
        ASSERT_OK(clffn_ffn_set_profiling(ffn, 0));
        ASSERT_OK(clffn_forward_host(ffn, T, x, T * D, y0, T * D));
        cr_assert_eq(clffn_ffn_stage_times(ffn, &s), CLFFN_ERROR_NO_FORWARD, "T=%zu", T);
        ASSERT_OK(clffn_ffn_set_profiling(ffn, 1));
        const double t0 = wall_s();
        ASSERT_OK(clffn_forward_host(ffn, T, x, T * D, y1, T * D));
        const double host = wall_s() - t0;
        cr_assert(memcmp(y0, y1, T * D * sizeof *y0) == 0, "T=%zu: profiling changed y", T);
        const clffn_status st = clffn_ffn_stage_times(ffn, &s);
        if (!ordered) { /* a driver whose timestamps are not times may say so, or not */
            cr_assert(st == CLFFN_SUCCESS || st == CLFFN_ERROR_PROFILING_TIMES, "T=%zu: %d", T, st);
            continue;
        }
        cr_assert_eq(st, CLFFN_SUCCESS, "T=%zu", T);
        cr_assert(s.gemm1_s > 0 && s.epilogue1_s > 0 && s.gemm2_s > 0 && s.epilogue2_s > 0,
                  "T=%zu: %g %g %g %g", T, s.gemm1_s, s.epilogue1_s, s.gemm2_s, s.epilogue2_s);
        const double parts = s.gemm1_s + s.epilogue1_s + s.gemm2_s + s.epilogue2_s;
        cr_assert(fabs(parts - s.total_s) <= 1e-9 + 1e-6 * s.total_s, "T=%zu: %.9f vs %.9f", T,
                  parts, s.total_s);
        cr_assert(s.total_s <= host * 1.01 + 1e-6, "T=%zu: device %.6f s, host %.6f s", T,
                  s.total_s, host);
    }
    clffn_ffn_destroy(ffn);
    clffn_context_destroy(ctx);
    free(x);
    free(y0);
    free(y1);
    test_weights_free(&w);
}
