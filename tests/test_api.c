/* The rest of the public API: version and status strings, config defaults, activation names,
 * initialisers, hidden tensors, caller-owned weights (stacked and separate gate), the in-place
 * residual FFN, workspace growth, kernel loading from CLFFN_KERNEL_DIR, the SGEMM's K-split and
 * its product against a double reference. The context's settings and profiles: test_settings.c. */
#include "common.h"
#include "tuning.h"

#include <clblast_c.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

Test(api, version_and_status_strings) {
    cr_assert_eq(clffn_version_number(), CLFFN_VERSION_NUMBER);
    cr_assert_str_eq(clffn_version_string(), CLFFN_VERSION_STRING);
    cr_assert_str_eq(clffn_status_string(CLFFN_SUCCESS), "CLFFN_SUCCESS");
    cr_assert_str_eq(clffn_status_string(-5), "CL_OUT_OF_RESOURCES");
    cr_assert_str_eq(clffn_status_string(-1017), "CLBlastInvalidDimension");
    for (int s = CLFFN_ERROR_PROFILING_TIMES; s <= CLFFN_ERROR_BASE; ++s) {
        cr_assert(strncmp(clffn_status_string(s), "CLFFN_ERROR_", 12) == 0, "status %d unnamed", s);
    }
    cr_assert_str_eq(clffn_status_string(123456), "unknown status");
}

Test(api, config_defaults_match_labml) {
    const clffn_config c = clffn_config_default(512, 2048);
    cr_assert_eq(c.d_model, 512);
    cr_assert_eq(c.d_ff, 2048);
    cr_assert_eq(c.activation, CLFFN_ACT_RELU);
    cr_assert(!c.gated && c.bias1 && c.bias2 && c.bias_gate && !c.residual);
    cr_assert(c.dropout == 0.1f);
    ASSERT_OK(clffn_config_validate(&c));
}

Test(api, activation_names) {
    for (int a = 0; a < CLFFN_ACT_COUNT_; ++a) {
        clffn_activation back;
        int gated = 7;
        ASSERT_OK(
            clffn_activation_parse(clffn_activation_name((clffn_activation)a), &back, &gated));
        cr_assert_eq((int)back, a);
        cr_assert_eq(gated, 0);
    }
    const struct {
        const char *name;
        clffn_activation act;
        int gated;
    } glu[] = {{"GLU", CLFFN_ACT_SIGMOID, 1},       {"ReGLU", CLFFN_ACT_RELU, 1},
               {"GEGLU", CLFFN_ACT_GELU, 1},        {"SwiGLU", CLFFN_ACT_SILU, 1},
               {"bilinear", CLFFN_ACT_IDENTITY, 1}, {"swish", CLFFN_ACT_SILU, 0}};
    for (size_t i = 0; i < sizeof glu / sizeof glu[0]; ++i) {
        clffn_activation a;
        int gated = -1;
        ASSERT_OK(clffn_activation_parse(glu[i].name, &a, &gated));
        cr_assert(a == glu[i].act && gated == glu[i].gated, "%s", glu[i].name);
    }
}

/* nn.Linear: U(±1/√fan_in) for weights and biases; numpy: randn·0.01 and zero biases. Same
 * seed, same values; IN_OUT is the transpose of OUT_IN. */
Test(api, initialisers) {
    clffn_config c = clffn_config_default(64, 256);
    c.gated = 1;
    const size_t D = 64, F = 256, n = D * F;
    float *a = malloc((3 * n + 3 * F + D) * sizeof *a),
          *b = malloc((3 * n + 3 * F + D) * sizeof *b);
    cr_assert(a && b);
    clffn_weight_arrays wa = {a, a + 3 * n, a + n, a + 3 * n + F, a + 2 * n, a + 3 * n + 2 * F};
    clffn_weight_arrays wb = {b, b + 3 * n, b + n, b + 3 * n + F, b + 2 * n, b + 3 * n + 2 * F};
    ASSERT_OK(clffn_init_weights_host(&c, CLFFN_INIT_TORCH_LINEAR, 5, CLFFN_LAYOUT_OUT_IN, &wa));
    const double bound1 = 1.0 / sqrt((double)D), bound2 = 1.0 / sqrt((double)F);
    double m1 = 0, m2 = 0, mb2 = 0, sum = 0;
    for (size_t i = 0; i < n; ++i) {
        m1 = fmax(m1, fabs(wa.w1[i]));
        m2 = fmax(m2, fabs(wa.w2[i]));
        sum += wa.w1[i];
    }
    for (size_t i = 0; i < D; ++i) { mb2 = fmax(mb2, fabs(wa.b2[i])); }
    cr_assert(m1 <= bound1 && m1 > 0.95 * bound1, "W1 max %g, bound %g", m1, bound1);
    cr_assert(m2 <= bound2 && m2 > 0.95 * bound2, "W2 max %g, bound %g", m2, bound2);
    cr_assert(mb2 <= bound2 && mb2 > 0.5 * bound2, "b2 max %g, bound %g", mb2, bound2);
    cr_assert(fabs(sum / n) < 0.05 * bound1, "W1 mean %g", sum / n);
    cr_assert(memcmp(wa.w1, wa.v, n * sizeof *a) != 0, "W1 and V drew the same stream");
    /* the values themselves, element by element from their definition: element i of a tensor
     * is word i & 3 of Philox block i >> 2 on the tensor's stream (W1 is stream 1, b2 stream 6),
     * its top 24 bits a uniform in [0, 1) */
    const size_t probe[] = {0, 1, 2, 3, 4, 7, 4097, n - 1};
    for (size_t k = 0; k < sizeof probe / sizeof probe[0]; ++k) {
        for (int t = 0; t < 2; ++t) {
            const size_t i = t ? probe[k] % D : probe[k];
            const uint32_t ctr[4] = {(uint32_t)(i >> 2), 0, t ? 6u : 1u, 0}, key[2] = {5, 0};
            uint32_t r[4];
            clffn_philox4x32_10(ctr, key, r);
            const float u = (float)(r[i & 3] >> 8) * (1.0f / 16777216.0f);
            const float want = (float)(t ? bound2 : bound1) * (2.0f * u - 1.0f);
            const float got = t ? wa.b2[i] : wa.w1[i];
            cr_assert(got == want, "%s[%zu] = %.9g, want %.9g", t ? "b2" : "W1", i, (double)got,
                      (double)want);
        }
    }
    /* IN_OUT is the transpose, value for value */
    ASSERT_OK(clffn_init_weights_host(&c, CLFFN_INIT_TORCH_LINEAR, 5, CLFFN_LAYOUT_IN_OUT, &wb));
    for (size_t o = 0; o < F; ++o) {
        for (size_t i = 0; i < D; ++i) { cr_assert(wa.w1[o * D + i] == wb.w1[i * F + o]); }
    }
    for (size_t o = 0; o < D; ++o) {
        for (size_t j = 0; j < F; ++j) { cr_assert(wa.w2[o * F + j] == wb.w2[j * D + o]); }
    }
    /* numpy: standard deviation 0.01, mean 0, zero biases */
    ASSERT_OK(clffn_init_weights_host(&c, CLFFN_INIT_NUMPY_RANDN, 5, CLFFN_LAYOUT_IN_OUT, &wb));
    double s = 0, s2 = 0;
    for (size_t i = 0; i < n; ++i) {
        s += wb.w1[i];
        s2 += (double)wb.w1[i] * wb.w1[i];
    }
    const double mean = s / n, sd = sqrt(s2 / n - mean * mean);
    cr_assert(fabs(sd - 0.01) < 0.0005 && fabs(mean) < 0.0005, "randn sd %g mean %g", sd, mean);
    for (size_t i = 0; i < F; ++i) { cr_assert(wb.b1[i] == 0.0f && wb.bv[i] == 0.0f); }
    for (size_t i = 0; i < D; ++i) { cr_assert(wb.b2[i] == 0.0f); }
    free(a);
    free(b);
}

/* PRE, GATE and OUT against the reference, for a gated FFN. */
Test(api, hidden_tensors) {
    clffn_context *ctx = test_context();
    clffn_config c = clffn_config_default(10, 30);
    c.gated = 1;
    c.activation = CLFFN_ACT_SILU;
    const size_t T = 6, D = 10, F = 30;
    test_weights w;
    test_weights_make(&w, &c, CLFFN_LAYOUT_IN_OUT, 8);
    float x[T * D], y[T * D], h[T * F];
    fill_uniform(x, T * D, -1, 1, 4);
    clffn_ffn *ffn = NULL;
    ASSERT_OK(clffn_ffn_create(ctx, &c, &ffn));
    ASSERT_OK(clffn_ffn_upload_weights(ffn, CLFFN_LAYOUT_IN_OUT, &w.host));
    ASSERT_OK(clffn_forward_host(ffn, T, x, T * D, y, T * D));
    double pre[T * F], gate[T * F];
    for (size_t t = 0; t < T; ++t) {
        for (size_t j = 0; j < F; ++j) {
            double a = w.b1[j], g = w.bv[j];
            for (size_t i = 0; i < D; ++i) {
                a += (double)x[t * D + i] * w.w1[i * F + j];
                g += (double)x[t * D + i] * w.v[i * F + j];
            }
            pre[t * F + j] = a;
            gate[t * F + j] = g;
        }
    }
    size_t tokens = 0;
    ASSERT_OK(clffn_ffn_read_hidden(ffn, CLFFN_HIDDEN_PRE, h, T * F, &tokens));
    cr_assert_eq(tokens, T);
    assert_close(h, pre, T * F, TOL_RTOL, "PRE");
    ASSERT_OK(clffn_ffn_read_hidden(ffn, CLFFN_HIDDEN_GATE, h, T * F, NULL));
    assert_close(h, gate, T * F, TOL_RTOL, "GATE");
    double out[T * F], yref[T * D];
    ASSERT_OK(clffn_reference_forward(&c, CLFFN_LAYOUT_IN_OUT, &w.host, T, x, 0, 0, 0, yref, out));
    ASSERT_OK(clffn_ffn_read_hidden(ffn, CLFFN_HIDDEN_OUT, h, T * F, NULL));
    assert_close(h, out, T * F, TOL_RTOL, "OUT");
    clffn_ffn_destroy(ffn);
    clffn_context_destroy(ctx);
    test_weights_free(&w);
}

static cl_mem device_copy(clffn_context *ctx, const float *src, size_t n, size_t pad) {
    cl_int err;
    cl_mem m = clCreateBuffer(clffn_context_cl_context(ctx), CL_MEM_READ_WRITE,
                              (n + pad) * sizeof(float), NULL, &err);
    cr_assert_eq(err, CL_SUCCESS);
    ASSERT_OK(clEnqueueWriteBuffer(clffn_context_queue(ctx), m, CL_TRUE, pad * sizeof(float),
                                   n * sizeof(float), src, 0, NULL, NULL));
    return m;
}

/* W1 and V stacked in the layout's stacked form (clffn_device_weights), a new array. */
static float *stack_w1_v(const test_weights *w, clffn_layout layout, size_t D, size_t F) {
    float *st = malloc(2 * D * F * sizeof *st);
    cr_assert(st);
    if (layout == CLFFN_LAYOUT_OUT_IN) {
        memcpy(st, w->w1, D * F * sizeof *st);
        memcpy(st + D * F, w->v, D * F * sizeof *st);
    } else {
        for (size_t i = 0; i < D; ++i) {
            memcpy(st + i * 2 * F, w->w1 + i * F, F * sizeof *st);
            memcpy(st + i * 2 * F + F, w->v + i * F, F * sizeof *st);
        }
    }
    return st;
}

/* Releases buffers the FFN retained while bound, checking that our releases and its destroy
 * balance: each must be down to our one reference. */
static void release_balanced(cl_mem *all, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        /* POCL drops a finished command's references from its own threads a moment after the
         * command completes: wait up to 2 s for the count to come down */
        cl_uint refs = 0;
        for (int k = 0; k < 200; ++k) {
            clGetMemObjectInfo(all[i], CL_MEM_REFERENCE_COUNT, sizeof refs, &refs, NULL);
            if (refs == 1) { break; }
            const struct timespec ms10 = {0, 10000000};
            nanosleep(&ms10, NULL);
        }
        cr_assert_eq(refs, 1, "buffer %zu left with %u references", i, refs);
        clReleaseMemObject(all[i]);
    }
}

/* One layout of bound_device_weights: V separate, then stacked, on the caller's queue q. */
static void bound_weights_layout(clffn_context *ctx, cl_command_queue q, const clffn_config *c,
                                 clffn_layout layout) {
    const size_t T = 9, D = c->d_model, F = c->d_ff;
    test_weights w;
    test_weights_make(&w, c, layout, 20 + (int)layout);
    float x[9 * 14], y[9 * 14];
    double ref[9 * 14];
    cr_assert(T * D <= sizeof x / sizeof x[0]);
    fill_uniform(x, T * D, -1, 1, 6);
    ASSERT_OK(clffn_reference_forward(c, layout, &w.host, T, x, 0, 0, 0, ref, NULL));
    float *st = stack_w1_v(&w, layout, D, F);
    cl_mem w1 = device_copy(ctx, w.w1, D * F, 3), v = device_copy(ctx, w.v, D * F, 5);
    cl_mem stk = device_copy(ctx, st, 2 * D * F, 7), w2 = device_copy(ctx, w.w2, D * F, 1);
    cl_mem b1 = device_copy(ctx, w.b1, F, 2), bv = device_copy(ctx, w.bv, F, 9);
    cl_mem b2 = device_copy(ctx, w.b2, D, 4);
    guarded gx = guarded_make(ctx, CANARY, T * D, x),
            gy = guarded_make(ctx, CANARY + 1, T * D, NULL);
    clffn_ffn *ffn = NULL;
    ASSERT_OK(clffn_ffn_create(ctx, c, &ffn));
    for (int stacked = 0; stacked < 2; ++stacked) {
        const clffn_device_weights dw = {stacked ? (clffn_buffer){stk, 7} : (clffn_buffer){w1, 3},
                                         {b1, 2},
                                         stacked ? (clffn_buffer){NULL, 0} : (clffn_buffer){v, 5},
                                         {bv, 9},
                                         {w2, 1},
                                         {b2, 4}};
        ASSERT_OK(clffn_ffn_bind_weights(ffn, layout, &dw));
        cl_event ev = NULL;
        ASSERT_OK(clffn_forward(ffn, T, gx.mem, gx.offset, gy.mem, gy.offset, q, &ev));
        ASSERT_OK(clWaitForEvents(1, &ev));
        clReleaseEvent(ev);
        guarded_read(ctx, &gy, y);
        assert_close(y, ref, T * D, act_rtol(c->activation), stacked ? "stacked" : "separate");
        guarded_assert_canaries(ctx, &gy, "bound weights");
    }
    clffn_ffn_destroy(ffn);
    cl_mem all[] = {w1, v, stk, w2, b1, bv, b2}; /* the FFN retained them */
    release_balanced(all, sizeof all / sizeof all[0]);
    guarded_free(&gx);
    guarded_free(&gy);
    free(st);
    test_weights_free(&w);
}

/* Caller-owned weights at offsets: V separate (two SGEMMs) and stacked with W1 (one SGEMM), in
 * both layouts; all equal the reference. The caller's own context and queue drive it. */
Test(api, bound_device_weights) {
    cl_platform_id plat;
    cl_device_id dev;
    cl_int err;
    cr_assert_eq(clGetPlatformIDs(1, &plat, NULL), CL_SUCCESS);
    cr_assert_eq(clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &dev, NULL), CL_SUCCESS);
    cl_context clctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    cr_assert_eq(err, CL_SUCCESS);
    cl_command_queue q = clCreateCommandQueue(clctx, dev, 0, &err);
    cr_assert_eq(err, CL_SUCCESS);
    clffn_context *ctx = NULL;
    ASSERT_OK(clffn_context_create(clctx, dev, &ctx));
    clffn_config c = clffn_config_default(14, 22);
    c.gated = 1;
    c.activation = CLFFN_ACT_GELU;
    bound_weights_layout(ctx, q, &c, CLFFN_LAYOUT_OUT_IN);
    bound_weights_layout(ctx, q, &c, CLFFN_LAYOUT_IN_OUT);
    clffn_context_destroy(ctx);
    clReleaseCommandQueue(q);
    clReleaseContext(clctx);
}

/* y = FFN(x) + x written over x itself. */
Test(api, in_place_residual) {
    clffn_context *ctx = test_context();
    clffn_config c = clffn_config_default(16, 48);
    c.residual = 1;
    c.activation = CLFFN_ACT_GELU_TANH;
    const size_t T = 11, D = 16;
    test_weights w;
    test_weights_make(&w, &c, CLFFN_LAYOUT_OUT_IN, 12);
    float x[T * D], y[T * D];
    double ref[T * D];
    fill_uniform(x, T * D, -1, 1, 13);
    ASSERT_OK(clffn_reference_forward(&c, CLFFN_LAYOUT_OUT_IN, &w.host, T, x, 0, 0, 0, ref, NULL));
    clffn_ffn *ffn = NULL;
    ASSERT_OK(clffn_ffn_create(ctx, &c, &ffn));
    ASSERT_OK(clffn_ffn_upload_weights(ffn, CLFFN_LAYOUT_OUT_IN, &w.host));
    guarded g = guarded_make(ctx, CANARY + 2, T * D, x);
    ASSERT_OK(
        clffn_forward(ffn, T, g.mem, g.offset, g.mem, g.offset, clffn_context_queue(ctx), NULL));
    guarded_read(ctx, &g, y);
    assert_close(y, ref, T * D, act_rtol(c.activation), "in-place residual");
    guarded_assert_canaries(ctx, &g, "in-place residual");
    guarded_free(&g);
    clffn_ffn_destroy(ffn);
    clffn_context_destroy(ctx);
    test_weights_free(&w);
}

/* The workspace grows and shrinking calls reuse it; results stay right at every size. */
Test(api, token_counts_vary) {
    clffn_context *ctx = test_context();
    clffn_config c = clffn_config_default(8, 24);
    test_weights w;
    test_weights_make(&w, &c, CLFFN_LAYOUT_OUT_IN, 2);
    clffn_ffn *ffn = NULL;
    ASSERT_OK(clffn_ffn_create(ctx, &c, &ffn));
    ASSERT_OK(clffn_ffn_init_weights(ffn, CLFFN_INIT_TORCH_LINEAR, 3));
    ASSERT_OK(clffn_ffn_upload_weights(ffn, CLFFN_LAYOUT_OUT_IN, &w.host));
    const size_t ts[] = {3, 40, 1, 17, 40, 2};
    float x[40 * 8], y[40 * 8];
    double ref[40 * 8];
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; ++i) {
        fill_uniform(x, ts[i] * 8, -1, 1, 100 + i);
        ASSERT_OK(clffn_reference_forward(&c, CLFFN_LAYOUT_OUT_IN, &w.host, ts[i], x, 0, 0, 0, ref,
                                          NULL));
        ASSERT_OK(clffn_forward_host(ffn, ts[i], x, ts[i] * 8, y, ts[i] * 8));
        assert_close(y, ref, ts[i] * 8, TOL_RTOL, "varying tokens");
    }
    clffn_ffn_destroy(ffn);
    clffn_context_destroy(ctx);
    test_weights_free(&w);
}

/* init_weights uploads what init_weights_host computes. */
Test(api, init_weights_uploads_host_values) {
    clffn_context *ctx = test_context();
    clffn_config c = clffn_config_default(12, 20);
    const size_t D = 12, F = 20, T = 4;
    float buf[2 * 12 * 20 + 20 + 12];
    clffn_weight_arrays wa = {buf, buf + 2 * D * F, NULL, NULL, buf + D * F, buf + 2 * D * F + F};
    ASSERT_OK(clffn_init_weights_host(&c, CLFFN_INIT_TORCH_LINEAR, 77, CLFFN_LAYOUT_OUT_IN, &wa));
    const clffn_host_weights hw = {wa.w1, wa.b1, NULL, NULL, wa.w2, wa.b2};
    float x[T * D], y[T * D];
    double ref[T * D];
    fill_uniform(x, T * D, -1, 1, 1);
    ASSERT_OK(clffn_reference_forward(&c, CLFFN_LAYOUT_OUT_IN, &hw, T, x, 0, 0, 0, ref, NULL));
    clffn_ffn *ffn = NULL;
    ASSERT_OK(clffn_ffn_create(ctx, &c, &ffn));
    ASSERT_OK(clffn_ffn_init_weights(ffn, CLFFN_INIT_TORCH_LINEAR, 77));
    ASSERT_OK(clffn_forward_host(ffn, T, x, T * D, y, T * D));
    assert_close(y, ref, T * D, TOL_RTOL, "init_weights");
    clffn_ffn_destroy(ffn);
    clffn_context_destroy(ctx);
}

static void copy_kernels(const char *dir) {
    for (size_t i = 0; i < clffn_embedded_source_count; ++i) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, clffn_embedded_sources[i].name);
        test_write_text(path, clffn_embedded_sources[i].text);
    }
}

/* CLFFN_KERNEL_DIR: sources are read from the folder; a missing file is KERNEL_SOURCE; a
 * broken kernel is CL_BUILD_PROGRAM_FAILURE with the compiler's log kept. */
Test(api, kernel_dir_override) {
    char dir[] = "/tmp/clffn-kdir-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    setenv("CLFFN_KERNEL_DIR", dir, 1);
    clffn_context *ctx = test_context();
    clffn_config c = clffn_config_default(8, 8);
    clffn_ffn *ffn = NULL;
    ASSERT_STATUS(clffn_ffn_create(ctx, &c, &ffn), CLFFN_ERROR_KERNEL_SOURCE);
    copy_kernels(dir);
    cr_assert(c.dropout > 0.0f);
    ASSERT_OK(clffn_ffn_create(ctx, &c, &ffn));
    ASSERT_OK(clffn_ffn_init_weights(ffn, CLFFN_INIT_TORCH_LINEAR, 3));
    float x[2 * 8], y0[2 * 8], y1[2 * 8];
    fill_uniform(x, 2 * 8, -1.0f, 1.0f, 5);
    ASSERT_OK(clffn_forward_host(ffn, 2, x, 2 * 8, y0, 2 * 8));
    char path[512];
    snprintf(path, sizeof path, "%s/epilogue.cl", dir);
    test_write_text(
        path, "__kernel void clffn_epilogue1(__global float *p) { p[0] = undefined_name; }\n");
    /* the dropout kernels are built when training starts: that build fails now, and the FFN
     * stays in inference mode (the same output as before, no mask) */
    ASSERT_STATUS(clffn_ffn_set_training(ffn, 1), CL_BUILD_PROGRAM_FAILURE);
    ASSERT_OK(clffn_forward_host(ffn, 2, x, 2 * 8, y1, 2 * 8));
    cr_assert_arr_eq(y0, y1, sizeof y0, "the failed switch to training changed the forward");
    clffn_ffn_destroy(ffn);
    ffn = NULL;
    c.activation = CLFFN_ACT_GELU; /* a key not yet cached in this context */
    ASSERT_STATUS(clffn_ffn_create(ctx, &c, &ffn), CL_BUILD_PROGRAM_FAILURE);
    cr_assert_null(ffn);
    cr_assert(strstr(clffn_context_build_log(ctx), "undefined_name") != NULL, "log: %s",
              clffn_context_build_log(ctx));
    clffn_context_destroy(ctx);
    for (size_t i = 0; i < clffn_embedded_source_count; ++i) {
        snprintf(path, sizeof path, "%s/%s", dir, clffn_embedded_sources[i].name);
        unlink(path);
    }
    rmdir(dir);
}

/* clffn_gemm_k_split: the blocks cover k exactly, in order, all but the last of one length that
 * is a multiple of 64, at least the asked block and less than twice it (plus rounding); no split
 * for 0 or k < 2 blocks. Checked against a
 * direct enumeration for every k up to 5000 and a spread of blocks. */
Test(api, gemm_k_split) {
    const size_t kbs[] = {0, 1, 63, 64, 100, 128, 256, 384, 1000, 4096};
    for (size_t i = 0; i < sizeof kbs / sizeof kbs[0]; ++i) {
        for (size_t k = 1; k <= 5000; ++k) {
            size_t b = 0;
            const size_t n = clffn_gemm_k_split(k, kbs[i], &b);
            cr_assert_eq(n, clffn_gemm_k_split(k, kbs[i], NULL));
            cr_assert(n >= 1 && b >= 1, "k %zu kb %zu", k, kbs[i]);
            if (kbs[i] == 0 || k < 2 * kbs[i]) {
                cr_assert(n == 1 && b == k, "k %zu kb %zu: %zu × %zu", k, kbs[i], n, b);
                continue;
            }
            if (n == 1) {
                cr_assert_eq(b, k);
                continue;
            }
            cr_assert_eq(b % 64, 0, "k %zu kb %zu: block %zu", k, kbs[i], b);
            cr_assert((n - 1) * b < k && n * b >= k, "k %zu kb %zu: %zu × %zu", k, kbs[i], n, b);
            /* not shorter than asked, and within one rounding to 64 of less than twice it */
            cr_assert(b >= kbs[i] && b < 2 * kbs[i] + 64, "k %zu kb %zu: block %zu", k, kbs[i], b);
        }
    }
    size_t b;
    cr_assert_eq(clffn_gemm_k_split(5632, 256, &b), 22);
    cr_assert_eq(b, 256);
    cr_assert_eq(clffn_gemm_k_split(640, 256, &b), 2);
    cr_assert_eq(b, 320);
    cr_assert_eq(clffn_gemm_k_split(200, 64, &b), 2);
    cr_assert_eq(b, 128);
    cr_assert_eq(clffn_gemm_k_split(511, 256, &b), 1);
    cr_assert_eq(b, 511);
}

/* clffn_sgemm, the path of every FFN product, against a double-precision product: all four
 * transpose combinations, odd sizes, non-zero offsets, leading dimensions wider than the rows,
 * β ≠ 0, and a K long enough for three 64-blocks (so the first block alone carries β). */
Test(api, sgemm_matches_reference) {
    clffn_context *ctx = test_context();
    ASSERT_OK(clffn_context_set_gemm_k_block(ctx, 64));
    ASSERT_OK(clffn_context_set_gemm_k_block_min_rows(ctx, 0)); /* every product */
    ASSERT_OK(clffn_context_set_gemv_max_tokens(ctx, 0));
    const size_t m = 37, n = 29, k = 200, pad = 3, off = 5;
    cl_context cx = clffn_context_cl_context(ctx);
    cl_command_queue q = clffn_context_queue(ctx);
    const size_t na = off + (k > m ? k : m) * (k + m + pad), nc = off + m * (n + pad);
    float *ha = malloc(na * sizeof *ha), *hb = malloc(na * sizeof *hb),
          *hc = malloc(nc * sizeof *hc);
    float *got = malloc(nc * sizeof *got);
    double *want = malloc(m * n * sizeof *want);
    cr_assert(ha && hb && hc && got && want);
    fill_uniform(ha, na, -1, 1, 31), fill_uniform(hb, na, -1, 1, 32),
        fill_uniform(hc, nc, -1, 1, 33);
    cl_int err;
    cl_mem a = clCreateBuffer(cx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, na * 4, ha, &err);
    cr_assert_eq(err, CL_SUCCESS);
    cl_mem b = clCreateBuffer(cx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, na * 4, hb, &err);
    cr_assert_eq(err, CL_SUCCESS);
    cl_mem c = clCreateBuffer(cx, CL_MEM_READ_WRITE, nc * 4, NULL, &err);
    cr_assert_eq(err, CL_SUCCESS);
    for (int ta = 0; ta < 2; ++ta) {
        for (int tb = 0; tb < 2; ++tb) {
            const size_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
            ASSERT_OK(clEnqueueWriteBuffer(q, c, CL_TRUE, 0, nc * 4, hc, 0, NULL, NULL));
            cl_event ev = NULL;
            ASSERT_OK(clffn_sgemm(ctx, ta, tb, m, n, k, 0.5f, a, off, lda, b, off, ldb, -2.0f, c,
                                  off, ldc, q, &ev));
            ASSERT_OK(clWaitForEvents(1, &ev));
            clReleaseEvent(ev);
            ASSERT_OK(clEnqueueReadBuffer(q, c, CL_TRUE, 0, nc * 4, got, 0, NULL, NULL));
            float *cm = malloc(m * n * sizeof *cm);
            cr_assert(cm);
            for (size_t i = 0; i < m; ++i) {
                for (size_t j = 0; j < n; ++j) {
                    double s = 0;
                    for (size_t l = 0; l < k; ++l) {
                        s += (double)ha[off + (ta ? l * lda + i : i * lda + l)] *
                             hb[off + (tb ? j * ldb + l : l * ldb + j)];
                    }
                    want[i * n + j] = 0.5 * s - 2.0 * hc[off + i * ldc + j];
                    cm[i * n + j] = got[off + i * ldc + j];
                }
                for (size_t j = n; j < ldc; ++j) { /* the padding columns are left alone */
                    cr_assert_eq(got[off + i * ldc + j], hc[off + i * ldc + j]);
                }
            }
            cr_assert(memcmp(got, hc, off * sizeof *got) == 0, "before the offset");
            char what[64];
            snprintf(what, sizeof what, "sgemm ta=%d tb=%d", ta, tb);
            assert_close(cm, want, m * n, TOL_RTOL, what);
            free(cm);
        }
    }
    ASSERT_STATUS(clffn_sgemm(NULL, 0, 0, m, n, k, 1, a, 0, k, b, 0, n, 0, c, 0, n, q, NULL),
                  CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(clffn_sgemm(ctx, 0, 0, m, n, k, 1, a, 0, k, NULL, 0, n, 0, c, 0, n, q, NULL),
                  CLFFN_ERROR_NULL_ARGUMENT);
    cl_command_queue ooo = clCreateCommandQueue(cx, clffn_context_cl_device(ctx),
                                                CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &err);
    if (err == CL_SUCCESS) {
        ASSERT_STATUS(clffn_sgemm(ctx, 0, 0, m, n, k, 1, a, 0, k, b, 0, n, 0, c, 0, n, ooo, NULL),
                      CLFFN_ERROR_INVALID_QUEUE);
        clReleaseCommandQueue(ooo);
    }
    clReleaseMemObject(a), clReleaseMemObject(b), clReleaseMemObject(c);
    free(ha), free(hb), free(hc), free(got), free(want);
    clffn_context_destroy(ctx);
}
