/* clffn-run: the devices of a mixture-of-experts layer (moe.c): --device's one, or with
 * --expert-devices one context for each SPEC listed, the experts split over them in this
 * process (clffn_moe_create_split: contiguous runs, the first context also routing and
 * combining); and --verbose's account of the weights each holds. */
#include "run.h"

#include <stdio.h>
#include <stdlib.h>

/* The layer's contexts: one for each of --expert-devices' SPECs (a device may repeat), else
 * --device's. Their count, or -1 (reported; those opened are in ctx). */
int run_moe_open_devices(const options *o, clffn_context **ctx) {
    if (!o->expert_devices) { return run_open_device(o, o->device, &ctx[0]) == 0 ? 1 : -1; }
    char *specs[RUN_MAX_DEVICES] = {NULL};
    const int n = run_device_list(o->expert_devices, specs);
    if (n < 0) {
        run_report("out of memory");
        return -1;
    }
    int ok = 1;
    for (int i = 0; ok && i < n; ++i) { ok = run_open_device(o, specs[i], &ctx[i]) == 0; }
    for (int i = 0; i < n; ++i) { free(specs[i]); }
    return ok ? n : -1;
}

/* --verbose: the weights' bytes on each device and their type (the router's f32 rows are on the
 * first, with the shared expert). */
void run_moe_print_weights(const moe_layer *L, clffn_moe *moe, clffn_context *const *ctx, int n) {
    const size_t n_ffn = L->E + (L->shared[0] ? 1 : 0);
    const char *type = clffn_dtype_name(clffn_ffn_weight_dtype(clffn_moe_expert(moe, 0)));
    for (int i = 0; i < n; ++i) {
        size_t bytes = i == 0 ? moe_router_rows(L) * L->D * sizeof(float) : 0;
        size_t first = L->E, end = 0;
        for (size_t e = 0; e < n_ffn; ++e) {
            if ((e < L->E ? clffn_moe_expert_owner(e, L->E, n) : 0) != i) { continue; }
            bytes += clffn_ffn_weight_bytes(clffn_moe_expert(moe, e));
            if (e < L->E) { first = e < first ? e : first, end = e + 1; }
        }
        if (n == 1) {
            printf("weights on device: %zu bytes (%s experts, f32 router)\n", bytes, type);
            continue;
        }
        char name[256] = "?";
        clffn_context_device_name(ctx[i], name, sizeof name);
        printf("device %d: %s, experts [%zu, %zu)%s; weights on device: %zu bytes (%s%s)\n", i,
               name, first, end, i == 0 ? ", the router and the combine" : "", bytes, type,
               i == 0 ? " experts, f32 router" : "");
    }
}
