/* clffn-run with weights in their stored types: GGUF files (written by the tests' own writer)
 * of every type clffn keeps, gated and plain, with and without biases; --weights-dtype turning
 * a checkpoint into each type on the host; gradients of the f32 tensors only; the refusals. */
#include "clffn_io.h"
#include "common.h"
#include "gguf_writer.h"
#include "tools_common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { D = 64, F = 96, T = 5 };

/* A GGUF layer: the f32 values it was made from, its tensors' bytes in `type`, and what the
 * device will hold as f32 (the dequantized values) for the reference. */
typedef struct gguf_layer {
    float *w[3], *r[3], b1[F], b2[D]; /* gate, up, down */
    void *bytes[3];
    size_t nbytes;
} gguf_layer;

static void gguf_layer_make(gguf_layer *L, clffn_dtype type) {
    for (int i = 0; i < 3; ++i) {
        L->w[i] = exact_values(D * F, 0.5f, 40 + (uint64_t)i);
        L->r[i] = malloc(D * F * sizeof(float));
        ASSERT_OK(clffn_dtype_bytes(type, D * F, &L->nbytes));
        L->bytes[i] = malloc(L->nbytes);
        ASSERT_OK(clffn_convert_weights(type, L->w[i], D * F, L->bytes[i], L->nbytes));
        ASSERT_OK(clffn_convert_to_f32(type, L->bytes[i], L->nbytes, D * F, L->r[i], D * F));
    }
    fill_uniform(L->b1, F, -0.5f, 0.5f, 50);
    fill_uniform(L->b2, D, -0.5f, 0.5f, 51);
}

static void gguf_layer_free(gguf_layer *L) {
    for (int i = 0; i < 3; ++i) { free(L->w[i]), free(L->r[i]), free(L->bytes[i]); }
}

static uint32_t ggml_type(clffn_dtype t) {
    static const uint32_t g[CLFFN_DTYPE_COUNT_] = {CLFFN_GGML_F32, CLFFN_GGML_F16, CLFFN_GGML_BF16,
                                                   CLFFN_GGML_Q8_0, CLFFN_GGML_Q4_0};
    return g[t];
}

/* Layer 1 of a file (layer 0 has the same names, other bytes) into path: gate, up, down in
 * type, with the biases up and down when asked, gate only when gated. */
static void write_gguf(const char *path, const gguf_layer *L, clffn_dtype type, int gated,
                       int biases) {
    const uint32_t g = ggml_type(type);
    gw_tensor ts[10];
    size_t n = 0;
    for (int layer = 0; layer < 2; ++layer) {
        static const char *const names[2][5] = {
            {"blk.0.ffn_gate.weight", "blk.0.ffn_up.weight", "blk.0.ffn_down.weight",
             "blk.0.ffn_up.bias", "blk.0.ffn_down.bias"},
            {"blk.1.ffn_gate.weight", "blk.1.ffn_up.weight", "blk.1.ffn_down.weight",
             "blk.1.ffn_up.bias", "blk.1.ffn_down.bias"}};
        const void *src[3] = {layer ? L->bytes[0] : L->bytes[2], layer ? L->bytes[1] : L->bytes[0],
                              layer ? L->bytes[2] : L->bytes[1]};
        if (gated) { ts[n++] = (gw_tensor){names[layer][0], g, 2, {D, F}, src[0], L->nbytes, 0}; }
        ts[n++] = (gw_tensor){names[layer][1], g, 2, {D, F}, src[1], L->nbytes, 0};
        ts[n++] = (gw_tensor){names[layer][2], g, 2, {F, D}, src[2], L->nbytes, 0};
        if (biases) {
            ts[n++] = (gw_tensor){names[layer][3], CLFFN_GGML_F32, 1, {F}, L->b1, F * 4, 0};
            ts[n++] = (gw_tensor){names[layer][4], CLFFN_GGML_F32, 1, {D}, L->b2, D * 4, 0};
        }
    }
    const gw_kv kvs[2] = {{"general.architecture", 8, 0, "llama"},
                          {"llama.block_count", 4, 2, NULL}};
    size_t len;
    uint8_t *img = gw_image(3, 0, kvs, 2, ts, n, &len);
    cr_assert_eq(gw_write(path, img, len), 0);
    free(img);
}

/* The layer as m.gguf and T tokens of uniform x (seed) as x.npy under dir: their paths into w
 * and x, the values into xv. */
static void write_case(const gguf_layer *L, clffn_dtype type, int gated, int biases, uint64_t seed,
                       char w[128], char x[128], float xv[T * D]) {
    char err[CLFFN_IO_ERR];
    snprintf(w, 128, "%s/m.gguf", dir), snprintf(x, 128, "%s/x.npy", dir);
    write_gguf(w, L, type, gated, biases);
    fill_uniform(xv, T * D, -1, 1, seed);
    const uint64_t shape[2] = {T, D};
    cr_assert_eq(clffn_npy_save(x, xv, 2, shape, err), 0, "%s", err);
}

/* clffn-run --layer 1 on the file with --verify --verbose and a backward: exit 0, the output
 * against the reference on the dequantized weights, the gradient file's tensors counted. */
static void run_gguf(const gguf_layer *L, clffn_dtype type, int gated, int biases,
                     const char *extra, size_t want_grads, const char *want_line) {
    char w[128], x[128], y[128], g[128], cmd[1024], out[8192], err[CLFFN_IO_ERR];
    float xv[T * D];
    write_case(L, type, gated, biases, 60, w, x, xv);
    snprintf(y, sizeof y, "%s/y.npy", dir), snprintf(g, sizeof g, "%s/g.safetensors", dir);
    snprintf(cmd, sizeof cmd,
             "'%s' --weights '%s' --input '%s' --output '%s' --layer 1 --verify --verbose "
             "--grad-output '%s' --grads-out '%s' %s",
             CLFFN_RUN_PATH, w, x, y, x, g, extra);
    cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "PASS") && strstr(out, want_line), "want '%s':\n%s", want_line, out);
    clffn_config c = clffn_config_default(D, F);
    c.gated = gated, c.activation = gated ? CLFFN_ACT_SILU : CLFFN_ACT_GELU_TANH;
    c.bias1 = c.bias2 = biases, c.bias_gate = 0;
    const clffn_host_weights hw = {
        gated ? L->r[0] : L->r[1], biases ? L->b1 : NULL, gated ? L->r[1] : NULL, NULL, L->r[2],
        biases ? L->b2 : NULL};
    double ref[T * D];
    ASSERT_OK(clffn_reference_forward(&c, CLFFN_LAYOUT_OUT_IN, &hw, T, xv, 0, 0, 0, ref, NULL));
    clffn_npy got;
    cr_assert_eq(clffn_npy_load(y, &got, err), 0, "%s", err);
    assert_close(got.data, ref, T * D, act_rtol(c.activation), "GGUF layer");
    clffn_npy_free(&got);
    clffn_st_file gf;
    cr_assert_eq(clffn_st_open(g, &gf, err), 0, "%s", err);
    cr_assert_eq(gf.count, want_grads, "%s", out);
    cr_assert_not_null(clffn_st_find(&gf, "input"));
    clffn_st_close(&gf);
}

Test(clffn_run_weights, gguf_gated_in_every_type, .timeout = 240) {
    for (int t = 0; t < CLFFN_DTYPE_COUNT_; ++t) {
        make_dir();
        gguf_layer L;
        gguf_layer_make(&L, (clffn_dtype)t);
        char line[96];
        const size_t bytes = 3 * L.nbytes; /* what the device holds: the file's bytes */
        snprintf(line, sizeof line, "weights on device: %zu bytes (%s)", bytes,
                 clffn_dtype_name((clffn_dtype)t));
        /* f32 weights have gradients: all three and input; the others input alone */
        run_gguf(&L, (clffn_dtype)t, 1, 0, "", t == CLFFN_DTYPE_F32 ? 4 : 1, line);
        gguf_layer_free(&L);
        remove_dir();
    }
}

Test(clffn_run_weights, gguf_plain_with_biases, .timeout = 120) {
    make_dir();
    gguf_layer L;
    gguf_layer_make(&L, CLFFN_DTYPE_Q4_0);
    /* kept as stored: the biases' gradients and input, the matrices named as skipped */
    run_gguf(&L, CLFFN_DTYPE_Q4_0, 0, 1, "", 3, "gradients skipped: blk.1.ffn_up.weight");
    /* as f32: every gradient, under the file's names */
    run_gguf(&L, CLFFN_DTYPE_Q4_0, 0, 1, "--weights-dtype f32", 5, "(f32)");
    gguf_layer_free(&L);
    remove_dir();
}

static void expect(const char *args, int want_rc, const char *needle) {
    char cmd[2048], out[4096];
    snprintf(cmd, sizeof cmd, "'%s' %s", CLFFN_RUN_PATH, args);
    const int rc = run(cmd, out, sizeof out);
    cr_assert_eq(rc, want_rc, "%s: exit %d, want %d:\n%s", args, rc, want_rc, out);
    cr_assert(strstr(out, needle) != NULL, "%s: output lacks '%s':\n%s", args, needle, out);
}

Test(clffn_run_weights, gguf_refusals) {
    make_dir();
    gguf_layer L;
    gguf_layer_make(&L, CLFFN_DTYPE_Q8_0);
    char w[128], x[128], args[1024], err[CLFFN_IO_ERR];
    snprintf(w, sizeof w, "%s/m.gguf", dir), snprintf(x, sizeof x, "%s/x.npy", dir);
    write_gguf(w, &L, CLFFN_DTYPE_Q8_0, 1, 0);
    float xv[D] = {0};
    const uint64_t shape[2] = {1, D};
    cr_assert_eq(clffn_npy_save(x, xv, 2, shape, err), 0);
    snprintf(args, sizeof args, "--weights '%s' --input '%s' --output '%s/y.npy' --preset llama", w,
             x, dir);
    expect(args, 2, "drop --preset");
    snprintf(args, sizeof args, "--weights '%s' --input '%s' --output '%s/y.npy' --layer 5", w, x,
             dir);
    expect(args, 2, "no tensor 'blk.5.ffn_up.weight' (GGUF, layer 5)");
    snprintf(args, sizeof args,
             "--weights '%s' --input '%s' --output '%s/y.npy' --quantized-inputs --verify", w, x,
             dir);
    expect(args, 2, "--quantized-inputs rounds the inputs first");
    /* a type clffn does not read, named */
    uint8_t k[144 * 24] = {0};
    const gw_tensor qk[3] = {
        {"blk.0.ffn_gate.weight", 12, 2, {256, 12}, k, sizeof k, 0},
        {"blk.0.ffn_up.weight", 12, 2, {256, 12}, k, sizeof k, 0},
        {"blk.0.ffn_down.weight", 12, 2, {12, 256}, k, 12 * 256 / 256 * 144, 0}};
    size_t len;
    uint8_t *img = gw_image(3, 0, NULL, 0, qk, 2, &len);
    snprintf(w, sizeof w, "%s/k.gguf", dir);
    cr_assert_eq(gw_write(w, img, len), 0);
    free(img);
    snprintf(args, sizeof args, "--weights '%s' --input '%s' --output '%s/y.npy'", w, x, dir);
    expect(args, 2, "no tensor 'blk.0.ffn_down.weight'");
    /* a damaged file: one line naming what is wrong, exit 2 */
    snprintf(args, sizeof args, "head -c 200 '%s/m.gguf' > '%s/cut.gguf'", dir, dir);
    cr_assert_eq(system(args), 0);
    snprintf(args, sizeof args, "--weights '%s/cut.gguf' --input '%s' --output '%s/y.npy'", dir, x,
             dir);
    expect(args, 2, "cut.gguf: ");
    gguf_layer_free(&L);
    remove_dir();
}

/* --quantized-inputs: the tool's output is the library's with a context that quantizes the
 * inputs (test_compressed.c checks those against the double reference), and not the plain
 * reference's: the rounding moves it past the tolerance. */
Test(clffn_run_weights, gguf_quantized_inputs, .timeout = 120) {
    static const clffn_dtype types[] = {CLFFN_DTYPE_Q8_0, CLFFN_DTYPE_Q4_0, CLFFN_DTYPE_BF16};
    for (size_t ti = 0; ti < 3; ++ti) {
        const clffn_dtype t = types[ti];
        const int bf16 = t == CLFFN_DTYPE_BF16; /* its inputs rounded to bf16, not q8_0 */
        make_dir();
        gguf_layer L;
        gguf_layer_make(&L, t);
        char w[128], x[128], y[128], cmd[1024], out[4096], err[CLFFN_IO_ERR];
        float xv[T * D], yl[T * D];
        write_case(&L, t, 1, 0, 61, w, x, xv);
        snprintf(y, sizeof y, "%s/y.npy", dir);
        snprintf(cmd, sizeof cmd,
                 "'%s' --weights '%s' --input '%s' --output '%s' --layer 1 --quantized-inputs "
                 "--verbose",
                 CLFFN_RUN_PATH, w, x, y);
        cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
        cr_assert(strstr(out, bf16 ? "inputs: rounded to bf16" : "inputs: rounded to q8_0") != NULL,
                  "%s", out);
        if (ti == 0) { /* kept in f16, the choice has nothing to round: said so */
            snprintf(cmd, sizeof cmd,
                     "'%s' --weights '%s' --input '%s' --output '%s/f16.npy' --layer 1 "
                     "--quantized-inputs --weights-dtype f16",
                     CLFFN_RUN_PATH, w, x, dir);
            cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
            cr_assert(strstr(out, "these weights are f16, so it changes nothing") != NULL, "%s",
                      out);
        }
        clffn_config c = clffn_config_default(D, F);
        c.gated = 1, c.activation = CLFFN_ACT_SILU;
        c.bias1 = c.bias2 = c.bias_gate = 0;
        clffn_context *ctx = test_context();
        ASSERT_OK(clffn_context_set_quantized_inputs(ctx, 1));
        clffn_ffn *ffn = NULL;
        ASSERT_OK(clffn_ffn_create(ctx, &c, &ffn));
        const clffn_typed_weights tw = {t, L.bytes[0], L.bytes[1], L.bytes[2], NULL, NULL, NULL};
        ASSERT_OK(clffn_ffn_upload_weights_typed(ffn, CLFFN_LAYOUT_OUT_IN, &tw));
        ASSERT_OK(clffn_forward_host(ffn, T, xv, T * D, yl, T * D));
        const clffn_host_weights hw = {L.r[0], NULL, L.r[1], NULL, L.r[2], NULL};
        double lib[T * D], ref[T * D];
        ASSERT_OK(clffn_reference_forward(&c, CLFFN_LAYOUT_OUT_IN, &hw, T, xv, 0, 0, 0, ref, NULL));
        for (size_t i = 0; i < T * D; ++i) { lib[i] = yl[i]; }
        clffn_npy got;
        cr_assert_eq(clffn_npy_load(y, &got, err), 0, "%s", err);
        assert_close(got.data, lib, T * D, TOL_RTOL, "clffn-run --quantized-inputs");
        clffn_npy_free(&got);
        assert_rounding_shows(lib, ref, T * D, bf16 ? 10 : 100, clffn_dtype_name(t));
        clffn_ffn_destroy(ffn);
        clffn_context_destroy(ctx);
        gguf_layer_free(&L);
        remove_dir();
    }
}

/* clffn-bench --quantized-inputs: the choice in the text and the JSON, off without it. */
Test(clffn_bench_weights, quantized_inputs_reported, .timeout = 120) {
    char cmd[512], out[16384];
    static const char *const flags[2] = {"", "--quantized-inputs"};
    for (int on = 0; on < 2; ++on) {
        snprintf(cmd, sizeof cmd,
                 "'%s' --json --tokens 2 --d-model 64 --d-ff 96 --reps 2 --weights-dtype q4_0 %s",
                 CLFFN_BENCH_PATH, flags[on]);
        cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
        cr_assert(strstr(out, on ? "\"quantized_inputs\":\ttrue" : "\"quantized_inputs\":\tfalse"),
                  "%s", out);
        snprintf(cmd, sizeof cmd, "'%s' --tokens 2 --d-model 64 --d-ff 96 --reps 2 %s",
                 CLFFN_BENCH_PATH, flags[on]);
        cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
        cr_assert(!strstr(out, "inputs:        rounded to q8_0") == !on, "%s", out);
    }
}

/* A K-quant layer is refused by its type's name. */
Test(clffn_run_weights, unread_types_are_named) {
    make_dir();
    static uint8_t k[144 * 2];
    const gw_tensor qk[3] = {{"blk.0.ffn_up.weight", 12, 2, {256, 2}, k, sizeof k, 0},
                             {"blk.0.ffn_down.weight", CLFFN_GGML_F32, 2, {2, 256}, k, 0, 0},
                             {"blk.0.ffn_gate.weight", 12, 2, {256, 2}, k, sizeof k, 0}};
    float down[512] = {0};
    gw_tensor ts[3] = {qk[0], qk[1], qk[2]};
    ts[1].data = down, ts[1].bytes = sizeof down;
    size_t len;
    uint8_t *img = gw_image(3, 0, NULL, 0, ts, 3, &len);
    char w[128], x[128], args[1024], err[CLFFN_IO_ERR];
    snprintf(w, sizeof w, "%s/k.gguf", dir), snprintf(x, sizeof x, "%s/x.npy", dir);
    cr_assert_eq(gw_write(w, img, len), 0);
    free(img);
    float xv[256] = {0};
    const uint64_t shape[2] = {1, 256};
    cr_assert_eq(clffn_npy_save(x, xv, 2, shape, err), 0);
    snprintf(args, sizeof args, "--weights '%s' --input '%s' --output '%s/y.npy'", w, x, dir);
    expect(args, 2, "is Q4_K, which clffn does not read");
    remove_dir();
}

/* --weights-dtype turns an f32 checkpoint into each type on the host, [in, out] ones (GPT-2's
 * Conv1D) transposed for the quantized types; a quantized type needs whole blocks. */
Test(clffn_run_weights, weights_dtype_conversions, .timeout = 240) {
    make_dir();
    float *w1 = exact_values(D * F, 0.5f, 70), *w2 = exact_values(D * F, 0.5f, 71);
    char m[128], m2[128], x[128], args[1024], err[CLFFN_IO_ERR];
    snprintf(m, sizeof m, "%s/m.safetensors", dir), snprintf(x, sizeof x, "%s/x.npy", dir);
    snprintf(m2, sizeof m2, "%s/gpt2.safetensors", dir);
    const tensor ts[2] = {{"w_1.weight", "F32", 2, {F, D}, w1},
                          {"w_2.weight", "F32", 2, {D, F}, w2}};
    write_checkpoint(m, ts, 2);
    const tensor g2[2] = {{"h.0.mlp.c_fc.weight", "F32", 2, {D, F}, w1},
                          {"h.0.mlp.c_proj.weight", "F32", 2, {F, D}, w2}};
    write_checkpoint(m2, g2, 2);
    float xv[T * D];
    fill_uniform(xv, T * D, -1, 1, 72);
    const uint64_t shape[2] = {T, D};
    cr_assert_eq(clffn_npy_save(x, xv, 2, shape, err), 0);
    for (int t = 0; t < CLFFN_DTYPE_COUNT_; ++t) {
        const char *name = clffn_dtype_name((clffn_dtype)t);
        char want[64];
        snprintf(want, sizeof want, "(%s)", name);
        snprintf(args, sizeof args,
                 "--weights '%s' --input '%s' --output '%s/y.npy' --verify --verbose "
                 "--weights-dtype %s",
                 m, x, dir, name);
        expect(args, 0, want);
        snprintf(args, sizeof args,
                 "--weights '%s' --input '%s' --output '%s/y.npy' --verify --verbose --preset "
                 "gpt2 --weights-dtype=%s",
                 m2, x, dir, name);
        expect(args, 0, want);
    }
    const tensor odd[2] = {{"w_1.weight", "F32", 2, {F, 12}, w1},
                           {"w_2.weight", "F32", 2, {12, F}, w2}};
    write_checkpoint(m, odd, 2);
    const uint64_t s12[2] = {1, 12};
    cr_assert_eq(clffn_npy_save(x, xv, 2, s12, err), 0);
    snprintf(args, sizeof args,
             "--weights '%s' --input '%s' --output '%s/y.npy' --weights-dtype q8_0", m, x, dir);
    expect(args, 2, "q8_0 weights need d_model (12)");
    snprintf(args, sizeof args,
             "--weights '%s' --input '%s' --output '%s/y.npy' --weights-dtype q5_k", m, x, dir);
    expect(args, 2, "--weights-dtype takes stored");
    free(w1), free(w2);
    remove_dir();
}
