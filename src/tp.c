/* One tensor-parallel layer over several contexts in one process (clffn_tp_*): a shard per
 * context, run concurrently (a thread each, one queue each), the partial outputs summed on the
 * host.
 *
 * Why the host sums: the contexts may be different platforms (an AMD GPU and an Intel one have no
 * shared buffer), a host-level call returns host arrays anyway, and the sum of n [T, D] partials
 * is n·T·D additions against the 2·T·D·F·(2 or 3)/n FLOPs each shard did. The sum runs in
 * double, shard 0 first, so the result does not depend on which shard finished first. */
#include "ffn.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct clffn_tp {
    int count;
    clffn_config cfg;
    clffn_layout layout;
    bool has_weights;
    clffn_ffn **shard;
};

/* A shard's slice arrays, one block: W1, V, W2, b1, bv, b2 (the slice's shapes). */
typedef struct slice_block {
    float *block;
    clffn_weight_arrays a;
} slice_block;

static bool slice_alloc(slice_block *s, const clffn_config *c, size_t S, bool with_b2) {
    const size_t D = c->d_model, nm = S * D;
    const size_t total = nm * (c->gated ? 3 : 2) + 2 * S + D;
    s->block = calloc(total, sizeof(float));
    if (!s->block) { return false; }
    float *p = s->block;
    s->a.w1 = p;
    p += nm;
    s->a.v = c->gated ? p : NULL;
    p += c->gated ? nm : 0;
    s->a.w2 = p;
    p += nm;
    s->a.b1 = c->bias1 ? p : NULL;
    s->a.bv = c->gated && c->bias_gate ? p + S : NULL;
    s->a.b2 = with_b2 && c->bias2 ? p + 2 * S : NULL;
    return true;
}

clffn_status clffn_tp_create(clffn_context *const *contexts, int count, const clffn_config *config,
                             clffn_tp **out) {
    if (!contexts || !config || !out) { return CLFFN_ERROR_NULL_ARGUMENT; }
    clffn_status st = clffn_config_validate(config);
    if (st != CLFFN_SUCCESS) { return st; }
    size_t f0, f1;
    if (count < 1 ||
        (st = clffn_shard_range(config->d_ff, count - 1, count, &f0, &f1)) != CLFFN_SUCCESS) {
        return CLFFN_ERROR_INVALID_ARGUMENT;
    }
    for (int i = 0; i < count; ++i) {
        if (!contexts[i]) { return CLFFN_ERROR_NULL_ARGUMENT; }
    }
    clffn_tp *tp = calloc(1, sizeof *tp);
    if (!tp || !(tp->shard = calloc((size_t)count, sizeof *tp->shard))) {
        free(tp);
        return CLFFN_ERROR_OUT_OF_HOST_MEMORY;
    }
    tp->count = count;
    tp->cfg = *config;
    for (int i = 0; i < count && st == CLFFN_SUCCESS; ++i) {
        st = clffn_ffn_create_shard(contexts[i], config, i, count, &tp->shard[i]);
    }
    if (st != CLFFN_SUCCESS) {
        clffn_tp_destroy(tp);
        return st;
    }
    *out = tp;
    return CLFFN_SUCCESS;
}

void clffn_tp_destroy(clffn_tp *tp) {
    if (!tp) { return; }
    for (int i = 0; i < tp->count; ++i) { clffn_ffn_destroy(tp->shard[i]); }
    free(tp->shard);
    free(tp);
}

int clffn_tp_count(const clffn_tp *tp) { return tp ? tp->count : 0; }

clffn_ffn *clffn_tp_shard(clffn_tp *tp, int index) {
    return tp && index >= 0 && index < tp->count ? tp->shard[index] : NULL;
}

clffn_status clffn_tp_upload_weights(clffn_tp *tp, clffn_layout layout,
                                     const clffn_host_weights *full) {
    if (!tp || !full) { return CLFFN_ERROR_NULL_ARGUMENT; }
    clffn_status st = CLFFN_SUCCESS;
    tp->has_weights = false; /* until every shard has its slice */
    for (int i = 0; i < tp->count && st == CLFFN_SUCCESS; ++i) {
        size_t f0, f1;
        clffn_ffn_shard_info(tp->shard[i], &f0, &f1, NULL);
        slice_block s;
        if (!slice_alloc(&s, &tp->cfg, f1 - f0, i == 0)) { return CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
        st = clffn_shard_weights(&tp->cfg, layout, f0, f1, full, &s.a);
        if (st == CLFFN_SUCCESS) {
            const clffn_host_weights hw = {s.a.w1, s.a.b1, s.a.v, s.a.bv, s.a.w2, s.a.b2};
            st = clffn_ffn_upload_weights(tp->shard[i], layout, &hw);
        }
        free(s.block);
    }
    if (st == CLFFN_SUCCESS) {
        tp->layout = layout;
        tp->has_weights = true;
    }
    return st;
}

clffn_status clffn_tp_set_training(clffn_tp *tp, int training) {
    if (!tp) { return CLFFN_ERROR_NULL_ARGUMENT; }
    for (int i = 0; i < tp->count; ++i) {
        const clffn_status st = clffn_ffn_set_training(tp->shard[i], training);
        if (st != CLFFN_SUCCESS) { /* all in the old mode again (switching back cannot fail) */
            for (int j = 0; j < i; ++j) { clffn_ffn_set_training(tp->shard[j], !training); }
            return st;
        }
    }
    return CLFFN_SUCCESS;
}

clffn_status clffn_tp_set_rng(clffn_tp *tp, uint64_t seed, uint64_t offset) {
    if (!tp) { return CLFFN_ERROR_NULL_ARGUMENT; }
    for (int i = 0; i < tp->count; ++i) { clffn_ffn_set_rng(tp->shard[i], seed, offset); }
    return CLFFN_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Passes: a thread per shard but the first, which runs in the caller's */

typedef struct job {
    clffn_ffn *ffn;
    size_t tokens;
    const float *x, *dy;
    size_t len;                       /* T·D, every array's */
    float *out;                       /* y or dx partial [T, D] */
    const clffn_weight_arrays *grads; /* the slice's, backward only */
    clffn_status st;
} job;

static void *run_job(void *p) {
    job *j = p;
    j->st = j->dy ? clffn_backward_host(j->ffn, j->tokens, j->x, j->len, j->dy, j->len, j->out,
                                        j->len, j->grads, 0)
                  : clffn_forward_host(j->ffn, j->tokens, j->x, j->len, j->out, j->len);
    return NULL;
}

/* Runs every job concurrently; the first failing shard's status, or SUCCESS. */
static clffn_status run_all(job *jobs, int n) {
    pthread_t *th = calloc((size_t)n, sizeof *th);
    bool *started = calloc((size_t)n, sizeof *started);
    if (!th || !started) {
        free(th);
        free(started);
        return CLFFN_ERROR_OUT_OF_HOST_MEMORY;
    }
    for (int i = 1; i < n; ++i) {
        started[i] = pthread_create(&th[i], NULL, run_job, &jobs[i]) == 0;
    }
    run_job(&jobs[0]);
    for (int i = 1; i < n; ++i) {
        if (started[i]) {
            pthread_join(th[i], NULL);
        } else { /* no thread to be had: in this one, after the others */
            run_job(&jobs[i]);
        }
    }
    free(th);
    free(started);
    for (int i = 0; i < n; ++i) {
        if (jobs[i].st != CLFFN_SUCCESS) { return jobs[i].st; }
    }
    return CLFFN_SUCCESS;
}

/* out[k] = Σ_i parts[i·len + k], in double, shard 0 first */
static void sum_parts(float *out, const float *parts, int n, size_t len) {
    for (size_t k = 0; k < len; ++k) {
        double s = 0.0;
        for (int i = 0; i < n; ++i) { s += (double)parts[(size_t)i * len + k]; }
        out[k] = (float)s;
    }
}

static clffn_status check_io(const clffn_tp *tp, size_t tokens, size_t *len) {
    if (!tp->has_weights) { return CLFFN_ERROR_NO_WEIGHTS; }
    if (!clffn__mul_ok(tokens, tp->cfg.d_model, len)) { return CLFFN_ERROR_SIZE_OVERFLOW; }
    size_t parts;
    if (!clffn__mul_ok(*len, (size_t)tp->count, &parts) ||
        !clffn__mul_ok(parts, sizeof(float), &parts)) {
        return CLFFN_ERROR_SIZE_OVERFLOW;
    }
    return CLFFN_SUCCESS;
}

/* A failed pass must not leave the shards' dropout offsets apart: all go back to before it. */
static void restore_rng(clffn_tp *tp, uint64_t seed, uint64_t offset) {
    for (int i = 0; i < tp->count; ++i) { clffn_ffn_set_rng(tp->shard[i], seed, offset); }
}

clffn_status clffn_tp_forward_host(clffn_tp *tp, size_t tokens, const float *x, size_t x_len,
                                   float *y, size_t y_len) {
    if (!tp || !x || !y) { return CLFFN_ERROR_NULL_ARGUMENT; }
    size_t len;
    clffn_status st = check_io(tp, tokens, &len);
    if (st != CLFFN_SUCCESS) { return st; }
    if (x_len < len || y_len < len) { return CLFFN_ERROR_BUFFER_TOO_SMALL; }
    uint64_t seed, offset;
    clffn_ffn_get_rng(tp->shard[0], &seed, &offset);
    float *parts = malloc((len ? len : 1) * (size_t)tp->count * sizeof *parts);
    job *jobs = calloc((size_t)tp->count, sizeof *jobs);
    if (!parts || !jobs) {
        free(parts);
        free(jobs);
        return CLFFN_ERROR_OUT_OF_HOST_MEMORY;
    }
    for (int i = 0; i < tp->count; ++i) {
        jobs[i] = (job){tp->shard[i], tokens, x, NULL, len, parts + (size_t)i * len, NULL, 0};
    }
    st = run_all(jobs, tp->count);
    if (st == CLFFN_SUCCESS) {
        sum_parts(y, parts, tp->count, len);
    } else {
        restore_rng(tp, seed, offset);
    }
    free(parts);
    free(jobs);
    return st;
}

clffn_status clffn_tp_backward_host(clffn_tp *tp, size_t tokens, const float *x, size_t x_len,
                                    const float *dy, size_t dy_len, float *dx, size_t dx_len,
                                    const clffn_weight_arrays *grads, int accumulate) {
    if (!tp || !x || !dy || !grads) { return CLFFN_ERROR_NULL_ARGUMENT; }
    size_t len;
    clffn_status st = check_io(tp, tokens, &len);
    if (st != CLFFN_SUCCESS) { return st; }
    if (x_len < len || dy_len < len || (dx && dx_len < len)) {
        return CLFFN_ERROR_BUFFER_TOO_SMALL;
    }
    const clffn_config *c = &tp->cfg;
    if (!grads->w1 || !grads->w2 || (c->bias1 && !grads->b1) || (c->bias2 && !grads->b2) ||
        (c->gated && (!grads->v || (c->bias_gate && !grads->bv)))) {
        return CLFFN_ERROR_NULL_ARGUMENT;
    }
    const int n = tp->count;
    float *parts = malloc((len ? len : 1) * (size_t)n * sizeof *parts);
    job *jobs = calloc((size_t)n, sizeof *jobs);
    slice_block *slices = calloc((size_t)n, sizeof *slices);
    bool ok = parts && jobs && slices;
    for (int i = 0; ok && i < n; ++i) {
        size_t f0, f1;
        clffn_ffn_shard_info(tp->shard[i], &f0, &f1, NULL);
        ok = slice_alloc(&slices[i], c, f1 - f0, i == 0);
    }
    if (!ok) {
        st = CLFFN_ERROR_OUT_OF_HOST_MEMORY;
    } else {
        for (int i = 0; i < n; ++i) {
            jobs[i] =
                (job){tp->shard[i], tokens, x, dy, len, parts + (size_t)i * len, &slices[i].a, 0};
        }
        st = run_all(jobs, n);
    }
    /* only now, with every shard done, is anything of the caller's written */
    for (int i = 0; st == CLFFN_SUCCESS && i < n; ++i) {
        size_t f0, f1;
        clffn_ffn_shard_info(tp->shard[i], &f0, &f1, NULL);
        st = clffn_shard_place(c, tp->layout, f0, f1, &slices[i].a, grads, accumulate);
    }
    if (st == CLFFN_SUCCESS && dx) { sum_parts(dx, parts, n, len); }
    for (int i = 0; slices && i < n; ++i) { free(slices[i].block); }
    free(slices);
    free(parts);
    free(jobs);
    return st;
}
