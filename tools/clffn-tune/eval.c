/* clffn-tune: one candidate measured. The parent runs each in a child process (this program
 * with --eval), so a parameter set whose kernel faults costs one candidate, not the search; the
 * child checks the candidate's SGEMM against a double-precision product before it times the
 * FFN's GEMMs through clffn_sgemm, the library's own path, and prints the seconds. */
#include "tune.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct bench {
    clffn_context *cctx; /* its K-block splits the products */
    cl_context ctx;
    cl_device_id dev;
    cl_command_queue q;
    size_t T, D, F, N1;
    cl_mem x, w1, z, h, w2, u;
    int backward_inputs; /* also time the backward's dh = u·W2 and dx = z·W1 */
    int kept_in_out;     /* the weights kept [in, out]: every product's weight transposed */
} bench;

/* Device seconds of one SGEMM (C[m,n] = A[m,k]·op(B) row-major: B [n,k] transposed, as the
 * forward uses W [out, in], or B [k,n] as stored, as the backward's input products do), between
 * two markers, run through clffn_sgemm as the library runs its products (the context's K-block
 * and small-batch crossover). The queue is idle before and after, so the host's clock around it
 * bounds the device's span; where the device's timestamps give no span inside that bound, or
 * one far short of it (tool_device_span_short), the host's span is the time. */
static int gemm_time(bench *b, size_t m, size_t n, size_t k, cl_mem A, cl_mem B, clffn_transpose tb,
                     cl_mem C, double *sec) {
    cl_event e0, e1;
    const double h0 = tool_now_s();
    if (clEnqueueMarkerWithWaitList(b->q, 0, NULL, &e0) != CL_SUCCESS) { return -1; }
    const clffn_status st = clffn_sgemm(b->cctx, CLFFN_NO_TRANS, tb, m, n, k, 1.0f, A, 0, k, B, 0,
                                        tb == CLFFN_TRANS ? k : n, 0.0f, C, 0, n, b->q, NULL);
    if (st != CLFFN_SUCCESS || clEnqueueMarkerWithWaitList(b->q, 0, NULL, &e1) != CL_SUCCESS) {
        clFinish(b->q);
        clReleaseEvent(e0);
        return -1;
    }
    cl_ulong t0 = 0, t1 = 0;
    cl_int err = clWaitForEvents(1, &e1);
    const double host = tool_now_s() - h0;
    if (err == CL_SUCCESS) {
        err = clGetEventProfilingInfo(e0, CL_PROFILING_COMMAND_END, sizeof t0, &t0, NULL);
    }
    if (err == CL_SUCCESS) {
        err = clGetEventProfilingInfo(e1, CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL);
    }
    clReleaseEvent(e0);
    clReleaseEvent(e1);
    if (err != CL_SUCCESS) { return -1; }
    const double device = (double)(t1 - t0) * 1e-9;
    *sec = t1 > t0 && device <= host && !tool_device_span_short(device, host) ? device : host;
    return 0;
}

/* Best of `reps` (after a first call that builds the kernels) for both FFN GEMMs at T tokens. */
static int ffn_gemms_time(bench *b, size_t T, int reps, double *sec) {
    double best = INFINITY;
    for (int r = 0; r <= reps; ++r) {
        double t1, t2, t3 = 0, t4 = 0;
        const clffn_transpose t = b->kept_in_out ? CLFFN_NO_TRANS : CLFFN_TRANS,
                              n = b->kept_in_out ? CLFFN_TRANS : CLFFN_NO_TRANS;
        if (gemm_time(b, T, b->N1, b->D, b->x, b->w1, t, b->z, &t1) != 0 ||
            gemm_time(b, T, b->D, b->F, b->h, b->w2, t, b->u, &t2) != 0 ||
            (b->backward_inputs &&
             (gemm_time(b, T, b->F, b->D, b->u, b->w2, n, b->h, &t3) != 0 ||
              gemm_time(b, T, b->D, b->N1, b->z, b->w1, n, b->x, &t4) != 0))) {
            return -1;
        }
        if (r > 0 && t1 + t2 + t3 + t4 < best) { best = t1 + t2 + t3 + t4; }
    }
    *sec = best;
    return 0;
}

static cl_mem random_buffer(bench *b, size_t n, uint64_t seed) {
    float *h = malloc(n * sizeof *h);
    if (!h) { return NULL; }
    for (size_t i = 0; i < n; ++i) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        h[i] = (float)((double)(seed >> 40) / 16777216.0 - 0.5);
    }
    cl_int err;
    cl_mem m =
        clCreateBuffer(b->ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n * sizeof *h, h, &err);
    free(h);
    return err == CL_SUCCESS ? m : NULL;
}

/* One product m × n × k checked against the double-precision product: 0, or -1. */
static int verify_one(bench *b, clffn_transpose tb, size_t m, size_t n, size_t k) {
    int ok = 0;
    float *A = malloc(m * k * 4), *B = malloc(n * k * 4), *C = malloc(m * n * 4);
    double *R = malloc(m * n * sizeof *R);
    cl_int e1 = CL_OUT_OF_HOST_MEMORY, e2 = e1, e3 = e1;
    cl_mem a = NULL, bb = NULL, c = NULL;
    if (A && B && C && R) {
        for (size_t i = 0; i < m * k; ++i) { A[i] = (float)sin(0.1 * (double)i); }
        for (size_t i = 0; i < n * k; ++i) { B[i] = (float)cos(0.07 * (double)i); }
        a = clCreateBuffer(b->ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, m * k * 4, A, &e1);
        bb = clCreateBuffer(b->ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, n * k * 4, B, &e2);
        c = clCreateBuffer(b->ctx, CL_MEM_READ_WRITE, m * n * 4, NULL, &e3);
    }
    if (e1 == CL_SUCCESS && e2 == CL_SUCCESS && e3 == CL_SUCCESS &&
        clffn_sgemm(b->cctx, CLFFN_NO_TRANS, tb, m, n, k, 1.0f, a, 0, k, bb, 0,
                    tb == CLFFN_TRANS ? k : n, 0.0f, c, 0, n, b->q, NULL) == CLFFN_SUCCESS &&
        clEnqueueReadBuffer(b->q, c, CL_TRUE, 0, m * n * 4, C, 0, NULL, NULL) == CL_SUCCESS) {
        for (size_t i = 0; i < m; ++i) {
            for (size_t j = 0; j < n; ++j) {
                double sum = 0;
                for (size_t l = 0; l < k; ++l) {
                    sum += (double)A[i * k + l] * (tb == CLFFN_TRANS ? B[j * k + l] : B[l * n + j]);
                }
                R[i * n + j] = sum;
            }
        }
        ok = tool_compare(C, R, m * n, 1e-5, 1e-6).pass;
    }
    if (a) { clReleaseMemObject(a); }
    if (bb) { clReleaseMemObject(bb); }
    if (c) { clReleaseMemObject(c); }
    free(A), free(B), free(C), free(R);
    return ok ? 0 : -1;
}

/* The SGEMM under the parameters now applied, against a double-precision product, on an odd
 * shape (so no tile fits it exactly), run as gemm_time runs it: B transposed, and B as stored
 * too when the candidate times the backward's products. With GEMVs on, the odd shape reaches
 * only CLBlast's general GEMV kernel: one row of 2048 × 2048 (one token, a GEMV whatever the
 * crossover; every candidate's tile divides it) checks its fast kernels (XgemvFastRot, say,
 * computes wrong results with WPT3 > WGS3), both ways, as the weight layout phase runs either. */
static int verify(bench *b) {
    const size_t gemv = clffn_context_gemv_max_tokens(b->cctx);
    /* with a few-tokens Xgemm set, its side too: the rows just below its threshold, as an
     * SGEMM whatever the GEMV crossover */
    const size_t few = clffn_context_xgemm_few_rows(b->cctx);
    int rc = 0;
    for (int i = 0; i < 2 && rc == 0; ++i) {
        const clffn_transpose tb = i ? CLFFN_NO_TRANS : CLFFN_TRANS;
        if (i && !b->backward_inputs && !gemv) { break; }
        rc = verify_one(b, tb, few > 37 ? few : 37, 131, 97);
        if (rc == 0 && gemv) { rc = verify_one(b, tb, 1, 2048, 2048); }
        if (rc == 0 && few > 1) {
            clffn_context_set_gemv_max_tokens(b->cctx, 0);
            rc = verify_one(b, tb, few - 1, 131, 97);
            clffn_context_set_gemv_max_tokens(b->cctx, gemv);
        }
    }
    return rc;
}

/* Applies a candidate's gemv spec (see opts) in the child. */
static int apply_gemv(clffn_context *cctx, const char *spec) {
    size_t n = 0;
    char *end;
    n = strtoul(spec, &end, 10);
    if (end == spec || (*end != '\0' && *end != ':') ||
        clffn_context_set_gemv_max_tokens(cctx, n) != CLFFN_SUCCESS) {
        return -1;
    }
    if (*end == '\0') { return 0; }
    pset all = {"", 6, {0}, {0}}, fast, rot;
    gemv_sets(&fast, &rot);
    if (pset_parse(end + 1, &all) != 0) { return -1; }
    memcpy(fast.values, all.values, 3 * sizeof(size_t));
    memcpy(rot.values, all.values + 3, 3 * sizeof(size_t));
    const cl_device_id d = clffn_context_cl_device(cctx);
    return pset_apply(d, &fast) == 0 && pset_apply(d, &rot) == 0 ? 0 : -1;
}

/* The candidate's Xgemm set (and a few-tokens one, "ROWS:values") as the context's own: a
 * context whose profile has two sets would otherwise apply its own over a bare override. */
static int set_xgemm(clffn_context *cctx, const pset *x, const char *few) {
    pset f = *x;
    char *end = NULL;
    const size_t rows = few ? strtoul(few, &end, 10) : 0;
    if (few && (end == few || *end != ':' || pset_parse(end + 1, &f) != 0)) { return -1; }
    return clffn_context_set_xgemm(cctx, 16, XGEMM_NAMES, x->values, few ? f.values : NULL, rows) ==
                   CLFFN_SUCCESS
               ? 0
               : -1;
}

/* Applies a candidate to the child's context: its K-block (for every product of the tuned
 * shape, whatever row threshold the profile in force has, or from o->k_min_rows rows where
 * that is given), small-batch side, Xgemm (and few-tokens) set, XgemmDirect set and
 * XGEMM_MIN_INDIRECT_SIZE. 0, or -1. */
int eval_apply(clffn_context *cctx, const opts *o, const candidate *c) {
    size_t k_block;
    if (c->k_block &&
        (tool_parse_size(c->k_block, 0, CLFFN_MAX_GEMM_K_BLOCK, &k_block) != 0 ||
         clffn_context_set_gemm_k_block(cctx, k_block) != CLFFN_SUCCESS ||
         clffn_context_set_gemm_k_block_min_rows(cctx, o->k_min_rows) != CLFFN_SUCCESS)) {
        return -1;
    }
    if (o->gemv ? apply_gemv(cctx, o->gemv) != 0
                : clffn_context_set_gemv_max_tokens(cctx, 0) != CLFFN_SUCCESS) {
        return -1;
    }
    const cl_device_id dev = clffn_context_cl_device(cctx);
    pset x = xgemm_set(), d = direct_set();
    const pset r = routine_set(c->routine);
    if ((c->xgemm && (pset_parse(c->xgemm, &x) != 0 || set_xgemm(cctx, &x, o->few) != 0)) ||
        (c->direct && (pset_parse(c->direct, &d) != 0 || pset_apply(dev, &d) != 0)) ||
        (c->routine && pset_apply(dev, &r) != 0)) {
        return -1;
    }
    return 0;
}

/* Child: applies the candidate's sets, checks the SGEMM on an odd shape, and prints the device
 * seconds of the FFN's GEMMs at T tokens, split along K in blocks of the candidate's (none
 * given: the block the context has from the profile applied now). Exit 0 with the time, 3 for a
 * wrong result, 1 otherwise. */
static int eval_run(clffn_context *cctx, const opts *o, const candidate *c, bench *out) {
    if (eval_apply(cctx, o, c) != 0) { return 1; }
    bench b = {cctx,
               clffn_context_cl_context(cctx),
               clffn_context_cl_device(cctx),
               clffn_context_queue(cctx),
               o->T,
               o->D,
               o->F,
               o->gated ? 2 * o->F : o->F,
               NULL,
               NULL,
               NULL,
               NULL,
               NULL,
               NULL,
               o->gemv != NULL && !o->forward_only,
               o->kept == CLFFN_LAYOUT_IN_OUT};
    if (verify(&b) != 0) { return 3; }
    b.x = random_buffer(&b, b.T * b.D, 1), b.w1 = random_buffer(&b, b.N1 * b.D, 2);
    b.z = random_buffer(&b, b.T * b.N1, 3), b.h = random_buffer(&b, b.T * b.F, 4);
    b.w2 = random_buffer(&b, b.D * b.F, 5), b.u = random_buffer(&b, b.T * b.D, 6);
    *out = b;
    double t;
    if (!b.x || !b.w1 || !b.z || !b.h || !b.w2 || !b.u || ffn_gemms_time(&b, b.T, 2, &t) != 0) {
        return 1;
    }
    printf("%.9g\n", t);
    return 0;
}

int eval_main(const opts *o, const candidate *c) {
    if (o->kernels) { return kernels_main(o, c); }
    clffn_context *cctx = NULL;
    if (clffn_context_create_for_device(o->device, &cctx) != CLFFN_SUCCESS) { return 1; }
    bench b = {0};
    const int rc = eval_run(cctx, o, c, &b);
    const cl_mem bufs[] = {b.x, b.w1, b.z, b.h, b.w2, b.u};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i) {
        if (bufs[i]) { clReleaseMemObject(bufs[i]); }
    }
    clffn_context_destroy(cctx);
    return rc;
}

int eval_child_line(const opts *o, size_t T, const pset *xg, const pset *dir, size_t routine,
                    size_t kb, char *line, size_t size) {
    char xs[256], ds[256], ks[32], kr[32], rs[32], ts[32], dm[32], df[32];
    snprintf(rs, sizeof rs, "%zu", routine);
    snprintf(ts, sizeof ts, "%zu", T);
    snprintf(dm, sizeof dm, "%zu", o->D);
    snprintf(df, sizeof df, "%zu", o->F);
    char *argv[32] = {"clffn-tune", "--eval",    "--routine", rs,       "--tokens",
                      ts,           "--d-model", dm,          "--d-ff", df};
    int n = 10;
    if (xg) {
        pset_format(xg, xs, sizeof xs);
        argv[n++] = "--xgemm", argv[n++] = xs;
    }
    if (dir) {
        pset_format(dir, ds, sizeof ds);
        argv[n++] = "--direct", argv[n++] = ds;
    }
    if (kb != KB_APPLIED) {
        snprintf(ks, sizeof ks, "%zu", kb);
        argv[n++] = "--k-block", argv[n++] = ks;
        if (o->k_min_rows) {
            snprintf(kr, sizeof kr, "%zu", o->k_min_rows);
            argv[n++] = "--k-block-min-rows", argv[n++] = kr;
        }
    }
    if (o->gated) { argv[n++] = "--gated"; }
    if (o->gemv) { argv[n++] = "--gemv", argv[n++] = (char *)o->gemv; }
    if (o->kept >= 0) { argv[n++] = "--kept", argv[n++] = o->kept ? "1" : "0"; }
    if (o->forward_only) { argv[n++] = "--forward-only"; }
    if (o->few) { argv[n++] = "--few", argv[n++] = (char *)o->few; }
    if (o->device) { argv[n++] = "--device", argv[n++] = (char *)o->device; }
    if (o->kernels) { argv[n++] = "--kernels", argv[n++] = (char *)o->kernels; }
    if (o->row_group) { argv[n++] = "--row-group", argv[n++] = (char *)o->row_group; }
    argv[n] = NULL;
    return tool_spawn_self(argv, NULL, 1, line, size);
}

int eval_child(const opts *o, size_t T, const pset *xg, const pset *dir, size_t routine, size_t kb,
               double *sec) {
    char line[64] = "";
    if (eval_child_line(o, T, xg, dir, routine, kb, line, sizeof line) != 0) { return -1; }
    return sscanf(line, "%lf", sec) == 1 && *sec > 0 ? 0 : -1;
}
