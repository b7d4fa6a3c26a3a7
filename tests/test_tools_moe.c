/* clffn-run with mixture-of-experts layers: Mixtral's safetensors names (--preset mixtral), a
 * GGUF layer with stacked experts (the tests' own writer) in f32 and in q8_0, each checked by
 * --verify against the double reference and by what --router-out says of the choice; and the
 * refusals (a Qwen2-MoE gated shared expert, top-k beyond E, --tensor-parallel). */
#include "clffn_io.h"
#include "common.h"
#include "gguf_writer.h"
#include "tools_common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { D = 32, F = 64, E = 4 };

/* x [2, 3, D] in steps of 1/64 (so are the router's weights: exact logits). */
static void write_input(const char *path) {
    float *x = exact_values(2 * 3 * D, 1.0f, 5);
    const uint64_t shape[3] = {2, 3, D};
    char err[CLFFN_IO_ERR];
    cr_assert_eq(clffn_npy_save(path, x, 3, shape, err), 0, "%s", err);
    free(x);
}

/* --router-out's [2, 3, k, 2]: distinct experts in range, weights positive and, when
 * normalised, summing to 1 per token. */
static void check_routing(const char *path, size_t k, int normalized) {
    clffn_npy r = {0};
    char err[CLFFN_IO_ERR];
    cr_assert_eq(clffn_npy_load(path, &r, err), 0, "%s", err);
    cr_assert(r.rank == 4 && r.shape[0] == 2 && r.shape[1] == 3 && r.shape[2] == k &&
              r.shape[3] == 2);
    for (size_t t = 0; t < 6; ++t) {
        double sum = 0.0;
        for (size_t j = 0; j < k; ++j) {
            const float e = r.data[(t * k + j) * 2], w = r.data[(t * k + j) * 2 + 1];
            cr_assert(e >= 0 && e < E && e == floorf(e) && w > 0, "token %zu: %g, %g", t, e, w);
            for (size_t i = 0; i < j; ++i) { cr_assert(r.data[(t * k + i) * 2] != e); }
            sum += w;
        }
        cr_assert(normalized ? fabs(sum - 1.0) < 1e-6 : sum < 1.0, "token %zu: sum %g", t, sum);
    }
    clffn_npy_free(&r);
}

/* y.npy against the double reference of the layer the test wrote (router [E, D], expert e's
 * gate, up, down at m[3e …]), on x: the tool's reading of the file checked independently of
 * its own --verify (which sees the weights as the tool read them). */
static void check_output(const char *y_path, const char *x_path, const float *router,
                         float *const *m, size_t k, clffn_routing routing) {
    clffn_npy x = {0}, y = {0};
    char err[CLFFN_IO_ERR];
    cr_assert_eq(clffn_npy_load(x_path, &x, err), 0, "%s", err);
    cr_assert_eq(clffn_npy_load(y_path, &y, err), 0, "%s", err);
    clffn_moe_config c = clffn_moe_config_default(D, F, E, k);
    c.routing = routing;
    clffn_host_weights hw[E];
    for (size_t e = 0; e < E; ++e) {
        hw[e] = (clffn_host_weights){m[3 * e], NULL, m[3 * e + 1], NULL, m[3 * e + 2], NULL};
    }
    double ref[6 * D];
    ASSERT_OK(clffn_moe_reference_forward(&c, CLFFN_LAYOUT_OUT_IN, router, NULL, hw, 6, x.data, ref,
                                          NULL, NULL));
    assert_close(y.data, ref, 6 * D, TOL_RTOL, y_path);
    clffn_npy_free(&x), clffn_npy_free(&y);
}

/* Mixtral's names (Qwen2-MoE's router and a gated shared expert with qwen_gate); the values
 * into router and m (freed by the caller). */
static void mixtral_checkpoint(const char *path, int qwen_gate, float **router_out, float **m) {
    tensor ts[1 + 3 * E + 1];
    size_t n = 0;
    float *router = exact_values(E * D, 0.25f, 1);
    ts[n++] = (tensor){"model.layers.0.block_sparse_moe.gate.weight", "F32", 2, {E, D}, router};
    for (size_t e = 0; e < E; ++e) {
        static const char *const part[3] = {"w1", "w3", "w2"};
        for (int i = 0; i < 3; ++i) {
            m[3 * e + i] = exact_values(D * F, 0.25f, 10 + 3 * e + (uint64_t)i);
            tensor t = {"", "BF16", 2, {i < 2 ? F : D, i < 2 ? D : F}, m[3 * e + i]};
            snprintf(t.name, sizeof t.name, "model.layers.0.block_sparse_moe.experts.%zu.%s.weight",
                     e, part[i]);
            ts[n++] = t;
        }
    }
    if (qwen_gate) { /* Qwen2-MoE's names for the router and a gated shared expert */
        strcpy(ts[0].name, "model.layers.0.mlp.gate.weight");
        ts[n++] =
            (tensor){"model.layers.0.mlp.shared_expert_gate.weight", "F32", 2, {1, D}, router};
    }
    write_checkpoint(path, ts, n);
    *router_out = router;
}

static void free_values(float *router, float **m) {
    free(router);
    for (size_t i = 0; i < 3 * E; ++i) { free(m[i]); }
}

Test(clffn_run_moe, mixtral_checkpoint_verifies, .timeout = 120) {
    make_dir();
    char w[128], x[128], y[128], r[128], cmd[1024], out[4096];
    snprintf(w, sizeof w, "%s/m.safetensors", dir), snprintf(x, sizeof x, "%s/x.npy", dir);
    snprintf(y, sizeof y, "%s/y.npy", dir), snprintf(r, sizeof r, "%s/r.npy", dir);
    float *router, *m[3 * E];
    mixtral_checkpoint(w, 0, &router, m);
    write_input(x);
    for (int mode = 0; mode < 3; ++mode) { /* Mixtral's top-2; as they are; top-1 */
        snprintf(cmd, sizeof cmd,
                 "'%s' --weights %s --preset mixtral --input %s --output %s --verify "
                 "--router-out %s %s 2>&1",
                 CLFFN_RUN_PATH, w, x, y, r,
                 mode == 1   ? "--routing topk"
                 : mode == 2 ? "--top-k 1"
                             : "");
        cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
        cr_assert(strstr(out, "PASS") && strstr(out, "MoE: 4 experts"), "%s", out);
        check_routing(r, mode == 2 ? 1 : 2, mode != 1);
        check_output(y, x, router, m, mode == 2 ? 1 : 2,
                     mode == 1 ? CLFFN_ROUTING_TOPK : CLFFN_ROUTING_TOPK_NORMALIZED);
    }
    free_values(router, m);
    clffn_npy yv = {0};
    char err[CLFFN_IO_ERR];
    cr_assert_eq(clffn_npy_load(y, &yv, err), 0, "%s", err);
    cr_assert(yv.rank == 3 && yv.shape[0] == 2 && yv.shape[1] == 3 && yv.shape[2] == D);
    clffn_npy_free(&yv);
    remove_dir();
}

/* A GGUF layer: router [E, D] and the experts stacked, in type; k from the metadata (3). */
/* vals: the f32 values the stacked tensors were made from (gate, up, down; the caller frees). */
static void moe_gguf(const char *path, clffn_dtype type, float **router_out, float **vals) {
    static const uint32_t ggml[CLFFN_DTYPE_COUNT_] = {
        CLFFN_GGML_F32, CLFFN_GGML_F16, CLFFN_GGML_BF16, CLFFN_GGML_Q8_0, CLFFN_GGML_Q4_0};
    float *router = exact_values(E * D, 0.25f, 2);
    void *bytes[3];
    size_t nb;
    ASSERT_OK(clffn_dtype_bytes(type, (size_t)E * D * F, &nb));
    for (int i = 0; i < 3; ++i) {
        vals[i] = exact_values((size_t)E * D * F, 0.25f, 20 + (uint64_t)i);
        bytes[i] = malloc(nb);
        ASSERT_OK(clffn_convert_weights(type, vals[i], (size_t)E * D * F, bytes[i], nb));
    }
    const gw_kv kvs[2] = {{"general.architecture", 8, 0, "mixtral"},
                          {"mixtral.expert_used_count", 4, 3, NULL}};
    const gw_tensor ts[4] = {
        {"blk.0.ffn_gate_inp.weight", CLFFN_GGML_F32, 2, {D, E}, router, E * D * 4, 0},
        {"blk.0.ffn_gate_exps.weight", ggml[type], 3, {D, F, E}, bytes[0], nb, 0},
        {"blk.0.ffn_up_exps.weight", ggml[type], 3, {D, F, E}, bytes[1], nb, 0},
        {"blk.0.ffn_down_exps.weight", ggml[type], 3, {F, D, E}, bytes[2], nb, 0}};
    size_t len;
    uint8_t *img = gw_image(3, 32, kvs, 2, ts, 4, &len);
    cr_assert_eq(gw_write(path, img, len), 0);
    free(img);
    *router_out = router;
    for (int i = 0; i < 3; ++i) { free(bytes[i]); }
}

/* A gradient file's tensor `name`, n floats, against ref (double). */
static void check_grad(const clffn_st_file *g, const char *name, const double *ref, size_t n) {
    const clffn_st_tensor *t = clffn_st_find(g, name);
    cr_assert_not_null(t, "no gradient '%s'", name);
    float *v = malloc(n * sizeof *v);
    char err[CLFFN_IO_ERR];
    cr_assert_eq(clffn_st_read_f32(g, t, v, err), 0, "%s", err);
    assert_close(v, ref, n, TOL_RTOL, name);
    free(v);
}

/* --grad-output on a GGUF file's stacked experts (f32): each gradient tensor restacked, expert
 * e's block at e, against the double reference. */
static void check_stacked_grads(const char *w, const char *x, const char *y, const float *router,
                                float *const *m) {
    char dyp[160], g[160], cmd[1024], out[4096], err[CLFFN_IO_ERR];
    snprintf(dyp, sizeof dyp, "%s/dy.npy", dir), snprintf(g, sizeof g, "%s/g.safetensors", dir);
    float *dy = exact_values(6 * D, 1.0f, 78);
    const uint64_t shape[3] = {2, 3, D};
    cr_assert_eq(clffn_npy_save(dyp, dy, 3, shape, err), 0, "%s", err);
    snprintf(cmd, sizeof cmd,
             "'%s' --weights %s --input %s --output %s --grad-output %s "
             "--grads-out %s 2>&1",
             CLFFN_RUN_PATH, w, x, y, dyp, g);
    cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
    clffn_npy xv = {0};
    cr_assert_eq(clffn_npy_load(x, &xv, err), 0, "%s", err);
    clffn_moe_config c = clffn_moe_config_default(D, F, E, 3);
    clffn_host_weights hw[E];
    clffn_ref_grads rg[E];
    double *stacked = malloc(3 * E * F * D * sizeof *stacked), dx[6 * D], drouter[E * D];
    for (size_t e = 0; e < E; ++e) { /* the reference writes each block where the file has it */
        hw[e] = (clffn_host_weights){m[3 * e], NULL, m[3 * e + 1], NULL, m[3 * e + 2], NULL};
        rg[e] =
            (clffn_ref_grads){stacked + e * F * D,           NULL, stacked + (E + e) * F * D, NULL,
                              stacked + (2 * E + e) * F * D, NULL};
    }
    ASSERT_OK(clffn_moe_reference_backward(&c, CLFFN_LAYOUT_OUT_IN, router, NULL, hw, 6, xv.data,
                                           dy, dx, drouter, NULL, rg));
    clffn_st_file gf;
    cr_assert_eq(clffn_st_open(g, &gf, err), 0, "%s", err);
    check_grad(&gf, "blk.0.ffn_gate_inp.weight", drouter, E * D);
    check_grad(&gf, "blk.0.ffn_gate_exps.weight", stacked, E * F * D);
    check_grad(&gf, "blk.0.ffn_up_exps.weight", stacked + E * F * D, E * F * D);
    check_grad(&gf, "blk.0.ffn_down_exps.weight", stacked + 2 * E * F * D, E * F * D);
    check_grad(&gf, "input", dx, 6 * D);
    clffn_st_close(&gf);
    clffn_npy_free(&xv);
    free(stacked), free(dy);
}

Test(clffn_run_moe, gguf_stacked_experts_verify, .timeout = 120) {
    make_dir();
    char w[128], x[128], y[128], r[128], cmd[1024], out[4096];
    snprintf(x, sizeof x, "%s/x.npy", dir), snprintf(y, sizeof y, "%s/y.npy", dir);
    snprintf(r, sizeof r, "%s/r.npy", dir);
    write_input(x);
    static const clffn_dtype types[2] = {CLFFN_DTYPE_F32, CLFFN_DTYPE_Q8_0};
    for (int i = 0; i < 2; ++i) {
        snprintf(w, sizeof w, "%s/m%d.gguf", dir, i);
        float *router, *vals[3], *m[3 * E];
        moe_gguf(w, types[i], &router, vals);
        snprintf(cmd, sizeof cmd,
                 "'%s' --weights %s --input %s --output %s --verify --router-out %s 2>&1",
                 CLFFN_RUN_PATH, w, x, y, r);
        cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
        cr_assert(strstr(out, "PASS") && strstr(out, "top-3"), "%s", out);
        check_routing(r, 3, 1);
        if (types[i] == CLFFN_DTYPE_F32) { /* expert e: rows e·F … of gate and up, e·D … of down */
            for (size_t e = 0; e < E; ++e) {
                m[3 * e] = vals[0] + e * F * D, m[3 * e + 1] = vals[1] + e * F * D;
                m[3 * e + 2] = vals[2] + e * D * F;
            }
            check_output(y, x, router, m, 3, CLFFN_ROUTING_TOPK_NORMALIZED);
            check_stacked_grads(w, x, y, router, m);
        }
        free(router);
        for (int j = 0; j < 3; ++j) { free(vals[j]); }
    }
    remove_dir();
}

Test(clffn_run_moe, refusals, .timeout = 60) {
    make_dir();
    char w[128], x[128], y[128], cmd[1024], out[4096];
    snprintf(w, sizeof w, "%s/q.safetensors", dir), snprintf(x, sizeof x, "%s/x.npy", dir);
    snprintf(y, sizeof y, "%s/y.npy", dir);
    float *router, *m[3 * E];
    mixtral_checkpoint(w, 1, &router, m);
    free_values(router, m);
    write_input(x);
    snprintf(cmd, sizeof cmd, "'%s' --weights %s --preset qwen_moe --input %s --output %s 2>&1",
             CLFFN_RUN_PATH, w, x, y);
    cr_assert_eq(run(cmd, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "sigmoid gate"), "%s", out);
    snprintf(w, sizeof w, "%s/m.safetensors", dir);
    mixtral_checkpoint(w, 0, &router, m);
    free_values(router, m);
    snprintf(cmd, sizeof cmd,
             "'%s' --weights %s --preset mixtral --top-k 5 --input %s --output %s 2>&1",
             CLFFN_RUN_PATH, w, x, y);
    cr_assert_eq(run(cmd, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "top-k 5 for 4 experts"), "%s", out);
    snprintf(cmd, sizeof cmd,
             "'%s' --weights %s --preset mixtral --tensor-parallel --input %s --output %s 2>&1",
             CLFFN_RUN_PATH, w, x, y);
    cr_assert_eq(run(cmd, out, sizeof out), 2, "%s", out);
    FILE *f = fopen(y, "rb");
    cr_assert(f == NULL, "a refused run left an output");
    remove_dir();
}

/* --grad-output on Mixtral's names, kept f32: the router's, every expert matrix's and the
 * input's gradients under the file's names, against the double reference of the values the
 * test wrote; kept in the file's BF16, the matrices are named as skipped. */
Test(clffn_run_moe, gradients_under_the_files_names, .timeout = 120) {
    make_dir();
    char w[128], x[128], y[128], dyp[128], g[128], cmd[1024], out[4096];
    snprintf(w, sizeof w, "%s/m.safetensors", dir), snprintf(x, sizeof x, "%s/x.npy", dir);
    snprintf(y, sizeof y, "%s/y.npy", dir), snprintf(dyp, sizeof dyp, "%s/dy.npy", dir);
    snprintf(g, sizeof g, "%s/g.safetensors", dir);
    float *router, *m[3 * E], *dy = exact_values(6 * D, 1.0f, 77);
    mixtral_checkpoint(w, 0, &router, m);
    write_input(x);
    const uint64_t shape[3] = {2, 3, D};
    char err[CLFFN_IO_ERR];
    cr_assert_eq(clffn_npy_save(dyp, dy, 3, shape, err), 0, "%s", err);
    snprintf(cmd, sizeof cmd,
             "'%s' --weights %s --preset mixtral --weights-dtype f32 --input %s --output %s "
             "--grad-output %s --grads-out %s 2>&1",
             CLFFN_RUN_PATH, w, x, y, dyp, g);
    cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "gradients: 13 tensors"), "%s", out);
    clffn_npy xv = {0};
    cr_assert_eq(clffn_npy_load(x, &xv, err), 0, "%s", err);
    clffn_moe_config c = clffn_moe_config_default(D, F, E, 2);
    clffn_host_weights hw[E];
    clffn_ref_grads rg[E];
    double *buf = malloc((6 * D + E * D + 3 * E * F * D) * sizeof *buf), *dx = buf;
    double *drouter = buf + 6 * D, *dm = drouter + E * D;
    for (size_t e = 0; e < E; ++e) {
        hw[e] = (clffn_host_weights){m[3 * e], NULL, m[3 * e + 1], NULL, m[3 * e + 2], NULL};
        double *b = dm + 3 * e * F * D;
        rg[e] = (clffn_ref_grads){b, NULL, b + F * D, NULL, b + 2 * F * D, NULL};
    }
    ASSERT_OK(clffn_moe_reference_backward(&c, CLFFN_LAYOUT_OUT_IN, router, NULL, hw, 6, xv.data,
                                           dy, dx, drouter, NULL, rg));
    clffn_st_file gf;
    cr_assert_eq(clffn_st_open(g, &gf, err), 0, "%s", err);
    check_grad(&gf, "model.layers.0.block_sparse_moe.gate.weight", drouter, E * D);
    check_grad(&gf, "input", dx, 6 * D);
    static const char *const part[3] = {"w1", "w3", "w2"};
    for (size_t e = 0; e < E; ++e) {
        for (int i = 0; i < 3; ++i) {
            char name[96];
            snprintf(name, sizeof name, "model.layers.0.block_sparse_moe.experts.%zu.%s.weight", e,
                     part[i]);
            check_grad(&gf, name, dm + (3 * e + (size_t)i) * F * D, F * D);
        }
    }
    clffn_st_close(&gf);
    /* kept as stored (BF16): dx and the router only */
    snprintf(cmd, sizeof cmd,
             "'%s' --weights %s --preset mixtral --input %s --output %s --grad-output %s "
             "--grads-out %s 2>&1",
             CLFFN_RUN_PATH, w, x, y, dyp, g);
    cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "gradients: 1 tensors") && strstr(out, "gradients skipped"), "%s", out);
    clffn_npy_free(&xv);
    free(buf), free(dy);
    free_values(router, m);
    remove_dir();
}
