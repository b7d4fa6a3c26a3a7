/* clffn-tune: searches CLBlast's GEMM parameters for a device and the FFN's GEMM shapes, checks
 * the winner against the CPU reference, and stores it as the device's tuning profile, which the
 * library applies whenever it opens that device.
 *
 *   clffn-tune [--device SPEC] [--budget SECONDS] [--tokens T] [--d-model D] [--d-ff F]
 *              [--gated] [--fresh] [--print]
 *
 * The phases share the time budget (default 180 s):
 *   1. Xgemm (CLBlast's tiled kernel, used for large products): random samples of its parameter
 *      space under CLBlast's constraints (src/tuning/kernels/xgemm.hpp), scored by the time of the
 *      FFN's two GEMMs together;
 *   2. XgemmDirect (the kernel for small products): the same, scored at a few tokens;
 *   3. GemmRoutine's XGEMM_MIN_INDIRECT_SIZE: where the direct kernel stops being faster;
 *   4. clffn's own GEMM_K_BLOCK (clffn_context_set_gemm_k_block): the inner-dimension block,
 *      then GEMM_K_BLOCK_MIN_ROWS, the fewest token rows worth blocking;
 *   5. the GEMV kernels of the small-batch path (XgemvFastRot for y = W·x with W [out, in],
 *      XgemvFast for W [in, out]), scored at one token over the FFN's forward products and the
 *      backward's input products, which between them run both;
 *   6. clffn's WEIGHT_LAYOUT (clffn_context_set_weight_layout): the forward's products with
 *      the weights kept either way at 1 and 16 tokens and the tuned shape;
 *   7. clffn's GEMV_MAX_TOKENS (clffn_context_set_gemv_max_tokens): the forward's and the
 *      backward's input products at 1, 2, 4, … 64 tokens as GEMVs and as SGEMMs, the weights
 *      kept as phase 6 chose; the crossover is the largest count up to which the GEMVs win at
 *      every count measured;
 *   8. a second Xgemm set for few tokens and XGEMM_FEW_ROWS, the count below which it runs
 *      (clffn_context_set_xgemm): the winner narrowed along the tokens, scored by the forward at
 *      16 tokens, and the threshold where the winner alone catches up.
 * Phases 1-3 run the GEMMs split along K as the library would with a first guess of the block
 * (256 on CPUs, where it pays, none on GPUs); phase 4 then tries every block with the winners.
 * Times come from OpenCL profiling events around each GEMM. Progress is saved after every
 * candidate next to the profile, so an interrupted run resumes where it stopped.
 *
 * Exit status: 0 success, 1 device or runtime failure (or a winner failing the check), 2 usage. */
#define CLFFN_HOOKS /* clffn_sgemm and clffn_gemm_k_split: time what the library runs */
#include "clffn.h"
#include "clffn_io.h"
#include "common.h"

#include <cjson/cJSON.h>
#include <clblast_c.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static volatile sig_atomic_t interrupted = 0;
static void on_signal(int sig) {
    (void)sig;
    interrupted = 1;
}

/* ------------------------------------------------------------------------------------------ */
/* Parameter sets */

#define MAX_PARAMS 16

typedef struct pset {
    const char *kernel;
    int n;
    const char *names[MAX_PARAMS];
    size_t values[MAX_PARAMS];
} pset;

static const char *const XGEMM_NAMES[] = {"GEMMK", "KREG",  "KWG",   "KWI", "MDIMA", "MDIMC",
                                          "MWG",   "NDIMB", "NDIMC", "NWG", "SA",    "SB",
                                          "STRM",  "STRN",  "VWM",   "VWN"};
enum { GEMMK, KREG, KWG, KWI, MDIMA, MDIMC, MWG, NDIMB, NDIMC, NWG, SA, SB, STRM, STRN, VWM, VWN };
static const char *const DIRECT_NAMES[] = {"KWID", "MDIMAD", "MDIMCD", "NDIMBD", "NDIMCD",
                                           "PADA", "PADB",   "VWMD",   "VWND",   "WGD"};
enum { KWID, MDIMAD, MDIMCD, NDIMBD, NDIMCD, PADA, PADB, VWMD, VWND, WGD };

static size_t pick(uint64_t *s, const size_t *opts, size_t n) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return opts[(*s >> 33) % n];
}

typedef struct limits {
    size_t max_wg;
    cl_ulong local_mem;
    int cpu; /* a CPU device: local memory is ordinary memory, so SA/SB only add copies */
} limits;

/* CLBlast's Xgemm constraints (kernel 0) and the device's limits. */
static int xgemm_valid(const size_t *v, const limits *lim) {
    if (v[KWG] % v[KWI]) { return 0; }
    if (v[MWG] % (v[MDIMC] * v[VWM]) || v[NWG] % (v[NDIMC] * v[VWN])) { return 0; }
    if (v[MWG] % (v[MDIMA] * v[VWM]) || v[NWG] % (v[NDIMB] * v[VWN])) { return 0; }
    if (v[KWG] % ((v[MDIMC] * v[NDIMC]) / v[MDIMA]) ||
        v[KWG] % ((v[MDIMC] * v[NDIMC]) / v[NDIMB])) {
        return 0;
    }
    if (v[MDIMC] * v[NDIMC] > lim->max_wg) { return 0; }
    const size_t local = 4 * (v[SA] * v[KWG] * v[MWG] + v[SB] * v[KWG] * v[NWG]);
    return (cl_ulong)local <= lim->local_mem;
}

/* Where the search starts: sets that did well on the device class before, so a short budget
 * begins from a good point and spends the rest improving it. */
static const size_t XGEMM_SEEDS_CPU[][16] = {
    {0, 1, 32, 8, 8, 4, 64, 4, 4, 64, 0, 0, 0, 0, 16, 16},
    {0, 1, 16, 8, 8, 8, 128, 8, 8, 64, 0, 0, 0, 0, 16, 8},
    {0, 1, 32, 8, 8, 4, 128, 4, 4, 32, 0, 0, 0, 0, 16, 8},
};
static const size_t XGEMM_SEEDS_GPU[][16] = {
    {0, 1, 16, 2, 16, 16, 64, 16, 8, 128, 1, 1, 1, 1, 4, 4}, /* the H100's, 2026-11-22 */
    {0, 1, 32, 2, 8, 8, 32, 32, 32, 64, 1, 1, 0, 0, 4, 2},   /* CLBlast's generic NVIDIA set */
    {0, 1, 32, 2, 16, 16, 64, 16, 16, 64, 1, 1, 0, 0, 4, 4},
    {0, 1, 16, 2, 8, 8, 64, 8, 8, 64, 1, 1, 0, 0, 4, 4},
};

/* A neighbour of `best`: one parameter changed to another allowed value, constraints kept. */
static int xgemm_mutate(uint64_t *s, const pset *best, const limits *lim, pset *out) {
    static const size_t wg[] = {16, 32, 64, 128}, kwg[] = {16, 32}, dim[] = {4, 8, 16, 32},
                        kwi[] = {2, 8}, vw[] = {1, 2, 4, 8, 16}, bit[] = {0, 1};
    static const struct {
        int idx;
        const size_t *opts;
        size_t n;
    } knobs[] = {{MWG, wg, 4},    {NWG, wg, 4},    {KWG, kwg, 2},   {MDIMC, dim, 4},
                 {NDIMC, dim, 4}, {MDIMA, dim, 4}, {NDIMB, dim, 4}, {KWI, kwi, 2},
                 {VWM, vw, 5},    {VWN, vw, 5},    {STRM, bit, 2},  {STRN, bit, 2}};
    for (int attempt = 0; attempt < 200; ++attempt) {
        *out = *best;
        const size_t which[2] = {0, 1};
        const int changes = 1 + (int)pick(s, which, 2); /* one or two knobs at a time */
        for (int c = 0; c < changes; ++c) {
            const size_t k =
                (size_t)pick(s, (const size_t[]){0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, 12);
            out->values[knobs[k].idx] = pick(s, knobs[k].opts, knobs[k].n);
        }
        if (!lim->cpu || (out->values[VWM] <= 16 && out->values[VWN] <= 16)) {
            if ((lim->cpu || (out->values[VWM] <= 8 && out->values[VWN] <= 8)) &&
                xgemm_valid(out->values, lim) &&
                memcmp(out->values, best->values, sizeof best->values) != 0) {
                return 0;
            }
        }
    }
    return -1;
}

/* One random Xgemm set that satisfies CLBlast's constraints and the device's limits. */
static pset xgemm_sample(uint64_t *s, const limits *lim) {
    static const size_t wg[] = {16, 32, 64, 128}, kwg[] = {16, 32}, dim[] = {8, 16, 32},
                        kwi[] = {2, 8}, vw[] = {1, 2, 4, 8, 16}, bit[] = {0, 1},
                        k1wg[] = {16, 32, 64}, k1dim[] = {4, 8, 16}, kreg[] = {1, 2, 4};
    pset p = {"Xgemm", 16, {0}, {0}};
    for (int i = 0; i < 16; ++i) { p.names[i] = XGEMM_NAMES[i]; }
    size_t *v = p.values;
    for (;;) {
        /* CLBlast's kernel 1 (GEMMK=1, 2D register tiling) is left out: on POCL, parameter sets
         * that satisfy all of its constraints wrote out of bounds (GEMMK=1 KREG=1 MWG=16 NWG=64
         * MDIMC=8 NDIMC=16 VWM=VWN=1 crashed the process), and candidates run in child
         * processes only so that such a crash costs one candidate, not the search */
        const int k1 = 0;
        v[GEMMK] = (size_t)k1;
        if (!k1) {
            v[MWG] = pick(s, wg, 4), v[NWG] = pick(s, wg, 4), v[KWG] = pick(s, kwg, 2);
            v[MDIMC] = pick(s, dim, 3), v[NDIMC] = pick(s, dim, 3);
            v[MDIMA] = pick(s, dim, 3), v[NDIMB] = pick(s, dim, 3);
            /* 16-wide vectors only where they fill a register (AVX-512 CPUs, some GPUs) */
            v[KWI] = pick(s, kwi, 2), v[VWM] = pick(s, vw, lim->cpu ? 5 : 4);
            v[VWN] = pick(s, vw, lim->cpu ? 5 : 4);
            v[STRM] = pick(s, bit, 2), v[STRN] = pick(s, bit, 2);
            v[SA] = lim->cpu ? 0 : pick(s, bit, 2), v[SB] = lim->cpu ? 0 : pick(s, bit, 2);
            v[KREG] = 1;
        } else {
            v[MWG] = pick(s, k1wg, 3), v[NWG] = pick(s, k1wg, 3), v[KWG] = 1, v[KWI] = 1;
            v[MDIMC] = v[MDIMA] = pick(s, k1dim, 3), v[NDIMC] = v[NDIMB] = pick(s, k1dim, 3);
            v[VWM] = pick(s, vw, 3), v[VWN] = pick(s, vw, 3);
            v[STRM] = v[STRN] = v[SA] = v[SB] = 0, v[KREG] = pick(s, kreg, 3);
        }
        /* CLBlast's constraints */
        if (v[KWG] % v[KWI]) { continue; }
        if (v[MWG] % (v[MDIMC] * v[VWM]) || v[NWG] % (v[NDIMC] * v[VWN])) { continue; }
        if (v[MWG] % (v[MDIMA] * v[VWM]) || v[NWG] % (v[NDIMB] * v[VWN])) { continue; }
        if (!k1 && (v[KWG] % ((v[MDIMC] * v[NDIMC]) / v[MDIMA]) ||
                    v[KWG] % ((v[MDIMC] * v[NDIMC]) / v[NDIMB]))) {
            continue;
        }
        if (k1 && v[KREG] % v[VWN]) { continue; }
        /* the device's limits */
        if (v[MDIMC] * v[NDIMC] > lim->max_wg) { continue; }
        const size_t local = 4 * (v[SA] * v[KWG] * v[MWG] + v[SB] * v[KWG] * v[NWG]);
        if ((cl_ulong)local > lim->local_mem) { continue; }
        return p;
    }
}

static pset direct_sample(uint64_t *s, const limits *lim) {
    static const size_t wgd[] = {8, 16, 32, 64}, dim[] = {8, 16, 32}, kwid[] = {2, 8},
                        vw[] = {1, 2, 4, 8}, bit[] = {0, 1};
    pset p = {"XgemmDirect", 10, {0}, {0}};
    for (int i = 0; i < 10; ++i) { p.names[i] = DIRECT_NAMES[i]; }
    size_t *v = p.values;
    for (;;) {
        v[WGD] = pick(s, wgd, 4), v[MDIMCD] = pick(s, dim, 3), v[NDIMCD] = pick(s, dim, 3);
        v[MDIMAD] = pick(s, dim, 3), v[NDIMBD] = pick(s, dim, 3), v[KWID] = pick(s, kwid, 2);
        v[VWMD] = pick(s, vw, 4), v[VWND] = pick(s, vw, 4);
        v[PADA] = pick(s, bit, 2), v[PADB] = pick(s, bit, 2);
        if (v[WGD] % v[KWID] || v[WGD] % (v[MDIMCD] * v[VWMD]) || v[WGD] % (v[NDIMCD] * v[VWND]) ||
            v[WGD] % (v[MDIMAD] * v[VWMD]) || v[WGD] % (v[NDIMBD] * v[VWND]) ||
            v[WGD] % ((v[MDIMCD] * v[NDIMCD]) / v[MDIMAD]) ||
            v[WGD] % ((v[MDIMCD] * v[NDIMCD]) / v[NDIMBD])) {
            continue;
        }
        if (v[MDIMCD] * v[NDIMCD] > lim->max_wg) { continue; }
        const size_t local = 4 * (v[WGD] * (v[WGD] + v[PADA]) + v[WGD] * (v[WGD] + v[PADB]));
        if ((cl_ulong)local > lim->local_mem) { continue; }
        return p;
    }
}

static pset routine_set(size_t min_indirect) {
    pset p = {"GemmRoutine", 1, {"XGEMM_MIN_INDIRECT_SIZE"}, {min_indirect}};
    return p;
}

static int apply(cl_device_id d, const pset *p) {
    if (getenv("CLFFN_TUNE_TRACE")) {
        fprintf(stderr, "%s:", p->kernel);
        for (int i = 0; i < p->n; ++i) { fprintf(stderr, " %s=%zu", p->names[i], p->values[i]); }
        fprintf(stderr, "\n");
    }
    return CLBlastOverrideParameters(d, p->kernel, CLBlastPrecisionSingle, (size_t)p->n,
                                     (const char **)p->names, p->values) == CLBlastSuccess
               ? 0
               : -1;
}

static cJSON *pset_json(const pset *p) {
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; i < p->n; ++i) {
        cJSON_AddNumberToObject(o, p->names[i], (double)p->values[i]);
    }
    return o;
}

static int pset_from_json(const cJSON *o, pset *p) {
    for (int i = 0; i < p->n; ++i) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, p->names[i]);
        if (!cJSON_IsNumber(v)) { return -1; }
        p->values[i] = (size_t)v->valuedouble;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* The GEMMs being tuned: the FFN's two projections, weights kept [out, in] as nn.Linear stores
 * them, or [in, out] in the weight layout phase */

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
 * and small-batch crossover). */
static int gemm_time(bench *b, size_t m, size_t n, size_t k, cl_mem A, cl_mem B, clffn_transpose tb,
                     cl_mem C, double *sec) {
    cl_event e0, e1;
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
    if (err == CL_SUCCESS) {
        err = clGetEventProfilingInfo(e0, CL_PROFILING_COMMAND_END, sizeof t0, &t0, NULL);
    }
    if (err == CL_SUCCESS) {
        err = clGetEventProfilingInfo(e1, CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL);
    }
    clReleaseEvent(e0);
    clReleaseEvent(e1);
    if (err != CL_SUCCESS) { return -1; }
    *sec = (double)(t1 - t0) * 1e-9;
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

/* The SGEMM under the parameters now applied, against a double-precision product, on an odd
 * shape (so no tile fits it exactly), run as gemm_time runs it: B transposed, and B as stored
 * too when the candidate times the backward's products. With GEMVs on, the odd shape reaches
 * only CLBlast's general GEMV kernel: one row of 2048 × 2048 (one token, a GEMV whatever the
 * crossover; every candidate's tile divides it) checks its fast kernels (XgemvFastRot, say,
 * computes wrong results with WPT3 > WGS3), both ways, as the weight layout phase runs either. */
static int verify_one(bench *b, clffn_transpose tb, size_t m, size_t n, size_t k);
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

/* ------------------------------------------------------------------------------------------ */
/* Progress (resumable) and output */

typedef struct state {
    int phase;          /* 1, 2, 3 (done) */
    int index;          /* next candidate of the phase */
    pset xgemm, direct; /* the best so far */
    double xgemm_s, direct_s;
    int have_xgemm, have_direct;
    double spent_s;
} state;

/* Progress goes through the atomic writer: an interrupted write leaves the last state. */
static void save_state(const char *path, const state *s) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "phase", s->phase);
    cJSON_AddNumberToObject(o, "index", s->index);
    cJSON_AddNumberToObject(o, "spent_s", s->spent_s);
    if (s->have_xgemm) {
        cJSON_AddItemToObject(o, "xgemm", pset_json(&s->xgemm));
        cJSON_AddNumberToObject(o, "xgemm_s", s->xgemm_s);
    }
    if (s->have_direct) {
        cJSON_AddItemToObject(o, "direct", pset_json(&s->direct));
        cJSON_AddNumberToObject(o, "direct_s", s->direct_s);
    }
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    if (text) {
        const void *parts[1] = {text};
        const size_t lens[1] = {strlen(text)};
        char err[CLFFN_IO_ERR];
        if (clffn_write_atomic(path, parts, lens, 1, err) != 0) {
            fprintf(stderr, "clffn-tune: progress not saved to %s: %s\n", path, err);
        }
    }
    free(text);
}

static void load_state(const char *path, state *s) {
    FILE *f = fopen(path, "rb");
    if (!f) { return; }
    char buf[8192];
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    cJSON *o = cJSON_Parse(buf);
    if (!o) { return; }
    const cJSON *v;
    if (cJSON_IsNumber(v = cJSON_GetObjectItem(o, "phase"))) { s->phase = v->valueint; }
    if (cJSON_IsNumber(v = cJSON_GetObjectItem(o, "index"))) { s->index = v->valueint; }
    if (cJSON_IsNumber(v = cJSON_GetObjectItem(o, "spent_s"))) { s->spent_s = v->valuedouble; }
    const cJSON *t;
    if ((v = cJSON_GetObjectItem(o, "xgemm")) && pset_from_json(v, &s->xgemm) == 0 &&
        cJSON_IsNumber(t = cJSON_GetObjectItem(o, "xgemm_s"))) {
        s->have_xgemm = 1;
        s->xgemm_s = t->valuedouble;
    }
    if ((v = cJSON_GetObjectItem(o, "direct")) && pset_from_json(v, &s->direct) == 0 &&
        cJSON_IsNumber(t = cJSON_GetObjectItem(o, "direct_s"))) {
        s->have_direct = 1;
        s->direct_s = t->valuedouble;
    }
    cJSON_Delete(o);
}

static void progress(int tty, double spent, double budget, const char *phase, int tried,
                     double best_gflops) {
    if (!tty) { return; }
    const int width = 30, fill = (int)(width * fmin(1.0, spent / budget));
    fprintf(stderr, "\r[%.*s%.*s] %3.0f s of %.0f s  %s: %d tried, best %.1f GFLOP/s   ", fill,
            "##############################", width - fill, "..............................", spent,
            budget, phase, tried, best_gflops);
    fflush(stderr);
}

static void usage(FILE *f) {
    fprintf(f, "usage: clffn-tune [--device SPEC] [--budget SECONDS] [--tokens T] [--d-model D]\n"
               "                  [--d-ff F] [--gated] [--fresh] [--print]\n"
               "  --budget   time for the search (default 180 s)\n"
               "  --tokens, --d-model, --d-ff, --gated   the FFN whose GEMMs are tuned (default "
               "640, 512, 2048)\n"
               "  --fresh    ignore an interrupted run's progress\n"
               "  --print    print the profile path and contents, and exit\n");
}

/* ------------------------------------------------------------------------------------------ */
/* Candidates run in child processes: a parameter set whose kernel faults costs one candidate */

static void format_values(const pset *p, char *buf, size_t size) {
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < p->n && n < size; ++i) {
        n += (size_t)snprintf(buf + n, size - n, "%s%zu", i ? "," : "", p->values[i]);
    }
}

static int parse_values(const char *text, pset *p) {
    const char *c = text;
    for (int i = 0; i < p->n; ++i) {
        char *end;
        p->values[i] = strtoul(c, &end, 10);
        if (end == c || (i + 1 < p->n && *end != ',')) { return -1; }
        c = end + 1;
    }
    return 0;
}

typedef struct opts {
    const char *device;
    size_t T, D, F;
    int gated;
    /* the small-batch side of a candidate: gemv is NULL (every product an SGEMM, as phases 1-4
     * measure), or "N" or "N:WGS2,WPT2,VW2,WGS3,WPT3,VW3": crossover N and, given, those
     * XgemvFast and XgemvFastRot parameters; the backward's input products are timed too */
    const char *gemv;
    /* the layout the weights are kept in (clffn_context_set_weight_layout), from the weight
     * layout phase on; -1 before it: [out, in] */
    int kept;
    int forward_only; /* the weight layout phase: the backward's input products are not timed */
    /* a few-tokens Xgemm set beside the candidate's (clffn_context_set_xgemm): NULL, or
     * "ROWS:v1,...,v16", the threshold and the set's values in XGEMM_NAMES' order */
    const char *few;
} opts;

static const char *const GEMV_FAST_NAMES[] = {"WGS2", "WPT2", "VW2"};
static const char *const GEMV_ROT_NAMES[] = {"WGS3", "WPT3", "VW3"};

static void gemv_sets(pset *fast, pset *rot) {
    *fast = (pset){"XgemvFast", 3, {0}, {0}};
    *rot = (pset){"XgemvFastRot", 3, {0}, {0}};
    for (int i = 0; i < 3; ++i) {
        fast->names[i] = GEMV_FAST_NAMES[i];
        rot->names[i] = GEMV_ROT_NAMES[i];
    }
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
    if (parse_values(end + 1, &all) != 0) { return -1; }
    memcpy(fast.values, all.values, 3 * sizeof(size_t));
    memcpy(rot.values, all.values + 3, 3 * sizeof(size_t));
    const cl_device_id d = clffn_context_cl_device(cctx);
    return apply(d, &fast) == 0 && apply(d, &rot) == 0 ? 0 : -1;
}

/* The candidate's Xgemm set (and a few-tokens one, "ROWS:values") as the context's own: a
 * context whose profile has two sets would otherwise apply its own over a bare override. */
static int set_xgemm(clffn_context *cctx, const pset *x, const char *few) {
    pset f = *x;
    char *end = NULL;
    const size_t rows = few ? strtoul(few, &end, 10) : 0;
    if (few && (end == few || *end != ':' || parse_values(end + 1, &f) != 0)) { return -1; }
    return clffn_context_set_xgemm(cctx, 16, XGEMM_NAMES, x->values, few ? f.values : NULL, rows) ==
                   CLFFN_SUCCESS
               ? 0
               : -1;
}

/* Child: applies the sets, checks the SGEMM on an odd shape, and prints the device seconds of the
 * FFN's two GEMMs at T tokens, split along K in blocks of kb ("-": the block the context has
 * from the profile applied now). Exit 0 with the time, 3 for a wrong result, 1 otherwise. */
static int eval_run(clffn_context *cctx, const opts *o, const char *xg, const char *dir,
                    size_t routine, const char *kb, bench *out) {
    size_t k_block;
    /* a candidate block applies to every product of the tuned shape, whatever row threshold
     * the profile in force has */
    if (strcmp(kb, "-") && (tool_parse_size(kb, 0, CLFFN_MAX_GEMM_K_BLOCK, &k_block) != 0 ||
                            clffn_context_set_gemm_k_block(cctx, k_block) != CLFFN_SUCCESS ||
                            clffn_context_set_gemm_k_block_min_rows(cctx, 0) != CLFFN_SUCCESS)) {
        return 1;
    }
    if (o->gemv ? apply_gemv(cctx, o->gemv) != 0
                : clffn_context_set_gemv_max_tokens(cctx, 0) != CLFFN_SUCCESS) {
        return 1;
    }
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
    pset x = {"Xgemm", 16, {0}, {0}}, d = {"XgemmDirect", 10, {0}, {0}};
    for (int i = 0; i < 16; ++i) { x.names[i] = XGEMM_NAMES[i]; }
    for (int i = 0; i < 10; ++i) { d.names[i] = DIRECT_NAMES[i]; }
    const pset r = routine_set(routine);
    if ((strcmp(xg, "-") && (parse_values(xg, &x) != 0 || set_xgemm(cctx, &x, o->few) != 0)) ||
        (strcmp(dir, "-") && (parse_values(dir, &d) != 0 || apply(b.dev, &d) != 0)) ||
        (routine && apply(b.dev, &r) != 0)) {
        return 1;
    }
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

static int eval_main(const opts *o, const char *xg, const char *dir, size_t routine,
                     const char *kb) {
    clffn_context *cctx = NULL;
    if (clffn_context_create_for_device(o->device, &cctx) != CLFFN_SUCCESS) { return 1; }
    bench b = {0};
    const int rc = eval_run(cctx, o, xg, dir, routine, kb, &b);
    const cl_mem bufs[] = {b.x, b.w1, b.z, b.h, b.w2, b.u};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i) {
        if (bufs[i]) { clReleaseMemObject(bufs[i]); }
    }
    clffn_context_destroy(cctx);
    return rc;
}

/* The K-block of a candidate that should keep the one the applied profile has. */
#define KB_APPLIED ((size_t)-1)
/* XGEMM_MIN_INDIRECT_SIZE so large that every product takes the direct kernel */
#define DIRECT_PATH ((size_t)1 << 20)

/* Parent: runs one evaluation in a child (this program, by /proc/self/exe, without a shell);
 * returns 0 with *sec, -1 for a failed or faulting candidate. */
static int eval_child(const opts *o, size_t T, const pset *xg, const pset *dir, size_t routine,
                      size_t kb, double *sec) {
    char xs[256] = "-", ds[256] = "-", ks[32] = "-", rs[32], ts[32], dm[32], df[32];
    if (xg) { format_values(xg, xs, sizeof xs); }
    if (dir) { format_values(dir, ds, sizeof ds); }
    if (kb != KB_APPLIED) { snprintf(ks, sizeof ks, "%zu", kb); }
    snprintf(rs, sizeof rs, "%zu", routine);
    snprintf(ts, sizeof ts, "%zu", T);
    snprintf(dm, sizeof dm, "%zu", o->D);
    snprintf(df, sizeof df, "%zu", o->F);
    char *argv[24] = {"clffn-tune", "--eval", xs,          ds, rs,       ks,
                      "--tokens",   ts,       "--d-model", dm, "--d-ff", df};
    int n = 12;
    if (o->gated) { argv[n++] = "--gated"; }
    if (o->gemv) { argv[n++] = "--gemv", argv[n++] = (char *)o->gemv; }
    if (o->kept >= 0) { argv[n++] = "--kept", argv[n++] = o->kept ? "1" : "0"; }
    if (o->forward_only) { argv[n++] = "--forward-only"; }
    if (o->few) { argv[n++] = "--few", argv[n++] = (char *)o->few; }
    if (o->device) { argv[n++] = "--device", argv[n++] = (char *)o->device; }
    argv[n] = NULL;
    int out[2];
    if (pipe(out) != 0) { return -1; }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    const int rc = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(out[1]);
    char line[64] = "";
    size_t got = 0;
    ssize_t r;
    while (
        rc == 0 && got + 1 < sizeof line &&
        ((r = read(out[0], line + got, sizeof line - 1 - got)) > 0 || (r < 0 && errno == EINTR))) {
        if (r > 0) { got += (size_t)r; }
    }
    line[got] = '\0';
    close(out[0]);
    int status = 0;
    if (rc != 0) { return -1; }
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) { return -1; }
    return sscanf(line, "%lf", sec) == 1 && *sec > 0 ? 0 : -1;
}

/* ------------------------------------------------------------------------------------------ */
/* The search, phase by phase */

/* What the parent knows of the device and the search. */
typedef struct search {
    opts o;
    double budget, t0; /* t0: the clock at the start, earlier runs' time subtracted */
    limits lim;
    int tty;
    double flops;    /* of the FFN's two GEMMs */
    size_t kb_guess; /* the K-block phases 1-3 run with */
    char path[1200], progress[1300], dir[1024];
    char name[256], platform[256], driver[256];
    state s;
} search;

static double spent(const search *r) { return tool_now_s() - r->t0; }

static int parse_options(int argc, char **argv, search *r, int *fresh, int *print_only,
                         const char *eval[4]) {
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        const size_t big = (size_t)1 << 30;
        if (!strcmp(a, "--device") && v) {
            r->o.device = v, ++i;
        } else if (!strcmp(a, "--budget") && !tool_parse_double(v, 1e-3, 1e9, &r->budget)) {
            ++i;
        } else if (!strcmp(a, "--tokens") && !tool_parse_size(v, 1, big, &r->o.T)) {
            ++i;
        } else if (!strcmp(a, "--d-model") && !tool_parse_size(v, 1, big, &r->o.D)) {
            ++i;
        } else if (!strcmp(a, "--d-ff") && !tool_parse_size(v, 1, big, &r->o.F)) {
            ++i;
        } else if (!strcmp(a, "--gated")) {
            r->o.gated = 1;
        } else if (!strcmp(a, "--fresh")) {
            *fresh = 1;
        } else if (!strcmp(a, "--print")) {
            *print_only = 1;
        } else if (!strcmp(a, "--gemv") && v) { /* internal: a candidate's small-batch side */
            r->o.gemv = v, ++i;
        } else if (!strcmp(a, "--kept") && v) { /* internal: the weight layout phase */
            r->o.kept = strcmp(v, "1") ? CLFFN_LAYOUT_OUT_IN : CLFFN_LAYOUT_IN_OUT, ++i;
        } else if (!strcmp(a, "--few") && v) { /* internal: a few-tokens Xgemm set */
            r->o.few = v, ++i;
        } else if (!strcmp(a, "--forward-only")) { /* internal: the weight layout phase */
            r->o.forward_only = 1;
        } else if (!strcmp(a, "--eval") && i + 4 < argc) { /* internal: one candidate */
            for (int k = 0; k < 4; ++k) { eval[k] = argv[i + 1 + k]; }
            i += 4;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "clffn-tune: bad argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    return -1;
}

/* Opens the device once to learn its names, limits and profile path; the parent only plans,
 * children measure. With print_only, prints the profile instead. Returns -1 to go on. */
static int device_facts(search *r, int print_only) {
    clffn_context *cctx = NULL;
    clffn_status cs = clffn_context_create_for_device(r->o.device, &cctx);
    if (cs != CLFFN_SUCCESS) {
        fprintf(stderr, "clffn-tune: opening the device: %s\n", clffn_status_string(cs));
        return 1;
    }
    const cl_device_id dev = clffn_context_cl_device(cctx);
    if ((cs = clffn_tuning_profile_path(dev, r->path, sizeof r->path)) != CLFFN_SUCCESS ||
        (cs = clffn_tuning_dir(r->dir, sizeof r->dir)) != CLFFN_SUCCESS) {
        fprintf(stderr, "clffn-tune: no place for profiles: %s (set CLFFN_TUNE_DIR)\n",
                clffn_status_string(cs));
        clffn_context_destroy(cctx);
        return 1;
    }
    if (print_only) {
        printf("%s\n", r->path);
        FILE *f = fopen(r->path, "r");
        if (f) {
            int ch;
            while ((ch = fgetc(f)) != EOF) { putchar(ch); }
            fclose(f);
        } else {
            printf("(none yet; applied now: %s)\n", clffn_context_tuning(cctx));
        }
        clffn_context_destroy(cctx);
        return 0;
    }
    snprintf(r->progress, sizeof r->progress, "%s.progress", r->path);
    clffn_context_device_name(cctx, r->name, sizeof r->name);
    cl_device_type type = 0;
    clGetDeviceInfo(dev, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    r->lim.cpu = (type & CL_DEVICE_TYPE_CPU) != 0;
    clGetDeviceInfo(dev, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof r->lim.max_wg, &r->lim.max_wg, NULL);
    clGetDeviceInfo(dev, CL_DEVICE_LOCAL_MEM_SIZE, sizeof r->lim.local_mem, &r->lim.local_mem,
                    NULL);
    cl_platform_id pid;
    clGetDeviceInfo(dev, CL_DEVICE_PLATFORM, sizeof pid, &pid, NULL);
    clGetPlatformInfo(pid, CL_PLATFORM_NAME, sizeof r->platform - 1, r->platform, NULL);
    clGetDeviceInfo(dev, CL_DRIVER_VERSION, sizeof r->driver - 1, r->driver, NULL);
    clffn_context_destroy(cctx);
    return -1;
}

/* mkdir -p: every missing folder of dir, as the shell's would. */
static int make_dirs(const char *dir) {
    char buf[1024];
    const int n = snprintf(buf, sizeof buf, "%s", dir);
    if (n <= 0 || (size_t)n >= sizeof buf) { return -1; }
    for (char *p = buf + 1;; ++p) {
        const char c = *p;
        if (c != '/' && c != '\0') { continue; }
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) { return -1; }
        *p = c;
        if (c == '\0') { break; }
    }
    struct stat st;
    return stat(buf, &st) == 0 && S_ISDIR(st.st_mode) ? 0 : -1;
}

/* Phase 1: Xgemm on the full shape, through the tiled path: the seeds, then alternately a
 * random set (to explore) and a neighbour of the best so far (to climb). Past its share of the
 * budget the phase stops once it has a winner, or after 32 failures. */
static void phase_xgemm(search *r) {
    state *s = &r->s;
    int tried = 0;
    const size_t n_seeds = r->lim.cpu ? sizeof XGEMM_SEEDS_CPU / sizeof XGEMM_SEEDS_CPU[0]
                                      : sizeof XGEMM_SEEDS_GPU / sizeof XGEMM_SEEDS_GPU[0];
    for (int i = s->index; s->phase == 1 && !interrupted; ++i) {
        if ((s->have_xgemm && spent(r) > 0.6 * r->budget) || (!s->have_xgemm && tried >= 32)) {
            s->phase = 2, s->index = 0;
            break;
        }
        uint64_t seed = 0x5eed0001ull + 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
        pset cand = {"Xgemm", 16, {0}, {0}};
        for (int k = 0; k < 16; ++k) { cand.names[k] = XGEMM_NAMES[k]; }
        if ((size_t)i < n_seeds) {
            memcpy(cand.values, r->lim.cpu ? XGEMM_SEEDS_CPU[i] : XGEMM_SEEDS_GPU[i],
                   sizeof cand.values);
            if (!xgemm_valid(cand.values, &r->lim)) { cand = xgemm_sample(&seed, &r->lim); }
        } else if (i % 2 == 1 && s->have_xgemm) {
            if (xgemm_mutate(&seed, &s->xgemm, &r->lim, &cand) != 0) {
                cand = xgemm_sample(&seed, &r->lim);
            }
        } else {
            cand = xgemm_sample(&seed, &r->lim);
        }
        double t;
        if (eval_child(&r->o, r->o.T, &cand, NULL, 1, r->kb_guess, &t) == 0 &&
            (!s->have_xgemm || t < s->xgemm_s)) {
            s->xgemm = cand, s->xgemm_s = t, s->have_xgemm = 1;
        }
        ++tried;
        s->index = i + 1;
        s->spent_s = spent(r);
        save_state(r->progress, s);
        progress(r->tty, s->spent_s, r->budget, "Xgemm", tried,
                 s->have_xgemm ? r->flops / s->xgemm_s * 1e-9 : 0);
    }
}

/* Phase 2: XgemmDirect at a few tokens, through the direct path. */
static void phase_direct(search *r, size_t small_t) {
    state *s = &r->s;
    int tried = 0;
    for (int i = s->index; s->phase == 2 && !interrupted; ++i) {
        uint64_t seed = 0x5eed0002ull + 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
        const pset cand = direct_sample(&seed, &r->lim);
        if ((s->have_direct && spent(r) > 0.8 * r->budget) || (!s->have_direct && tried >= 32)) {
            s->phase = 3, s->index = 0;
            break;
        }
        double t;
        if (eval_child(&r->o, small_t, NULL, &cand, DIRECT_PATH, r->kb_guess, &t) == 0 &&
            (!s->have_direct || t < s->direct_s)) {
            s->direct = cand, s->direct_s = t, s->have_direct = 1;
        }
        ++tried;
        s->index = i + 1;
        s->spent_s = spent(r);
        save_state(r->progress, s);
        progress(r->tty, s->spent_s, r->budget, "XgemmDirect", tried,
                 s->have_direct ? r->flops * (double)small_t / (double)r->o.T / s->direct_s * 1e-9
                                : 0);
    }
}

/* Phase 3: the crossover; CLBlast goes direct when m·n·k < XGEMM_MIN_INDIRECT_SIZE³. Each new
 * size may make the device build another kernel variant, so this phase stops at the budget too
 * and keeps what it learnt. Returns XGEMM_MIN_INDIRECT_SIZE. */
static size_t phase_crossover(search *r) {
    const size_t N1 = r->o.gated ? 2 * r->o.F : r->o.F;
    size_t crossover_mnk = 0, direct_wins_mnk = 0;
    const size_t ts[] = {1, 16, 64, 256, 1024};
    size_t k1; /* CLBlast sees m·n·k of one K-block: GEMM 1's block */
    clffn_gemm_k_split(r->o.D, r->kb_guess, &k1);
    for (size_t i = 0; i < sizeof ts / sizeof ts[0] && ts[i] <= r->o.T && !interrupted; ++i) {
        if (spent(r) > r->budget) { break; }
        double td, ti;
        if (eval_child(&r->o, ts[i], &r->s.xgemm, &r->s.direct, DIRECT_PATH, r->kb_guess, &td) ||
            eval_child(&r->o, ts[i], &r->s.xgemm, &r->s.direct, 1, r->kb_guess, &ti)) {
            break;
        }
        printf("%4zu tokens: direct kernel %.3f ms, tiled %.3f ms\n", ts[i], td * 1e3, ti * 1e3);
        fflush(stdout);
        if (ti < td) { /* the first token count where the tiled kernel wins */
            crossover_mnk = ts[i] * k1 * N1;
            break;
        }
        direct_wins_mnk = ts[i] * k1 * N1;
    }
    if (!crossover_mnk) { crossover_mnk = direct_wins_mnk ? 2 * direct_wins_mnk : k1 * N1; }
    return (size_t)ceil(cbrt((double)crossover_mnk));
}

/* Phase 4: the K-block, with the winners at the full shape; blocks from 64 up to the longest
 * inner dimension (beyond it nothing is split), and none. Each block only changes K of the same
 * kernels, so no candidate builds anything: this phase is short, and it ends at the budget too
 * once "none" and the guess are measured. A block must beat none by more than run-to-run noise
 * (K_BLOCK_MARGIN): only the forward's products are timed here, and a block also splits the
 * backward's, whose inner dimension is the tokens (on an H100 a 2048-block that won the forward
 * by 2% made the BERT-shape backward 1.5x slower). */
#define K_BLOCK_MARGIN 0.97
static size_t phase_k_block(search *r, size_t min_indirect) {
    size_t k_block = r->kb_guess;
    double kb_best = INFINITY, none_s = INFINITY;
    const size_t kb_cands[] = {r->kb_guess, 0, 64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048};
    const size_t k_max = r->o.D > r->o.F ? r->o.D : r->o.F;
    for (size_t i = 0; i < sizeof kb_cands / sizeof kb_cands[0] && !interrupted; ++i) {
        const size_t kb = kb_cands[i];
        if (i > 0 && (kb == r->kb_guess || kb > k_max || (i >= 2 && spent(r) > r->budget))) {
            continue;
        }
        double t;
        if (eval_child(&r->o, r->o.T, &r->s.xgemm, &r->s.direct, min_indirect, kb, &t) != 0) {
            continue;
        }
        printf("K-block %4zu: %.1f GFLOP/s\n", kb, r->flops / t * 1e-9);
        fflush(stdout);
        if (kb == 0) { none_s = t; }
        if (t < kb_best) { kb_best = t, k_block = kb; }
    }
    return k_block != 0 && kb_best > K_BLOCK_MARGIN * none_s ? 0 : k_block;
}

/* Phase 4b: the fewest token rows a product needs to be K-blocked (GEMM_K_BLOCK_MIN_ROWS). The
 * block is chosen at the full shape; for few rows a blocked product re-reads the weights once per
 * block for little work each time (on POCL 20-35% slower at 4-8 tokens), so blocked and whole
 * are compared at growing token counts, and the threshold is the first count where the block
 * wins (the full shape's own count if it never does below it). */
static size_t phase_k_block_rows(search *r, size_t min_indirect, size_t k_block) {
    if (k_block == 0) { return 0; }
    const size_t ts[] = {16, 64, 256, 1024};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0] && ts[i] < r->o.T && !interrupted; ++i) {
        if (i > 0 && spent(r) > r->budget) { break; }
        double tb, tw;
        if (eval_child(&r->o, ts[i], &r->s.xgemm, &r->s.direct, min_indirect, k_block, &tb) ||
            eval_child(&r->o, ts[i], &r->s.xgemm, &r->s.direct, min_indirect, 0, &tw)) {
            break;
        }
        printf("%4zu tokens: K-blocked %.3f ms, whole %.3f ms\n", ts[i], tb * 1e3, tw * 1e3);
        fflush(stdout);
        if (tb < tw) { return ts[i]; }
    }
    return r->o.T < CLFFN_MAX_GEMM_K_BLOCK_MIN_ROWS ? r->o.T : CLFFN_MAX_GEMM_K_BLOCK_MIN_ROWS;
}

/* The block a product of T token rows gets from the library under that threshold (clffn__sgemm:
 * m >= GEMM_K_BLOCK_MIN_ROWS), for the children, which run every product blocked. */
static size_t k_block_at(size_t T, size_t k_block, size_t k_min_rows) {
    return T >= k_min_rows ? k_block : 0;
}

/* What phases 5 and 7 found: the GEMV kernels' parameters and the crossover. */
typedef struct gemv_result {
    pset fast, rot;
    int have;
    size_t max_tokens;
} gemv_result;

/* A candidate's small-batch spec (opts.gemv) into buf. */
static const char *gemv_spec(char *buf, size_t size, size_t tokens, const gemv_result *g) {
    char f[128] = "", rt[128] = "";
    format_values(&g->fast, f, sizeof f);
    format_values(&g->rot, rt, sizeof rt);
    snprintf(buf, size, "%zu:%s,%s", tokens, f, rt);
    return buf;
}

/* Phase 5: XgemvFastRot, then XgemvFast, each over a short list of work-group size, work per
 * item and vector width (the kernels have few parameters, and the list spans what the full
 * sweeps, clffn-bench-gemms --gemv-sweep, and CLBlast's GPU database pick: 32/32/8 is its
 * NVIDIA default, 32/1/1 the H100's XgemvFast; the first two are POCL's, tried first when the
 * budget is short), scored at one token. Not resumable: it is short. */
static void phase_gemv(search *r, size_t min_indirect, size_t k_block, gemv_result *g) {
    static const size_t cands[][3] = {
        {16, 16, 16}, {8, 2, 2},   {64, 4, 4},  {16, 16, 8}, {4, 4, 4},    {4, 8, 4},   {16, 8, 8},
        {64, 8, 4},   {32, 8, 4},  {64, 1, 1},  {128, 1, 1}, {256, 1, 1},  {64, 2, 2},  {64, 16, 4},
        {32, 16, 8},  {128, 4, 4}, {32, 32, 8}, {64, 32, 8}, {128, 16, 8}, {256, 2, 2}, {32, 1, 1}};
    const size_t nc = sizeof cands / sizeof cands[0];
    gemv_sets(&g->fast, &g->rot);
    memcpy(g->fast.values, cands[0], sizeof cands[0]);
    memcpy(g->rot.values, cands[0], sizeof cands[0]);
    double best = INFINITY;
    for (int which = 0; which < 2; ++which) { /* 0: the rotated kernel (forward), 1: the other */
        pset *p = which ? &g->fast : &g->rot;
        size_t keep[3];
        memcpy(keep, p->values, sizeof keep);
        for (size_t i = 0; i < nc && !interrupted; ++i) {
            if (i >= 2 && spent(r) > r->budget) { break; }
            /* CLBlast's own tuner constraint for the rotated kernel: a tile no longer than
             * its work-group loads the whole vector */
            if (cands[i][0] > r->lim.max_wg || (!which && cands[i][1] > cands[i][0])) { continue; }
            memcpy(p->values, cands[i], sizeof cands[i]);
            char spec[300];
            opts o = r->o;
            o.gemv = gemv_spec(spec, sizeof spec, CLFFN_MAX_GEMV_TOKENS, g);
            double t;
            if (eval_child(&o, 1, &r->s.xgemm, &r->s.direct, min_indirect, k_block, &t) == 0 &&
                t < best) {
                best = t, g->have = 1;
                memcpy(keep, cands[i], sizeof keep);
            }
        }
        memcpy(p->values, keep, sizeof keep);
    }
    if (g->have) {
        printf("GEMV at 1 token (forward and backward-input products): %.3f ms\n", best * 1e3);
    }
}

/* Phase 6: WEIGHT_LAYOUT, the layout uploads keep the weights in (clffn_context_set_weight_
 * layout). The forward's products with the weights kept [out, in] and [in, out], at one token
 * (each layout has its own GEMV kernel), at 16 and at the tuned shape. Only the forward is
 * scored: the backward's input products pay whatever transposition the forward saves, so
 * training breaks even either way and inference takes the faster forward. [in, out] wins when
 * its times are shorter on average, as ratios, so that no one count decides. */
static clffn_layout phase_weight_layout(search *r, size_t min_indirect, size_t k_block,
                                        size_t k_min_rows, const gemv_result *g) {
    /* none beyond the tuned shape, none twice */
    const size_t ts[] = {1, r->o.T < 16 ? r->o.T : 16, r->o.T};
    char spec[300];
    opts o = r->o;
    o.gemv = g->have ? gemv_spec(spec, sizeof spec, 1, g) : "1";
    o.forward_only = 1;
    double ratio_sum = 0;
    int counted = 0;
    for (size_t i = 0; i < sizeof ts / sizeof ts[0] && !interrupted; ++i) {
        if ((i > 0 && ts[i] == ts[i - 1]) || (i > 1 && spent(r) > r->budget)) { continue; }
        const size_t kb = k_block_at(ts[i], k_block, k_min_rows);
        double t[2]; /* indexed by clffn_layout */
        int ok = 1;
        for (int l = 0; l < 2 && ok; ++l) {
            o.kept = l;
            ok = eval_child(&o, ts[i], &r->s.xgemm, &r->s.direct, min_indirect, kb, &t[l]) == 0;
        }
        if (!ok) { continue; }
        printf("%4zu tokens, forward: weights kept [out, in] %.3f ms, [in, out] %.3f ms\n", ts[i],
               t[CLFFN_LAYOUT_OUT_IN] * 1e3, t[CLFFN_LAYOUT_IN_OUT] * 1e3);
        fflush(stdout);
        ratio_sum += t[CLFFN_LAYOUT_IN_OUT] / t[CLFFN_LAYOUT_OUT_IN];
        ++counted;
    }
    return counted && ratio_sum < counted ? CLFFN_LAYOUT_IN_OUT : CLFFN_LAYOUT_OUT_IN;
}

/* Phase 7: GEMV_MAX_TOKENS. The GEMVs read the weights once per token and pad nothing; the
 * SGEMM reads them once and pads the tokens to a tile: the GEMVs win up to some count. */
static size_t phase_gemv_crossover(search *r, size_t min_indirect, size_t k_block,
                                   size_t k_min_rows, const gemv_result *g, clffn_layout kept) {
    size_t max_tokens = 0;
    for (size_t T = 1; T <= 64 && T <= r->o.T && !interrupted; T *= 2) {
        if (T > 1 && spent(r) > r->budget) { break; } /* keeps what it learnt */
        char spec[300], zero[8] = "0";
        opts ov = r->o, om = r->o;
        ov.gemv = g->have ? gemv_spec(spec, sizeof spec, CLFFN_MAX_GEMV_TOKENS, g) : "65536";
        om.gemv = zero;
        ov.kept = om.kept = (int)kept; /* every product as it will run */
        double tv, tm;
        const size_t kb = k_block_at(T, k_block, k_min_rows);
        if (eval_child(&ov, T, &r->s.xgemm, &r->s.direct, min_indirect, kb, &tv) != 0 ||
            eval_child(&om, T, &r->s.xgemm, &r->s.direct, min_indirect, kb, &tm) != 0) {
            break;
        }
        printf("%3zu tokens: GEMV %.3f ms, SGEMM %.3f ms\n", T, tv * 1e3, tm * 1e3);
        fflush(stdout);
        if (tv >= tm) { break; }
        max_tokens = T;
    }
    return max_tokens;
}

/* A few-tokens Xgemm set found by phase 8: rows 0 when there is none. */
typedef struct few_result {
    pset set;
    size_t rows;    /* XGEMM_FEW_ROWS: products of fewer tokens use set */
    char spec[300]; /* as opts.few gives it to a child */
} few_result;

static const char *few_spec(few_result *f, size_t rows) {
    char v[256];
    format_values(&f->set, v, sizeof v);
    snprintf(f->spec, sizeof f->spec, "%zu:%s", rows, v);
    return f->spec;
}

/* Phase 8: a second Xgemm set for few tokens (clffn_context_set_xgemm). The tokens are padded
 * to the tile's width along them (NWG), so a tile that is best for many tokens wastes most of
 * its work on a few; one that is narrow there is slow on many (docs/PERFORMANCE.md). Candidates:
 * the winner narrowed to 8 and 16 tokens (vectors and work-items along them cut to fit), with
 * its own KWG and with 64, and POCL's few-tokens set; each scored by the forward at 16 tokens
 * (or the tuned count, if fewer) against the winner alone, kept only if it beats it by more than
 * 3%. The threshold is then the first doubling of that count at which the winner alone is at
 * least as fast. Not resumable: it is short. */
static void phase_few_rows(search *r, size_t min_indirect, size_t k_block, size_t k_min_rows,
                           const gemv_result *g, clffn_layout kept, few_result *f) {
    static const size_t pocl_few[16] = {0, 1, 64, 8, 4, 4, 128, 1, 1, 8, 0, 0, 0, 1, 16, 8};
    f->rows = 0;
    f->set = r->s.xgemm;
    const size_t tf = r->o.T < 16 ? r->o.T : 16;
    if (tf <= g->max_tokens || interrupted) { return; } /* GEMVs run those */
    char gspec[300];
    opts o = r->o;
    o.gemv = g->have ? gemv_spec(gspec, sizeof gspec, g->max_tokens, g) : NULL;
    o.kept = (int)kept;
    o.forward_only = 1;
    double t_large, best = INFINITY;
    if (eval_child(&o, tf, &r->s.xgemm, &r->s.direct, min_indirect,
                   k_block_at(tf, k_block, k_min_rows), &t_large) != 0) {
        return;
    }
    pset cands[5];
    size_t nc = 0;
    for (int i = 0; i < 4; ++i) {
        pset c = r->s.xgemm;
        size_t *v = c.values;
        v[NWG] = i % 2 ? 16 : 8;
        if (v[VWN] > v[NWG]) { v[VWN] = v[NWG]; }
        while (v[NDIMC] > 1 && v[NWG] % (v[NDIMC] * v[VWN])) { v[NDIMC] /= 2; }
        while (v[NDIMB] > 1 && v[NWG] % (v[NDIMB] * v[VWN])) { v[NDIMB] /= 2; }
        if (i >= 2) { v[KWG] = 64; }
        if (xgemm_valid(v, &r->lim)) { cands[nc++] = c; }
    }
    cands[nc] = r->s.xgemm;
    memcpy(cands[nc].values, pocl_few, sizeof pocl_few);
    if (xgemm_valid(cands[nc].values, &r->lim)) { ++nc; }
    for (size_t i = 0; i < nc && !interrupted; ++i) {
        if (i >= 1 && spent(r) > r->budget) { break; }
        few_result c = {cands[i], 0, ""};
        o.few = few_spec(&c, tf + 1);
        double t;
        if (eval_child(&o, tf, &r->s.xgemm, &r->s.direct, min_indirect,
                       k_block_at(tf, k_block, k_min_rows), &t) == 0 &&
            t < best) {
            best = t, f->set = cands[i];
        }
    }
    printf("%3zu tokens, forward: one Xgemm set %.3f ms, with a few-tokens set %.3f ms\n", tf,
           t_large * 1e3, best * 1e3);
    if (!(best < 0.97 * t_large)) { return; }
    size_t rows = tf + 1; /* the set won there */
    for (size_t T = 2 * tf; T <= r->o.T && T <= 1024 && !interrupted; T *= 2) {
        double tl, tw;
        const size_t kb = k_block_at(T, k_block, k_min_rows);
        opts ol = o;
        ol.few = NULL;
        o.few = few_spec(f, T + 1);
        if (eval_child(&ol, T, &r->s.xgemm, &r->s.direct, min_indirect, kb, &tl) != 0 ||
            eval_child(&o, T, &r->s.xgemm, &r->s.direct, min_indirect, kb, &tw) != 0) {
            break;
        }
        printf("%3zu tokens, forward: one Xgemm set %.3f ms, the few-tokens set %.3f ms\n", T,
               tl * 1e3, tw * 1e3);
        fflush(stdout);
        if (tl <= tw) {
            rows = T;
            break;
        }
        rows = T + 1;
        if (spent(r) > r->budget) { break; }
    }
    f->rows = rows;
    few_spec(f, rows);
}

/* The winners as a profile, written atomically. */
static int write_profile(const search *r, size_t min_indirect, size_t k_block, size_t k_min_rows,
                         const gemv_result *g, const few_result *few, clffn_layout kept,
                         double after_s, int have_before, double before_s) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "platform", r->platform);
    cJSON_AddStringToObject(root, "device", r->name);
    cJSON_AddStringToObject(root, "driver", r->driver);
    cJSON *shape = cJSON_AddObjectToObject(root, "tuned_for");
    cJSON_AddNumberToObject(shape, "tokens", (double)r->o.T);
    cJSON_AddNumberToObject(shape, "d_model", (double)r->o.D);
    cJSON_AddNumberToObject(shape, "d_ff", (double)r->o.F);
    cJSON_AddBoolToObject(shape, "gated", r->o.gated);
    cJSON_AddNumberToObject(shape, "gemm_gflops", r->flops / after_s * 1e-9);
    if (have_before) {
        cJSON_AddNumberToObject(shape, "gemm_gflops_before", r->flops / before_s * 1e-9);
    }
    const pset routine = routine_set(min_indirect);
    cJSON *k = cJSON_AddObjectToObject(root, "clblast");
    cJSON_AddItemToObject(k, "Xgemm", pset_json(&r->s.xgemm));
    cJSON_AddItemToObject(k, "XgemmDirect", pset_json(&r->s.direct));
    cJSON_AddItemToObject(k, "GemmRoutine", pset_json(&routine));
    if (g->have) {
        cJSON_AddItemToObject(k, "XgemvFast", pset_json(&g->fast));
        cJSON_AddItemToObject(k, "XgemvFastRot", pset_json(&g->rot));
    }
    if (few->rows) {
        cJSON *fk = cJSON_AddObjectToObject(root, "clblast_few_rows");
        cJSON_AddItemToObject(fk, "Xgemm", pset_json(&few->set));
    }
    cJSON *own = cJSON_AddObjectToObject(root, "clffn");
    cJSON_AddNumberToObject(own, "GEMM_K_BLOCK", (double)k_block);
    cJSON_AddNumberToObject(own, "GEMM_K_BLOCK_MIN_ROWS", (double)k_min_rows);
    cJSON_AddNumberToObject(own, "GEMV_MAX_TOKENS", (double)g->max_tokens);
    cJSON_AddNumberToObject(own, "WEIGHT_LAYOUT", (double)kept);
    if (few->rows) { cJSON_AddNumberToObject(own, "XGEMM_FEW_ROWS", (double)few->rows); }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    char err[CLFFN_IO_ERR] = "out of memory";
    const void *parts[1] = {text};
    const size_t lens[1] = {text ? strlen(text) : 0};
    if (!text || clffn_write_atomic(r->path, parts, lens, 1, err) != 0) {
        fprintf(stderr, "clffn-tune: cannot write %s: %s\n", r->path, err);
        free(text);
        return 1;
    }
    remove(r->progress);
    if (have_before) {
        printf("GEMMs of the FFN: %.1f GFLOP/s before, %.1f GFLOP/s after (%.0f s)\n",
               r->flops / before_s * 1e-9, r->flops / after_s * 1e-9, spent(r));
    }
    printf("direct kernel below m*n*k = %zu^3; K-block %zu from %zu tokens; GEMVs up to %zu "
           "tokens; weights kept %s; a few-tokens Xgemm set below %zu tokens\nprofile: %s\n%s\n",
           min_indirect, k_block, k_min_rows, g->max_tokens,
           kept == CLFFN_LAYOUT_IN_OUT ? "[in, out]" : "[out, in]", few->rows, r->path, text);
    free(text);
    return 0;
}

/* Phases 3 and 4, then the winners together, checked (each child verifies its path), timed
 * against what was applied before, and written only if they are faster. */
static int finish(search *r, size_t small_t, int have_before, double before_s) {
    const size_t min_indirect = phase_crossover(r);
    const size_t k_block = phase_k_block(r, min_indirect);
    const size_t k_min_rows = phase_k_block_rows(r, min_indirect, k_block);
    gemv_result g;
    phase_gemv(r, min_indirect, k_block, &g);
    const clffn_layout kept = phase_weight_layout(r, min_indirect, k_block, k_min_rows, &g);
    g.max_tokens = phase_gemv_crossover(r, min_indirect, k_block, k_min_rows, &g, kept);
    few_result few;
    phase_few_rows(r, min_indirect, k_block, k_min_rows, &g, kept, &few);
    double after_s = 0, small_s = 0;
    const state *s = &r->s;
    opts o = r->o; /* with a few-tokens set, each child checks both sets */
    o.few = few.rows ? few.spec : NULL;
    if (eval_child(&o, r->o.T, &s->xgemm, &s->direct, min_indirect, k_block, &after_s) ||
        eval_child(&o, small_t, &s->xgemm, &s->direct, min_indirect,
                   k_block_at(small_t, k_block, k_min_rows), &small_s)) {
        fprintf(stderr, "clffn-tune: the winning parameters fail the check against the CPU; "
                        "no profile written\n");
        return 1;
    }
    if (have_before && after_s >= before_s) { /* a profile must never make things slower */
        printf("clffn-tune: nothing found beats what is applied now (%.1f vs %.1f GFLOP/s); "
               "no profile written. A larger --budget searches further.\n",
               r->flops / after_s * 1e-9, r->flops / before_s * 1e-9);
        remove(r->progress);
        return 0;
    }
    return write_profile(r, min_indirect, k_block, k_min_rows, &g, &few, kept, after_s, have_before,
                         before_s);
}

static void state_init(state *s, const char *progress_path, int fresh) {
    memset(s, 0, sizeof *s);
    s->phase = 1;
    s->xgemm = (pset){"Xgemm", 16, {0}, {0}};
    for (int i = 0; i < 16; ++i) { s->xgemm.names[i] = XGEMM_NAMES[i]; }
    s->direct = (pset){"XgemmDirect", 10, {0}, {0}};
    for (int i = 0; i < 10; ++i) { s->direct.names[i] = DIRECT_NAMES[i]; }
    if (!fresh) { load_state(progress_path, s); }
    if (s->spent_s > 0) {
        fprintf(stderr, "clffn-tune: resuming phase %d at candidate %d (%.0f s spent)\n", s->phase,
                s->index, s->spent_s);
    }
}

static int tool_main(int argc, char **argv) {
    static search r; /* large: path buffers */
    r.o = (opts){NULL, 640, 512, 2048, 0, NULL, -1, 0, NULL};
    r.budget = 180;
    int fresh = 0, print_only = 0;
    const char *eval[4] = {NULL, NULL, NULL, NULL};
    int rc = parse_options(argc, argv, &r, &fresh, &print_only, eval);
    if (rc >= 0) { return rc; }
    if (eval[0]) {
        size_t routine;
        if (tool_parse_size(eval[2], 0, SIZE_MAX, &routine) != 0) { return 1; }
        return eval_main(&r.o, eval[0], eval[1], routine, eval[3]);
    }
    if ((rc = device_facts(&r, print_only)) >= 0) { return rc; }
    if (make_dirs(r.dir) != 0) {
        fprintf(stderr, "clffn-tune: cannot create %s: %s\n", r.dir, strerror(errno));
        return 1;
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    r.tty = isatty(2);
    const size_t N1 = r.o.gated ? 2 * r.o.F : r.o.F;
    r.flops = 2.0 * (double)r.o.T * (double)r.o.D * (double)(N1 + r.o.F);
    /* K-blocking pays on CPUs, whose caches the operand panels outgrow (docs/PERFORMANCE.md) */
    r.kb_guess = r.lim.cpu ? 256 : 0;
    state_init(&r.s, r.progress, fresh);
    printf("clffn-tune: %s, FFN %zu tokens, %zu -> %zu%s, budget %.0f s\n", r.name, r.o.T, r.o.D,
           r.o.F, r.o.gated ? " gated" : "", r.budget);
    fflush(stdout);
    /* the budget covers everything from here, the earlier runs of an interrupted search too */
    r.t0 = tool_now_s() - r.s.spent_s;

    /* before: what the library applies today (a profile, the built-in one, or CLBlast's) */
    double before_s = 0;
    const int have_before = eval_child(&r.o, r.o.T, NULL, NULL, 0, KB_APPLIED, &before_s) == 0;
    const size_t small_t = r.o.T < 16 ? r.o.T : 16;
    phase_xgemm(&r);
    phase_direct(&r, small_t);
    if (r.tty) { fputc('\n', stderr); }
    if (interrupted) {
        fprintf(stderr, "clffn-tune: interrupted; run again to resume from %s\n", r.progress);
        return 1;
    }
    if (!r.s.have_xgemm || !r.s.have_direct) {
        fprintf(stderr, "clffn-tune: no working candidate for %s\n",
                r.s.have_xgemm ? "XgemmDirect" : "Xgemm");
        return 1;
    }
    return finish(&r, small_t, have_before, before_s);
}

int main(int argc, char **argv) { return tool_exit("clffn-tune", tool_main(argc, argv)); }
