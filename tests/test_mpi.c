/* clffn-run --tensor-parallel under mpirun (2 and 3 ranks on the test device, oversubscribed):
 * the split run's output and gradient file equal the single process's, on a llama-preset
 * (gated SiLU, no biases, [out, in]) and a gpt2-preset checkpoint (gelu_tanh, biases, [in, out],
 * here with training-mode dropout and the residual, so the masks must agree too); and one rank
 * given a damaged checkpoint makes every rank fail with one message and no output file.
 *
 * The single process is the reference here: it is itself checked against the double reference
 * (clffn-run --verify) in the same test. Built when CMake finds MPI. */
#include "clffn_io.h"
#include "common.h"
#include "gguf_writer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[64];
static char out[16384];

static int run(const char *cmd) {
    char full[8192];
    snprintf(full, sizeof full, "cd %s && %s 2>&1", dir, cmd);
    FILE *p = popen(full, "r");
    cr_assert_not_null(p);
    const size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    const int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void setup(void) {
    snprintf(dir, sizeof dir, "/tmp/clffn-mpi-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    /* CI runs as root; Open MPI refuses that unless told */
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 1);
}

static void teardown(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

static void fill(float *a, size_t n, float scale, uint64_t seed) {
    fill_uniform(a, n, -scale, scale, seed);
}

typedef struct named {
    char name[96];
    size_t rank;
    uint64_t shape[2];
} named;

/* Writes a checkpoint of the given tensors (random values) and x.npy / dy.npy [3, 5, D]. */
/* x.npy and dy.npy of [3, 5, D], D at most 64. */
static void write_inputs(uint64_t D) {
    char path[128], err[CLFFN_IO_ERR];
    const uint64_t shape[3] = {3, 5, D};
    float x[15 * 64];
    cr_assert(D <= 64);
    fill(x, 15 * D, 1.0f, 7);
    snprintf(path, sizeof path, "%s/x.npy", dir);
    cr_assert_eq(clffn_npy_save(path, x, 3, shape, err), 0, "%s", err);
    fill(x, 15 * D, 1.0f, 8);
    snprintf(path, sizeof path, "%s/dy.npy", dir);
    cr_assert_eq(clffn_npy_save(path, x, 3, shape, err), 0, "%s", err);
}

static void write_case(const named *ts, size_t n, uint64_t D) {
    clffn_st_out o[64];
    float *data[64];
    cr_assert(n <= 64);
    for (size_t i = 0; i < n; ++i) {
        const size_t numel = (size_t)(ts[i].shape[0] * (ts[i].rank == 2 ? ts[i].shape[1] : 1));
        data[i] = malloc(numel * sizeof(float));
        cr_assert(data[i]);
        fill(data[i], numel, 0.3f, 100 + i);
        o[i] = (clffn_st_out){ts[i].name, ts[i].rank, ts[i].shape, data[i]};
    }
    char path[128], err[CLFFN_IO_ERR];
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    cr_assert_eq(clffn_st_write(path, o, n, err), 0, "%s", err);
    for (size_t i = 0; i < n; ++i) { free(data[i]); }
    write_inputs(D);
}

static void load_npy(const char *name, clffn_npy *a) {
    char path[128], err[CLFFN_IO_ERR];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    cr_assert_eq(clffn_npy_load(path, a, err), 0, "%s: %s", name, err);
}

/* |a − b| ≤ 1e-5·max|a| + 1e-6 everywhere: the split sums partials in another order. */
static void assert_same(const float *a, const float *b, size_t n, const char *what) {
    double m = 0.0, worst = 0.0;
    for (size_t i = 0; i < n; ++i) { m = fmax(m, fabs((double)a[i])); }
    for (size_t i = 0; i < n; ++i) { worst = fmax(worst, fabs((double)a[i] - (double)b[i])); }
    cr_assert(m > 0.0, "%s: all zero", what);
    cr_assert(worst <= 1e-5 * m + 1e-6, "%s: differs by %g (max %g)", what, worst, m);
}

static void compare_outputs(const char *one, const char *split) {
    clffn_npy a = {0}, b = {0};
    load_npy(one, &a);
    load_npy(split, &b);
    cr_assert_eq(a.numel, b.numel);
    assert_same(a.data, b.data, (size_t)a.numel, split);
    clffn_npy_free(&a);
    clffn_npy_free(&b);
}

static void compare_grads(const char *one, const char *split, size_t expect_tensors) {
    char pa[128], pb[128], err[CLFFN_IO_ERR];
    snprintf(pa, sizeof pa, "%s/%s", dir, one);
    snprintf(pb, sizeof pb, "%s/%s", dir, split);
    clffn_st_file a, b;
    cr_assert_eq(clffn_st_open(pa, &a, err), 0, "%s", err);
    cr_assert_eq(clffn_st_open(pb, &b, err), 0, "%s", err);
    cr_assert_eq(a.count, expect_tensors);
    cr_assert_eq(b.count, a.count, "%s has %zu tensors, %s %zu", split, b.count, one, a.count);
    for (size_t i = 0; i < a.count; ++i) {
        const clffn_st_tensor *ta = &a.tensors[i], *tb = clffn_st_find(&b, ta->name);
        cr_assert_not_null(tb, "%s lacks '%s'", split, ta->name);
        cr_assert(tb->rank == ta->rank && tb->numel == ta->numel, "'%s' shape", ta->name);
        float *va = malloc((size_t)ta->numel * sizeof(float));
        float *vb = malloc((size_t)ta->numel * sizeof(float));
        cr_assert(va && vb);
        cr_assert_eq(clffn_st_read_f32(&a, ta, va, err), 0);
        cr_assert_eq(clffn_st_read_f32(&b, tb, vb, err), 0);
        char what[256];
        snprintf(what, sizeof what, "%s: '%s'", split, ta->name);
        assert_same(va, vb, (size_t)ta->numel, what);
        free(va);
        free(vb);
    }
    clffn_st_close(&a);
    clffn_st_close(&b);
}

/* The single process against the double reference. */
static void single_verified(const char *weights, const char *args) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s --weights %s --input x.npy --output y1.npy %s --verify",
             CLFFN_RUN_PATH, weights, args);
    cr_assert_eq(run(cmd), 0, "%s", out);
    cr_assert(strstr(out, "PASS") != NULL, "%s", out);
}

/* The single process (checked against the double reference), then np_from to np_to ranks. */
static void split_equals_single_on(const char *weights, const char *args, size_t expect_tensors,
                                   int np_from, int np_to) {
    char cmd[2048];
    single_verified(weights, args);
    snprintf(cmd, sizeof cmd,
             "%s --weights %s --input x.npy --output y1.npy %s --grad-output dy.npy "
             "--grads-out g1.safetensors",
             CLFFN_RUN_PATH, weights, args);
    cr_assert_eq(run(cmd), 0, "%s", out);
    for (int np = np_from; np <= np_to; ++np) {
        snprintf(cmd, sizeof cmd,
                 "%s -np %d %s --tensor-parallel --verbose --weights %s --input x.npy "
                 "--output y%d.npy %s --grad-output dy.npy --grads-out g%d.safetensors",
                 CLFFN_MPIEXEC, np, CLFFN_RUN_PATH, weights, np, args, np);
        cr_assert_eq(run(cmd), 0, "%s", out);
        char want[64];
        snprintf(want, sizeof want, "split over %d ranks", np);
        cr_assert(strstr(out, want) != NULL, "%s", out);
        for (int r = 0; r < np; ++r) { /* every rank read only its slice */
            snprintf(want, sizeof want, "rank %d/%d", r, np);
            const char *line = strstr(out, want);
            cr_assert_not_null(line, "%s", out);
            int pct = 0;
            const char *at = strstr(line, "MiB (");
            cr_assert(at && sscanf(at, "MiB (%d%%)", &pct) == 1, "%s", line);
            cr_assert(pct > 100 / np - 10 && pct < 100 / np + 10, "rank %d read %d%%", r, pct);
        }
        char y[16], g[32];
        snprintf(y, sizeof y, "y%d.npy", np);
        snprintf(g, sizeof g, "g%d.safetensors", np);
        compare_outputs("y1.npy", y);
        compare_grads("g1.safetensors", g, expect_tensors);
    }
}

static void split_equals_single(const char *args, size_t expect_tensors) {
    split_equals_single_on("w.safetensors", args, expect_tensors, 2, 3);
}

/* A llama-preset layer 0: gate, up and down projections, no biases, d_ff a multiple of 4. */
static void write_llama_case(void) {
    const uint64_t D = 48, F = 136;
    const named ts[3] = {
        {"model.layers.0.mlp.gate_proj.weight", 2, {F, D}},
        {"model.layers.0.mlp.up_proj.weight", 2, {F, D}},
        {"model.layers.0.mlp.down_proj.weight", 2, {D, F}},
    };
    write_case(ts, 3, D);
}

Test(mpi, llama_preset_two_and_three_ranks, .init = setup, .fini = teardown, .timeout = 300) {
    write_llama_case();
    split_equals_single("--preset llama", 4);
}

Test(mpi, gpt2_preset_dropout_residual, .init = setup, .fini = teardown, .timeout = 300) {
    const uint64_t D = 40, F = 150; /* not a multiple of 4: slices start mid Philox block */
    const named ts[4] = {
        {"h.0.mlp.c_fc.weight", 2, {D, F}},
        {"h.0.mlp.c_fc.bias", 1, {F, 0}},
        {"h.0.mlp.c_proj.weight", 2, {F, D}},
        {"h.0.mlp.c_proj.bias", 1, {D, 0}},
    };
    write_case(ts, 4, D);
    split_equals_single("--preset gpt2 --train --dropout 0.25 --seed 9 --residual", 5);
}

/* Rank 1 gets a truncated copy of the checkpoint (MPMD: each rank its own arguments). */
Test(mpi, a_damaged_slice_fails_every_rank, .init = setup, .fini = teardown, .timeout = 300) {
    write_llama_case();
    cr_assert_eq(run("head -c 3000 w.safetensors > bad.safetensors"), 0);
    char cmd[4096];
    const char *common = "--tensor-parallel --preset llama --input x.npy --output y.npy "
                         "--grad-output dy.npy --grads-out g.safetensors";
    snprintf(cmd, sizeof cmd,
             "%s -np 1 %s --weights w.safetensors %s : -np 1 %s --weights "
             "bad.safetensors %s",
             CLFFN_MPIEXEC, CLFFN_RUN_PATH, common, CLFFN_RUN_PATH, common);
    const int rc = run(cmd);
    cr_assert_eq(rc, 2, "exit %d: %s", rc, out);
    cr_assert(strstr(out, "clffn-run: rank 1: bad.safetensors:") != NULL, "%s", out);
    /* one line of ours, from rank 0 only */
    size_t lines = 0;
    for (const char *p = out; (p = strstr(p, "clffn-run:")) != NULL; ++p) { ++lines; }
    cr_assert_eq(lines, 1, "%s", out);
    char path[128];
    struct stat sb;
    snprintf(path, sizeof path, "%s/y.npy", dir);
    cr_assert(stat(path, &sb) != 0, "an output file was left");
    snprintf(path, sizeof path, "%s/g.safetensors", dir);
    cr_assert(stat(path, &sb) != 0, "a gradient file was left");
    /* a layer the checkpoint lacks: every rank refuses, rank 0 says why */
    snprintf(cmd, sizeof cmd,
             "%s -np 3 %s --tensor-parallel --preset llama --weights "
             "w.safetensors --input x.npy --output y.npy --layer 1",
             CLFFN_MPIEXEC, CLFFN_RUN_PATH);
    cr_assert_eq(run(cmd), 2, "%s", out);
    cr_assert(strstr(out, "rank 0: w.safetensors: no tensor") != NULL, "%s", out);
}

/* A GGUF layer kept in q8_0: each of 3 ranks reads its rows of the gate and up projections and
 * its 32-value blocks of the down projection's rows; 2 ranks would cut W2's blocks (48 hidden
 * units each) and are refused with the reason. */
Test(mpi, gguf_q8_0_slices, .init = setup, .fini = teardown, .timeout = 300) {
    enum { D = 64, F = 96 };
    uint8_t *q[3];
    size_t bytes = D * F / 32 * 34;
    for (int i = 0; i < 3; ++i) {
        float w[D * F];
        fill(w, D * F, 0.3f, 200 + (uint64_t)i);
        q[i] = malloc(bytes);
        ASSERT_OK(clffn_convert_weights(CLFFN_DTYPE_Q8_0, w, D * F, q[i], bytes));
    }
    const gw_tensor ts[3] = {{"blk.0.ffn_gate.weight", CLFFN_GGML_Q8_0, 2, {D, F}, q[0], bytes, 0},
                             {"blk.0.ffn_up.weight", CLFFN_GGML_Q8_0, 2, {D, F}, q[1], bytes, 0},
                             {"blk.0.ffn_down.weight", CLFFN_GGML_Q8_0, 2, {F, D}, q[2], bytes, 0}};
    size_t len;
    uint8_t *img = gw_image(3, 0, NULL, 0, ts, 3, &len);
    char path[128];
    snprintf(path, sizeof path, "%s/w.gguf", dir);
    cr_assert_eq(gw_write(path, img, len), 0);
    free(img);
    for (int i = 0; i < 3; ++i) { free(q[i]); }
    write_inputs(D);
    split_equals_single_on("w.gguf", "", 1, 3, 3); /* input alone: q8_0 has no gradients */
    char cmd[1024];
    /* --quantized-inputs: said once for all ranks, whether it applies or not */
    static const char *const said[2] = {"inputs: rounded to q8_0", "so it changes nothing"};
    for (int f16 = 0; f16 < 2; ++f16) {
        snprintf(cmd, sizeof cmd,
                 "%s -np 3 %s --tensor-parallel --weights w.gguf --input x.npy --output yq.npy "
                 "--quantized-inputs --verbose%s",
                 CLFFN_MPIEXEC, CLFFN_RUN_PATH, f16 ? " --weights-dtype f16" : "");
        cr_assert_eq(run(cmd), 0, "%s", out);
        const char *at = strstr(out, said[f16]);
        cr_assert(at && !strstr(at + 1, said[f16]), "once: %s\n%s", said[f16], out);
    }
    snprintf(cmd, sizeof cmd,
             "%s -np 2 %s --tensor-parallel --weights w.gguf --input x.npy --output y.npy",
             CLFFN_MPIEXEC, CLFFN_RUN_PATH);
    cr_assert_eq(run(cmd), 2, "%s", out);
    cr_assert(strstr(out, "must start and end on a multiple of 32") != NULL, "%s", out);
}

/* --expert-parallel on np_from to np_to ranks against the single process (itself checked
 * against the double reference): the routing is the same bytes, and so are the output and the
 * gradient file (with bits; below the few-token kernels' crossover the single process keeps the
 * expert counts on the device, and each rank's experts then run the kernels built for the pass's
 * tokens, as its do), and each rank read its own experts' share of the weights. */
static void experts_split_equal_single(const char *weights, const char *args, int grads, int bits,
                                       int np_from, int np_to) {
    char cmd[2048];
    single_verified(weights, args);
    const char *backward = grads ? "--grad-output dy.npy --grads-out g%d.safetensors" : "";
    char b1[96], bn[96];
    snprintf(b1, sizeof b1, backward, 1);
    snprintf(cmd, sizeof cmd,
             "%s --weights %s --input x.npy --output y1.npy --router-out r1.npy %s %s",
             CLFFN_RUN_PATH, weights, args, b1);
    cr_assert_eq(run(cmd), 0, "%s", out);
    for (int np = np_from; np <= np_to; ++np) {
        snprintf(bn, sizeof bn, backward, np);
        snprintf(cmd, sizeof cmd,
                 "%s -np %d %s --expert-parallel --verbose --weights %s --input x.npy "
                 "--output y%d.npy --router-out r%d.npy %s %s",
                 CLFFN_MPIEXEC, np, CLFFN_RUN_PATH, weights, np, np, args, bn);
        cr_assert_eq(run(cmd), 0, "%s", out);
        char want[64];
        snprintf(want, sizeof want, "experts over %d ranks", np);
        cr_assert(strstr(out, want) != NULL, "%s", out);
        for (int r = 0; r < np; ++r) { /* each rank read its experts, rank 0 also the router */
            snprintf(want, sizeof want, "rank %d/%d", r, np);
            const char *line = strstr(out, want);
            cr_assert_not_null(line, "%s", out);
            unsigned a = 0, b = 0;
            int pct = 0;
            const char *at = strstr(line, "experts [");
            cr_assert(at && sscanf(at, "experts [%u, %u)", &a, &b) == 2, "%s", line);
            cr_assert(a < b, "rank %d holds no expert: %s", r, line);
            at = strstr(line, "MiB (");
            cr_assert(at && sscanf(at, "MiB (%d%%)", &pct) == 1, "%s", line);
            cr_assert(pct < 100 && pct > 100 / (np + 2), "rank %d read %d%%: %s", r, pct, line);
        }
        snprintf(cmd, sizeof cmd, "cmp r1.npy r%d.npy", np);
        cr_assert_eq(run(cmd), 0, "%d ranks' routing: %s", np, out);
        char y[16], g[32];
        snprintf(y, sizeof y, "y%d.npy", np);
        snprintf(g, sizeof g, "g%d.safetensors", np);
        compare_outputs("y1.npy", y);
        if (grads) { compare_grads("g1.safetensors", g, (size_t)grads); }
        snprintf(cmd, sizeof cmd, "cmp y1.npy %s && (%d = 0 || cmp g1.safetensors %s)", y, grads,
                 g);
        cr_assert(!bits || run(cmd) == 0, "%d ranks: not the same bits: %s", np, out);
    }
}

enum { MD = 32, MF = 48, ME = 6 };

/* Mixtral's names for ME experts of [MF, MD], or Qwen2-MoE's with a gated shared expert of its
 * own width 40. */
static void write_moe_case(int qwen) {
    named ts[3 * ME + 5];
    size_t n = 0;
    const char *pre = qwen ? "model.layers.0.mlp" : "model.layers.0.block_sparse_moe";
    snprintf(ts[n].name, sizeof ts[n].name, "%s.gate.weight", pre);
    ts[n].rank = 2, ts[n].shape[0] = ME, ts[n++].shape[1] = MD;
    static const char *const mixtral[3] = {"w1", "w3", "w2"};
    static const char *const qw[3] = {"gate_proj", "up_proj", "down_proj"};
    for (int e = 0; e <= ME; ++e) {
        if (e == ME && !qwen) { break; }
        const uint64_t f = e == ME ? 40 : MF;
        for (int i = 0; i < 3; ++i) {
            if (e == ME) {
                snprintf(ts[n].name, sizeof ts[n].name, "%s.shared_expert.%s.weight", pre, qw[i]);
            } else {
                snprintf(ts[n].name, sizeof ts[n].name, "%s.experts.%d.%s.weight", pre, e,
                         qwen ? qw[i] : mixtral[i]);
            }
            ts[n].rank = 2, ts[n].shape[0] = i < 2 ? f : MD, ts[n++].shape[1] = i < 2 ? MD : f;
        }
    }
    if (qwen) {
        snprintf(ts[n].name, sizeof ts[n].name, "%s.shared_expert_gate.weight", pre);
        ts[n].rank = 2, ts[n].shape[0] = 1, ts[n++].shape[1] = MD;
    }
    write_case(ts, n, MD);
}

Test(mpi, experts_split_mixtral_two_and_three_ranks, .init = setup, .fini = teardown,
     .timeout = 300) {
    write_moe_case(0);
    experts_split_equal_single("w.safetensors", "--preset mixtral", 3 * ME + 2, 1, 2, 3);
}

Test(mpi, experts_split_qwen_shared_expert, .init = setup, .fini = teardown, .timeout = 300) {
    write_moe_case(1);
    experts_split_equal_single("w.safetensors", "--preset qwen_moe --top-k 3", 3 * ME + 6, 1, 3, 3);
}

/* A GGUF layer's stacked experts kept in q8_0: each rank reads its experts' blocks of the
 * stacked tensors; dx alone (compressed experts have no weight gradients). Every rank builds the
 * q8_0 programs itself: on rusticl's llvmpipe on a 2-core AVX2 host, with Mesa's shader cache
 * cold and a second suite beside it, this ran past 300 s. */
Test(mpi, experts_split_gguf_q8_0, .init = setup, .fini = teardown, .timeout = 600) {
    enum { D = 64, F = 64, E = 4 };
    float *router = malloc(E * D * sizeof *router);
    cr_assert(router);
    fill(router, E * D, 0.3f, 300);
    uint8_t *q[3];
    const size_t bytes = (size_t)E * D * F / 32 * 34;
    for (int i = 0; i < 3; ++i) {
        float *w = malloc((size_t)E * D * F * sizeof *w);
        cr_assert(w);
        fill(w, (size_t)E * D * F, 0.3f, 301 + (uint64_t)i);
        q[i] = malloc(bytes);
        ASSERT_OK(clffn_convert_weights(CLFFN_DTYPE_Q8_0, w, (size_t)E * D * F, q[i], bytes));
        free(w);
    }
    const gw_kv kvs[2] = {{"general.architecture", 8, 0, "mixtral"},
                          {"mixtral.expert_used_count", 4, 2, NULL}};
    const gw_tensor ts[4] = {
        {"blk.0.ffn_gate_inp.weight", CLFFN_GGML_F32, 2, {D, E}, router, E * D * 4, 0},
        {"blk.0.ffn_gate_exps.weight", CLFFN_GGML_Q8_0, 3, {D, F, E}, q[0], bytes, 0},
        {"blk.0.ffn_up_exps.weight", CLFFN_GGML_Q8_0, 3, {D, F, E}, q[1], bytes, 0},
        {"blk.0.ffn_down_exps.weight", CLFFN_GGML_Q8_0, 3, {F, D, E}, q[2], bytes, 0}};
    size_t len;
    uint8_t *img = gw_image(3, 32, kvs, 2, ts, 4, &len);
    char path[128];
    snprintf(path, sizeof path, "%s/w.gguf", dir);
    cr_assert_eq(gw_write(path, img, len), 0);
    free(img), free(router);
    for (int i = 0; i < 3; ++i) { free(q[i]); }
    write_inputs(D);
    experts_split_equal_single("w.gguf", "", 2, 1, 2, 3); /* 15 tokens: counted in one process */
}

/* A dense layer, more ranks than experts, --verify: refused, by every rank at once. */
Test(mpi, experts_split_refusals, .init = setup, .fini = teardown, .timeout = 300) {
    write_moe_case(0);
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "%s -np 7 %s --expert-parallel --preset mixtral --weights w.safetensors "
             "--input x.npy --output y.npy",
             CLFFN_MPIEXEC, CLFFN_RUN_PATH);
    cr_assert_eq(run(cmd), 2, "%s", out);
    cr_assert(strstr(out, "7 ranks are more than the layer's 6 experts") != NULL, "%s", out);
    snprintf(cmd, sizeof cmd,
             "%s --expert-parallel --verify --preset mixtral --weights w.safetensors --input "
             "x.npy --output y.npy",
             CLFFN_RUN_PATH);
    cr_assert_eq(run(cmd), 2, "%s", out);
    cr_assert(strstr(out, "--verify needs the whole layer") != NULL, "%s", out);
    write_llama_case();
    snprintf(cmd, sizeof cmd,
             "%s -np 2 %s --expert-parallel --preset llama --weights w.safetensors --input "
             "x.npy --output y.npy",
             CLFFN_MPIEXEC, CLFFN_RUN_PATH);
    cr_assert_eq(run(cmd), 2, "%s", out);
    cr_assert(strstr(out, "is a dense FFN: --expert-parallel") != NULL, "%s", out);
    struct stat sb;
    char path[128];
    snprintf(path, sizeof path, "%s/y.npy", dir);
    cr_assert(stat(path, &sb) != 0, "an output file was left");
}

/* The glue under clffn-run --expert-parallel, driven with passes of the test's own making: every
 * answer a holder gives equals the experts run in one process, and every failure (counts beyond
 * MPI's, a holder's failing pass, gradients asked of a holder without arrays) reaches rank 0
 * with the failing rank, the next pass still working. */
Test(mpi, expert_glue_passes_and_failures, .init = setup, .fini = teardown, .timeout = 300) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s -np 2 %s", CLFFN_MPIEXEC, CLFFN_MPI_MOE_GLUE_PATH);
    cr_assert_eq(run(cmd), 0, "%s", out);
    static const char *const want[] = {
        "ok: a forward's rows come back as the experts' outputs, bit for bit",
        "ok: counts beyond MPI's int: SIZE_OVERFLOW, nothing sent",
        "ok: a backward of other rows than the forward's: rank 1's NO_FORWARD",
        "ok: a backward's dy rows come back as dx, bit for bit",
        "ok: the gradients collected from rank 1 are the experts' own, bit for bit",
        "ok: after failures, a forward still comes back right",
        "ok: gradients asked of a holder without arrays: rank 1's NULL_ARGUMENT",
        "ok: collecting from a holder without arrays: rank 1's NULL_ARGUMENT",
        "ok: dx alone still comes back right"};
    for (size_t i = 0; i < sizeof want / sizeof *want; ++i) {
        cr_assert(strstr(out, want[i]) != NULL, "missing \"%s\" in:\n%s", want[i], out);
    }
    cr_assert(strstr(out, "FAILED") == NULL, "%s", out);
}
