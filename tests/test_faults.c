/* Host allocation failures. This suite links the fault-injection build of the library and the
 * loaders (src/fault.h): every malloc, calloc, strdup our code makes, and every block cJSON
 * allocates for it, goes through a countdown. For each operation the sweep fails the 1st, 2nd,
 * … allocation in turn, once (later allocations succeed) and sticky (all later ones fail too,
 * like memory that stays exhausted), until a run makes no allocation that fails. Each failing
 * run must return OUT_OF_HOST_MEMORY (the loaders: an error naming memory), leave the caller's
 * outputs as they were, and leave no block and no OpenCL object behind: live blocks return to
 * where they were and the test's cl_context is back to the test's single reference. */
#include "clffn.h"
#include "clffn_io.h"
#include "fault.h"
#include "gguf_writer.h"
#include "internal.h"

#include <clblast_c.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* the test's own allocations are not under test */
#undef malloc
#undef calloc
#undef realloc
#undef strdup
#undef free
#undef clCreateBuffer

#define D 16
#define F 24
#define T 3
#define SENTINEL 777.25f

/* Everything an operation may touch. */
typedef struct fx {
    cl_context cl;
    cl_device_id dev;
    clffn_context *ctx; /* prepared before the armed window where an op needs one */
    clffn_ffn *ffn;
    clffn_context *out_ctx; /* outputs of creating operations */
    clffn_ffn *out_ffn;
    clffn_config cfg;
    float w[6][D * F]; /* w1, b1, v, bv, w2, b2: room for the largest */
    float x[T * D], dy[T * D], y[T * D], dx[T * D], h[T * F];
    float g[6][D * F];
    uint16_t h16[3][D * F]; /* w1, v, w2 in f16 */
    double ry[T * D], rh[T * F], rdx[T * D], rg[6][D * F];
    clffn_device_info devs[8];
    size_t ndev;
    char name[64];
    char err[CLFFN_IO_ERR];
    char dir[64]; /* a temporary folder for the loaders and the tuning profile */
    uint8_t *st_bytes, *npy_bytes, *gguf_bytes;
    size_t st_len, npy_len, gguf_len;
    clffn_st_file st;
    clffn_npy npy;
    clffn_gguf_file gg;
    const char *tuning_before; /* the tuning the context reports with no fault */
} fx;

static fx S;

static clffn_host_weights host_weights(fx *f) {
    const clffn_host_weights hw = {f->w[0], f->w[1], f->w[2], f->w[3], f->w[4], f->w[5]};
    return hw;
}

static cl_uint cl_refs(fx *f) {
    cl_uint refs = 0;
    cr_assert_eq(clGetContextInfo(f->cl, CL_CONTEXT_REFERENCE_COUNT, sizeof refs, &refs, NULL),
                 CL_SUCCESS);
    return refs;
}

/* The context's references once what is not ours has let go: CLBlast's process-wide program
 * cache keeps a reference to every context it ran on until CLBlastClearCache(), and POCL drops
 * its references from finished commands on its own threads a moment after they complete (so
 * wait up to 2 s for the count to come down to want). */
static cl_uint cl_refs_settled(fx *f, cl_uint want) {
    CLBlastClearCache();
    cl_uint refs = cl_refs(f);
    for (int i = 0; i < 200 && refs != want; ++i) {
        const struct timespec ms10 = {0, 10000000};
        nanosleep(&ms10, NULL);
        refs = cl_refs(f);
    }
    return refs;
}

static void outputs_reset(fx *f) {
    f->out_ctx = (clffn_context *)&S;
    f->out_ffn = (clffn_ffn *)&S;
    for (size_t i = 0; i < T * D; ++i) { f->y[i] = f->dx[i] = SENTINEL; }
    for (size_t i = 0; i < T * F; ++i) { f->h[i] = SENTINEL; }
    for (size_t k = 0; k < 6; ++k) {
        for (size_t i = 0; i < D * F; ++i) {
            f->g[k][i] = SENTINEL;
            f->rg[k][i] = SENTINEL;
        }
    }
    for (size_t i = 0; i < T * D; ++i) { f->ry[i] = f->rdx[i] = SENTINEL; }
    for (size_t i = 0; i < T * F; ++i) { f->rh[i] = SENTINEL; }
    memset(f->devs, 0xA5, sizeof f->devs);
    f->ndev = 12345;
    memset(f->name, 'Q', sizeof f->name);
    memset(&f->st, 0x5A, sizeof f->st);
    memset(&f->npy, 0x5A, sizeof f->npy);
    memset(&f->gg, 0x5A, sizeof f->gg);
}

static void outputs_untouched(const fx *f, const char *what) {
    cr_assert(f->out_ctx == (clffn_context *)&S && f->out_ffn == (clffn_ffn *)&S,
              "%s: an out-pointer was written", what);
    for (size_t i = 0; i < T * D; ++i) {
        cr_assert(f->y[i] == SENTINEL && f->dx[i] == SENTINEL && f->ry[i] == SENTINEL &&
                      f->rdx[i] == SENTINEL,
                  "%s: output [%zu] was written", what, i);
    }
    for (size_t i = 0; i < T * F; ++i) {
        cr_assert(f->h[i] == SENTINEL && f->rh[i] == SENTINEL, "%s: hidden [%zu] written", what, i);
    }
    for (size_t k = 0; k < 6; ++k) {
        for (size_t i = 0; i < D * F; ++i) {
            cr_assert(f->g[k][i] == SENTINEL && f->rg[k][i] == SENTINEL,
                      "%s: gradient %zu [%zu] was written", what, k, i);
        }
    }
    cr_assert(f->ndev == 12345, "%s: the device count was written", what);
    for (size_t i = 0; i < sizeof f->devs; ++i) {
        cr_assert(((const unsigned char *)f->devs)[i] == 0xA5, "%s: the device list was written",
                  what);
    }
    for (size_t i = 0; i < sizeof f->name; ++i) {
        cr_assert(f->name[i] == 'Q', "%s: the name buffer was written", what);
    }
    for (size_t i = 0; i < sizeof f->st; ++i) {
        cr_assert(((const unsigned char *)&f->st)[i] == 0x5A, "%s: the file struct was written",
                  what);
    }
    for (size_t i = 0; i < sizeof f->npy; ++i) {
        cr_assert(((const unsigned char *)&f->npy)[i] == 0x5A, "%s: the array struct was written",
                  what);
    }
    for (size_t i = 0; i < sizeof f->gg; ++i) {
        cr_assert(((const unsigned char *)&f->gg)[i] == 0x5A, "%s: the GGUF struct was written",
                  what);
    }
}

/* One operation: prepare (unarmed) builds what it needs, run is the armed call, finish
 * (unarmed) releases what a successful run made and what prepare made. */
typedef struct op {
    const char *name;
    void (*prepare)(fx *);
    int (*run)(fx *); /* a clffn_status; loaders: 0 or the status OUT_OF_HOST_MEMORY */
    void (*finish)(fx *);
    int allocates; /* the op is known to allocate: a sweep that fails nothing is an error */
} op;

static void prep_ctx(fx *f) { cr_assert_eq(clffn_context_create(f->cl, f->dev, &f->ctx), 0); }
/* a context whose FFNs share its scratch: the first one made makes it */
static void prep_ctx_shared(fx *f) {
    prep_ctx(f);
    cr_assert_eq(clffn_context_set_shared_scratch(f->ctx, 1), 0);
}
static void prep_ffn(fx *f) {
    prep_ctx(f);
    cr_assert_eq(clffn_ffn_create(f->ctx, &f->cfg, &f->ffn), 0);
    const clffn_host_weights hw = host_weights(f);
    cr_assert_eq(clffn_ffn_upload_weights(f->ffn, CLFFN_LAYOUT_OUT_IN, &hw), 0);
    cr_assert_eq(clffn_ffn_set_training(f->ffn, 1), 0);
}
static void prep_forwarded(fx *f) {
    prep_ffn(f);
    float y[T * D];
    cr_assert_eq(clffn_forward_host(f->ffn, T, f->x, T * D, y, T * D), 0);
}
static void prep_none(fx *f) { (void)f; }
static clffn_typed_weights typed_f16(fx *f) {
    const clffn_typed_weights tw = {CLFFN_DTYPE_F16, f->h16[0], f->h16[1], f->h16[2],
                                    f->w[1],         f->w[3],   f->w[5]};
    return tw;
}
/* an FFN whose weights are f16 (clffn's kernels for T tokens), forwarded once */
static void prep_typed(fx *f) {
    prep_ctx(f);
    cr_assert_eq(clffn_ffn_create(f->ctx, &f->cfg, &f->ffn), 0);
    const clffn_typed_weights tw = typed_f16(f);
    cr_assert_eq(clffn_ffn_upload_weights_typed(f->ffn, CLFFN_LAYOUT_OUT_IN, &tw), 0);
    float y[T * D];
    cr_assert_eq(clffn_forward_host(f->ffn, T, f->x, T * D, y, T * D), 0);
}

static void fin_all(fx *f) {
    if (f->out_ffn != (clffn_ffn *)&S) { clffn_ffn_destroy(f->out_ffn); }
    if (f->out_ctx != (clffn_context *)&S) { clffn_context_destroy(f->out_ctx); }
    clffn_ffn_destroy(f->ffn);
    clffn_context_destroy(f->ctx);
    f->ffn = NULL;
    f->ctx = NULL;
    f->out_ffn = (clffn_ffn *)&S;
    f->out_ctx = (clffn_context *)&S;
}
static int still_sentinel(const void *p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        if (((const unsigned char *)p)[i] != 0x5A) { return 0; }
    }
    return 1;
}
/* a refused file left the struct as it was: nothing to close or free */
static void fin_st(fx *f) {
    if (!still_sentinel(&f->st, sizeof f->st)) { clffn_st_close(&f->st); }
    memset(&f->st, 0x5A, sizeof f->st);
}
static void fin_gguf(fx *f) {
    if (!still_sentinel(&f->gg, sizeof f->gg)) { clffn_gguf_close(&f->gg); }
    memset(&f->gg, 0x5A, sizeof f->gg);
}
static void fin_npy(fx *f) {
    if (!still_sentinel(&f->npy, sizeof f->npy)) { clffn_npy_free(&f->npy); }
    memset(&f->npy, 0x5A, sizeof f->npy);
}

/* a loader's failure: its status, and a message that names memory */
static int io_status(fx *f, int rc) {
    if (rc == 0) { return CLFFN_SUCCESS; }
    cr_assert(strstr(f->err, "memory"), "loader error does not name memory: %s", f->err);
    return CLFFN_ERROR_OUT_OF_HOST_MEMORY;
}

static int run_context_create(fx *f) { return clffn_context_create(f->cl, f->dev, &f->out_ctx); }
static int run_context_default(fx *f) { return clffn_context_create_default(&f->out_ctx); }
static int run_devices(fx *f) { return clffn_devices_list(f->devs, 8, &f->ndev); }
static int run_device_name(fx *f) {
    return clffn_context_device_name(f->ctx, f->name, sizeof f->name);
}
static int run_ffn_create(fx *f) { return clffn_ffn_create(f->ctx, &f->cfg, &f->out_ffn); }
static int run_ffn_init(fx *f) {
    return clffn_ffn_init_weights(f->ffn, CLFFN_INIT_TORCH_LINEAR, 3);
}
static int run_upload_in_out(fx *f) {
    const clffn_host_weights hw = host_weights(f);
    return clffn_ffn_upload_weights(f->ffn, CLFFN_LAYOUT_IN_OUT, &hw);
}
static int run_forward(fx *f) { return clffn_forward_host(f->ffn, T, f->x, T * D, f->y, T * D); }
static int run_backward(fx *f) {
    const clffn_weight_arrays g = {f->g[0], f->g[1], f->g[2], f->g[3], f->g[4], f->g[5]};
    return clffn_backward_host(f->ffn, T, f->x, T * D, f->dy, T * D, f->dx, T * D, &g, 0);
}
static int run_read_pre(fx *f) {
    return clffn_ffn_read_hidden(f->ffn, CLFFN_HIDDEN_PRE, f->h, T * F, NULL);
}
static int run_read_gate(fx *f) {
    return clffn_ffn_read_hidden(f->ffn, CLFFN_HIDDEN_GATE, f->h, T * F, NULL);
}
static int run_init_host(fx *f) {
    const clffn_weight_arrays a = {f->g[0], f->g[1], f->g[2], f->g[3], f->g[4], f->g[5]};
    return clffn_init_weights_host(&f->cfg, CLFFN_INIT_TORCH_LINEAR, 9, CLFFN_LAYOUT_IN_OUT, &a);
}
static int run_ref_forward(fx *f) {
    const clffn_host_weights hw = host_weights(f);
    return clffn_reference_forward(&f->cfg, CLFFN_LAYOUT_OUT_IN, &hw, T, f->x, 1, 1, 0, f->ry,
                                   f->rh);
}
static int run_ref_backward(fx *f) {
    const clffn_host_weights hw = host_weights(f);
    const clffn_ref_grads g = {f->rg[0], f->rg[1], f->rg[2], f->rg[3], f->rg[4], f->rg[5]};
    return clffn_reference_backward(&f->cfg, CLFFN_LAYOUT_OUT_IN, &hw, T, f->x, f->dy, 1, 1, 0,
                                    f->rdx, &g);
}
static int run_st_parse(fx *f) {
    return io_status(f, clffn_st_parse(f->st_bytes, f->st_len, &f->st, f->err));
}
static int run_st_open(fx *f) {
    char path[128];
    snprintf(path, sizeof path, "%s/w.safetensors", f->dir);
    return io_status(f, clffn_st_open(path, &f->st, f->err));
}
/* a writer's status; a failed write leaves no file (and no temporary) behind */
static int written_or_absent(fx *f, const char *path, int rc) {
    const int st = io_status(f, rc);
    if (st != CLFFN_SUCCESS) { cr_assert(access(path, F_OK) != 0, "a partial file is left"); }
    return st;
}
static int run_st_write(fx *f) {
    char path[128];
    snprintf(path, sizeof path, "%s/out.safetensors", f->dir);
    unlink(path);
    const uint64_t s1[2] = {F, D}, s2[1] = {F};
    const clffn_st_out t[2] = {{"w_1.weight", 2, s1, f->w[0]}, {"w_1.bias", 1, s2, f->w[1]}};
    return written_or_absent(f, path, clffn_st_write(path, t, 2, f->err));
}
static int run_gguf_parse(fx *f) {
    return io_status(f, clffn_gguf_parse(f->gguf_bytes, f->gguf_len, &f->gg, f->err));
}
static int run_gguf_open(fx *f) {
    char path[128];
    snprintf(path, sizeof path, "%s/w.gguf", f->dir);
    return io_status(f, clffn_gguf_open(path, &f->gg, f->err));
}
static int run_upload_typed(fx *f) {
    const clffn_typed_weights tw = typed_f16(f);
    return clffn_ffn_upload_weights_typed(f->ffn, CLFFN_LAYOUT_OUT_IN, &tw);
}
static int run_backward_typed(fx *f) { /* the biases' gradients: the matrices are f16 */
    const clffn_weight_arrays g = {NULL, f->g[1], NULL, f->g[3], NULL, f->g[5]};
    return clffn_backward_host(f->ffn, T, f->x, T * D, f->dy, T * D, f->dx, T * D, &g, 0);
}
static int run_npy_parse(fx *f) {
    return io_status(f, clffn_npy_parse(f->npy_bytes, f->npy_len, &f->npy, f->err));
}
static int run_npy_load(fx *f) {
    char path[128];
    snprintf(path, sizeof path, "%s/x.npy", f->dir);
    return io_status(f, clffn_npy_load(path, &f->npy, f->err));
}
static int run_npy_save(fx *f) {
    char path[128];
    snprintf(path, sizeof path, "%s/out.npy", f->dir);
    unlink(path);
    const uint64_t shape[2] = {T, D};
    return written_or_absent(f, path, clffn_npy_save(path, f->x, 2, shape, f->err));
}

static const op ops[] = {
    {"clffn_context_create", prep_none, run_context_create, fin_all, 1},
    {"clffn_context_create_default", prep_none, run_context_default, fin_all, 1},
    {"clffn_devices_list", prep_none, run_devices, fin_all, 1},
    {"clffn_context_device_name", prep_ctx, run_device_name, fin_all, 1},
    {"clffn_ffn_create", prep_ctx, run_ffn_create, fin_all, 1},
    {"clffn_ffn_init_weights", prep_ffn, run_ffn_init, fin_all, 1},
    {"clffn_ffn_upload_weights in_out", prep_ffn, run_upload_in_out, fin_all, 0},
    {"clffn_forward_host", prep_ffn, run_forward, fin_all, 0},
    {"clffn_backward_host", prep_forwarded, run_backward, fin_all, 0},
    {"clffn_ffn_read_hidden PRE", prep_forwarded, run_read_pre, fin_all, 1},
    {"clffn_ffn_read_hidden GATE", prep_forwarded, run_read_gate, fin_all, 1},
    {"clffn_init_weights_host in_out", prep_none, run_init_host, fin_all, 1},
    {"clffn_reference_forward", prep_none, run_ref_forward, fin_all, 1},
    {"clffn_reference_backward", prep_none, run_ref_backward, fin_all, 1},
    {"clffn_st_parse", prep_none, run_st_parse, fin_st, 1},
    {"clffn_st_open", prep_none, run_st_open, fin_st, 1},
    {"clffn_st_write", prep_none, run_st_write, fin_st, 1},
    {"clffn_npy_parse", prep_none, run_npy_parse, fin_npy, 1},
    {"clffn_npy_load", prep_none, run_npy_load, fin_npy, 1},
    {"clffn_npy_save", prep_none, run_npy_save, fin_npy, 1},
    {"clffn_gguf_parse", prep_none, run_gguf_parse, fin_gguf, 1},
    {"clffn_gguf_open", prep_none, run_gguf_open, fin_gguf, 1},
    {"clffn_ffn_upload_weights_typed f16", prep_typed, run_upload_typed, fin_all, 0},
    {"clffn_forward_host f16", prep_typed, run_forward, fin_all, 0},
    {"clffn_backward_host f16", prep_typed, run_backward_typed, fin_all, 0},
    {"clffn_ffn_create, scratch shared", prep_ctx_shared, run_ffn_create, fin_all, 1},
};

/* A failure the API documents as absorbed: with one failing allocation, a tuning profile that
 * cannot be parsed is skipped and the context says so (clffn_context_tuning). */
static int absorbed(const op *o, const fx *f, int sticky) {
    if (sticky || (o->run != run_context_create && o->run != run_context_default)) { return 0; }
    if (f->out_ctx == (clffn_context *)&S) { return 0; }
    return strstr(clffn_context_tuning(f->out_ctx), "could not be applied") != NULL;
}

static void sweep(const op *o, int sticky) {
    fx *f = &S;
    const long live0 = clffn__fi_live();
    const cl_uint refs0 = cl_refs(f);
    long n = 1;
    for (;; ++n) {
        char what[160];
        snprintf(what, sizeof what, "%s, allocation %ld failing%s", o->name, n,
                 sticky ? " and all after it" : "");
        outputs_reset(f);
        o->prepare(f);
        clffn__fi_arm(n, sticky);
        const int st = o->run(f);
        const long failed = clffn__fi_failed();
        clffn__fi_arm(0, 0);
        if (failed == 0) { /* every allocation of the op came and went: the sweep is over */
            cr_assert_eq(st, CLFFN_SUCCESS, "%s: %s with no failure", what,
                         clffn_status_string(st));
            o->finish(f);
            break;
        }
        if (st == CLFFN_SUCCESS && absorbed(o, f, sticky)) {
            o->finish(f);
        } else {
            cr_assert_eq(st, CLFFN_ERROR_OUT_OF_HOST_MEMORY, "%s: status %s", what,
                         clffn_status_string(st));
            outputs_untouched(f, what);
            o->finish(f);
        }
        cr_assert_eq(clffn__fi_live(), live0, "%s: %ld blocks leaked", what,
                     clffn__fi_live() - live0);
        const cl_uint refs = cl_refs_settled(f, refs0);
        cr_assert_eq(refs, refs0, "%s: OpenCL objects leaked (context references %u, was %u)", what,
                     refs, refs0);
        cr_assert(n < 10000, "%s: no end to the allocations", o->name);
    }
    cr_assert_eq(clffn__fi_live(), live0, "%s: blocks leaked by the successful run", o->name);
    cr_assert_eq(cl_refs_settled(f, refs0), refs0,
                 "%s: OpenCL objects leaked by the successful run", o->name);
    if (o->allocates) { cr_assert(n > 1, "%s: no allocation was failed; vacuous", o->name); }
    cr_log_info("%s: %ld allocation(s) failed in turn%s", o->name, n - 1,
                sticky ? " (sticky)" : "");
}

static void fixture_setup(void) {
    fx *f = &S;
    memset(f, 0, sizeof *f);
    cl_platform_id plat;
    cl_uint np = 0;
    cr_assert_eq(clGetPlatformIDs(1, &plat, &np), CL_SUCCESS);
    cr_assert_eq(clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &f->dev, NULL), CL_SUCCESS);
    cl_int err;
    f->cl = clCreateContext(NULL, 1, &f->dev, NULL, NULL, &err);
    cr_assert_eq(err, CL_SUCCESS);
    f->cfg = clffn_config_default(D, F);
    f->cfg.gated = 1;
    f->cfg.activation = CLFFN_ACT_SILU;
    f->cfg.dropout = 0.25f;
    for (size_t k = 0; k < 6; ++k) {
        for (size_t i = 0; i < D * F; ++i) {
            f->w[k][i] = (float)((i * 37 + k * 11) % 17) / 17.0f - 0.5f;
        }
    }
    for (size_t i = 0; i < T * D; ++i) {
        f->x[i] = (float)(i % 7) / 7.0f - 0.4f;
        f->dy[i] = (float)(i % 5) / 5.0f - 0.3f;
    }

    /* files for the loaders, and a tuning profile for the device (the built-in text) so that
     * context creation reads and parses one */
    snprintf(f->dir, sizeof f->dir, "/tmp/clffn-faults-XXXXXX");
    cr_assert(mkdtemp(f->dir));
    setenv("CLFFN_TUNE_DIR", f->dir, 1);
    unsetenv("CLFFN_NO_TUNING");
    const char *builtin = clffn__builtin_profile(f->dev);
    char path[1400];
    if (builtin) {
        cr_assert_eq(clffn_tuning_profile_path(f->dev, path, sizeof path), 0);
        FILE *pf = fopen(path, "wb");
        cr_assert(pf);
        fputs(builtin, pf);
        fclose(pf);
    }
    char ioerr[CLFFN_IO_ERR];
    const uint64_t s1[2] = {F, D}, s2[1] = {F};
    const clffn_st_out t[2] = {{"w_1.weight", 2, s1, f->w[0]}, {"w_1.bias", 1, s2, f->w[1]}};
    snprintf(path, sizeof path, "%s/w.safetensors", f->dir);
    cr_assert_eq(clffn_st_write(path, t, 2, ioerr), 0, "%s", ioerr);
    FILE *sf = fopen(path, "rb");
    cr_assert(sf);
    f->st_bytes = malloc(1 << 16);
    f->st_len = fread(f->st_bytes, 1, 1 << 16, sf);
    fclose(sf);
    const uint64_t shape[2] = {T, D};
    snprintf(path, sizeof path, "%s/x.npy", f->dir);
    cr_assert_eq(clffn_npy_save(path, f->x, 2, shape, ioerr), 0, "%s", ioerr);
    FILE *nf = fopen(path, "rb");
    cr_assert(nf);
    f->npy_bytes = malloc(1 << 16);
    f->npy_len = fread(f->npy_bytes, 1, 1 << 16, nf);
    fclose(nf);
    /* f16 weights, and a GGUF file of them with a bias */
    for (int i = 0; i < 3; ++i) {
        cr_assert_eq(
            clffn_convert_weights(CLFFN_DTYPE_F16, f->w[2 * i], D * F, f->h16[i], sizeof f->h16[i]),
            0);
    }
    const gw_kv kv = {"general.architecture", 8, 0, "llama"};
    const gw_tensor ts[3] = {
        {"blk.0.ffn_up.weight", 1, 2, {D, F}, f->h16[0], sizeof f->h16[0], 0},
        {"blk.0.ffn_down.weight", 1, 2, {F, D}, f->h16[2], sizeof f->h16[2], 0},
        {"blk.0.ffn_down.bias", 0, 1, {D}, f->w[5], D * sizeof(float), 0}};
    f->gguf_bytes = gw_image(3, 0, &kv, 1, ts, 3, &f->gguf_len);
    cr_assert(f->gguf_bytes);
    snprintf(path, sizeof path, "%s/w.gguf", f->dir);
    cr_assert_eq(gw_write(path, f->gguf_bytes, f->gguf_len), 0);
}

static void fixture_teardown(void) {
    free(S.st_bytes);
    free(S.npy_bytes);
    free(S.gguf_bytes);
    clReleaseContext(S.cl);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", S.dir);
    (void)!system(cmd);
}

TestSuite(faults, .init = fixture_setup, .fini = fixture_teardown, .timeout = 600);

/* The sweep's own machinery: the counters fail exactly what they were told to. */
Test(faults, injector) {
    const long live0 = clffn__fi_live();
    clffn__fi_arm(2, 0);
    void *a = clffn__fi_malloc(8), *b = clffn__fi_malloc(8), *c = clffn__fi_malloc(8);
    cr_assert(a && !b && c);
    cr_assert_eq(clffn__fi_failed(), 1);
    cr_assert_eq(clffn__fi_live(), live0 + 2);
    clffn__fi_free(a);
    clffn__fi_free(c);
    clffn__fi_arm(1, 1);
    cr_assert(!clffn__fi_malloc(8) && !clffn__fi_calloc(1, 8) && !clffn__fi_strdup("x"));
    cr_assert_eq(clffn__fi_failed(), 3);
    clffn__fi_arm(0, 0);
    cr_assert_eq(clffn__fi_live(), live0);
}

#define SWEEP_TEST(id, index)                          \
    Test(faults, id##_once) { sweep(&ops[index], 0); } \
    Test(faults, id##_sticky) { sweep(&ops[index], 1); }

SWEEP_TEST(context_create, 0)
SWEEP_TEST(context_create_default, 1)
SWEEP_TEST(devices_list, 2)
SWEEP_TEST(device_name, 3)
SWEEP_TEST(ffn_create, 4)
SWEEP_TEST(ffn_init_weights, 5)
SWEEP_TEST(upload_in_out, 6)
SWEEP_TEST(forward_host, 7)
SWEEP_TEST(backward_host, 8)
SWEEP_TEST(read_hidden_pre, 9)
SWEEP_TEST(read_hidden_gate, 10)
SWEEP_TEST(init_weights_host, 11)
SWEEP_TEST(reference_forward, 12)
SWEEP_TEST(reference_backward, 13)
SWEEP_TEST(st_parse, 14)
SWEEP_TEST(st_open, 15)
SWEEP_TEST(st_write, 16)
SWEEP_TEST(npy_parse, 17)
SWEEP_TEST(npy_load, 18)
SWEEP_TEST(npy_save, 19)
SWEEP_TEST(gguf_parse, 20)
SWEEP_TEST(gguf_open, 21)
SWEEP_TEST(upload_typed_f16, 22)
SWEEP_TEST(forward_host_f16, 23)
SWEEP_TEST(backward_host_f16, 24)
SWEEP_TEST(ffn_create_shared, 25)

/* ------------------------------------------------------------------------------------------ */
/* Device allocations. The k-th buffer clffn creates inside a forward or backward fails, for
 * k = 1, 2, … until a call creates none that fails (sticky: that one and all after it). A
 * failing call returns the allocation's error and leaves the caller's y, dx and every gradient
 * exactly as they were, also with accumulate, where a partly run backward would have added some
 * gradients already and a retry would add them twice. Every product takes CLBlast's indirect
 * GEMM here, whose padded copies need the FFN's scratch, so the scratch grows inside the call. */

enum { NG = 5 }; /* device gradients: stacked w1|v, b1, bv, w2, b2 */

typedef struct dev_fx {
    clffn_context *ctx;
    clffn_ffn *ffn;
    cl_mem x, dy, dx, y, g[NG];
    size_t g_len[NG];
} dev_fx;

static cl_mem dev_buffer(cl_context cl, size_t n) {
    cl_int err;
    cl_mem m = clCreateBuffer(cl, CL_MEM_READ_WRITE, n * sizeof(float), NULL, &err);
    cr_assert_eq(err, CL_SUCCESS);
    return m;
}

static void dev_write(clffn_context *ctx, cl_mem m, const float *src, size_t n) {
    cr_assert_eq(clEnqueueWriteBuffer(clffn_context_queue(ctx), m, CL_TRUE, 0, n * sizeof(float),
                                      src, 0, NULL, NULL),
                 CL_SUCCESS);
}

static void dev_read(clffn_context *ctx, cl_mem m, float *dst, size_t n) {
    cr_assert_eq(clEnqueueReadBuffer(clffn_context_queue(ctx), m, CL_TRUE, 0, n * sizeof(float),
                                     dst, 0, NULL, NULL),
                 CL_SUCCESS);
}

/* The device sweeps' FFN applies its epilogues in the products' kernels (f32 weights kept
 * [out, in] on clffn's own kernels, inference: dropout would keep the first apart). */
static int dev_fused;

/* a fresh FFN (empty workspace and scratch) with its buffers: y and dx hold SENTINEL, the
 * gradients 0.5 (to be accumulated onto) */
static void dev_setup(fx *f, dev_fx *d) {
    cr_assert_eq(clffn_context_create(f->cl, f->dev, &d->ctx), 0);
    cr_assert_eq(clffn_context_set_fused_epilogues(d->ctx, dev_fused), 0);
    if (dev_fused) {
        cr_assert_eq(clffn_context_set_kernel_max_tokens(d->ctx, 0, T), 0);
        cr_assert_eq(clffn_context_set_weight_layout(d->ctx, CLFFN_LAYOUT_OUT_IN), 0);
    }
    /* every product through the indirect kernel (the direct one needs no scratch) */
    const char *name[1] = {"XGEMM_MIN_INDIRECT_SIZE"};
    const size_t one[1] = {1};
    cr_assert_eq(
        CLBlastOverrideParameters(f->dev, "GemmRoutine", CLBlastPrecisionSingle, 1, name, one),
        CLBlastSuccess);
    cr_assert_eq(clffn_ffn_create(d->ctx, &f->cfg, &d->ffn), 0);
    const clffn_host_weights hw = host_weights(f);
    cr_assert_eq(clffn_ffn_upload_weights(d->ffn, CLFFN_LAYOUT_OUT_IN, &hw), 0);
    cr_assert_eq(clffn_ffn_set_training(d->ffn, !dev_fused), 0);
    float fill[2 * F * D];
    for (size_t i = 0; i < 2 * F * D; ++i) { fill[i] = SENTINEL; }
    d->x = dev_buffer(f->cl, T * D);
    d->dy = dev_buffer(f->cl, T * D);
    d->dx = dev_buffer(f->cl, T * D);
    d->y = dev_buffer(f->cl, T * D);
    dev_write(d->ctx, d->x, f->x, T * D);
    dev_write(d->ctx, d->dy, f->dy, T * D);
    dev_write(d->ctx, d->dx, fill, T * D);
    dev_write(d->ctx, d->y, fill, T * D);
    const size_t len[NG] = {2 * F * D, F, F, D * F, D};
    for (size_t i = 0; i < 2 * F * D; ++i) { fill[i] = 0.5f; }
    for (int k = 0; k < NG; ++k) {
        d->g_len[k] = len[k];
        d->g[k] = dev_buffer(f->cl, len[k]);
        dev_write(d->ctx, d->g[k], fill, len[k]);
    }
}

static void dev_teardown(dev_fx *d) {
    cl_mem all[4 + NG] = {d->x, d->dy, d->dx, d->y};
    for (int k = 0; k < NG; ++k) { all[4 + k] = d->g[k]; }
    for (int i = 0; i < 4 + NG; ++i) { clReleaseMemObject(all[i]); }
    clffn_ffn_destroy(d->ffn);
    clffn_context_destroy(d->ctx);
}

static int dev_forward(dev_fx *d) {
    cl_command_queue q = clffn_context_queue(d->ctx);
    const int st = clffn_forward(d->ffn, T, d->x, 0, d->y, 0, q, NULL);
    clFinish(q);
    return st;
}

static int dev_backward(dev_fx *d) {
    const clffn_device_weights g = {{d->g[0], 0}, {d->g[1], 0}, {NULL, 0},
                                    {d->g[2], 0}, {d->g[3], 0}, {d->g[4], 0}};
    cl_command_queue q = clffn_context_queue(d->ctx);
    const int st = clffn_backward(d->ffn, T, d->x, 0, d->dy, 0, d->dx, 0, &g, 1, q, NULL);
    clFinish(q);
    return st;
}

/* Everything the caller owns, read back: y, dx, then the gradients. */
static size_t dev_snapshot(dev_fx *d, float *out) {
    size_t n = 0;
    dev_read(d->ctx, d->y, out + n, T * D), n += T * D;
    dev_read(d->ctx, d->dx, out + n, T * D), n += T * D;
    for (int k = 0; k < NG; ++k) {
        dev_read(d->ctx, d->g[k], out + n, d->g_len[k]), n += d->g_len[k];
    }
    return n;
}

#define SNAP (2 * T * D + 3 * F * D + 2 * F + D)

/* Sweeps the device allocations of a forward (backward = 0) or of a backward after a clean
 * forward; then the call succeeds and must give what a run that never failed gives. */
static void device_sweep(int backward, int sticky) {
    fx *f = &S;
    static float before[SNAP], after[SNAP], clean[SNAP];
    dev_fx d;
    /* the clean run, for the values a retry must give */
    dev_setup(f, &d);
    cr_assert_eq(dev_forward(&d), 0);
    cr_assert_eq(d.ffn->last_fused.first && d.ffn->last_fused.second, dev_fused);
    if (backward) { cr_assert_eq(dev_backward(&d), 0); }
    const size_t n = dev_snapshot(&d, clean);
    dev_teardown(&d);
    cr_assert_eq(n, SNAP);

    long k = 1;
    for (;; ++k) {
        dev_setup(f, &d);
        if (backward) { cr_assert_eq(dev_forward(&d), 0); }
        dev_snapshot(&d, before);
        clffn__fi_arm_device(k, sticky);
        const int st = backward ? dev_backward(&d) : dev_forward(&d);
        const long failed = clffn__fi_device_failed();
        clffn__fi_arm_device(0, 0);
        if (failed == 0) {
            cr_assert_eq(st, CLFFN_SUCCESS, "buffer %ld: %s with no failure", k,
                         clffn_status_string(st));
            dev_teardown(&d);
            break;
        }
        cr_assert_eq(st, CL_MEM_OBJECT_ALLOCATION_FAILURE, "%s, buffer %ld failing: %s",
                     backward ? "backward" : "forward", k, clffn_status_string(st));
        dev_snapshot(&d, after);
        for (size_t i = 0; i < SNAP; ++i) {
            cr_assert(after[i] == before[i] || (after[i] != after[i] && before[i] != before[i]),
                      "%s, buffer %ld failing: the caller's value [%zu] changed (%g -> %g)",
                      backward ? "backward" : "forward", k, i, before[i], after[i]);
        }
        /* the retry, with nothing failing, adds its gradients once */
        cr_assert_eq(backward ? dev_backward(&d) : dev_forward(&d), 0);
        dev_snapshot(&d, after);
        for (size_t i = 0; i < SNAP; ++i) {
            if (!backward && i >= T * D) { break; }
            cr_assert(fabsf(after[i] - clean[i]) <= 1e-6f * (1.0f + fabsf(clean[i])),
                      "%s retried after buffer %ld failed: [%zu] is %g, a clean run gives %g",
                      backward ? "backward" : "forward", k, i, after[i], clean[i]);
        }
        dev_teardown(&d);
        cr_assert(k < 1000, "no end to the device allocations");
    }
    cr_assert(k > 2, "%s: fewer than two device buffers made inside the call; vacuous",
              backward ? "backward" : "forward");
    cr_log_info("%s: %ld device buffer(s) failed in turn%s", backward ? "backward" : "forward",
                k - 1, sticky ? " (sticky)" : "");
}

Test(faults, device_forward_once) { device_sweep(0, 0); }
Test(faults, device_forward_sticky) { device_sweep(0, 1); }
Test(faults, device_backward_once) { device_sweep(1, 0); }
Test(faults, device_backward_sticky) { device_sweep(1, 1); }
Test(faults, device_fused_forward_once) {
    dev_fused = 1;
    device_sweep(0, 0);
}
Test(faults, device_fused_backward_sticky) {
    dev_fused = 1;
    device_sweep(1, 1);
}
