/* A mixture-of-experts layer through ggml's CPU backend, built as llama.cpp builds it
 * (llm_graph_context::build_moe_ffn for Mixtral): router logits, softmax, the top k, their
 * probabilities renormalised, the experts as ggml_mul_mat_id over stacked 3-D weights
 * (gate and up [D, F, E], down [F, D, E] in ggml's ne order), SwiGLU, the weighted sum of the k
 * outputs. The router stays f32 as in llama.cpp's files; the experts are in TYPE, in the buffer
 * llama.cpp would give them (CPU_REPACK for q4_0 on x86 with AVX2, else the CPU's). Prints the
 * best and median of the timed runs after two warm-ups. Built by scripts/peers/ggml-bench.sh.
 *
 *   ggml_moe TYPE [tokens] [d_model] [d_ff] [experts] [k] [threads] [reps] */
#define _POSIX_C_SOURCE 200809L
#include "ggml_peer.h"

#include <stdio.h>

/* The layer's graph on x [D, T]: y [D, T]. */
static struct ggml_tensor *moe_graph(struct ggml_context *g, struct ggml_tensor *x,
                                     struct ggml_tensor *const w[4], int64_t k) {
    const int64_t D = x->ne[0], T = x->ne[1], E = w[0]->ne[1];
    struct ggml_tensor *probs = ggml_soft_max(g, ggml_mul_mat(g, w[0], x)); /* [E, T] */
    struct ggml_tensor *sel = ggml_argsort_top_k(g, probs, (int)k);         /* [k, T] */
    struct ggml_tensor *wt = ggml_get_rows(g, ggml_reshape_3d(g, probs, 1, E, T), sel);
    wt = ggml_reshape_2d(g, wt, k, T);
    wt = ggml_div(g, wt, ggml_sum_rows(g, wt)); /* renormalised, as Mixtral */
    wt = ggml_reshape_3d(g, wt, 1, k, T);
    struct ggml_tensor *xr = ggml_reshape_3d(g, x, D, 1, T);
    struct ggml_tensor *up = ggml_mul_mat_id(g, w[2], xr, sel);   /* [F, k, T] */
    struct ggml_tensor *gate = ggml_mul_mat_id(g, w[1], xr, sel); /* [F, k, T] */
    struct ggml_tensor *out = ggml_mul_mat_id(g, w[3], ggml_mul(g, ggml_silu(g, gate), up), sel);
    out = ggml_mul(g, out, wt); /* [D, k, T] */
    struct ggml_tensor *y = ggml_view_2d(g, out, D, T, out->nb[2], 0);
    for (int64_t j = 1; j < k; ++j) {
        y = ggml_add(g, y, ggml_view_2d(g, out, D, T, out->nb[2], (size_t)j * out->nb[1]));
    }
    return y;
}

int main(int argc, char **argv) {
    static const struct {
        const char *name;
        enum ggml_type type;
    } types[] = {{"f32", GGML_TYPE_F32},
                 {"f16", GGML_TYPE_F16},
                 {"bf16", GGML_TYPE_BF16},
                 {"q8_0", GGML_TYPE_Q8_0},
                 {"q4_0", GGML_TYPE_Q4_0}};
    enum ggml_type type = GGML_TYPE_COUNT;
    for (size_t i = 0; argc > 1 && i < sizeof types / sizeof types[0]; ++i) {
        if (!strcmp(argv[1], types[i].name)) { type = types[i].type; }
    }
    if (type == GGML_TYPE_COUNT) {
        fprintf(stderr, "usage: ggml_moe f32|f16|bf16|q8_0|q4_0 [T] [D] [F] [E] [k] [threads] "
                        "[reps]\n");
        return 2;
    }
    const int64_t T = argc > 2 ? atoll(argv[2]) : 1, D = argc > 3 ? atoll(argv[3]) : 4096;
    const int64_t F = argc > 4 ? atoll(argv[4]) : 14336, E = argc > 5 ? atoll(argv[5]) : 8;
    const int64_t k = argc > 6 ? atoll(argv[6]) : 2;
    const int threads = argc > 7 ? atoi(argv[7]) : 2, reps = argc > 8 ? atoi(argv[8]) : 10;
    ggml_backend_t cpu = ggml_backend_cpu_init();
    if (!cpu) { return 1; }
    ggml_backend_cpu_set_n_threads(cpu, threads);

    /* the router (f32, the CPU buffer) and the stacked experts (TYPE, llama.cpp's buffer) */
    struct ggml_init_params rp = {2 * ggml_tensor_overhead(), NULL, true};
    struct ggml_init_params ep = {4 * ggml_tensor_overhead(), NULL, true};
    struct ggml_context *rctx = ggml_init(rp), *ectx = ggml_init(ep);
    struct ggml_tensor *w[4] = {ggml_new_tensor_2d(rctx, GGML_TYPE_F32, D, E),
                                ggml_new_tensor_3d(ectx, type, D, F, E),
                                ggml_new_tensor_3d(ectx, type, D, F, E),
                                ggml_new_tensor_3d(ectx, type, F, D, E)};
    struct ggml_tensor *x = ggml_new_tensor_2d(rctx, GGML_TYPE_F32, D, T);
    ggml_backend_buffer_t rbuf = ggml_backend_alloc_ctx_tensors(rctx, cpu);
    ggml_backend_buffer_type_t buft = weight_buft(cpu, type, F < D ? F : D);
    ggml_backend_buffer_t ebuf = ggml_backend_alloc_ctx_tensors_from_buft(ectx, buft);
    if (!rbuf || !ebuf) { return 1; }
    for (int i = 0; i < 4; ++i) {
        if (fill_weight(w[i], 1 + (uint64_t)i) != 0) { return 1; }
    }
    float *xs = malloc((size_t)(D * T) * sizeof *xs);
    for (int64_t i = 0; i < D * T; ++i) { xs[i] = sinf(0.01f * (float)i); }
    ggml_backend_tensor_set(x, xs, 0, ggml_nbytes(x));

    struct ggml_init_params gp = {64 * ggml_tensor_overhead() + ggml_graph_overhead(), NULL,
                                  true};
    struct ggml_context *gctx = ggml_init(gp);
    struct ggml_tensor *y = moe_graph(gctx, x, w, k);
    ggml_set_output(y);
    struct ggml_cgraph *gf = ggml_new_graph(gctx);
    ggml_build_forward_expand(gf, y);
    ggml_gallocr_t galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(cpu));
    if (!ggml_gallocr_alloc_graph(galloc, gf)) { return 1; }
    double *ts = malloc((size_t)reps * sizeof *ts);
    for (int r = -2; r < reps; ++r) {
        const double t0 = now_s();
        if (ggml_backend_graph_compute(cpu, gf) != GGML_STATUS_SUCCESS) { return 1; }
        if (r >= 0) { ts[r] = now_s() - t0; }
    }
    qsort(ts, (size_t)reps, sizeof *ts, cmp);
    float y0;
    ggml_backend_tensor_get(y, &y0, 0, sizeof y0);
    printf("%s moe %lld tokens %lld -> %lld, %lld experts, top-%lld: best %.3f ms, median %.3f "
           "ms, experts in %s, %d threads, built for AVX2 %d F16C %d AVX-512 %d VNNI %d BF16 %d, "
           "y[0] %g\n",
           argv[1], (long long)T, (long long)D, (long long)F, (long long)E, (long long)k,
           ts[0] * 1e3, ts[reps / 2] * 1e3, ggml_backend_buft_name(buft), threads,
           ggml_cpu_has_avx2(), ggml_cpu_has_f16c(), ggml_cpu_has_avx512(),
           ggml_cpu_has_avx512_vnni(), ggml_cpu_has_avx512_bf16(), (double)y0);
    free(ts);
    free(xs);
    ggml_gallocr_free(galloc);
    ggml_backend_buffer_free(ebuf);
    ggml_backend_buffer_free(rbuf);
    ggml_free(gctx);
    ggml_free(ectx);
    ggml_free(rctx);
    ggml_backend_free(cpu);
    return 0;
}
