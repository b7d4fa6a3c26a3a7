/* The weight pools of a mixture-of-experts layer: every expert's tensor of one kind (W1 with V,
 * b1, bv, W2, b2) in one buffer, expert e's at e·stride bytes as a sub-buffer of it, so that a
 * single launch reaches every expert's weights (moe_grouped.c). An expert's upload takes its
 * slot (weights.c); the FFN then holds the sub-buffer like any buffer of its own. */
#ifndef CLFFN_POOL_H
#define CLFFN_POOL_H

#include "context.h"

#include <stdbool.h>

typedef enum clffn_pool_kind {
    CLFFN_POOL_W1, /* W1, with V stacked in when gated */
    CLFFN_POOL_B1,
    CLFFN_POOL_BV,
    CLFFN_POOL_W2,
    CLFFN_POOL_B2,
    CLFFN_POOL_KINDS
} clffn_pool_kind;

/* One kind's pool: made at the first upload of that kind, for slots of `bytes`, and made anew
 * (a new generation) when an upload brings another size; the old one lives on while experts
 * still hold slots of it. */
typedef struct clffn_pool {
    cl_mem parent; /* NULL until the first upload */
    size_t bytes, stride;
    unsigned gen;
} clffn_pool;

typedef struct clffn_pools {
    const clffn_context *ctx;
    size_t slots; /* the routed experts */
    clffn_pool kind[CLFFN_POOL_KINDS];
    unsigned next_gen;
    /* the layer's last command: an upload into a slot whose expert's weights are there already
     * writes over them, once it has completed */
    const cl_event *busy;
    bool off; /* clffn_moe_set_grouping(moe, 0): uploads make buffers of their own */
} clffn_pools;

/* A buffer of `bytes` for tensor `kind` of expert `slot`: a sub-buffer of the kind's pool (made
 * or made anew as needed; *gen its generation), or where the pool cannot hold it (it would pass
 * the device's largest allocation) a buffer of its own (*gen 0). *over: the slot held weights
 * already, which writing it overwrites (after waiting for wait[0..n) and the layer's last
 * command). Pools switched off give a buffer of its own too. NULL on error, with *err set. */
cl_mem clffn__pool_take(clffn_pools *pools, clffn_pool_kind kind, size_t slot, size_t bytes,
                        bool held, const cl_event *wait, size_t n, unsigned *gen, bool *over,
                        cl_int *err);

/* Releases the pools' buffers (the slots experts hold keep theirs alive). */
void clffn__pools_release(clffn_pools *pools);

#endif
