/* Epilogues applied by the few-token row products' kernels (clffn_context_set_fused_epilogues,
 * cl/weights.cl's clffn_wgemv_rows_ep/_act/_glu): the same bits as the epilogues' own launches
 * for every weight type, activation, bias flag, gating and token bucket, in the kernels' CPU
 * and GPU shapes; the hidden tensors and the backward after such a forward; which products
 * fuse and which keep their launches; stage times; and a mixture-of-experts layer's experts. */
#include "clffn_defs.h"
#include "common.h" /* with internal.h: ffn->last_fused, which epilogues a forward fused */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The kernels' shapes: the device's own (NULL), a GPU's (a row's 32 lanes side by side, 4 rows
 * a work-group), lanes in 8s with 6 rows a work-group (3 of W1 and 3 of V), and one lane a row
 * in groups of 3, where a gated first layer cannot pair its rows and keeps its launch. */
static const size_t SHAPES[4][CLFFN_WGEMV_PARAMS] = {
    {0}, {32, 4, 8, 16, 8}, {8, 6, 8, 32, 4}, {1, 3, 64, 1, 4}};
enum { N_SHAPES = 4 };

/* A context whose own kernels take every type up to 16 tokens, in SHAPES[sh] (0: the
 * device's), fusing epilogues (the tests turn it off and on again on one context, which takes
 * effect on the next forward: one context's programs serve both ways). */
static clffn_context *shaped_context(int sh) {
    clffn_context *ctx = test_context();
    ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, 0, CLFFN_MAX_KERNEL_TOKENS));
    ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, 1, CLFFN_MAX_KERNEL_TOKENS));
    ASSERT_OK(clffn_context_set_weight_layout(ctx, CLFFN_LAYOUT_OUT_IN));
    if (sh) { ASSERT_OK(clffn_context_set_wgemv(ctx, SHAPES[sh])); }
    ASSERT_OK(clffn_context_set_fused_epilogues(ctx, 1));
    cr_assert_eq(clffn_context_fused_epilogues(ctx), 1);
    /* rows one a work-item at every count here (x of at most 1024 floats), whatever the device's
     * profile groups them from: grouped rows take no epilogue, and same_bits expects fusing */
    ASSERT_OK(clffn_context_set_row_group_cols(ctx, CLFFN_DEFAULT_ROW_GROUP_COLS));
    return ctx;
}

/* One forward's outputs: y and the hidden tensors. */
typedef struct outputs {
    float *y, *pre, *gate, *out;
} outputs;

static void outputs_free(outputs *o) { free(o->y), free(o->pre), free(o->gate), free(o->out); }

/* T tokens of x through ffn, y and the hidden tensors read back. */
static outputs run(clffn_ffn *ffn, const clffn_config *c, size_t T, const float *x) {
    const size_t D = c->d_model, F = c->d_ff;
    outputs o = {malloc(T * D * 4), malloc(T * F * 4), malloc(T * F * 4), malloc(T * F * 4)};
    cr_assert(o.y && o.pre && o.gate && o.out);
    ASSERT_OK(clffn_forward_host(ffn, T, x, T * D, o.y, T * D));
    ASSERT_OK(clffn_ffn_read_hidden(ffn, CLFFN_HIDDEN_PRE, o.pre, T * F, NULL));
    ASSERT_OK(clffn_ffn_read_hidden(ffn, CLFFN_HIDDEN_OUT, o.out, T * F, NULL));
    if (c->gated) { ASSERT_OK(clffn_ffn_read_hidden(ffn, CLFFN_HIDDEN_GATE, o.gate, T * F, NULL)); }
    return o;
}

/* A config of D → F with the activation, gating and bias flags given (bias: b1, bv, b2 bits),
 * no dropout. */
static clffn_config config_of(size_t D, size_t F, clffn_activation a, int gated, int bias) {
    clffn_config c = clffn_config_default(D, F);
    c.activation = a;
    c.gated = gated;
    c.bias1 = bias & 1, c.bias_gate = (bias >> 1) & 1, c.bias2 = (bias >> 2) & 1;
    c.dropout = 0.0f;
    return c;
}

/* An FFN of config c on ctx with weights w in type t (kept [out, in]). */
static clffn_ffn *make_ffn(clffn_context *ctx, const clffn_config *c, clffn_dtype t,
                           const test_weights *w, typed_set *s) {
    clffn_ffn *ffn = NULL;
    ASSERT_OK(clffn_ffn_create(ctx, c, &ffn));
    if (t == CLFFN_DTYPE_F32) {
        ASSERT_OK(clffn_ffn_upload_weights(ffn, CLFFN_LAYOUT_OUT_IN, &w->host));
    } else {
        typed_make(s, c, w, t, CLFFN_LAYOUT_OUT_IN);
        ASSERT_OK(clffn_ffn_upload_weights_typed(ffn, CLFFN_LAYOUT_OUT_IN, &s->typed));
    }
    return ffn;
}

/* Config c in type t on ctx (kernels in SHAPES[sh]), at each of the token counts, the context
 * fusing and then not: the same bits in y and every hidden tensor, y the double reference's,
 * and the products fused where they should: the second always (one lane a row or lanes side by
 * side, no residual), the first unless gated in a shape with an odd number of rows a
 * work-group. */
static void same_bits(clffn_context *ctx, const clffn_config *c, clffn_dtype t, int sh,
                      const size_t *tokens, size_t n_tokens) {
    const size_t D = c->d_model, F = c->d_ff;
    test_weights w;
    test_weights_make(&w, c, CLFFN_LAYOUT_OUT_IN, 3 + D + F + (uint64_t)t);
    typed_set s;
    clffn_ffn *ffn = make_ffn(ctx, c, t, &w, &s);
    const clffn_host_weights *ref = t == CLFFN_DTYPE_F32 ? &w.host : &s.ref;
    const int first = !c->gated || SHAPES[sh][1] % 2 == 0;
    for (size_t i = 0; i < n_tokens; ++i) {
        const size_t T = tokens[i];
        char what[160];
        snprintf(what, sizeof what, "%s %s%s bias=%d%d%d shape %d, %zu -> %zu, %zu tokens",
                 clffn_dtype_name(t), clffn_activation_name(c->activation),
                 c->gated ? " gated" : "", c->bias1, c->bias_gate, c->bias2, sh, D, F, T);
        float *x = malloc(T * D * sizeof *x);
        double *r = malloc(T * D * sizeof *r);
        cr_assert(x && r);
        fill_uniform(x, T * D, -1.0f, 1.0f, 100 + T);
        outputs o[2];
        for (int k = 0; k < 2; ++k) {
            ASSERT_OK(clffn_context_set_fused_epilogues(ctx, k == 0));
            o[k] = run(ffn, c, T, x);
            cr_assert_eq(ffn->last_fused.first, k == 0 && first, "%s: first fused?", what);
            cr_assert_eq(ffn->last_fused.second, k == 0, "%s: second fused?", what);
        }
        cr_assert(!memcmp(o[0].y, o[1].y, T * D * 4), "%s: y differs", what);
        cr_assert(!memcmp(o[0].pre, o[1].pre, T * F * 4), "%s: x·W1 + b1 differs", what);
        cr_assert(!memcmp(o[0].out, o[1].out, T * F * 4), "%s: h differs", what);
        if (c->gated) {
            cr_assert(!memcmp(o[0].gate, o[1].gate, T * F * 4), "%s: x·V + bv differs", what);
        }
        ASSERT_OK(clffn_reference_forward(c, CLFFN_LAYOUT_OUT_IN, ref, T, x, 0, 0, 0, r, NULL));
        assert_mostly_nonzero(r, T * D, 0.9, what);
        assert_close(o[0].y, r, T * D, act_rtol(c->activation), what);
        outputs_free(&o[0]), outputs_free(&o[1]);
        free(x), free(r);
    }
    clffn_ffn_destroy(ffn);
    if (t != CLFFN_DTYPE_F32) { typed_free(&s); }
    test_weights_free(&w);
}

ParameterizedTestParameters(fused, every_type) {
    static int types[CLFFN_DTYPE_COUNT_];
    for (int t = 0; t < CLFFN_DTYPE_COUNT_; ++t) { types[t] = t; }
    return cr_make_param_array(int, types, CLFFN_DTYPE_COUNT_);
}

/* Each type at one token, in a GPU's shape (a row's lanes side by side) and the device's:
 * gated (SiLU, every bias), plain (GELU, b1 and b2), and 45 → 70 (96 → 160 quantized), rows
 * that end in a tail (the element types) and last work-groups that are part empty. The
 * epilogues' code is the same for every type (the sums are clffn_row_sums', which
 * test_compressed checks for each); the shapes and token counts go through f16 below. Each
 * weight program counts on Mesa's rusticl, where a build takes seconds. */
ParameterizedTest(int *type, fused, every_type, .timeout = 600) {
    const clffn_dtype t = (clffn_dtype)*type;
    const int q = t == CLFFN_DTYPE_Q8_0 || t == CLFFN_DTYPE_Q4_0;
    static const size_t one[] = {1};
    const clffn_config gated = config_of(64, 96, CLFFN_ACT_SILU, 1, 7);
    const clffn_config plain = config_of(64, 96, CLFFN_ACT_GELU, 0, 5);
    const clffn_config odd = config_of(q ? 96 : 45, q ? 160 : 70, CLFFN_ACT_SILU, 1, 3);
    for (int sh = 1; sh >= 0; --sh) {
        clffn_context *ctx = shaped_context(sh);
        same_bits(ctx, &gated, t, sh, one, 1);
        same_bits(ctx, &plain, t, sh, one, 1);
        same_bits(ctx, &odd, t, sh, one, 1);
        clffn_context_destroy(ctx);
    }
}

/* f16 in every shape: at 1, 3 and 16 tokens (the 1-, 4- and 16-token kernels: 16 values a
 * vector, then 8) in the device's shape and a GPU's, 1 and 3 with 3 + 3 rows a work-group, and
 * 1 with an odd row count, where the gated first layer keeps its epilogue apart. On rusticl's
 * llvmpipe on a 2-core AVX2 host, with Mesa's shader cache cold and a second suite beside it,
 * this ran past 600 s. */
Test(fused, every_shape, .timeout = 1200) {
    static const size_t tokens[] = {1, 3, 16};
    const clffn_config gated = config_of(64, 96, CLFFN_ACT_SILU, 1, 7);
    const clffn_config plain = config_of(64, 96, CLFFN_ACT_GELU, 0, 5);
    const clffn_config odd = config_of(45, 70, CLFFN_ACT_SILU, 1, 3);
    static const size_t counts[N_SHAPES] = {3, 3, 2, 1};
    for (int sh = 0; sh < N_SHAPES; ++sh) {
        clffn_context *ctx = shaped_context(sh);
        same_bits(ctx, &gated, CLFFN_DTYPE_F16, sh, tokens, counts[sh]);
        same_bits(ctx, &plain, CLFFN_DTYPE_F16, sh, tokens, 1);
        same_bits(ctx, &odd, CLFFN_DTYPE_F16, sh, tokens, counts[sh] < 2 ? counts[sh] : 2);
        clffn_context_destroy(ctx);
    }
}

/* Every activation, plain and gated, the biases each way, at one token in a GPU's shape and
 * the device's: the kernels choose the activation at run time, from the same expressions as
 * the epilogue programs built for each. */
Test(fused, every_activation, .timeout = 600) {
    static const size_t one[] = {1};
    clffn_context *ctx[2] = {shaped_context(1), shaped_context(0)};
    for (int a = 0; a < CLFFN_ACT_COUNT_; ++a) {
        for (int gated = 0; gated < 2; ++gated) {
            const clffn_config c = config_of(64, 40, (clffn_activation)a, gated, a % 2 ? 7 : 0);
            same_bits(ctx[0], &c, CLFFN_DTYPE_F16, 1, one, 1);
            same_bits(ctx[1], &c, CLFFN_DTYPE_F16, 0, one, 1);
        }
    }
    clffn_context_destroy(ctx[0]), clffn_context_destroy(ctx[1]);
}

/* Training without dropout keeps both fusions, and the backward after such a forward (which
 * reads z and h) gives the gradients of the one after an unfused forward, to the bit: dx,
 * every weight's and every bias's. */
Test(fused, backward_after_a_fused_forward, .timeout = 300) {
    enum { T = 3, D = 64, F = 48, NW = D * F };
    const clffn_config c = config_of(D, F, CLFFN_ACT_GELU_TANH, 1, 7);
    test_weights w;
    test_weights_make(&w, &c, CLFFN_LAYOUT_OUT_IN, 77);
    static float x[T * D], dy[T * D], y[T * D], dx[2][T * D], g[2][3 * NW + 2 * F + D];
    fill_uniform(x, T * D, -1.0f, 1.0f, 1);
    fill_uniform(dy, T * D, -1.0f, 1.0f, 2);
    clffn_context *ctx = shaped_context(1);
    clffn_ffn *ffn = make_ffn(ctx, &c, CLFFN_DTYPE_F32, &w, NULL);
    ASSERT_OK(clffn_ffn_set_training(ffn, 1));
    for (int i = 0; i < 2; ++i) {
        ASSERT_OK(clffn_context_set_fused_epilogues(ctx, i == 0));
        ASSERT_OK(clffn_forward_host(ffn, T, x, T * D, y, T * D));
        cr_assert_eq(ffn->last_fused.first && ffn->last_fused.second, i == 0);
        float *p = g[i];
        const clffn_weight_arrays ga = {p,          p + 3 * NW,        p + NW, p + 3 * NW + F,
                                        p + 2 * NW, p + 3 * NW + 2 * F};
        ASSERT_OK(clffn_backward_host(ffn, T, x, T * D, dy, T * D, dx[i], T * D, &ga, 0));
    }
    clffn_ffn_destroy(ffn);
    clffn_context_destroy(ctx);
    cr_assert(!memcmp(dx[0], dx[1], sizeof dx[0]), "dx differs");
    cr_assert(!memcmp(g[0], g[1], sizeof g[0]), "the gradients differ");
    double nz[3 * NW];
    for (size_t k = 0; k < 3 * NW; ++k) { nz[k] = g[0][k]; }
    assert_mostly_nonzero(nz, 3 * NW, 0.9, "the weights' gradients");
    test_weights_free(&w);
}

/* A case of which_products_fuse: the context's setting beside the shapes, the FFN's config and
 * type, tokens, and whether W1 and V are bound apart. */
typedef struct fuse_case {
    const char *what;
    clffn_config c;
    clffn_dtype t;
    size_t T;
    int sh;           /* SHAPES */
    int kernel_max;   /* the kernels' crossover for the type (0: 16) */
    int qx;           /* quantized inputs */
    clffn_layout lay; /* the layout the weights are kept in */
    int apart;        /* W1 and V bound as separate buffers */
    int first, second;
} fuse_case;

/* c's FFN on ctx, its weights w uploaded, or bound from buffers of its own (W1 and V apart). */
static clffn_ffn *case_ffn(clffn_context *ctx, const fuse_case *k, const test_weights *w,
                           typed_set *s, cl_mem bound[6]) {
    if (!k->apart) { return make_ffn(ctx, &k->c, k->t, w, s); }
    const clffn_config *c = &k->c;
    const size_t D = c->d_model, F = c->d_ff;
    const float *src[6] = {w->w1, w->b1, w->v, w->bv, w->w2, w->b2};
    const size_t len[6] = {D * F, F, D * F, F, D * F, D};
    clffn_buffer b[6];
    for (int i = 0; i < 6; ++i) {
        cl_int err;
        bound[i] = clCreateBuffer(ctx->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                  len[i] * sizeof(float), (void *)src[i], &err);
        cr_assert_eq(err, CL_SUCCESS);
        b[i].mem = bound[i], b[i].offset = 0;
    }
    const clffn_device_weights dw = {b[0], b[1], b[2], b[3], b[4], b[5]};
    clffn_ffn *ffn = NULL;
    ASSERT_OK(clffn_ffn_create(ctx, c, &ffn));
    ASSERT_OK(clffn_ffn_bind_weights(ffn, CLFFN_LAYOUT_OUT_IN, &dw));
    return ffn;
}

/* The case's forward on a fusing context and on one that does not: which epilogues fused, and
 * the same y and h either way. */
static void check_case(const fuse_case *k) {
    const clffn_config *c = &k->c;
    const size_t T = k->T, D = c->d_model, F = c->d_ff;
    test_weights w;
    test_weights_make(&w, c, CLFFN_LAYOUT_OUT_IN, 5 + D);
    float *x = malloc(T * D * sizeof *x);
    cr_assert(x);
    fill_uniform(x, T * D, -1.0f, 1.0f, 9);
    outputs o[2];
    clffn_context *ctx = shaped_context(k->sh);
    if (k->kernel_max) { /* with quantized inputs or without */
        ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, k->t != CLFFN_DTYPE_F32,
                                                      (size_t)k->kernel_max));
        ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, CLFFN_KERNELS_QUANTIZED,
                                                      (size_t)k->kernel_max));
    }
    ASSERT_OK(clffn_context_set_quantized_inputs(ctx, k->qx));
    ASSERT_OK(clffn_context_set_weight_layout(ctx, k->lay));
    typed_set s;
    cl_mem bound[6] = {NULL};
    clffn_ffn *ffn = case_ffn(ctx, k, &w, &s, bound);
    if (c->dropout > 0) { ASSERT_OK(clffn_ffn_set_training(ffn, 1)); }
    for (int i = 0; i < 2; ++i) {
        ASSERT_OK(clffn_context_set_fused_epilogues(ctx, i == 0));
        ASSERT_OK(clffn_ffn_set_rng(ffn, 11, 0)); /* both draw the same dropout mask */
        o[i] = run(ffn, c, T, x);
        const clffn_fused f = ffn->last_fused;
        cr_assert_eq(f.first, i == 0 && k->first, "%s: first epilogue fused = %d", k->what,
                     f.first);
        cr_assert_eq(f.second, i == 0 && k->second, "%s: second epilogue fused = %d", k->what,
                     f.second);
    }
    clffn_ffn_destroy(ffn);
    if (!k->apart && k->t != CLFFN_DTYPE_F32) { typed_free(&s); }
    for (int b = 0; b < 6; ++b) {
        if (bound[b]) { clReleaseMemObject(bound[b]); }
    }
    clffn_context_destroy(ctx);
    cr_assert(!memcmp(o[0].y, o[1].y, T * D * 4), "%s: y differs", k->what);
    cr_assert(!memcmp(o[0].out, o[1].out, T * F * 4), "%s: h differs", k->what);
    outputs_free(&o[0]), outputs_free(&o[1]);
    free(x);
    test_weights_free(&w);
}

/* Which products apply the epilogues: the first not with dropout (with W1 and V bound apart it
 * reads V's rows from V's own buffer), the second not with a residual (y may be x); neither
 * with quantized inputs, nor where W is kept [in, out], nor past the kernels' crossover; and on
 * a CPU's shape, not where a product's rows go several to a work-item (its x, cols values for
 * each of the pass's tokens, outgrowing the first-level cache). Each fused or not, y and h are
 * the same. */
Test(fused, which_products_fuse, .timeout = 300) {
    const clffn_layout oi = CLFFN_LAYOUT_OUT_IN, io = CLFFN_LAYOUT_IN_OUT;
    clffn_config res = config_of(64, 48, CLFFN_ACT_RELU, 1, 7);
    res.residual = 1;
    clffn_config drop = config_of(64, 48, CLFFN_ACT_SILU, 1, 7);
    drop.dropout = 0.25f;
    const clffn_config gated = config_of(64, 48, CLFFN_ACT_SILU, 1, 7);
    const clffn_config gq = config_of(64, 64, CLFFN_ACT_SILU, 1, 7);
    const clffn_config wide = config_of(1100, 48, CLFFN_ACT_GELU, 1, 7);
    const clffn_dtype f32 = CLFFN_DTYPE_F32, q8 = CLFFN_DTYPE_Q8_0, f16 = CLFFN_DTYPE_F16;
    const fuse_case cases[] = {
        {"residual", res, f16, 3, 1, 0, 0, oi, 0, 1, 0},
        {"dropout", drop, f16, 3, 1, 0, 0, oi, 0, 0, 1},
        {"W1 and V apart", gated, f32, 3, 1, 0, 0, oi, 1, 1, 1},
        {"W1 and V apart, one lane a row", gated, f32, 1, 0, 0, 0, oi, 1, 1, 1},
        {"quantized inputs", gq, q8, 1, 1, 0, 1, oi, 0, 0, 0},
        {"kept [in, out]", gated, f32, 1, 1, 0, 0, io, 0, 0, 0},
        {"past the crossover", gated, f16, 8, 1, 4, 0, oi, 0, 0, 0},
        {"rows in fours", wide, f16, 3, 3, 0, 0, oi, 0, 0, 1},
        {"one token, one row a work-item", wide, f16, 1, 3, 0, 0, oi, 0, 0, 1},
        {"one token, pairs", wide, f16, 1, 1, 0, 0, oi, 0, 1, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) { check_case(&cases[i]); }
}

/* The setting a context starts with: its profile's "FUSED_EPILOGUES", else on but on CPU
 * devices. */
static int device_default(const clffn_context *ctx) {
    return ctx->tuning.fused_epilogues >= 0 ? ctx->tuning.fused_epilogues : !ctx->cpu;
}

/* The setting a context starts with (off on a CPU device, where POCL ran the fused kernels no
 * faster, on elsewhere, unless the profile says); NULL refused; and a fused forward's stage
 * times give the epilogues 0, their time in the GEMMs'. */
Test(fused, setting_and_stage_times, .timeout = 120) {
    clffn_context *ctx = test_context();
    cr_assert_eq(clffn_context_fused_epilogues(ctx), device_default(ctx));
    ASSERT_STATUS(clffn_context_set_fused_epilogues(NULL, 1), CLFFN_ERROR_NULL_ARGUMENT);
    cr_assert_eq(clffn_context_fused_epilogues(NULL), 0);
    if (!test_timestamps_ordered(ctx)) {
        clffn_context_destroy(ctx);
        cr_skip_test("the device's timestamps do not order its kernels");
    }
    clffn_context_destroy(ctx);
    const clffn_config c = config_of(64, 96, CLFFN_ACT_SILU, 1, 7);
    test_weights w;
    test_weights_make(&w, &c, CLFFN_LAYOUT_OUT_IN, 8);
    float x[3 * 64], y[3 * 64];
    fill_uniform(x, 3 * 64, -1.0f, 1.0f, 3);
    ctx = shaped_context(1);
    typed_set s;
    clffn_ffn *ffn = make_ffn(ctx, &c, CLFFN_DTYPE_F16, &w, &s);
    ASSERT_OK(clffn_ffn_set_profiling(ffn, 1));
    for (int fused = 0; fused < 2; ++fused) {
        ASSERT_OK(clffn_context_set_fused_epilogues(ctx, fused));
        clffn_stage_times st;
        ASSERT_OK(clffn_forward_host(ffn, 3, x, 3 * 64, y, 3 * 64));
        ASSERT_OK(clffn_ffn_stage_times(ffn, &st));
        cr_assert(st.gemm1_s > 0 && st.gemm2_s > 0 && st.total_s > 0);
        cr_assert_eq(st.epilogue1_s == 0 && st.epilogue2_s == 0, fused, "fused %d", fused);
        cr_assert(st.gemm1_s + st.epilogue1_s + st.gemm2_s + st.epilogue2_s <= st.total_s * 1.001);
    }
    clffn_ffn_destroy(ffn);
    typed_free(&s);
    clffn_context_destroy(ctx);
    test_weights_free(&w);
}

/* A mixture-of-experts layer's experts (4, top-2, gated, every bias) in type t, run grouped (a
 * launch a stage for all of them) and one at a time, on a fusing context and on one that does
 * not, at 1 and 3 tokens: all four give the same bits, and the double reference's values. With
 * quantized inputs (qx) the same bits, which the products' own tests hold to the reference on
 * the rounded inputs: at one token the grouped steps share one rounded copy of x. */
static void moe_case(clffn_dtype t, int sh, int qx) {
    enum { E = 4, K = 2, D = 64, F = 96 };
    clffn_moe_config c = clffn_moe_config_default(D, F, E, K);
    c.expert = config_of(D, F, CLFFN_ACT_SILU, 1, 7);
    float router[E * D];
    fill_uniform(router, E * D, -0.5f, 0.5f, 5);
    test_weights w[E];
    typed_set ts[E];
    clffn_host_weights ref[E];
    for (size_t e = 0; e < E; ++e) {
        test_weights_make(&w[e], &c.expert, CLFFN_LAYOUT_OUT_IN, 60 + e);
        if (t != CLFFN_DTYPE_F32) { typed_make(&ts[e], &c.expert, &w[e], t, CLFFN_LAYOUT_OUT_IN); }
        ref[e] = t != CLFFN_DTYPE_F32 ? ts[e].ref : w[e].host;
    }
    clffn_context *ctx = shaped_context(sh);
    ASSERT_OK(clffn_context_set_quantized_inputs(ctx, qx));
    clffn_moe *moe[4];
    for (int i = 0; i < 4; ++i) { /* fused grouped, fused one at a time, then both unfused */
        ASSERT_OK(clffn_moe_create(ctx, &c, &moe[i]));
        ASSERT_OK(clffn_moe_set_grouping(moe[i], i % 2 == 0));
        ASSERT_OK(clffn_moe_upload_router(moe[i], router, NULL));
        for (size_t e = 0; e < E; ++e) {
            clffn_ffn *f = clffn_moe_expert(moe[i], e);
            ASSERT_OK(t != CLFFN_DTYPE_F32
                          ? clffn_ffn_upload_weights_typed(f, CLFFN_LAYOUT_OUT_IN, &ts[e].typed)
                          : clffn_ffn_upload_weights(f, CLFFN_LAYOUT_OUT_IN, &w[e].host));
        }
    }
    for (size_t T = 1; T <= 3; T += 2) {
        float x[3 * D], y[4][3 * D];
        double r[3 * D];
        fill_uniform(x, T * D, -1.0f, 1.0f, 7 + T);
        char what[96];
        snprintf(what, sizeof what, "experts %s shape %d%s, %zu tokens", clffn_dtype_name(t), sh,
                 qx ? ", quantized inputs" : "", T);
        for (int i = 0; i < 4; ++i) {
            ASSERT_OK(clffn_context_set_fused_epilogues(ctx, i < 2));
            ASSERT_OK(clffn_moe_forward_host(moe[i], T, x, T * D, y[i], T * D, NULL, NULL));
            cr_assert_eq(clffn_moe_experts_grouped(moe[i]), i % 2 == 0, "%s, layer %d", what, i);
            cr_assert(!memcmp(y[0], y[i], T * D * sizeof(float)), "%s: layer %d's bits", what, i);
        }
        if (qx) { continue; }
        ASSERT_OK(clffn_moe_reference_forward(&c, CLFFN_LAYOUT_OUT_IN, router, NULL, ref, T, x, r,
                                              NULL, NULL));
        assert_close(y[0], r, T * D, TOL_RTOL, what);
    }
    for (int i = 0; i < 4; ++i) { clffn_moe_destroy(moe[i]); }
    for (size_t e = 0; e < E; ++e) {
        if (t != CLFFN_DTYPE_F32) { typed_free(&ts[e]); }
        test_weights_free(&w[e]);
    }
    clffn_context_destroy(ctx);
}

/* The experts' grouped launches apply the epilogues as a single FFN's products do (their
 * hidden rows and biases at each expert's strides): f32, f16 and q8_0 experts in a GPU's kernel
 * shape, f16 also in the device's. */
Test(fused, mixture_of_experts, .timeout = 300) {
    static const clffn_dtype types[] = {CLFFN_DTYPE_F32, CLFFN_DTYPE_F16, CLFFN_DTYPE_Q8_0};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; ++i) { moe_case(types[i], 1, 0); }
    moe_case(CLFFN_DTYPE_F16, 0, 0);
}

/* The grouped experts with quantized inputs give one at a time's bits, in both kernel shapes,
 * q8_0 and q4_0 (whose one-token rows carry offset sums), and bf16 (x rounded to bf16). */
Test(fused, mixture_of_experts_quantized_inputs, .timeout = 300) {
    static const clffn_dtype types[] = {CLFFN_DTYPE_Q8_0, CLFFN_DTYPE_Q4_0, CLFFN_DTYPE_BF16};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; ++i) {
        moe_case(types[i], 0, 1);
        moe_case(types[i], 1, 1);
    }
}

/* A profile sets the default for its device: "FUSED_EPILOGUES" 1 or 0 whatever the device's
 * kind; another value makes the profile invalid, and the device's rule stands. */
Test(fused, a_profile_sets_the_default, .timeout = 120) {
    char dir[] = "/tmp/clffn-fused-XXXXXX", path[1400];
    test_profile_dir(dir, path, sizeof path);
    clffn_context *ctx = test_context(); /* no profile file yet: the built-in's, or the rule */
    const int rule = device_default(ctx);
    cr_assert_eq(clffn_context_fused_epilogues(ctx), rule);
    clffn_context_destroy(ctx);
    static const char *const texts[3] = {"{\"clblast\":{},\"clffn\":{\"FUSED_EPILOGUES\":1}}",
                                         "{\"clblast\":{},\"clffn\":{\"FUSED_EPILOGUES\":0}}",
                                         "{\"clblast\":{},\"clffn\":{\"FUSED_EPILOGUES\":2}}"};
    for (int i = 0; i < 3; ++i) {
        FILE *f = fopen(path, "w");
        cr_assert(f);
        fputs(texts[i], f);
        fclose(f);
        ctx = test_context();
        const char *applied = clffn_context_tuning(ctx);
        cr_assert_eq(strncmp(applied, "profile", 7) == 0, i < 2, "%s: %s", texts[i], applied);
        cr_assert_eq(clffn_context_fused_epilogues(ctx),
                     i == 0   ? 1
                     : i == 1 ? 0
                              : rule,
                     "%s", texts[i]);
        clffn_context_destroy(ctx);
    }
    test_profile_dir_end(dir, path);
}
