/* clffn's kernels and whole passes on Oclgrind, a simulated OpenCL 1.2 device that reports what a
 * CPU device forgives and a GPU does not: data races between work-items, reads of memory nobody
 * wrote, accesses out of bounds, divergent barriers, misused API calls. ctest runs this binary
 * under `oclgrind --data-races --uninitialized --check-api`, and any report in the output fails
 * it (tests/CMakeLists.txt); each case also checks its values against the double reference, so
 * a kernel that runs clean but computes the wrong thing fails too.
 *
 * Shapes are small (the simulator interprets every work-item) and odd: d_model 13 and d_ff 29
 * leave float4 and scalar tails in every element-wise kernel, d_ff 133 splits the second GEMM
 * into K-blocks of 64. Dropout runs on both of its paths: float4 (d_ff 28, 20) and per element
 * (d_ff 29), whose mask Oclgrind 21.10 computed wrongly before the lane selection was changed
 * (docs/RELIABILITY.md). Each case destroys its context, and each test calls
 * clffn_release_all() as it ends (the suites' fini): without it CLBlast's cache releases its
 * programs after Oclgrind has torn itself down, and the process dies at exit. Not after every
 * case: CLBlast keeps each kernel's binary for the process, so a test's later contexts take its
 * GEMMs from there instead of compiling them again, which was half of the simulator's time. */
#include "common.h"

#include "moe.h" /* the router logits' form */
#include "program.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct sim_case {
    clffn_activation act;
    int gated;
    clffn_layout layout;
    int bias;     /* every bias flag on, or all off */
    int train;    /* dropout 0.25 in training mode */
    int residual; /* y = FFN(x) + x */
    size_t k_block, T, D, F;
    int gemv;  /* every product that can be one runs as CLBlast GEMVs (else SGEMMs) */
    int fused; /* 0: the device's default for fused epilogues (Oclgrind's, a GPU: on); 1: off */
} sim_case;

static void describe(const sim_case *s, char *buf, size_t size) {
    snprintf(buf, size, "%s%s %s bias=%d train=%d res=%d kb=%zu T=%zu D=%zu F=%zu gemv=%d",
             clffn_activation_name(s->act), s->gated ? " gated" : "",
             s->layout == CLFFN_LAYOUT_OUT_IN ? "out_in" : "in_out", s->bias, s->train, s->residual,
             s->k_block, s->T, s->D, s->F, s->gemv);
}

static clffn_config config_of(const sim_case *s) {
    clffn_config c = clffn_config_default(s->D, s->F);
    c.activation = s->act;
    c.gated = s->gated;
    c.bias1 = c.bias2 = c.bias_gate = s->bias;
    c.dropout = s->train ? 0.25f : 0.0f;
    c.residual = s->residual;
    return c;
}

static void release_all(void) { ASSERT_OK(clffn_release_all()); }

TestSuite(oclgrind, .fini = release_all);
TestSuite(oclgrind_grouped, .fini = release_all);

/* The host-level forward, then the host-level backward accumulating onto gradients that hold
 * 0.25 (stacked W1|V for a gated FFN: the mapped upload), both against the reference. */
static void run_host(const sim_case *s) {
    char what[160];
    describe(s, what, sizeof what);
    const clffn_config c = config_of(s);
    const size_t T = s->T, D = s->D, F = s->F, nw = D * F;
    clffn_context *ctx = test_context();
    if (s->k_block) {
        ASSERT_OK(clffn_context_set_gemm_k_block(ctx, s->k_block));
        ASSERT_OK(clffn_context_set_gemm_k_block_min_rows(ctx, 0));
    }
    ASSERT_OK(clffn_context_set_gemv_max_tokens(ctx, test_gemv_sides[s->gemv]));
    test_weights w;
    test_weights_make(&w, &c, s->layout, 31 + T + D + F);
    float *x = malloc(T * D * sizeof *x), *dy = malloc(T * D * sizeof *dy);
    float *y = malloc(T * D * sizeof *y), *dx = malloc(T * D * sizeof *dx);
    float *g = malloc((3 * nw + 3 * F + D) * sizeof *g);
    double *ry = malloc(T * D * sizeof *ry), *rdx = malloc(T * D * sizeof *rdx);
    double *rg = calloc(3 * nw + 3 * F + D, sizeof *rg);
    cr_assert(x && dy && y && dx && g && ry && rdx && rg);
    fill_uniform(x, T * D, -1.0f, 1.0f, 5);
    fill_uniform(dy, T * D, -1.0f, 1.0f, 6);
    for (size_t i = 0; i < 3 * nw + 3 * F + D; ++i) { g[i] = 0.25f; }
    const clffn_weight_arrays ga = {
        g, g + 3 * nw, s->gated ? g + nw : NULL, g + 3 * nw + F, g + 2 * nw, g + 3 * nw + 2 * F};
    const clffn_ref_grads rga = {
        rg,          rg + 3 * nw,        s->gated ? rg + nw : NULL, rg + 3 * nw + F,
        rg + 2 * nw, rg + 3 * nw + 2 * F};

    clffn_ffn *ffn = NULL;
    ASSERT_OK(clffn_ffn_create(ctx, &c, &ffn));
    ASSERT_OK(clffn_ffn_upload_weights(ffn, s->layout, &w.host));
    ASSERT_OK(clffn_ffn_set_training(ffn, s->train));
    ASSERT_OK(clffn_ffn_set_rng(ffn, 7, 0));
    ASSERT_OK(clffn_forward_host(ffn, T, x, T * D, y, T * D));
    ASSERT_OK(clffn_reference_forward(&c, s->layout, &w.host, T, x, s->train, 7, 0, ry, NULL));
    assert_close(y, ry, T * D, act_rtol(s->act), what);

    ASSERT_OK(clffn_backward_host(ffn, T, x, T * D, dy, T * D, dx, T * D, &ga, 1));
    ASSERT_OK(
        clffn_reference_backward(&c, s->layout, &w.host, T, x, dy, s->train, 7, 0, rdx, &rga));
    assert_close(dx, rdx, T * D, act_rtol(s->act), what);
    for (size_t i = 0; i < 3 * nw + 3 * F + D; ++i) { rg[i] += 0.25; }
    char part[200];
    snprintf(part, sizeof part, "%s dW1", what);
    assert_close(ga.w1, rga.w1, nw, act_rtol(s->act), part);
    snprintf(part, sizeof part, "%s dW2", what);
    assert_close(ga.w2, rga.w2, nw, act_rtol(s->act), part);
    if (s->gated) {
        snprintf(part, sizeof part, "%s dV", what);
        assert_close(ga.v, rga.v, nw, act_rtol(s->act), part);
    }
    if (s->bias) {
        snprintf(part, sizeof part, "%s db1", what);
        assert_close(ga.b1, rga.b1, F, act_rtol(s->act), part);
        snprintf(part, sizeof part, "%s db2", what);
        assert_close(ga.b2, rga.b2, D, act_rtol(s->act), part);
    }
    clffn_ffn_destroy(ffn);
    test_weights_free(&w);
    free(x), free(dy), free(y), free(dx), free(g), free(ry), free(rdx), free(rg);
    clffn_context_destroy(ctx);
}

/* Every activation, each in four cases that between them take every path: plain and gated
 * (stacked W1|V), both layouts, biases on and off, dropout, the residual, K-blocks. */
ParameterizedTestParameters(oclgrind, host_passes) {
    static int acts[CLFFN_ACT_COUNT_];
    for (int a = 0; a < CLFFN_ACT_COUNT_; ++a) { acts[a] = a; }
    return cr_make_param_array(int, acts, CLFFN_ACT_COUNT_);
}

ParameterizedTest(int *a, oclgrind, host_passes, .timeout = 600) {
    const clffn_activation act = (clffn_activation)*a;
    const sim_case cases[] = {
        {act, 0, CLFFN_LAYOUT_OUT_IN, 1, 1, 0, 0, 7, 13, 28, 0, 0},
        {act, 1, CLFFN_LAYOUT_IN_OUT, 1, 1, 1, 0, 7, 13, 29, 0, 0},
        {act, 1, CLFFN_LAYOUT_OUT_IN, 0, 1, 0, 0, 6, 16, 20, 0, 0},
        {act, 0, CLFFN_LAYOUT_IN_OUT, 0, 0, 1, 64, 5, 13, 133, 0, 0},
        /* small batches: GEMVs at odd sizes (CLBlast's general kernel) and at multiples of 64
         * (its fast kernels, both orientations) */
        {act, 1, CLFFN_LAYOUT_OUT_IN, 1, 1, 1, 0, 3, 13, 29, 1, 0},
        {act, 0, CLFFN_LAYOUT_IN_OUT, 1, 0, 0, 0, 2, 64, 64, 1, 0},
        {act, 0, CLFFN_LAYOUT_OUT_IN, 0, 1, 0, 0, 2, 64, 64, 1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) { run_host(&cases[i]); }
}

/* The device level: caller-bound weights with V separate (two first-layer products), x, y, dx
 * and every gradient at offsets ≠ 0 inside larger buffers with canaries around them. Without
 * the residual here: its dy → dx copy at offsets ≠ 0 is not tracked by Oclgrind's
 * uninitialized-memory check (the residual runs in host_passes, at offset 0). */
Test(oclgrind, device_offsets_separate_gate, .timeout = 600) {
    const sim_case s = {CLFFN_ACT_GELU, 1, CLFFN_LAYOUT_OUT_IN, 1, 1, 0, 0, 7, 13, 28, 0, 0};
    const clffn_config c = config_of(&s);
    const size_t T = s.T, D = s.D, F = s.F;
    clffn_context *ctx = test_context();
    cl_command_queue q = clffn_context_queue(ctx);
    test_weights w;
    test_weights_make(&w, &c, s.layout, 77);
    float x[7 * 13], dy[7 * 13], y[7 * 13], dx[7 * 13];
    double ry[7 * 13], rdx[7 * 13], rw1[13 * 29], rb1[29], rv[13 * 29], rbv[29], rw2[13 * 29],
        rb2[13];
    fill_uniform(x, T * D, -1.0f, 1.0f, 8);
    fill_uniform(dy, T * D, -1.0f, 1.0f, 9);
    const float *wsrc[6] = {w.w1, w.b1, w.v, w.bv, w.w2, w.b2};
    const size_t wlen[6] = {F * D, F, F * D, F, D * F, D};
    guarded gw[6], gg[6];
    for (int i = 0; i < 6; ++i) {
        gw[i] = guarded_make(ctx, CANARY + 1 + (size_t)i, wlen[i], wsrc[i]);
        gg[i] = guarded_make(ctx, CANARY + 2 + (size_t)i, wlen[i], NULL);
    }
    const clffn_device_weights dw = {{gw[0].mem, gw[0].offset}, {gw[1].mem, gw[1].offset},
                                     {gw[2].mem, gw[2].offset}, {gw[3].mem, gw[3].offset},
                                     {gw[4].mem, gw[4].offset}, {gw[5].mem, gw[5].offset}};
    const clffn_device_weights dg = {{gg[0].mem, gg[0].offset}, {gg[1].mem, gg[1].offset},
                                     {gg[2].mem, gg[2].offset}, {gg[3].mem, gg[3].offset},
                                     {gg[4].mem, gg[4].offset}, {gg[5].mem, gg[5].offset}};
    guarded gx = guarded_make(ctx, CANARY + 3, T * D, x),
            gy = guarded_make(ctx, CANARY + 5, T * D, NULL);
    guarded gdy = guarded_make(ctx, CANARY + 7, T * D, dy);
    guarded gdx = guarded_make(ctx, CANARY + 9, T * D, NULL);

    clffn_ffn *ffn = NULL;
    ASSERT_OK(clffn_ffn_create(ctx, &c, &ffn));
    ASSERT_OK(clffn_ffn_bind_weights(ffn, s.layout, &dw));
    ASSERT_OK(clffn_ffn_set_training(ffn, 1));
    ASSERT_OK(clffn_ffn_set_rng(ffn, 3, 0));
    ASSERT_OK(clffn_forward(ffn, T, gx.mem, gx.offset, gy.mem, gy.offset, q, NULL));
    ASSERT_OK(clffn_backward(ffn, T, gx.mem, gx.offset, gdy.mem, gdy.offset, gdx.mem, gdx.offset,
                             &dg, 0, q, NULL));
    ASSERT_OK(clFinish(q));

    ASSERT_OK(clffn_reference_forward(&c, s.layout, &w.host, T, x, 1, 3, 0, ry, NULL));
    const clffn_ref_grads rg = {rw1, rb1, rv, rbv, rw2, rb2};
    ASSERT_OK(clffn_reference_backward(&c, s.layout, &w.host, T, x, dy, 1, 3, 0, rdx, &rg));
    guarded_read(ctx, &gy, y);
    assert_close(y, ry, T * D, act_rtol(s.act), "device y");
    guarded_read(ctx, &gdx, dx);
    assert_close(dx, rdx, T * D, act_rtol(s.act), "device dx");
    const double *refs[6] = {rw1, rb1, rv, rbv, rw2, rb2};
    static const char *const names[6] = {"dW1", "db1", "dV", "dbv", "dW2", "db2"};
    float got[13 * 29];
    for (int i = 0; i < 6; ++i) {
        guarded_read(ctx, &gg[i], got);
        assert_close(got, refs[i], wlen[i], act_rtol(s.act), names[i]);
        guarded_assert_canaries(ctx, &gg[i], names[i]);
    }
    guarded_assert_canaries(ctx, &gy, "y");
    guarded_assert_canaries(ctx, &gdx, "dx");

    clffn_ffn_destroy(ffn);
    for (int i = 0; i < 6; ++i) { guarded_free(&gw[i]), guarded_free(&gg[i]); }
    guarded_free(&gx), guarded_free(&gy), guarded_free(&gdy), guarded_free(&gdx);
    test_weights_free(&w);
    clffn_context_destroy(ctx);
}

/* dx and the biases' gradients (the matrices' too where they are f32; compressed ones refuse
 * them, test_compressed.c) of ffn's pass over x, against the reference on ts's weights. */
static void typed_backward(const sim_case *s, clffn_dtype t, clffn_ffn *ffn, const float *x,
                           const float *dy, const typed_set *ts, const char *what) {
    const clffn_config c = config_of(s);
    const size_t T = s->T, D = s->D, F = s->F;
    float *dx = malloc(T * D * 4), *gb = malloc((2 * F + D) * 4), *gw = malloc(3 * D * F * 4);
    double *rdx = malloc(T * D * 8), *rw = malloc(3 * D * F * 8), *rb = malloc((2 * F + D) * 8);
    cr_assert(dx && gb && gw && rdx && rw && rb);
    const int f32 = t == CLFFN_DTYPE_F32;
    const clffn_weight_arrays g = {f32 ? gw : NULL,
                                   gb,
                                   f32 && s->gated ? gw + D * F : NULL,
                                   gb + F,
                                   f32 ? gw + 2 * D * F : NULL,
                                   gb + 2 * F};
    ASSERT_OK(clffn_backward_host(ffn, T, x, T * D, dy, T * D, dx, T * D, &g, 0));
    const clffn_ref_grads rg = {rw, rb, rw + D * F, rb + F, rw + 2 * D * F, rb + 2 * F};
    ASSERT_OK(clffn_reference_backward(&c, s->layout, &ts->ref, T, x, dy, 0, 0, 0, rdx, &rg));
    assert_close(dx, rdx, T * D, act_rtol(s->act), what);
    if (s->bias) {
        assert_close(gb, rb, F, act_rtol(s->act), what);
        assert_close(gb + 2 * F, rb + 2 * F, D, act_rtol(s->act), what);
    }
    if (f32) {
        assert_close(gw, rw, D * F, act_rtol(s->act), what);
        assert_close(gw + 2 * D * F, rw + 2 * D * F, D * F, act_rtol(s->act), what);
    }
    free(dx), free(gb), free(gw), free(rdx), free(rw), free(rb);
}

/* Weights in a stored type through clffn's own kernels (kernel_tokens ≥ T, with the few-token
 * shapes wgemv: reductions split across work-items, so the local-memory sums run) or through the
 * dequantizer and SGEMM (kernel_tokens 0, K-blocks of 32; tiles ≥ 0 that form of it, -1 the
 * device's): forward against the reference on the dequantized weights, then, with backward, dx
 * and the gradients (typed_backward). */
static void run_typed_case(const sim_case *s, clffn_dtype t, const size_t wgemv[CLFFN_WGEMV_PARAMS],
                           size_t kernel_tokens, int tiles, int backward) {
    char what[200];
    describe(s, what, sizeof what);
    snprintf(what + strlen(what), sizeof what - strlen(what), " %s kernel_tokens=%zu tiles=%d",
             clffn_dtype_name(t), kernel_tokens, tiles);
    const clffn_config c = config_of(s);
    const size_t T = s->T, D = s->D, F = s->F;
    clffn_context *ctx = test_context();
    ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, t != CLFFN_DTYPE_F32, kernel_tokens));
    ASSERT_OK(clffn_context_set_gemm_k_block(ctx, 32));
    ASSERT_OK(clffn_context_set_gemm_k_block_min_rows(ctx, 0));
    if (wgemv) { ASSERT_OK(clffn_context_set_wgemv(ctx, wgemv)); }
    if (s->fused) { ASSERT_OK(clffn_context_set_fused_epilogues(ctx, 0)); }
    if (tiles >= 0) { ASSERT_OK(clffn_context_set_dequant_tiles(ctx, tiles)); }
    test_weights w;
    test_weights_make(&w, &c, s->layout, 41 + T + D + F);
    typed_set ts;
    typed_make(&ts, &c, &w, t, s->layout);
    float *x = malloc(T * D * 4), *dy = malloc(T * D * 4), *y = malloc(T * D * 4);
    double *ry = malloc(T * D * 8);
    cr_assert(x && dy && y && ry);
    fill_uniform(x, T * D, -1.0f, 1.0f, 15);
    fill_uniform(dy, T * D, -1.0f, 1.0f, 16);
    clffn_ffn *ffn = NULL;
    ASSERT_OK(clffn_ffn_create(ctx, &c, &ffn));
    ASSERT_OK(clffn_ffn_upload_weights_typed(ffn, s->layout, &ts.typed));
    ASSERT_OK(clffn_forward_host(ffn, T, x, T * D, y, T * D));
    ASSERT_OK(clffn_reference_forward(&c, s->layout, &ts.ref, T, x, 0, 0, 0, ry, NULL));
    assert_close(y, ry, T * D, act_rtol(s->act), what);
    if (backward) { typed_backward(s, t, ffn, x, dy, &ts, what); }
    clffn_ffn_destroy(ffn);
    typed_free(&ts);
    test_weights_free(&w);
    free(x), free(dy), free(y), free(ry);
    clffn_context_destroy(ctx);
}

static void run_typed_tiles(const sim_case *s, clffn_dtype t,
                            const size_t wgemv[CLFFN_WGEMV_PARAMS], size_t kernel_tokens,
                            int tiles) {
    run_typed_case(s, t, wgemv, kernel_tokens, tiles, 1);
}

/* The same with the dequantizer's form the device takes; or the forward alone. */
static void run_typed(const sim_case *s, clffn_dtype t, const size_t wgemv[CLFFN_WGEMV_PARAMS],
                      size_t kernel_tokens) {
    run_typed_case(s, t, wgemv, kernel_tokens, -1, 1);
}
static void run_typed_forward(const sim_case *s, clffn_dtype t,
                              const size_t wgemv[CLFFN_WGEMV_PARAMS], size_t kernel_tokens) {
    run_typed_case(s, t, wgemv, kernel_tokens, -1, 0);
}

/* Quantized inputs (clffn_context_set_quantized_inputs): clffn_xquant and clffn_wgemv_rows_qx
 * (q8_0 and q4_0 weights, or bf16 ones), gated, T tokens, D → F, against the reference on the
 * rounded inputs (test_compressed.c), in the kernels' shape wgemv (NULL: the device's). */
static void run_quantized_inputs(clffn_dtype t, size_t T, size_t D, size_t F, const size_t *wgemv) {
    clffn_config c = clffn_config_default(D, F);
    c.gated = 1;
    c.activation = CLFFN_ACT_SILU;
    clffn_context *ctx = test_context();
    ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, 1, CLFFN_MAX_KERNEL_TOKENS));
    ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, CLFFN_KERNELS_QUANTIZED, 32));
    ASSERT_OK(clffn_context_set_quantized_inputs(ctx, 1));
    if (wgemv) { ASSERT_OK(clffn_context_set_wgemv(ctx, wgemv)); }
    test_weights w;
    test_weights_make(&w, &c, CLFFN_LAYOUT_OUT_IN, 43 + T + D + F);
    typed_set ts;
    typed_make(&ts, &c, &w, t, CLFFN_LAYOUT_OUT_IN);
    float *x = malloc(T * D * 4);
    cr_assert(x);
    fill_uniform(x, T * D, -1.0f, 1.0f, 17);
    clffn_ffn *ffn = NULL;
    ASSERT_OK(clffn_ffn_create(ctx, &c, &ffn));
    ASSERT_OK(clffn_ffn_upload_weights_typed(ffn, CLFFN_LAYOUT_OUT_IN, &ts.typed));
    char what[96];
    snprintf(what, sizeof what, "quantized inputs %s T=%zu D=%zu F=%zu", clffn_dtype_name(t), T, D,
             F);
    assert_quantized_forward(ffn, &c, &ts, T, x, 0, what);
    clffn_ffn_destroy(ffn);
    typed_free(&ts);
    test_weights_free(&w);
    free(x);
    clffn_context_destroy(ctx);
}

ParameterizedTestParameters(oclgrind, typed_passes) {
    static int types[CLFFN_DTYPE_COUNT_];
    for (int t = 0; t < CLFFN_DTYPE_COUNT_; ++t) { types[t] = t; }
    return cr_make_param_array(int, types, CLFFN_DTYPE_COUNT_);
}

/* Each weight type on both of its paths, in the layouts it takes (each pass runs both GEMV kernels:
 * one in the forward, the other for dx), two shape sets, the few-token products applying the
 * epilogues (Oclgrind is a GPU to clffn, which fuses them there) and once apart, and past 16
 * tokens in passes; the element types also at d_model 13, d_ff 29, whose rows end in scalar
 * tails and whose column groups run past the last column. */
ParameterizedTest(int *type, oclgrind, typed_passes, .timeout = 600) {
    const clffn_dtype t = (clffn_dtype)*type;
    const int q = t == CLFFN_DTYPE_Q8_0 || t == CLFFN_DTYPE_Q4_0; /* out_in only */
    const clffn_layout in_out = q ? CLFFN_LAYOUT_OUT_IN : CLFFN_LAYOUT_IN_OUT;
    static const size_t split[CLFFN_WGEMV_PARAMS] = {4, 2, 8, 4, 2};
    static const size_t wide[CLFFN_WGEMV_PARAMS] = {1, 4, 32, 2, 2};
    const sim_case gated = {CLFFN_ACT_SILU, 1, CLFFN_LAYOUT_OUT_IN, 0, 0, 1, 0, 3, 64, 96, 0, 0};
    const sim_case plain = {CLFFN_ACT_GELU, 0, in_out, 1, 0, 0, 0, 2, 64, 96, 0, 0};
    const sim_case many = {CLFFN_ACT_GELU, 1, in_out, 1, 0, 0, 0, 5, 64, 96, 0, 0};
    /* 9 tokens: the 16-token kernels, whose rows are read 8 values at a time, not 16 */
    const sim_case nine = {CLFFN_ACT_SILU, 1, CLFFN_LAYOUT_OUT_IN, 1, 0, 0, 0, 9, 64, 96, 0, 0};
    /* the epilogues in launches of their own, beside the products that apply them */
    const sim_case apart = {CLFFN_ACT_GELU, 1, CLFFN_LAYOUT_OUT_IN, 1, 0, 0, 0, 3, 64, 96, 0, 1};
    run_typed(&gated, t, split, CLFFN_MAX_KERNEL_TOKENS);
    run_typed(&apart, t, split, CLFFN_MAX_KERNEL_TOKENS);
    run_typed(&plain, t, wide, CLFFN_MAX_KERNEL_TOKENS);
    run_typed(&nine, t, wide, CLFFN_MAX_KERNEL_TOKENS);
    run_typed(&many, t, NULL, 0);
    run_typed_tiles(&many, t, NULL, 0, 0); /* the dequantizer's other form (below) */
    /* 20 tokens: a pass of 16, then one of 4 through the kernels built for 16 (the backward's
     * dx through CLBlast) */
    const sim_case passes = {CLFFN_ACT_SILU, 1, CLFFN_LAYOUT_OUT_IN, 1, 0, 0, 0, 20, 64, 96, 0, 0};
    run_typed(&passes, t, NULL, 32);
    /* a CPU's shape: columns in strips of one work-item each (clffn_wgemv_strip), the rows in
     * two chunks; 163 of them (160 for the quantized types, whose inputs are whole blocks)
     * leave three after the last group of four, which go one at a time */
    static const size_t cpu[CLFFN_WGEMV_PARAMS] = {1, 8, 64, 1, 4};
    const sim_case strips = {CLFFN_ACT_SILU, 1, in_out, 1, 0, 0, 0, 9, 64, q ? 160 : 163, 0, 0};
    run_typed(&strips, t, cpu, CLFFN_MAX_KERNEL_TOKENS);
    /* rows several to a work-item: at 1056 values, x of 3 tokens (the 4-token kernels) and of 5
     * (the 8-token ones) passes CLFFN_DEFAULT_ROW_GROUP_COLS, so W1's rows go in fours, then in
     * threes with the direct sums (Oclgrind is a CPU device; the quantized types in twos); 71
     * rows leave the last four 3 short, the last three 1 short and the last pair 1 short, 1057
     * values a tail */
    const size_t pd = q ? 1056 : 1057, pf = q ? 96 : 71; /* d_model, d_ff */
    const sim_case fours = {CLFFN_ACT_SILU, 1, CLFFN_LAYOUT_OUT_IN, 1, 0, 0, 0, 3, pd, pf, 0, 0};
    const sim_case twos = {CLFFN_ACT_GELU, 0, CLFFN_LAYOUT_OUT_IN, 1, 0, 0, 0, 5, pd, pf, 0, 0};
    run_typed(&fours, t, wide, CLFFN_MAX_KERNEL_TOKENS);
    run_typed(&twos, t, wide, CLFFN_MAX_KERNEL_TOKENS);
    /* 20 tokens on a CPU's shape: both passes in one launch of the 16-token row kernels, W1's
     * rows in threes (the quantized types in twos) in parts of tokens, the second pass's 4
     * tokens one part; x of 288 values a token passes the grouping boundary at 16 tokens. The
     * forward alone: past 16 tokens the backward's products are SGEMMs (over dequantized
     * weights), as in `passes` above, and at this size they took seven eighths of the case's
     * time under the simulator */
    const sim_case cpu_passes = {
        CLFFN_ACT_GELU, 1, CLFFN_LAYOUT_OUT_IN, 1, 0, 0, 0, 20, 288, pf, 0, 0};
    run_typed_forward(&cpu_passes, t, cpu, 32);
    if (q) {
        run_quantized_inputs(t, 1, 96, 160, NULL); /* 3 and 5 blocks: a lone last block */
        run_quantized_inputs(t, 3, 96, 160, NULL);
        run_quantized_inputs(t, 9, 64, 96, NULL);
        run_quantized_inputs(t, 20, 64, 96, NULL);  /* in passes: 16, then 4 */
        run_quantized_inputs(t, 1, 96, 160, split); /* a row's lanes: the GPU form */
        run_quantized_inputs(t, 3, 96, 160, split);
        return;
    }
    if (t == CLFFN_DTYPE_BF16) { /* bf16 inputs: a row's tail, rows in fours, a row's lanes */
        run_quantized_inputs(t, 1, 100, 70, NULL);
        run_quantized_inputs(t, 5, 100, 70, cpu);
        run_quantized_inputs(t, 3, 96, 160, split);
    }
    const sim_case odd = {CLFFN_ACT_RELU, 1, CLFFN_LAYOUT_OUT_IN, 1, 0, 0, 0, 3, 13, 29, 0, 0};
    const sim_case odd_in = {CLFFN_ACT_SILU, 0, CLFFN_LAYOUT_IN_OUT, 1, 0, 0, 0, 3, 13, 29, 0, 0};
    run_typed(&odd, t, split, CLFFN_MAX_KERNEL_TOKENS);
    run_typed(&odd_in, t, wide, CLFFN_MAX_KERNEL_TOKENS);
    run_typed(&odd_in, t, cpu, CLFFN_MAX_KERNEL_TOKENS);
    /* the dequantizer's two transposing forms, tiles of 32 rows by 64 columns of W in local
     * memory and of 8 x 8 a work-item, on part tiles and K-blocks past the first */
    run_typed_tiles(&odd, t, NULL, 0, 0);
    run_typed_tiles(&odd, t, NULL, 0, 1);
}

/* The first epilogue in the first product's kernel with W1 and V bound apart, each at an offset
 * ≠ 0 in a buffer with canaries (the kernel reads V's rows from V's buffer): f32 on clffn's
 * kernels, kept [out, in], inference, with a row's lanes side by side and one lane a row; y
 * against the reference, and both fusions checked to have run. One FFN runs 1 token, then 3:
 * the host-level forward's x and y buffers are replaced in between (docs/RELIABILITY.md). */
static void fused_gate_apart(const size_t wgemv[CLFFN_WGEMV_PARAMS]) {
    const sim_case s = {CLFFN_ACT_SILU, 1, CLFFN_LAYOUT_OUT_IN, 1, 0, 0, 0, 3, 13, 29, 0, 0};
    const clffn_config c = config_of(&s);
    const size_t D = s.D, F = s.F;
    test_weights w;
    test_weights_make(&w, &c, s.layout, 78);
    const float *wsrc[6] = {w.w1, w.b1, w.v, w.bv, w.w2, w.b2};
    const size_t wlen[6] = {F * D, F, F * D, F, D * F, D};
    clffn_context *ctx = test_context();
    ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, 0, CLFFN_MAX_KERNEL_TOKENS));
    ASSERT_OK(clffn_context_set_wgemv(ctx, wgemv));
    ASSERT_OK(clffn_context_set_fused_epilogues(ctx, 1));
    guarded gw[6];
    for (int i = 0; i < 6; ++i) {
        gw[i] = guarded_make(ctx, CANARY + 3 + (size_t)i, wlen[i], wsrc[i]);
    }
    const clffn_device_weights dw = {{gw[0].mem, gw[0].offset}, {gw[1].mem, gw[1].offset},
                                     {gw[2].mem, gw[2].offset}, {gw[3].mem, gw[3].offset},
                                     {gw[4].mem, gw[4].offset}, {gw[5].mem, gw[5].offset}};
    clffn_ffn *ffn = NULL;
    ASSERT_OK(clffn_ffn_create(ctx, &c, &ffn));
    ASSERT_OK(clffn_ffn_bind_weights(ffn, CLFFN_LAYOUT_OUT_IN, &dw));
    for (size_t T = 1; T <= 3; T += 2) {
        float x[3 * 13], y[3 * 13];
        double ry[3 * 13];
        fill_uniform(x, T * D, -1.0f, 1.0f, 10 + T);
        ASSERT_OK(clffn_forward_host(ffn, T, x, T * D, y, T * D));
        cr_assert(ffn->last_fused.first && ffn->last_fused.second, "T %zu", T);
        ASSERT_OK(clffn_reference_forward(&c, s.layout, &w.host, T, x, 0, 0, 0, ry, NULL));
        assert_close(y, ry, T * D, act_rtol(s.act), "fused, V apart");
    }
    for (int i = 0; i < 6; ++i) {
        guarded_assert_canaries(ctx, &gw[i], "a weight");
        guarded_free(&gw[i]);
    }
    clffn_ffn_destroy(ffn);
    test_weights_free(&w);
    clffn_context_destroy(ctx);
}

Test(oclgrind, fused_gate_apart, .timeout = 600) {
    static const size_t shapes[2][CLFFN_WGEMV_PARAMS] = {{4, 2, 8, 4, 2}, {1, 8, 64, 1, 4}};
    fused_gate_apart(shapes[0]);
    fused_gate_apart(shapes[1]);
}

/* Every weight program (type × token bucket) builds with -cl-std=CL1.2, with the reductions
 * split (local memory and barriers in both GEMVs) and without. */
Test(oclgrind, every_weight_program_builds_as_cl12, .timeout = 600) {
    clffn_context *ctx = test_context();
    static const clffn_wgemv_params shapes[2] = {{1, 8, 64, 1, 4}, {4, 2, 8, 4, 2}};
    for (int t = 0; t < CLFFN_DTYPE_COUNT_; ++t) {
        for (int tokens = 1; tokens <= (int)CLFFN_MAX_KERNEL_TOKENS; tokens *= 2) {
            for (int sh = 0; sh < 2; ++sh) {
                const clffn_program_key key = {
                    .weights = 1 + t, .tokens = tokens, .wgemv = shapes[sh]};
                cl_program p = NULL;
                ASSERT_OK(clffn__get_program(&ctx->programs, &key, &p));
                cr_assert(p != NULL, "%s, %d tokens", clffn_dtype_name((clffn_dtype)t), tokens);
            }
        }
    }
    clffn_context_destroy(ctx);
}

/* Every epilogue program (activation × gated × dropout) builds with -cl-std=CL1.2 on a device
 * that is OpenCL 1.2 and nothing more. */
Test(oclgrind, every_program_builds_as_cl12, .timeout = 600) {
    clffn_context *ctx = test_context();
    for (int a = 0; a < CLFFN_ACT_COUNT_; ++a) {
        for (int k = 0; k < 4; ++k) {
            const clffn_program_key key = {.activation = a, .gated = k & 1, .dropout = k >> 1};
            cl_program p = NULL;
            ASSERT_OK(clffn__get_program(&ctx->programs, &key, &p));
            cr_assert(p != NULL);
        }
    }
    clffn_context_destroy(ctx);
}

/* The kernels use core OpenCL 1.2 only: no extension enabled, no double anywhere (no device is
 * required to have cl_khr_fp64 or cl_khr_fp16), and half only as the pointer vload_half reads
 * through, which core 1.2 allows without the extension. */
static void assert_code_core_cl12(const char *src, const char *what) {
    static const char *const banned[] = {"OPENCL EXTENSION", "cl_khr_", "double", "half"};
    for (size_t i = 0; i < sizeof banned / sizeof banned[0]; ++i) {
        const size_t n = strlen(banned[i]);
        for (const char *p = strstr(src, banned[i]); p; p = strstr(p + 1, banned[i])) {
            /* the types as whole words ("halfway" is none); the others anywhere */
            const int part_of_word = (p > src && (isalnum((unsigned char)p[-1]) || p[-1] == '_')) ||
                                     isalnum((unsigned char)p[n]) || p[n] == '_';
            const int half_pointer = i == 3 && !strncmp(p + n, " *", 2);
            const int is_type = i >= 2;
            cr_assert(is_type && (part_of_word || half_pointer), "%s uses '%s': %.60s", what,
                      banned[i], p);
        }
    }
}

/* The same over the code alone: comments, which may well speak of halves, blanked out. */
static void assert_core_cl12(const char *src, const char *what) {
    char *code = strdup(src);
    cr_assert(code != NULL);
    for (char *p = code; *p;) {
        if (p[0] == '/' && p[1] == '/') {
            while (*p && *p != '\n') { *p++ = ' '; }
        } else if (p[0] == '/' && p[1] == '*') {
            char *end = strstr(p + 2, "*/");
            cr_assert(end != NULL, "%s: an unclosed comment", what);
            while (p < end + 2) { *p++ = ' '; }
        } else {
            ++p;
        }
    }
    assert_code_core_cl12(code, what);
    free(code);
}

Test(oclgrind, kernels_use_core_cl12_only) {
    char *src = NULL;
    ASSERT_OK(clffn__kernel_source(NULL, &src));
    assert_core_cl12(src, "the epilogue program");
    cr_assert(strstr(src, "half *") == NULL, "the epilogue program needs no half pointer");
    free(src);
    ASSERT_OK(clffn__kernel_source("weights.cl", &src));
    assert_core_cl12(src, "weights.cl");
    cr_assert(strstr(src, "vload_half") != NULL);
    free(src);
}

/* A mixture-of-experts layer's kernels, forward and backward (cl/moe.cl): 4 experts, k = 2, a
 * shared expert of its own width behind the router's gate row (R = E + 1 rows) and a router
 * bias, odd widths; x and the router in steps of 1/16 so every logit is exact and the choice is
 * the reference's. 40 tokens (80 choices: route, count and place apart, and the count and place
 * kernels' lanes take runs of 2 and some none) and 3 (6 choices: the three in one work-group,
 * clffn_moe_route_few), each with the counts read back (f32 on CLBlast, the rows packed), then
 * kept on the device (f32 on clffn's own kernels, each expert's launched for all T rows and
 * reading its count; the backward then routes again). At 3 tokens the router's logits take a
 * CPU's form (clffn_moe_logits_rows: a work-item a logit, their count rounded up). */
typedef struct moe_ocl_case {
    int counted;
    size_t tokens;
} moe_ocl_case;

ParameterizedTestParameters(oclgrind, moe_forward_backward) {
    static moe_ocl_case cases[] = {{0, 40}, {1, 40}, {0, 3}, {1, 3}};
    return cr_make_param_array(moe_ocl_case, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(moe_ocl_case *mc, oclgrind, moe_forward_backward, .timeout = 600) {
    clffn_context *ctx = test_context();
    ASSERT_OK(
        clffn_context_set_kernel_max_tokens(ctx, 0, mc->counted ? CLFFN_MAX_KERNEL_TOKENS : 0));
    enum { TMAX = 40, E = 4, R = E + 1, D = 13, F = 29, FS = 21 };
    const size_t T = mc->tokens;
    clffn_moe_config c = clffn_moe_config_default(D, F, E, 2);
    c.shared_expert = 1, c.router_bias = 1, c.shared_gate = 1, c.shared_d_ff = FS;
    clffn_config sc = c.expert;
    sc.d_ff = FS;
    float x[TMAX * D], router[R * D], bias[R] = {0.5f, -0.25f, 0.0f, 0.125f, -0.5f}, y[TMAX * D];
    for (size_t i = 0; i < T * D; ++i) { x[i] = (float)((int)((i * 7) % 33) - 16) / 16.0f; }
    for (size_t i = 0; i < R * D; ++i) { router[i] = (float)((int)((i * 5) % 17) - 8) / 16.0f; }
    test_weights w[E + 1];
    clffn_host_weights hw[E + 1];
    clffn_moe *moe = NULL;
    ASSERT_OK(clffn_moe_create(ctx, &c, &moe));
    ASSERT_OK(clffn_moe_set_grouping(moe, 0)); /* experts apart: oclgrind_grouped below */
    moe->router_items = T < TMAX;
    ASSERT_OK(clffn_moe_upload_router(moe, router, bias));
    for (size_t e = 0; e <= E; ++e) {
        test_weights_make(&w[e], e < E ? &c.expert : &sc, CLFFN_LAYOUT_OUT_IN, 40 + e);
        hw[e] = w[e].host;
        ASSERT_OK(clffn_ffn_upload_weights(clffn_moe_expert(moe, e), CLFFN_LAYOUT_OUT_IN, &hw[e]));
    }
    int32_t ch[TMAX * 2], rch[TMAX * 2];
    double ref[TMAX * D];
    ASSERT_OK(clffn_moe_forward_host(moe, T, x, T * D, y, T * D, ch, NULL));
    ASSERT_OK(clffn_moe_reference_forward(&c, CLFFN_LAYOUT_OUT_IN, router, bias, hw, T, x, ref, rch,
                                          NULL));
    cr_assert(!memcmp(ch, rch, T * 2 * sizeof *ch), "the choice differs from the reference's");
    assert_close(y, ref, T * D, TOL_RTOL, "moe on Oclgrind");
    /* the backward's kernels: dx and the router's gradients (the experts' own are the FFN's) */
    float dy[TMAX * D], dx[TMAX * D], rg[R * D], rbg[R];
    double rdx[TMAX * D], rrg[R * D], rrbg[R];
    fill_uniform(dy, T * D, -1.0f, 1.0f, 3);
    ASSERT_OK(clffn_moe_backward_host(moe, T, dy, T * D, dx, T * D, rg, rbg, NULL, 0));
    ASSERT_OK(clffn_moe_reference_backward(&c, CLFFN_LAYOUT_OUT_IN, router, bias, hw, T, x, dy, rdx,
                                           rrg, rrbg, NULL));
    assert_close(dx, rdx, T * D, TOL_RTOL, "moe dx on Oclgrind");
    assert_close(rg, rrg, R * D, TOL_RTOL, "moe router gradient on Oclgrind");
    assert_close(rbg, rrbg, R, TOL_RTOL, "moe router bias gradient on Oclgrind");
    for (size_t e = 0; e <= E; ++e) { test_weights_free(&w[e]); }
    clffn_moe_destroy(moe);
    clffn_context_destroy(ctx);
}

/* Grouped experts (clffn_moe_experts_grouped): a layer's experts in one launch a stage, their
 * weights in the layer's pools, every expert kernel with its expert's offsets and the launch's
 * list of experts with rows (1 token, top-2 of 4: two steps; 3 tokens: all four), and past a
 * pass (20 tokens) the experts' rows in tiles of 16, a step a tile (clffn_moe_tiles). The layer's
 * outputs must be the bits of the same layer with grouping off, and, but with quantized inputs,
 * the double reference's. ctest runs these without --uninitialized (oclgrind_grouped): Oclgrind
 * 21.10 takes memory written through a sub-buffer for uninitialized (docs/RELIABILITY.md); races,
 * out-of-bounds accesses and API misuse are still reported. Each case: the weights' type and
 * layout, quantized inputs, and the kernels' shape. */
typedef struct grouped_case {
    clffn_dtype dtype;
    clffn_layout layout;
    int qx;
    int cpu; /* the kernels in a CPU's shape (else the device's) */
} grouped_case;

static void run_grouped(const grouped_case *g) {
    enum { E = 4, K = 2, D = 64, F = 96 };
    clffn_context *ctx = test_context();
    for (int k = 0; k < 4; ++k) { /* clffn's kernels at every count: tiles past a pass */
        ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, k, (size_t)1 << 30));
    }
    ASSERT_OK(clffn_context_set_quantized_inputs(ctx, g->qx));
    static const size_t cpu[5] = {1, 8, 64, 1, 4};
    if (g->cpu) { ASSERT_OK(clffn_context_set_wgemv(ctx, cpu)); }
    clffn_moe_config c = clffn_moe_config_default(D, F, E, K);
    c.expert.bias1 = c.expert.bias_gate = c.expert.bias2 = 1;
    float router[E * D];
    fill_uniform(router, E * D, -0.5f, 0.5f, 5);
    test_weights w[E];
    typed_set ts[E];
    clffn_host_weights ref[E];
    clffn_moe *moe[2];
    for (size_t e = 0; e < E; ++e) {
        test_weights_make(&w[e], &c.expert, g->layout, 60 + e);
        if (g->dtype != CLFFN_DTYPE_F32) {
            typed_make(&ts[e], &c.expert, &w[e], g->dtype, g->layout);
        }
        ref[e] = g->dtype != CLFFN_DTYPE_F32 ? ts[e].ref : w[e].host;
    }
    for (int i = 0; i < 2; ++i) {
        ASSERT_OK(clffn_moe_create(ctx, &c, &moe[i]));
        ASSERT_OK(clffn_moe_set_grouping(moe[i], i == 0));
        moe[i]->group.tiles_any_type = true; /* the tiles over every type, not the blocks' alone */
        ASSERT_OK(clffn_moe_upload_router(moe[i], router, NULL));
        for (size_t e = 0; e < E; ++e) {
            clffn_ffn *f = clffn_moe_expert(moe[i], e);
            ASSERT_OK(g->dtype != CLFFN_DTYPE_F32
                          ? clffn_ffn_upload_weights_typed(f, g->layout, &ts[e].typed)
                          : clffn_ffn_upload_weights(f, g->layout, &w[e].host));
        }
    }
    static const size_t tokens[3] = {1, 3, 20};
    for (size_t ti = 0; ti < 3; ++ti) {
        const size_t T = tokens[ti];
        float x[20 * D], y[2][20 * D];
        double r[20 * D];
        fill_uniform(x, T * D, -1.0f, 1.0f, 7 + T);
        for (int i = 0; i < 2; ++i) {
            ASSERT_OK(clffn_moe_forward_host(moe[i], T, x, T * D, y[i], T * D, NULL, NULL));
            cr_assert_eq(clffn_moe_experts_grouped(moe[i]), i == 0, "layer %d", i);
            cr_assert_eq(clffn_moe_counts_kept(moe[i]), i == 0 || T <= 16, "layer %d", i);
        }
        char what[96];
        snprintf(what, sizeof what, "grouped %s %s qx=%d cpu=%d T=%zu", clffn_dtype_name(g->dtype),
                 g->layout == CLFFN_LAYOUT_OUT_IN ? "out_in" : "in_out", g->qx, g->cpu, T);
        cr_assert(!memcmp(y[0], y[1], T * D * sizeof(float)), "%s: not the ungrouped bits", what);
        if (!g->qx) {
            ASSERT_OK(
                clffn_moe_reference_forward(&c, g->layout, router, NULL, ref, T, x, r, NULL, NULL));
            assert_close(y[0], r, T * D, TOL_RTOL, what);
        }
    }
    for (size_t e = 0; e < E; ++e) {
        if (g->dtype != CLFFN_DTYPE_F32) { typed_free(&ts[e]); }
        test_weights_free(&w[e]);
    }
    clffn_moe_destroy(moe[0]), clffn_moe_destroy(moe[1]);
    clffn_context_destroy(ctx);
}

ParameterizedTestParameters(oclgrind_grouped, moe) {
    static grouped_case cases[] = {
        {CLFFN_DTYPE_F32, CLFFN_LAYOUT_OUT_IN, 0, 0},
        {CLFFN_DTYPE_F16, CLFFN_LAYOUT_OUT_IN, 0, 0},
        {CLFFN_DTYPE_F16, CLFFN_LAYOUT_IN_OUT, 0, 1}, /* the column kernels, in chunks */
        {CLFFN_DTYPE_Q8_0, CLFFN_LAYOUT_OUT_IN, 1, 0},
        {CLFFN_DTYPE_Q4_0, CLFFN_LAYOUT_OUT_IN, 1, 1},
    };
    return cr_make_param_array(grouped_case, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(grouped_case *g, oclgrind_grouped, moe, .timeout = 600) { run_grouped(g); }
