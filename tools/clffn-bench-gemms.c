/* clffn-bench-gemms: each SGEMM of the FFN's forward and backward alone, on the context's tuned
 * CLBlast, with the operand arrangement clffn uses (row-major, the weights in the layout the
 * context keeps them in), so a slow pass can be traced to one product; then the forward's two
 * products once more with their inputs token-major (products_of). Buffers are filled first: an
 * untouched POCL buffer reads the kernel's shared zero page and makes every product look faster
 * than it is. Each product runs
 * through clffn_sgemm, the library's own path, with the context's K-block or --k-block's.
 * --gemv-sweep instead times CLBlast's two fast GEMV kernels over a grid of their parameters on
 * the products one token runs as GEMVs (docs/PERFORMANCE.md has the search it made).
 *   clffn-bench-gemms [--tokens T] [--d-model D] [--d-ff F] [--gated] [--reps N] [--k-block N]
 *                     [--gemv-sweep[=fast|rot]] [--device SPEC] */
#define CLFFN_HOOKS /* clffn_sgemm, the path the library runs */
#include "clffn.h"
#include "common.h"
#include "options.h"

#include <clblast_c.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The constants every operand is filled with: each output of a product over k inputs is then
 * k·VA·VB, whatever order a kernel sums in (to within about k/2 roundings of it). */
static const float VA = 0.37f, VB = -0.21f, VC = 0.1f;

/* 0 where each of the count outputs in C is k·VA·VB (within k/2 roundings of it), as every
 * product over k inputs of the constant-filled operands gives, whatever its shape and order of
 * summing; else -1, with the first wrong one named. */
static int check_output(cl_command_queue q, cl_mem C, size_t count, size_t k, float *out,
                        const char *what) {
    if (clEnqueueReadBuffer(q, C, CL_TRUE, 0, count * sizeof *out, out, 0, NULL, NULL) !=
        CL_SUCCESS) {
        return -1;
    }
    const double want = (double)k * VA * VB, tol = fabs(want) * ((double)k * 0x1p-24 + 1e-6);
    for (size_t i = 0; i < count; ++i) {
        if (!(fabs(out[i] - want) <= tol)) {
            fprintf(stderr, "clffn-bench-gemms: %s: output %zu of %zu (k %zu): %g, not %g\n", what,
                    i, count, k, out[i], want);
            return -1;
        }
    }
    return 0;
}

/* Best of reps (after one untimed call) of C[1, n] = a[1, k]·B, B [k, n] (tb NO_TRANS: CLBlast's
 * XgemvFast) or [n, k] (tb TRANS: XgemvFastRot), as one token's products run; < 0 on an error or
 * a wrong output, so that a candidate computing something else is refused, not timed. */
static double time_gemv(const clffn_context *ctx, clffn_transpose tb, size_t n, size_t k, cl_mem A,
                        cl_mem B, cl_mem C, float *out, size_t reps) {
    cl_command_queue q = clffn_context_queue(ctx);
    double best = 1e30;
    for (size_t r = 0; r <= reps; ++r) {
        const double t0 = tool_now_s();
        cl_int err = clffn_sgemm(ctx, CLFFN_NO_TRANS, tb, 1, n, k, 1.0f, A, 0, k, B, 0,
                                 tb == CLFFN_TRANS ? k : n, 0.0f, C, 0, n, q, NULL);
        if (err == CL_SUCCESS) { err = tool_finish(q); }
        if (err != CL_SUCCESS) { return -1; }
        const double t = tool_now_s() - t0;
        if (r > 0 && t < best) { best = t; }
    }
    return check_output(q, C, n, k, out, "a GEMV") == 0 ? best : -1;
}

/* One GEMV kernel: its name, parameter names and the transpose of B that selects it. */
typedef struct gemv_kernel {
    const char *name, *params[3];
    clffn_transpose tb;
} gemv_kernel;

/* Times candidate v of kernel g on the four products one token runs on it ({outputs, inputs}),
 * prints a row (GB/s of weights read per product, total ms) and returns the total seconds; < 0
 * on failure. */
static double gemv_candidate(clffn_context *ctx, const gemv_kernel *g, const size_t v[3],
                             const size_t shapes[4][2], cl_mem A, cl_mem B, cl_mem C, float *out,
                             size_t reps) {
    const char *params[3] = {g->params[0], g->params[1], g->params[2]};
    if (CLBlastOverrideParameters(clffn_context_cl_device(ctx), g->name, CLBlastPrecisionSingle, 3,
                                  params, v) != CLBlastSuccess) {
        fprintf(stderr, "clffn-bench-gemms: CLBlast refused %s %zu/%zu/%zu\n", g->name, v[0], v[1],
                v[2]);
        return -1;
    }
    printf("%-12s %3zu %2zu %2zu", g->name, v[0], v[1], v[2]);
    double total = 0;
    for (int i = 0; i < 4; ++i) {
        const size_t n = shapes[i][0], k = shapes[i][1];
        const double t = time_gemv(ctx, g->tb, n, k, A, B, C, out, reps);
        if (t < 0) {
            fprintf(stderr, "clffn-bench-gemms: %s %zu/%zu/%zu failed\n", g->name, v[0], v[1],
                    v[2]);
            return -1;
        }
        total += t;
        printf(" %7.1f", 4.0 * (double)(n * k) / t * 1e-9);
    }
    printf("  %8.3f ms\n", total * 1e3);
    return total;
}

/* --gemv-sweep: XgemvFast, then XgemvFastRot, over work-group size × work per item × vector
 * width, each candidate scored by the four products one token runs on that kernel (the
 * forward's two with the weights kept one way, the backward's input products with them kept the
 * other). Work-group size × work per item stays ≤ 256: CLBlast runs a fast kernel only where it
 * divides the output count, and larger tiles would leave it for counts like 11008 (43 × 256).
 * Prints every candidate and the fastest by total time; only >= 0 sweeps that kernel alone. */
static int gemv_sweep(clffn_context *ctx, cl_mem A, cl_mem B, cl_mem C, size_t D, size_t F,
                      size_t N1, size_t reps, int only) {
    static const gemv_kernel kernels[2] = {
        {"XgemvFast", {"WGS2", "WPT2", "VW2"}, CLFFN_NO_TRANS},
        {"XgemvFastRot", {"WGS3", "WPT3", "VW3"}, CLFFN_TRANS},
    };
    const size_t shapes[4][2] = {{N1, D}, {D, F}, {F, D}, {D, N1}};
    size_t max_wg = 0;
    clGetDeviceInfo(clffn_context_cl_device(ctx), CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof max_wg,
                    &max_wg, NULL);
    float *out = malloc((N1 > D ? N1 : D) * sizeof *out);
    if (!out || clffn_context_set_gemv_max_tokens(ctx, 1) != CLFFN_SUCCESS) {
        free(out);
        return 1;
    }
    printf("1 token, %zu -> %zu%s, best of %zu: GB/s of weights read on %zux%zu %zux%zu %zux%zu "
           "%zux%zu (outputs x inputs), and their total time\n",
           D, F, N1 > F ? " gated" : "", reps, shapes[0][0], shapes[0][1], shapes[1][0],
           shapes[1][1], shapes[2][0], shapes[2][1], shapes[3][0], shapes[3][1]);
    int rc = 0;
    for (int kind = 0; kind < 2 && rc == 0; ++kind) {
        if (only >= 0 && kind != only) { continue; }
        const gemv_kernel *g = &kernels[kind];
        double best = 1e30;
        size_t win[3] = {0, 0, 0};
        for (size_t wgs = 4; rc == 0 && wgs <= 256 && wgs <= max_wg; wgs *= 2) {
            /* the rotated kernel loads the vector one item per work-item: its tile may not be
             * longer than its work-group (CLBlast's tuner constraint) */
            for (size_t wpt = 1; rc == 0 && wgs * wpt <= 256 && (!kind || wpt <= wgs); wpt *= 2) {
                for (size_t vw = 1; rc == 0 && vw <= wpt && vw <= 16; vw *= 2) {
                    const size_t v[3] = {wgs, wpt, vw};
                    const double t = gemv_candidate(ctx, g, v, shapes, A, B, C, out, reps);
                    if (t < 0) {
                        rc = 1;
                    } else if (t < best) {
                        best = t;
                        memcpy(win, v, sizeof win);
                    }
                }
            }
        }
        if (rc == 0) {
            printf("fastest %s: %s %zu, %s %zu, %s %zu (%.3f ms)\n", g->name, g->params[0], win[0],
                   g->params[1], win[1], g->params[2], win[2], best * 1e3);
        }
        fflush(stdout);
    }
    free(out);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* The command line */

enum {
    OPT_TOKENS = 256,
    OPT_D_MODEL,
    OPT_D_FF,
    OPT_GATED,
    OPT_REPS,
    OPT_K_BLOCK,
    OPT_SWEEP,
    OPT_DEVICE,
    OPT_LAYOUT
};

static const tool_option OPTIONS[] = {
    {"tokens", OPT_TOKENS, TOOL_VALUE, "T", "token rows (default 2048)"},
    {"d-model", OPT_D_MODEL, TOOL_VALUE, "D", "d_model (default 1024)"},
    {"d-ff", OPT_D_FF, TOOL_VALUE, "F", "d_ff (default 2816)"},
    {"gated", OPT_GATED, TOOL_FLAG, NULL, "the gated FFN's products (W1 and V stacked)"},
    {"reps", OPT_REPS, TOOL_VALUE, "N", "timed calls after one untimed (default 3)"},
    {"k-block", OPT_K_BLOCK, TOOL_VALUE, "N",
     "the SGEMMs' K-block (default: the tuning profile's)"},
    {"gemv-sweep", OPT_SWEEP, TOOL_OPTIONAL, "fast|rot",
     "the GEMV kernels' parameters at 1 token instead: both\nkernels, or one (also as a separate "
     "word: --gemv-sweep rot)"},
    {"device", OPT_DEVICE, TOOL_VALUE, "SPEC", "\"platform:device\" or a name substring"},
    {"weight-layout", OPT_LAYOUT, TOOL_VALUE, "out_in|in_out",
     "the layout of the weight operands (default: the\ncontext's, from its tuning profile)"},
    {0},
};

static const tool_cli CLI = {
    "clffn-bench-gemms",
    "[options]",
    "Exit status: 0 success, 1 device or runtime failure (or a wrong GEMV output), 2 usage.\n",
    OPTIONS,
};

typedef struct gemms_args {
    size_t T, D, F, reps, k_block;
    int gated, sweep, only, set_k_block; /* only: -1 both GEMV kernels, 0 XgemvFast, 1 Rot */
    int layout;                          /* --weight-layout: a clffn_layout, or -1 */
    const char *device;
} gemms_args;

/* --gemv-sweep's kernel, from its value or the word after it: 0, or -1 for another value. */
static int sweep_kernel(const char *v, tool_parser *p, gemms_args *a) {
    static const char *const kernels[] = {"fast", "rot", NULL};
    if (!v) { v = tool_take_word(p, kernels); }
    a->sweep = 1;
    a->only = !v ? -1 : !strcmp(v, "fast") ? 0 : !strcmp(v, "rot") ? 1 : -2;
    if (a->only == -2) { fprintf(stderr, "clffn-bench-gemms: --gemv-sweep takes fast or rot\n"); }
    return a->only == -2 ? -1 : 0;
}

static int take_option(int key, tool_parser *p, gemms_args *a) {
    const char *v = p->value;
    const size_t big = (size_t)1 << 30;
    size_t *dst = NULL, min = 1, max = big;
    switch (key) {
    case OPT_TOKENS: dst = &a->T; break;
    case OPT_D_MODEL: dst = &a->D; break;
    case OPT_D_FF: dst = &a->F; break;
    case OPT_REPS: dst = &a->reps, max = 100000; break;
    case OPT_K_BLOCK:
        dst = &a->k_block, min = 0, max = CLFFN_MAX_GEMM_K_BLOCK, a->set_k_block = 1;
        break;
    case OPT_GATED: a->gated = 1; return 0;
    case OPT_DEVICE: a->device = v; return 0;
    case OPT_SWEEP: return sweep_kernel(v, p, a);
    case OPT_LAYOUT:
        a->layout = !strcmp(v, "out_in")   ? CLFFN_LAYOUT_OUT_IN
                    : !strcmp(v, "in_out") ? CLFFN_LAYOUT_IN_OUT
                                           : -1;
        if (a->layout >= 0) { return 0; }
        fprintf(stderr, "clffn-bench-gemms: --weight-layout takes out_in or in_out\n");
        return -1;
    default: return -1;
    }
    if (tool_parse_size(v, min, max, dst) == 0) { return 0; }
    fprintf(stderr, "clffn-bench-gemms: --%s needs an integer %zu ... %zu\n", p->name, min, max);
    return -1;
}

/* -1 to run, else the exit status (0 after --help, 2 after a refusal). */
static int parse_args(int argc, char **argv, gemms_args *a) {
    *a = (gemms_args){2048, 1024, 2816, 3, 0, 0, 0, -1, 0, -1, NULL};
    tool_parser p = tool_parser_start(&CLI, argc, argv);
    for (int key; (key = tool_next(&p)) > 0;) {
        if (take_option(key, &p, a) != 0) { return tool_usage_error(&CLI); }
    }
    return p.status;
}

/* ------------------------------------------------------------------------------------------ */
/* The products */

/* The three operand buffers, filled: A holds every first operand (x, h, dy, dz: [T, max(N1,
 * D)]); B every second one (the weights [N1, D], h [T, F], x [T, D], dz); C every product. */
static cl_int make_buffers(clffn_context *ctx, const gemms_args *a, cl_mem bufs[3]) {
    const size_t T = a->T, D = a->D, F = a->F, N1 = a->gated ? 2 * F : F;
    const cl_context cx = clffn_context_cl_context(ctx);
    const cl_command_queue q = clffn_context_queue(ctx);
    const size_t na = T * (N1 > D ? N1 : D);
    size_t nw = N1 * D;
    if (T * F > nw) { nw = T * F; }
    if (T * D > nw) { nw = T * D; }
    /* with the weights [in, out] the backward's dW1 takes dz as its second operand */
    const size_t most = na > nw ? na : nw, n[3] = {na, most, most};
    const float *fill[3] = {&VA, &VB, &VC};
    cl_int err = CL_SUCCESS;
    for (int i = 0; i < 3 && err == CL_SUCCESS; ++i) {
        bufs[i] = clCreateBuffer(cx, CL_MEM_READ_WRITE, n[i] * 4, NULL, &err);
        if (err == CL_SUCCESS) {
            err = clEnqueueFillBuffer(q, bufs[i], fill[i], 4, 0, n[i] * 4, 0, NULL, NULL);
        }
    }
    return err == CL_SUCCESS ? tool_finish(q) : err;
}

/* One product as clffn_sgemm takes it (row-major): C[m, n] = op(A)·op(B). */
typedef struct product {
    const char *name;
    clffn_transpose ta, tb;
    size_t m, n, k, lda, ldb, ldc;
} product;

enum { N_PRODUCTS = 8 };

/* The FFN's products with the weights kept in the context's layout (W1 and V stacked: [N1, D]
 * as [out, in], [D, N1] as [in, out]; W2 [D, F] or [F, D]), then the two forward products again
 * with their inputs stored token-major ([D, T] and [F, T]). CLBlast's Xgemm takes its second
 * operand that way (b_want_rotated in its xgemm.hpp); called column-major, that operand is
 * clffn's x or h, which it therefore transposes into scratch on every call. The last two lines
 * time the products without that copy: what an arrangement keeping x and h token-major would
 * save on the device at hand. */
static void products_of(const gemms_args *a, clffn_layout layout, product g[N_PRODUCTS]) {
    const size_t T = a->T, D = a->D, F = a->F, N1 = a->gated ? 2 * F : F;
    const int oi = layout == CLFFN_LAYOUT_OUT_IN;
    const clffn_transpose W = oi ? CLFFN_TRANS : CLFFN_NO_TRANS;  /* the forward's weights */
    const clffn_transpose WB = oi ? CLFFN_NO_TRANS : CLFFN_TRANS; /* the backward's */
    const product p[N_PRODUCTS] = {
        {"forward 1: x to [h|g]", CLFFN_NO_TRANS, W, T, N1, D, D, oi ? D : N1, N1},
        {"forward 2: h to y", CLFFN_NO_TRANS, W, T, D, F, F, oi ? F : D, D},
        {"backward: dh from dy", CLFFN_NO_TRANS, WB, T, F, D, D, oi ? F : D, F},
        {"backward: dW2", CLFFN_TRANS, CLFFN_NO_TRANS, oi ? D : F, oi ? F : D, T, oi ? D : F,
         oi ? F : D, oi ? F : D},
        {"backward: dW1|dV", CLFFN_TRANS, CLFFN_NO_TRANS, oi ? N1 : D, oi ? D : N1, T, oi ? N1 : D,
         oi ? D : N1, oi ? D : N1},
        {"backward: dx from dz", CLFFN_NO_TRANS, WB, T, D, N1, N1, oi ? D : N1, D},
        {"forward 1, x token-major", CLFFN_TRANS, W, T, N1, D, T, oi ? D : N1, N1},
        {"forward 2, h token-major", CLFFN_TRANS, W, T, D, F, T, oi ? F : D, D},
    };
    memcpy(g, p, sizeof p);
}

/* Each SGEMM of forward and backward, best of reps after one untimed call, its outputs checked;
 * printed. */
static int time_products(clffn_context *ctx, const gemms_args *a, const product g[N_PRODUCTS],
                         cl_mem A, cl_mem B, cl_mem C, float *out) {
    const cl_command_queue q = clffn_context_queue(ctx);
    const clffn_layout layout = clffn_context_weight_layout(ctx);
    printf("%zu tokens, %zu -> %zu%s, weights %s, K-block %zu, best of %zu after one untimed "
           "call\n",
           a->T, a->D, a->F, a->gated ? " gated" : "",
           layout == CLFFN_LAYOUT_OUT_IN ? "[out, in]" : "[in, out]",
           clffn_context_gemm_k_block(ctx), a->reps);
    for (size_t i = 0; i < N_PRODUCTS; ++i) {
        double best = 1e30;
        for (size_t r = 0; r <= a->reps; ++r) {
            const double t0 = tool_now_s();
            cl_int err = clffn_sgemm(ctx, g[i].ta, g[i].tb, g[i].m, g[i].n, g[i].k, 1.0f, A, 0,
                                     g[i].lda, B, 0, g[i].ldb, 0.0f, C, 0, g[i].ldc, q, NULL);
            if (err == CL_SUCCESS) { err = tool_finish(q); }
            if (err != CL_SUCCESS) {
                fprintf(stderr, "clffn-bench-gemms: %s: %s\n", g[i].name, clffn_status_string(err));
                return 1;
            }
            const double t = tool_now_s() - t0;
            if (r > 0 && t < best) { best = t; }
        }
        if (check_output(q, C, g[i].m * g[i].n, g[i].k, out, g[i].name) != 0) { return 1; }
        printf("%-28s %9.3f ms %9.1f GFLOP/s\n", g[i].name, best * 1e3,
               2.0 * (double)g[i].m * (double)g[i].n * (double)g[i].k / best * 1e-9);
    }
    return 0;
}

static int run_products(clffn_context *ctx, const gemms_args *a, cl_mem A, cl_mem B, cl_mem C) {
    product g[N_PRODUCTS];
    products_of(a, clffn_context_weight_layout(ctx), g);
    size_t most = 0;
    for (size_t i = 0; i < N_PRODUCTS; ++i) {
        if (g[i].m * g[i].n > most) { most = g[i].m * g[i].n; }
    }
    float *out = malloc(most * sizeof *out);
    if (!out) {
        fprintf(stderr, "clffn-bench-gemms: out of host memory\n");
        return 1;
    }
    const int rc = time_products(ctx, a, g, A, B, C, out);
    free(out);
    return rc;
}

static int tool_main(int argc, char **argv) {
    gemms_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) { return rc; }
    clffn_context *ctx = NULL;
    const clffn_status st = clffn_context_create_for_device(a.device, &ctx);
    if (st != CLFFN_SUCCESS) {
        fprintf(stderr, "clffn-bench-gemms: %s\n", clffn_status_string(st));
        return 1;
    }
    if (a.set_k_block) { clffn_context_set_gemm_k_block(ctx, a.k_block); } /* else the profile's */
    if (a.layout >= 0) { clffn_context_set_weight_layout(ctx, (clffn_layout)a.layout); }
    cl_mem bufs[3] = {NULL, NULL, NULL};
    const cl_int err = make_buffers(ctx, &a, bufs);
    if (err != CL_SUCCESS) {
        fprintf(stderr, "clffn-bench-gemms: buffers: %s\n", clffn_status_string(err));
        rc = 1;
    } else if (a.sweep) {
        rc = gemv_sweep(ctx, bufs[0], bufs[1], bufs[2], a.D, a.F, a.gated ? 2 * a.F : a.F, a.reps,
                        a.only);
    } else {
        rc = run_products(ctx, &a, bufs[0], bufs[1], bufs[2]);
    }
    for (size_t i = 0; i < 3; ++i) {
        if (bufs[i]) { clReleaseMemObject(bufs[i]); }
    }
    clffn_context_destroy(ctx);
    return rc;
}

int main(int argc, char **argv) { return tool_exit("clffn-bench-gemms", tool_main(argc, argv)); }
