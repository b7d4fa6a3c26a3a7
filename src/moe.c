/* A mixture-of-experts layer: a router, top-k, and expert FFNs on their gathered tokens.
 *
 *   x[T,D] ─route─► chosen[T,k], weights[T,k] ─count, place─► counts[E], slot[T,k]
 *          ─gather─► xg ─expert e on rows [o_e, o_e + n_e)─► yg
 *          ─combine─► y[T,D] = ys + Σ_j weights[t,j]·yg[slot[t,j]]   (ys: the shared expert's)
 *
 * The routing kernels are cl/moe.cl's; the experts are ordinary FFNs, so each runs whatever its
 * row count and weight type call for. Two ways to size them:
 *  - counts read back (xg, yg [T·k, D], o_e the lower experts' counts): the host waits for the
 *    E counts and runs each chosen expert on its n_e rows; CLBlast's products need them.
 *  - counts on the device (xg, yg [E·T, D], o_e = e·T), where every expert's products at T
 *    tokens run clffn's own kernels (decoding): the experts run grouped, a launch a stage for
 *    all of them (moe_grouped.c), where their weights are in the layer's pools, else each is
 *    launched for T rows; the kernels read n_e from counts, and an expert with no token reads
 *    no weight. No host wait, so a GPU never idles between the routing and the experts. At one
 *    token every chosen expert's one row is the token itself: the experts read x where it lies
 *    and nothing is gathered (a launch fewer in decoding). A backward after such a forward runs
 *    the routing and the experts again the other way first (moe_backward.c).
 *  - counts on the device past one pass (xg, yg [16·S, D], each expert's rows in tiles of 16
 *    after the lower experts' tiles; S the tiles' bound, CLFFN_MOE_TILE_STEPS), where every
 *    expert's products run clffn's kernels at every count up to T and the experts run grouped:
 *    a step of the grouped launches a tile (moe_grouped.c). Each tile sums as the expert's own
 *    forward sums a pass of its rows read back (src/forward.c, pass_capacity), so the bits are
 *    the same either way.
 * y is written by the last kernel alone: a failure anywhere earlier leaves it untouched, and y
 * may be x itself. */
#include "moe.h"

#include "clffn_defs.h"
#include "launch.h"
#include "reference_moe.h"

#include <stdlib.h>
#include <string.h>

static void release_kernel(cl_kernel *k) {
    if (*k) { clReleaseKernel(*k); }
    *k = NULL;
}

void clffn_moe_destroy(clffn_moe *moe) {
    if (!moe) { return; }
    if (moe->last_event) { /* as clffn_ffn_destroy does, for rusticl's late completion */
        clWaitForEvents(1, &moe->last_event);
        clReleaseEvent(moe->last_event);
    }
    for (size_t i = 0; moe->ffn && i < moe->n_ffn; ++i) { clffn_ffn_destroy(moe->ffn[i]); }
    free(moe->ffn);
    clffn__scratch_release(&moe->wscratch);
    clffn__scratch_release(&moe->gscratch);
    clffn__group_release(&moe->group);
    cl_mem *mems[] = {&moe->router, &moe->bias,   &moe->probs,    &moe->chosen,  &moe->weights,
                      &moe->slot,   &moe->counts, &moe->xg,       &moe->yg,      &moe->ys,
                      &moe->io_x,   &moe->io_y,   &moe->io_dx,    &moe->dyg,     &moe->dxg,
                      &moe->dxs,    &moe->dlogit, &moe->g_router, &moe->g_rbias, &moe->gate,
                      &moe->dys};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; ++i) { clffn__release_mem(mems[i]); }
    cl_kernel *ks[] = {&moe->logits,       &moe->route,           &moe->count,
                       &moe->place,        &moe->gather,          &moe->combine,
                       &moe->scatter_dy,   &moe->router_backward, &moe->dx_kernel,
                       &moe->router_grads, &moe->scale_dy,        &moe->route_few,
                       &moe->logits_rows};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; ++i) { release_kernel(ks[i]); }
    free(moe->host_counts);
    free(moe);
}

/* The routing kernels, from the experts' own epilogue program (cl/moe.cl is part of it), so a
 * layer builds nothing its experts do not. */
static clffn_status make_kernels(clffn_moe *moe) {
    const clffn_program_key key = {.activation = (int)moe->cfg.expert.activation,
                                   .gated = moe->cfg.expert.gated ? 1 : 0};
    cl_program p = NULL;
    clffn_status st = clffn__get_program(&moe->ctx->programs, &key, &p);
    if (st != CLFFN_SUCCESS) { return st; }
    static const char *const names[13] = {
        "clffn_moe_logits",       "clffn_moe_route",           "clffn_moe_count",
        "clffn_moe_place",        "clffn_moe_gather",          "clffn_moe_combine",
        "clffn_moe_scatter_dy",   "clffn_moe_router_backward", "clffn_moe_dx",
        "clffn_moe_router_grads", "clffn_moe_scale_dy",        "clffn_moe_route_few",
        "clffn_moe_logits_rows"};
    cl_kernel *ks[13] = {&moe->logits,       &moe->route,           &moe->count,
                         &moe->place,        &moe->gather,          &moe->combine,
                         &moe->scatter_dy,   &moe->router_backward, &moe->dx_kernel,
                         &moe->router_grads, &moe->scale_dy,        &moe->route_few,
                         &moe->logits_rows};
    cl_int err = CL_SUCCESS;
    for (size_t i = 0; i < 13 && err == CL_SUCCESS; ++i) {
        *ks[i] = clCreateKernel(p, names[i], &err);
    }
    return (clffn_status)err;
}

clffn_status clffn_moe_create(clffn_context *ctx, const clffn_moe_config *config, clffn_moe **out) {
    if (!ctx || !out) { return CLFFN_ERROR_NULL_ARGUMENT; }
    clffn_status st = clffn__moe_config_check(config);
    if (st != CLFFN_SUCCESS) { return st; }
    clffn_moe *moe = calloc(1, sizeof *moe);
    if (!moe) { return CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
    moe->ctx = ctx;
    moe->cfg = *config;
    moe->n_ffn = config->experts + (config->shared_expert ? 1 : 0);
    moe->router_rows = clffn__moe_router_rows(config);
    moe->few_choices = CLFFN_MOE_LANES;
    moe->router_items = ctx->cpu;
    moe->ffn = calloc(moe->n_ffn, sizeof *moe->ffn);
    moe->host_counts = malloc(config->experts * sizeof *moe->host_counts);
    st = moe->ffn && moe->host_counts ? CLFFN_SUCCESS : CLFFN_ERROR_OUT_OF_HOST_MEMORY;
    const clffn_config shared = clffn__moe_shared_config(config);
    for (size_t i = 0; i < moe->n_ffn && st == CLFFN_SUCCESS; ++i) {
        st = clffn_ffn_create(ctx, i < config->experts ? &config->expert : &shared, &moe->ffn[i]);
        if (st == CLFFN_SUCCESS && !ctx->share_scratch) { /* else the context's, as created */
            clffn__ffn_share_scratch(moe->ffn[i], &moe->wscratch, &moe->gscratch);
        }
    }
    if (st == CLFFN_SUCCESS) { st = make_kernels(moe); }
    if (st == CLFFN_SUCCESS) {
        clffn__group_init(&moe->group, ctx, moe->ffn, config->experts, &moe->last_event);
    }
    if (st != CLFFN_SUCCESS) {
        clffn_moe_destroy(moe);
        return st;
    }
    *out = moe;
    return CLFFN_SUCCESS;
}

bool clffn__moe_split(const clffn_moe *moe) {
    for (size_t e = 0; e < moe->cfg.experts; ++e) {
        if (clffn__moe_remote(moe, e)) { return true; }
    }
    return false;
}

clffn_status clffn__moe_remote_pass(const clffn_moe *moe, size_t T, bool backward,
                                    clffn_remote_pass *p) {
    memset(p, 0, sizeof *p);
    if (!clffn__moe_split(moe)) { return CLFFN_SUCCESS; }
    p->jobs = malloc(moe->cfg.experts * sizeof *p->jobs);
    if (!p->jobs) { return CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
    size_t row0 = 0;
    for (size_t e = 0; e < moe->cfg.experts; ++e) {
        const size_t n = moe->host_counts[e];
        if (n && clffn__moe_remote(moe, e)) {
            const clffn_remote_job j = {moe->ffn[e], n, row0, CLFFN_SUCCESS, e};
            p->jobs[p->count++] = j;
        }
        row0 += n;
    }
    p->rows = T * moe->cfg.top_k, p->d_model = moe->cfg.expert.d_model, p->tokens = T;
    p->backward = backward;
    p->exchange = moe->exchange, p->user = moe->exchange_user, p->experts = moe->cfg.experts;
    p->in = backward ? moe->dyg : moe->xg, p->out = backward ? moe->dxg : moe->yg;
    return CLFFN_SUCCESS;
}

clffn_ffn *clffn_moe_expert(clffn_moe *moe, size_t e) {
    return moe && e < moe->n_ffn && !clffn__moe_away(moe, e) ? moe->ffn[e] : NULL;
}

/* A read-only device copy of n host floats (blocking). */
static cl_mem upload(clffn_context *ctx, const float *src, size_t n, cl_int *err) {
    cl_mem m = clffn__buffer(ctx, CL_MEM_READ_ONLY, n * sizeof(float), err);
    if (*err == CL_SUCCESS) { *err = clffn__write(ctx->queue, m, 0, n * sizeof(float), src); }
    if (*err != CL_SUCCESS && m) {
        clReleaseMemObject(m);
        m = NULL;
    }
    return m;
}

clffn_status clffn_moe_upload_router(clffn_moe *moe, const float *weight, const float *bias) {
    if (!moe || !weight || (moe->cfg.router_bias && !bias)) { return CLFFN_ERROR_NULL_ARGUMENT; }
    const size_t R = moe->router_rows, D = moe->cfg.expert.d_model;
    size_t n, bytes;
    if (!clffn__mul_ok(R, D, &n) || !clffn__mul_ok(n, sizeof(float), &bytes)) {
        return CLFFN_ERROR_SIZE_OVERFLOW;
    }
    cl_int err = CL_SUCCESS;
    cl_mem w = upload(moe->ctx, weight, n, &err), b = NULL;
    if (err == CL_SUCCESS && moe->cfg.router_bias) { b = upload(moe->ctx, bias, R, &err); }
    if (err != CL_SUCCESS) {
        if (w) { clReleaseMemObject(w); }
        return (clffn_status)err;
    }
    cl_command_queue q = moe->ctx->queue;
    if (moe->router) { clffn__release_when_done(q, moe->router); }
    if (moe->bias) { clffn__release_when_done(q, moe->bias); }
    moe->router = w, moe->bias = b;
    return CLFFN_SUCCESS;
}

/* The rows of xg and yg a forward of T tokens needs (clffn_moe_rows). */
static size_t gathered_rows(const clffn_moe *moe, size_t T, clffn_moe_rows rows) {
    const size_t E = moe->cfg.experts, n = T * moe->cfg.top_k;
    return rows == CLFFN_MOE_ROWS_BY_EXPERT ? E * T
           : rows == CLFFN_MOE_ROWS_TILED   ? CLFFN_MOE_TILE * CLFFN_MOE_TILE_STEPS(n, E)
                                            : n;
}

/* Grows the workspace to T tokens and xg, yg to `rows` rows, all of it or none. */
static clffn_status grow(clffn_moe *moe, size_t T, size_t rows, cl_command_queue queue) {
    if (T <= moe->tokens && rows <= moe->g_rows) { return CLFFN_SUCCESS; }
    if (T < moe->tokens) { T = moe->tokens; }
    if (rows < moe->g_rows) { rows = moe->g_rows; }
    const size_t E = moe->cfg.experts, k = moe->cfg.top_k, D = moe->cfg.expert.d_model;
    const size_t f = sizeof(float), shared = moe->cfg.shared_expert ? 1 : 0;
    const size_t sizes[9] = {T * E * f,
                             T * k * f,
                             T * k * f,
                             T * k * f,
                             (2 * E + 1 + 2 * CLFFN_MOE_TILE_STEPS(T * k, E)) * f,
                             rows * D * f,
                             rows * D * f,
                             shared ? T * D * f : f,
                             moe->router_rows > E ? T * f : f};
    cl_mem m[9] = {NULL};
    cl_int err = CL_SUCCESS;
    for (size_t i = 0; i < 9 && err == CL_SUCCESS; ++i) {
        m[i] = clffn__buffer(moe->ctx, CL_MEM_READ_WRITE, sizes[i], &err);
    }
    if (err != CL_SUCCESS) {
        for (size_t i = 0; i < 9; ++i) { clffn__release_mem(&m[i]); }
        return (clffn_status)err;
    }
    cl_mem *mine[9] = {&moe->probs, &moe->chosen, &moe->weights, &moe->slot, &moe->counts,
                       &moe->xg,    &moe->yg,     &moe->ys,      &moe->gate};
    for (size_t i = 0; i < 9; ++i) {
        if (*mine[i]) { clffn__release_when_done(queue, *mine[i]); }
        *mine[i] = m[i];
    }
    moe->tokens = T, moe->g_rows = rows;
    return CLFFN_SUCCESS;
}

/* Every size, buffer and weight the forward touches, checked before anything is enqueued. */
static clffn_status check_forward(clffn_moe *moe, size_t T, cl_mem x, size_t xo, cl_mem y,
                                  size_t yo, cl_command_queue queue) {
    const size_t R = moe->router_rows, k = moe->cfg.top_k, D = moe->cfg.expert.d_model;
    size_t nx, ng, bytes; /* probs [T, E] and dlogit [T, R] within R */
    if (!clffn__mul_ok(T, D, &nx) || !clffn__mul_ok(nx, k, &ng) ||
        !clffn__mul_ok(ng, sizeof(float), &bytes) || (cl_ulong)bytes > moe->ctx->max_alloc ||
        !clffn__mul_ok(T, R * sizeof(float), &bytes) || (cl_ulong)bytes > moe->ctx->max_alloc ||
        T * k > UINT32_MAX || D > UINT32_MAX) {
        return CLFFN_ERROR_SIZE_OVERFLOW;
    }
    clffn_status st;
    if ((st = clffn__check_queue(moe->ctx, queue)) != CLFFN_SUCCESS ||
        (st = clffn__check_buffer(moe->ctx, x, xo, nx)) != CLFFN_SUCCESS ||
        (st = clffn__check_buffer(moe->ctx, y, yo, nx)) != CLFFN_SUCCESS) {
        return st;
    }
    if (x == y && xo != yo && xo < yo + nx && yo < xo + nx) { return CLFFN_ERROR_BUFFER_OVERLAP; }
    if (!moe->router) { return CLFFN_ERROR_NO_WEIGHTS; }
    for (size_t i = 0; i < moe->n_ffn; ++i) {
        if (!moe->ffn[i]->has_weights && !clffn__moe_away(moe, i)) {
            return CLFFN_ERROR_NO_WEIGHTS;
        }
    }
    return CLFFN_SUCCESS;
}

/* kernel over global (dims dimensions; local NULL: an element-wise kernel, launched through
 * clffn__enqueue_items), its event kept as the layer's last. */
static cl_int enqueue_nd(clffn_moe *moe, cl_command_queue q, cl_kernel kernel, cl_uint dims,
                         const size_t *global, const size_t *local) {
    cl_event ev = NULL;
    const cl_int err =
        local ? clEnqueueNDRangeKernel(q, kernel, dims, NULL, global, local, 0, NULL, &ev)
              : clffn__enqueue_items(&moe->ctx->programs, q, kernel, dims, global, &ev);
    if (err == CL_SUCCESS) {
        if (moe->last_event) { clReleaseEvent(moe->last_event); }
        moe->last_event = ev;
    }
    return err;
}

cl_int clffn__moe_enqueue(clffn_moe *moe, cl_command_queue q, cl_kernel kernel, size_t g0,
                          size_t g1) {
    const size_t global[2] = {g0, g1};
    return enqueue_nd(moe, q, kernel, g1 ? 2 : 1, global, NULL);
}

/* The router's logits into probs (and the gate's into gate): a work-group of CLFFN_MOE_LANES
 * (cl/moe.cl) per router row and token, or on a CPU device a work-item (the same bits). */
static cl_int enqueue_logits(clffn_moe *moe, cl_uint T, cl_mem x, cl_ulong xo, cl_command_queue q) {
    const clffn_moe_config *c = &moe->cfg;
    const cl_uint E = (cl_uint)c->experts, D = (cl_uint)c->expert.d_model;
    const cl_int has_bias = c->router_bias ? 1 : 0;
    cl_mem bias = moe->bias ? moe->bias : moe->router; /* not read without a bias */
    const bool rows = moe->router_items != 0;
    clffn_args a = clffn__args(rows ? moe->logits_rows : moe->logits);
    CLFFN_ARG(a, x), CLFFN_ARG(a, xo), CLFFN_ARG(a, moe->router), CLFFN_ARG(a, bias);
    CLFFN_ARG(a, has_bias), CLFFN_ARG(a, E), CLFFN_ARG(a, D), CLFFN_ARG(a, moe->probs);
    CLFFN_ARG(a, moe->gate);
    const cl_uint R = (cl_uint)moe->router_rows; /* the rows form's bound: its items round up */
    if (rows) { CLFFN_ARG(a, R); }
    const cl_int err = clffn__args_end(&a);
    if (err != CL_SUCCESS) { return err; }
    if (rows) {
        const size_t items[2] = {moe->router_rows, T};
        return enqueue_nd(moe, q, moe->logits_rows, 2, items, NULL);
    }
    const size_t global[3] = {CLFFN_MOE_LANES, moe->router_rows, T};
    const size_t local[3] = {CLFFN_MOE_LANES, 1, 1};
    return enqueue_nd(moe, q, moe->logits, 3, global, local);
}

/* clffn_moe_route's arguments, the first nine of clffn_moe_route_few's too. */
static clffn_args route_args(clffn_moe *moe, cl_kernel kernel, cl_uint T) {
    const clffn_moe_config *c = &moe->cfg;
    const cl_uint E = (cl_uint)c->experts, k = (cl_uint)c->top_k, R = (cl_uint)moe->router_rows;
    const cl_int normalize = c->routing == CLFFN_ROUTING_TOPK_NORMALIZED;
    clffn_args a = clffn__args(kernel);
    CLFFN_ARG(a, E), CLFFN_ARG(a, k), CLFFN_ARG(a, normalize), CLFFN_ARG(a, T);
    CLFFN_ARG(a, moe->probs), CLFFN_ARG(a, moe->chosen), CLFFN_ARG(a, moe->weights);
    CLFFN_ARG(a, R), CLFFN_ARG(a, moe->gate);
    return a;
}

/* route, count and place: in one launch of clffn_moe_route_few where the n choices are at most
 * few_choices, else three. Expert e's rows from e·stride, packed (0), or tiled
 * (CLFFN_MOE_TILED). */
static cl_int enqueue_choice(clffn_moe *moe, cl_uint T, cl_uint stride, cl_command_queue q) {
    const cl_uint E = (cl_uint)moe->cfg.experts, n = T * (cl_uint)moe->cfg.top_k;
    const size_t one[1] = {CLFFN_MOE_LANES};
    const size_t lanes[2] = {CLFFN_MOE_LANES, E}, group[2] = {CLFFN_MOE_LANES, 1};
    const bool few = n <= moe->few_choices;
    clffn_args a = route_args(moe, few ? moe->route_few : moe->route, T);
    if (few) {
        CLFFN_ARG(a, moe->counts), CLFFN_ARG(a, stride), CLFFN_ARG(a, moe->slot);
        cl_int err = clffn__args_end(&a);
        return err != CL_SUCCESS ? err : enqueue_nd(moe, q, moe->route_few, 1, one, one);
    }
    cl_int err = clffn__args_end(&a);
    if (err == CL_SUCCESS) { err = clffn__moe_enqueue(moe, q, moe->route, T, 0); }
    clffn_args b = clffn__args(moe->count);
    CLFFN_ARG(b, moe->chosen), CLFFN_ARG(b, n), CLFFN_ARG(b, moe->counts);
    if (err == CL_SUCCESS && (err = clffn__args_end(&b)) == CL_SUCCESS) {
        err = enqueue_nd(moe, q, moe->count, 2, lanes, group);
    }
    clffn_args p = clffn__args(moe->place);
    CLFFN_ARG(p, moe->chosen), CLFFN_ARG(p, n), CLFFN_ARG(p, moe->counts);
    CLFFN_ARG(p, stride), CLFFN_ARG(p, moe->slot);
    if (err == CL_SUCCESS && (err = clffn__args_end(&p)) == CL_SUCCESS) {
        err = enqueue_nd(moe, q, moe->place, 2, lanes, group);
    }
    return err;
}

/* At one token with the counts on the device, the experts read x itself (the file's head). */
static bool experts_read_x(size_t T, clffn_moe_rows rows) {
    return rows == CLFFN_MOE_ROWS_BY_EXPERT && T == 1;
}

/* logits, the choice (enqueue_choice) and gather (unless experts_read_x); then, where packed,
 * the counts read back (blocking). */
static cl_int enqueue_routing(clffn_moe *moe, cl_uint T, cl_mem x, cl_ulong xo, clffn_moe_rows rows,
                              cl_command_queue q) {
    const clffn_moe_config *c = &moe->cfg;
    const cl_uint E = (cl_uint)c->experts, k = (cl_uint)c->top_k, D = (cl_uint)c->expert.d_model;
    const cl_uint n = T * k;
    const cl_uint stride = rows == CLFFN_MOE_ROWS_BY_EXPERT ? T
                           : rows == CLFFN_MOE_ROWS_TILED   ? CLFFN_MOE_TILED
                                                            : 0;
    cl_int err = enqueue_logits(moe, T, x, xo, q);
    if (err == CL_SUCCESS) { err = enqueue_choice(moe, T, stride, q); }
    if (err == CL_SUCCESS && !experts_read_x(T, rows)) {
        clffn_args g = clffn__args(moe->gather);
        CLFFN_ARG(g, x), CLFFN_ARG(g, xo), CLFFN_ARG(g, moe->slot), CLFFN_ARG(g, D);
        CLFFN_ARG(g, n), CLFFN_ARG(g, k), CLFFN_ARG(g, moe->xg);
        if ((err = clffn__args_end(&g)) == CL_SUCCESS) {
            err = clffn__moe_enqueue(moe, q, moe->gather, D, n);
        }
    }
    if (err == CL_SUCCESS && rows == CLFFN_MOE_ROWS_PACKED) {
        err = clffn__read(q, moe->counts, 0, E * sizeof(cl_uint), moe->host_counts, 0, NULL);
    }
    return err;
}

/* Where a forward of T tokens keeps the counts: on the device as clffn_moe_set_counts() asks
 * (AUTO: unless some expert must go unchosen), where every expert's products run clffn's own
 * kernels, in one pass (BY_EXPERT) or past it grouped in tiles (TILED, where
 * clffn__group_tiles_pay), and xg, yg fit an allocation; else read back (PACKED). */
static clffn_moe_rows rows_for(clffn_moe *moe, size_t T) {
    const size_t E = moe->cfg.experts, D = moe->cfg.expert.d_model;
    const clffn_moe_counts where = moe->counts_where;
    const bool tiled = T > CLFFN_MAX_KERNEL_TOKENS;
    size_t bytes;
    if (where == CLFFN_MOE_COUNTS_HOST ||
        (where == CLFFN_MOE_COUNTS_AUTO && E > T * moe->cfg.top_k) ||
        !clffn__mul_ok(
            gathered_rows(moe, T, tiled ? CLFFN_MOE_ROWS_TILED : CLFFN_MOE_ROWS_BY_EXPERT),
            D * sizeof(float), &bytes) ||
        (cl_ulong)bytes > moe->ctx->max_alloc) {
        return CLFFN_MOE_ROWS_PACKED;
    }
    for (size_t e = 0; e < E; ++e) {
        if (tiled ? !clffn__forward_can_tile(moe->ffn[e], T)
                  : !clffn__forward_can_count(moe->ffn[e], T)) {
            return CLFFN_MOE_ROWS_PACKED;
        }
    }
    /* another context's expert needs its count on the host; tiles run grouped only */
    if (clffn__moe_split(moe) || (tiled && (!clffn__group_tiles_pay(&moe->group, moe->ffn, E) ||
                                            !clffn__group_ready(&moe->group, moe->ffn, E)))) {
        return CLFFN_MOE_ROWS_PACKED;
    }
    return tiled ? CLFFN_MOE_ROWS_TILED : CLFFN_MOE_ROWS_BY_EXPERT;
}

/* The shared expert on every token, and each routed one on its rows. */
static clffn_status run_experts(clffn_moe *moe, size_t T, cl_mem x, size_t xo, clffn_moe_rows rows,
                                cl_command_queue q) {
    const bool counted = rows != CLFFN_MOE_ROWS_PACKED;
    const clffn_moe_config *c = &moe->cfg;
    const size_t D = c->expert.d_model;
    clffn_remote_pass rp; /* the experts on other contexts, beside this one's */
    clffn_status st = clffn__moe_remote_pass(moe, T, false, &rp);
    if (st == CLFFN_SUCCESS) { st = clffn__remote_start(&rp, q); }
    if (st == CLFFN_SUCCESS && c->shared_expert) {
        st = clffn_forward(moe->ffn[c->experts], T, x, xo, moe->ys, 0, q, NULL);
    }
    size_t row0 = 0;
    moe->last_grouped =
        st == CLFFN_SUCCESS && counted && clffn__group_ready(&moe->group, moe->ffn, c->experts);
    const bool one_x = experts_read_x(T, rows);
    const clffn_group_pass gp = {.ffn = moe->ffn,
                                 .experts = c->experts,
                                 .top_k = c->top_k,
                                 .tokens = T,
                                 .counts = moe->counts,
                                 .xg = one_x ? x : moe->xg,
                                 .yg = moe->yg,
                                 .xg_off = one_x ? xo : 0,
                                 .one_x = one_x,
                                 .tiled = rows == CLFFN_MOE_ROWS_TILED};
    if (moe->last_grouped) { st = clffn__group_forward(&moe->group, &gp, q); }
    for (size_t e = 0; e < c->experts && st == CLFFN_SUCCESS && !moe->last_grouped; ++e) {
        if (counted) {
            const clffn_wcount n = {moe->counts, (cl_uint)e, 0, 0, 0, 0, 0, 0};
            st = clffn__forward_counted(moe->ffn[e], T, &n, gp.xg, one_x ? xo : e * T * D, moe->yg,
                                        e * T * D, q);
            continue;
        }
        const size_t n = moe->host_counts[e];
        if (n && !clffn__moe_remote(moe, e)) {
            st = clffn__forward_as_pass(moe->ffn[e], n, T, moe->xg, row0 * D, moe->yg, row0 * D, q);
        }
        row0 += n;
    }
    const clffn_status fin = clffn__remote_finish(&rp, q);
    free(rp.jobs);
    return st != CLFFN_SUCCESS ? st : fin;
}

/* y from the experts' rows and the shared expert's. */
static clffn_status enqueue_combine(clffn_moe *moe, cl_uint T, cl_mem y, cl_ulong yo,
                                    cl_command_queue q) {
    const clffn_moe_config *c = &moe->cfg;
    const cl_uint k = (cl_uint)c->top_k, D = (cl_uint)c->expert.d_model;
    const cl_int shared = c->shared_expert ? 1 : 0, gated = moe->router_rows > c->experts;
    clffn_args a = clffn__args(moe->combine);
    CLFFN_ARG(a, moe->yg), CLFFN_ARG(a, moe->slot), CLFFN_ARG(a, moe->weights);
    CLFFN_ARG(a, moe->ys), CLFFN_ARG(a, shared), CLFFN_ARG(a, D), CLFFN_ARG(a, T);
    CLFFN_ARG(a, k), CLFFN_ARG(a, y), CLFFN_ARG(a, yo), CLFFN_ARG(a, moe->gate);
    CLFFN_ARG(a, gated);
    cl_int err = clffn__args_end(&a);
    if (err == CL_SUCCESS) { err = clffn__moe_enqueue(moe, q, moe->combine, D, T); }
    return (clffn_status)err;
}

clffn_status clffn__moe_route_and_run(clffn_moe *moe, size_t T, cl_mem x, size_t xo,
                                      clffn_moe_rows rows, cl_command_queue q) {
    clffn_status st = grow(moe, T, gathered_rows(moe, T, rows), q);
    if (st != CLFFN_SUCCESS) { return st; }
    /* what the workspace held is going */
    moe->last_tokens = 0, moe->last_host = false, moe->last_counted = false;
    const cl_int err = enqueue_routing(moe, (cl_uint)T, x, xo, rows, q);
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    return run_experts(moe, T, x, xo, rows, q);
}

clffn_status clffn_moe_forward(clffn_moe *moe, size_t tokens, cl_mem x, size_t x_offset, cl_mem y,
                               size_t y_offset, cl_command_queue queue) {
    if (!moe) { return CLFFN_ERROR_NULL_ARGUMENT; }
    clffn_status st = check_forward(moe, tokens, x, x_offset, y, y_offset, queue);
    if (st != CLFFN_SUCCESS || tokens == 0) { return st; }
    const clffn_moe_rows rows = rows_for(moe, tokens);
    st = clffn__moe_route_and_run(moe, tokens, x, x_offset, rows, queue);
    if (st == CLFFN_SUCCESS) { st = enqueue_combine(moe, (cl_uint)tokens, y, y_offset, queue); }
    if (st == CLFFN_SUCCESS) {
        moe->last_tokens = tokens, moe->last_counted = rows != CLFFN_MOE_ROWS_PACKED;
    }
    /* a failure part-way may leave launches after last_event, which an upload over the pools
     * waits for (pool.h): none is left running */
    if (st != CLFFN_SUCCESS) { clFinish(queue); }
    return st;
}
