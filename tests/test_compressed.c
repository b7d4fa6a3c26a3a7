/* Weights kept in their stored type (f16, bf16, q8_0, q4_0, and f32 through clffn's own
 * kernels): every type × plain and gated × the layouts it takes × 1, 2, 3, 8, 64 and 130 tokens
 * (both sides of the few-token crossover), against the double reference run on the dequantized
 * weights; the backward's dx and bias gradients; the refusals. */
#include "clffn_defs.h"
#include "common.h"
#include "program.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const size_t TOKENS[] = {1, 2, 3, 8, 64, 130};
enum { N_TOKENS = sizeof TOKENS / sizeof TOKENS[0] };

/* An FFN of config c on ctx with random weights (seed) stored as type t in layout: w and s own
 * the host arrays (test_weights_free, typed_free). */
static clffn_ffn *typed_ffn(clffn_context *ctx, const clffn_config *c, clffn_dtype t,
                            clffn_layout layout, uint64_t seed, test_weights *w, typed_set *s) {
    test_weights_make(w, c, layout, seed);
    typed_make(s, c, w, t, layout);
    clffn_ffn *ffn = NULL;
    ASSERT_OK(clffn_ffn_create(ctx, c, &ffn));
    ASSERT_OK(clffn_ffn_upload_weights_typed(ffn, layout, &s->typed));
    return ffn;
}

/* D → F, plain with GELU or gated with SiLU (SwiGLU), every bias on. */
static clffn_config case_config(size_t D, size_t F, int gated) {
    clffn_config c = clffn_config_default(D, F);
    c.gated = gated;
    c.activation = gated ? CLFFN_ACT_SILU : CLFFN_ACT_GELU;
    return c;
}

/* T tokens through the FFN against the reference on the dequantized weights. */
static void assert_forward(clffn_ffn *ffn, const clffn_config *c, const typed_set *s, size_t T,
                           const char *what) {
    const size_t D = c->d_model;
    float *x = malloc(T * D * sizeof *x), *y = malloc(T * D * sizeof *y);
    double *ref = malloc(T * D * sizeof *ref);
    cr_assert(x && y && ref);
    fill_uniform(x, T * D, -1, 1, 1000 + T);
    ASSERT_OK(clffn_forward_host(ffn, T, x, T * D, y, T * D));
    ASSERT_OK(clffn_reference_forward(c, s->layout, &s->ref, T, x, 0, 0, 0, ref, NULL));
    assert_mostly_nonzero(ref, T * D, 0.9, what);
    assert_close(y, ref, T * D, act_rtol(c->activation), what);
    free(x), free(y), free(ref);
}

/* Every token count through one type, plain or gated, in one layout, on shape D → F. */
static void forward_case(clffn_context *ctx, clffn_dtype t, int gated, clffn_layout layout,
                         size_t D, size_t F) {
    clffn_config c = case_config(D, F, gated);
    c.bias_gate = 0; /* b1 without bv: each bias flag on its own */
    test_weights w;
    typed_set s;
    clffn_ffn *ffn = typed_ffn(ctx, &c, t, layout, 7 + (uint64_t)t, &w, &s);
    cr_assert_eq(clffn_ffn_weight_dtype(ffn), t);
    for (int i = 0; i < N_TOKENS; ++i) {
        char what[96];
        snprintf(what, sizeof what, "%s %s %s, %zu -> %zu, %zu tokens", clffn_dtype_name(t),
                 gated ? "gated" : "plain", layout ? "in_out" : "out_in", D, F, TOKENS[i]);
        assert_forward(ffn, &c, &s, TOKENS[i], what);
    }
    clffn_ffn_destroy(ffn);
    typed_free(&s);
    test_weights_free(&w);
}

/* The f32 path through clffn's own kernels too: they take f32 up to 16 tokens here, and
 * compressed weights up to 8 (whatever the device's profile says), so that 1, 2, 3 and 8 tokens
 * run the kernels and 64 and 130 the dequantized SGEMMs; setting one leaves the other. */
static clffn_context *kernels_context(void) {
    clffn_context *ctx = test_context();
    ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, 1, 8));
    ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, 0, CLFFN_MAX_KERNEL_TOKENS));
    cr_assert_eq(clffn_context_kernel_max_tokens(ctx, 1), 8);
    cr_assert_eq(clffn_context_kernel_max_tokens(ctx, 0), CLFFN_MAX_KERNEL_TOKENS);
    return ctx;
}

Test(compressed, forward_element_types, .timeout = 600) {
    clffn_context *ctx = kernels_context();
    static const clffn_dtype types[] = {CLFFN_DTYPE_F32, CLFFN_DTYPE_F16, CLFFN_DTYPE_BF16};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; ++t) {
        for (int gated = 0; gated < 2; ++gated) {
            for (int l = 0; l < 2; ++l) {
                forward_case(ctx, types[t], gated, (clffn_layout)l, 64, 96);
                /* odd sizes: rows that end in a tail, columns past the last vector */
                forward_case(ctx, types[t], gated, (clffn_layout)l, 45, 70);
            }
        }
    }
    clffn_context_destroy(ctx);
}

/* f32 weights kept [out, in] (the context's layout), so the forward runs the row kernels too;
 * and rows read several at a time, which a CPU device does where x (cols values for each of the
 * pass's tokens) passes 4096 (CLFFN_DEFAULT_ROW_GROUP_COLS, set here over the device's
 * profile): four at a time up to 4 tokens, above three with the direct sums (POCL; two on other
 * CPU devices, and for the quantized types). W2's rows of 4100 values go so at every token
 * count, W1's of 1030 or 1031 from 3 tokens on (the 4-token kernels) and one at a time below.
 * Row counts of 45, 70 and 71 leave the last group of four 1, 2 and 3 rows short (45 and 71 the
 * last pair one short, 70 and 71 the last three 2 and 1 short, as do W2's 1030 and 1031); 4100,
 * 1030 and 1031 values end in a tail. The quantized types at 1088 values: one row at a time for
 * 1 and 2 tokens, four at 3, two at 8. */
Test(compressed, forward_row_kernels_and_pairs, .timeout = 600) {
    clffn_context *ctx = kernels_context();
    ASSERT_OK(clffn_context_set_row_group_cols(ctx, CLFFN_DEFAULT_ROW_GROUP_COLS));
    ASSERT_OK(clffn_context_set_weight_layout(ctx, CLFFN_LAYOUT_OUT_IN));
    static const clffn_dtype types[] = {CLFFN_DTYPE_F32, CLFFN_DTYPE_F16, CLFFN_DTYPE_BF16};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; ++t) {
        forward_case(ctx, types[t], 1, CLFFN_LAYOUT_OUT_IN, 1030, 70);
        forward_case(ctx, types[t], 0, CLFFN_LAYOUT_IN_OUT, 45, 4100);
        forward_case(ctx, types[t], 1, CLFFN_LAYOUT_OUT_IN, 1031, 71);
    }
    forward_case(ctx, CLFFN_DTYPE_Q8_0, 1, CLFFN_LAYOUT_OUT_IN, 64, 4128);
    forward_case(ctx, CLFFN_DTYPE_Q4_0, 0, CLFFN_LAYOUT_OUT_IN, 64, 4128);
    forward_case(ctx, CLFFN_DTYPE_Q8_0, 0, CLFFN_LAYOUT_OUT_IN, 1088, 96);
    forward_case(ctx, CLFFN_DTYPE_Q4_0, 1, CLFFN_LAYOUT_OUT_IN, 1088, 96);
    clffn_context_destroy(ctx);
}

/* The kernels' GPU forms, which a CPU device runs only when given such shapes: lanes sharing a
 * row interleaved by eight values, columns split across work-items, and the wide loads where
 * rows are 16-byte aligned (64 and 96 values) and their fallback where they are not (45, 70).
 * W1's rows of 1088 values give each of 8 or 32 lanes more chunks than it loads at once, so the
 * lanes' main loop runs for every type, and its last pass ends part-way. */
Test(compressed, forward_split_shapes, .timeout = 600) {
    clffn_context *ctx = kernels_context();
    static const size_t shapes[2][CLFFN_WGEMV_PARAMS] = {{32, 4, 8, 16, 8}, {8, 16, 8, 32, 4}};
    for (int sh = 0; sh < 2; ++sh) {
        ASSERT_OK(clffn_context_set_wgemv(ctx, shapes[sh]));
        for (int t = 0; t < CLFFN_DTYPE_COUNT_; ++t) {
            const int q = t == CLFFN_DTYPE_Q8_0 || t == CLFFN_DTYPE_Q4_0;
            for (int l = 0; l < (q ? 1 : 2); ++l) {
                forward_case(ctx, (clffn_dtype)t, sh, (clffn_layout)l, 64, 96);
                if (!q) { forward_case(ctx, (clffn_dtype)t, !sh, (clffn_layout)l, 45, 70); }
                if (!l) { forward_case(ctx, (clffn_dtype)t, sh, CLFFN_LAYOUT_OUT_IN, 1088, 64); }
            }
            if (q) { forward_case(ctx, (clffn_dtype)t, !sh, CLFFN_LAYOUT_OUT_IN, 160, 288); }
        }
    }
    clffn_context_destroy(ctx);
}

Test(compressed, forward_quantized, .timeout = 600) {
    clffn_context *ctx = kernels_context();
    static const clffn_dtype types[] = {CLFFN_DTYPE_Q8_0, CLFFN_DTYPE_Q4_0};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; ++t) {
        for (int gated = 0; gated < 2; ++gated) {
            forward_case(ctx, types[t], gated, CLFFN_LAYOUT_OUT_IN, 64, 96);
            forward_case(ctx, types[t], gated, CLFFN_LAYOUT_OUT_IN, 160, 32);
        }
    }
    clffn_context_destroy(ctx);
}

/* Past CLFFN_MAX_KERNEL_TOKENS the kernels run in passes of that many tokens: 17 tokens (a full
 * pass and one row) and 40 (two and a half) through every type, plain and gated, in each layout
 * its kernels take, against the reference; and each row sums alike in whichever pass it falls,
 * the short last one too: rows 24 to 39 of 40 tokens are, to the bit, those of a 16-token forward
 * of the same 16 rows. */
static void passes_case(clffn_context *ctx, clffn_dtype t, int gated, clffn_layout layout) {
    enum { D = 64, F = 96, T = 40, P = (int)CLFFN_MAX_KERNEL_TOKENS };
    clffn_config c = case_config(D, F, gated);
    test_weights w;
    typed_set s;
    clffn_ffn *ffn = typed_ffn(ctx, &c, t, layout, 17 + (uint64_t)t, &w, &s);
    char what[96];
    snprintf(what, sizeof what, "%s %s %s in passes", clffn_dtype_name(t),
             gated ? "gated" : "plain", layout ? "in_out" : "out_in");
    assert_forward(ffn, &c, &s, P + 1, what);
    assert_forward(ffn, &c, &s, T, what);
    static float x[T * D], y[T * D], y16[P * D];
    fill_uniform(x, T * D, -1, 1, 77);
    ASSERT_OK(clffn_forward_host(ffn, T, x, T * D, y, T * D));
    ASSERT_OK(clffn_forward_host(ffn, P, x + (T - P) * D, P * D, y16, P * D));
    cr_assert(!memcmp(y + (T - P) * D, y16, sizeof y16), "%s: a row's bits follow its pass", what);
    clffn_ffn_destroy(ffn);
    typed_free(&s);
    test_weights_free(&w);
}

Test(compressed, forward_in_passes, .timeout = 300) {
    clffn_context *ctx = test_context();
    ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, CLFFN_KERNELS_F32, 64));
    ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, CLFFN_KERNELS_COMPRESSED, 64));
    cr_assert_eq(clffn_context_kernel_max_tokens(ctx, CLFFN_KERNELS_COMPRESSED), 64);
    for (int t = 0; t < CLFFN_DTYPE_COUNT_; ++t) {
        const int q = t == CLFFN_DTYPE_Q8_0 || t == CLFFN_DTYPE_Q4_0;
        for (int gated = 0; gated < 2; ++gated) {
            for (int l = 0; l < (q ? 1 : 2); ++l) {
                passes_case(ctx, (clffn_dtype)t, gated, (clffn_layout)l);
            }
        }
    }
    clffn_context_destroy(ctx);
}

/* Both sides of the crossover at one count: all kernels, then all dequantized SGEMMs. */
Test(compressed, either_path_at_the_same_tokens, .timeout = 300) {
    clffn_context *ctx = test_context();
    clffn_config c = clffn_config_default(96, 128);
    c.gated = 1, c.activation = CLFFN_ACT_SILU;
    test_weights w;
    typed_set s;
    clffn_ffn *ffn = typed_ffn(ctx, &c, CLFFN_DTYPE_Q4_0, CLFFN_LAYOUT_OUT_IN, 3, &w, &s);
    for (int side = 0; side < 2; ++side) {
        ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, 1, side ? 16 : 0));
        for (size_t T = 1; T <= 16; T += 5) {
            assert_forward(ffn, &c, &s, T, side ? "kernels" : "dequantized SGEMMs");
        }
    }
    clffn_ffn_destroy(ffn);
    typed_free(&s);
    test_weights_free(&w);
    clffn_context_destroy(ctx);
}

/* Each product takes its class's crossover: by its weights the large products' one, below it
 * f16's the compressed one and q8_0's the blocks' one. At 20 tokens (two passes of the kernels)
 * a plain FFN of 96 → 128 (12288 weights a product) gives the kernels' bits where its class's
 * crossover is above 20, and SGEMM's where it is 0, whatever the other classes say; the
 * products fall below the large threshold by one weight. The two paths sum in other orders, so
 * their bits differ somewhere, which is what tells them apart here. */
static void crossover_case(clffn_context *ctx, clffn_dtype t, const int same_as[7]) {
    clffn_config c = case_config(96, 128, 0);
    test_weights w;
    typed_set s;
    clffn_ffn *ffn = typed_ffn(ctx, &c, t, CLFFN_LAYOUT_OUT_IN, 5, &w, &s);
    enum { T = 20, RUNS = 7 };
    const size_t n = T * 96, weights = 96 * 128;
    float *x = malloc(n * sizeof *x), *y[RUNS];
    cr_assert(x);
    fill_uniform(x, n, -1, 1, 77);
    /* compressed, blocks', large crossovers, the threshold past the products' weights */
    static const size_t runs[RUNS][4] = {{32, 32, 32, 1}, {0, 0, 0, 1},  {0, 0, 32, 0},
                                         {32, 32, 0, 0},  {0, 0, 32, 1}, {32, 0, 0, 1},
                                         {0, 32, 0, 1}};
    for (int r = 0; r < RUNS; ++r) {
        cr_assert((y[r] = malloc(n * sizeof *y[r])) != NULL);
        ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, CLFFN_KERNELS_COMPRESSED, runs[r][0]));
        ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, CLFFN_KERNELS_BLOCKS, runs[r][1]));
        ASSERT_OK(
            clffn_context_set_kernel_max_tokens(ctx, CLFFN_KERNELS_COMPRESSED_LARGE, runs[r][2]));
        ASSERT_OK(clffn_context_set_kernel_large_weights(ctx, weights + runs[r][3]));
        ASSERT_OK(clffn_forward_host(ffn, T, x, n, y[r], n));
    }
    cr_assert(memcmp(y[0], y[1], n * sizeof *x) != 0, "the paths gave the same bits");
    for (int r = 2; r < RUNS; ++r) {
        cr_assert(memcmp(y[r], y[same_as[r]], n * sizeof *x) == 0, "%s, run %d",
                  clffn_dtype_name(t), r);
    }
    assert_forward(ffn, &c, &s, T, clffn_dtype_name(t)); /* the last run's */
    for (int r = 0; r < RUNS; ++r) { free(y[r]); }
    free(x), clffn_ffn_destroy(ffn), typed_free(&s), test_weights_free(&w);
}

Test(compressed, crossovers_by_type_and_size, .timeout = 300) {
    clffn_context *ctx = test_context();
    static const int f16[7] = {0, 1, 0, 1, 1, 0, 1}, q8_0[7] = {0, 1, 0, 1, 1, 1, 0};
    crossover_case(ctx, CLFFN_DTYPE_F16, f16);
    crossover_case(ctx, CLFFN_DTYPE_Q8_0, q8_0);
    clffn_context_destroy(ctx);
}

/* ∂x and the biases' gradients through compressed weights on D → F, against the reference
 * backward on the dequantized weights; no weight gradient is computed, and asking for one is
 * refused. */
static void backward_case(clffn_context *ctx, clffn_dtype t, clffn_layout layout, int gated,
                          size_t D, size_t F, size_t T) {
    clffn_config c = clffn_config_default(D, F);
    c.gated = gated, c.activation = gated ? CLFFN_ACT_SILU : CLFFN_ACT_RELU, c.residual = 1;
    test_weights w;
    typed_set s;
    clffn_ffn *ffn = typed_ffn(ctx, &c, t, layout, 11, &w, &s);
    float *x = malloc(T * D * 4), *y = malloc(T * D * 4), *dy = malloc(T * D * 4);
    float *dx = malloc(T * D * 4), *gb = malloc((2 * F + D) * 4), *gw = malloc(D * F * 4);
    double *rdx = malloc(T * D * 8), *rw = malloc(3 * D * F * 8), *rb = malloc((2 * F + D) * 8);
    cr_assert(x && y && dy && dx && gb && gw && rdx && rw && rb);
    fill_uniform(x, T * D, -1, 1, 21), fill_uniform(dy, T * D, -1, 1, 22);
    ASSERT_OK(clffn_forward_host(ffn, T, x, T * D, y, T * D));
    const clffn_weight_arrays g = {NULL, gb, NULL, gb + F, NULL, gb + 2 * F};
    ASSERT_OK(clffn_backward_host(ffn, T, x, T * D, dy, T * D, dx, T * D, &g, 0));
    const clffn_ref_grads rg = {rw, rb, rw + D * F, rb + F, rw + 2 * D * F, rb + 2 * F};
    ASSERT_OK(clffn_reference_backward(&c, layout, &s.ref, T, x, dy, 0, 0, 0, rdx, &rg));
    char what[96];
    snprintf(what, sizeof what, "%s %s, %zu -> %zu, %zu tokens: dx", clffn_dtype_name(t),
             gated ? "gated" : "plain", D, F, T);
    assert_mostly_nonzero(rdx, T * D, 0.9, what);
    assert_close(dx, rdx, T * D, TOL_RTOL, what);
    assert_close(gb, rb, F, TOL_RTOL, "db1");
    if (gated) { assert_close(gb + F, rb + F, F, TOL_RTOL, "dbv"); }
    assert_close(gb + 2 * F, rb + 2 * F, D, TOL_RTOL, "db2");
    const clffn_weight_arrays asks = {gw, gb, gated ? gw : NULL, gb + F, gw, gb + 2 * F};
    ASSERT_STATUS(clffn_backward_host(ffn, T, x, T * D, dy, T * D, dx, T * D, &asks, 0),
                  CLFFN_ERROR_COMPRESSED_WEIGHTS);
    cr_assert(strstr(clffn_ffn_error_message(ffn), clffn_dtype_name(t)) != NULL, "%s",
              clffn_ffn_error_message(ffn));
    clffn_ffn_destroy(ffn);
    free(x), free(y), free(dy), free(dx), free(gb), free(gw), free(rdx), free(rw), free(rb);
    typed_free(&s);
    test_weights_free(&w);
}

Test(compressed, backward_input_and_bias_gradients, .timeout = 600) {
    clffn_context *ctx = test_context();
    static const clffn_dtype types[] = {CLFFN_DTYPE_F16, CLFFN_DTYPE_BF16, CLFFN_DTYPE_Q8_0,
                                        CLFFN_DTYPE_Q4_0};
    static const size_t ts[] = {1, 3, 64};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; ++t) {
        for (int gated = 0; gated < 2; ++gated) {
            for (size_t i = 0; i < sizeof ts / sizeof ts[0]; ++i) {
                backward_case(ctx, types[t], CLFFN_LAYOUT_OUT_IN, gated, 64, 96, ts[i]);
            }
        }
    }
    clffn_context_destroy(ctx);
}

/* dx runs down the columns of [out, in] weights: on POCL's CPU device, strips of columns as wide as
 * CLFFN_WCOL_STRIP_VALUES over the pass's tokens, in chunks of CLFFN_WCOL_CHUNK_ROWS rows read
 * four at a time. d_model 1088 is one whole strip and part of another at one token (two whole
 * ones at 2 tokens, 17 at 16); d_ff 160 two chunks, the second of 32 rows; 1061 and 133 end the
 * last strip in a scalar tail and the last chunk one row past a group of four, 1063 and 135
 * three rows past (the rows after the last whole group go one at a time). Every token
 * bucket for f16 and q4_0 (both of q4_0's decodings), gated (V's product added onto W1's).
 * About 20 weight programs: on rusticl's llvmpipe on a 2-core AVX2 host, with Mesa's shader
 * cache cold and a second suite beside it, this ran past 600 s. */
Test(compressed, backward_column_strips_and_chunks, .timeout = 1200) {
    clffn_context *ctx = kernels_context();
    ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, 1, CLFFN_MAX_KERNEL_TOKENS));
    static const size_t all[] = {1, 2, 3, 5, 9}, some[] = {1, 3, 5};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) {
        backward_case(ctx, CLFFN_DTYPE_F16, CLFFN_LAYOUT_OUT_IN, 1, 1088, 160, all[i]);
        backward_case(ctx, CLFFN_DTYPE_Q4_0, CLFFN_LAYOUT_OUT_IN, 1, 1088, 160, all[i]);
    }
    for (size_t i = 0; i < sizeof some / sizeof some[0]; ++i) {
        backward_case(ctx, CLFFN_DTYPE_Q8_0, CLFFN_LAYOUT_OUT_IN, 1, 1088, 160, some[i]);
        backward_case(ctx, CLFFN_DTYPE_BF16, CLFFN_LAYOUT_OUT_IN, 1, 1061, 133, some[i]);
    }
    backward_case(ctx, CLFFN_DTYPE_BF16, CLFFN_LAYOUT_OUT_IN, 0, 1063, 135, 3);
    /* f32 kept [in, out]: the forward's products run down the columns */
    ASSERT_OK(clffn_context_set_weight_layout(ctx, CLFFN_LAYOUT_IN_OUT));
    forward_case(ctx, CLFFN_DTYPE_F32, 1, CLFFN_LAYOUT_OUT_IN, 133, 1061);
    clffn_context_destroy(ctx);
}

/* Past the crossover each block goes to SGEMM as [k, n] rows: dequantized transposed where the
 * inner dimension runs along the stored rows (the forward through [out, in] weights, above; dx
 * through [in, out] ones, here), as stored otherwise. f16 kept [in, out], forward and backward,
 * on sizes that end in part tiles. */
Test(compressed, dequantized_blocks_either_way, .timeout = 600) {
    clffn_context *ctx = kernels_context();
    forward_case(ctx, CLFFN_DTYPE_F16, 1, CLFFN_LAYOUT_IN_OUT, 45, 70);
    backward_case(ctx, CLFFN_DTYPE_F16, CLFFN_LAYOUT_IN_OUT, 1, 45, 70, 64);
    backward_case(ctx, CLFFN_DTYPE_BF16, CLFFN_LAYOUT_IN_OUT, 0, 64, 96, 130);
    clffn_context_destroy(ctx);
}

/* The transposing dequantizer's two forms give the same results: 8 x 8 tiles a work-item (a CPU
 * device's default) and tiles of 32 of W's rows by 64 of its columns staged in local memory
 * (other devices'), on part tiles, rows that do not start on a multiple of 8 values (45), and
 * K-blocks past the first (1088 inputs). */
Test(compressed, dequantized_through_local_tiles, .timeout = 600) {
    clffn_context *ctx = kernels_context();
    ASSERT_OK(clffn_context_set_gemm_k_block(ctx, 256));
    ASSERT_OK(clffn_context_set_gemm_k_block_min_rows(ctx, 0));
    for (int tiles = 0; tiles < 2; ++tiles) {
        ASSERT_OK(clffn_context_set_dequant_tiles(ctx, tiles));
        cr_assert_eq(clffn_context_dequant_tiles(ctx), tiles);
        forward_case(ctx, CLFFN_DTYPE_F16, 1, CLFFN_LAYOUT_OUT_IN, 45, 70);
        forward_case(ctx, CLFFN_DTYPE_Q4_0, 0, CLFFN_LAYOUT_OUT_IN, 1088, 96);
        backward_case(ctx, CLFFN_DTYPE_BF16, CLFFN_LAYOUT_IN_OUT, 1, 45, 70, 130);
    }
    ASSERT_STATUS(clffn_context_set_dequant_tiles(NULL, 1), CLFFN_ERROR_NULL_ARGUMENT);
    cr_assert_eq(clffn_context_dequant_tiles(NULL), 0);
    clffn_context_destroy(ctx);
}

/* A refused upload changes nothing: the earlier weights still run. Shapes a quantized type
 * cannot take are refused before anything is allocated, with the dimension named. */
Test(compressed, refusals_keep_the_old_weights) {
    clffn_context *ctx = test_context();
    clffn_config c = clffn_config_default(45, 64);
    test_weights w;
    test_weights_make(&w, &c, CLFFN_LAYOUT_OUT_IN, 5);
    typed_set f16, q8;
    typed_make(&f16, &c, &w, CLFFN_DTYPE_F16, CLFFN_LAYOUT_OUT_IN);
    clffn_ffn *ffn = NULL;
    ASSERT_OK(clffn_ffn_create(ctx, &c, &ffn));
    cr_assert_eq(clffn_ffn_weight_bytes(ffn), 0);
    cr_assert_eq(clffn_ffn_weight_dtype(ffn), CLFFN_DTYPE_F32);
    ASSERT_OK(clffn_ffn_upload_weights_typed(ffn, CLFFN_LAYOUT_OUT_IN, &f16.typed));
    cr_assert_eq(clffn_ffn_weight_bytes(ffn), 2 * 45 * 64 * 2);
    cr_assert_str_empty(clffn_ffn_error_message(ffn));
    float zeros[64 * 45] = {0};
    clffn_typed_weights q = {CLFFN_DTYPE_Q8_0, zeros, NULL, zeros, w.host.b1, NULL, w.host.b2};
    ASSERT_STATUS(clffn_ffn_upload_weights_typed(ffn, CLFFN_LAYOUT_OUT_IN, &q),
                  CLFFN_ERROR_INVALID_ARGUMENT);
    cr_assert(strstr(clffn_ffn_error_message(ffn), "d_model") &&
                  strstr(clffn_ffn_error_message(ffn), "45"),
              "%s", clffn_ffn_error_message(ffn));
    ASSERT_STATUS(clffn_ffn_upload_weights_typed(ffn, CLFFN_LAYOUT_IN_OUT, &q),
                  CLFFN_ERROR_INVALID_LAYOUT);
    cr_assert(strstr(clffn_ffn_error_message(ffn), "OUT_IN"), "%s", clffn_ffn_error_message(ffn));
    q.dtype = (clffn_dtype)42;
    ASSERT_STATUS(clffn_ffn_upload_weights_typed(ffn, CLFFN_LAYOUT_OUT_IN, &q),
                  CLFFN_ERROR_INVALID_ARGUMENT);
    q.dtype = CLFFN_DTYPE_F16, q.w2 = NULL;
    ASSERT_STATUS(clffn_ffn_upload_weights_typed(ffn, CLFFN_LAYOUT_OUT_IN, &q),
                  CLFFN_ERROR_NULL_ARGUMENT);
    cr_assert_eq(clffn_ffn_weight_dtype(ffn), CLFFN_DTYPE_F16);
    assert_forward(ffn, &c, &f16, 3, "the f16 weights after the refusals");
    clffn_ffn_destroy(ffn);
    /* d_ff, W2's input dimension, named when it is the one */
    c = clffn_config_default(64, 70);
    test_weights w2;
    test_weights_make(&w2, &c, CLFFN_LAYOUT_OUT_IN, 6);
    typed_make(&q8, &c, &w2, CLFFN_DTYPE_F16, CLFFN_LAYOUT_OUT_IN); /* any bytes of the size */
    ASSERT_OK(clffn_ffn_create(ctx, &c, &ffn));
    q8.typed.dtype = CLFFN_DTYPE_Q4_0;
    ASSERT_STATUS(clffn_ffn_upload_weights_typed(ffn, CLFFN_LAYOUT_OUT_IN, &q8.typed),
                  CLFFN_ERROR_INVALID_ARGUMENT);
    cr_assert(strstr(clffn_ffn_error_message(ffn), "d_ff") &&
                  strstr(clffn_ffn_error_message(ffn), "70"),
              "%s", clffn_ffn_error_message(ffn));
    cr_assert_eq(clffn_ffn_weight_bytes(ffn), 0, "nothing was uploaded");
    clffn_ffn_destroy(ffn);
    typed_free(&f16), typed_free(&q8);
    test_weights_free(&w), test_weights_free(&w2);
    clffn_context_destroy(ctx);
}

/* The device level with compressed weights: the caller's buffers at offsets, canaries intact,
 * a few tokens (the kernels) and many (dequantized SGEMMs). */
Test(compressed, device_level_offsets_and_canaries, .timeout = 300) {
    clffn_context *ctx = test_context();
    clffn_config c = clffn_config_default(64, 96);
    c.gated = 1, c.activation = CLFFN_ACT_GELU;
    test_weights w;
    typed_set s;
    clffn_ffn *ffn = typed_ffn(ctx, &c, CLFFN_DTYPE_Q8_0, CLFFN_LAYOUT_OUT_IN, 9, &w, &s);
    const size_t ts[2] = {2, 40};
    for (int i = 0; i < 2; ++i) {
        const size_t T = ts[i], n = T * c.d_model;
        float *x = malloc(n * 4), *y = malloc(n * 4);
        double *ref = malloc(n * 8);
        fill_uniform(x, n, -1, 1, 31 + T);
        guarded gx = guarded_make(ctx, CANARY + 5, n, x),
                gy = guarded_make(ctx, CANARY + 9, n, NULL);
        cl_event ev = NULL;
        ASSERT_OK(clffn_forward(ffn, T, gx.mem, gx.offset, gy.mem, gy.offset,
                                clffn_context_queue(ctx), &ev));
        ASSERT_OK(clWaitForEvents(1, &ev));
        clReleaseEvent(ev);
        guarded_read(ctx, &gy, y);
        ASSERT_OK(
            clffn_reference_forward(&c, CLFFN_LAYOUT_OUT_IN, &s.ref, T, x, 0, 0, 0, ref, NULL));
        assert_close(y, ref, n, act_rtol(c.activation), "device level");
        guarded_assert_canaries(ctx, &gy, "y");
        guarded_assert_canaries(ctx, &gx, "x");
        guarded_free(&gx), guarded_free(&gy);
        free(x), free(y), free(ref);
    }
    clffn_ffn_destroy(ffn);
    typed_free(&s);
    test_weights_free(&w);
    clffn_context_destroy(ctx);
}

/* The identity-activation, bias-free N → N FFN of tw, run on N one-hot tokens (token j is
 * column j) in passes of kernel_tokens (0: one pass, the dequantizing path): y[j·N + r] is then
 * Σ_i W2[r, i]·W1[i, j], W1's column j when W2 is the identity, exactly (every product but one
 * is of a zero). */
static void one_hot_forward(clffn_context *ctx, const clffn_typed_weights *tw, clffn_layout layout,
                            size_t n, size_t kernel_tokens, float *y) {
    float *x = calloc(n * n, sizeof *x);
    cr_assert(x != NULL);
    for (size_t j = 0; j < n; ++j) { x[j * n + j] = 1.0f; }
    clffn_config c = clffn_config_default(n, n);
    c.activation = CLFFN_ACT_IDENTITY, c.bias1 = c.bias2 = 0;
    clffn_ffn *ffn = NULL;
    ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, 1, kernel_tokens));
    ASSERT_OK(clffn_ffn_create(ctx, &c, &ffn));
    ASSERT_OK(clffn_ffn_upload_weights_typed(ffn, layout, tw));
    const size_t T = kernel_tokens ? kernel_tokens : n;
    for (size_t j0 = 0; j0 < n; j0 += T) {
        ASSERT_OK(clffn_forward_host(ffn, T, x + j0 * n, T * n, y + j0 * n, T * n));
    }
    clffn_ffn_destroy(ffn);
    free(x);
}

/* The blocks' f16 scales decode exactly on the device, on both paths: subnormal, negative,
 * the largest, zero. W1 is one block per row with those scales and every quant; W2 is the
 * identity (scale 1, quant 1 on the diagonal, q4_0's 9), so one-hot tokens read W1 back a
 * column at a time, which must be what the host's decoding gives. */
static void scales_case(clffn_context *ctx, clffn_dtype t, size_t kernel_tokens) {
    enum { N = 32 };
    static const uint16_t scales[] = {0x0001, 0x03ff, 0x8001, 0x0400, 0x3c00,
                                      0xc000, 0x7bff, 0x0000, 0x83ff, 0x3555};
    const size_t blk = t == CLFFN_DTYPE_Q8_0 ? 34 : 18;
    uint8_t w1[N * 34], w2[N * 34];
    for (size_t r = 0; r < N; ++r) {
        uint8_t *b1 = w1 + r * blk, *b2 = w2 + r * blk;
        const uint16_t d = scales[r % (sizeof scales / sizeof scales[0])];
        b1[0] = (uint8_t)d, b1[1] = (uint8_t)(d >> 8);
        b2[0] = 0x00, b2[1] = 0x3c; /* 1.0 */
        for (size_t i = 0; i < blk - 2; ++i) {
            b1[2 + i] = (uint8_t)(r * 37 + i * 11 + 3); /* every quant, q8_0's -128 too */
            /* q4_0: byte i's low nibble is value i, its high one value i + 16 */
            b2[2 + i] = t == CLFFN_DTYPE_Q8_0
                            ? (uint8_t)(i == r)
                            : (uint8_t)((i + 16 == r ? 9 : 8) << 4 | (i == r ? 9 : 8));
        }
    }
    float exact[N * N];
    ASSERT_OK(clffn_convert_to_f32(t, w1, N * blk, N * N, exact, N * N));
    const clffn_typed_weights tw = {t, w1, NULL, w2, NULL, NULL, NULL};
    float y[N * N];
    one_hot_forward(ctx, &tw, CLFFN_LAYOUT_OUT_IN, N, kernel_tokens, y);
    for (size_t j = 0; j < N; ++j) {
        for (size_t r = 0; r < N; ++r) {
            cr_assert(y[j * N + r] == exact[r * N + j], /* exact; a zero's sign aside */
                      "%s, %zu-token kernels: W1[%zu, %zu] = %a, the host decodes %a",
                      clffn_dtype_name(t), kernel_tokens, r, j, (double)y[j * N + r],
                      (double)exact[r * N + j]);
        }
    }
}

Test(compressed, scales_decode_exactly_on_the_device, .timeout = 300) {
    clffn_context *ctx = test_context();
    static const size_t kernel_tokens[] = {1, 4, 16, 0};
    for (size_t k = 0; k < sizeof kernel_tokens / sizeof kernel_tokens[0]; ++k) {
        scales_case(ctx, CLFFN_DTYPE_Q8_0, kernel_tokens[k]);
        scales_case(ctx, CLFFN_DTYPE_Q4_0, kernel_tokens[k]);
    }
    clffn_context_destroy(ctx);
}

/* Every finite half decodes exactly on the device, subnormals included, in both layouts and on
 * both paths: W1 [256, 256] holds each finite f16 bit pattern once (infinities and NaNs, which
 * would turn the zero products into NaNs, are zeros there), W2 is the identity, and one-hot
 * tokens read W1 back a column at a time. */
static void halves_case(clffn_context *ctx, clffn_layout layout, size_t kernel_tokens) {
    enum { N = 256 };
    static uint16_t w1[N * N], w2[N * N];
    static float exact[N * N], y[N * N];
    for (size_t i = 0; i < N * N; ++i) {
        w1[i] = (i & 0x7c00u) == 0x7c00u ? 0 : (uint16_t)i;
        w2[i] = i / N == i % N ? 0x3c00 : 0;
    }
    ASSERT_OK(clffn_convert_to_f32(CLFFN_DTYPE_F16, w1, sizeof w1, N * N, exact, N * N));
    const clffn_typed_weights tw = {CLFFN_DTYPE_F16, w1, NULL, w2, NULL, NULL, NULL};
    one_hot_forward(ctx, &tw, layout, N, kernel_tokens, y);
    for (size_t j = 0; j < N; ++j) {
        for (size_t r = 0; r < N; ++r) {
            const size_t at = layout == CLFFN_LAYOUT_OUT_IN ? r * N + j : j * N + r;
            cr_assert(y[j * N + r] == exact[at], /* exact; a zero's sign aside */
                      "%s, %zu-token kernels: half 0x%04x gives %a, the host decodes %a",
                      layout == CLFFN_LAYOUT_OUT_IN ? "[out, in]" : "[in, out]", kernel_tokens,
                      (unsigned)w1[at], (double)y[j * N + r], (double)exact[at]);
        }
    }
}

Test(compressed, every_finite_half_decodes_exactly_on_the_device, .timeout = 300) {
    clffn_context *ctx = test_context();
    static const size_t kernel_tokens[] = {1, 4, 16, 0};
    for (size_t k = 0; k < sizeof kernel_tokens / sizeof kernel_tokens[0]; ++k) {
        halves_case(ctx, CLFFN_LAYOUT_OUT_IN, kernel_tokens[k]);
        halves_case(ctx, CLFFN_LAYOUT_IN_OUT, kernel_tokens[k]);
    }
    clffn_context_destroy(ctx);
}

/* Quantized inputs up to 32 tokens (in passes past 16), f32 inputs up to 16. */
static void quantized_context(clffn_context *ctx) {
    ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, CLFFN_KERNELS_COMPRESSED,
                                                  CLFFN_MAX_KERNEL_TOKENS));
    ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, CLFFN_KERNELS_QUANTIZED, 32));
    ASSERT_OK(clffn_context_set_quantized_inputs(ctx, 1));
}

/* One type, plain or gated, D → F, every count the kernels take and one past them. D and F of
 * 96 and 160 values (3 and 5 blocks) leave the pair kernels a lone last block. Token 0 of the
 * first case starts with GGUF's edge blocks: all zeros (scale 0), one outlier among tiny values,
 * and values at rounding midpoints (x·(127 / amax) = k + ½, which rounds away from zero). */
static void quantized_inputs_case(clffn_context *ctx, clffn_dtype t, int gated, size_t D,
                                  size_t F) {
    static const size_t counts[] = {1, 2, 3, 5, 8, 16, 20, 40}; /* 20: in passes; 40: SGEMMs */
    clffn_config c = case_config(D, F, gated);
    test_weights w;
    typed_set s;
    clffn_ffn *ffn = typed_ffn(ctx, &c, t, CLFFN_LAYOUT_OUT_IN, 31 + (uint64_t)t, &w, &s);
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; ++i) {
        const size_t T = counts[i];
        float *x = malloc(T * D * sizeof *x);
        cr_assert(x);
        fill_uniform(x, T * D, -1, 1, 500 + T);
        if (i == 0) {
            for (size_t j = 0; j < 32; ++j) { x[j] = 0.0f; }
            for (size_t j = 32; j < 64; ++j) { x[j] = 1e-3f * (float)(j % 7) - 3e-3f; }
            x[40] = 3.0f;
            for (size_t j = 64; j < 96; ++j) { x[j] = ((float)(j % 9) - 4.5f) * (1.0f / 127.0f); }
            x[70] = 1.0f; /* amax: the step is 1/127, so the others sit at k + ½ steps */
        }
        char what[96];
        snprintf(what, sizeof what, "quantized inputs, %s %s, %zu -> %zu, %zu tokens",
                 clffn_dtype_name(t), gated ? "gated" : "plain", D, F, T);
        const size_t most = clffn_context_kernel_max_tokens(ctx, CLFFN_KERNELS_QUANTIZED);
        assert_quantized_forward(ffn, &c, &s, T, x, T > most, what);
        free(x);
    }
    clffn_ffn_destroy(ffn);
    typed_free(&s);
    test_weights_free(&w);
}

Test(compressed, quantized_inputs, .timeout = 600) {
    clffn_context *ctx = test_context();
    cr_assert_eq(clffn_context_quantized_inputs(ctx), 0, "off by default");
    quantized_context(ctx);
    cr_assert_eq(clffn_context_kernel_max_tokens(ctx, CLFFN_KERNELS_COMPRESSED),
                 CLFFN_MAX_KERNEL_TOKENS, "the classes' crossovers apart");
    cr_assert_eq(clffn_context_quantized_inputs(ctx), 1);
    static const clffn_dtype types[] = {CLFFN_DTYPE_Q8_0, CLFFN_DTYPE_Q4_0, CLFFN_DTYPE_BF16};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; ++t) {
        for (int gated = 0; gated < 2; ++gated) {
            quantized_inputs_case(ctx, types[t], gated, 96, 160);
            quantized_inputs_case(ctx, types[t], !gated, 128, 64);
        }
    }
    /* bf16 rows of any length: 3 chunks of 32 and 4 values past them, 2 and 6; 70 and 102 rows
     * end in a short group of rows where several go to a work-item */
    quantized_inputs_case(ctx, CLFFN_DTYPE_BF16, 1, 100, 70);
    quantized_inputs_case(ctx, CLFFN_DTYPE_BF16, 0, 102, 70);
    clffn_context_destroy(ctx);
}

/* The forms of other CPUs than the host's (clffn__set_cpu_dot_products): mode 0, none of AVX-512
 * VNNI and BF16 (vpdpbusd and vdpbf16ps, the test above on a CPU with them); mode 2, also the
 * quantized types' AVX2 form on an AVX-512 host (elsewhere the host's form or the portable one). */
static void other_cpu_forms(int mode, size_t ntypes) {
    clffn__set_cpu_dot_products(mode);
    clffn_context *ctx = test_context();
    quantized_context(ctx);
    static const clffn_dtype types[] = {CLFFN_DTYPE_Q8_0, CLFFN_DTYPE_Q4_0, CLFFN_DTYPE_BF16};
    for (size_t t = 0; t < ntypes; ++t) {
        quantized_inputs_case(ctx, types[t], 1, 96, 160);
        quantized_inputs_case(ctx, types[t], 0, 128, 64);
    }
    if (ntypes == 3) { quantized_inputs_case(ctx, CLFFN_DTYPE_BF16, 1, 100, 70); }
    clffn_context_destroy(ctx);
}

Test(compressed, quantized_inputs_without_vnni, .timeout = 600) { other_cpu_forms(0, 3); }

Test(compressed, quantized_inputs_avx2_form, .timeout = 600) { other_cpu_forms(2, 2); }

/* The GPU form of the quantized-inputs product, which a CPU device runs only when given such
 * shapes: a row's lanes taking its half-blocks in turn, fewer half-blocks than lanes (3 and 5
 * blocks), and more (34 blocks: each lane walks several). */
Test(compressed, quantized_inputs_split_shapes, .timeout = 600) {
    clffn_context *ctx = test_context();
    quantized_context(ctx);
    static const size_t shapes[2][CLFFN_WGEMV_PARAMS] = {{32, 4, 8, 16, 8}, {8, 16, 8, 32, 4}};
    static const clffn_dtype types[] = {CLFFN_DTYPE_Q8_0, CLFFN_DTYPE_Q4_0, CLFFN_DTYPE_BF16};
    for (int sh = 0; sh < 2; ++sh) {
        ASSERT_OK(clffn_context_set_wgemv(ctx, shapes[sh]));
        for (size_t t = 0; t < sizeof types / sizeof types[0]; ++t) {
            quantized_inputs_case(ctx, types[t], sh, 96, 160);
            quantized_inputs_case(ctx, types[t], !sh, 1088, 96);
        }
    }
    clffn_context_destroy(ctx);
}

/* A mixture-of-experts layer whose context quantizes the inputs: its experts' products take the
 * same kernels over each expert's gathered rows, each token's rows summed on their own, so each
 * token's output is the sum, over the experts the layer chose for it, of the chosen weight times
 * that expert's output as a dense FFN on the same context (checked against the double reference
 * above). Mixtral's layout at a small shape, q8_0 and q4_0 experts, 1 and 5 tokens. */
Test(compressed, quantized_inputs_in_a_mixture_of_experts, .timeout = 300) {
    enum { E = 4, K = 2 };
    const size_t D = 96, F = 64;
    clffn_context *ctx = test_context();
    quantized_context(ctx);
    const clffn_moe_config mc = clffn_moe_config_default(D, F, E, K);
    static const clffn_dtype types[] = {CLFFN_DTYPE_Q8_0, CLFFN_DTYPE_Q4_0, CLFFN_DTYPE_BF16};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ++ti) {
        test_weights w[E];
        typed_set s[E];
        clffn_host_weights deq[E];
        clffn_ffn *dense[E];
        clffn_moe *moe = NULL;
        float *router = malloc(E * D * sizeof *router);
        cr_assert(router);
        fill_uniform(router, E * D, -0.5f, 0.5f, 71 + ti);
        ASSERT_OK(clffn_moe_create(ctx, &mc, &moe));
        ASSERT_OK(clffn_moe_upload_router(moe, router, NULL));
        for (size_t e = 0; e < E; ++e) {
            test_weights_make(&w[e], &mc.expert, CLFFN_LAYOUT_OUT_IN, 80 + 7 * e + ti);
            typed_make(&s[e], &mc.expert, &w[e], types[ti], CLFFN_LAYOUT_OUT_IN);
            deq[e] = s[e].ref;
            ASSERT_OK(clffn_ffn_upload_weights_typed(clffn_moe_expert(moe, e), CLFFN_LAYOUT_OUT_IN,
                                                     &s[e].typed));
            ASSERT_OK(clffn_ffn_create(ctx, &mc.expert, &dense[e]));
            ASSERT_OK(clffn_ffn_upload_weights_typed(dense[e], CLFFN_LAYOUT_OUT_IN, &s[e].typed));
        }
        static const size_t counts[] = {1, 5};
        for (size_t ci = 0; ci < 2; ++ci) {
            const size_t T = counts[ci];
            float *x = malloc(T * D * sizeof *x), *y = malloc(T * D * sizeof *y);
            float *ye = malloc(E * T * D * sizeof *ye), *wt = malloc(T * K * sizeof *wt);
            int32_t *ch = malloc(T * K * sizeof *ch);
            double *ref = malloc(T * D * sizeof *ref), *plain = malloc(T * D * sizeof *plain);
            cr_assert(x && y && ye && wt && ch && ref && plain);
            fill_uniform(x, T * D, -1, 1, 90 + T);
            ASSERT_OK(clffn_moe_forward_host(moe, T, x, T * D, y, T * D, ch, wt));
            for (size_t e = 0; e < E; ++e) {
                ASSERT_OK(clffn_forward_host(dense[e], T, x, T * D, ye + e * T * D, T * D));
            }
            for (size_t t = 0; t < T; ++t) {
                for (size_t i = 0; i < D; ++i) {
                    double acc = 0;
                    for (size_t j = 0; j < K; ++j) {
                        cr_assert(ch[t * K + j] >= 0 && ch[t * K + j] < E);
                        acc += (double)wt[t * K + j] * ye[((size_t)ch[t * K + j] * T + t) * D + i];
                    }
                    ref[t * D + i] = acc;
                }
            }
            char what[96];
            snprintf(what, sizeof what, "quantized inputs, %s experts, %zu tokens",
                     clffn_dtype_name(types[ti]), T);
            assert_mostly_nonzero(ref, T * D, 0.9, what);
            assert_close(y, ref, T * D, TOL_RTOL, what);
            ASSERT_OK(clffn_moe_reference_forward(&mc, CLFFN_LAYOUT_OUT_IN, router, NULL, deq, T, x,
                                                  plain, NULL, NULL));
            assert_rounding_shows(ref, plain, T * D, types[ti] == CLFFN_DTYPE_BF16 ? 10 : 100,
                                  what);
            free(x), free(y), free(ye), free(wt), free(ch), free(ref), free(plain);
        }
        for (size_t e = 0; e < E; ++e) {
            clffn_ffn_destroy(dense[e]);
            typed_free(&s[e]);
            test_weights_free(&w[e]);
        }
        clffn_moe_destroy(moe);
        free(router);
    }
    clffn_context_destroy(ctx);
}

/* A NaN or an infinity in a token's x makes that token's outputs NaN with quantized inputs, as
 * on the f32 path, and leaves the other tokens' as they were: its block's scale is NaN (q8_0),
 * or the value stays a NaN or an infinity (bf16). */
Test(compressed, quantized_inputs_pass_non_finite_values_on, .timeout = 120) {
    const size_t D = 64, F = 96, T = 3;
    clffn_context *ctx = test_context();
    ASSERT_OK(clffn_context_set_quantized_inputs(ctx, 1));
    static const clffn_dtype types[] = {CLFFN_DTYPE_Q8_0, CLFFN_DTYPE_Q4_0, CLFFN_DTYPE_BF16};
    static const size_t counts[] = {1, T}; /* the one-token form, and the one for more */
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ++ti) {
        clffn_config c = clffn_config_default(D, F);
        c.gated = 1, c.activation = CLFFN_ACT_SILU;
        test_weights w;
        typed_set s;
        clffn_ffn *ffn = typed_ffn(ctx, &c, types[ti], CLFFN_LAYOUT_OUT_IN, 3, &w, &s);
        for (size_t ci = 0; ci < 2; ++ci) {
            const size_t n = counts[ci];
            float x[3 * 64], clean[3 * 64], y[3 * 64];
            fill_uniform(x, n * D, -1, 1, 8);
            ASSERT_OK(clffn_forward_host(ffn, n, x, n * D, clean, n * D));
            const size_t bad = n - 1; /* the last token: a NaN, and for 3 tokens an infinity */
            x[bad * D + 5] = NAN;
            if (n > 1) { x[1 * D + 40] = INFINITY; }
            ASSERT_OK(clffn_forward_host(ffn, n, x, n * D, y, n * D));
            for (size_t t = 0; t < n; ++t) {
                for (size_t i = 0; i < D; ++i) {
                    const int poisoned = t == bad || (n > 1 && t == 1);
                    cr_assert(poisoned ? isnan(y[t * D + i]) : y[t * D + i] == clean[t * D + i],
                              "%s, %zu tokens: token %zu, %zu: %g", clffn_dtype_name(types[ti]), n,
                              t, i, (double)y[t * D + i]);
                }
            }
        }
        clffn_ffn_destroy(ffn);
        typed_free(&s);
        test_weights_free(&w);
    }
    clffn_context_destroy(ctx);
}
