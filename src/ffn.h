/* The clffn_ffn, owned by ffn.c (create, weights, dropout state), and the helpers its passes
 * share. Files above the context, from the bottom up: launch, gemm, linear, workspace → ffn →
 * epilogue → forward, backward, inspect → tp. Shapes as in clffn.h: T tokens, D = d_model,
 * F = d_ff, N1 = F or 2F (gated). */
#ifndef CLFFN_FFN_H
#define CLFFN_FFN_H

#include "gemm.h"
#include "linear.h"
#include "pool.h"
#include "workspace.h"

/* What a pass does about dropout: whether it drops, with which p, at which Philox offset. */
typedef struct clffn_dropout_use {
    int on;
    float p;
    uint64_t offset;
} clffn_dropout_use;

/* Which of a forward's epilogues its products applied (cl/weights.cl, clffn_wgemv_rows_ep). */
typedef struct clffn_fused {
    bool first, second;
} clffn_fused;

/* The scratch of the FFNs created on a context while it shares one (clffn_context_set_shared_
 * scratch): their weight kernels' (w, wmatrix.h) and CLBlast's (g, gemm.h), one of each however
 * many FFNs, released with the last of its users. Their products run one at a time, on one
 * queue, as the caller promises, so one buffer of each, as large as the largest product needs,
 * serves them all. */
struct clffn_shared_scratch {
    clffn_scratch w, g;
    size_t users;
};

struct clffn_ffn {
    clffn_context *ctx;
    clffn_config cfg;
    cl_kernel epilogue1;       /* no dropout: inference, or p = 0 */
    cl_kernel epilogue1_train; /* with dropout; exists while p > 0 */
    cl_kernel epilogue2;
    cl_kernel backward1;       /* epilogue 1's backward without dropout */
    cl_kernel backward1_train; /* with dropout; exists while p > 0 */
    cl_kernel column_partials; /* the bias gradients' two passes */
    cl_kernel column_sums;

    /* weights, each mem retained (owned or the caller's) */
    bool has_weights;
    bool stacked;           /* gated with V stacked into w1: one product for both */
    clffn_linear w1, v, w2; /* w1: in D, out N1 when stacked, else F; w2: in F, out D */
    /* the layout the caller handed the weights over in, which gradients are written in; the
     * linears' own layout is how they are kept (clffn_context_set_weight_layout) */
    clffn_layout grad_layout;
    clffn_buffer b1, bv, b2;

    /* a tensor-parallel shard holds the hidden columns [hidden_col0, hidden_col0 + d_ff) of a
     * layer hidden_total wide (0 and d_ff when unsplit): dropout indexes by the layer */
    size_t hidden_col0, hidden_total;

    /* dropout state */
    int training;
    uint64_t seed;
    uint64_t rng_offset;

    clffn_workspace ws;
    clffn_scratch scratch; /* CLBlast's, for every product of the FFN */
    clffn_wkernels wk;     /* the few-token and dequantization kernels, for its weights' type */
    /* a mixture-of-experts layer's scratch for CLBlast, which its experts on its context share
     * as they do wk.shared (NULL: scratch) */
    clffn_scratch *shared_scratch;
    /* the context's shared scratch, where the FFN was created while the context shared it
     * (clffn_context_set_shared_scratch): one of its users, whichever scratch it runs on */
    struct clffn_shared_scratch *ctx_shared;
    size_t weight_bytes; /* of W1, V and W2 on the device */
    char message[160];   /* clffn_ffn_error_message() */

    /* an expert of a mixture-of-experts layer: the layer's weight pools and its slot there
     * (pools NULL: buffers of its own), and for each kind of tensor the generation of the pool
     * whose slot its buffer is (0: a buffer of its own; pool.h) */
    clffn_pools *pools;
    size_t pool_slot;
    unsigned pool_gen[CLFFN_POOL_KINDS];

    /* set by a mixture-of-experts layer around its expert's forward: the few-token kernels run
     * as built for this many tokens (0: the pass's own); see clffn_gemm_env */
    size_t kernel_capacity;

    /* the last forward, for clffn_ffn_read_hidden() and clffn_backward() */
    size_t last_tokens;
    clffn_dropout_use last_drop;
    cl_event last_event;         /* completion of epilogue1 of the last forward, or NULL */
    clffn_fused last_fused;      /* its epilogues that its products applied */
    cl_command_queue last_queue; /* its queue (retained), flushed before we wait on it */
    /* the last command the FFN enqueued, forward (epilogue 2) or backward (a marker), or NULL:
     * clffn_ffn_destroy() waits for it */
    cl_event tail;

    /* stage timing (clffn_ffn_set_profiling): a marker before GEMM 1 and epilogue 2's event */
    int profiling;
    cl_event prof_start, prof_end;
};

/* ev (owned) becomes the FFN's tail, the last command it enqueued. */
static inline void clffn__keep_tail(clffn_ffn *ffn, cl_event ev) {
    if (ffn->tail) { clReleaseEvent(ffn->tail); }
    ffn->tail = ev;
}

/* The FFN's products use w and g as their scratch from now on, not scratch buffers of its own:
 * for FFNs whose products never overlap, all on one queue from one thread (a mixture-of-experts
 * layer's experts). w and g outlive the FFN. */
static inline void clffn__ffn_share_scratch(clffn_ffn *ffn, clffn_scratch *w, clffn_scratch *g) {
    ffn->wk.shared = w;
    ffn->shared_scratch = g;
}

static inline clffn_gemm_env clffn__gemm_env(clffn_ffn *ffn, cl_command_queue *queue) {
    clffn_scratch *scratch = ffn->shared_scratch ? ffn->shared_scratch : &ffn->scratch;
    const clffn_gemm_env env = {ffn->ctx, scratch, &ffn->wk, queue, NULL, 0};
    return env;
}

/* forward.c: clffn_forward() with the token count kept on the device (a mixture-of-experts
 * layer's expert, whose rows the host does not read back): tokens is the most it can be, and
 * rows of y past the count are left meaningless. It runs where clffn__forward_can_count() says
 * every product takes clffn's own kernels at that many tokens (which take the count) and no
 * dropout mask would be drawn for all of them; INVALID_ARGUMENT elsewhere. */
bool clffn__forward_can_count(const clffn_ffn *ffn, size_t tokens);

/* Whether a mixture-of-experts layer of T > CLFFN_MAX_KERNEL_TOKENS tokens can run this expert
 * in tiles with its counts on the device (src/moe_grouped.c): every product takes clffn's own
 * kernels at any count up to T (so that the expert's rows, read back, would run them too) and
 * the expert can take a counted pass of CLFFN_MAX_KERNEL_TOKENS. */
bool clffn__forward_can_tile(const clffn_ffn *ffn, size_t tokens);

/* clffn_forward() and clffn_forward_host() of a mixture-of-experts layer's expert on its rows
 * of a pass of pass_tokens tokens: where the expert could take that pass with its count on the
 * device (clffn__forward_can_count), its few-token kernels are those built for pass_tokens,
 * as in that counted pass; past CLFFN_MAX_KERNEL_TOKENS, where it could take the pass in tiles
 * (clffn__forward_can_tile), those built for a full pass of CLFFN_MAX_KERNEL_TOKENS, as each
 * tile is. So its rows sum in the same order whichever way the layer ran them (counts on the
 * device or read back; on one context, several, or in another process). */
clffn_status clffn__forward_as_pass(clffn_ffn *ffn, size_t tokens, size_t pass_tokens, cl_mem x,
                                    size_t x_offset, cl_mem y, size_t y_offset,
                                    cl_command_queue queue);
clffn_status clffn__forward_host_as_pass(clffn_ffn *ffn, size_t tokens, size_t pass_tokens,
                                         const float *x, size_t x_len, float *y, size_t y_len);
clffn_status clffn__forward_counted(clffn_ffn *ffn, size_t tokens, const clffn_wcount *count,
                                    cl_mem x, size_t x_offset, cl_mem y, size_t y_offset,
                                    cl_command_queue queue);

/* ffn.c: the FFN's weights from buffers it holds a reference to (owned or retained), kept in
 * `layout` as dtype and handed over in `given` (W1 and V stacked in m[0] when stacked); and
 * their release. m: w1, b1, v, bv, w2, b2. */
void clffn__ffn_weights_set(clffn_ffn *ffn, clffn_layout layout, clffn_layout given, bool stacked,
                            clffn_dtype dtype, const clffn_buffer m[6]);
void clffn__ffn_weights_release(clffn_ffn *ffn);

/* backward_host.c: the caller's host gradient arrays and the FFN's own gradient buffers
 * (its workspace's g_w1 … g_b2, W1 and V stacked): whether the arrays suit the FFN
 * (NULL_ARGUMENT for a missing one, COMPRESSED_WEIGHTS for a weight gradient of compressed
 * weights); the buffers as clffn_backward() takes them; copies in (to accumulate onto) and out,
 * enqueued on q without waiting. */
clffn_status clffn__host_grads_check(clffn_ffn *ffn, const clffn_weight_arrays *g);
clffn_device_weights clffn__host_grads_device(const clffn_ffn *ffn);
cl_int clffn__host_grads_upload(clffn_ffn *ffn, cl_command_queue q, const clffn_weight_arrays *g);
cl_int clffn__host_grads_download(clffn_ffn *ffn, cl_command_queue q, const clffn_weight_arrays *g);
/* backward_host.c: zeroes host gradient arrays of config c (w1, b1, v, bv, w2, b2 as c has
 * them; NULL ones skipped): an expert that no token chose. */
void clffn__host_grads_zero(const clffn_config *c, const clffn_weight_arrays *g);

/* ffn.c: refuses a call with st, keeping what it refused in words for
 * clffn_ffn_error_message(). Returns st. */
clffn_status clffn__ffn_refuse(clffn_ffn *ffn, clffn_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A weight gradient asked of weights kept compressed. */
static inline clffn_status clffn__refuse_compressed_grads(clffn_ffn *ffn) {
    return clffn__ffn_refuse(ffn, CLFFN_ERROR_COMPRESSED_WEIGHTS,
                             "the weights are kept in %s: no gradient of W1, V or W2 (pass NULL "
                             "for them); dx and the biases' gradients are computed",
                             clffn_dtype_name(ffn->w1.dtype));
}

/* epilogue.c: clffn's own kernels around the products (cl/epilogue.cl, cl/backward.cl) */
/* Whether epilogue 1 takes its float4 path (cl/epilogue.cl's vec): d_ff, and the layer's
 * width and this shard's first column (for dropout's Philox blocks), multiples of 4. */
bool clffn__epilogue1_vec(const clffn_ffn *ffn);

/* Epilogue 1's flags for the first product's kernel that applies it (clffn_wepi, CLFFN_EP_*):
 * the first epilogue, paired rows when gated, the biases the config has, the float4 form where
 * epilogue 1 takes it. */
cl_uint clffn__epilogue1_fused_flags(const clffn_ffn *ffn);

/* h [T, F] = dropout(act(z1 + b1) ⊙ (z2 + bv)); with count (NULL: none) its first rows alone */
cl_int clffn__epilogue1(clffn_ffn *ffn, size_t tokens, const clffn_wcount *count,
                        const clffn_dropout_use *drop, cl_command_queue queue, cl_event *event);
/* dz [T, N1] from dh [T, F], z and the last forward's dropout */
cl_int clffn__epilogue1_backward(clffn_ffn *ffn, size_t tokens, cl_command_queue queue);
/* y [T, D] = u + b2 (+ x); with count (NULL: none) its first rows alone */
cl_int clffn__epilogue2(clffn_ffn *ffn, size_t tokens, const clffn_wcount *count, clffn_matrix x,
                        clffn_matrix y, cl_command_queue queue, cl_event *event);
/* The epilogues of a grouped launch (several experts' at once, count->groups of them, with
 * ffn, the first expert, giving the kernels and the config): in (z or u) and out (h or y) hold
 * the experts' tensors grp's strides apart (cl/epilogue.cl), and so do the biases; grp.s[4] is
 * count->ids_at. The FFN's
 * own forms above are the group of one. */
typedef struct clffn_group_io {
    cl_mem in, out;
    cl_ulong8 grp;
} clffn_group_io;
cl_int clffn__epilogue1_group(const clffn_ffn *ffn, size_t tokens, const clffn_wcount *count,
                              const clffn_buffer bias[2], const clffn_group_io *io,
                              const clffn_dropout_use *drop, cl_command_queue queue,
                              cl_event *event);
cl_int clffn__epilogue2_group(const clffn_ffn *ffn, size_t tokens, const clffn_wcount *count,
                              const clffn_buffer *b2, const clffn_group_io *io, size_t y_offset,
                              clffn_matrix x, cl_command_queue queue, cl_event *event);
/* out[n] (+)= column sums of m [rows, n] */
cl_int clffn__column_sums(clffn_ffn *ffn, clffn_matrix m, size_t rows, size_t n,
                          const clffn_buffer *out, int accumulate, cl_command_queue queue);

#endif
