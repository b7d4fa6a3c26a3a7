/* The mixture-of-experts reference (reference_moe.c), and the config check the layer shares
 * with it. */
#ifndef CLFFN_REFERENCE_MOE_H
#define CLFFN_REFERENCE_MOE_H

#include "common.h"

/* NULL_ARGUMENT, the expert config's validate status (and the shared expert's), or
 * INVALID_ARGUMENT (E = 0 or beyond 2^24, k outside [1, E], an unknown routing, residual set,
 * aux_loss_coef negative or not finite, shared_d_ff or shared_gate without a shared expert). */
clffn_status clffn__moe_config_check(const clffn_moe_config *c);

/* The shared expert's FFN config: the experts', with shared_d_ff where it is set. */
clffn_config clffn__moe_shared_config(const clffn_moe_config *c);

/* The router's rows: E, and the shared expert's gate with shared_gate. */
static inline size_t clffn__moe_router_rows(const clffn_moe_config *c) {
    return c->experts + (c->shared_expert && c->shared_gate ? 1 : 0);
}

#endif
