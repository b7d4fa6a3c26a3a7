/* The kernels' own erf (cl/activation.cl, behind exact-erf GELU and its gradient) against the C
 * library's erf in double, in ulps of the float result, on the device, in both its forms (float
 * and float4).
 *
 * The suite sweeps every 509th float bit pattern (8.4 million floats of each sign, through every
 * binade, with the specials) and holds the bound that docs/PERFORMANCE.md states from the sweep
 * of all 2^32 patterns. That full sweep takes minutes, so it runs on request:
 *   CLFFN_ERF_EXHAUSTIVE=1 tests/test_erf --filter 'erf/exhaustive'
 * and prints the largest error and where it is.
 *
 * On a device that flushes subnormals (clffn_context_denormals() 0) a subnormal input counts as
 * zero of its sign, as the header defines, so its expected result is that zero, bit for bit;
 * every normal input keeps the bound. */
#include "clffn_defs.h"
#include "common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The bound the docs state: the largest error measured over all floats on POCL, rounded up. */
#define ERF_MAX_ULP 1.12

static float from_bits(uint32_t b) {
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

static uint32_t to_bits(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

/* |got − ref| in units of the float spacing at |ref| (floats in [2^e, 2^(e+1)) are 2^(e−23)
 * apart; subnormals 2^−149). */
static double ulp_error(float got, double ref) {
    int e;
    frexp(ref, &e); /* |ref| in [2^(e−1), 2^e) */
    const double ulp = ldexp(1.0, (e - 1 < -126 ? -126 : e - 1) - 23);
    return fabs((double)got - ref) / ulp;
}

typedef struct sweep {
    double worst;      /* largest ulp error over finite inputs */
    float worst_x;     /* where */
    size_t checked;    /* finite inputs compared */
    size_t asymmetric; /* inputs where erf(−x) != −erf(x) bit for bit */
} sweep;

/* Checks one chunk of device results y[i] = erf(bits first + i·stride): finite inputs against
 * erf in double, the specials exactly; subnormal inputs against erf(±0) = ±0 where the device
 * flushes them (denormals 0). */
static void check_chunk(sweep *s, uint32_t first, uint32_t stride, size_t n, const float *y,
                        unsigned form, int denormals) {
    for (size_t i = 0; i < n; ++i) {
        const float x = from_bits(first + (uint32_t)i * stride);
        if (!denormals && fpclassify(x) == FP_SUBNORMAL) {
            cr_assert(to_bits(y[i]) == (to_bits(x) & 0x80000000u),
                      "form=%u erf(subnormal %a) = %a on a device that flushes subnormals", form,
                      (double)x, (double)y[i]);
            s->checked++;
        } else if (isnan(x)) {
            cr_assert(isnan(y[i]), "form=%u erf(NaN 0x%08x) = %a", form, to_bits(x), (double)y[i]);
        } else if (isinf(x)) {
            cr_assert(y[i] == (x > 0 ? 1.0f : -1.0f), "form=%u erf(%g) = %a", form, (double)x,
                      (double)y[i]);
        } else {
            const double e = ulp_error(y[i], erf((double)x));
            if (e > s->worst || isnan(y[i])) {
                s->worst = isnan(y[i]) ? INFINITY : e;
                s->worst_x = x;
            }
            s->checked++;
            if (x == 0.0f) {
                cr_assert(to_bits(y[i]) == to_bits(x), "form=%u erf(%g) = %a keeps no sign", form,
                          (double)x, (double)y[i]);
            }
        }
    }
}

/* Sweeps the patterns first, first + stride, … (count of them) in chunks, both forms; for a
 * symmetric sweep (stride even, first < 2^31) also the negative patterns, asserting oddness. */
static sweep run_sweep(clffn_context *ctx, uint32_t stride, uint64_t count, unsigned form) {
    const size_t chunk = (size_t)1 << 22;
    float *pos = malloc(chunk * sizeof *pos), *neg = malloc(chunk * sizeof *neg);
    cr_assert(pos && neg);
    sweep s = {0};
    for (uint64_t done = 0; done < count; done += chunk) {
        const size_t n = (size_t)(count - done < chunk ? count - done : chunk);
        const uint32_t first = (uint32_t)(done * stride);
        ASSERT_OK(clffn__device_erf(&ctx->programs, ctx->queue, first, stride, n, form, pos));
        ASSERT_OK(clffn__device_erf(&ctx->programs, ctx->queue, first | 0x80000000u, stride, n,
                                    form, neg));
        check_chunk(&s, first, stride, n, pos, form, clffn_context_denormals(ctx));
        check_chunk(&s, first | 0x80000000u, stride, n, neg, form, clffn_context_denormals(ctx));
        for (size_t i = 0; i < n; ++i) {
            s.asymmetric += !isnan(pos[i]) && to_bits(neg[i]) != (to_bits(pos[i]) ^ 0x80000000u);
        }
    }
    free(pos);
    free(neg);
    return s;
}

static void assert_sweep(const sweep *s, unsigned form, const char *what) {
    cr_log_info("%s, form=%u: %zu floats, max %.3f ulp at %a (%.9g)", what, form, s->checked,
                s->worst, (double)s->worst_x, (double)s->worst_x);
    cr_assert(s->checked > 0);
    cr_assert(s->worst <= ERF_MAX_ULP, "%s, form=%u: erf(%a = %.9g) is %.3f ulp off (bound %.2f)",
              what, form, (double)s->worst_x, (double)s->worst_x, s->worst, ERF_MAX_ULP);
    cr_assert_eq(s->asymmetric, 0, "%s, form=%u: erf(-x) != -erf(x) at %zu inputs", what, form,
                 s->asymmetric);
}

/* 509 is prime, so the sample walks every mantissa residue and every binade. */
Test(erf, sampled_every_509th_float, .timeout = 240) {
    clffn_context *ctx = test_context();
    const uint32_t stride = 509;
    const uint64_t count = (0x80000000ull + stride - 1) / stride;
    for (unsigned form = 0; form <= CLFFN_ERF_PROBE_VEC; ++form) {
        const sweep s = run_sweep(ctx, stride, count, form);
        assert_sweep(&s, form, "every 509th float");
    }
    clffn_context_destroy(ctx);
}

/* Dense where the two regions meet and near the clamp, and on the tiny inputs where erf(x) is
 * 2x/sqrt(pi) to the last bit. */
static void sweep_edges(clffn_context *ctx, unsigned form) {
    const float edges[] = {1.0f, 4.0f, 0.5f, 2.0f, 3.0f, 1e-20f, 1.17549435e-38f};
    for (size_t k = 0; k < sizeof edges / sizeof edges[0]; ++k) {
        const size_t n = 1 << 16;
        float y[1 << 16];
        const uint32_t first = to_bits(edges[k]) - (uint32_t)(n / 2);
        ASSERT_OK(clffn__device_erf(&ctx->programs, ctx->queue, first, 1, n, form, y));
        sweep s = {0};
        check_chunk(&s, first, 1, n, y, form, clffn_context_denormals(ctx));
        char what[64];
        snprintf(what, sizeof what, "around %g", (double)edges[k]);
        assert_sweep(&s, form, what);
    }
}

Test(erf, region_edges_and_known_values) {
    clffn_context *ctx = test_context();
    for (unsigned form = 0; form <= CLFFN_ERF_PROBE_VEC; ++form) { sweep_edges(ctx, form); }
    /* values fixed by the formula's regions: erf of 4 and beyond is 1 exactly, erf(0) = 0 */
    float y[4];
    ASSERT_OK(
        clffn__device_erf(&ctx->programs, ctx->queue, to_bits(4.0f), 0, 4, CLFFN_ERF_PROBE_VEC, y));
    cr_assert(y[0] == 1.0f && y[3] == 1.0f, "erf(4) = %a", (double)y[0]);
    ASSERT_OK(clffn__device_erf(&ctx->programs, ctx->queue, to_bits(3.4e38f), 0, 1, 0, y));
    cr_assert(y[0] == 1.0f, "erf(3.4e38) = %a", (double)y[0]);
    ASSERT_OK(clffn__device_erf(&ctx->programs, ctx->queue, 0, 0, 1, 0, y));
    cr_assert(to_bits(y[0]) == 0, "erf(0) = %a", (double)y[0]);
    clffn_context_destroy(ctx);
}

/* The bound must not rest on the device dividing exactly: OpenCL allows 2.5 ulp, and NVIDIA's
 * division took erf to 1.130 ulp near x = 0.9993. Where a device offers no IEEE division the
 * kernels correct the quotient; the same functions through that correction with a reciprocal
 * 2 ulp off, up or down, over the region edges and every 4099th float, hold the same bound on
 * any device. */
Test(erf, bound_holds_with_a_division_2_ulp_off, .timeout = 240) {
    clffn_context *ctx = test_context();
    const uint32_t stride = 4099; /* prime */
    for (unsigned vec = 0; vec <= CLFFN_ERF_PROBE_VEC; ++vec) {
        const unsigned form = CLFFN_ERF_PROBE_DIV_2ULP | vec;
        sweep_edges(ctx, form);
        const sweep s = run_sweep(ctx, stride, (0x80000000ull + stride - 1) / stride, form);
        assert_sweep(&s, form, "every 4099th float");
    }
    clffn_context_destroy(ctx);
}

Test(erf, bad_arguments) {
    clffn_context *ctx = test_context();
    float y[1] = {42.0f};
    cr_assert_eq(clffn__device_erf(NULL, NULL, 0, 1, 1, 0, y), CLFFN_ERROR_NULL_ARGUMENT);
    cr_assert_eq(clffn__device_erf(&ctx->programs, ctx->queue, 0, 1, 1, 0, NULL),
                 CLFFN_ERROR_NULL_ARGUMENT);
    cr_assert_eq(clffn__device_erf(&ctx->programs, ctx->queue, 0, 1, 0, 0, y),
                 CLFFN_ERROR_INVALID_ARGUMENT);
    cr_assert_eq(clffn__device_erf(&ctx->programs, ctx->queue, 0, 1, 1, 4, y),
                 CLFFN_ERROR_INVALID_ARGUMENT);
    cr_assert(y[0] == 42.0f);
    clffn_context_destroy(ctx);
}

/* Every float, both forms: the figure in docs/PERFORMANCE.md. Minutes on two cores. */
Test(erf, exhaustive, .timeout = 3600) {
    const char *on = getenv("CLFFN_ERF_EXHAUSTIVE");
    if (!on || strcmp(on, "1") != 0) {
        cr_skip_test("set CLFFN_ERF_EXHAUSTIVE=1 to sweep all 2^32 floats");
    }
    clffn_context *ctx = test_context();
    for (unsigned form = 0; form <= CLFFN_ERF_PROBE_VEC; ++form) {
        const sweep s = run_sweep(ctx, 1, 0x80000000ull, form);
        printf("all floats, form=%u: %zu finite, max %.4f ulp at %a (%.9g)\n", form, s.checked,
               s.worst, (double)s.worst_x, (double)s.worst_x);
        fflush(stdout);
        assert_sweep(&s, form, "all floats");
    }
    clffn_context_destroy(ctx);
}
