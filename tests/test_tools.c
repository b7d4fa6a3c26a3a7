/* The command-line tools end to end: clffn-run on small checkpoints of every preset (F32, F16,
 * BF16 and F64 weights) against the CPU reference, its refusals and exit codes, and
 * clffn-devices in both formats, with --check and with no platform at all. */
#include "clffn_io.h"
#include "common.h"
#include "tools_common.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------ */
/* Presets end to end */

typedef struct preset_case {
    const char *preset;
    const char *dtype;
    int layer;
    const char *w1, *b1, *v, *bv, *w2, *b2; /* NULL: absent */
    clffn_layout layout;
    clffn_activation act;
    int gated;
    const char *extra_args;
} preset_case;

/* A preset case's layer, as written to its checkpoint and as the reference sees it. */
enum { PD = 12, PF = 28, PT = 6 };
typedef struct preset_layer {
    float *w1, *v, *w2, *b1, *bv, *b2;
    clffn_config c;
    clffn_host_weights hw;
} preset_layer;

static void preset_layer_make(preset_layer *L, const preset_case *pc) {
    L->w1 = exact_values(PD * PF, 0.5f, 1), L->v = exact_values(PD * PF, 0.5f, 2);
    L->w2 = exact_values(PD * PF, 0.25f, 3), L->b1 = exact_values(PF, 0.5f, 4);
    L->bv = exact_values(PF, 0.5f, 5), L->b2 = exact_values(PD, 0.5f, 6);
    L->c = clffn_config_default(PD, PF);
    L->c.activation = pc->act;
    L->c.gated = pc->gated;
    L->c.bias1 = pc->b1 != NULL;
    L->c.bias_gate = pc->bv != NULL;
    L->c.bias2 = pc->b2 != NULL;
    L->c.residual = pc->extra_args && strstr(pc->extra_args, "--residual") != NULL;
    L->hw = (clffn_host_weights){
        L->w1, pc->b1 ? L->b1 : NULL, pc->gated ? L->v : NULL, pc->bv ? L->bv : NULL,
        L->w2, pc->b2 ? L->b2 : NULL};
}

static void preset_layer_free(preset_layer *L) {
    free(L->w1), free(L->v), free(L->w2), free(L->b1), free(L->bv), free(L->b2);
}

/* The layer's tensors under the preset's names (in the case's dtype), and an unrelated tensor
 * of another layer, as a real checkpoint has. */
static void write_preset_checkpoint(const char *path, const preset_case *pc,
                                    const preset_layer *L) {
    const int oi = pc->layout == CLFFN_LAYOUT_OUT_IN;
    const struct {
        const char *name;
        size_t rank;
        uint64_t s0, s1;
        const float *vals;
    } parts[6] = {{pc->w1, 2, oi ? PF : PD, oi ? PD : PF, L->w1}, {pc->b1, 1, PF, 0, L->b1},
                  {pc->v, 2, oi ? PF : PD, oi ? PD : PF, L->v},   {pc->bv, 1, PF, 0, L->bv},
                  {pc->w2, 2, oi ? PD : PF, oi ? PF : PD, L->w2}, {pc->b2, 1, PD, 0, L->b2}};
    tensor ts[8];
    size_t n = 0;
    for (int i = 0; i < 6; ++i) {
        if (!parts[i].name) { continue; }
        ts[n] = (tensor){"", pc->dtype, parts[i].rank, {parts[i].s0, parts[i].s1}, parts[i].vals};
        snprintf(ts[n].name, sizeof ts[n].name, parts[i].name, pc->layer);
        ++n;
    }
    static const float other[3] = {1, 2, 3};
    ts[n++] = (tensor){"unrelated.tensor", "F32", 1, {3, 0}, other};
    write_checkpoint(path, ts, n);
}

/* The gradient file holds every tensor's gradient under the checkpoint's names, and 'input',
 * each equal to the reference backward's; nothing else. */
/* Whether the case's matrices stay in their 16-bit type on the device (the default for F16 and
 * BF16 checkpoints): then they have no gradients, and clffn-run says it skipped them. */
static int kept_compressed(const preset_case *pc) {
    return (!strcmp(pc->dtype, "F16") || !strcmp(pc->dtype, "BF16")) &&
           !(pc->extra_args && strstr(pc->extra_args, "--weights-dtype f32"));
}

static void check_preset_grads(const char *gpath, const preset_case *pc, const preset_layer *L,
                               const float *x, const float *dy) {
    double rw1[PD * PF], rv[PD * PF], rw2[PD * PF], rb1[PF], rbv[PF], rb2[PD], rdx[PT * PD];
    const clffn_ref_grads rg = {rw1, rb1, rv, rbv, rw2, rb2};
    ASSERT_OK(clffn_reference_backward(&L->c, pc->layout, &L->hw, PT, x, dy, 0, 0, 0, rdx, &rg));
    char err[CLFFN_IO_ERR];
    clffn_st_file gf;
    cr_assert_eq(clffn_st_open(gpath, &gf, err), 0, "%s", err);
    const struct {
        const char *pattern;
        const double *ref;
        size_t n;
    } want[] = {{pc->w1, rw1, PD * PF}, {pc->b1, rb1, PF},      {pc->v, rv, PD * PF},
                {pc->bv, rbv, PF},      {pc->w2, rw2, PD * PF}, {pc->b2, rb2, PD},
                {"input", rdx, PT * PD}};
    size_t found = 0;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; ++i) {
        if (!want[i].pattern) { continue; }
        char name[96];
        snprintf(name, sizeof name, want[i].pattern, pc->layer);
        const clffn_st_tensor *t = clffn_st_find(&gf, name);
        if (kept_compressed(pc) && (i == 0 || i == 2 || i == 4)) {
            cr_assert_null(t, "%s: a gradient of '%s', kept compressed", pc->preset, name);
            continue;
        }
        cr_assert_not_null(t, "%s: no gradient '%s'", pc->preset, name);
        cr_assert_eq(t->numel, want[i].n);
        float *g = malloc(want[i].n * sizeof *g);
        cr_assert_eq(clffn_st_read_f32(&gf, t, g, err), 0);
        char what[160];
        snprintf(what, sizeof what, "%s gradient %s", pc->preset, name);
        assert_close(g, want[i].ref, want[i].n, act_rtol(pc->act), what);
        free(g);
        ++found;
    }
    cr_assert_eq(gf.count, found, "%s: %zu tensors in the gradient file, %zu expected", pc->preset,
                 gf.count, found);
    clffn_st_close(&gf);
}

/* clffn-run on a checkpoint of the case's preset: its output (rank 3, the leading shape kept)
 * and gradients against the reference. */
static void run_preset(const preset_case *pc) {
    make_dir();
    preset_layer L;
    preset_layer_make(&L, pc);
    char wpath[128], xpath[128], ypath[128], dypath[128], gpath[128], cmd[1400], out[8192];
    snprintf(wpath, sizeof wpath, "%s/model.safetensors", dir);
    snprintf(xpath, sizeof xpath, "%s/x.npy", dir);
    snprintf(ypath, sizeof ypath, "%s/y.npy", dir);
    snprintf(dypath, sizeof dypath, "%s/dy.npy", dir);
    snprintf(gpath, sizeof gpath, "%s/grads.safetensors", dir);
    write_preset_checkpoint(wpath, pc, &L);
    const uint64_t xshape[3] = {2, 3, PD}; /* an input of rank 3 */
    float x[PT * PD], dy[PT * PD];
    fill_uniform(x, PT * PD, -1, 1, 9);
    fill_uniform(dy, PT * PD, -1, 1, 10);
    char err[CLFFN_IO_ERR];
    cr_assert_eq(clffn_npy_save(xpath, x, 3, xshape, err), 0, "%s", err);
    cr_assert_eq(clffn_npy_save(dypath, dy, 3, xshape, err), 0, "%s", err);
    snprintf(cmd, sizeof cmd,
             "'%s' --weights '%s' --input '%s' --output '%s' --preset %s --layer %d --verify "
             "--grad-output '%s' --grads-out '%s' %s",
             CLFFN_RUN_PATH, wpath, xpath, ypath, pc->preset, pc->layer, dypath, gpath,
             pc->extra_args ? pc->extra_args : "");
    const int rc = run(cmd, out, sizeof out);
    cr_assert_eq(rc, 0, "%s %s: exit %d:\n%s", pc->preset, pc->dtype, rc, out);
    cr_assert(strstr(out, "PASS") != NULL, "%s", out);
    cr_assert_eq(strstr(out, "gradients skipped: ") != NULL, kept_compressed(pc), "%s", out);
    clffn_npy y;
    cr_assert_eq(clffn_npy_load(ypath, &y, err), 0, "%s", err);
    cr_assert_eq(y.rank, 3, "output keeps the leading shape");
    for (int k = 0; k < 3; ++k) { cr_assert_eq(y.shape[k], xshape[k]); }
    double ref[PT * PD];
    ASSERT_OK(clffn_reference_forward(&L.c, pc->layout, &L.hw, PT, x, 0, 0, 0, ref, NULL));
    assert_mostly_nonzero(ref, PT * PD, 0.9, pc->preset);
    assert_close(y.data, ref, PT * PD, act_rtol(pc->act), pc->preset);
    clffn_npy_free(&y);
    check_preset_grads(gpath, pc, &L, x, dy);
    preset_layer_free(&L);
    remove_dir();
}

Test(clffn_run, preset_annotated_f32) {
    run_preset(&(preset_case){"annotated", "F32", 0, "w_1.weight", "w_1.bias", NULL, NULL,
                              "w_2.weight", "w_2.bias", CLFFN_LAYOUT_OUT_IN, CLFFN_ACT_RELU, 0,
                              NULL});
}
Test(clffn_run, preset_annotated_residual_gelu_override) {
    run_preset(&(preset_case){"annotated", "F32", 0, "w_1.weight", "w_1.bias", NULL, NULL,
                              "w_2.weight", "w_2.bias", CLFFN_LAYOUT_OUT_IN, CLFFN_ACT_GELU, 0,
                              "--residual --activation gelu"});
}
Test(clffn_run, preset_labml_gated_f16) {
    run_preset(&(preset_case){"labml", "F16", 0, "layer1.weight", "layer1.bias", "linear_v.weight",
                              "linear_v.bias", "layer2.weight", "layer2.bias", CLFFN_LAYOUT_OUT_IN,
                              CLFFN_ACT_RELU, 1, NULL});
}
Test(clffn_run, preset_labml_plain_no_bias2) {
    run_preset(&(preset_case){"labml", "F32", 0, "layer1.weight", "layer1.bias", NULL, NULL,
                              "layer2.weight", NULL, CLFFN_LAYOUT_OUT_IN, CLFFN_ACT_RELU, 0, NULL});
}
Test(clffn_run, preset_gpt2_f64_layer3) {
    run_preset(&(preset_case){"gpt2", "F64", 3, "h.%d.mlp.c_fc.weight", "h.%d.mlp.c_fc.bias", NULL,
                              NULL, "h.%d.mlp.c_proj.weight", "h.%d.mlp.c_proj.bias",
                              CLFFN_LAYOUT_IN_OUT, CLFFN_ACT_GELU_TANH, 0, NULL});
}
Test(clffn_run, preset_gpt2_transformer_prefix) {
    run_preset(&(preset_case){
        "gpt2", "F32", 0, "transformer.h.%d.mlp.c_fc.weight", "transformer.h.%d.mlp.c_fc.bias",
        NULL, NULL, "transformer.h.%d.mlp.c_proj.weight", "transformer.h.%d.mlp.c_proj.bias",
        CLFFN_LAYOUT_IN_OUT, CLFFN_ACT_GELU_TANH, 0, NULL});
}
Test(clffn_run, preset_bert_f16_layer1) {
    run_preset(&(preset_case){"bert", "F16", 1, "bert.encoder.layer.%d.intermediate.dense.weight",
                              "bert.encoder.layer.%d.intermediate.dense.bias", NULL, NULL,
                              "bert.encoder.layer.%d.output.dense.weight",
                              "bert.encoder.layer.%d.output.dense.bias", CLFFN_LAYOUT_OUT_IN,
                              CLFFN_ACT_GELU, 0, NULL});
}
Test(clffn_run, preset_llama_bf16_as_f32_with_weight_gradients) {
    run_preset(&(preset_case){"llama", "BF16", 1, "model.layers.%d.mlp.gate_proj.weight", NULL,
                              "model.layers.%d.mlp.up_proj.weight", NULL,
                              "model.layers.%d.mlp.down_proj.weight", NULL, CLFFN_LAYOUT_OUT_IN,
                              CLFFN_ACT_SILU, 1, "--weights-dtype f32"});
}
Test(clffn_run, preset_llama_bf16) {
    run_preset(&(preset_case){"llama", "BF16", 2, "model.layers.%d.mlp.gate_proj.weight", NULL,
                              "model.layers.%d.mlp.up_proj.weight", NULL,
                              "model.layers.%d.mlp.down_proj.weight", NULL, CLFFN_LAYOUT_OUT_IN,
                              CLFFN_ACT_SILU, 1, NULL});
}

/* ------------------------------------------------------------------------------------------ */
/* Refusals: exit 2 for usage and bad files, one line naming the file, no output left behind */

static void expect_refusal(const char *args, int want_rc, const char *needle, const char *ypath) {
    char cmd[2048], out[4096];
    snprintf(cmd, sizeof cmd, "'%s' %s", CLFFN_RUN_PATH, args);
    const int rc = run(cmd, out, sizeof out);
    cr_assert_eq(rc, want_rc, "%s: exit %d, want %d:\n%s", args, rc, want_rc, out);
    cr_assert(strstr(out, needle) != NULL, "%s: output lacks '%s':\n%s", args, needle, out);
    if (ypath) {
        struct stat sb;
        cr_assert(stat(ypath, &sb) != 0, "%s: an output was left behind", args);
    }
}

Test(clffn_run, refusals) {
    make_dir();
    enum { D = 8, F = 16 };
    float *w1 = exact_values(D * F, 0.5f, 1), *w2 = exact_values(D * F, 0.5f, 2);
    const tensor ts[2] = {{"w_1.weight", "F32", 2, {F, D}, w1},
                          {"w_2.weight", "F32", 2, {D, F}, w2}};
    char w[128], x[128], x_bad[128], y[128], trunc[128], args[1024], err[CLFFN_IO_ERR];
    snprintf(w, sizeof w, "%s/m.safetensors", dir);
    snprintf(x, sizeof x, "%s/x.npy", dir);
    snprintf(x_bad, sizeof x_bad, "%s/x_bad.npy", dir);
    snprintf(y, sizeof y, "%s/y.npy", dir);
    snprintf(trunc, sizeof trunc, "%s/trunc.safetensors", dir);
    write_checkpoint(w, ts, 2);
    float xv[4 * (D + 1)] = {0}; /* room for x_bad, one column wider */
    const uint64_t xs[2] = {4, D}, xbs[2] = {4, D + 1};
    cr_assert_eq(clffn_npy_save(x, xv, 2, xs, err), 0);
    cr_assert_eq(clffn_npy_save(x_bad, xv, 2, xbs, err), 0);
    /* a truncated copy of the checkpoint */
    snprintf(args, sizeof args, "head -c 100 '%s' > '%s'", w, trunc);
    cr_assert_eq(system(args), 0);

    expect_refusal("--bogus", 2, "unknown option '--bogus'", NULL);
    expect_refusal("--weights only.safetensors", 2, "go together", NULL);
    expect_refusal("--activation gelu", 2, "--weights", NULL);
    snprintf(args, sizeof args, "--weights '%s' --input '%s' --output '%s' --grad-output '%s'", w,
             x, y, x);
    expect_refusal(args, 2, "go together", y);
    snprintf(args, sizeof args,
             "--weights '%s' --input '%s' --output '%s' --grad-output '%s' "
             "--grads-out '%s/g.safetensors'",
             w, x, y, x_bad, dir);
    expect_refusal(args, 2, "x_bad.npy: shape differs", y);
    snprintf(args, sizeof args, "--weights '%s' --input '%s' --output '%s' --preset nope", w, x, y);
    expect_refusal(args, 2, "unknown preset", y);
    snprintf(args, sizeof args, "--weights '%s' --input '%s' --output '%s' --dropout 1.5", w, x, y);
    expect_refusal(args, 2, "--dropout", y);
    snprintf(args, sizeof args, "--weights '%s' --input '%s' --output '%s'", trunc, x, y);
    expect_refusal(args, 2, "trunc.safetensors: ", y);
    snprintf(args, sizeof args, "--weights '%s/missing.safetensors' --input '%s' --output '%s'",
             dir, x, y);
    expect_refusal(args, 2, "missing.safetensors: cannot open", y);
    snprintf(args, sizeof args, "--weights '%s' --input '%s' --output '%s' --preset labml", w, x,
             y);
    expect_refusal(args, 2, "no tensor 'layer1.weight'", y);
    snprintf(args, sizeof args, "--weights '%s' --input '%s' --output '%s' --gated", w, x, y);
    expect_refusal(args, 2, "no gate tensor", y);
    snprintf(args, sizeof args, "--weights '%s' --input '%s' --output '%s'", w, x_bad, y);
    expect_refusal(args, 2, "x_bad.npy: last dimension", y);
    snprintf(args, sizeof args, "--weights '%s' --input '%s' --output '%s'", w, w, y);
    expect_refusal(args, 2, "m.safetensors: not an .npy file", y); /* a checkpoint given as input */
    snprintf(args, sizeof args, "--weights '%s' --input '%s/nothing.npy' --output '%s'", w, dir, y);
    expect_refusal(args, 2, "nothing.npy: cannot open", y);
    snprintf(args, sizeof args, "--weights '%s' --input '%s' --output '%s/no/such/dir/y.npy'", w, x,
             dir);
    expect_refusal(args, 1, "y.npy: cannot", NULL);
    /* and a good run writes the output */
    snprintf(args, sizeof args, "'%s' --weights '%s' --input '%s' --output '%s'", CLFFN_RUN_PATH, w,
             x, y);
    cr_assert_eq(run(args, NULL, 0), 0);
    struct stat sb;
    cr_assert_eq(stat(y, &sb), 0);
    free(w1), free(w2);
    remove_dir();
}

/* ------------------------------------------------------------------------------------------ */
/* clffn-devices */

Test(clffn_devices, table_json_and_check) {
    char out[16384], err[4096], cmd[512];
    snprintf(cmd, sizeof cmd, "'%s'", CLFFN_DEVICES_PATH);
    cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "[0:0]") && strstr(out, "compute units") && strstr(out, "max allocation"),
              "%s", out);
    snprintf(cmd, sizeof cmd, "'%s' --json", CLFFN_DEVICES_PATH);
    cr_assert_eq(run_split(cmd, out, sizeof out, err, sizeof err), 0, "%s%s", out, err);
    cJSON *root = cJSON_Parse(out);
    cr_assert_not_null(root, "not JSON: %s%s", out, err);
    const cJSON *devs = cJSON_GetObjectItemCaseSensitive(root, "devices");
    cr_assert(cJSON_IsArray(devs) && cJSON_GetArraySize(devs) >= 1);
    const cJSON *d0 = cJSON_GetArrayItem(devs, 0);
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(d0, "index")->valuestring, "0:0");
    cr_assert(cJSON_GetObjectItemCaseSensitive(d0, "compute_units")->valuedouble >= 1);
    cr_assert(cJSON_GetObjectItemCaseSensitive(d0, "max_alloc_bytes")->valuedouble > 0);
    cr_assert(cJSON_IsBool(cJSON_GetObjectItemCaseSensitive(d0, "fp64")));
    cJSON_Delete(root);
    snprintf(cmd, sizeof cmd, "'%s' --check --json", CLFFN_DEVICES_PATH);
    cr_assert_eq(run_split(cmd, out, sizeof out, err, sizeof err), 0, "%s%s", out, err);
    root = cJSON_Parse(out);
    cr_assert_not_null(root, "not JSON: %s%s", out, err);
    d0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "devices"), 0);
    const cJSON *check = cJSON_GetObjectItemCaseSensitive(d0, "check");
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(check, "pass")), "%s%s", out, err);
    cr_assert(cJSON_GetObjectItemCaseSensitive(check, "max_error")->valuedouble <=
              cJSON_GetObjectItemCaseSensitive(check, "tolerance")->valuedouble);
    cJSON_Delete(root);
    snprintf(cmd, sizeof cmd, "'%s' --check", CLFFN_DEVICES_PATH);
    cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "PASS: max error") != NULL, "%s", out);
    snprintf(cmd, sizeof cmd, "'%s' --frobnicate", CLFFN_DEVICES_PATH);
    cr_assert_eq(run(cmd, out, sizeof out), 2, "%s", out);
}

Test(clffn_devices, no_platform) {
    char out[4096], cmd[512];
    snprintf(cmd, sizeof cmd, "OCL_ICD_VENDORS=/nonexistent-clffn '%s'", CLFFN_DEVICES_PATH);
    cr_assert_eq(run(cmd, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "no OpenCL platform") && strstr(out, "pocl-opencl-icd"), "%s", out);
    cr_assert(strchr(out, '\n') == out + strlen(out) - 1, "more than one line: %s", out);
    snprintf(cmd, sizeof cmd, "OCL_ICD_VENDORS=/nonexistent-clffn '%s'", CLFFN_RUN_PATH);
    cr_assert_eq(run(cmd, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "no OpenCL platform") != NULL, "%s", out);
}

/* ------------------------------------------------------------------------------------------ */
/* clffn-bench and clffn-tune */

/* clffn-bench's JSON document for `options` (prefix: an environment before the command, or ""),
 * its output in out; the run must succeed. */
static cJSON *bench_json(const char *prefix, const char *options, char *out, size_t size) {
    char err[4096], cmd[512];
    snprintf(cmd, sizeof cmd, "%s'%s' --json %s", prefix, CLFFN_BENCH_PATH, options);
    cr_assert_eq(run_split(cmd, out, size, err, sizeof err), 0, "%s%s", out, err);
    cJSON *o = cJSON_Parse(out);
    cr_assert_not_null(o, "not JSON: %s%s", out, err);
    return o;
}

/* OpenBLAS detecting an old core (as it does on a virtual CPU it does not know) is not the
 * measure: clffn-bench also runs the best core the CPU's flags allow, in a child, and keeps the
 * faster, naming both. */
static void assert_fair_cpu(void) {
    char out[16384];
    cJSON *o =
        bench_json("OPENBLAS_CORETYPE=Prescott ",
                   "--tokens 9 --d-model 24 --d-ff 64 --reps 3 --compare-cpu", out, sizeof out);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, "cpu_blas");
    const cJSON *det = cJSON_GetObjectItemCaseSensitive(c, "detected_core");
    const cJSON *forced = cJSON_GetObjectItemCaseSensitive(c, "forced_core");
    cr_assert(cJSON_IsString(det) && !strcmp(det->valuestring, "Prescott"), "%s", out);
    if (forced) { /* an x86-64 CPU with AVX2 or better */
        const double d = json_num(c, "detected_best_s"), f = json_num(c, "forced_best_s");
        cr_assert(strcmp(forced->valuestring, "Prescott") != 0, "%s", out);
        cr_assert_eq(json_num(c, "best_s"), d < f ? d : f, "%s", out);
        cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(c, "core")->valuestring,
                         d < f ? "Prescott" : forced->valuestring);
    }
    cJSON_Delete(o);
}

Test(clffn_bench, json_report, .timeout = 120) {
    char out[16384], err[4096], cmd[512];
    cJSON *o = bench_json("", "--tokens 7 --d-model 16 --d-ff 40 --activation swiglu --reps 3", out,
                          sizeof out);
    cr_assert(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(o, "device")));
    cr_assert_eq(json_num(o, "tokens"), 7);
    cr_assert_eq(json_num(o, "d_model"), 16);
    cr_assert_eq(json_num(o, "d_ff"), 40);
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(o, "activation")->valuestring, "silu");
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "gated")));
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "bias")), "the seeds' biases");
    cr_assert(json_num(o, "best_s") > 0 && json_num(o, "best_s") <= json_num(o, "median_s"));
    /* gflops is the FFN's 2·T·D·F·3 flops over the best time */
    cr_assert(fabs(json_num(o, "gflops") - 2.0 * 7 * 16 * 40 * 3 / json_num(o, "best_s") * 1e-9) <=
              1e-6 * json_num(o, "gflops"));
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "stages");
    clffn_context *ctx = test_context();
    const int timed = test_timestamps_ordered(ctx);
    clffn_context_destroy(ctx);
    const cJSON *why = cJSON_GetObjectItemCaseSensitive(o, "stages_unavailable");
    if (timed && cJSON_IsNull(st)) {
        /* timestamps in order, but a forward this small is mostly the host's enqueueing (a
         * loaded or sanitized host): the tool then says the spans do not account for the wall
         * clock, which its rule allows only past a millisecond of difference */
        cr_assert(cJSON_IsString(why) && strstr(why->valuestring, "wall-clock") != NULL, "%s", out);
        cr_assert(json_num(o, "median_s") > 1e-3, "%s", out);
    } else if (timed) {
        const double parts = json_num(st, "gemm1_s") + json_num(st, "epilogue1_s") +
                             json_num(st, "gemm2_s") + json_num(st, "epilogue2_s");
        cr_assert(json_num(st, "gemm1_s") > 0 && json_num(st, "epilogue1_s") > 0 &&
                      json_num(st, "gemm2_s") > 0 && json_num(st, "epilogue2_s") > 0,
                  "%s", out);
        cr_assert(fabs(parts - json_num(st, "total_s")) <= 1e-9 + 1e-6 * json_num(st, "total_s"),
                  "stages %.9f vs total %.9f", parts, json_num(st, "total_s"));
    } else { /* a driver whose profiling timestamps are not times: the rest still stands */
        cr_assert(cJSON_IsNull(st), "%s", out);
        cr_assert(cJSON_IsString(why), "%s", out);
    }
    cr_assert(json_num(o, "startup_s") > 0);
    cr_assert(json_num(o, "backward_best_s") > 0 &&
              json_num(o, "backward_best_s") <= json_num(o, "backward_median_s"));
    cr_assert(fabs(json_num(o, "backward_over_forward") -
                   json_num(o, "backward_best_s") / json_num(o, "best_s")) < 1e-9);
    cJSON_Delete(o);
    /* with the CPU BLAS beside it, when one was found at build time */
    snprintf(cmd, sizeof cmd,
             "'%s' --json --tokens 9 --d-model 24 --d-ff 64 --reps 3 --compare-cpu",
             CLFFN_BENCH_PATH);
    const int rc = run_split(cmd, out, sizeof out, err, sizeof err);
    if (rc == 2) {
        cr_assert(strstr(err, "needs a CBLAS") != NULL, "%s%s", out, err);
    } else {
        cr_assert_eq(rc, 0, "%s%s", out, err);
        o = cJSON_Parse(out);
        cr_assert_not_null(o, "%s%s", out, err);
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, "cpu_blas");
        cr_assert(json_num(c, "best_s") > 0 && json_num(o, "ratio_vs_cpu_blas") > 0);
        cr_assert(
            fabs(json_num(o, "ratio_vs_cpu_blas") - json_num(c, "best_s") / json_num(o, "best_s")) <
            1e-9 * json_num(o, "ratio_vs_cpu_blas") + 1e-12);
        cr_assert(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(c, "core")), "%s%s", out, err);
        cJSON_Delete(o);
        assert_fair_cpu();
    }
    snprintf(cmd, sizeof cmd, "'%s' --tokens 0", CLFFN_BENCH_PATH);
    cr_assert_eq(run(cmd, out, sizeof out), 2, "%s", out);
}

/* --bias off: the FFN without b1, bv and b2, as decoder models' FFNs (and ggml's peer programs)
 * have it. Compressed weights are uploaded without biases, which the library refuses for an FFN
 * configured with them, so the f16 run proves the configuration and the upload agree; the
 * backward runs without the biases' gradients, and the CPU FFN beside it without its adds. */
Test(clffn_bench, no_bias, .timeout = 120) {
    char out[16384], err[4096], cmd[512];
    cJSON *o = bench_json("",
                          "--tokens 3 --d-model 32 --d-ff 40 --activation swiglu --reps 2 "
                          "--weights-dtype f16 --bias off",
                          out, sizeof out);
    cr_assert(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(o, "bias")), "%s", out);
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "gated")), "%s", out);
    cr_assert(json_num(o, "best_s") > 0 && json_num(o, "backward_best_s") > 0, "%s", out);
    cJSON_Delete(o);
    snprintf(cmd, sizeof cmd, "'%s' --tokens 2 --d-model 16 --d-ff 24 --reps 2 --bias off",
             CLFFN_BENCH_PATH);
    cr_assert_eq(run_split(cmd, out, sizeof out, err, sizeof err), 0, "%s%s", out, err);
    cr_assert(strstr(out, "relu, no biases\n") != NULL, "%s", out);
    snprintf(cmd, sizeof cmd,
             "'%s' --json --tokens 2 --d-model 16 --d-ff 24 --reps 2 --bias off "
             "--compare-cpu",
             CLFFN_BENCH_PATH);
    const int rc = run_split(cmd, out, sizeof out, err, sizeof err);
    cr_assert(rc == 0 || (rc == 2 && strstr(err, "needs a CBLAS") != NULL), "%s%s", out, err);
    snprintf(cmd, sizeof cmd, "'%s' --bias sometimes", CLFFN_BENCH_PATH);
    cr_assert_eq(run_split(cmd, out, sizeof out, err, sizeof err), 2, "%s%s", out, err);
    cr_assert(strstr(err, "--bias takes on or off") != NULL, "%s", err);
}

/* The CSV is standard output alone: a driver may print to standard error as it compiles a kernel
 * (rusticl does for CLBlast's Xgemv: "MESA: warning: Treating load_kernel_arg in control flow
 * as uniform"), and that must not end up in the file. */
Test(clffn_bench, sweep_csv, .timeout = 120) {
    char out[16384], err[4096], cmd[512];
    snprintf(cmd, sizeof cmd, "'%s' --sweep --d-model 8 --d-ff 16 --reps 1", CLFFN_BENCH_PATH);
    cr_assert_eq(run_split(cmd, out, sizeof out, err, sizeof err), 0, "%s%s", out, err);
    cr_assert(strncmp(out, "tokens,clffn_gflops,clffn_weights_gbps,copy_gbps", 48) == 0, "%s", out);
    int rows = 0;
    size_t expect = 1;
    for (char *line = strchr(out, '\n'); line && line[1]; line = strchr(line + 1, '\n')) {
        unsigned long t = 0;
        double g = 0, w = 0, c = 0;
        cr_assert(sscanf(line + 1, "%lu,%lf,%lf,%lf", &t, &g, &w, &c) == 4, "bad row: %.40s",
                  line + 1);
        cr_assert_eq(t, expect);
        cr_assert(g > 0 && w > 0 && c > 0, "%.60s", line + 1);
        /* weights: 2 · 8 · 16 floats; FLOPs: 2 · T · 8 · 16 · 2, so GB/s = GFLOP/s · 2 / T */
        cr_assert(fabs(w - g * 2.0 / (double)t) <= 1e-3 * w, "%.60s", line + 1);
        expect *= 2;
        ++rows;
    }
    cr_assert_eq(rows, 14, "token counts 1 … 8192: %d rows", rows);
}
