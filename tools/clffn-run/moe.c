/* clffn-run: a mixture-of-experts layer of a checkpoint (clffn_moe): Mixtral's and Qwen-MoE's
 * safetensors names (--preset mixtral, qwen_moe), or a GGUF layer with a router
 * (blk.L.ffn_gate_inp) and its experts stacked in 3-D tensors (ffn_gate_exps, ffn_up_exps,
 * ffn_down_exps: [E, F, D] and [E, D, F] row-major, expert e's matrix rows e·F … of the first
 * two and e·D … of the third). Each expert is SwiGLU without biases, as these models have them
 * (--activation overrides the activation); k comes from --top-k, else GGUF's
 * {arch}.expert_used_count, else 2. A shared expert may have its own width and a sigmoid gate
 * (Qwen2-MoE's shared_expert_gate, GGUF's ffn_gate_inp_shexp). */
#include "run.h"
#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct moe_preset {
    const char *name;
    const char *router;           /* takes the layer */
    const char *gate, *up, *down; /* take the layer and the expert */
    const char *shared[3];        /* gate, up, down of a shared expert (the layer); NULL: none */
    const char *shared_gating;    /* the shared expert's sigmoid gate (Qwen2-MoE's) */
    clffn_routing routing;
};

static const moe_preset moe_presets[] = {
    {"mixtral",
     "model.layers.%d.block_sparse_moe.gate.weight",
     "model.layers.%d.block_sparse_moe.experts.%d.w1.weight",
     "model.layers.%d.block_sparse_moe.experts.%d.w3.weight",
     "model.layers.%d.block_sparse_moe.experts.%d.w2.weight",
     {NULL, NULL, NULL},
     NULL,
     CLFFN_ROUTING_TOPK_NORMALIZED},
    {"qwen_moe",
     "model.layers.%d.mlp.gate.weight",
     "model.layers.%d.mlp.experts.%d.gate_proj.weight",
     "model.layers.%d.mlp.experts.%d.up_proj.weight",
     "model.layers.%d.mlp.experts.%d.down_proj.weight",
     {"model.layers.%d.mlp.shared_expert.gate_proj.weight",
      "model.layers.%d.mlp.shared_expert.up_proj.weight",
      "model.layers.%d.mlp.shared_expert.down_proj.weight"},
     "model.layers.%d.mlp.shared_expert_gate.weight",
     CLFFN_ROUTING_TOPK},
};

/* GGUF's names, llama.cpp's */
static const moe_preset gguf_moe = {
    "gguf",
    "blk.%d.ffn_gate_inp.weight",
    "blk.%d.ffn_gate_exps.weight",
    "blk.%d.ffn_up_exps.weight",
    "blk.%d.ffn_down_exps.weight",
    {"blk.%d.ffn_gate_shexp.weight", "blk.%d.ffn_up_shexp.weight", "blk.%d.ffn_down_shexp.weight"},
    "blk.%d.ffn_gate_inp_shexp.weight",
    CLFFN_ROUTING_TOPK_NORMALIZED};

const moe_preset *run_moe_preset_named(const char *name) {
    for (size_t i = 0; i < sizeof moe_presets / sizeof moe_presets[0]; ++i) {
        if (!strcmp(moe_presets[i].name, name)) { return &moe_presets[i]; }
    }
    return NULL;
}

static const ckpt_tensor *find(const ckpt *c, const char *fmt, int l, int e) {
    char name[256];
    snprintf(name, sizeof name, fmt, l, e);
    return ckpt_find(c, name);
}

const moe_preset *run_moe_of(const options *o, const ckpt *c) {
    if (o->moe_preset) { return o->moe_preset; }
    return c->gguf && find(c, gguf_moe.router, o->layer, 0) ? &gguf_moe : NULL;
}

static int shape_is(const ckpt_tensor *t, size_t rank, uint64_t a, uint64_t b, uint64_t e) {
    const uint64_t want[3] = {e, a, b};
    if (!t || t->rank != rank) { return 0; }
    for (size_t i = 0; i < rank; ++i) {
        if (t->shape[i] != want[3 - rank + i]) { return 0; }
    }
    return 1;
}

/* The experts' tensors, counted (safetensors: experts 0, 1, … while the gate is there) and
 * shape-checked against the router's [E, D] and the first gate's F. 0, or -1 (reported). */
static int find_experts(const options *o, const ckpt *c, moe_layer *L) {
    const int l = o->layer;
    L->stacked = L->p == &gguf_moe;
    if (L->stacked) {
        L->m = calloc(3, sizeof *L->m);
        for (int i = 0; L->m && i < 3; ++i) {
            L->m[i] = find(c, i == 0 ? L->p->gate : i == 1 ? L->p->up : L->p->down, l, 0);
        }
    } else {
        L->m = calloc(3 * L->E, sizeof *L->m);
        for (size_t e = 0; L->m && e < L->E; ++e) {
            L->m[3 * e] = find(c, L->p->gate, l, (int)e);
            L->m[3 * e + 1] = find(c, L->p->up, l, (int)e);
            L->m[3 * e + 2] = find(c, L->p->down, l, (int)e);
        }
    }
    if (!L->m) {
        run_report("out of memory");
        return -1;
    }
    L->F = L->m[0] && L->m[0]->rank >= 2 ? L->m[0]->shape[L->m[0]->rank - 2] : 0;
    const size_t n = L->stacked ? 1 : L->E, rank = L->stacked ? 3 : 2;
    for (size_t e = 0; e < n; ++e) {
        for (int i = 0; i < 3; ++i) {
            const ckpt_tensor *t = L->m[3 * e + i];
            const int ok =
                i < 2 ? shape_is(t, rank, L->F, L->D, L->E) : shape_is(t, rank, L->D, L->F, L->E);
            if (!ok || !L->F) {
                run_report("%s: expert %zu's %s is %s (the router has %zu experts of d_model %zu)",
                           o->weights, e,
                           i == 0   ? "gate"
                           : i == 1 ? "up"
                                    : "down",
                           t ? "of another shape" : "missing", L->E, L->D);
                return -1;
            }
        }
    }
    return 0;
}

/* k: --top-k, else GGUF's {arch}.expert_used_count, else 2; at most E. */
static int choose_k(const options *o, const ckpt *c, moe_layer *L) {
    uint64_t k = 2;
    char arch[64], key[96];
    if (o->top_k) {
        k = o->top_k;
    } else if (c->gguf &&
               clffn_gguf_string(&c->gg, "general.architecture", arch, sizeof arch) == 0) {
        snprintf(key, sizeof key, "%s.expert_used_count", arch);
        clffn_gguf_uint(&c->gg, key, &k);
    }
    if (k < 1 || k > L->E) {
        run_report("%s: top-k %llu for %zu experts", o->weights, (unsigned long long)k, L->E);
        return -1;
    }
    L->k = (size_t)k;
    return 0;
}

/* A GGUF file's {arch}.KEY: its kv, or NULL. */
static const clffn_gguf_kv *arch_kv(const ckpt *c, const char *key, char *arch, size_t n) {
    char name[128];
    if (clffn_gguf_string(&c->gg, "general.architecture", arch, n) != 0) { return NULL; }
    snprintf(name, sizeof name, "%s.%s", arch, key);
    return clffn_gguf_kv_find(&c->gg, name);
}

/* The routing: --routing, else the preset's, else GGUF's as llama.cpp takes it: the file's
 * {arch}.expert_weights_norm where it has one, qwen2moe's softmax weights as they are, every
 * other architecture's renormalised. A gating function other than the softmax (DeepSeek-V3's
 * sigmoid) is refused by name. 0 or -1. */
static int choose_routing(const options *o, const ckpt *c, moe_layer *L) {
    L->routing = L->p->routing;
    char arch[64] = "";
    if (c->gguf) {
        const clffn_gguf_kv *norm = arch_kv(c, "expert_weights_norm", arch, sizeof arch);
        uint64_t gating = 1; /* llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX */
        char key[96];
        snprintf(key, sizeof key, "%s.expert_gating_func", arch);
        clffn_gguf_uint(&c->gg, key, &gating);
        if (gating != 1) {
            run_report("%s: %s's expert gating function %llu is not the softmax clffn's router "
                       "computes",
                       o->weights, arch, (unsigned long long)gating);
            return -1;
        }
        if (norm && norm->type == CLFFN_GGUF_BOOL) {
            L->routing = norm->value[0] ? CLFFN_ROUTING_TOPK_NORMALIZED : CLFFN_ROUTING_TOPK;
        } else if (!strcmp(arch, "qwen2moe")) {
            L->routing = CLFFN_ROUTING_TOPK;
        }
    }
    if (o->routing_given) { L->routing = o->routing; }
    return 0;
}

int run_moe_resolve(const options *o, const ckpt *c, moe_layer *L) {
    memset(L, 0, sizeof *L);
    L->p = run_moe_of(o, c);
    L->router = find(c, L->p->router, o->layer, 0);
    if (!L->router || L->router->rank != 2) {
        run_report("%s: no router matrix for layer %d (looked for '%s')", o->weights, o->layer,
                   L->p->router);
        return -1;
    }
    L->E = (size_t)L->router->shape[0], L->D = (size_t)L->router->shape[1];
    for (int i = 0; i < 3 && L->p->shared[i]; ++i) {
        L->shared[i] = find(c, L->p->shared[i], o->layer, 0);
    }
    if (L->p->shared_gating) { L->shared_gate = find(c, L->p->shared_gating, o->layer, 0); }
    if (find_experts(o, c, L) != 0 || choose_k(o, c, L) != 0 || choose_routing(o, c, L) != 0) {
        return -1;
    }
    /* a shared expert: all three matrices, of one width Fs of its own */
    const ckpt_tensor *const *sh = L->shared;
    L->Fs = sh[0] && sh[0]->rank == 2 ? (size_t)sh[0]->shape[0] : 0;
    if ((sh[0] || sh[1] || sh[2]) &&
        !(L->Fs && shape_is(sh[0], 2, L->Fs, L->D, 0) && shape_is(sh[1], 2, L->Fs, L->D, 0) &&
          shape_is(sh[2], 2, L->D, L->Fs, 0))) {
        run_report("%s: layer %d's shared expert is incomplete, or its matrices disagree on its "
                   "width or with d_model %zu",
                   o->weights, o->layer, L->D);
        return -1;
    }
    const ckpt_tensor *g = L->shared_gate;
    if (g && (!sh[0] || !(shape_is(g, 2, 1, L->D, 0) || shape_is(g, 1, 0, L->D, 0)))) {
        run_report("%s: layer %d's '%s' is %s", o->weights, o->layer, g->name,
                   sh[0] ? "not of shape [1, d_model] or [d_model]"
                         : "there without a shared "
                           "expert");
        return -1;
    }
    return 0;
}

/* Expert e's matrix i (gate, up, down; e = E: the shared expert's) as it goes to the device, in
 * dtype, [out, in]: the file's bytes where it holds dtype already, else its values converted;
 * with ref, its exact f32 values too (malloc'd, freed by the caller). 0, or -1 (reported). */
static int load_matrix(const options *o, const ckpt *c, const moe_layer *L, size_t e, int i,
                       clffn_dtype dtype, void **bytes, float **ref) {
    const int shared = e == L->E;
    const ckpt_tensor *t = shared ? L->shared[i] : L->stacked ? L->m[i] : L->m[3 * e + i];
    const size_t F = shared ? L->Fs : L->F;
    const uint64_t rows = i < 2 ? F : L->D, cols = i < 2 ? L->D : F;
    const uint64_t row0 = L->stacked && !shared ? (uint64_t)e * rows : 0;
    const size_t n = (size_t)(rows * cols);
    size_t nb = 0;
    char err[CLFFN_IO_ERR] = "";
    clffn_dtype_bytes(dtype, n, &nb);
    *bytes = malloc(nb ? nb : 1);
    float *f = malloc(n * sizeof *f);
    int rc = *bytes && f ? 0 : -1;
    if (rc == 0 && t->keep && t->dtype == dtype) {
        rc = ckpt_read_stored(c, t, row0, rows, 0, cols, *bytes, nb, err);
        if (rc == 0 && clffn_convert_to_f32(dtype, *bytes, nb, n, f, n) != CLFFN_SUCCESS) {
            rc = -1;
        }
    } else if (rc == 0) {
        rc = ckpt_read_f32(c, t, row0, rows, 0, cols, f, err);
        if (rc == 0 && clffn_convert_weights(dtype, f, n, *bytes, nb) != CLFFN_SUCCESS) {
            snprintf(err, sizeof err, "tensor '%s' does not convert to %s", t->name,
                     clffn_dtype_name(dtype));
            rc = -1;
        }
        if (rc == 0 && dtype != CLFFN_DTYPE_F32) {
            clffn_convert_to_f32(dtype, *bytes, nb, n, f, n);
        }
    }
    if (rc != 0) {
        run_report("%s: %s", o->weights, err[0] ? err : "out of memory");
        free(f);
        return -1;
    }
    if (ref) {
        *ref = f;
    } else {
        free(f);
    }
    return 0;
}

clffn_dtype run_moe_dtype(const options *o, const moe_layer *L) {
    if (!o->dtype_stored) { return o->dtype; }
    const size_t n = L->stacked ? 3 : 3 * L->E;
    const ckpt_tensor *first = L->m[0];
    for (size_t i = 0; i < n; ++i) {
        if (!L->m[i]->keep || L->m[i]->dtype != first->dtype) { return CLFFN_DTYPE_F32; }
    }
    return first->keep ? first->dtype : CLFFN_DTYPE_F32;
}

int run_moe_upload(const options *o, const ckpt *c, const moe_layer *L, clffn_moe *moe,
                   clffn_moe_holder *h, clffn_dtype dtype, float **refs) {
    const size_t n_ffn = L->E + (L->shared[0] ? 1 : 0);
    for (size_t e = 0; e < n_ffn; ++e) {
        clffn_ffn *ffn = moe ? clffn_moe_expert(moe, e) : clffn_moe_holder_expert(h, e);
        if (!ffn) { continue; } /* held elsewhere: not read here */
        void *b[3] = {NULL, NULL, NULL};
        int rc = 0;
        for (int i = 0; i < 3 && rc == 0; ++i) {
            rc = load_matrix(o, c, L, e, i, dtype, &b[i], refs ? &refs[3 * e + i] : NULL);
        }
        const clffn_typed_weights tw = {dtype, b[0], b[1], b[2], NULL, NULL, NULL};
        clffn_status s = CLFFN_SUCCESS;
        if (rc == 0 &&
            (s = clffn_ffn_upload_weights_typed(ffn, CLFFN_LAYOUT_OUT_IN, &tw)) != CLFFN_SUCCESS) {
            run_report("%s: expert %zu: %s", o->weights, e,
                       *clffn_ffn_error_message(ffn) ? clffn_ffn_error_message(ffn)
                                                     : clffn_status_string(s));
            rc = -1;
        }
        for (int i = 0; i < 3; ++i) { free(b[i]); }
        if (rc != 0) { return -1; }
    }
    return 0;
}

/* --verify: y against clffn_moe_reference_forward on the experts' own values. 0 or -1. */
static int verify(const clffn_moe_config *mc, const moe_layer *L, const float *router,
                  float *const *refs, size_t T, const float *x, const float *y) {
    const size_t n_ffn = L->E + (L->shared[0] ? 1 : 0);
    clffn_host_weights *hw = calloc(n_ffn, sizeof *hw);
    double *ref = malloc((T * L->D + 1) * sizeof *ref);
    clffn_status s = hw && ref ? CLFFN_SUCCESS : CLFFN_ERROR_OUT_OF_HOST_MEMORY;
    for (size_t e = 0; hw && e < n_ffn; ++e) {
        hw[e] =
            (clffn_host_weights){refs[3 * e], NULL, refs[3 * e + 1], NULL, refs[3 * e + 2], NULL};
    }
    if (s == CLFFN_SUCCESS) {
        s = clffn_moe_reference_forward(mc, CLFFN_LAYOUT_OUT_IN, router, NULL, hw, T, x, ref, NULL,
                                        NULL);
    }
    int rc = -1;
    if (s != CLFFN_SUCCESS) {
        run_fail("CPU reference", s);
    } else {
        const tool_comparison cmp = tool_compare(y, ref, T * L->D, 1e-5, 1e-6);
        printf("max error: %.3g vs CPU reference in double (tolerance %.3g): %s\n", cmp.max_err,
               cmp.tol, cmp.pass ? "PASS" : "FAIL");
        rc = cmp.pass ? 0 : -1;
    }
    free(hw);
    free(ref);
    return rc;
}

/* --router-out: [..., k, 2] float32, each token's experts best first (the index as a float)
 * and their weights. 0 or -1. */
static int write_routing(const options *o, const clffn_npy *x, size_t k, const int32_t *ch,
                         const float *wt) {
    const size_t T = (size_t)(x->numel / x->shape[x->rank - 1]);
    float *r = malloc((T * k * 2 + 1) * sizeof *r);
    if (!r) {
        run_report("out of memory");
        return -1;
    }
    for (size_t i = 0; i < T * k; ++i) { r[2 * i] = (float)ch[i], r[2 * i + 1] = wt[i]; }
    uint64_t shape[CLFFN_IO_MAX_RANK];
    memcpy(shape, x->shape, (x->rank - 1) * sizeof *shape);
    shape[x->rank - 1] = k, shape[x->rank] = 2;
    char err[CLFFN_IO_ERR];
    const int rc = clffn_npy_save(o->router_out, r, x->rank + 1, shape, err);
    if (rc != 0) { run_report("%s: %s", o->router_out, err); }
    free(r);
    return rc;
}

int run_moe_layer(const options *o, const moe_layer *L, clffn_moe *moe, const clffn_moe_config *mc,
                  const float *router, float *const *refs, const clffn_npy *x, const clffn_npy *dy,
                  const moe_away *away) {
    const size_t T = (size_t)(x->numel / L->D);
    float *y = malloc((x->numel + 1) * sizeof *y), *wt = malloc((T * L->k + 1) * sizeof *wt);
    int32_t *ch = malloc((T * L->k + 1) * sizeof *ch);
    int rc = -1;
    const double t0 = tool_now_s();
    clffn_status s = y && wt && ch ? CLFFN_SUCCESS : CLFFN_ERROR_OUT_OF_HOST_MEMORY;
    if (s == CLFFN_SUCCESS) {
        s = clffn_moe_forward_host(moe, T, x->data, (size_t)x->numel, y, (size_t)x->numel, ch, wt);
    }
    char err[CLFFN_IO_ERR];
    if (s != CLFFN_SUCCESS) {
        run_fail("forward pass", s);
    } else {
        const double dt = tool_now_s() - t0;
        char over[48] = "";
        const int devices = o->expert_devices ? run_device_list(o->expert_devices, NULL) : 1;
        if (away) {
            snprintf(over, sizeof over, ", experts over %d ranks", away->ranks);
        } else if (devices > 1) {
            snprintf(over, sizeof over, ", experts over %d devices", devices);
        }
        printf("MoE: %zu experts%s%s, top-%zu (%s), d_model %zu, d_ff %zu, %s, %zu tokens%s\n",
               L->E, L->shared[0] ? " and a shared one" : "",
               L->shared_gate ? " behind a gate" : "", L->k,
               mc->routing == CLFFN_ROUTING_TOPK ? "as they are" : "renormalised", L->D, L->F,
               clffn_activation_name(mc->expert.activation), T, over);
        printf("time: %.3f ms (first call includes kernel builds)\n", dt * 1e3);
        if (o->verbose) {
            printf("experts: %s\n", clffn_moe_experts_grouped(moe)
                                        ? "grouped, a launch a stage for all of them"
                                        : "one at a time");
            printf("expert counts: %s\n",
                   clffn_moe_counts_kept(moe) ? "kept on the device" : "read back to the host");
        }
        if ((!o->verify || verify(mc, L, router, refs, T, x->data, y) == 0) &&
            (!o->router_out || write_routing(o, x, L->k, ch, wt) == 0) &&
            (!o->grad_output || run_moe_backward(o, L, moe, x, dy, away) == 0)) {
            rc = clffn_npy_save(o->output, y, x->rank, x->shape, err);
            if (rc != 0) {
                run_report("%s: %s", o->output, err);
                if (o->grads_out) { remove(o->grads_out); } /* the run failed: no file stays */
            }
        }
    }
    free(y), free(wt), free(ch);
    return rc;
}

int run_moe_load_input(const options *o, const moe_layer *L, clffn_npy *x, clffn_npy *dy) {
    char err[CLFFN_IO_ERR];
    if (clffn_npy_load(o->input, x, err) != 0) {
        run_report("%s: %s", o->input, err);
        return -1;
    }
    if (x->rank == 0 || x->rank >= CLFFN_IO_MAX_RANK || x->shape[x->rank - 1] != L->D) {
        run_report("%s: last dimension must be d_model = %zu (from %s)", o->input, L->D,
                   L->router->name);
        return -1;
    }
    return o->grad_output ? run_load_dy(o, x, dy) : 0;
}

clffn_moe_config run_moe_config(const options *o, const moe_layer *L) {
    clffn_moe_config mc = clffn_moe_config_default(L->D, L->F, L->E, L->k);
    if (o->have_act) { mc.expert.activation = o->act; }
    mc.routing = L->routing;
    mc.shared_expert = L->shared[0] != NULL;
    mc.shared_d_ff = L->Fs;
    mc.shared_gate = L->shared_gate != NULL;
    return mc;
}

/* Devices, layer, router and experts, then the run. The exit status. */
static int on_device(const options *o, const ckpt *c, const moe_layer *L, const clffn_npy *x,
                     const clffn_npy *dy) {
    const clffn_moe_config mc = run_moe_config(o, L);
    const size_t n_refs = 3 * (L->E + 1);
    float *router = malloc(moe_router_rows(L) * L->D * sizeof *router);
    float **refs = o->verify ? calloc(n_refs, sizeof *refs) : NULL;
    char err[CLFFN_IO_ERR];
    clffn_context *ctx[RUN_MAX_DEVICES] = {NULL};
    clffn_moe *moe = NULL;
    clffn_status s;
    int rc = EXIT_RUNTIME, n = 0;
    if (!router || (o->verify && !refs)) {
        run_report("out of memory");
    } else if (ckpt_read_all_f32(c, L->router, router, err) != 0 ||
               (L->shared_gate &&
                ckpt_read_all_f32(c, L->shared_gate, router + L->E * L->D, err) != 0)) {
        run_report("%s: %s", o->weights, err);
        rc = EXIT_USAGE;
    } else if ((n = run_moe_open_devices(o, ctx)) < 1) {
        /* reported */
    } else if ((s = clffn_moe_create_split(ctx, n, &mc, &moe)) != CLFFN_SUCCESS ||
               (s = clffn_moe_set_counts(moe, o->counts)) != CLFFN_SUCCESS ||
               (s = clffn_moe_set_grouping(moe, !o->ungrouped)) != CLFFN_SUCCESS ||
               (s = clffn_moe_upload_router(moe, router, NULL)) != CLFFN_SUCCESS) {
        run_fail("setting up the layer", s);
    } else if (run_moe_upload(o, c, L, moe, NULL, run_moe_dtype(o, L), refs) == 0) {
        if (o->verbose) { run_moe_print_weights(L, moe, ctx, n); }
        run_note_quantized_inputs(o, run_moe_dtype(o, L));
        if (run_moe_layer(o, L, moe, &mc, router, refs, x, dy, NULL) == 0) { rc = 0; }
    }
    for (size_t i = 0; refs && i < n_refs; ++i) { free(refs[i]); }
    free(refs);
    free(router);
    clffn_moe_destroy(moe);
    for (int i = 0; i < RUN_MAX_DEVICES; ++i) { clffn_context_destroy(ctx[i]); }
    return rc;
}

int run_moe(const options *o, const ckpt *c) {
    moe_layer L;
    clffn_npy x = {0}, dy = {0};
    int rc = EXIT_USAGE;
    const int devices = o->expert_devices ? run_device_list(o->expert_devices, NULL) : 1;
    if (run_moe_resolve(o, c, &L) != 0) {
        /* reported */
    } else if ((size_t)devices > L.E) {
        run_report("--expert-devices names %d devices for a layer of %zu experts", devices, L.E);
    } else if (run_moe_load_input(o, &L, &x, &dy) == 0) {
        rc = on_device(o, c, &L, &x, &dy);
    }
    clffn_npy_free(&x);
    clffn_npy_free(&dy);
    free(L.m);
    return rc;
}
