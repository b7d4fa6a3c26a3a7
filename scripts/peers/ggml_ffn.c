/* The FFN of clffn-bench's decoding shape through ggml's CPU backend, as llama.cpp runs a
 * layer's feed-forward: y = W_down · (silu(W_gate · x) ⊙ (W_up · x)), weights in one type (f32,
 * f16, bf16, q8_0, q4_0; ggml converts x to the type's dot-product partner, q8_0 for the
 * quantized ones), one graph computed by the CPU backend on N threads.
 *
 * The weights go where llama.cpp puts them by default: into the CPU backend's repacking buffer
 * (CPU_REPACK) when it takes the type on this machine — on x86 with AVX2, q4_0 with a row count
 * that is a multiple of 8, repacked into interleaved blocks (ggml-cpu/repack.cpp) — else into a
 * plain CPU buffer. Prints the best and median of the timed runs (after two warm-ups) in ms, the
 * buffer the weights went into, and the instruction sets ggml was built for. Built against a
 * ggml checkout by scripts/peers/ggml-bench.sh.
 *
 *   ggml_ffn TYPE [tokens] [d_model] [d_ff] [threads] [reps] */
#define _POSIX_C_SOURCE 200809L
#include "ggml_peer.h"

#include <stdio.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: ggml_ffn f32|f16|bf16|q8_0|q4_0 [T] [D] [F] [threads] [reps]\n");
        return 2;
    }
    static const struct {
        const char *name;
        enum ggml_type type;
    } types[] = {{"f32", GGML_TYPE_F32},
                 {"f16", GGML_TYPE_F16},
                 {"bf16", GGML_TYPE_BF16},
                 {"q8_0", GGML_TYPE_Q8_0},
                 {"q4_0", GGML_TYPE_Q4_0}};
    enum ggml_type type = GGML_TYPE_COUNT;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; ++i) {
        if (!strcmp(argv[1], types[i].name)) { type = types[i].type; }
    }
    if (type == GGML_TYPE_COUNT) { return 2; }
    const int64_t T = argc > 2 ? atoll(argv[2]) : 1, D = argc > 3 ? atoll(argv[3]) : 4096;
    const int64_t F = argc > 4 ? atoll(argv[4]) : 11008;
    const int threads = argc > 5 ? atoi(argv[5]) : 2, reps = argc > 6 ? atoi(argv[6]) : 20;
    ggml_backend_t cpu = ggml_backend_cpu_init();
    if (!cpu) { return 1; }
    ggml_backend_cpu_set_n_threads(cpu, threads);

    /* the weights, in the buffer llama.cpp would choose */
    struct ggml_init_params wp = {4 * ggml_tensor_overhead(), NULL, true};
    struct ggml_context *wctx = ggml_init(wp);
    struct ggml_tensor *wg = ggml_new_tensor_2d(wctx, type, D, F);
    struct ggml_tensor *wu = ggml_new_tensor_2d(wctx, type, D, F);
    struct ggml_tensor *wd = ggml_new_tensor_2d(wctx, type, F, D);
    ggml_backend_buffer_type_t buft = weight_buft(cpu, type, F < D ? F : D);
    ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, buft);
    if (!wbuf || fill_weight(wg, 1) || fill_weight(wu, 2) || fill_weight(wd, 3)) { return 1; }

    /* the graph */
    struct ggml_init_params gp = {16 * ggml_tensor_overhead() + ggml_graph_overhead(), NULL,
                                  true};
    struct ggml_context *gctx = ggml_init(gp);
    /* x in a buffer of its own: the graph's allocator reuses an input's memory after its last
     * use, and every timed run must see the same x */
    struct ggml_init_params xp = {ggml_tensor_overhead(), NULL, true};
    struct ggml_context *xctx = ggml_init(xp);
    struct ggml_tensor *x = ggml_new_tensor_2d(xctx, GGML_TYPE_F32, D, T);
    ggml_backend_buffer_t xbuf = ggml_backend_alloc_ctx_tensors(xctx, cpu);
    if (!xbuf) { return 1; }
    struct ggml_tensor *h =
        ggml_mul(gctx, ggml_silu(gctx, ggml_mul_mat(gctx, wg, x)), ggml_mul_mat(gctx, wu, x));
    struct ggml_tensor *y = ggml_mul_mat(gctx, wd, h);
    ggml_set_output(y);
    struct ggml_cgraph *gf = ggml_new_graph(gctx);
    ggml_build_forward_expand(gf, y);
    ggml_gallocr_t galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(cpu));
    if (!ggml_gallocr_alloc_graph(galloc, gf)) { return 1; }
    float *xs = malloc((size_t)(D * T) * sizeof *xs);
    for (int64_t i = 0; i < D * T; ++i) { xs[i] = sinf(0.01f * (float)i); }
    ggml_backend_tensor_set(x, xs, 0, ggml_nbytes(x));

    double *ts = malloc((size_t)reps * sizeof *ts);
    for (int r = -2; r < reps; ++r) {
        const double t0 = now_s();
        if (ggml_backend_graph_compute(cpu, gf) != GGML_STATUS_SUCCESS) { return 1; }
        if (r >= 0) { ts[r] = now_s() - t0; }
    }
    qsort(ts, (size_t)reps, sizeof *ts, cmp);
    float y0;
    ggml_backend_tensor_get(y, &y0, 0, sizeof y0);
    const size_t wbytes = ggml_nbytes(wg) + ggml_nbytes(wu) + ggml_nbytes(wd);
    /* what ggml's CPU backend was built to use: the kernels it ran follow from these */
    printf("%s %lld tokens %lld -> %lld: best %.3f ms, median %.3f ms, weights %zu bytes in %s, "
           "%d threads, built for AVX2 %d F16C %d AVX-512 %d VNNI %d BF16 %d, y[0] %g\n",
           argv[1], (long long)T, (long long)D, (long long)F, ts[0] * 1e3, ts[reps / 2] * 1e3,
           wbytes, ggml_backend_buft_name(buft), threads, ggml_cpu_has_avx2(), ggml_cpu_has_f16c(),
           ggml_cpu_has_avx512(), ggml_cpu_has_avx512_vnni(), ggml_cpu_has_avx512_bf16(),
           (double)y0);
    free(ts);
    free(xs);
    ggml_gallocr_free(galloc);
    ggml_backend_buffer_free(wbuf);
    ggml_backend_buffer_free(xbuf);
    ggml_free(xctx);
    ggml_free(gctx);
    ggml_free(wctx);
    ggml_backend_free(cpu);
    return 0;
}
