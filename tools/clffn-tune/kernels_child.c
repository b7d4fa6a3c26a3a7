/* clffn-tune, phase 9's child (this program with --eval --kernels TYPE:MODE:ARG): an FFN of the
 * tuned shape with weights in TYPE, timed as the parent (kernels.c) asks, one line of seconds
 * printed. */
#include "tune.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct kbench {
    clffn_context *ctx;
    clffn_ffn *ffn;
    cl_mem x, y;
    clffn_dtype dtype;
    size_t D;
    int which; /* the clffn_kernel_class its products take */
} kbench;

/* An FFN of the tuned shape with random weights in dtype, and x and y for MOST_TOKENS. */
static int kbench_make(kbench *b, const opts *o, clffn_dtype dtype) {
    const size_t D = o->D, F = o->F, n = D * F;
    clffn_config c = clffn_config_default(D, F);
    c.gated = o->gated;
    c.activation = o->gated ? CLFFN_ACT_SILU : CLFFN_ACT_GELU;
    b->dtype = dtype, b->D = D;
    if (clffn_ffn_create(b->ctx, &c, &b->ffn) != CLFFN_SUCCESS) { return -1; }
    size_t bytes;
    if (clffn_dtype_bytes(dtype, n, &bytes) != CLFFN_SUCCESS) { return -1; }
    float *w = malloc(n * sizeof *w), *bias = calloc(F, sizeof *bias);
    float *xs = malloc(MOST_TOKENS * D * sizeof *xs);
    void *m[3] = {malloc(bytes), malloc(bytes), malloc(bytes)};
    int rc = w && bias && xs && m[0] && m[1] && m[2] ? 0 : -1;
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int k = 0; k < 3 && rc == 0; ++k) {
        for (size_t i = 0; i < n; ++i) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            w[i] = (float)((double)(s >> 40) / 16777216.0 - 0.5) * 0.1f;
        }
        if (clffn_convert_weights(dtype, w, n, m[k], bytes) != CLFFN_SUCCESS) { rc = -1; }
    }
    for (size_t i = 0; rc == 0 && i < MOST_TOKENS * D; ++i) {
        xs[i] = (float)sin(0.01 * (double)i);
    }
    const clffn_typed_weights tw = {dtype, m[0], o->gated ? m[1] : NULL, m[2], bias, bias, bias};
    if (rc == 0 && clffn_ffn_upload_weights_typed(b->ffn, CLFFN_LAYOUT_OUT_IN, &tw) != 0) {
        rc = -1;
    }
    cl_int e1 = CL_SUCCESS, e2 = CL_SUCCESS;
    if (rc == 0) {
        const cl_context cx = clffn_context_cl_context(b->ctx);
        const size_t bytes_x = MOST_TOKENS * D * 4;
        b->x = clCreateBuffer(cx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, bytes_x, xs, &e1);
        b->y = clCreateBuffer(cx, CL_MEM_READ_WRITE, bytes_x, NULL, &e2);
    }
    free(w), free(bias), free(xs), free(m[0]), free(m[1]), free(m[2]);
    return rc == 0 && e1 == CL_SUCCESS && e2 == CL_SUCCESS ? 0 : -1;
}

/* Best of five forwards at T tokens (after one that builds the kernels), through the kernels
 * up to `through` tokens. */
static int forward_time(kbench *b, size_t T, size_t through, double *sec) {
    if (clffn_context_set_kernel_max_tokens(b->ctx, b->which, through) != CLFFN_SUCCESS) {
        return -1;
    }
    cl_command_queue q = clffn_context_queue(b->ctx);
    double best = INFINITY;
    for (int r = 0; r < 6; ++r) {
        const double t0 = tool_now_s();
        if (clffn_forward(b->ffn, T, b->x, 0, b->y, 0, q, NULL) != CLFFN_SUCCESS ||
            tool_finish(q) != CL_SUCCESS) {
            return -1;
        }
        const double t = tool_now_s() - t0;
        if (r > 0 && t < best) { best = t; }
    }
    *sec = best;
    return 0;
}

/* One side of a comparison: through the kernels (side 1) or not (0); with grouped, through the
 * kernels with rows several a work-item at any size (1) or one (0). */
static int set_side(kbench *b, int grouped, int side) {
    if (!grouped) {
        return clffn_context_set_kernel_max_tokens(b->ctx, b->which, side ? MOST_TOKENS : 0);
    }
    return clffn_context_set_kernel_max_tokens(b->ctx, b->which, MOST_TOKENS) == CLFFN_SUCCESS
               ? clffn_context_set_row_group_cols(b->ctx, side ? 0 : SIZE_MAX)
               : -1;
}

/* y at T tokens through the kernels (in passes past CLFFN_MAX_KERNEL_TOKENS), and without,
 * agree; with grouped, the kernels with rows grouped and not. */
static int paths_agree(kbench *b, size_t T, int grouped) {
    const size_t n = T * b->D;
    float *a = malloc(n * 4), *c = malloc(n * 4);
    double *ref = malloc(n * sizeof *ref);
    cl_command_queue q = clffn_context_queue(b->ctx);
    int ok = a && c && ref;
    for (int side = 0; side < 2 && ok; ++side) {
        ok = set_side(b, grouped, side) == 0 &&
             clffn_forward(b->ffn, T, b->x, 0, b->y, 0, q, NULL) == CLFFN_SUCCESS &&
             clEnqueueReadBuffer(q, b->y, CL_TRUE, 0, n * 4, side ? a : c, 0, NULL, NULL) == 0;
    }
    for (size_t i = 0; ok && i < n; ++i) { ref[i] = c[i]; }
    /* inputs rounded to 8 bits (2^-8 of their block's largest) move y by about 1%: the check
     * then catches a broken kernel, not the rounding */
    const double tol = b->which == CLFFN_KERNELS_QUANTIZED ? 5e-2 : 1e-4;
    ok = ok && tool_compare(a, ref, n, tol, tol / 10).pass;
    free(a), free(c), free(ref);
    return ok ? 0 : -1;
}

/* T tokens through the kernels (*t) and without them (*t0), printed as a pair. */
static int both_paths(kbench *b, size_t T, double *t, double *t0) {
    if (forward_time(b, T, MOST_TOKENS, t) != 0 || forward_time(b, T, 0, t0) != 0) { return -1; }
    printf("%.9g %.9g ", *t, *t0);
    return 0;
}

/* "p1,…,p5" into p. */
static int parse_shape(const char *s, size_t p[CLFFN_WGEMV_PARAMS]) {
    pset ps = {"", CLFFN_WGEMV_PARAMS, {0}, {0}};
    if (pset_parse(s, &ps) != 0) { return -1; }
    memcpy(p, ps.values, CLFFN_WGEMV_PARAMS * sizeof *p);
    return 0;
}

/* "S;B1,B2,…" (mode groups): the best over four rounds, in turns, of the forward at each of
 * GROUP_COUNTS summed, with shape S and rows grouped from each B, printed in B's order. */
static int groups_measure(kbench *b, char *spec) {
    char *list = strchr(spec, ';');
    size_t p[CLFFN_WGEMV_PARAMS], bounds[MAX_GROUP_BOUNDS];
    double best[MAX_GROUP_BOUNDS];
    if (!list) { return 1; }
    *list++ = '\0';
    if (parse_shape(spec, p) != 0 || clffn_context_set_wgemv(b->ctx, p) != CLFFN_SUCCESS) {
        return 1;
    }
    int n = 0;
    for (char *save = NULL, *s = strtok_r(list, ",", &save); s;
         s = strtok_r(NULL, ",", &save), ++n) {
        if (n == MAX_GROUP_BOUNDS || tool_parse_size(s, 0, SIZE_MAX, &bounds[n]) != 0) { return 1; }
        best[n] = INFINITY;
    }
    if (n == 0) { return 1; }
    if (paths_agree(b, 3, 1) != 0 || paths_agree(b, 12, 1) != 0) { return 3; }
    for (int round = 0; round < 4; ++round) {
        for (int i = 0; i < n; ++i) {
            double sum = 0, t;
            if (clffn_context_set_row_group_cols(b->ctx, bounds[i]) != CLFFN_SUCCESS) { return 1; }
            for (int c = 0; c < N_GROUP_COUNTS; ++c) {
                if (forward_time(b, GROUP_COUNTS[c], CLFFN_MAX_KERNEL_TOKENS, &t) != 0) {
                    return 1;
                }
                sum += t;
            }
            if (sum < best[i]) { best[i] = sum; }
        }
    }
    for (int i = 0; i < n; ++i) { printf("%.9g ", best[i]); }
    printf("\n");
    return 0;
}

/* "S;M;T1,T2,…" (mode times): the best forward at each count with shape S, the kernels up to M
 * tokens (clffn_context_set_kernel_max_tokens) and the context's path past them, in turns
 * over two rounds, printed in the counts' order. */
static int times_measure(kbench *b, char *spec) {
    char *m = strchr(spec, ';'), *list = m ? strchr(m + 1, ';') : NULL;
    size_t p[CLFFN_WGEMV_PARAMS], most, counts[N_TOKEN_COUNTS];
    double best[N_TOKEN_COUNTS], t;
    if (!list) { return 1; }
    *m++ = '\0', *list++ = '\0';
    if (parse_shape(spec, p) != 0 || clffn_context_set_wgemv(b->ctx, p) != CLFFN_SUCCESS ||
        tool_parse_size(m, 0, SIZE_MAX, &most) != 0) {
        return 1;
    }
    int n = 0;
    for (char *save = NULL, *s = strtok_r(list, ",", &save); s;
         s = strtok_r(NULL, ",", &save), ++n) {
        if (n == N_TOKEN_COUNTS || tool_parse_size(s, 1, MOST_TOKENS, &counts[n]) != 0) {
            return 1;
        }
        best[n] = INFINITY;
    }
    if (n == 0) { return 1; }
    if (paths_agree(b, 3, 0) != 0) { return 3; }
    for (int round = 0; round < 2; ++round) {
        for (int i = 0; i < n; ++i) {
            if (forward_time(b, counts[i], most, &t) != 0) { return 1; }
            if (t < best[i]) { best[i] = t; }
        }
    }
    for (int i = 0; i < n; ++i) { printf("%.9g ", best[i]); }
    printf("\n");
    return 0;
}

/* The measurement opts.kernels asks for, printed on one line. */
static int kernels_measure(kbench *b, const char *mode, const char *rest) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", rest);
    size_t p[CLFFN_WGEMV_PARAMS];
    double t, t0;
    if (!strcmp(mode, "groups")) { return groups_measure(b, buf); }
    if (!strcmp(mode, "times")) { return times_measure(b, buf); }
    if (!strcmp(mode, "shapes")) { /* in turns, so a noisy moment costs every shape alike */
        size_t shapes[8][CLFFN_WGEMV_PARAMS];
        double best[8];
        int n = 0;
        for (char *save = NULL, *s = strtok_r(buf, ";", &save); s && n < 8;
             s = strtok_r(NULL, ";", &save), ++n) {
            if (parse_shape(s, shapes[n]) != 0) { return 1; }
            best[n] = INFINITY;
        }
        for (int round = 0; round < 4; ++round) {
            for (int i = 0; i < n; ++i) {
                if (clffn_context_set_wgemv(b->ctx, shapes[i]) != CLFFN_SUCCESS ||
                    forward_time(b, 1, 16, &t) != 0) {
                    return 1;
                }
                if (t < best[i]) { best[i] = t; }
            }
        }
        for (int i = 0; i < n; ++i) { printf("%.9g ", best[i]); }
    } else if (!strcmp(mode, "cross") || !strcmp(mode, "crossqx")) {
        if (parse_shape(buf, p) != 0 || clffn_context_set_wgemv(b->ctx, p) != CLFFN_SUCCESS) {
            return 1;
        }
        if (!strcmp(mode, "crossqx")) {
            b->which = CLFFN_KERNELS_QUANTIZED;
            if (clffn_context_set_quantized_inputs(b->ctx, 1) != CLFFN_SUCCESS) { return 1; }
        }
        if (paths_agree(b, 3, 0) != 0 || paths_agree(b, 20, 0) != 0) { return 3; }
        /* up to the first count the kernels lose, then (from 4 tokens) three quarters of it:
         * between powers of two the crossover may lie anywhere */
        for (int i = 0; i < N_TOKEN_COUNTS; ++i) {
            const size_t T = TOKEN_COUNTS[i];
            if (both_paths(b, T, &t, &t0) != 0) { return 1; }
            if (t < t0) { continue; }
            if (T >= 4 && both_paths(b, T * 3 / 4, &t, &t0) != 0) { return 1; }
            break;
        }
    } else {
        return 1;
    }
    printf("\n");
    return 0;
}

int kernels_main(const opts *o, const candidate *c) {
    char type[16], mode[16];
    const char *colon = strchr(o->kernels, ':'), *colon2 = colon ? strchr(colon + 1, ':') : NULL;
    if (!colon2 || (size_t)(colon - o->kernels) >= sizeof type ||
        (size_t)(colon2 - colon - 1) >= sizeof mode) {
        return 1;
    }
    snprintf(type, sizeof type, "%.*s", (int)(colon - o->kernels), o->kernels);
    snprintf(mode, sizeof mode, "%.*s", (int)(colon2 - colon - 1), colon + 1);
    clffn_dtype dtype;
    if (clffn_dtype_parse(type, &dtype) != CLFFN_SUCCESS) { return 1; }
    kbench b = {0};
    b.which = dtype == CLFFN_DTYPE_F32 ? CLFFN_KERNELS_F32 : CLFFN_KERNELS_COMPRESSED;
    if (clffn_context_create_for_device(o->device, &b.ctx) != CLFFN_SUCCESS) { return 1; }
    int rc = 1;
    size_t group = 0;
    if (eval_apply(b.ctx, o, c) == 0 &&
        (o->kept < 0 || clffn_context_set_weight_layout(b.ctx, (clffn_layout)o->kept) == 0) &&
        (!o->row_group || (tool_parse_size(o->row_group, 0, SIZE_MAX, &group) == 0 &&
                           clffn_context_set_row_group_cols(b.ctx, group) == CLFFN_SUCCESS)) &&
        kbench_make(&b, o, dtype) == 0) {
        rc = kernels_measure(&b, mode, colon2 + 1);
    }
    if (b.x) { clReleaseMemObject(b.x); }
    if (b.y) { clReleaseMemObject(b.y); }
    clffn_ffn_destroy(b.ffn);
    clffn_context_destroy(b.ctx);
    return rc;
}
