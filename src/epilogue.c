/* Launches of clffn's own kernels around the products (cl/epilogue.cl, cl/backward.cl). Each
 * sets its kernel's arguments in the order of the kernel's parameter list. */
#include "ffn.h"

#include "clffn_defs.h"
#include "launch.h"
#include "philox.h"

/* The biases of epilogue 1 (b[0] b1, b[1] bv); a bias that is off is never read, and standin,
 * any valid buffer, stands in for it. */
static void bias_args(clffn_args *a, const clffn_ffn *ffn, const clffn_buffer b[2],
                      cl_mem standin) {
    const clffn_config *c = &ffn->cfg;
    const bool b1_on = c->bias1, bv_on = c->gated && c->bias_gate;
    const cl_mem b1 = b1_on ? b[0].mem : standin, bv = bv_on ? b[1].mem : standin;
    const cl_ulong b1_off = b1_on ? b[0].offset : 0, bv_off = bv_on ? b[1].offset : 0;
    const cl_uint flags = (b1_on ? CLFFN_F_BIAS1 : 0) | (bv_on ? CLFFN_F_BIAS_GATE : 0);
    CLFFN_ARG(*a, b1);
    CLFFN_ARG(*a, b1_off);
    CLFFN_ARG(*a, bv);
    CLFFN_ARG(*a, bv_off);
    CLFFN_ARG(*a, flags);
}

bool clffn__epilogue1_vec(const clffn_ffn *ffn) {
    const size_t F = ffn->cfg.d_ff, ld = ffn->hidden_total, col0 = ffn->hidden_col0;
    return F % CLFFN_COLUMNS_PER_ITEM == 0 && ld % CLFFN_COLUMNS_PER_ITEM == 0 &&
           col0 % CLFFN_COLUMNS_PER_ITEM == 0;
}

cl_uint clffn__epilogue1_fused_flags(const clffn_ffn *ffn) {
    const clffn_config *c = &ffn->cfg;
    const bool bv_on = c->gated && c->bias_gate;
    return CLFFN_EP_HIDDEN | (c->gated ? CLFFN_EP_PAIRS : 0) | (c->bias1 ? CLFFN_EP_BIAS : 0) |
           (bv_on ? CLFFN_EP_BIAS_GATE : 0) | (clffn__epilogue1_vec(ffn) ? CLFFN_EP_VEC4 : 0);
}

/* The tail epilogue 1 and its backward share: biases, sizes, dropout, and the float4 switch. */
static void epilogue1_tail(clffn_args *a, const clffn_ffn *ffn, const clffn_buffer b[2],
                           cl_mem standin, size_t tokens, const clffn_dropout_use *drop) {
    const cl_ulong T = tokens, F = ffn->cfg.d_ff, off = drop->offset;
    const cl_ulong thresh = drop->on ? clffn__drop_threshold(drop->p) : 0;
    const cl_float scale = drop->on ? clffn__drop_scale(drop->p) : 1.0f;
    const cl_ulong ld = ffn->hidden_total, col0 = ffn->hidden_col0;
    const cl_uint2 key = {{(cl_uint)ffn->seed, (cl_uint)(ffn->seed >> 32)}};
    const cl_uint vec = clffn__epilogue1_vec(ffn);
    bias_args(a, ffn, b, standin);
    CLFFN_ARG(*a, T);
    CLFFN_ARG(*a, F);
    CLFFN_ARG(*a, thresh);
    CLFFN_ARG(*a, scale);
    CLFFN_ARG(*a, key);
    CLFFN_ARG(*a, off);
    CLFFN_ARG(*a, ld);
    CLFFN_ARG(*a, col0);
    CLFFN_ARG(*a, vec);
}

/* The rows' count on the device, or none (count NULL), the experts' list (in the counts, else
 * in, which the kernel reads anyway) and the group's strides: the epilogues' last arguments. */
static void count_args(clffn_args *a, const clffn_wcount *count, cl_ulong8 grp, cl_mem in) {
    static const clffn_wcount none = {NULL, 0, 0, 0, 0, 0, 0, 0};
    if (!count) { count = &none; }
    const cl_mem ids = count->mem ? count->mem : in; /* read either way (cl/epilogue.cl) */
    CLFFN_ARG(*a, count->mem);
    CLFFN_ARG(*a, count->at);
    CLFFN_ARG(*a, ids);
    CLFFN_ARG(*a, grp);
}

/* A launch over the columns and tokens of each of the count's groups (one without a count). */
static cl_int launch(const clffn_ffn *ffn, cl_kernel k, size_t columns, size_t tokens,
                     const clffn_wcount *count, cl_command_queue queue, cl_event *event) {
    const size_t groups = count && count->groups > 1 ? count->groups : 1;
    if (groups == 1) { return clffn__launch_columns(ffn->ctx, k, columns, tokens, queue, event); }
    const size_t global[3] = {(columns + CLFFN_COLUMNS_PER_ITEM - 1) / CLFFN_COLUMNS_PER_ITEM,
                              tokens, groups};
    return clffn__enqueue_items(&ffn->ctx->programs, queue, k, 3, global, event);
}

cl_int clffn__epilogue1(clffn_ffn *ffn, size_t tokens, const clffn_wcount *count,
                        const clffn_dropout_use *drop, cl_command_queue queue, cl_event *event) {
    const clffn_buffer b[2] = {ffn->b1, ffn->bv};
    const clffn_group_io io = {ffn->ws.z, ffn->ws.h, {{0}}};
    return clffn__epilogue1_group(ffn, tokens, count, b, &io, drop, queue, event);
}

cl_int clffn__epilogue1_group(const clffn_ffn *ffn, size_t tokens, const clffn_wcount *count,
                              const clffn_buffer bias[2], const clffn_group_io *io,
                              const clffn_dropout_use *drop, cl_command_queue queue,
                              cl_event *event) {
    const cl_ulong ldz = clffn__n1(&ffn->cfg);
    clffn_args a = clffn__args(drop->on ? ffn->epilogue1_train : ffn->epilogue1);
    CLFFN_ARG(a, io->in);
    CLFFN_ARG(a, ldz);
    CLFFN_ARG(a, io->out);
    epilogue1_tail(&a, ffn, bias, io->in, tokens, drop);
    count_args(&a, count, io->grp, io->in);
    const cl_int err = clffn__args_end(&a);
    if (err != CL_SUCCESS) { return err; }
    return launch(ffn, a.kernel, ffn->cfg.d_ff, tokens, count, queue, event);
}

cl_int clffn__epilogue1_backward(clffn_ffn *ffn, size_t tokens, cl_command_queue queue) {
    const clffn_dropout_use *drop = &ffn->last_drop;
    const cl_ulong ldz = clffn__n1(&ffn->cfg);
    const clffn_buffer b[2] = {ffn->b1, ffn->bv};
    clffn_args a = clffn__args(drop->on ? ffn->backward1_train : ffn->backward1);
    CLFFN_ARG(a, ffn->ws.dh);
    CLFFN_ARG(a, ffn->ws.z);
    CLFFN_ARG(a, ldz);
    CLFFN_ARG(a, ffn->ws.dz);
    epilogue1_tail(&a, ffn, b, ffn->ws.z, tokens, drop);
    const cl_int err = clffn__args_end(&a);
    if (err != CL_SUCCESS) { return err; }
    return clffn__launch_columns(ffn->ctx, a.kernel, ffn->cfg.d_ff, tokens, queue, NULL);
}

cl_int clffn__epilogue2(clffn_ffn *ffn, size_t tokens, const clffn_wcount *count, clffn_matrix x,
                        clffn_matrix y, cl_command_queue queue, cl_event *event) {
    const clffn_group_io io = {ffn->ws.u, y.mem, {{0}}};
    return clffn__epilogue2_group(ffn, tokens, count, &ffn->b2, &io, y.off, x, queue, event);
}

cl_int clffn__epilogue2_group(const clffn_ffn *ffn, size_t tokens, const clffn_wcount *count,
                              const clffn_buffer *b2, const clffn_group_io *io, size_t y_offset,
                              clffn_matrix x, cl_command_queue queue, cl_event *event) {
    const clffn_config *c = &ffn->cfg;
    const cl_mem b2m = c->bias2 ? b2->mem : io->in;
    const cl_ulong b2_off = c->bias2 ? b2->offset : 0;
    const cl_ulong xo = x.off, yo = y_offset, T = tokens, D = c->d_model;
    const cl_uint flags = (c->bias2 ? CLFFN_F_BIAS2 : 0) | (c->residual ? CLFFN_F_RESIDUAL : 0);
    const cl_uint vec = (D % CLFFN_COLUMNS_PER_ITEM) == 0;
    clffn_args a = clffn__args(ffn->epilogue2);
    CLFFN_ARG(a, io->in);
    CLFFN_ARG(a, io->out);
    CLFFN_ARG(a, yo);
    CLFFN_ARG(a, x.mem);
    CLFFN_ARG(a, xo);
    CLFFN_ARG(a, b2m);
    CLFFN_ARG(a, b2_off);
    CLFFN_ARG(a, flags);
    CLFFN_ARG(a, vec);
    CLFFN_ARG(a, T);
    CLFFN_ARG(a, D);
    count_args(&a, count, io->grp, io->in);
    const cl_int err = clffn__args_end(&a);
    if (err != CL_SUCCESS) { return err; }
    return launch(ffn, a.kernel, c->d_model, tokens, count, queue, event);
}

/* Partial sums of CLFFN_COLSUM_ROWS-row chunks, then their sums (cl/backward.cl says why two
 * passes). */
cl_int clffn__column_sums(clffn_ffn *ffn, clffn_matrix m, size_t rows, size_t n,
                          const clffn_buffer *out, int accumulate, cl_command_queue queue) {
    const cl_ulong mo = m.off, ld = m.ld, r = rows, nn = n, oo = out->offset;
    const cl_ulong chunk_rows = CLFFN_COLSUM_ROWS;
    const cl_ulong chunks = (rows + CLFFN_COLSUM_ROWS - 1) / CLFFN_COLSUM_ROWS;
    const cl_uint acc = accumulate != 0;
    clffn_args a = clffn__args(ffn->column_partials);
    CLFFN_ARG(a, m.mem);
    CLFFN_ARG(a, mo);
    CLFFN_ARG(a, ld);
    CLFFN_ARG(a, r);
    CLFFN_ARG(a, nn);
    CLFFN_ARG(a, chunk_rows);
    CLFFN_ARG(a, ffn->ws.colsum);
    cl_int err = clffn__args_end(&a);
    const size_t global[2] = {(n + CLFFN_COLUMNS_PER_ITEM - 1) / CLFFN_COLUMNS_PER_ITEM,
                              (size_t)chunks};
    if (err == CL_SUCCESS) {
        err = clffn__enqueue_items(&ffn->ctx->programs, queue, a.kernel, 2, global, NULL);
    }
    clffn_args s = clffn__args(ffn->column_sums);
    CLFFN_ARG(s, ffn->ws.colsum);
    CLFFN_ARG(s, chunks);
    CLFFN_ARG(s, nn);
    CLFFN_ARG(s, out->mem);
    CLFFN_ARG(s, oo);
    CLFFN_ARG(s, acc);
    if (err == CL_SUCCESS) { err = clffn__args_end(&s); }
    if (err == CL_SUCCESS) {
        err = clffn__enqueue_items(&ffn->ctx->programs, queue, s.kernel, 1, &n, NULL);
    }
    return err;
}
