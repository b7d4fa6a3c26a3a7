/* clffn-run --weights: one FFN layer of a checkpoint on one device, on an input of any rank
 * [..., d_model], optionally checked against the CPU reference and run backward. */
#include "run.h"
#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int run_load_inputs(const options *o, const layer *L, clffn_npy *x, clffn_npy *dy) {
    char err[CLFFN_IO_ERR];
    if (clffn_npy_load(o->input, x, err) != 0) {
        run_report("%s: %s", o->input, err);
        return -1;
    }
    if (x->rank == 0 || x->shape[x->rank - 1] != L->D) {
        run_report("%s: last dimension must be d_model = %llu (from %s), not %llu", o->input,
                   (unsigned long long)L->D, L->w1->name,
                   x->rank ? (unsigned long long)x->shape[x->rank - 1] : 0ull);
        return -1;
    }
    return o->grad_output ? run_load_dy(o, x, dy) : 0;
}

int run_load_dy(const options *o, const clffn_npy *x, clffn_npy *dy) {
    char err[CLFFN_IO_ERR];
    if (clffn_npy_load(o->grad_output, dy, err) != 0) {
        run_report("%s: %s", o->grad_output, err);
        return -1;
    }
    int same = dy->rank == x->rank;
    for (size_t k = 0; same && k < x->rank; ++k) { same = dy->shape[k] == x->shape[k]; }
    if (!same) {
        run_report("%s: shape differs from the output's (the input's shape)", o->grad_output);
        return -1;
    }
    return 0;
}

int run_write_grads(const options *o, const ckpt_tensor *const t[6], float *const arr[6],
                    const clffn_npy *x, const float *dx) {
    char err[CLFFN_IO_ERR], skipped[512] = "";
    clffn_st_out outs[7];
    size_t n = 0, ns = 0;
    for (int i = 0; i < 6; ++i) {
        if (t[i] && arr[i]) {
            outs[n++] = (clffn_st_out){t[i]->name, t[i]->rank, t[i]->shape, arr[i]};
        } else if (t[i]) {
            ns += (size_t)snprintf(skipped + ns, ns < sizeof skipped ? sizeof skipped - ns : 0,
                                   "%s%s", ns ? ", " : "", t[i]->name);
        }
    }
    outs[n++] = (clffn_st_out){"input", x->rank, x->shape, dx};
    if (clffn_st_write(o->grads_out, outs, n, err) != 0) {
        run_report("%s: %s", o->grads_out, err);
        return -1;
    }
    printf("gradients: %zu tensors and 'input' written to %s\n", n - 1, o->grads_out);
    if (skipped[0]) {
        printf("gradients skipped: %s (weights kept compressed have none; --weights-dtype f32 "
               "computes them)\n",
               skipped);
    }
    return 0;
}

/* The backward pass for --grad-output: dy (checked to have the output's shape) in, the
 * gradient of every f32 weight tensor and of the input out. Returns 0 or -1 (reported). */
static int run_backward(const options *o, clffn_ffn *ffn, const layer *L, const clffn_npy *x,
                        const clffn_npy *dy, size_t T) {
    const ckpt_tensor *const t[6] = {L->w1, L->b1, L->v, L->bv, L->w2, L->b2};
    const int matrices = clffn_ffn_weight_dtype(ffn) == CLFFN_DTYPE_F32;
    float *arr[6] = {NULL};
    float *dx = malloc((size_t)(x->numel ? x->numel : 1) * sizeof *dx);
    int ok = dx != NULL;
    for (int i = 0; ok && i < 6; ++i) {
        const int matrix = i == 0 || i == 2 || i == 4;
        ok = !t[i] || (matrix && !matrices) ||
             (arr[i] = calloc((size_t)(t[i]->numel ? t[i]->numel : 1), sizeof(float)));
    }
    int ret = -1;
    if (!ok) {
        run_report("out of memory for gradients");
    } else {
        const clffn_weight_arrays ga = {arr[0], arr[1], arr[2], arr[3], arr[4], arr[5]};
        const clffn_status s = clffn_backward_host(ffn, T, x->data, (size_t)x->numel, dy->data,
                                                   (size_t)dy->numel, dx, (size_t)x->numel, &ga, 0);
        if (s != CLFFN_SUCCESS) {
            run_fail("backward pass", s);
        } else {
            ret = run_write_grads(o, t, arr, x, dx);
        }
    }
    for (int i = 0; i < 6; ++i) { free(arr[i]); }
    free(dx);
    return ret;
}

int run_open_device(const options *o, const char *spec, clffn_context **ctx) {
    clffn_status s = clffn_context_create_for_device(spec, ctx);
    if (s == CLFFN_PLATFORM_NOT_FOUND) {
        run_report("no OpenCL platform found; install one, e.g. `apt-get install pocl-opencl-icd` "
                   "for the CPU");
        return -1;
    }
    if (s != CLFFN_SUCCESS) {
        run_fail(spec ? spec : "opening the default device", s);
        return -1;
    }
    if (o->quantized_inputs && (s = clffn_context_set_quantized_inputs(*ctx, 1)) != CLFFN_SUCCESS) {
        run_fail("--quantized-inputs", s);
        clffn_context_destroy(*ctx);
        *ctx = NULL;
        return -1;
    }
    return 0;
}

int run_device_list(const char *list, char **specs) {
    int n = 0;
    for (const char *p = list;; ++n) {
        const char *end = strchr(p, ',');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == 0 || n == RUN_MAX_DEVICES) { break; }
        if (specs && !(specs[n] = malloc(len + 1))) { break; }
        if (specs) { memcpy(specs[n], p, len), specs[n][len] = '\0'; }
        if (!end) { return n + 1; }
        p = end + 1;
    }
    for (int i = 0; specs && i < n; ++i) { free(specs[i]), specs[i] = NULL; }
    return -1;
}

void run_print(clffn_context *ctx, const layer *L, const clffn_config *c, size_t T, double dt,
               const char *split) {
    char name[256] = "?";
    clffn_context_device_name(ctx, name, sizeof name);
    const double flops = 2.0 * (double)T * (double)L->D * (double)L->F * (L->gated ? 3.0 : 2.0);
    printf("device: %s\nFFN: d_model %llu, d_ff %llu, %s%s%s, %zu tokens%s\n", name,
           (unsigned long long)L->D, (unsigned long long)L->F, clffn_activation_name(c->activation),
           L->gated ? ", gated" : "", c->residual ? ", residual" : "", T, split);
    printf("time: %.3f ms (%.1f GFLOP/s, first call includes kernel builds)\n", dt * 1e3,
           dt > 0 ? flops / dt * 1e-9 : 0.0);
}

/* --verify: y against the CPU reference; 0 on a pass, -1 otherwise (a failure reported). */
static int verify(const clffn_config *c, const options *o, const loaded *w, size_t T,
                  const clffn_npy *x, const float *y) {
    const clffn_host_weights refs = run_refs(w);
    double *ref = malloc((x->numel ? x->numel : 1) * sizeof *ref);
    if (!ref) {
        run_report("out of memory");
        return -1;
    }
    const clffn_status s =
        clffn_reference_forward(c, w->layout, &refs, T, x->data, o->train, o->seed, 0, ref, NULL);
    if (s != CLFFN_SUCCESS) {
        free(ref);
        run_fail("CPU reference", s);
        return -1;
    }
    const tool_comparison cmp = tool_compare(y, ref, (size_t)x->numel, 1e-5, 1e-6);
    printf("max error: %.3g vs CPU reference in double (tolerance %.3g): %s\n", cmp.max_err,
           cmp.tol, cmp.pass ? "PASS" : "FAIL");
    free(ref);
    return cmp.pass ? 0 : -1;
}

/* The weights onto the device, as loaded: 0, or -1 (reported). --verbose says what they take. */
static int upload(const options *o, clffn_ffn *ffn, const loaded *w) {
    const clffn_typed_weights tw = run_typed(w);
    clffn_status s;
    if ((s = clffn_ffn_upload_weights_typed(ffn, w->layout, &tw)) != CLFFN_SUCCESS ||
        (s = clffn_ffn_set_training(ffn, o->train)) != CLFFN_SUCCESS ||
        (s = clffn_ffn_set_rng(ffn, o->seed, 0)) != CLFFN_SUCCESS) {
        if (*clffn_ffn_error_message(ffn)) {
            run_report("%s: %s", o->weights, clffn_ffn_error_message(ffn));
        } else {
            run_fail("setting up the FFN", s);
        }
        return -1;
    }
    if (o->verbose) {
        printf("weights on device: %zu bytes (%s)\n", clffn_ffn_weight_bytes(ffn),
               clffn_dtype_name(clffn_ffn_weight_dtype(ffn)));
    }
    run_note_quantized_inputs(o, clffn_ffn_weight_dtype(ffn));
    return 0;
}

void run_note_quantized_inputs(const options *o, clffn_dtype dtype) {
    if (!o->quantized_inputs) { return; }
    if (dtype != CLFFN_DTYPE_Q8_0 && dtype != CLFFN_DTYPE_Q4_0 && dtype != CLFFN_DTYPE_BF16) {
        fprintf(stderr,
                "clffn-run: --quantized-inputs rounds the inputs of q8_0, q4_0 and bf16 "
                "products; these weights are %s, so it changes nothing\n",
                clffn_dtype_name(dtype));
    } else if (o->verbose) {
        printf("inputs: rounded to %s for clffn's few-token kernels (--quantized-inputs)\n",
               dtype == CLFFN_DTYPE_BF16 ? "bf16" : "q8_0");
    }
}

/* The FFN on the device: forward (printed, verified), backward, output written. 0 or -1. */
static int run_on_device(const options *o, clffn_ffn *ffn, clffn_context *ctx, const layer *Ly,
                         const loaded *w, const clffn_npy *x, const clffn_npy *dy) {
    const size_t T = (size_t)(x->numel / Ly->D);
    const clffn_config c = run_layer_config(o, Ly);
    if (upload(o, ffn, w) != 0) { return -1; }
    float *y = malloc((x->numel ? x->numel : 1) * sizeof *y);
    if (!y) {
        run_report("out of memory");
        return -1;
    }
    int rc = -1;
    char err[CLFFN_IO_ERR];
    const double t0 = tool_now_s();
    clffn_status s;
    if ((s = clffn_forward_host(ffn, T, x->data, (size_t)x->numel, y, (size_t)x->numel)) !=
        CLFFN_SUCCESS) {
        run_fail("forward pass", s);
    } else {
        run_print(ctx, Ly, &c, T, tool_now_s() - t0, "");
        if ((!o->verify || verify(&c, o, w, T, x, y) == 0) &&
            (!o->grad_output || run_backward(o, ffn, Ly, x, dy, T) == 0)) {
            if (clffn_npy_save(o->output, y, x->rank, x->shape, err) != 0) {
                run_report("%s: %s", o->output, err);
                if (o->grads_out) { remove(o->grads_out); } /* the run failed: no file stays */
            } else {
                rc = 0;
            }
        }
    }
    free(y);
    return rc;
}

int run_checkpoint(const options *o) {
    char err[CLFFN_IO_ERR];
    ckpt ck;
    if (ckpt_open(o->weights, &ck, err) != 0) {
        run_report("%s: %s", o->weights, err);
        return EXIT_USAGE;
    }
    if (run_moe_of(o, &ck)) { /* a mixture-of-experts layer (moe.c) */
        const int moe_rc = run_moe(o, &ck);
        ckpt_close(&ck);
        return moe_rc;
    }
    if (o->expert_devices) {
        run_report("%s: layer %d is a dense FFN: --expert-devices splits a mixture-of-experts "
                   "layer's experts",
                   o->weights, o->layer);
        ckpt_close(&ck);
        return EXIT_USAGE;
    }
    int rc = EXIT_USAGE;
    layer Ly;
    loaded w = {0};
    clffn_npy x = {0}, dy = {0};
    clffn_context *ctx = NULL;
    clffn_ffn *ffn = NULL;
    if (run_resolve_layer(o, &ck, &Ly) == 0 && run_load_inputs(o, &Ly, &x, &dy) == 0) {
        const slice all = {0, Ly.F, 1};
        if (run_load_weights(o, &ck, &Ly, &all, o->verify, &w) == 0) {
            rc = EXIT_RUNTIME;
            const clffn_config c = run_layer_config(o, &Ly);
            clffn_status s;
            if (run_open_device(o, o->device, &ctx) != 0) {
                /* reported */
            } else if ((s = clffn_ffn_create(ctx, &c, &ffn)) != CLFFN_SUCCESS) {
                run_fail("setting up the FFN", s);
            } else if (run_on_device(o, ffn, ctx, &Ly, &w, &x, &dy) == 0) {
                rc = 0;
            }
        }
    }
    clffn_ffn_destroy(ffn);
    clffn_context_destroy(ctx);
    clffn_npy_free(&x);
    clffn_npy_free(&dy);
    run_loaded_free(&w);
    ckpt_close(&ck);
    return rc;
}
