#include "common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* splitmix64: small, well mixed, and unrelated to the library's Philox */
static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void fill_uniform(float *a, size_t n, float lo, float hi, uint64_t seed) {
    uint64_t s = seed;
    for (size_t i = 0; i < n; ++i) {
        const double u = (double)(splitmix(&s) >> 11) / 9007199254740992.0;
        a[i] = (float)(lo + (hi - lo) * u);
    }
}

static float *make(size_t n, float bound, uint64_t seed) {
    float *a = malloc((n ? n : 1) * sizeof *a);
    cr_assert(a);
    fill_uniform(a, n, -bound, bound, seed);
    return a;
}

void test_weights_make(test_weights *w, const clffn_config *c, clffn_layout layout, uint64_t seed) {
    (void)layout; /* random values: either layout is just another random matrix */
    const size_t D = c->d_model, F = c->d_ff;
    /* x ~ U(-1, 1): a weight bound of √3/√fan_in gives pre-activations of unit variance */
    const float s1 = (float)(sqrt(3.0) / sqrt((double)D)),
                s2 = (float)(sqrt(3.0) / sqrt((double)F));
    memset(w, 0, sizeof *w);
    w->w1 = make(D * F, s1, seed + 1);
    w->b1 = make(F, 0.5f, seed + 2);
    w->v = make(D * F, s1, seed + 3);
    w->bv = make(F, 0.5f, seed + 4);
    w->w2 = make(D * F, s2, seed + 5);
    w->b2 = make(D, 0.5f, seed + 6);
    w->host.w1 = w->w1;
    w->host.b1 = c->bias1 ? w->b1 : NULL;
    w->host.v = c->gated ? w->v : NULL;
    w->host.bv = c->gated && c->bias_gate ? w->bv : NULL;
    w->host.w2 = w->w2;
    w->host.b2 = c->bias2 ? w->b2 : NULL;
}

void test_weights_free(test_weights *w) {
    free(w->w1);
    free(w->b1);
    free(w->v);
    free(w->bv);
    free(w->w2);
    free(w->b2);
    memset(w, 0, sizeof *w);
}

/* a's n values in type t, and back */
static void *stored(clffn_dtype t, const float *a, size_t n, float **back) {
    size_t bytes;
    ASSERT_OK(clffn_dtype_bytes(t, n, &bytes));
    void *s = malloc(bytes);
    *back = malloc(n * sizeof **back);
    cr_assert(s && *back);
    ASSERT_OK(clffn_convert_weights(t, a, n, s, bytes));
    ASSERT_OK(clffn_convert_to_f32(t, s, bytes, n, *back, n));
    return s;
}

void typed_make(typed_set *s, const clffn_config *c, const test_weights *w, clffn_dtype t,
                clffn_layout layout) {
    const size_t n = c->d_model * c->d_ff;
    s->dtype = t, s->layout = layout;
    s->w1 = stored(t, w->w1, n, &s->r1);
    s->v = stored(t, w->v, n, &s->rv);
    s->w2 = stored(t, w->w2, n, &s->r2);
    s->typed = (clffn_typed_weights){
        t, s->w1, c->gated ? s->v : NULL, s->w2, w->host.b1, w->host.bv, w->host.b2};
    s->ref = (clffn_host_weights){s->r1,      w->host.b1, c->gated ? s->rv : NULL,
                                  w->host.bv, s->r2,      w->host.b2};
}

void typed_free(typed_set *s) {
    free(s->w1), free(s->v), free(s->w2), free(s->r1), free(s->rv), free(s->r2);
}

clffn_context *test_context(void) {
    clffn_context *ctx = NULL;
    ASSERT_OK(clffn_context_create_default(&ctx));
    return ctx;
}

clffn_context *test_clblast_context(void) {
    clffn_context *ctx = test_context();
    ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, CLFFN_KERNELS_F32, 0));
    return ctx;
}

void test_profile_dir(char *dir, char *path, size_t size) {
    cr_assert(mkdtemp(dir));
    setenv("CLFFN_TUNE_DIR", dir, 1);
    unsetenv("CLFFN_NO_TUNING");
    clffn_context *ctx = test_context();
    ASSERT_OK(clffn_tuning_profile_path(clffn_context_cl_device(ctx), path, size));
    clffn_context_destroy(ctx);
}

void test_profile_dir_end(const char *dir, const char *path) {
    remove(path);
    rmdir(dir);
    unsetenv("CLFFN_TUNE_DIR");
}

void test_write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fputs(text, f);
    cr_assert_eq(fclose(f), 0, "%s", path);
}

/* Known defects of OpenCL implementations: the platform (a prefix of CL_PLATFORM_NAME), the
 * driver versions (a prefix of CL_DRIVER_VERSION), the test, and why; ended by a NULL platform.
 * None at present: every defect met so far is worked around in the library or asked of the
 * device (docs/RELIABILITY.md). */
static const struct {
    const char *platform, *driver, *test, *why;
} known_defects[] = {
    {NULL, NULL, NULL, NULL},
};

void test_skip_known_defect(clffn_context *ctx, const char *test) {
    cl_device_id dev = clffn_context_cl_device(ctx);
    cl_platform_id plat = NULL;
    char pname[256] = "", driver[256] = "";
    cr_assert_eq(clGetDeviceInfo(dev, CL_DEVICE_PLATFORM, sizeof plat, &plat, NULL), CL_SUCCESS);
    cr_assert_eq(clGetPlatformInfo(plat, CL_PLATFORM_NAME, sizeof pname - 1, pname, NULL),
                 CL_SUCCESS);
    cr_assert_eq(clGetDeviceInfo(dev, CL_DRIVER_VERSION, sizeof driver - 1, driver, NULL),
                 CL_SUCCESS);
    for (size_t i = 0; known_defects[i].platform; ++i) {
        const size_t np = strlen(known_defects[i].platform), nd = strlen(known_defects[i].driver);
        if (!strcmp(test, known_defects[i].test) &&
            !strncmp(pname, known_defects[i].platform, np) &&
            !strncmp(driver, known_defects[i].driver, nd)) {
            clffn_context_destroy(ctx);
            fprintf(stderr, "%s: skipped, known defect of %s %s: %s\n", test, pname, driver,
                    known_defects[i].why);
            cr_skip_test("known defect of %s %s: %s", pname, driver, known_defects[i].why);
        }
    }
}

int test_timestamps_ordered(clffn_context *ctx) {
    static const char *src = "__kernel void k(__global float *a) { a[get_global_id(0)] += 1.0f; }";
    cl_context cx = clffn_context_cl_context(ctx);
    cl_device_id dev = clffn_context_cl_device(ctx);
    cl_int err;
    cl_command_queue q = clCreateCommandQueue(cx, dev, CL_QUEUE_PROFILING_ENABLE, &err);
    cr_assert_eq(err, CL_SUCCESS);
    cl_program p = clCreateProgramWithSource(cx, 1, &src, NULL, &err);
    cr_assert_eq(err, CL_SUCCESS);
    cr_assert_eq(clBuildProgram(p, 1, &dev, "", NULL, NULL), CL_SUCCESS);
    cl_kernel k = clCreateKernel(p, "k", &err);
    cr_assert_eq(err, CL_SUCCESS);
    const size_t n = 1 << 16;
    cl_mem b = clCreateBuffer(cx, CL_MEM_READ_WRITE, n * sizeof(float), NULL, &err);
    cr_assert_eq(err, CL_SUCCESS);
    cr_assert_eq(clSetKernelArg(k, 0, sizeof b, &b), CL_SUCCESS);
    cl_event ev[3];
    for (int i = 0; i < 3; ++i) {
        cr_assert_eq(clEnqueueNDRangeKernel(q, k, 1, NULL, &n, NULL, 0, NULL, &ev[i]), CL_SUCCESS);
    }
    cr_assert_eq(clFinish(q), CL_SUCCESS);
    cl_ulong last_end = 0;
    int ordered = 1;
    for (int i = 0; i < 3; ++i) {
        cl_ulong s = 0, e = 0;
        cr_assert_eq(clGetEventProfilingInfo(ev[i], CL_PROFILING_COMMAND_START, sizeof s, &s, NULL),
                     CL_SUCCESS);
        cr_assert_eq(clGetEventProfilingInfo(ev[i], CL_PROFILING_COMMAND_END, sizeof e, &e, NULL),
                     CL_SUCCESS);
        ordered = ordered && s >= last_end && e >= s;
        last_end = e;
        clReleaseEvent(ev[i]);
    }
    clReleaseMemObject(b);
    clReleaseKernel(k);
    clReleaseProgram(p);
    clReleaseCommandQueue(q);
    return ordered;
}

void assert_close(const float *y, const double *ref, size_t n, double rtol, const char *what) {
    double max_ref = 0.0;
    for (size_t i = 0; i < n; ++i) { max_ref = fmax(max_ref, fabs(ref[i])); }
    const double tol = rtol * max_ref + TOL_ATOL;
    double worst = 0.0;
    size_t worst_i = 0, first_bad = n;
    for (size_t i = 0; i < n; ++i) {
        const double e = fabs((double)y[i] - ref[i]);
        if (!(e <= tol)) { /* NaN counts as bad */
            if (first_bad == n) { first_bad = i; }
            if (!(e <= worst)) {
                worst = e;
                worst_i = i;
            }
        } else if (e > worst) {
            worst = e;
            worst_i = i;
        }
    }
    cr_assert(first_bad == n,
              "%s: first bad index %zu (got %.9g, want %.9g); worst error %.3g at %zu; "
              "tolerance %.3g (max|ref| %.3g)",
              what, first_bad, first_bad < n ? (double)y[first_bad] : 0.0,
              first_bad < n ? ref[first_bad] : 0.0, worst, worst_i, tol, max_ref);
}

void assert_mostly_nonzero(const double *v, size_t n, double frac, const char *what) {
    size_t nz = 0;
    for (size_t i = 0; i < n; ++i) { nz += v[i] != 0.0; }
    cr_assert((double)nz >= frac * (double)n, "%s: only %zu of %zu values are non-zero", what, nz,
              n);
}

guarded guarded_make(clffn_context *ctx, size_t offset, size_t n, const float *init) {
    guarded g = {NULL, offset, n, offset + n + CANARY};
    cr_assert(offset >= CANARY || offset == 0);
    float *host = malloc(g.total * sizeof *host);
    cr_assert(host);
    for (size_t i = 0; i < g.total; ++i) { host[i] = CANARY_VALUE; }
    if (init) { memcpy(host + offset, init, n * sizeof *host); }
    cl_int err;
    g.mem = clCreateBuffer(clffn_context_cl_context(ctx), CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                           g.total * sizeof *host, host, &err);
    cr_assert_eq(err, CL_SUCCESS);
    free(host);
    return g;
}

void guarded_read(clffn_context *ctx, const guarded *g, float *out) {
    ASSERT_OK(clEnqueueReadBuffer(clffn_context_queue(ctx), g->mem, CL_TRUE,
                                  g->offset * sizeof(float), g->n * sizeof(float), out, 0, NULL,
                                  NULL));
}

void guarded_assert_canaries(clffn_context *ctx, const guarded *g, const char *what) {
    float *host = malloc(g->total * sizeof *host);
    cr_assert(host);
    ASSERT_OK(clEnqueueReadBuffer(clffn_context_queue(ctx), g->mem, CL_TRUE, 0,
                                  g->total * sizeof *host, host, 0, NULL, NULL));
    for (size_t i = 0; i < g->total; ++i) {
        if (i >= g->offset && i < g->offset + g->n) { continue; }
        cr_assert(host[i] == CANARY_VALUE, "%s: canary at float %zu overwritten (%g)", what, i,
                  (double)host[i]);
    }
    free(host);
}

void guarded_free(guarded *g) {
    if (g->mem) { clReleaseMemObject(g->mem); }
    g->mem = NULL;
}

double act_rtol(clffn_activation a) {
    (void)a;
    return TOL_RTOL;
}

void assert_host_forward(clffn_ffn *ffn, const clffn_config *c, const test_weights *w, size_t T,
                         const char *what) {
    const size_t D = c->d_model;
    float *x = malloc(T * D * sizeof *x), *y = malloc(T * D * sizeof *y);
    double *ref = malloc(T * D * sizeof *ref);
    cr_assert(x && y && ref);
    fill_uniform(x, T * D, -1.0f, 1.0f, 17 + T);
    ASSERT_OK(clffn_reference_forward(c, CLFFN_LAYOUT_OUT_IN, &w->host, T, x, 0, 0, 0, ref, NULL));
    ASSERT_OK(clffn_forward_host(ffn, T, x, T * D, y, T * D));
    assert_close(y, ref, T * D, act_rtol(c->activation), what);
    free(x);
    free(y);
    free(ref);
}

/* Rows of n values rounded on the host as the library's converters round them
 * (clffn_convert_weights: GGUF's reference quantizer for q8_0), and back: the inputs a product
 * with quantized inputs multiplies. */
void host_quantized_rows(clffn_dtype w, const float *x, size_t rows, size_t n, float *out) {
    const clffn_dtype xt = w == CLFFN_DTYPE_BF16 ? CLFFN_DTYPE_BF16 : CLFFN_DTYPE_Q8_0;
    size_t bytes = 0;
    ASSERT_OK(clffn_dtype_bytes(xt, n, &bytes));
    unsigned char *q = malloc(bytes);
    cr_assert(q);
    for (size_t r = 0; r < rows; ++r) {
        ASSERT_OK(clffn_convert_weights(xt, x + r * n, n, q, bytes));
        ASSERT_OK(clffn_convert_to_f32(xt, q, bytes, n, out + r * n, n));
    }
    free(q);
}

/* T tokens of x through an FFN whose context quantizes the inputs of q8_0, q4_0 and bf16
 * products: the hidden layer against the double reference run on the weights' values and x
 * rounded on the host, and y against the second product in double over the device's own hidden
 * layer rounded on the host (so a hidden value a rounding boundary apart on the two sides does
 * not move the check). A quantization that differed from GGUF's by one step anywhere would miss
 * by some 1e-3 of the largest value. `exact` (more tokens than the kernels take): the
 * dequantized SGEMMs, whose inputs stay f32, against the plain reference. */
void assert_quantized_forward(clffn_ffn *ffn, const clffn_config *c, const typed_set *s, size_t T,
                              const float *x, int exact, const char *what) {
    const size_t D = c->d_model, F = c->d_ff;
    float *y = malloc(T * D * sizeof *y), *h = malloc(T * F * sizeof *h);
    float *xq = malloc(T * D * sizeof *xq), *hq = malloc(T * F * sizeof *hq);
    double *ref = malloc(T * D * sizeof *ref), *href = malloc(T * F * sizeof *href);
    double *plain = malloc(T * D * sizeof *plain);
    cr_assert(y && h && xq && hq && ref && href && plain);
    ASSERT_OK(clffn_forward_host(ffn, T, x, T * D, y, T * D));
    ASSERT_OK(clffn_reference_forward(c, s->layout, &s->ref, T, x, 0, 0, 0, plain, NULL));
    if (exact) {
        assert_close(y, plain, T * D, act_rtol(c->activation), what);
    } else {
        ASSERT_OK(clffn_ffn_read_hidden(ffn, CLFFN_HIDDEN_OUT, h, T * F, NULL));
        host_quantized_rows(s->dtype, x, T, D, xq);
        ASSERT_OK(clffn_reference_forward(c, s->layout, &s->ref, T, xq, 0, 0, 0, ref, href));
        assert_close(h, href, T * F, act_rtol(c->activation), what);
        host_quantized_rows(s->dtype, h, T, F, hq);
        for (size_t t = 0; t < T; ++t) {
            for (size_t i = 0; i < D; ++i) { /* W2 [D, F] as the out_in layout keeps it */
                double acc = c->bias2 ? s->ref.b2[i] : 0.0;
                for (size_t j = 0; j < F; ++j) { acc += (double)s->r2[i * F + j] * hq[t * F + j]; }
                ref[t * D + i] = acc;
            }
        }
        assert_mostly_nonzero(ref, T * D, 0.9, what);
        assert_close(y, ref, T * D, TOL_RTOL, what);
        assert_rounding_shows(ref, plain, T * D, s->dtype == CLFFN_DTYPE_BF16 ? 10 : 100, what);
    }
    free(y), free(h), free(xq), free(hq), free(ref), free(href), free(plain);
}

void assert_rounding_shows(const double *rounded, const double *plain, size_t n, double margin,
                           const char *what) {
    double worst = 0, top = 0;
    for (size_t i = 0; i < n; ++i) {
        worst = fabs(rounded[i] - plain[i]) > worst ? fabs(rounded[i] - plain[i]) : worst;
        top = fabs(plain[i]) > top ? fabs(plain[i]) : top;
    }
    cr_assert_gt(worst, margin * TOL_RTOL * top, "%s: rounding the inputs moves y by only %g of %g",
                 what, worst, top);
}
