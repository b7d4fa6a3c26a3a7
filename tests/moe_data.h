/* The mixture-of-experts suites' cases and layers (test_moe.c, test_moe_internals.c): a case's
 * config, its host data with dyadic router inputs (every logit exact in float as in double, so
 * the device and the reference choose alike), a layer made from it, and the check against the
 * double reference. */
#ifndef CLFFN_TEST_MOE_DATA_H
#define CLFFN_TEST_MOE_DATA_H

#include "common.h"

typedef struct moe_case {
    size_t tokens, experts, k;
    clffn_routing routing;
    int shared, router_bias, gated;
    clffn_activation act;
    int shared_gate;    /* the shared expert behind the router's row E (Qwen2-MoE) */
    size_t shared_d_ff; /* its own width (0: the experts') */
} moe_case;

/* A layer's host data: x, the router, and E (+1) expert weight sets. */
typedef struct moe_data {
    clffn_moe_config c;
    float *x, *router, *bias;
    test_weights *w;
    clffn_host_weights *hw;
    size_t n_w;
} moe_data;

/* m's host data for a case: x [T, D] in steps of 1/64, the router in steps of 1/64 and its
 * bias in steps of 1/8, the experts' weights (D → F; the shared expert's own width). */
void data_make(moe_data *m, const moe_case *mc, size_t D, size_t F, uint64_t seed);
void data_free(moe_data *m);

/* Expert e's config: the experts', or the shared expert's own width. */
clffn_config expert_config(const moe_data *m, size_t e);

/* A layer with m's weights, uploaded. */
clffn_moe *moe_make(clffn_context *ctx, const moe_data *m);

/* Runs m's tokens and checks y, the choice and the weights against the reference. */
void check_against_reference(clffn_moe *moe, const moe_data *m, size_t T, const char *what);

typedef void (*case_check)(clffn_moe *moe, const moe_data *m, const moe_case *mc, const char *what);

/* The f32 few-token crossover each_case's context gets (clffn_context_set_kernel_max_tokens);
 * SIZE_MAX (the start): the device's own. At CLFFN_MAX_KERNEL_TOKENS every f32 expert at up to
 * that many tokens runs clffn's own kernels, so the layer keeps its counts on the device
 * (src/moe.c). */
extern size_t f32_kernel_max;

/* Runs check on a layer of each case (D → F experts), named in what. */
void each_case(const moe_case *cs, size_t n, size_t D, size_t F, uint64_t seed, case_check check);

#endif
