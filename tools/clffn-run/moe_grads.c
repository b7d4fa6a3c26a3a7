/* clffn-run --grad-output for a mixture-of-experts layer: clffn_moe_backward_host after the
 * forward, and the gradients written under the checkpoint's own names: the router's, each
 * expert matrix's (a GGUF file's experts restacked into their 3-D tensors: expert e's block at
 * e), the shared expert's and its gate's (the device router's row E), and 'input' for dL/dx.
 * Experts kept compressed have no matrix gradients: they are named as skipped. */
#include "run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The tensors to write: the router (and the shared expert's gate), the expert matrices (when
 * f32), 'input'. */
static size_t outputs(const moe_layer *L, int matrices, float *rg, float *const *eg,
                      float *const *stacked, const clffn_npy *x, float *dx, clffn_st_out *outs) {
    size_t n = 0;
    outs[n++] = (clffn_st_out){L->router->name, 2, L->router->shape, rg};
    if (L->shared_gate) {
        const ckpt_tensor *g = L->shared_gate;
        outs[n++] = (clffn_st_out){g->name, g->rank, g->shape, rg + L->E * L->D};
    }
    for (int i = 0; matrices && L->stacked && i < 3; ++i) {
        outs[n++] = (clffn_st_out){L->m[i]->name, 3, L->m[i]->shape, stacked[i]};
    }
    for (size_t e = 0; matrices && !L->stacked && e < L->E; ++e) {
        for (int i = 0; i < 3; ++i) {
            const ckpt_tensor *t = L->m[3 * e + i];
            outs[n++] = (clffn_st_out){t->name, 2, t->shape, eg[3 * e + i]};
        }
    }
    for (int i = 0; matrices && L->shared[0] && i < 3; ++i) {
        outs[n++] = (clffn_st_out){L->shared[i]->name, 2, L->shared[i]->shape, eg[3 * L->E + i]};
    }
    outs[n++] = (clffn_st_out){"input", x->rank, x->shape, dx};
    return n;
}

int run_moe_backward(const options *o, const moe_layer *L, clffn_moe *moe, const clffn_npy *x,
                     const clffn_npy *dy, const moe_away *away) {
    const size_t T = (size_t)(x->numel / L->D), n_ffn = L->E + (L->shared[0] ? 1 : 0);
    const size_t fd = L->F * L->D;
    const int matrices = clffn_ffn_weight_dtype(clffn_moe_expert(moe, 0)) == CLFFN_DTYPE_F32;
    float *dx = malloc((x->numel + 1) * sizeof *dx);
    float *rg = malloc(moe_router_rows(L) * L->D * sizeof *rg);
    float **eg = calloc(3 * n_ffn, sizeof *eg), *stacked[3] = {NULL, NULL, NULL};
    clffn_weight_arrays *wa = calloc(n_ffn, sizeof *wa);
    clffn_st_out *outs = calloc(3 * n_ffn + 4, sizeof *outs);
    int ok = dx && rg && eg && wa && outs;
    for (size_t i = 0; ok && matrices && i < 3 * n_ffn; ++i) {
        ok = !!(eg[i] = malloc((i < 3 * L->E ? fd : L->Fs * L->D) * sizeof(float)));
    }
    for (size_t e = 0; ok && matrices && e < n_ffn; ++e) {
        wa[e] = (clffn_weight_arrays){eg[3 * e], NULL, eg[3 * e + 1], NULL, eg[3 * e + 2], NULL};
    }
    int rc = -1;
    clffn_status s = ok ? CLFFN_SUCCESS : CLFFN_ERROR_OUT_OF_HOST_MEMORY;
    if (s == CLFFN_SUCCESS) {
        s = clffn_moe_backward_host(moe, T, dy->data, (size_t)dy->numel, dx, (size_t)x->numel, rg,
                                    NULL, wa, 0);
    }
    int collected = 1; /* the experts held elsewhere: their gradients from their ranks */
    if (s == CLFFN_SUCCESS && away) { collected = away->collect(away->user, matrices, wa) == 0; }
    for (int i = 0; s == CLFFN_SUCCESS && collected && matrices && L->stacked && i < 3; ++i) {
        if (!(stacked[i] = malloc(L->E * fd * sizeof(float)))) {
            s = CLFFN_ERROR_OUT_OF_HOST_MEMORY;
            break;
        }
        for (size_t e = 0; e < L->E; ++e) {
            memcpy(stacked[i] + e * fd, eg[3 * e + i], fd * sizeof(float));
        }
    }
    char err[CLFFN_IO_ERR];
    if (s != CLFFN_SUCCESS) {
        run_fail("backward pass", s);
    } else if (collected) {
        const size_t n = outputs(L, matrices, rg, eg, stacked, x, dx, outs);
        if (clffn_st_write(o->grads_out, outs, n, err) != 0) {
            run_report("%s: %s", o->grads_out, err);
        } else {
            printf("gradients: %zu tensors and 'input' written to %s\n", n - 1, o->grads_out);
            if (!matrices) {
                printf("gradients skipped: the experts' matrices (weights kept compressed have "
                       "none; --weights-dtype f32 computes them)\n");
            }
            rc = 0;
        }
    }
    for (size_t i = 0; eg && i < 3 * n_ffn; ++i) { free(eg[i]); }
    for (int i = 0; i < 3; ++i) { free(stacked[i]); }
    free(eg), free(wa), free(outs), free(dx), free(rg);
    return rc;
}
