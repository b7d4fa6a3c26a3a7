/* clffn-run with mixture-of-experts layers: Mixtral's safetensors names (--preset mixtral), a
 * GGUF layer with stacked experts (the tests' own writer) in f32 and in q8_0, each checked by
 * --verify against the double reference and by what --router-out says of the choice; Qwen2-MoE's
 * shared expert of its own width behind a sigmoid gate, from safetensors (--preset qwen_moe)
 * and GGUF (qwen2moe); the experts split over contexts in one process (--expert-devices); and
 * the refusals (top-k beyond E, --tensor-parallel, a gate of another shape, a gating function
 * other than the softmax); and clffn-bench's layer with its counts on the host or the device. */
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
/* [2, 3, D] exact values from seed, written to path as .npy; the caller frees them. */
static float *write_tokens(const char *path, uint64_t seed) {
    float *v = exact_values(2 * 3 * D, 1.0f, seed);
    const uint64_t shape[3] = {2, 3, D};
    char err[CLFFN_IO_ERR];
    cr_assert_eq(clffn_npy_save(path, v, 3, shape, err), 0, "%s", err);
    return v;
}

static void write_input(const char *path) { free(write_tokens(path, 5)); }

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

/* Mixtral's names; the values into router and m (freed by the caller). */
static void mixtral_checkpoint(const char *path, float **router_out, float **m) {
    tensor ts[1 + 3 * E];
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
    mixtral_checkpoint(w, &router, m);
    write_input(x);
    /* Mixtral's top-2; as they are; top-1; top-2 with the expert counts read back */
    for (int mode = 0; mode < 4; ++mode) {
        snprintf(cmd, sizeof cmd,
                 "'%s' --weights %s --preset mixtral --input %s --output %s --verify "
                 "--router-out %s %s 2>&1",
                 CLFFN_RUN_PATH, w, x, y, r,
                 mode == 1   ? "--routing topk"
                 : mode == 2 ? "--top-k 1"
                 : mode == 3 ? "--moe-counts host"
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

/* --moe-grouping: f16 experts (clffn's own kernels at these 6 tokens, so the counts stay on the
 * device) run grouped by default and one at a time with off, as --verbose says, with the same
 * bits in y. */
Test(clffn_run_moe, grouping_on_and_off, .timeout = 120) {
    make_dir();
    char w[128], x[128], y[2][128], cmd[1024], out[4096];
    snprintf(w, sizeof w, "%s/m.safetensors", dir), snprintf(x, sizeof x, "%s/x.npy", dir);
    float *router, *m[3 * E];
    mixtral_checkpoint(w, &router, m);
    write_input(x);
    clffn_npy yv[2] = {{0}, {0}};
    for (int i = 0; i < 2; ++i) {
        snprintf(y[i], sizeof y[i], "%s/y%d.npy", dir, i);
        snprintf(cmd, sizeof cmd,
                 "'%s' --weights %s --preset mixtral --weights-dtype f16 --input %s --output %s "
                 "--verbose %s 2>&1",
                 CLFFN_RUN_PATH, w, x, y[i], i ? "--moe-grouping off" : "");
        cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
        cr_assert(strstr(out, i ? "experts: one at a time" : "experts: grouped"), "%s", out);
        cr_assert(strstr(out, "expert counts: kept on the device"), "%s", out);
        char err[CLFFN_IO_ERR];
        cr_assert_eq(clffn_npy_load(y[i], &yv[i], err), 0, "%s", err);
    }
    cr_assert(yv[0].numel == yv[1].numel &&
                  !memcmp(yv[0].data, yv[1].data, (size_t)yv[0].numel * sizeof(float)),
              "grouped and one at a time differ");
    for (int i = 0; i < 2; ++i) { clffn_npy_free(&yv[i]); }
    snprintf(cmd, sizeof cmd,
             "'%s' --weights %s --preset mixtral --moe-grouping sometimes --input %s --output %s "
             "2>&1",
             CLFFN_RUN_PATH, w, x, y[0]);
    cr_assert_eq(run(cmd, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "--moe-grouping takes on or off, not 'sometimes'"), "%s", out);
    free_values(router, m);
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
                                float *const *m, const char *extra) {
    char dyp[160], g[160], cmd[1024], out[4096], err[CLFFN_IO_ERR];
    snprintf(dyp, sizeof dyp, "%s/dy.npy", dir), snprintf(g, sizeof g, "%s/g.safetensors", dir);
    float *dy = write_tokens(dyp, 78);
    snprintf(cmd, sizeof cmd,
             "'%s' --weights %s --input %s --output %s --grad-output %s "
             "--grads-out %s %s 2>&1",
             CLFFN_RUN_PATH, w, x, y, dyp, g, extra);
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
            check_stacked_grads(w, x, y, router, m, "");
        }
        free(router);
        for (int j = 0; j < 3; ++j) { free(vals[j]); }
    }
    remove_dir();
}

/* The device the suite runs on as a SPEC without a comma (llvmpipe's name has one): CLFFN_DEVICE
 * when set, else the default device's "P:D". */
static void suite_device(char *spec, size_t n) {
    const char *env = getenv("CLFFN_DEVICE");
    if (env && *env && !strchr(env, ',')) {
        snprintf(spec, n, "%s", env);
        return;
    }
    size_t count = 0, idx = 0;
    ASSERT_OK(clffn_devices_list(NULL, 0, &count));
    clffn_device_info *devs = calloc(count, sizeof *devs);
    cr_assert_not_null(devs);
    ASSERT_OK(clffn_devices_list(devs, count, &count));
    ASSERT_OK(clffn_devices_default(devs, count, &idx));
    snprintf(spec, n, "%u:%u", devs[idx].platform_index, devs[idx].device_index);
    free(devs);
}

/* The file's n floats at path (a .npy), malloc'd. */
static float *npy_values(const char *path, size_t n) {
    clffn_npy v = {0};
    char err[CLFFN_IO_ERR];
    cr_assert_eq(clffn_npy_load(path, &v, err), 0, "%s", err);
    cr_assert_eq((size_t)v.numel, n);
    float *out = malloc(n * sizeof *out);
    memcpy(out, v.data, n * sizeof *out);
    clffn_npy_free(&v);
    return out;
}

/* --expert-devices: the layer's experts over three contexts of the suite's device in one
 * process (experts 0-1, 2, 3). The outputs are the one-context run's bits, they pass --verify
 * and the double reference, each context's part is printed, and the gradients (f32 experts,
 * restacked from three contexts) match the reference. */
Test(clffn_run_moe, expert_devices_split_in_process, .timeout = 180) {
    make_dir();
    char w[128], x[128], y[128], y1[128], cmd[1024], out[4096], spec[64], list[256];
    snprintf(x, sizeof x, "%s/x.npy", dir), snprintf(y, sizeof y, "%s/y.npy", dir);
    snprintf(y1, sizeof y1, "%s/y1.npy", dir);
    write_input(x);
    suite_device(spec, sizeof spec);
    snprintf(list, sizeof list, "--expert-devices %s,%s,%s", spec, spec, spec);
    static const clffn_dtype types[2] = {CLFFN_DTYPE_Q8_0, CLFFN_DTYPE_F32};
    for (int i = 0; i < 2; ++i) {
        snprintf(w, sizeof w, "%s/m%d.gguf", dir, i);
        float *router, *vals[3], *m[3 * E];
        moe_gguf(w, types[i], &router, vals);
        snprintf(cmd, sizeof cmd, "'%s' --weights %s --input %s --output %s --device %s 2>&1",
                 CLFFN_RUN_PATH, w, x, y1, spec);
        cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
        snprintf(cmd, sizeof cmd,
                 "'%s' --weights %s --input %s --output %s --verify --verbose %s 2>&1",
                 CLFFN_RUN_PATH, w, x, y, list);
        cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
        cr_assert(strstr(out, "PASS") && strstr(out, "experts over 3 devices"), "%s", out);
        cr_assert(strstr(out, "device 0: ") && strstr(out, "experts [0, 2), the router") &&
                      strstr(out, "device 1: ") && strstr(out, "experts [2, 3)") &&
                      strstr(out, "device 2: ") && strstr(out, "experts [3, 4)"),
                  "%s", out);
        float *split = npy_values(y, 6 * D), *one = npy_values(y1, 6 * D);
        cr_assert(!memcmp(split, one, 6 * D * sizeof *one), "split and unsplit outputs differ");
        free(split), free(one);
        if (types[i] == CLFFN_DTYPE_F32) {
            for (size_t e = 0; e < E; ++e) {
                m[3 * e] = vals[0] + e * F * D, m[3 * e + 1] = vals[1] + e * F * D;
                m[3 * e + 2] = vals[2] + e * D * F;
            }
            check_output(y, x, router, m, 3, CLFFN_ROUTING_TOPK_NORMALIZED);
            check_stacked_grads(w, x, y, router, m, list);
        }
        free(router);
        for (int j = 0; j < 3; ++j) { free(vals[j]); }
    }
    /* refused before any device is opened, and no output left behind */
    remove(y);
    const char *bad[4] = {"--expert-devices 0:0,,0:0", "--expert-devices 0:0 --device 0:0",
                          "--expert-devices 0:0,0:0,0:0,0:0,0:0",
                          "--expert-devices 0:0,0:0 --expert-parallel"};
    const char *why[4] = {"--expert-devices takes device SPECs", "leave out --device",
                          "names 5 devices for a layer of 4 experts", "take one"};
    for (int i = 0; i < 4; ++i) {
        snprintf(cmd, sizeof cmd, "'%s' --weights %s --input %s --output %s %s 2>&1",
                 CLFFN_RUN_PATH, w, x, y, bad[i]);
        cr_assert_eq(run(cmd, out, sizeof out), 2, "%s", out);
        cr_assert(strstr(out, why[i]), "%s", out);
        cr_assert_null(fopen(y, "rb"), "a refused run left an output");
    }
    float *router, *m[3 * E]; /* Mixtral's names read as a dense llama layer */
    snprintf(w, sizeof w, "%s/m.safetensors", dir);
    mixtral_checkpoint(w, &router, m);
    free_values(router, m);
    snprintf(cmd, sizeof cmd, "'%s' --weights %s --preset llama --input %s --output %s %s 2>&1",
             CLFFN_RUN_PATH, w, x, y, list);
    cr_assert_eq(run(cmd, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "is a dense FFN: --expert-devices"), "%s", out);
    cr_assert_null(fopen(y, "rb"), "a refused run left an output");
    remove_dir();
}

Test(clffn_run_moe, refusals, .timeout = 60) {
    make_dir();
    char w[128], x[128], y[128], cmd[1024], out[4096];
    snprintf(x, sizeof x, "%s/x.npy", dir), snprintf(y, sizeof y, "%s/y.npy", dir);
    float *router, *m[3 * E];
    write_input(x);
    snprintf(w, sizeof w, "%s/m.safetensors", dir);
    mixtral_checkpoint(w, &router, m);
    free_values(router, m);
    snprintf(cmd, sizeof cmd,
             "'%s' --weights %s --preset mixtral --top-k 5 --input %s --output %s 2>&1",
             CLFFN_RUN_PATH, w, x, y);
    cr_assert_eq(run(cmd, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "top-k 5 for 4 experts"), "%s", out);
    snprintf(cmd, sizeof cmd,
             "'%s' --weights %s --preset mixtral --moe-counts sometimes --input %s --output %s "
             "2>&1",
             CLFFN_RUN_PATH, w, x, y);
    cr_assert_eq(run(cmd, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "--moe-counts takes device, host or auto, not 'sometimes'"), "%s", out);
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
    float *router, *m[3 * E], *dy = write_tokens(dyp, 77);
    mixtral_checkpoint(w, &router, m);
    write_input(x);
    char err[CLFFN_IO_ERR];
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

/* ---- Qwen2-MoE: a shared expert of its own width FS behind a sigmoid gate ------------------ */
enum { FS = 96 };

/* The values of a Qwen2-MoE layer: router rows E + 1 (the shared expert's gate last; one more
 * row for a gate of a wrong shape), expert e's gate, up, down at m[3e …], the shared expert's
 * at m[3E …]. */
static void qwen_values(float **router, float **m) {
    *router = exact_values((E + 2) * D, 0.25f, 3);
    for (size_t e = 0; e <= E; ++e) {
        const size_t f = e < E ? F : FS;
        for (int i = 0; i < 3; ++i) { m[3 * e + i] = exact_values(D * f, 0.25f, 40 + 3 * e + i); }
    }
}

static void qwen_free(float *router, float **m) {
    free(router);
    for (size_t i = 0; i < 3 * (E + 1); ++i) { free(m[i]); }
}

/* Qwen2-MoE's safetensors names; bad_gate writes the gate as [2, D]. */
static void qwen_checkpoint(const char *path, int bad_gate, const float *router, float **m) {
    tensor ts[3 * (E + 1) + 2];
    size_t n = 0;
    ts[n++] = (tensor){"model.layers.0.mlp.gate.weight", "F32", 2, {E, D}, router};
    static const char *const part[3] = {"gate_proj", "up_proj", "down_proj"};
    for (size_t e = 0; e <= E; ++e) {
        const uint64_t f = e < E ? F : FS;
        for (int i = 0; i < 3; ++i) {
            tensor t = {"", "F32", 2, {i < 2 ? f : D, i < 2 ? D : f}, m[3 * e + i]};
            if (e < E) {
                snprintf(t.name, sizeof t.name, "model.layers.0.mlp.experts.%zu.%s.weight", e,
                         part[i]);
            } else {
                snprintf(t.name, sizeof t.name, "model.layers.0.mlp.shared_expert.%s.weight",
                         part[i]);
            }
            ts[n++] = t;
        }
    }
    ts[n++] = (tensor){"model.layers.0.mlp.shared_expert_gate.weight",
                       "F32",
                       2,
                       {bad_gate ? 2 : 1, D},
                       router + E * D};
    write_checkpoint(path, ts, n);
}

/* The reference layer: top-2, the softmax weights as they are, the gated shared expert. */
static clffn_moe_config qwen_config(clffn_host_weights *hw, float *const *m) {
    clffn_moe_config c = clffn_moe_config_default(D, F, E, 2);
    c.routing = CLFFN_ROUTING_TOPK;
    c.shared_expert = 1, c.shared_d_ff = FS, c.shared_gate = 1;
    for (size_t e = 0; e <= E; ++e) {
        hw[e] = (clffn_host_weights){m[3 * e], NULL, m[3 * e + 1], NULL, m[3 * e + 2], NULL};
    }
    return c;
}

/* y.npy against the reference of the values the test wrote. */
static void check_qwen_output(const char *y_path, const char *x_path, const float *router,
                              float *const *m) {
    clffn_npy x = {0}, y = {0};
    char err[CLFFN_IO_ERR];
    cr_assert_eq(clffn_npy_load(x_path, &x, err), 0, "%s", err);
    cr_assert_eq(clffn_npy_load(y_path, &y, err), 0, "%s", err);
    clffn_host_weights hw[E + 1];
    const clffn_moe_config c = qwen_config(hw, m);
    double ref[6 * D];
    ASSERT_OK(clffn_moe_reference_forward(&c, CLFFN_LAYOUT_OUT_IN, router, NULL, hw, 6, x.data, ref,
                                          NULL, NULL));
    assert_close(y.data, ref, 6 * D, TOL_RTOL, y_path);
    clffn_npy_free(&x), clffn_npy_free(&y);
}

/* --preset qwen_moe: the output, and the gradients of the router, the shared expert's gate, its
 * matrices and x under the file's names, against the double reference; a gate of another shape
 * is refused by name. */
Test(clffn_run_moe, qwen2_moe_gated_shared_expert, .timeout = 120) {
    make_dir();
    char w[128], x[128], y[128], dyp[128], g[128], cmd[1024], out[4096], err[CLFFN_IO_ERR];
    snprintf(w, sizeof w, "%s/q.safetensors", dir), snprintf(x, sizeof x, "%s/x.npy", dir);
    snprintf(y, sizeof y, "%s/y.npy", dir), snprintf(dyp, sizeof dyp, "%s/dy.npy", dir);
    snprintf(g, sizeof g, "%s/g.safetensors", dir);
    float *router, *m[3 * (E + 1)], *dy = write_tokens(dyp, 79);
    qwen_values(&router, m);
    qwen_checkpoint(w, 0, router, m);
    write_input(x);
    snprintf(cmd, sizeof cmd,
             "'%s' --weights %s --preset qwen_moe --input %s --output %s --verify "
             "--grad-output %s --grads-out %s 2>&1",
             CLFFN_RUN_PATH, w, x, y, dyp, g);
    cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "PASS") && strstr(out, "and a shared one behind a gate") &&
                  strstr(out, "as they are") && strstr(out, "gradients: 17 tensors"),
              "%s", out);
    check_qwen_output(y, x, router, m);
    clffn_npy xv = {0};
    cr_assert_eq(clffn_npy_load(x, &xv, err), 0, "%s", err);
    clffn_host_weights hw[E + 1];
    const clffn_moe_config c = qwen_config(hw, m);
    clffn_ref_grads rg[E + 1];
    double dx[6 * D], drouter[(E + 1) * D];
    double *dm = malloc((3 * E * F * D + 3 * FS * D) * sizeof *dm);
    for (size_t e = 0; e <= E; ++e) {
        double *b = dm + 3 * e * F * D;
        const size_t f = e < E ? F : FS;
        rg[e] = (clffn_ref_grads){b, NULL, b + f * D, NULL, b + 2 * f * D, NULL};
    }
    ASSERT_OK(clffn_moe_reference_backward(&c, CLFFN_LAYOUT_OUT_IN, router, NULL, hw, 6, xv.data,
                                           dy, dx, drouter, NULL, rg));
    clffn_st_file gf;
    cr_assert_eq(clffn_st_open(g, &gf, err), 0, "%s", err);
    check_grad(&gf, "model.layers.0.mlp.gate.weight", drouter, E * D);
    check_grad(&gf, "model.layers.0.mlp.shared_expert_gate.weight", drouter + E * D, D);
    check_grad(&gf, "input", dx, 6 * D);
    check_grad(&gf, "model.layers.0.mlp.experts.1.up_proj.weight", rg[1].v, F * D);
    static const char *const part[3] = {"gate_proj", "up_proj", "down_proj"};
    for (int i = 0; i < 3; ++i) {
        char name[96];
        snprintf(name, sizeof name, "model.layers.0.mlp.shared_expert.%s.weight", part[i]);
        check_grad(&gf, name, dm + 3 * E * F * D + (size_t)i * FS * D, FS * D);
    }
    clffn_st_close(&gf);
    qwen_checkpoint(w, 1, router, m);
    cr_assert_eq(run(cmd, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "shared_expert_gate.weight' is not of shape [1, d_model]"), "%s", out);
    clffn_npy_free(&xv);
    free(dm), free(dy);
    qwen_free(router, m);
    remove_dir();
}

/* A GGUF qwen2moe layer (llama.cpp's names: the experts stacked, ffn_*_shexp, the gate
 * ffn_gate_inp_shexp of one dimension); gating: a {arch}.expert_gating_func to write (0: none). */
static void qwen_gguf(const char *path, const float *router, float *const *m, uint64_t gating) {
    float *st[3];
    for (int i = 0; i < 3; ++i) { /* expert e's block at e */
        st[i] = malloc((size_t)E * F * D * sizeof(float));
        for (size_t e = 0; e < E; ++e) { memcpy(st[i] + e * F * D, m[3 * e + i], F * D * 4); }
    }
    const gw_kv kvs[3] = {{"general.architecture", 8, 0, "qwen2moe"},
                          {"qwen2moe.expert_used_count", 4, 2, NULL},
                          {"qwen2moe.expert_gating_func", 4, gating, NULL}};
    const size_t fd = F * D * 4, sd = FS * D * 4;
    const gw_tensor ts[8] = {
        {"blk.0.ffn_gate_inp.weight", CLFFN_GGML_F32, 2, {D, E}, router, E * D * 4, 0},
        {"blk.0.ffn_gate_exps.weight", CLFFN_GGML_F32, 3, {D, F, E}, st[0], E * fd, 0},
        {"blk.0.ffn_up_exps.weight", CLFFN_GGML_F32, 3, {D, F, E}, st[1], E * fd, 0},
        {"blk.0.ffn_down_exps.weight", CLFFN_GGML_F32, 3, {F, D, E}, st[2], E * fd, 0},
        {"blk.0.ffn_gate_shexp.weight", CLFFN_GGML_F32, 2, {D, FS}, m[3 * E], sd, 0},
        {"blk.0.ffn_up_shexp.weight", CLFFN_GGML_F32, 2, {D, FS}, m[3 * E + 1], sd, 0},
        {"blk.0.ffn_down_shexp.weight", CLFFN_GGML_F32, 2, {FS, D}, m[3 * E + 2], sd, 0},
        {"blk.0.ffn_gate_inp_shexp.weight", CLFFN_GGML_F32, 1, {D}, router + E * D, D * 4, 0}};
    size_t len;
    uint8_t *img = gw_image(3, 32, kvs, gating ? 3 : 2, ts, 8, &len);
    cr_assert_eq(gw_write(path, img, len), 0);
    free(img);
    for (int i = 0; i < 3; ++i) { free(st[i]); }
}

/* qwen2moe from GGUF: found without a preset, its weights as they are (llama.cpp's for this
 * architecture), the gated shared expert; the output against the reference of the values the
 * test wrote. A sigmoid gating function (DeepSeek-V3's) is refused by name. */
Test(clffn_run_moe, gguf_qwen2moe_gated_shared_expert, .timeout = 120) {
    make_dir();
    char w[128], x[128], y[128], r[128], cmd[1024], out[4096];
    snprintf(w, sizeof w, "%s/q.gguf", dir), snprintf(x, sizeof x, "%s/x.npy", dir);
    snprintf(y, sizeof y, "%s/y.npy", dir), snprintf(r, sizeof r, "%s/r.npy", dir);
    float *router, *m[3 * (E + 1)];
    qwen_values(&router, m);
    qwen_gguf(w, router, m, 0);
    write_input(x);
    snprintf(cmd, sizeof cmd,
             "'%s' --weights %s --input %s --output %s --verify --router-out %s 2>&1",
             CLFFN_RUN_PATH, w, x, y, r);
    cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "PASS") && strstr(out, "behind a gate") && strstr(out, "as they are"),
              "%s", out);
    check_routing(r, 2, 0);
    check_qwen_output(y, x, router, m);
    qwen_gguf(w, router, m, 2);
    cr_assert_eq(run(cmd, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "gating function 2"), "%s", out);
    qwen_free(router, m);
    remove_dir();
}

/* clffn-bench's JSON for 8 experts, top-2, at one token of 32 -> 64 SwiGLU in f16 with `extra`
 * options, into out: it must run, read the two experts the token chose, and print `want`. */
static void bench_moe_json(const char *extra, const char *want, char *out, size_t size) {
    char cmd[512], err[4096];
    snprintf(cmd, sizeof cmd,
             "'%s' --json --experts 8 --top-k 2 --tokens 1 --d-model 32 --d-ff 64 "
             "--activation swiglu --weights-dtype f16 --reps 2 %s",
             CLFFN_BENCH_PATH, extra);
    cr_assert_eq(run_split(cmd, out, size, err, sizeof err), 0, "%s%s", out, err);
    cr_assert(strstr(out, want) != NULL, "%s: %s", extra, out);
    cr_assert(strstr(out, "\"experts_read\": 2,") != NULL, "%s: %s", extra, out);
}

/* clffn-bench --experts --moe-counts: the layer runs in each mode, says which in its JSON with
 * what the forward did (the counts kept on the device at one token but where asked for on the
 * host, or by auto with E = 8 > T·k = 2), and reads the two experts one token chose, as the
 * device counts do. */
Test(clffn_bench, moe_counts, .timeout = 120) {
    static const char *modes[] = {"device", "host", "auto"};
    for (int i = 0; i < 3; ++i) {
        char extra[64], want[96], out[4096];
        snprintf(extra, sizeof extra, "--moe-counts %s", modes[i]);
        snprintf(want, sizeof want, "\"counts\": \"%s\", \"counts_kept\": %s", modes[i],
                 i == 0 ? "true" : "false");
        bench_moe_json(extra, want, out, sizeof out);
    }
}

/* --moe-grouping: experts at one token (clffn's own kernels, the counts on the device) run
 * grouped unless it is off, and the JSON says which ran; the layer reads the same experts. */
Test(clffn_bench, moe_grouping, .timeout = 120) {
    char out[4096], err[4096], cmd[512];
    bench_moe_json("--moe-grouping on", "\"grouped\": true}", out, sizeof out);
    bench_moe_json("--moe-grouping off", "\"grouped\": false}", out, sizeof out);
    snprintf(cmd, sizeof cmd, "'%s' --experts 8 --moe-grouping sideways", CLFFN_BENCH_PATH);
    cr_assert_eq(run_split(cmd, out, sizeof out, err, sizeof err), 2, "%s%s", out, err);
    cr_assert(strstr(err, "--moe-grouping takes on or off") != NULL, "%s", err);
    snprintf(cmd, sizeof cmd, "'%s' --moe-grouping off", CLFFN_BENCH_PATH);
    cr_assert_eq(run_split(cmd, out, sizeof out, err, sizeof err), 2, "%s%s", out, err);
    cr_assert(strstr(err, "go with --experts") != NULL, "%s", err);
}

/* The number after "key": in clffn-bench's one-line JSON for a layer. */
static double field(const char *json, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *at = strstr(json, pat);
    cr_assert(at != NULL, "no '%s' in %s", key, json);
    return strtod(at + strlen(pat), NULL);
}

/* --experts: the layer's JSON, its experts read no more than the tokens could choose, and the
 * same-work comparison with the dense FFN; the same layer split over three contexts. */
Test(clffn_bench, experts_report, .timeout = 120) {
    char out[4096], err[4096], cmd[512];
    snprintf(cmd, sizeof cmd,
             "'%s' --json --experts 6 --top-k 2 --tokens 1 --d-model 16 --d-ff 32 "
             "--activation swiglu --reps 2",
             CLFFN_BENCH_PATH);
    cr_assert_eq(run_split(cmd, out, sizeof out, err, sizeof err), 0, "%s%s", out, err);
    cr_assert_eq(field(out, "experts"), 6);
    cr_assert_eq(field(out, "top_k"), 2);
    cr_assert_eq(field(out, "experts_read"), 2, "one token reads its two experts: %s", out);
    /* two experts' W1, V and W2 of 16·32 f32 weights each, and the router's 6·16 */
    cr_assert_eq(field(out, "weights_read_bytes"), 2 * 4 * (3 * 16 * 32) + 4 * 6 * 16, "%s%s", out,
                 err);
    cr_assert_eq(field(out, "dense_rows"), 1);
    cr_assert(field(out, "rows_most") == 1 && field(out, "rows_fewest") == 0,
              "one token: a row for each of its two experts, none for the other four: %s", out);
    cr_assert(field(out, "best_s") > 0 && field(out, "speed_vs_dense") > 0);
    snprintf(cmd, sizeof cmd, /* 80 rows over 6 experts: at least 14 for one, at most 13 for
                               * another; an expert takes a token once */
             "'%s' --json --experts 6 --top-k 2 --tokens 40 --d-model 16 --d-ff 32 "
             "--activation swiglu --reps 2",
             CLFFN_BENCH_PATH);
    cr_assert_eq(run_split(cmd, out, sizeof out, err, sizeof err), 0, "%s%s", out, err);
    cr_assert_eq(field(out, "dense_rows"), 14, "%s", out);
    cr_assert(field(out, "rows_most") >= 14 && field(out, "rows_most") <= 40, "%s", out);
    cr_assert(field(out, "rows_fewest") <= 13, "%s", out);
    snprintf(cmd, sizeof cmd, /* the experts over three contexts: the same experts read */
             "'%s' --json --experts 6 --expert-split 3 --tokens 1 --d-model 16 --d-ff 32 "
             "--activation swiglu --reps 2",
             CLFFN_BENCH_PATH);
    cr_assert_eq(run_split(cmd, out, sizeof out, err, sizeof err), 0, "%s%s", out, err);
    cr_assert(field(out, "contexts") == 3 && field(out, "experts_read") == 2, "%s", out);
    cr_assert(strstr(out, "\"bias\": true,") != NULL, "the seeds' biases: %s", out);
    /* experts without biases (Mixtral's, Qwen's), in f16: uploaded without them */
    bench_moe_json("--bias off", "\"bias\": false,", out, sizeof out);
    snprintf(cmd, sizeof cmd, "'%s' --experts 2 --top-k 3 2>&1", CLFFN_BENCH_PATH);
    cr_assert_eq(run(cmd, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "--top-k from 1 to E") != NULL, "%s", out);
    snprintf(cmd, sizeof cmd, "'%s' --experts 2 --expert-split 3 2>&1", CLFFN_BENCH_PATH);
    cr_assert_eq(run(cmd, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "1 to E contexts") != NULL, "%s", out);
}
