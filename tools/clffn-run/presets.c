/* clffn-run: where a checkpoint keeps an FFN layer's tensors (the presets; GGUF files have
 * llama.cpp's names), found and shape-checked. */
#include "run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const preset presets[] = {
    {"annotated",
     "w_1.weight",
     "w_1.bias",
     NULL,
     NULL,
     "w_2.weight",
     "w_2.bias",
     {"", NULL},
     CLFFN_LAYOUT_OUT_IN,
     CLFFN_ACT_RELU,
     0},
    {"labml",
     "layer1.weight",
     "layer1.bias",
     "linear_v.weight",
     "linear_v.bias",
     "layer2.weight",
     "layer2.bias",
     {"", NULL},
     CLFFN_LAYOUT_OUT_IN,
     CLFFN_ACT_RELU,
     -1},
    {"gpt2",
     "h.%d.mlp.c_fc.weight",
     "h.%d.mlp.c_fc.bias",
     NULL,
     NULL,
     "h.%d.mlp.c_proj.weight",
     "h.%d.mlp.c_proj.bias",
     {"", "transformer.", NULL},
     CLFFN_LAYOUT_IN_OUT,
     CLFFN_ACT_GELU_TANH,
     0},
    {"bert",
     "encoder.layer.%d.intermediate.dense.weight",
     "encoder.layer.%d.intermediate.dense.bias",
     NULL,
     NULL,
     "encoder.layer.%d.output.dense.weight",
     "encoder.layer.%d.output.dense.bias",
     {"bert.", "", NULL},
     CLFFN_LAYOUT_OUT_IN,
     CLFFN_ACT_GELU,
     0},
    {"llama",
     "model.layers.%d.mlp.gate_proj.weight",
     NULL,
     "model.layers.%d.mlp.up_proj.weight",
     NULL,
     "model.layers.%d.mlp.down_proj.weight",
     NULL,
     {"", NULL},
     CLFFN_LAYOUT_OUT_IN,
     CLFFN_ACT_SILU,
     1},
};

/* GGUF files name an FFN layer's tensors as llama.cpp does: gate, up and down (SwiGLU, the
 * gate's product activated) or up and down alone (a plain FFN, GELU in ggml's tanh form, as
 * llama.cpp runs GPT-2 and BERT), each with .bias where the model has one. */
static const preset gguf_gated = {"gguf",
                                  "blk.%d.ffn_gate.weight",
                                  "blk.%d.ffn_gate.bias",
                                  "blk.%d.ffn_up.weight",
                                  "blk.%d.ffn_up.bias",
                                  "blk.%d.ffn_down.weight",
                                  "blk.%d.ffn_down.bias",
                                  {"", NULL},
                                  CLFFN_LAYOUT_OUT_IN,
                                  CLFFN_ACT_SILU,
                                  1};
static const preset gguf_plain = {"gguf",
                                  "blk.%d.ffn_up.weight",
                                  "blk.%d.ffn_up.bias",
                                  NULL,
                                  NULL,
                                  "blk.%d.ffn_down.weight",
                                  "blk.%d.ffn_down.bias",
                                  {"", NULL},
                                  CLFFN_LAYOUT_OUT_IN,
                                  CLFFN_ACT_GELU_TANH,
                                  0};

const preset *run_preset_default(void) { return &presets[0]; }

const preset *run_preset_named(const char *name) {
    for (size_t k = 0; k < sizeof presets / sizeof presets[0]; ++k) {
        if (!strcmp(name, presets[k].name)) { return &presets[k]; }
    }
    return NULL;
}

const char *run_preset_names(void) { return "annotated, labml, gpt2, bert, llama"; }

/* Finds a tensor by pattern and layer under the preset's prefixes; writes the name tried first
 * into tried for messages. */
static const ckpt_tensor *find(const ckpt *f, const preset *p, const char *pattern, int layer_index,
                               char *tried, size_t tried_len) {
    char base[256], full[300];
    snprintf(base, sizeof base, pattern, layer_index);
    snprintf(tried, tried_len, "%s%s", p->prefixes[0], base);
    for (int i = 0; i < 3 && p->prefixes[i]; ++i) {
        snprintf(full, sizeof full, "%s%s", p->prefixes[i], base);
        const ckpt_tensor *t = ckpt_find(f, full);
        if (t) { return t; }
    }
    return NULL;
}

/* Whether a tensor has shape [rows, cols] (cols = 0: [rows]); reports it if not. */
static int check_shape(const char *file, const ckpt_tensor *t, uint64_t rows, uint64_t cols) {
    const int ok = cols ? (t->rank == 2 && t->shape[0] == rows && t->shape[1] == cols)
                        : (t->rank == 1 && t->shape[0] == rows);
    if (ok) { return 0; }
    char have[128] = "", want[64];
    size_t n = 0;
    for (size_t k = 0; k < t->rank && n < sizeof have - 24; ++k) {
        n += (size_t)snprintf(have + n, sizeof have - n, "%s%llu", k ? ", " : "",
                              (unsigned long long)t->shape[k]);
    }
    if (cols) {
        snprintf(want, sizeof want, "[%llu, %llu]", (unsigned long long)rows,
                 (unsigned long long)cols);
    } else {
        snprintf(want, sizeof want, "[%llu]", (unsigned long long)rows);
    }
    run_report("%s: tensor '%s' has shape [%s], expected %s", file, t->name, have, want);
    return -1;
}

/* The gate, which the options or the preset may ask for: L->v and L->gated set, 0 or -1. */
static int resolve_gate(const options *o, const ckpt *c, layer *L) {
    const preset *p = L->preset;
    char tried[300];
    L->v = p->v ? find(c, p, p->v, o->layer, tried, sizeof tried) : NULL;
    L->gated =
        o->gated_flag || (o->have_act && o->act_gated) || p->gated == 1 || (p->gated == -1 && L->v);
    if (L->gated && !L->v) {
        if (p->v) {
            run_report("%s: gated FFN, but no tensor '%s'", o->weights, tried);
        } else {
            run_report("%s: %s has no gate tensor; drop --gated or the GLU activation", o->weights,
                       c->gguf ? "this GGUF layer" : p->name);
        }
        return -1;
    }
    if (!L->gated) { L->v = NULL; }
    return 0;
}

/* The preset: the options', or for a GGUF file llama.cpp's names (gated when the layer has a
 * gate). 0, or -1 (reported). */
static int choose_preset(const options *o, const ckpt *c, layer *L) {
    L->preset = o->preset;
    if (!c->gguf) { return 0; }
    if (o->preset_given) {
        run_report("%s: a GGUF file names its tensors as llama.cpp does; drop --preset",
                   o->weights);
        return -1;
    }
    char tried[300];
    L->preset = find(c, &gguf_gated, gguf_gated.w1, o->layer, tried, sizeof tried) ? &gguf_gated
                                                                                   : &gguf_plain;
    return 0;
}

/* The matrices' shapes: W1 [F, D] (or [D, F] for a preset of [in, out] weights), W2 the other
 * way, V as W1, the biases [F] and [D]. */
static int check_shapes(const options *o, layer *L) {
    const int oi = L->preset->layout == CLFFN_LAYOUT_OUT_IN;
    if (L->w1->rank != 2 || L->w1->shape[0] == 0 || L->w1->shape[1] == 0) {
        run_report("%s: tensor '%s' is not a non-empty matrix", o->weights, L->w1->name);
        return -1;
    }
    const uint64_t F = oi ? L->w1->shape[0] : L->w1->shape[1];
    const uint64_t D = oi ? L->w1->shape[1] : L->w1->shape[0];
    L->F = F, L->D = D;
    return check_shape(o->weights, L->w2, oi ? D : F, oi ? F : D) != 0 ||
                   (L->v && check_shape(o->weights, L->v, oi ? F : D, oi ? D : F) != 0) ||
                   (L->b1 && check_shape(o->weights, L->b1, F, 0) != 0) ||
                   (L->bv && check_shape(o->weights, L->bv, F, 0) != 0) ||
                   (L->b2 && check_shape(o->weights, L->b2, D, 0) != 0)
               ? -1
               : 0;
}

int run_resolve_layer(const options *o, const ckpt *c, layer *L) {
    char tried[300];
    memset(L, 0, sizeof *L);
    if (choose_preset(o, c, L) != 0) { return -1; }
    const preset *p = L->preset;
    if (!(L->w1 = find(c, p, p->w1, o->layer, tried, sizeof tried)) ||
        !(L->w2 = find(c, p, p->w2, o->layer, tried, sizeof tried))) {
        run_report("%s: no tensor '%s' (%s%s, layer %d)", o->weights, tried,
                   c->gguf ? "GGUF" : "preset ", c->gguf ? "" : p->name, o->layer);
        return -1;
    }
    if (resolve_gate(o, c, L) != 0) { return -1; }
    L->b1 = p->b1 ? find(c, p, p->b1, o->layer, tried, sizeof tried) : NULL;
    L->bv = L->gated && p->bv ? find(c, p, p->bv, o->layer, tried, sizeof tried) : NULL;
    L->b2 = p->b2 ? find(c, p, p->b2, o->layer, tried, sizeof tried) : NULL;
    return check_shapes(o, L);
}

clffn_config run_layer_config(const options *o, const layer *L) {
    clffn_config c = clffn_config_default((size_t)L->D, (size_t)L->F);
    c.activation = o->have_act ? o->act : L->preset->act;
    c.gated = L->gated;
    c.bias1 = L->b1 != NULL;
    c.bias_gate = L->bv != NULL;
    c.bias2 = L->b2 != NULL;
    c.dropout = o->dropout;
    c.residual = o->residual;
    return c;
}
