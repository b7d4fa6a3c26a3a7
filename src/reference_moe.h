/* The mixture-of-experts reference (reference_moe.c), and the config check the layer shares
 * with it. */
#ifndef CLFFN_REFERENCE_MOE_H
#define CLFFN_REFERENCE_MOE_H

#include "common.h"

/* NULL_ARGUMENT, the expert config's validate status, or INVALID_ARGUMENT (E = 0 or beyond
 * 2^24, k outside [1, E], an unknown routing, residual set, aux_loss_coef negative or not
 * finite). */
clffn_status clffn__moe_config_check(const clffn_moe_config *c);

#endif
