/* clffn-run: a checkpoint of either format, safetensors or GGUF (told apart by GGUF's magic),
 * seen the same way: tensors with row-major shapes, read as f32 values or as their stored
 * bytes where clffn keeps that type on a device. */
#include "run.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Whether the file at path starts with GGUF's magic (0 when it cannot be read: the loader
 * that follows says why). */
static int is_gguf(const char *path) {
    uint8_t magic[4];
    const int fd = open(path, O_RDONLY);
    if (fd < 0) { return 0; }
    const ssize_t n = read(fd, magic, sizeof magic);
    close(fd);
    return n == 4 && clffn_gguf_is(magic, 4);
}

/* clffn's type for a safetensors dtype it keeps on a device (F32, F16, BF16); 0 when none. */
static int st_keep(clffn_io_dtype d, clffn_dtype *out) {
    switch (d) {
    case CLFFN_DT_F32: *out = CLFFN_DTYPE_F32; return 1;
    case CLFFN_DT_F16: *out = CLFFN_DTYPE_F16; return 1;
    case CLFFN_DT_BF16: *out = CLFFN_DTYPE_BF16; return 1;
    default: return 0;
    }
}

/* clffn's type for a ggml type it keeps on a device; 0 when none. */
static int gg_keep(uint32_t t, clffn_dtype *out) {
    switch (t) {
    case CLFFN_GGML_F32: *out = CLFFN_DTYPE_F32; return 1;
    case CLFFN_GGML_F16: *out = CLFFN_DTYPE_F16; return 1;
    case CLFFN_GGML_BF16: *out = CLFFN_DTYPE_BF16; return 1;
    case CLFFN_GGML_Q8_0: *out = CLFFN_DTYPE_Q8_0; return 1;
    case CLFFN_GGML_Q4_0: *out = CLFFN_DTYPE_Q4_0; return 1;
    default: return 0;
    }
}

static void view_st(const clffn_st_tensor *s, ckpt_tensor *t) {
    t->name = s->name;
    t->rank = s->rank;
    memcpy(t->shape, s->shape, sizeof s->shape);
    t->numel = s->numel;
    t->keep = st_keep(s->dtype, &t->dtype);
    t->readable = clffn_io_dtype_is_convertible(s->dtype);
    snprintf(t->type_name, sizeof t->type_name, "%s", clffn_io_dtype_name(s->dtype));
    t->st = s;
}

/* GGUF lists ne[0] (a row's length) first: the row-major shape is the reverse. */
static void view_gg(const clffn_gguf_tensor *g, ckpt_tensor *t) {
    t->name = g->name;
    t->rank = g->rank;
    for (size_t d = 0; d < g->rank; ++d) { t->shape[d] = g->ne[g->rank - 1 - d]; }
    t->numel = g->numel;
    t->keep = gg_keep(g->type, &t->dtype);
    t->readable = t->keep;
    const char *name = clffn_gguf_type_name(g->type);
    snprintf(t->type_name, sizeof t->type_name, "%s", name ? name : "?");
    t->gg = g;
}

int ckpt_open(const char *path, ckpt *c, char *err) {
    memset(c, 0, sizeof *c);
    c->gguf = is_gguf(path);
    if (c->gguf ? clffn_gguf_open(path, &c->gg, err) : clffn_st_open(path, &c->st, err)) {
        return -1;
    }
    const size_t n = c->gguf ? c->gg.count : c->st.count;
    if (!(c->tensors = calloc(n ? n : 1, sizeof *c->tensors))) {
        ckpt_close(c);
        snprintf(err, CLFFN_IO_ERR, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; ++i) {
        if (c->gguf) {
            view_gg(&c->gg.tensors[i], &c->tensors[i]);
        } else {
            view_st(&c->st.tensors[i], &c->tensors[i]);
        }
    }
    c->count = n;
    return 0;
}

void ckpt_close(ckpt *c) {
    if (c->gguf) {
        clffn_gguf_close(&c->gg);
    } else {
        clffn_st_close(&c->st);
    }
    free(c->tensors);
    memset(c, 0, sizeof *c);
}

const ckpt_tensor *ckpt_find(const ckpt *c, const char *name) {
    for (size_t i = 0; i < c->count; ++i) {
        if (!strcmp(c->tensors[i].name, name)) { return &c->tensors[i]; }
    }
    return NULL;
}

/* A matrix's rows and columns (a vector is one row; GGUF's higher dimensions fold into rows). */
static void extent(const ckpt_tensor *t, uint64_t *rows, uint64_t *cols) {
    *cols = t->rank ? t->shape[t->rank - 1] : 1;
    *rows = *cols ? t->numel / *cols : 0;
}

int ckpt_read_stored(const ckpt *c, const ckpt_tensor *t, uint64_t row0, uint64_t rows,
                     uint64_t col0, uint64_t cols, void *dst, size_t dst_size, char *err) {
    if (!t->keep) {
        return clffn__io_fail(err, "tensor '%s' is %s, which clffn does not keep on a device",
                              t->name, t->type_name);
    }
    if (c->gguf) {
        return clffn_gguf_read_block(&c->gg, t->gg, row0, rows, col0, cols, dst, dst_size, err);
    }
    size_t need;
    if (clffn_dtype_bytes(t->dtype, (size_t)(rows * cols), &need) != CLFFN_SUCCESS ||
        need > dst_size) {
        return clffn__io_fail(err, "tensor '%s': the buffer is too small", t->name);
    }
    return clffn_st_read_block(&c->st, t->st, row0, rows, col0, cols, dst, err);
}

int ckpt_read_f32(const ckpt *c, const ckpt_tensor *t, uint64_t row0, uint64_t rows, uint64_t col0,
                  uint64_t cols, float *dst, char *err) {
    if (!t->readable) {
        return clffn__io_fail(
            err, "tensor '%s' is %s, which clffn does not read (%s)", t->name, t->type_name,
            c->gguf ? "F32, F16, BF16, Q8_0 and Q4_0 are" : "F32, F16, BF16 and F64 are");
    }
    if (!c->gguf) {
        return clffn_st_read_f32_block(&c->st, t->st, row0, rows, col0, cols, dst, err);
    }
    size_t bytes;
    if (clffn_gguf_block_bytes(t->gg, rows, cols, &bytes, err) != 0) { return -1; }
    void *raw = malloc(bytes ? bytes : 1);
    if (!raw) { return clffn__io_fail(err, "out of memory for tensor '%s'", t->name); }
    int rc = clffn_gguf_read_block(&c->gg, t->gg, row0, rows, col0, cols, raw, bytes, err);
    if (rc == 0 && clffn_convert_to_f32(t->dtype, raw, bytes, (size_t)(rows * cols), dst,
                                        (size_t)(rows * cols)) != CLFFN_SUCCESS) {
        rc = clffn__io_fail(err, "tensor '%s': cannot decode its %s values", t->name, t->type_name);
    }
    free(raw);
    return rc;
}

int ckpt_read_all_f32(const ckpt *c, const ckpt_tensor *t, float *dst, char *err) {
    uint64_t rows, cols;
    extent(t, &rows, &cols);
    return ckpt_read_f32(c, t, 0, rows, 0, cols, dst, err);
}
