/* clffn-run: a layer's weights (or a rank's slice of them) in the type they go to the device
 * in: the file's own bytes where they are already of it, else its values converted on the host
 * (GGUF's rounding for the quantized types). */
#include "run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

clffn_dtype run_weights_dtype(const options *o, const layer *L) {
    if (!o->dtype_stored) { return o->dtype; }
    const ckpt_tensor *const m[3] = {L->w1, L->v, L->w2};
    for (int i = 0; i < 3; ++i) {
        if (m[i] && (!m[i]->keep || m[i]->dtype != L->w1->dtype)) { return CLFFN_DTYPE_F32; }
    }
    return L->w1->keep ? L->w1->dtype : CLFFN_DTYPE_F32;
}

/* n f32 values in dtype: a new array of its bytes (the values themselves for f32), and with
 * refs their exact f32 values back (the same array for f32). 0, or -1 (reported). */
static int convert(const char *name, float *f, size_t n, clffn_dtype dtype, int refs, void **bytes,
                   float **ref) {
    if (dtype == CLFFN_DTYPE_F32) {
        *bytes = f;
        *ref = refs ? f : NULL;
        return 0;
    }
    size_t nb;
    clffn_status st = clffn_dtype_bytes(dtype, n, &nb);
    if (st == CLFFN_SUCCESS && !(*bytes = malloc(nb ? nb : 1))) {
        st = CLFFN_ERROR_OUT_OF_HOST_MEMORY;
    }
    if (st == CLFFN_SUCCESS) { st = clffn_convert_weights(dtype, f, n, *bytes, nb); }
    if (st == CLFFN_SUCCESS && refs) {
        st = clffn_convert_to_f32(dtype, *bytes, nb, n, f, n);
        *ref = f;
        f = NULL;
    }
    free(f);
    if (st != CLFFN_SUCCESS) {
        run_report("tensor '%s' to %s: %s%s", name, clffn_dtype_name(dtype),
                   clffn_status_string(st),
                   st == CLFFN_ERROR_INVALID_ARGUMENT ? " (a value that is not finite)" : "");
        return -1;
    }
    return 0;
}

/* A block of a matrix, [r0, +nr) × [c0, +nc) as the file stores it, in dtype; transposed (its
 * columns become rows) when asked. The file's own bytes where they are dtype already. */
static int load_matrix(const options *o, const ckpt *c, const ckpt_tensor *t, const uint64_t b[4],
                       clffn_dtype dtype, int transpose, int refs, void **bytes, float **ref) {
    const uint64_t r0 = b[0], nr = b[1], c0 = b[2], nc = b[3];
    const size_t n = (size_t)(nr * nc);
    char err[CLFFN_IO_ERR];
    if (t->keep && t->dtype == dtype && !transpose) {
        size_t nb;
        clffn_dtype_bytes(dtype, n, &nb); /* whole blocks: checked by the caller */
        if (!(*bytes = malloc(nb ? nb : 1))) {
            run_report("out of memory for tensor '%s'", t->name);
            return -1;
        }
        if (ckpt_read_stored(c, t, r0, nr, c0, nc, *bytes, nb, err) != 0) {
            run_report("%s: %s", o->weights, err);
            return -1;
        }
        *ref = refs && dtype == CLFFN_DTYPE_F32 ? *bytes : NULL; /* f32: the values themselves */
        if (refs && dtype != CLFFN_DTYPE_F32 &&
            ((*ref = malloc(n * sizeof **ref)) == NULL ||
             clffn_convert_to_f32(dtype, *bytes, nb, n, *ref, n) != CLFFN_SUCCESS)) {
            run_report("out of memory for tensor '%s'", t->name);
            return -1;
        }
        return 0;
    }
    float *f = malloc((n ? n : 1) * sizeof *f);
    if (!f || ckpt_read_f32(c, t, r0, nr, c0, nc, f, err) != 0) {
        if (f) {
            run_report("%s: %s", o->weights, err);
        } else {
            run_report("out of memory for tensor '%s'", t->name);
        }
        free(f);
        return -1;
    }
    if (transpose) { /* [nr, nc] to [nc, nr] */
        float *tr = malloc((n ? n : 1) * sizeof *tr);
        if (!tr) {
            free(f);
            run_report("out of memory for tensor '%s'", t->name);
            return -1;
        }
        for (size_t i = 0; i < nr; ++i) {
            for (size_t j = 0; j < nc; ++j) { tr[j * nr + i] = f[i * nc + j]; }
        }
        free(f);
        f = tr;
    }
    return convert(t->name, f, n, dtype, refs, bytes, ref);
}

/* A bias's values [f0, f0 + n), f32. */
static int load_bias(const options *o, const ckpt *c, const ckpt_tensor *t, uint64_t f0, uint64_t n,
                     float **out) {
    char err[CLFFN_IO_ERR];
    *out = NULL;
    if (!t) { return 0; }
    if (!(*out = malloc((n ? n : 1) * sizeof **out))) {
        run_report("out of memory for tensor '%s'", t->name);
        return -1;
    }
    if (ckpt_read_f32(c, t, 0, 1, f0, n, *out, err) != 0) {
        run_report("%s: %s", o->weights, err);
        return -1;
    }
    return 0;
}

/* A quantized type's blocks run along the input dimension: D for W1 and V, this slice's
 * hidden units for W2. 0, or -1 (reported) when either is not whole blocks. */
static int check_blocks(const options *o, const layer *L, const slice *s, clffn_dtype dtype) {
    if (dtype != CLFFN_DTYPE_Q8_0 && dtype != CLFFN_DTYPE_Q4_0) { return 0; }
    const char *name = clffn_dtype_name(dtype);
    if (L->D % CLFFN_QK) {
        run_report("%s: %s weights need d_model (%llu), the input dimension of W1 and V, to be a "
                   "multiple of %d",
                   o->weights, name, (unsigned long long)L->D, CLFFN_QK);
        return -1;
    }
    if (s->f0 % CLFFN_QK || s->S % CLFFN_QK) {
        if (s->S == L->F) {
            run_report("%s: %s weights need d_ff (%llu), the input dimension of W2, to be a "
                       "multiple of %d",
                       o->weights, name, (unsigned long long)L->F, CLFFN_QK);
        } else {
            run_report("%s: a %s slice of W2's input dimension must start and end on a multiple "
                       "of %d; this rank's hidden units [%llu, %llu) do not (choose a rank count "
                       "that splits d_ff = %llu so)",
                       o->weights, name, CLFFN_QK, (unsigned long long)s->f0,
                       (unsigned long long)(s->f0 + s->S), (unsigned long long)L->F);
        }
        return -1;
    }
    return 0;
}

int run_load_weights(const options *o, const ckpt *c, const layer *L, const slice *s, int refs,
                     loaded *w) {
    memset(w, 0, sizeof *w);
    w->dtype = run_weights_dtype(o, L);
    const int oi = L->preset->layout == CLFFN_LAYOUT_OUT_IN;
    /* quantized weights are [out, in]: an [in, out] file is transposed on the host */
    const int quantized = w->dtype == CLFFN_DTYPE_Q8_0 || w->dtype == CLFFN_DTYPE_Q4_0;
    const int tr = quantized && !oi;
    w->layout = tr ? CLFFN_LAYOUT_OUT_IN : L->preset->layout;
    if (check_blocks(o, L, s, w->dtype) != 0) { return -1; }
    const uint64_t D = L->D, f0 = s->f0, S = s->S;
    /* [rows at, rows, columns at, columns] of each matrix as the file stores it */
    const uint64_t first[4] = {oi ? f0 : 0, oi ? S : D, oi ? 0 : f0, oi ? D : S};
    const uint64_t second[4] = {oi ? 0 : f0, oi ? D : S, oi ? f0 : 0, oi ? S : D};
    if (load_matrix(o, c, L->w1, first, w->dtype, tr, refs, &w->w1, &w->r1) != 0 ||
        (L->v && load_matrix(o, c, L->v, first, w->dtype, tr, refs, &w->v, &w->rv) != 0) ||
        load_matrix(o, c, L->w2, second, w->dtype, tr, refs, &w->w2, &w->r2) != 0 ||
        load_bias(o, c, L->b1, f0, S, &w->b1) != 0 || load_bias(o, c, L->bv, f0, S, &w->bv) != 0 ||
        load_bias(o, c, s->with_b2 ? L->b2 : NULL, 0, D, &w->b2) != 0) {
        run_loaded_free(w);
        return -1;
    }
    return 0;
}

void run_loaded_free(loaded *w) {
    float *const refs[3] = {w->r1, w->rv, w->r2};
    void *const mats[3] = {w->w1, w->v, w->w2};
    for (int i = 0; i < 3; ++i) {
        if (refs[i] != mats[i]) { free(refs[i]); } /* f32: one array for both */
        free(mats[i]);
    }
    free(w->b1), free(w->bv), free(w->b2);
    memset(w, 0, sizeof *w);
}

clffn_typed_weights run_typed(const loaded *w) {
    const clffn_typed_weights t = {w->dtype, w->w1, w->v, w->w2, w->b1, w->bv, w->b2};
    return t;
}

clffn_host_weights run_refs(const loaded *w) {
    const clffn_host_weights h = {w->r1, w->b1, w->rv, w->bv, w->r2, w->b2};
    return h;
}
