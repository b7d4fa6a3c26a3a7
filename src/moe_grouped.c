/* A mixture-of-experts layer's experts in grouped launches: with the counts on the device and
 * every routed expert's weights in the layer's pools (pool.h), each stage of the experts'
 * forward is one launch for all of them, the expert in the third dimension:
 *
 *   xg[E·T, D] ─W1|V─► z[E·T, N1] ─epilogue1─► h[E·T, F] ─W2─► yg[E·T, D] (─epilogue2─► with b2)
 *
 * (the epilogues in the products' kernels where the context fuses them, as a forward does)
 *
 * expert e's rows from e·T, n_e of them live (counts[e]). The launches run min(E, T·k) steps,
 * each taking its expert from the routing's list of the experts with rows (cl/moe.cl's
 * clffn_moe_place), so an unchosen expert costs nothing, not even an empty work-group. Each
 * expert's sums are those of its own FFN's launch at T tokens (the same kernels, built for T,
 * cl/weights.cl's CLFFN_GROUP_SHIFT), so the layer's bits do not change. E launches of each
 * stage become one: a device's per-launch cost, on the host and between kernels, no longer
 * grows with E.
 *
 * Past one pass of the kernels (T > CLFFN_MOE_TILE) the steps are tiles instead: each expert's
 * rows in tiles of CLFFN_MOE_TILE, a step each, at most CLFFN_MOE_TILE_STEPS(T·k, E) of them
 * (cl/moe.cl's clffn_moe_tiles), and each tile sums as a pass of the expert's own forward over
 * its rows does (src/forward.c, the capacity of a pass past CLFFN_MAX_KERNEL_TOKENS). The rows
 * stay packed (T·k of them, the last tile of each expert part empty), so a prefill keeps its
 * counts on the device too. */
#include "moe_grouped.h"

#include "clffn_defs.h"
#include "dtype.h"
#include "launch.h"

void clffn__group_init(clffn_moe_group *g, const clffn_context *ctx, clffn_ffn *const *ffn,
                       size_t E, const cl_event *busy) {
    g->pools.ctx = ctx;
    g->pools.slots = E;
    g->pools.busy = busy;
    for (size_t e = 0; e < E; ++e) {
        ffn[e]->pools = &g->pools;
        ffn[e]->pool_slot = e;
    }
}

void clffn__group_release(clffn_moe_group *g) {
    clffn__pools_release(&g->pools);
    cl_mem *mems[3] = {&g->z, &g->h, &g->u};
    for (int i = 0; i < 3; ++i) {
        if (*mems[i]) { clReleaseMemObject(*mems[i]); }
        *mems[i] = NULL;
    }
    g->rows = 0;
}

bool clffn__group_ready(const clffn_moe_group *g, clffn_ffn *const *ffn, size_t E) {
    const clffn_ffn *f0 = ffn[0];
    const clffn_config *c = &f0->cfg;
    const bool need[CLFFN_POOL_KINDS] = {true, c->bias1, c->gated && c->bias_gate, true, c->bias2};
    if (g->pools.off) { return false; }
    for (size_t e = 0; e < E; ++e) {
        const clffn_ffn *f = ffn[e];
        if (f->pools != &g->pools || !f->has_weights || f->w1.dtype != f0->w1.dtype ||
            f->w1.layout != f0->w1.layout || (c->gated && !f->stacked)) {
            return false;
        }
        for (int k = 0; k < CLFFN_POOL_KINDS; ++k) {
            if (need[k] && (!f->pool_gen[k] || f->pool_gen[k] != g->pools.kind[k].gen)) {
                return false;
            }
        }
    }
    return true;
}

/* z, h (and u, with b2) for `rows` rows, all of them or none. */
static clffn_status grow(clffn_moe_group *g, const clffn_config *c, size_t rows,
                         cl_command_queue q) {
    if (rows <= g->rows) { return CLFFN_SUCCESS; }
    const size_t f = sizeof(float), widths[3] = {clffn__n1(c), c->d_ff, c->d_model};
    const size_t n = c->bias2 ? 3 : 2;
    cl_mem m[3] = {NULL, NULL, NULL};
    cl_int err = CL_SUCCESS;
    for (size_t i = 0; i < n && err == CL_SUCCESS; ++i) {
        m[i] = clffn__buffer(g->pools.ctx, CL_MEM_READ_WRITE, rows * widths[i] * f, &err);
    }
    if (err != CL_SUCCESS) {
        for (size_t i = 0; i < n; ++i) {
            if (m[i]) { clReleaseMemObject(m[i]); }
        }
        return (clffn_status)err;
    }
    cl_mem *mine[3] = {&g->z, &g->h, &g->u};
    for (size_t i = 0; i < 3; ++i) {
        if (*mine[i]) { clffn__release_when_done(q, *mine[i]); }
        *mine[i] = m[i];
    }
    g->rows = rows;
    return CLFFN_SUCCESS;
}

/* An expert's weight matrix as the whole pool: the first expert's, in the pool's buffer. */
static clffn_linear pooled(const clffn_linear *w, const clffn_pool *p) {
    clffn_linear m = *w;
    m.mem = p->parent, m.offset = 0;
    return m;
}

/* The grouped launches' steps: the experts that can have rows, or the tiles that can. */
static cl_uint steps(const clffn_group_pass *p) {
    const size_t most = p->tokens * p->top_k;
    if (p->tiled) { return (cl_uint)CLFFN_MOE_TILE_STEPS(most, p->experts); }
    return (cl_uint)(most < p->experts ? most : p->experts);
}

/* The rows a step's product runs: an expert's T, or a tile's. */
static size_t step_rows(const clffn_group_pass *p) { return p->tiled ? CLFFN_MOE_TILE : p->tokens; }

/* A product's count over the steps: the list of experts with rows after the counts, or the
 * tiles' rows and experts after it (cl/moe.cl, clffn_moe_tiles); w_stride bytes from one
 * expert's weights to the next, x_stride and y_stride floats from one step's rows to the next. */
static clffn_wcount step_count(const clffn_group_pass *p, cl_ulong w_stride, cl_ulong x_stride,
                               cl_ulong y_stride) {
    const cl_uint E = (cl_uint)p->experts, S = steps(p);
    const clffn_wcount c = {
        p->counts, p->tiled ? 2 * E + 1 : 0,    S, p->tiled ? 0 : E + 1, w_stride, x_stride,
        y_stride,  p->tiled ? 2 * E + 1 + S : 0};
    return c;
}

/* The first epilogue as the first product's kernel applies it (clffn_wgemv_rows_act, _glu):
 * e's hidden rows and biases e's strides on. */
static clffn_wepi first_ep(const clffn_ffn *f0, const clffn_pool *pool, cl_mem h, size_t T) {
    const clffn_config *c = &f0->cfg;
    const bool bv_on = c->gated && c->bias_gate;
    const cl_uint flags = clffn__epilogue1_fused_flags(f0);
    const clffn_pool *b = &pool[c->bias1 ? CLFFN_POOL_B1 : CLFFN_POOL_BV];
    const clffn_wepi ep = {flags,
                           (cl_uint)c->activation,
                           c->d_ff,
                           NULL, /* V: stacked into W1 (the linear layer sets it) */
                           0,
                           {h, 0, c->d_ff},
                           {c->bias1 ? pool[CLFFN_POOL_B1].parent : h, 0},
                           {bv_on ? pool[CLFFN_POOL_BV].parent : h, 0},
                           (c->bias1 || bv_on) ? b->stride / sizeof(float) : 0,
                           T * c->d_ff};
    return ep;
}

/* The two products, planned (plan) or enqueued, with the first epilogue between them and the
 * second after them, each in its product's kernel where the context fuses them (the forward's
 * rule, src/forward.c); *second_done says whether the second was. */
static cl_int products(const clffn_moe_group *g, const clffn_group_pass *p,
                       const clffn_gemm_env *base, bool plan, cl_command_queue q,
                       bool *second_done) {
    const clffn_ffn *f0 = p->ffn[0];
    const clffn_config *c = &f0->cfg;
    const clffn_pool *pool = g->pools.kind;
    const size_t T = step_rows(p), D = c->d_model, F = c->d_ff, N1 = clffn__n1(c);
    const size_t x_stride = p->one_x ? 0 : T * D;
    const clffn_wcount c1 = step_count(p, pool[CLFFN_POOL_W1].stride, x_stride, T * N1);
    const clffn_wcount c2 = step_count(p, pool[CLFFN_POOL_W2].stride, T * F, T * D);
    const clffn_linear w1 = pooled(&f0->w1, &pool[CLFFN_POOL_W1]);
    const clffn_linear w2 = pooled(&f0->w2, &pool[CLFFN_POOL_W2]);
    const clffn_matrix x = {p->xg, p->xg_off, D}, z = {g->z, 0, N1}, h = {g->h, 0, F};
    const bool fused = f0->ctx->fused_epilogues != 0;
    clffn_gemm_env env = *base;
    env.count = &c1;
    cl_int err;
    if (fused && clffn__linear_takes_ep(&env, &w1, NULL, T, c->gated)) {
        const clffn_wepi ep = first_ep(f0, pool, h.mem, T);
        err = clffn__linear_forward_ep(&env, &w1, NULL, T, x, z, &ep, NULL);
    } else {
        err = clffn__linear_forward(&env, &w1, T, x, 0.0f, z);
        if (err == CL_SUCCESS && !plan) {
            const clffn_pool *b = &pool[c->bias1 ? CLFFN_POOL_B1 : CLFFN_POOL_BV];
            const clffn_buffer bias[2] = {{pool[CLFFN_POOL_B1].parent, 0},
                                          {pool[CLFFN_POOL_BV].parent, 0}};
            const clffn_group_io io = {
                z.mem,
                h.mem,
                {{T * N1, T * F, b->stride / sizeof(float), 0, c1.ids_at, 0, 0, c1.experts_at}}};
            const clffn_dropout_use none = {false, 0.0f, 0};
            err = clffn__epilogue1_group(f0, T, &c1, bias, &io, &none, q, NULL);
        }
    }
    env.count = &c2;
    const clffn_matrix yg = {p->yg, 0, D};
    *second_done = !c->bias2 || (fused && clffn__linear_takes_ep(&env, &w2, NULL, T, false));
    if (err != CL_SUCCESS) { return err; }
    if (!c->bias2 || !*second_done) {
        const clffn_matrix u = {c->bias2 ? g->u : p->yg, 0, D};
        return clffn__linear_forward(&env, &w2, T, h, 0.0f, u);
    }
    const clffn_pool *b2 = &pool[CLFFN_POOL_B2];
    const clffn_wepi ep = {CLFFN_EP_BIAS,
                           0,
                           0,
                           NULL,
                           0,
                           {h.mem, 0, F},
                           {b2->parent, 0},
                           {b2->parent, 0},
                           b2->stride / sizeof(float),
                           0};
    return clffn__linear_forward_ep(&env, &w2, NULL, T, h, yg, &ep, NULL);
}

clffn_status clffn__group_forward(clffn_moe_group *g, const clffn_group_pass *p,
                                  cl_command_queue q) {
    clffn_ffn *f0 = p->ffn[0];
    const clffn_config *c = &f0->cfg;
    const size_t T = step_rows(p), D = c->d_model;
    /* an expert's rows by its index, or a tile's by the step */
    clffn_status st = grow(g, c, (p->tiled ? steps(p) : p->experts) * T, q);
    if (st != CLFFN_SUCCESS) { return st; }
    const clffn_gemm_env env = clffn__gemm_env(f0, &q);
    clffn__env_plan(&env);
    bool second_done = false;
    cl_int err = products(g, p, &env, true, q, &second_done);
    const cl_int reserved = clffn__env_reserve(&env);
    if (err == CL_SUCCESS) { err = reserved; }
    if (err == CL_SUCCESS) { err = products(g, p, &env, false, q, &second_done); }
    if (err == CL_SUCCESS && !second_done) {
        const clffn_wcount c2 = step_count(p, 0, 0, 0);
        const clffn_pool *b2 = &g->pools.kind[CLFFN_POOL_B2];
        const clffn_group_io io = {
            g->u,
            p->yg,
            {{T * D, T * D, b2->stride / sizeof(float), 0, c2.ids_at, 0, 0, c2.experts_at}}};
        const clffn_matrix x = {p->xg, 0, D}; /* no residual in an expert: unread */
        const clffn_buffer bias = {b2->parent, 0};
        err = clffn__epilogue2_group(f0, T, &c2, &bias, &io, 0, x, q, NULL);
    }
    return (clffn_status)err;
}

/* Tiles pay for E experts where their weights are q8_0 or q4_0: a tile reads its expert's
 * weights once, where read back an expert's passes go row-first, each group of its weight rows
 * through every pass while in the cache (src/forward.c), so the more bytes a weight the more the
 * tiles' re-reads cost. On POCL on an AMD EPYC (2 cores, AVX2), tiles against read
 * back: f32 experts 6-22% slower (8 × 1024 -> 2816 at 64, 256 and 512 tokens, 128 × 2048 -> 768
 * at 32 and 128), f16 0-11%, q8_0 and q4_0 level; on AVX-512, f16 3-8% slower, q4_0 level to 18%
 * faster (docs/PERFORMANCE.md, "Tiles for byte blocks alone"). */
bool clffn__group_tiles_pay(const clffn_moe_group *g, clffn_ffn *const *ffn, size_t E) {
    if (g->tiles_any_type) { return true; }
    for (size_t e = 0; e < E; ++e) {
        if (!clffn__dtype_quantized(clffn_ffn_weight_dtype(ffn[e]))) { return false; }
    }
    return true;
}
