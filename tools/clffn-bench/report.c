/* clffn-bench: one shape's results, as text for a person or as one JSON document. */
#include "bench.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>

/* What both forms derive from the measurements. */
typedef struct derived {
    double flops, weights_gbps, epilogue_gbps, outside_share;
} derived;

static derived derive(const args *a, device_run *r, const bench_result *res) {
    const clffn_stage_times *s = &res->stages;
    const size_t T = a->tokens, D = a->d_model, F = a->d_ff, N1 = a->gated ? 2 * F : F;
    const double epi_bytes = 4.0 * (double)T * ((double)N1 + (double)F + 2.0 * (double)D);
    const double epi_s = s->epilogue1_s + s->epilogue2_s;
    derived d = {bench_flops(a, T), (double)clffn_ffn_weight_bytes(r->ffn) / res->fwd.best_s * 1e-9,
                 epi_s > 0 ? epi_bytes / epi_s * 1e-9 : 0.0,
                 s->total_s > 0 ? (s->total_s - s->gemm1_s - s->gemm2_s) / s->total_s : 0.0};
    return d;
}

/* The context's choices: tuning, K-block, GEMV crossover, Xgemm sets, weight layout. */
static void json_choices(cJSON *o, clffn_context *ctx) {
    cJSON_AddStringToObject(o, "tuning", clffn_context_tuning(ctx));
    cJSON_AddNumberToObject(o, "kernel_max_tokens",
                            (double)clffn_context_kernel_max_tokens(ctx, 1));
    cJSON_AddNumberToObject(o, "kernel_max_tokens_f32",
                            (double)clffn_context_kernel_max_tokens(ctx, CLFFN_KERNELS_F32));
    cJSON_AddNumberToObject(o, "kernel_max_tokens_qx",
                            (double)clffn_context_kernel_max_tokens(ctx, CLFFN_KERNELS_QUANTIZED));
    cJSON_AddNumberToObject(
        o, "kernel_max_tokens_large",
        (double)clffn_context_kernel_max_tokens(ctx, CLFFN_KERNELS_COMPRESSED_LARGE));
    cJSON_AddNumberToObject(o, "kernel_max_tokens_blocks",
                            (double)clffn_context_kernel_max_tokens(ctx, CLFFN_KERNELS_BLOCKS));
    cJSON_AddNumberToObject(o, "kernel_large_weights",
                            (double)clffn_context_kernel_large_weights(ctx));
    cJSON_AddBoolToObject(o, "quantized_inputs", clffn_context_quantized_inputs(ctx));
    cJSON_AddBoolToObject(o, "fused_epilogues", clffn_context_fused_epilogues(ctx));
    cJSON_AddBoolToObject(o, "dequant_tiles", clffn_context_dequant_tiles(ctx));
    cJSON_AddNumberToObject(o, "row_group_cols", (double)clffn_context_row_group_cols(ctx));
    cJSON_AddNumberToObject(o, "gemm_k_block", (double)clffn_context_gemm_k_block(ctx));
    cJSON_AddNumberToObject(o, "gemv_max_tokens", (double)clffn_context_gemv_max_tokens(ctx));
    cJSON_AddNumberToObject(o, "xgemm_few_rows", (double)clffn_context_xgemm_few_rows(ctx));
    cJSON_AddStringToObject(o, "weight_layout",
                            bench_layout_name(clffn_context_weight_layout(ctx)));
}

static void json_startup(cJSON *o, const bench_result *res) {
    const startup_times *su = &res->startup;
    cJSON_AddNumberToObject(o, "startup_s", res->startup_s);
    cJSON *b = cJSON_AddObjectToObject(o, "startup");
    if (su->before_main >= 0) { cJSON_AddNumberToObject(b, "before_main_s", su->before_main); }
    cJSON_AddNumberToObject(b, "platforms_s", su->platforms);
    cJSON_AddNumberToObject(b, "context_s", su->context);
    cJSON_AddNumberToObject(b, "ffn_create_s", su->ffn);
    cJSON_AddNumberToObject(b, "weights_s", su->weights);
    cJSON_AddNumberToObject(b, "first_forward_s", su->first);
}

static void json_stages(cJSON *o, const device_run *r, const bench_result *res, const derived *d) {
    if (r->no_stages) {
        cJSON_AddNullToObject(o, "stages");
        cJSON_AddStringToObject(o, "stages_unavailable", r->no_stages);
        return;
    }
    cJSON *st = cJSON_AddObjectToObject(o, "stages");
    cJSON_AddNumberToObject(st, "gemm1_s", res->stages.gemm1_s);
    cJSON_AddNumberToObject(st, "epilogue1_s", res->stages.epilogue1_s);
    cJSON_AddNumberToObject(st, "gemm2_s", res->stages.gemm2_s);
    cJSON_AddNumberToObject(st, "epilogue2_s", res->stages.epilogue2_s);
    cJSON_AddNumberToObject(st, "total_s", res->stages.total_s);
    cJSON_AddNumberToObject(o, "outside_gemm_share", d->outside_share);
    cJSON_AddNumberToObject(o, "epilogue_gbps", d->epilogue_gbps);
}

void bench_report_json(const args *a, device_run *r, const bench_result *res) {
    const derived d = derive(a, r, res);
    char name[256] = "?";
    clffn_context_device_name(r->ctx, name, sizeof name);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "device", name);
    cJSON_AddNumberToObject(o, "tokens", (double)a->tokens);
    cJSON_AddNumberToObject(o, "d_model", (double)a->d_model);
    cJSON_AddNumberToObject(o, "d_ff", (double)a->d_ff);
    cJSON_AddStringToObject(o, "activation", clffn_activation_name(a->act));
    cJSON_AddBoolToObject(o, "gated", a->gated);
    cJSON_AddBoolToObject(o, "bias", !a->no_bias);
    cJSON_AddNumberToObject(o, "reps", a->reps);
    json_choices(o, r->ctx);
    cJSON_AddStringToObject(o, "weights_dtype", clffn_dtype_name(a->dtype));
    cJSON_AddNumberToObject(o, "weights_bytes", (double)clffn_ffn_weight_bytes(r->ffn));
    cJSON_AddNumberToObject(o, "weights_gbps", d.weights_gbps);
    cJSON_AddNumberToObject(o, "copy_gbps", res->copy_gbps);
    cJSON_AddNumberToObject(o, "best_s", res->fwd.best_s);
    cJSON_AddNumberToObject(o, "median_s", res->fwd.median_s);
    cJSON_AddNumberToObject(o, "gflops", d.flops / res->fwd.best_s * 1e-9);
    json_startup(o, res);
    cJSON_AddNumberToObject(o, "backward_best_s", res->bwd.best_s);
    cJSON_AddNumberToObject(o, "backward_median_s", res->bwd.median_s);
    cJSON_AddNumberToObject(o, "backward_over_forward", res->bwd.best_s / res->fwd.best_s);
    json_stages(o, r, res, &d);
    if (res->have_cpu) {
        const cpu_timing *ct = &res->cpu;
        cJSON *c = cJSON_AddObjectToObject(o, "cpu_blas");
        cJSON_AddNumberToObject(c, "best_s", ct->best.best_s);
        cJSON_AddNumberToObject(c, "median_s", ct->best.median_s);
        cJSON_AddNumberToObject(c, "gflops", d.flops / ct->best.best_s * 1e-9);
        cJSON_AddStringToObject(c, "core", ct->core);
        cJSON_AddStringToObject(c, "detected_core", ct->detected_core);
        cJSON_AddNumberToObject(c, "detected_best_s", ct->detected.best_s);
        if (ct->forced_core[0]) {
            cJSON_AddStringToObject(c, "forced_core", ct->forced_core);
            cJSON_AddNumberToObject(c, "forced_best_s", ct->forced.best_s);
        }
        cJSON_AddNumberToObject(o, "ratio_vs_cpu_blas", ct->best.best_s / res->fwd.best_s);
    }
    char *text = cJSON_Print(o);
    if (text) { puts(text); }
    free(text);
    cJSON_Delete(o);
}

/* The context's choices and where each came from (an option or the tuning). */
static void text_choices(const args *a, clffn_context *ctx) {
    const char *tuning = clffn_context_tuning(ctx);
    printf("GEMM K-block:  %zu, from %zu token rows (%s)\n", clffn_context_gemm_k_block(ctx),
           clffn_context_gemm_k_block_min_rows(ctx), a->set_k_block ? "--k-block" : tuning);
    printf("GEMVs up to:   %zu tokens (%s)\n", clffn_context_gemv_max_tokens(ctx),
           a->set_gemv_max ? "--gemv-max" : tuning);
    if (clffn_context_xgemm_few_rows(ctx)) {
        printf("Xgemm sets:    a few-tokens one below %zu tokens (%s)\n",
               clffn_context_xgemm_few_rows(ctx), tuning);
    }
    printf("weights kept:  %s (%s)\n",
           a->dtype == CLFFN_DTYPE_F32 ? bench_layout_name(clffn_context_weight_layout(ctx))
                                       : "as stored, out_in",
           a->dtype != CLFFN_DTYPE_F32 ? "their type"
           : a->set_layout             ? "--weight-layout"
                                       : tuning);
    const int blocks = a->dtype == CLFFN_DTYPE_Q8_0 || a->dtype == CLFFN_DTYPE_Q4_0;
    const int which = a->dtype == CLFFN_DTYPE_F32 ? CLFFN_KERNELS_F32
                      : clffn_context_quantized_inputs(ctx) && a->dtype != CLFFN_DTYPE_F16
                          ? CLFFN_KERNELS_QUANTIZED
                      : blocks ? CLFFN_KERNELS_BLOCKS
                               : CLFFN_KERNELS_COMPRESSED;
    const size_t most = clffn_context_kernel_max_tokens(ctx, which);
    const size_t large = clffn_context_kernel_max_tokens(ctx, CLFFN_KERNELS_COMPRESSED_LARGE);
    char sized[96] = "";
    if ((which == CLFFN_KERNELS_COMPRESSED || which == CLFFN_KERNELS_BLOCKS) && large != most) {
        snprintf(sized, sizeof sized, " (%zu in products of %zu weights or more)", large,
                 clffn_context_kernel_large_weights(ctx));
    }
    printf("own kernels:   up to %zu tokens%s, past %zu in passes (%s)\n", most, sized,
           CLFFN_MAX_KERNEL_TOKENS, a->set_kernel_max ? "--kernel-max" : tuning);
    if (!clffn_context_fused_epilogues(ctx)) {
        printf("epilogues:     launches of their own (--fused-epilogues off)\n");
    }
    if (a->dequant_tiles >= 0) {
        printf("dequantizer:   %s (--dequant-tiles)\n",
               clffn_context_dequant_tiles(ctx) ? "local-memory tiles" : "a tile a work-item");
    }
    if (a->set_row_group) {
        printf("row groups:    where a product's input has %zu floats or more "
               "(--row-group-cols)\n",
               clffn_context_row_group_cols(ctx));
    }
    if (clffn_context_quantized_inputs(ctx)) {
        printf("inputs:        rounded to q8_0 for q8_0 and q4_0 products, to bf16 for bf16 "
               "ones (--quantized-inputs)\n");
    }
}

void bench_report_text(const args *a, device_run *r, const bench_result *res) {
    const derived d = derive(a, r, res);
    const clffn_stage_times *s = &res->stages;
    const startup_times *su = &res->startup;
    char name[256] = "?";
    clffn_context_device_name(r->ctx, name, sizeof name);
    printf("device:        %s\n", name);
    printf("FFN:           %zu tokens, %zu -> %zu, %s%s%s\n", a->tokens, a->d_model, a->d_ff,
           clffn_activation_name(a->act), a->gated ? ", gated" : "",
           a->no_bias ? ", no biases" : "");
    text_choices(a, r->ctx);
    printf("forward:       best %.3f ms, median %.3f ms over %d reps: %.1f GFLOP/s\n",
           res->fwd.best_s * 1e3, res->fwd.median_s * 1e3, a->reps,
           d.flops / res->fwd.best_s * 1e-9);
    printf("weights read:  %.1f GB/s of %zu bytes (%s) over the forward; device copy bandwidth "
           "%.1f GB/s\n",
           d.weights_gbps, clffn_ffn_weight_bytes(r->ffn), clffn_dtype_name(a->dtype),
           res->copy_gbps);
    if (r->no_stages) {
        printf("stages:        unavailable: %s\n", r->no_stages);
    } else {
        /* the span is what CUDA events around a forward time: the device from its first
         * kernel's start to its last one's end, without the host's enqueue and wait */
        printf("stages (mean): GEMM 1 %.3f ms | epilogue 1 %.3f ms | GEMM 2 %.3f ms | epilogue 2 "
               "%.3f ms | span %.3f ms\n",
               s->gemm1_s * 1e3, s->epilogue1_s * 1e3, s->gemm2_s * 1e3, s->epilogue2_s * 1e3,
               s->total_s * 1e3);
        if (s->epilogue1_s > 0 || s->epilogue2_s > 0) {
            printf("outside GEMMs: %.1f%% of device time; epilogues at %.1f GB/s\n",
                   100.0 * d.outside_share, d.epilogue_gbps);
        } else {
            printf("outside GEMMs: %.1f%% of device time; epilogues fused into the GEMMs\n",
                   100.0 * d.outside_share);
        }
    }
    printf("backward:      best %.3f ms, median %.3f ms: %.2fx the forward\n",
           res->bwd.best_s * 1e3, res->bwd.median_s * 1e3, res->bwd.best_s / res->fwd.best_s);
    printf("startup:       %.3f s from process start to the first result\n", res->startup_s);
    printf("               ");
    if (su->before_main >= 0) { printf("loading %.3f | ", su->before_main); }
    printf("platforms %.3f | context %.3f | FFN (kernel build) %.3f | weights %.3f | first "
           "forward %.3f s\n",
           su->platforms, su->context, su->ffn, su->weights, su->first);
    if (res->have_cpu) {
        const cpu_timing *ct = &res->cpu;
        printf("CPU BLAS FFN:  best %.3f ms, median %.3f ms: %.1f GFLOP/s; clffn / CPU = %.2fx\n",
               ct->best.best_s * 1e3, ct->best.median_s * 1e3, d.flops / ct->best.best_s * 1e-9,
               ct->best.best_s / res->fwd.best_s);
        printf("OpenBLAS core: %s", ct->core);
        if (ct->forced_core[0]) {
            printf(" (best of %s, detected: %.3f ms, and %s, the best the CPU's flags allow: "
                   "%.3f ms)\n",
                   ct->detected_core, ct->detected.best_s * 1e3, ct->forced_core,
                   ct->forced.best_s * 1e3);
        } else {
            printf(" (as detected; the best the CPU's flags allow)\n");
        }
    }
}
