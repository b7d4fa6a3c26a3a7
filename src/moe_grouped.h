/* A mixture-of-experts layer's routed experts in grouped launches (moe_grouped.c): their weights
 * in the layer's pools, one buffer a kind of tensor (pool.h), and each stage of their forward one
 * launch for all of them. Below the layer (moe.c), which decides when it runs. */
#ifndef CLFFN_MOE_GROUPED_H
#define CLFFN_MOE_GROUPED_H

#include "ffn.h"

/* The pools and the grouped launches' workspace: z, h and u (with b2) for `rows` rows. */
typedef struct clffn_moe_group {
    clffn_pools pools;
    cl_mem z, h, u;
    size_t rows;
    /* tiles past one pass for experts of any type, not q8_0's and q4_0's alone
     * (clffn__group_tiles_pay): the tests' way to run the tiles over every type */
    bool tiles_any_type;
} clffn_moe_group;

/* One grouped forward: the E routed experts (ffn[0 .. E)) at T tokens, k chosen per token; xg
 * and yg [E·T, D], expert e's rows from e·T, xg's from xg_off floats on; with one_x every
 * expert reads the same T rows there instead (one token: the caller's x, no gather); counts as
 * cl/moe.cl's clffn_moe_place leaves it ([2E + 1]: the E counts, a 0, and the list of experts
 * with rows). tiled (past CLFFN_MOE_TILE tokens): xg and yg hold the experts' rows in tiles
 * instead, [TILE·S, D] for S = CLFFN_MOE_TILE_STEPS(T·k, E), and counts the tiles' rows and
 * experts after the list (clffn_moe_tiles); a step a tile, each as an expert's pass of TILE. */
typedef struct clffn_group_pass {
    clffn_ffn *const *ffn;
    size_t experts, top_k, tokens;
    cl_mem counts, xg, yg;
    size_t xg_off;
    bool one_x, tiled;
} clffn_group_pass;

/* Gives the E experts ffn[0 .. E) their slots in g's pools (at the layer's creation); busy is
 * the layer's last command, which an upload over a slot waits for. */
void clffn__group_init(clffn_moe_group *g, const clffn_context *ctx, clffn_ffn *const *ffn,
                       size_t E, const cl_event *busy);

/* Releases the pools and the workspace. */
void clffn__group_release(clffn_moe_group *g);

/* Whether the E experts' weights are all in g's pools alike (one type and layout, W1 and V
 * stacked, each bias the config has), so that they can run grouped, and grouping is on. */
bool clffn__group_ready(const clffn_moe_group *g, clffn_ffn *const *ffn, size_t E);

/* Whether tiles past one pass pay for the E experts' weights (q8_0 or q4_0, the blocks of a
 * byte or less a value; any with g's tiles_any_type), or the counts are better read back. */
bool clffn__group_tiles_pay(const clffn_moe_group *g, clffn_ffn *const *ffn, size_t E);

/* Enqueues the pass: xg through every expert with rows into yg, a launch a stage. The routing
 * must have run before it on q, with the counts on the device. */
clffn_status clffn__group_forward(clffn_moe_group *g, const clffn_group_pass *p,
                                  cl_command_queue q);

#endif
