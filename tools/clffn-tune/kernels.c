/* clffn-tune, phase 9: clffn's own few-token kernels over weights in their stored type
 * (cl/weights.cl). Their shapes (WGEMV_*: work-items per row and rows per group of the row
 * kernel; columns per work-item, work-items per column group and groups per work-group of the
 * column kernel) and the four crossovers the library reads from the profile:
 * KERNEL_MAX_TOKENS, the most tokens for which f16 and bf16 weights go through the kernels
 * rather than dequantized blocks and SGEMM; KERNEL_MAX_TOKENS_BLOCKS, the same for q8_0 and q4_0
 * weights, whose kernels decode bytes (on a CPU they win further); KERNEL_MAX_TOKENS_QX, the
 * same where the inputs are quantized (clffn_context_set_quantized_inputs); and
 * KERNEL_MAX_TOKENS_F32, the same for f32 weights against CLBlast's path.
 *
 * Each measurement runs in a child (this program with --eval --kernels), with the winners of
 * the earlier phases applied, on the tuned d_model and d_ff: one child per weight type times
 * the forward at one token under every candidate shape, then one per type and kind of input
 * times 1, 2, 4, 8, 16 tokens and on (past 16 the kernels run in passes) with the winning shape
 * through the kernels and without, after checking that both paths agree, until the kernels
 * lose, then three quarters of that count. On a CPU device whose kernels take a row a work-item,
 * between the two: WGEMV_ROW_GROUP_COLS, the input size (the product's inner dimension × the
 * pass's tokens, in floats) from which rows go several to a work-item, one child per type timing
 * the forward at 1, 2, 4, 8 and 16 tokens in turns under each boundary that the tuned shape's
 * products tell apart; it stays the profile's unless another is at least 3% faster (hosts'
 * memory moves more than that between runs). The compressed crossover is measured once more, in
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

/* The crossover written where the kernels win at every count measured: by MOST_TOKENS both
 * paths cost the same per token at any count, so they win at every count (the library's
 * largest profile value). */
#define EVERY_COUNT 1073741824L
const size_t TOKEN_COUNTS[N_TOKEN_COUNTS] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
const size_t GROUP_COUNTS[N_GROUP_COUNTS] = {1, 2, 4, 8, 16};

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

static int cmp_size(const void *a, const void *b) {
    const size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return (x > y) - (x < y);
}

/* WGEMV_ROW_GROUP_COLS on a CPU device whose row kernels take a row a work-item (k->shape):
 * the boundaries that the tuned shape's products tell apart (each input size its products take
 * at GROUP_COUNTS, and one past the largest: no grouping at this shape), scored by the forward
 * at those counts summed over the types. The profile's boundary stays unless another is at
 * least 3% faster. Into e->o.row_group (buf) for the crossovers after it. */
static void row_groups(kernel_env *e, const char *const types[], int n_types, kernel_result *k,
                       char *buf, size_t size) {
    if (!e->r->lim.cpu || k->shape[0] != 1 || interrupted) { return; }
    size_t b[MAX_GROUP_BOUNDS];
    int n = 0;
    for (int c = 0; c < N_GROUP_COUNTS; ++c) {
        b[n++] = e->o.D * GROUP_COUNTS[c];
        b[n++] = e->o.F * GROUP_COUNTS[c];
    }
    qsort(b, (size_t)n, sizeof *b, cmp_size);
    int u = 1;
    for (int i = 1; i < n; ++i) {
        if (b[i] != b[u - 1]) { b[u++] = b[i]; }
    }
    b[u] = b[u - 1] + 1;
    n = u + 1;
    /* the boundary in force: the candidate that groups the same inputs */
    const size_t now = e->r->row_group_cols;
    int cur = 0;
    while (cur < n - 1 && b[cur] < now) { ++cur; }
    char list[512], one[64];
    shape_text(k->shape, list, sizeof list);
    for (int i = 0; i < n; ++i) {
        snprintf(one, sizeof one, "%s%zu", i ? "," : ";", b[i]);
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s", one);
    }
    double sum[MAX_GROUP_BOUNDS] = {0}, t[MAX_GROUP_BOUNDS];
    for (int ty = 0; ty < n_types; ++ty) {
        if (child_times(e, types[ty], "groups", list, t, n) != n) { return; }
        for (int i = 0; i < n; ++i) { sum[i] += t[i]; }
    }
    int best = cur;
    for (int i = 0; i < n; ++i) {
        printf("rows grouped from %9zu floats: %.3f ms over %s%s, 1-16 tokens%s\n", b[i],
               sum[i] * 1e3, types[0], n_types > 1 ? " and the others" : "",
               i == cur ? " (the profile's)" : "");
        if (sum[i] < sum[best]) { best = i; }
    }
    if (sum[best] > 0.97 * sum[cur]) { best = cur; }
    k->have_row_group = 1;
    k->row_group_cols = best == cur ? now : b[best];
    snprintf(buf, size, "%zu", k->row_group_cols);
    e->o.row_group = buf;
    fflush(stdout);
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

/* f32's layout and crossover, chosen together: the layout phase 6 chose scores CLBlast's
 * products, but the row kernels read weights kept [out, in] along their rows and the strips
 * read [in, out] ones down their columns, so the kernels may win further in the other layout,
 * far enough to make it the faster one (on POCL on Intel's cores [out, in] with the kernels at
 * every count, where [in, out] took the strips to 4 tokens and CLBlast past them). The other
 * layout's crossover is measured as the first's was; then each pair's forward at the token
 * counts up to the tuned shape's (and 1 to 16 below that), in children of their own. The
 * other layout wins when its times are at least 3% shorter on average, as ratios, as phase 6
 * scores; a failing child keeps phase 6's layout and its crossover. */
static void f32_layout(kernel_env *e, clffn_layout kept, long f32, kernel_result *k) {
    const clffn_layout other =
        kept == CLFFN_LAYOUT_OUT_IN ? CLFFN_LAYOUT_IN_OUT : CLFFN_LAYOUT_OUT_IN;
    k->layout = kept, k->max_tokens_f32 = (size_t)f32;
    if (interrupted) { return; }
    kernel_env oe = *e;
    oe.o.kept = (int)other;
    printf("f32   with the weights kept %s:\n", layout_text(other));
    const long f32_other = crossover(&oe, "f32", "cross", k->shape);
    if (f32_other < 0) { return; }
    char list[256], shape[64];
    shape_text(k->shape, shape, sizeof shape);
    int n = 0;
    const size_t top = e->o.T > 16 ? e->o.T : 16;
    while (n < N_TOKEN_COUNTS && TOKEN_COUNTS[n] <= top) { ++n; }
    double t[2][N_TOKEN_COUNTS];
    const long most[2] = {f32, f32_other};
    for (int l = 0; l < 2; ++l) {
        char arg[64];
        snprintf(list, sizeof list, "%s;%ld;", shape, most[l]);
        for (int i = 0; i < n; ++i) {
            snprintf(arg, sizeof arg, "%s%zu", i ? "," : "", TOKEN_COUNTS[i]);
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s", arg);
        }
        if (child_times(l ? &oe : e, "f32", "times", list, t[l], n) != n) { return; }
    }
    double ratio_sum = 0;
    for (int i = 0; i < n; ++i) {
        printf("f32   %4zu tokens: weights kept %s (kernels to %ld) %.3f ms, %s (to %ld) %.3f "
               "ms\n",
               TOKEN_COUNTS[i], layout_text(kept), f32, t[0][i] * 1e3, layout_text(other),
               f32_other, t[1][i] * 1e3);
        ratio_sum += t[1][i] / t[0][i];
    }
    if (ratio_sum < 0.97 * n) { k->layout = other, k->max_tokens_f32 = (size_t)f32_other; }
    printf("f32   weights kept %s, kernels to %zu\n", layout_text(k->layout), k->max_tokens_f32);
    fflush(stdout);
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
    char group[32];
    row_groups(&e, types, n_types, k, group, sizeof group);
    /* q4_0's stands for q8_0's (both decode bytes), f16's for bf16's (both convert halves);
     * without the quantized types f16's is both */
    long cross[2];
    for (int ty = 0; ty < n_types; ++ty) {
        if ((cross[ty] = crossover(&e, types[ty], "cross", k->shape)) < 0) { return; }
    }
    const long compressed = cross[n_types - 1], blocks = cross[0];
    long qx = EVERY_COUNT;
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
    k->max_tokens_blocks = (size_t)blocks;
    k->max_tokens_qx = (size_t)qx;
    k->max_tokens_large = (size_t)(compressed < blocks ? compressed : blocks);
    f32_layout(&e, kept, f32, k);
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
    cJSON_AddNumberToObject(own, "KERNEL_MAX_TOKENS_BLOCKS", (double)k->max_tokens_blocks);
    cJSON_AddNumberToObject(own, "KERNEL_MAX_TOKENS_F32", (double)k->max_tokens_f32);
    cJSON_AddNumberToObject(own, "WEIGHT_LAYOUT", (double)k->layout);
    if (k->have_row_group) {
        cJSON_AddNumberToObject(own, "WGEMV_ROW_GROUP_COLS", (double)k->row_group_cols);
    }
    if (k->large_weights) {
        cJSON_AddNumberToObject(own, "KERNEL_MAX_TOKENS_LARGE", (double)k->max_tokens_large);
        cJSON_AddNumberToObject(own, "KERNEL_LARGE_WEIGHTS", (double)k->large_weights);
    }
}
