/* clffn-bench-gemms: each SGEMM of the FFN's forward and backward alone, on the context's tuned
 * CLBlast, with the operand arrangement clffn uses (row-major, OUT_IN weights), so a slow pass
 * can be traced to one product. Buffers are filled first: an untouched POCL buffer reads the
 * kernel's shared zero page and makes every product look faster than it is. Each product runs
 * through clffn_sgemm, the library's own path, with the context's K-block or --k-block's.
 * --gemv-sweep instead times CLBlast's two fast GEMV kernels over a grid of their parameters on
 * the products one token runs as GEMVs (docs/PERFORMANCE.md has the search it made).
 *   clffn-bench-gemms [--tokens T] [--d-model D] [--d-ff F] [--gated] [--reps N] [--k-block N]
 *                     [--gemv-sweep [fast|rot]] */
#define CLFFN_HOOKS /* clffn_sgemm, the path the library runs */
#include "clffn.h"
#include "common.h"

#include <clblast_c.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The value of option name into *out (left as it is when the option is absent); -1 when it is
 * not an integer in [min, max]. */
static int arg(int argc, char **argv, const char *name, size_t min, size_t max, size_t *out) {
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], name) != 0) { continue; }
        if (tool_parse_size(i + 1 < argc ? argv[i + 1] : NULL, min, max, out) != 0) {
            fprintf(stderr, "clffn-bench-gemms: %s needs an integer %zu ... %zu\n", name, min, max);
            return -1;
        }
    }
    return 0;
}

/* The constants every operand is filled with: each output of a product over k inputs is then
 * k·VA·VB, whatever order a kernel sums in (to within about k/2 roundings of it). */
static const float VA = 0.37f, VB = -0.21f, VC = 0.1f;

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
        if (err == CL_SUCCESS) { err = clFinish(q); }
        if (err != CL_SUCCESS) { return -1; }
        const double t = tool_now_s() - t0;
        if (r > 0 && t < best) { best = t; }
    }
    if (clEnqueueReadBuffer(q, C, CL_TRUE, 0, n * sizeof *out, out, 0, NULL, NULL) != CL_SUCCESS) {
        return -1;
    }
    const double want = (double)k * VA * VB, tol = fabs(want) * ((double)k * 0x1p-24 + 1e-6);
    for (size_t i = 0; i < n; ++i) {
        if (!(fabs(out[i] - want) <= tol)) {
            fprintf(stderr, "clffn-bench-gemms: output %zu of %zu x %zu: %g, not %g\n", i, n, k,
                    out[i], want);
            return -1;
        }
    }
    return best;
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

static int tool_main(int argc, char **argv) {
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            puts("usage: clffn-bench-gemms [--tokens T] [--d-model D] [--d-ff F] [--gated] [--reps "
                 "N]\n"
                 "                         [--k-block N]   (default: the tuning profile's block)\n"
                 "                         [--gemv-sweep [fast|rot]]  (the GEMV kernels' "
                 "parameters at 1 token;\n"
                 "                                                   one kernel or both)");
            return 0;
        }
    }
    int gated = 0, sweep = 0, only = -1;
    for (int i = 1; i < argc; ++i) {
        gated |= strcmp(argv[i], "--gated") == 0;
        if (strcmp(argv[i], "--gemv-sweep") != 0) { continue; }
        sweep = 1;
        if (i + 1 < argc && strcmp(argv[i + 1], "fast") == 0) { only = 0; }
        if (i + 1 < argc && strcmp(argv[i + 1], "rot") == 0) { only = 1; }
    }
    size_t T = 2048, D = 1024, F = 2816, reps = 3, k_block = 0;
    const size_t big = (size_t)1 << 30;
    if (arg(argc, argv, "--tokens", 1, big, &T) || arg(argc, argv, "--d-model", 1, big, &D) ||
        arg(argc, argv, "--d-ff", 1, big, &F) || arg(argc, argv, "--reps", 1, 100000, &reps) ||
        arg(argc, argv, "--k-block", 0, CLFFN_MAX_GEMM_K_BLOCK, &k_block)) {
        return 2;
    }
    const size_t N1 = gated ? 2 * F : F;
    clffn_context *ctx = NULL;
    int st = clffn_context_create_default(&ctx);
    if (st != CLFFN_SUCCESS) {
        fprintf(stderr, "clffn-bench-gemms: %s\n", clffn_status_string(st));
        return 1;
    }
    for (int i = 1; i < argc; ++i) { /* else the tuning profile's block */
        if (strcmp(argv[i], "--k-block") == 0) { clffn_context_set_gemm_k_block(ctx, k_block); }
    }
    k_block = clffn_context_gemm_k_block(ctx);
    cl_context cx = clffn_context_cl_context(ctx);
    cl_command_queue q = clffn_context_queue(ctx);
    /* A holds every first operand (x, h, dy, dz: [T, max(N1, D)]); B every second one (the
     * weights [N1, D], h [T, F], x [T, D]); C every product */
    const size_t na = T * (N1 > D ? N1 : D);
    size_t nw = N1 * D;
    if (T * F > nw) { nw = T * F; }
    if (T * D > nw) { nw = T * D; }
    const size_t nc = na > nw ? na : nw;
    cl_int err = CL_SUCCESS;
    cl_mem A = clCreateBuffer(cx, CL_MEM_READ_WRITE, na * 4, NULL, &err);
    cl_mem B = err == CL_SUCCESS ? clCreateBuffer(cx, CL_MEM_READ_WRITE, nw * 4, NULL, &err) : NULL;
    cl_mem C = err == CL_SUCCESS ? clCreateBuffer(cx, CL_MEM_READ_WRITE, nc * 4, NULL, &err) : NULL;
    if (err == CL_SUCCESS) { err = clEnqueueFillBuffer(q, A, &VA, 4, 0, na * 4, 0, NULL, NULL); }
    if (err == CL_SUCCESS) { err = clEnqueueFillBuffer(q, B, &VB, 4, 0, nw * 4, 0, NULL, NULL); }
    if (err == CL_SUCCESS) { err = clEnqueueFillBuffer(q, C, &VC, 4, 0, nc * 4, 0, NULL, NULL); }
    if (err == CL_SUCCESS) { err = clFinish(q); }
    int rc = 0;
    if (err != CL_SUCCESS) {
        fprintf(stderr, "clffn-bench-gemms: buffers: %s\n", clffn_status_string(err));
        rc = 1;
    }
    const struct {
        const char *name;
        clffn_transpose ta, tb;
        size_t m, n, k, lda, ldb, ldc;
    } g[] = {
        {"forward 1: x·[W1|V]^T", CLFFN_NO_TRANS, CLFFN_TRANS, T, N1, D, D, D, N1},
        {"forward 2: h·W2^T", CLFFN_NO_TRANS, CLFFN_TRANS, T, D, F, F, F, D},
        {"backward dh = dy·W2", CLFFN_NO_TRANS, CLFFN_NO_TRANS, T, F, D, D, F, F},
        {"backward dW2 = dy^T·h", CLFFN_TRANS, CLFFN_NO_TRANS, D, F, T, D, F, F},
        {"backward dW1|dV = dz^T·x", CLFFN_TRANS, CLFFN_NO_TRANS, N1, D, T, N1, D, D},
        {"backward dx = dz·[W1|V]", CLFFN_NO_TRANS, CLFFN_NO_TRANS, T, D, N1, N1, D, D},
    };
    if (rc == 0 && sweep) { rc = gemv_sweep(ctx, A, B, C, D, F, N1, reps, only); }
    if (rc == 0 && !sweep) {
        printf("%zu tokens, %zu -> %zu%s, K-block %zu, best of %zu after one untimed call\n", T, D,
               F, gated ? " gated" : "", k_block, reps);
    }
    for (size_t i = 0; rc == 0 && !sweep && i < sizeof g / sizeof g[0]; ++i) {
        double best = 1e30;
        for (size_t r = 0; r <= reps; ++r) {
            const double t0 = tool_now_s();
            err = clffn_sgemm(ctx, g[i].ta, g[i].tb, g[i].m, g[i].n, g[i].k, 1.0f, A, 0, g[i].lda,
                              B, 0, g[i].ldb, 0.0f, C, 0, g[i].ldc, q, NULL);
            if (err == CL_SUCCESS) { err = clFinish(q); }
            if (err != CL_SUCCESS) {
                fprintf(stderr, "clffn-bench-gemms: %s: %s\n", g[i].name, clffn_status_string(err));
                rc = 1;
                break;
            }
            const double t = tool_now_s() - t0;
            if (r > 0 && t < best) { best = t; }
        }
        if (rc != 0) { break; }
        printf("%-26s %9.1f ms %7.1f GFLOP/s\n", g[i].name, best * 1e3,
               2.0 * (double)g[i].m * (double)g[i].n * (double)g[i].k / best * 1e-9);
    }
    const cl_mem bufs[] = {A, B, C};
    for (size_t i = 0; i < 3; ++i) {
        if (bufs[i]) { clReleaseMemObject(bufs[i]); }
    }
    clffn_context_destroy(ctx);
    return rc;
}

int main(int argc, char **argv) { return tool_exit("clffn-bench-gemms", tool_main(argc, argv)); }
