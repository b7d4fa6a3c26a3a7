/* clffn-tune, phase 9: clffn's own few-token kernels over weights in their stored type
 * (cl/weights.cl). Their shapes (WGEMV_*: work-items per row and rows per group of the row
 * kernel; columns per work-item, work-items per column group and groups per work-group of the
 * column kernel) and the three crossovers the library reads from the profile:
 * KERNEL_MAX_TOKENS, the most tokens for which compressed weights go through the kernels rather
 * than dequantized blocks and SGEMM; KERNEL_MAX_TOKENS_QX, the same where the inputs are
 * quantized (clffn_context_set_quantized_inputs); and KERNEL_MAX_TOKENS_F32, the same for f32
 * weights against CLBlast's path.
 *
 * Each measurement runs in a child (this program with --eval --kernels), with the winners of
 * the earlier phases applied, on the tuned d_model and d_ff: one child per weight type times
 * the forward at one token under every candidate shape, then one per type and kind of input
 * times 1, 2, 4, 8, 16 tokens and on (past 16 the kernels run in passes) with the winning shape
 * through the kernels and without, after checking that both paths agree, until the kernels
 * lose, then three quarters of that count. The compressed crossover is measured once more, in
 * f16, on a large shape (--large-shape), for the products at least as large as its W2:
 * KERNEL_MAX_TOKENS_LARGE and KERNEL_LARGE_WEIGHTS. */
#include "tune.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const WGEMV_NAMES[CLFFN_WGEMV_PARAMS] = {
    "WGEMV_ROW_SPLIT", "WGEMV_ROW_ROWS", "WGEMV_COL_WIDTH", "WGEMV_COL_SPLIT", "WGEMV_COL_GROUPS"};

/* Candidates, the library's default for the device class first: on a CPU each work-item walks
 * whole rows (more or fewer per work-group; with COL_SPLIT 1 the column GEMV's strips are the
 * library's own, so the column parameters change nothing), on a GPU a warp or half of one
 * shares a row or a column group. */
static const size_t SHAPES_CPU[][CLFFN_WGEMV_PARAMS] = {
    {1, 8, 64, 1, 4}, {1, 4, 64, 1, 4}, {1, 16, 64, 1, 4}, {1, 2, 64, 1, 4}, {1, 32, 64, 1, 4},
};
static const size_t SHAPES_GPU[][CLFFN_WGEMV_PARAMS] = {
    {32, 4, 8, 16, 8}, {16, 8, 8, 16, 8}, {32, 2, 16, 8, 8}, {64, 2, 8, 32, 4}, {8, 16, 8, 8, 16},
};

enum { N_TOKEN_COUNTS = 11, MOST_TOKENS = 1024 };
/* The crossover written where the kernels win at every count measured: by MOST_TOKENS both
 * paths cost the same per token at any count, so they win at every count (the library's
 * largest profile value). */
#define EVERY_COUNT 1073741824L
static const size_t TOKEN_COUNTS[N_TOKEN_COUNTS] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};

/* ------------------------------------------------------------------------------------------ */
/* The child */

typedef struct kbench {
    clffn_context *ctx;
    clffn_ffn *ffn;
    cl_mem x, y;
    clffn_dtype dtype;
    size_t D;
    int which; /* the clffn_kernel_class its products take */
} kbench;

/* An FFN of the tuned shape with random weights in dtype, and x and y for MOST_TOKENS. */
static int kbench_make(kbench *b, const opts *o, clffn_dtype dtype) {
    const size_t D = o->D, F = o->F, n = D * F;
    clffn_config c = clffn_config_default(D, F);
    c.gated = o->gated;
    c.activation = o->gated ? CLFFN_ACT_SILU : CLFFN_ACT_GELU;
    b->dtype = dtype, b->D = D;
    if (clffn_ffn_create(b->ctx, &c, &b->ffn) != CLFFN_SUCCESS) { return -1; }
    size_t bytes;
    if (clffn_dtype_bytes(dtype, n, &bytes) != CLFFN_SUCCESS) { return -1; }
    float *w = malloc(n * sizeof *w), *bias = calloc(F, sizeof *bias);
    float *xs = malloc(MOST_TOKENS * D * sizeof *xs);
    void *m[3] = {malloc(bytes), malloc(bytes), malloc(bytes)};
    int rc = w && bias && xs && m[0] && m[1] && m[2] ? 0 : -1;
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int k = 0; k < 3 && rc == 0; ++k) {
        for (size_t i = 0; i < n; ++i) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            w[i] = (float)((double)(s >> 40) / 16777216.0 - 0.5) * 0.1f;
        }
        if (clffn_convert_weights(dtype, w, n, m[k], bytes) != CLFFN_SUCCESS) { rc = -1; }
    }
    for (size_t i = 0; rc == 0 && i < MOST_TOKENS * D; ++i) {
        xs[i] = (float)sin(0.01 * (double)i);
    }
    const clffn_typed_weights tw = {dtype, m[0], o->gated ? m[1] : NULL, m[2], bias, bias, bias};
    if (rc == 0 && clffn_ffn_upload_weights_typed(b->ffn, CLFFN_LAYOUT_OUT_IN, &tw) != 0) {
        rc = -1;
    }
    cl_int e1 = CL_SUCCESS, e2 = CL_SUCCESS;
    if (rc == 0) {
        const cl_context cx = clffn_context_cl_context(b->ctx);
        const size_t bytes_x = MOST_TOKENS * D * 4;
        b->x = clCreateBuffer(cx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, bytes_x, xs, &e1);
        b->y = clCreateBuffer(cx, CL_MEM_READ_WRITE, bytes_x, NULL, &e2);
    }
    free(w), free(bias), free(xs), free(m[0]), free(m[1]), free(m[2]);
    return rc == 0 && e1 == CL_SUCCESS && e2 == CL_SUCCESS ? 0 : -1;
}

/* Best of five forwards at T tokens (after one that builds the kernels), through the kernels
 * up to `through` tokens. */
static int forward_time(kbench *b, size_t T, size_t through, double *sec) {
    if (clffn_context_set_kernel_max_tokens(b->ctx, b->which, through) != CLFFN_SUCCESS) {
        return -1;
    }
    cl_command_queue q = clffn_context_queue(b->ctx);
    double best = INFINITY;
    for (int r = 0; r < 6; ++r) {
        const double t0 = tool_now_s();
        if (clffn_forward(b->ffn, T, b->x, 0, b->y, 0, q, NULL) != CLFFN_SUCCESS ||
            tool_finish(q) != CL_SUCCESS) {
            return -1;
        }
        const double t = tool_now_s() - t0;
        if (r > 0 && t < best) { best = t; }
    }
    *sec = best;
    return 0;
}

/* y at T tokens through the kernels (in passes past CLFFN_MAX_KERNEL_TOKENS), and without,
 * agree. */
static int paths_agree(kbench *b, size_t T) {
    const size_t n = T * b->D;
    float *a = malloc(n * 4), *c = malloc(n * 4);
    double *ref = malloc(n * sizeof *ref);
    cl_command_queue q = clffn_context_queue(b->ctx);
    int ok = a && c && ref;
    for (int side = 0; side < 2 && ok; ++side) {
        ok = clffn_context_set_kernel_max_tokens(b->ctx, b->which, side ? MOST_TOKENS : 0) == 0 &&
             clffn_forward(b->ffn, T, b->x, 0, b->y, 0, q, NULL) == CLFFN_SUCCESS &&
             clEnqueueReadBuffer(q, b->y, CL_TRUE, 0, n * 4, side ? a : c, 0, NULL, NULL) == 0;
    }
    for (size_t i = 0; ok && i < n; ++i) { ref[i] = c[i]; }
    /* inputs rounded to 8 bits (2^-8 of their block's largest) move y by about 1%: the check
     * then catches a broken kernel, not the rounding */
    const double tol = b->which == CLFFN_KERNELS_QUANTIZED ? 5e-2 : 1e-4;
    ok = ok && tool_compare(a, ref, n, tol, tol / 10).pass;
    free(a), free(c), free(ref);
    return ok ? 0 : -1;
}

/* T tokens through the kernels (*t) and without them (*t0), printed as a pair. */
static int both_paths(kbench *b, size_t T, double *t, double *t0) {
    if (forward_time(b, T, MOST_TOKENS, t) != 0 || forward_time(b, T, 0, t0) != 0) { return -1; }
    printf("%.9g %.9g ", *t, *t0);
    return 0;
}

/* "p1,…,p5" into p. */
static int parse_shape(const char *s, size_t p[CLFFN_WGEMV_PARAMS]) {
    pset ps = {"", CLFFN_WGEMV_PARAMS, {0}, {0}};
    if (pset_parse(s, &ps) != 0) { return -1; }
    memcpy(p, ps.values, CLFFN_WGEMV_PARAMS * sizeof *p);
    return 0;
}

/* The measurement opts.kernels asks for, printed on one line. */
static int kernels_measure(kbench *b, const char *mode, const char *rest) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", rest);
    size_t p[CLFFN_WGEMV_PARAMS];
    double t, t0;
    if (!strcmp(mode, "shapes")) { /* in turns, so a noisy moment costs every shape alike */
        size_t shapes[8][CLFFN_WGEMV_PARAMS];
        double best[8];
        int n = 0;
        for (char *save = NULL, *s = strtok_r(buf, ";", &save); s && n < 8;
             s = strtok_r(NULL, ";", &save), ++n) {
            if (parse_shape(s, shapes[n]) != 0) { return 1; }
            best[n] = INFINITY;
        }
        for (int round = 0; round < 4; ++round) {
            for (int i = 0; i < n; ++i) {
                if (clffn_context_set_wgemv(b->ctx, shapes[i]) != CLFFN_SUCCESS ||
                    forward_time(b, 1, 16, &t) != 0) {
                    return 1;
                }
                if (t < best[i]) { best[i] = t; }
            }
        }
        for (int i = 0; i < n; ++i) { printf("%.9g ", best[i]); }
    } else if (!strcmp(mode, "cross") || !strcmp(mode, "crossqx")) {
        if (parse_shape(buf, p) != 0 || clffn_context_set_wgemv(b->ctx, p) != CLFFN_SUCCESS) {
            return 1;
        }
        if (!strcmp(mode, "crossqx")) {
            b->which = CLFFN_KERNELS_QUANTIZED;
            if (clffn_context_set_quantized_inputs(b->ctx, 1) != CLFFN_SUCCESS) { return 1; }
        }
        if (paths_agree(b, 3) != 0 || paths_agree(b, 20) != 0) { return 3; }
        /* up to the first count the kernels lose, then (from 4 tokens) three quarters of it:
         * between powers of two the crossover may lie anywhere */
        for (int i = 0; i < N_TOKEN_COUNTS; ++i) {
            const size_t T = TOKEN_COUNTS[i];
            if (both_paths(b, T, &t, &t0) != 0) { return 1; }
            if (t < t0) { continue; }
            if (T >= 4 && both_paths(b, T * 3 / 4, &t, &t0) != 0) { return 1; }
            break;
        }
    } else {
        return 1;
    }
    printf("\n");
    return 0;
}

int kernels_main(const opts *o, const candidate *c) {
    char type[16], mode[16];
    const char *colon = strchr(o->kernels, ':'), *colon2 = colon ? strchr(colon + 1, ':') : NULL;
    if (!colon2 || (size_t)(colon - o->kernels) >= sizeof type ||
        (size_t)(colon2 - colon - 1) >= sizeof mode) {
        return 1;
    }
    snprintf(type, sizeof type, "%.*s", (int)(colon - o->kernels), o->kernels);
    snprintf(mode, sizeof mode, "%.*s", (int)(colon2 - colon - 1), colon + 1);
    clffn_dtype dtype;
    if (clffn_dtype_parse(type, &dtype) != CLFFN_SUCCESS) { return 1; }
    kbench b = {0};
    b.which = dtype == CLFFN_DTYPE_F32 ? CLFFN_KERNELS_F32 : CLFFN_KERNELS_COMPRESSED;
    if (clffn_context_create_for_device(o->device, &b.ctx) != CLFFN_SUCCESS) { return 1; }
    int rc = 1;
    if (eval_apply(b.ctx, o, c) == 0 &&
        (o->kept < 0 || clffn_context_set_weight_layout(b.ctx, (clffn_layout)o->kept) == 0) &&
        kbench_make(&b, o, dtype) == 0) {
        rc = kernels_measure(&b, mode, colon2 + 1);
    }
    if (b.x) { clReleaseMemObject(b.x); }
    if (b.y) { clReleaseMemObject(b.y); }
    clffn_ffn_destroy(b.ffn);
    clffn_context_destroy(b.ctx);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* The parent */

typedef struct kernel_env {
    search *r;
    opts o;
    size_t min_indirect, kb;
} kernel_env;

/* One child's line of seconds for type: up to n numbers into t; how many (at least one), or
 * -1. */
static int child_times(kernel_env *e, const char *type, const char *mode, const char *arg,
                       double *t, int n) {
    char spec[2048], line[1024];
    snprintf(spec, sizeof spec, "%s:%s:%s", type, mode, arg);
    opts o = e->o;
    o.kernels = spec;
    if (eval_child_line(&o, 1, &e->r->s.xgemm, &e->r->s.direct, e->min_indirect, e->kb, line,
                        sizeof line) != 0) {
        return -1;
    }
    const char *p = line;
    int i = 0;
    for (; i < n; ++i) {
        char *end;
        t[i] = strtod(p, &end);
        if (end == p) { break; }
        if (!(t[i] > 0)) { return -1; }
        p = end;
    }
    return i > 0 ? i : -1;
}

static void shape_text(const size_t p[CLFFN_WGEMV_PARAMS], char *buf, size_t size) {
    snprintf(buf, size, "%zu,%zu,%zu,%zu,%zu", p[0], p[1], p[2], p[3], p[4]);
}

/* The candidate shape with the least one-token forward summed over the types. */
static int best_shape(kernel_env *e, const char *const types[], int n_types, kernel_result *k) {
    const int cpu = e->r->lim.cpu;
    const size_t(*cands)[CLFFN_WGEMV_PARAMS] = cpu ? SHAPES_CPU : SHAPES_GPU;
    const int nc = (int)(cpu ? sizeof SHAPES_CPU / sizeof SHAPES_CPU[0]
                             : sizeof SHAPES_GPU / sizeof SHAPES_GPU[0]);
    char list[1024] = "", one[64];
    int kept[8], nk = 0;
    for (int i = 0; i < nc; ++i) {
        const size_t *p = cands[i];
        if (p[0] * p[1] > e->r->lim.max_wg || p[3] * p[4] > e->r->lim.max_wg) { continue; }
        shape_text(p, one, sizeof one);
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", nk ? ";" : "", one);
        kept[nk++] = i;
    }
    double sum[8] = {0}, t[8];
    for (int ty = 0; ty < n_types; ++ty) {
        if (child_times(e, types[ty], "shapes", list, t, nk) != nk) { return -1; }
        for (int i = 0; i < nk; ++i) { sum[i] += t[i]; }
    }
    int best = 0;
    for (int i = 0; i < nk; ++i) {
        shape_text(cands[kept[i]], one, sizeof one);
        printf("kernel shape %-18s one token: %.3f ms over %s%s\n", one, sum[i] * 1e3, types[0],
               n_types > 1 ? " and the others" : "");
        if (sum[i] < sum[best]) { best = i; }
    }
    memcpy(k->shape, cands[kept[best]], sizeof k->shape);
    return 0;
}

/* The largest token count up to which type's kernels beat the path they replace at every count
 * measured (mode "cross", or "crossqx" with quantized inputs): the last power of two they win,
 * or three quarters of the first they lose where they win that; -1 when a child fails or the
 * paths disagree. */
static long crossover(kernel_env *e, const char *type, const char *mode,
                      const size_t shape[CLFFN_WGEMV_PARAMS]) {
    char s[64];
    double t[2 * N_TOKEN_COUNTS + 2];
    shape_text(shape, s, sizeof s);
    const int n = child_times(e, type, mode, s, t, 2 * N_TOKEN_COUNTS + 2);
    if (n < 2) { return -1; }
    const int qx = !strcmp(mode, "crossqx");
    long max = 0;
    for (int i = 0; i < n / 2; ++i) {
        /* the pair after the first loss is at three quarters of its count */
        const int lost = i > 0 && t[2 * i - 2] >= t[2 * i - 1];
        const size_t T = lost ? TOKEN_COUNTS[i - 1] * 3 / 4 : TOKEN_COUNTS[i];
        printf("%-5s %4zu tokens%s: kernels %.3f ms, %s %.3f ms\n", type, T,
               qx ? ", quantized inputs" : "", t[2 * i] * 1e3,
               strcmp(type, "f32") ? "dequantized SGEMM" : "CLBlast", t[2 * i + 1] * 1e3);
        if (t[2 * i] < t[2 * i + 1]) { max = (long)T; } /* the pairs before a loss all won */
    }
    if (max == MOST_TOKENS) {
        printf("%-5s kernels ahead at every count measured: %ld\n", type, EVERY_COUNT);
        max = EVERY_COUNT;
    }
    fflush(stdout);
    return max;
}

/* The compressed crossover of large products: f16 on --large-shape, gated, where its W2 (its
 * smaller product, whose weights become KERNEL_LARGE_WEIGHTS) outgrows the tuned shape's
 * largest product. Dequantized SGEMM slows per token as the products grow, the kernels do not
 * (docs/PERFORMANCE.md, "Large products"). A failing child leaves the one crossover. */
static void large_crossover(kernel_env *e, kernel_result *k) {
    const search *r = e->r;
    const size_t tuned = (r->o.gated ? 2 : 1) * r->o.D * r->o.F, large = r->large_D * r->large_F;
    if (!large || large <= tuned || interrupted) { return; }
    kernel_env le = *e;
    le.o.D = r->large_D, le.o.F = r->large_F, le.o.gated = 1;
    printf("large products: %zu -> %zu gated, from %zu weights\n", r->large_D, r->large_F, large);
    const long m = crossover(&le, "f16", "cross", k->shape);
    if (m < 0) { return; }
    k->max_tokens_large = (size_t)m;
    k->large_weights = large;
}

/* Phase 9. The quantized types need d_model and d_ff in multiples of 32; without them the shapes
 * and the compressed crossover are measured on f16 alone. Not resumable: it is short. */
void phase_kernels(search *r, size_t min_indirect, size_t k_block, size_t k_min_rows,
                   const gemv_result *g, clffn_layout kept, const few_result *few,
                   kernel_result *k) {
    memset(k, 0, sizeof *k);
    if (interrupted) { return; }
    char gspec[300];
    /* the SGEMM side blocked as the library would block it at each count measured */
    kernel_env e = {r, r->o, min_indirect, k_block};
    e.o.k_min_rows = k_block ? k_min_rows : 0;
    e.o.gemv = g->have ? gemv_spec(gspec, sizeof gspec, g->max_tokens, g) : NULL;
    e.o.kept = (int)kept;
    e.o.few = few->rows ? few->spec : NULL;
    const int quantized = r->o.D % 32 == 0 && r->o.F % 32 == 0;
    const char *const types[2] = {quantized ? "q4_0" : "f16", "f16"};
    const int n_types = quantized ? 2 : 1;
    if (best_shape(&e, types, n_types, k) != 0) { return; }
    long compressed = EVERY_COUNT, qx = EVERY_COUNT;
    for (int ty = 0; ty < n_types; ++ty) {
        const long m = crossover(&e, types[ty], "cross", k->shape);
        if (m < 0) { return; }
        if (m < compressed) { compressed = m; }
    }
    /* the types whose inputs the context can quantize: q8_0's integer products stand for
     * q4_0's, bf16's are their own */
    const char *const qx_types[2] = {quantized ? "q8_0" : "bf16", "bf16"};
    for (int ty = 0; ty < n_types; ++ty) {
        const long m = crossover(&e, qx_types[ty], "crossqx", k->shape);
        if (m < 0) { return; }
        if (m < qx) { qx = m; }
    }
    const long f32 = crossover(&e, "f32", "cross", k->shape);
    if (f32 < 0) { return; }
    k->max_tokens = (size_t)compressed;
    k->max_tokens_qx = (size_t)qx;
    k->max_tokens_f32 = (size_t)f32;
    k->max_tokens_large = (size_t)compressed;
    k->have = 1;
    large_crossover(&e, k);
}

/* The phase's findings into the profile's "clffn" object. */
void kernels_json(cJSON *own, const kernel_result *k) {
    if (!k->have) { return; }
    for (int i = 0; i < CLFFN_WGEMV_PARAMS; ++i) {
        cJSON_AddNumberToObject(own, WGEMV_NAMES[i], (double)k->shape[i]);
    }
    cJSON_AddNumberToObject(own, "KERNEL_MAX_TOKENS", (double)k->max_tokens);
    cJSON_AddNumberToObject(own, "KERNEL_MAX_TOKENS_QX", (double)k->max_tokens_qx);
    cJSON_AddNumberToObject(own, "KERNEL_MAX_TOKENS_F32", (double)k->max_tokens_f32);
    if (k->large_weights) {
        cJSON_AddNumberToObject(own, "KERNEL_MAX_TOKENS_LARGE", (double)k->max_tokens_large);
        cJSON_AddNumberToObject(own, "KERNEL_LARGE_WEIGHTS", (double)k->large_weights);
    }
}
