/* clffn-bench --experts E --top-k K: a mixture-of-experts layer of E experts of the FFN the other
 * options describe (its activation, gating and --weights-dtype), with a random router, timed as
 * the FFN is (device-level forwards, wall clock around each and its completion), side by side with
 * the dense FFN of the same config doing the same work per expert: the rows an expert gets on
 * average, ⌈T·k / E⌉ (one row at one token: the k experts one token runs are k one-row FFNs).
 * Reports the weights the layer actually read (the router and the experts the tokens chose) and
 * the rows per second against the dense FFN's. */
#include "bench.h"
#include "common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct moe_run {
    clffn_moe *moe;
    size_t chosen;           /* distinct experts the timed tokens choose */
    size_t most, fewest;     /* the rows of the busiest expert and of the idlest (0: unchosen) */
    clffn_context *more[64]; /* --expert-split: the group's contexts past the first */
} moe_run;

/* The layer: router weights uniform in ±1/√D (nn.Linear's), each expert's weights from its own
 * seed in --weights-dtype. */
static int moe_setup(moe_run *m, device_run *r, const args *a) {
    clffn_moe_config mc = clffn_moe_config_default(a->d_model, a->d_ff, a->experts, a->top_k);
    mc.expert = bench_ffn_config(a); /* the dense FFN's */
    clffn_context *group[65] = {r->ctx};
    const int count = a->split > 1 ? (int)a->split : 1;
    for (int i = 1; i < count; ++i) {
        if (bench_open_context(a, &m->more[i - 1]) != 0) { return 1; }
        group[i] = m->more[i - 1];
    }
    clffn_status st = clffn_moe_create_split(group, count, &mc, &m->moe);
    if (st == CLFFN_SUCCESS) { st = clffn_moe_set_counts(m->moe, a->counts); }
    if (st == CLFFN_SUCCESS) { st = clffn_moe_set_grouping(m->moe, !a->ungrouped); }
    if (st != CLFFN_SUCCESS) { return bench_fail("creating the layer", st); }
    const size_t n = a->experts * a->d_model;
    float *router = malloc(n * sizeof *router);
    if (!router) { return bench_fail("the router", CLFFN_ERROR_OUT_OF_HOST_MEMORY); }
    uint64_t s = 12345;
    const double bound = 1.0 / sqrt((double)a->d_model);
    for (size_t i = 0; i < n; ++i) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        router[i] = (float)(bound * ((double)(s >> 11) / 4503599627370496.0 - 1.0));
    }
    st = clffn_moe_upload_router(m->moe, router, NULL);
    free(router);
    for (size_t e = 0; e < a->experts && st == CLFFN_SUCCESS; ++e) {
        st = bench_upload_weights(clffn_moe_expert(m->moe, e), a, &mc.expert, 100 + e);
    }
    if (st != CLFFN_SUCCESS) { return bench_fail("the layer's weights", st); }
    return 0;
}

/* The distinct experts r's first T tokens choose, and the most and fewest rows an expert gets:
 * a layer whose routing leaves experts far from the mean runs some of them past a crossover the
 * dense FFN of the mean's rows does not reach. */
static int count_chosen(moe_run *m, device_run *r, size_t T, const args *a) {
    const size_t n = T * a->d_model;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    int32_t *ch = malloc(T * a->top_k * sizeof *ch);
    size_t *seen = calloc(a->experts, sizeof *seen);
    clffn_status st = x && y && ch && seen ? CLFFN_SUCCESS : CLFFN_ERROR_OUT_OF_HOST_MEMORY;
    if (st == CLFFN_SUCCESS) {
        st = (clffn_status)clEnqueueReadBuffer(clffn_context_queue(r->ctx), r->x, CL_TRUE, 0,
                                               n * sizeof *x, x, 0, NULL, NULL);
    }
    if (st == CLFFN_SUCCESS) { st = clffn_moe_forward_host(m->moe, T, x, n, y, n, ch, NULL); }
    m->chosen = 0;
    for (size_t i = 0; st == CLFFN_SUCCESS && i < T * a->top_k; ++i) {
        m->chosen += !seen[ch[i]];
        seen[ch[i]]++;
    }
    m->most = 0, m->fewest = SIZE_MAX;
    for (size_t e = 0; st == CLFFN_SUCCESS && e < a->experts; ++e) {
        m->most = seen[e] > m->most ? seen[e] : m->most;
        m->fewest = seen[e] < m->fewest ? seen[e] : m->fewest;
    }
    free(x), free(y), free(ch), free(seen);
    return st == CLFFN_SUCCESS ? 0 : bench_fail("the routing", st);
}

static int moe_time(moe_run *m, device_run *r, size_t T, int reps, timing *t) {
    double *ts = malloc((size_t)reps * sizeof *ts);
    if (!ts) { return bench_fail("timing", CLFFN_ERROR_OUT_OF_HOST_MEMORY); }
    cl_command_queue q = clffn_context_queue(r->ctx);
    for (int i = -2; i < reps; ++i) { /* two warm-ups */
        const double t0 = tool_now_s();
        clffn_status st = clffn_moe_forward(m->moe, T, r->x, 0, r->y, 0, q);
        if (st == CLFFN_SUCCESS) { st = (clffn_status)tool_finish(q); }
        if (st != CLFFN_SUCCESS) {
            free(ts);
            return bench_fail("the layer's forward", st);
        }
        if (i >= 0) { ts[i] = tool_now_s() - t0; }
    }
    *t = bench_summarize(ts, reps);
    free(ts);
    return 0;
}

static void report(const args *a, const moe_run *m, size_t rows, const timing *tm, const timing *td,
                   double expert_bytes) {
    const size_t T = a->tokens, work = T * a->top_k;
    const double read = expert_bytes * (double)m->chosen + 4.0 * (double)(a->experts * a->d_model);
    const double ratio = ((double)work / tm->best_s) / ((double)rows / td->best_s);
    const double gflops = bench_flops(a, work) / tm->best_s * 1e-9;
    if (a->json) {
        printf("{\"experts\": %zu, \"top_k\": %zu, \"tokens\": %zu, \"d_model\": %zu, "
               "\"d_ff\": %zu, \"bias\": %s, \"weights_dtype\": \"%s\", \"best_s\": %.6g, "
               "\"median_s\": %.6g, "
               "\"gflops\": %.6g, \"experts_read\": %zu, \"weights_read_bytes\": %.0f, "
               "\"dense_rows\": %zu, \"dense_best_s\": %.6g, \"speed_vs_dense\": %.4g, "
               "\"rows_most\": %zu, \"rows_fewest\": %zu, "
               "\"contexts\": %zu, \"counts\": \"%s\", \"counts_kept\": %s, \"grouped\": %s}\n",
               a->experts, a->top_k, T, a->d_model, a->d_ff, a->no_bias ? "false" : "true",
               clffn_dtype_name(a->dtype), tm->best_s, tm->median_s, gflops, m->chosen, read, rows,
               td->best_s, ratio, m->most, m->fewest, a->split > 1 ? a->split : (size_t)1,
               tool_moe_counts_name(a->counts), clffn_moe_counts_kept(m->moe) ? "true" : "false",
               clffn_moe_experts_grouped(m->moe) ? "true" : "false");
        return;
    }
    printf("layer:         %zu experts, top-%zu, %zu tokens, %zu -> %zu, %s weights", a->experts,
           a->top_k, T, a->d_model, a->d_ff, clffn_dtype_name(a->dtype));
    if (a->no_bias) { printf(", no biases"); }
    if (a->split > 1) { printf(", split over %zu contexts", a->split); }
    /* the setting, and what the forward did: past one pass of clffn's kernels the counts are
     * read back whatever the setting */
    printf(", counts: %s (%s)%s\n", tool_moe_counts_name(a->counts),
           clffn_moe_counts_kept(m->moe) ? "kept on the device" : "read back",
           clffn_moe_experts_grouped(m->moe) ? ", experts grouped" : "");
    printf("forward:       best %.3f ms, median %.3f ms over %d reps: %.1f GFLOP/s\n",
           tm->best_s * 1e3, tm->median_s * 1e3, a->reps, gflops);
    printf("weights read:  %zu of %zu experts, %.0f bytes (router included): %.1f GB/s\n",
           m->chosen, a->experts, read, read / tm->best_s * 1e-9);
    printf("routing:       %zu to %zu rows an expert, %zu on average\n", m->fewest, m->most, rows);
    printf("dense FFN:     %zu row(s) in %.3f ms; the layer's %zu rows at %.2fx its rows/s\n", rows,
           td->best_s * 1e3, work, ratio);
}

int bench_moe(const args *a) {
    device_run r;
    moe_run m = {0};
    const size_t rows = (a->tokens * a->top_k + a->experts - 1) / a->experts;
    int rc = device_setup(&r, a, a->tokens, NULL);
    if (rc == 0) { rc = moe_setup(&m, &r, a); }
    if (rc == 0) { rc = count_chosen(&m, &r, a->tokens, a); }
    timing tm = {0, 0}, td = {0, 0};
    if (rc == 0) { rc = moe_time(&m, &r, a->tokens, a->reps, &tm); }
    if (rc == 0) { rc = device_time(&r, rows, a->reps, &td, NULL); }
    if (rc == 0) {
        report(a, &m, rows, &tm, &td, (double)clffn_ffn_weight_bytes(clffn_moe_expert(m.moe, 0)));
    }
    clffn_moe_destroy(m.moe);
    for (size_t i = 0; i < sizeof m.more / sizeof m.more[0]; ++i) {
        clffn_context_destroy(m.more[i]);
    }
    device_teardown(&r);
    return rc;
}
