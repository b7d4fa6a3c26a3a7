/* GGUF reading: llama.cpp's model files, versions 2 and 3, little-endian.
 *
 *   "GGUF" u32 version  u64 tensor_count  u64 kv_count
 *   kv_count × (string key, u32 value type, value)
 *   tensor_count × (string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset)
 *   padding to general.alignment (default 32), then the data section
 *
 * A string is a u64 length and that many bytes. Every count, length, offset and size is
 * bounded by the bytes that remain and checked for overflow before it is used, since a model
 * file may come from anywhere: a damaged one gets one line saying what is wrong. */
#include "clffn_io.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define fail clffn__io_fail

/* ggml's types: name, values per block and bytes per block (ggml.c's type traits). Numbers no
 * ggml has defined, or has retired, have no entry. */
static const struct {
    const char *name;
    uint32_t block, bytes;
} types[] = {
    [0] = {"F32", 1, 4},         [1] = {"F16", 1, 2},         [2] = {"Q4_0", 32, 18},
    [3] = {"Q4_1", 32, 20},      [6] = {"Q5_0", 32, 22},      [7] = {"Q5_1", 32, 24},
    [8] = {"Q8_0", 32, 34},      [9] = {"Q8_1", 32, 36},      [10] = {"Q2_K", 256, 84},
    [11] = {"Q3_K", 256, 110},   [12] = {"Q4_K", 256, 144},   [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210},   [15] = {"Q8_K", 256, 292},   [16] = {"IQ2_XXS", 256, 66},
    [17] = {"IQ2_XS", 256, 74},  [18] = {"IQ3_XXS", 256, 98}, [19] = {"IQ1_S", 256, 50},
    [20] = {"IQ4_NL", 32, 18},   [21] = {"IQ3_S", 256, 110},  [22] = {"IQ2_S", 256, 82},
    [23] = {"IQ4_XS", 256, 136}, [24] = {"I8", 1, 1},         [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},        [27] = {"I64", 1, 8},        [28] = {"F64", 1, 8},
    [29] = {"IQ1_M", 256, 56},   [30] = {"BF16", 1, 2},       [34] = {"TQ1_0", 256, 54},
    [35] = {"TQ2_0", 256, 66},   [39] = {"MXFP4", 32, 17},
};
enum { N_TYPES = sizeof types / sizeof types[0] };

const char *clffn_gguf_type_name(uint32_t type) { return type < N_TYPES ? types[type].name : NULL; }

int clffn_gguf_type_block(uint32_t type, uint32_t *block, uint32_t *bytes) {
    if (type >= N_TYPES || !types[type].name) { return -1; }
    *block = types[type].block;
    *bytes = types[type].bytes;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* A bounded reader over the image */

typedef struct reader {
    const uint8_t *buf;
    size_t len, pos;
    char *err;
} reader;

static uint64_t le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) { v = (v << 8) | p[i]; }
    return v;
}

static int take(reader *r, size_t n, const char *what, const uint8_t **at) {
    if (n > r->len - r->pos) {
        return fail(r->err, "%s at byte %zu runs past the end of the file (%zu bytes)", what,
                    r->pos, r->len);
    }
    *at = r->buf + r->pos;
    r->pos += n;
    return 0;
}

static int u32(reader *r, const char *what, uint32_t *out) {
    const uint8_t *p = NULL;
    if (take(r, 4, what, &p) != 0) { return -1; }
    *out = (uint32_t)le(p, 4);
    return 0;
}

static int u64(reader *r, const char *what, uint64_t *out) {
    const uint8_t *p = NULL;
    if (take(r, 8, what, &p) != 0) { return -1; }
    *out = le(p, 8);
    return 0;
}

/* A string's bytes (not NUL-terminated) and length. */
static int string(reader *r, const char *what, const uint8_t **s, uint64_t *n) {
    if (u64(r, what, n) != 0) { return -1; }
    if (*n > r->len - r->pos) {
        return fail(r->err, "%s of %llu bytes at byte %zu runs past the end of the file", what,
                    (unsigned long long)*n, r->pos - 8);
    }
    return take(r, (size_t)*n, what, s);
}

/* A NUL-terminated copy of a name (no NUL inside, at most max bytes). */
static int name_copy(reader *r, const char *what, size_t max, char **out) {
    const uint8_t *s = NULL;
    uint64_t n;
    if (string(r, what, &s, &n) != 0) { return -1; }
    if (n > max || memchr(s, 0, (size_t)n)) {
        return fail(r->err, "%s at byte %zu is %s", what, r->pos - (size_t)n,
                    n > max ? "too long" : "not text (it holds a NUL byte)");
    }
    if (!(*out = malloc((size_t)n + 1))) { return fail(r->err, "out of memory"); }
    memcpy(*out, s, (size_t)n);
    (*out)[n] = '\0';
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Metadata */

/* Bytes of one fixed-size value of a GGUF value type; 0 for strings, arrays and unknown types. */
static size_t value_size(uint32_t type) {
    static const size_t sizes[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return type < 13 ? sizes[type] : 0;
}

/* Skips one value of `type` (an array's elements are of one type; arrays of arrays are not in
 * any file llama.cpp writes, and not read here). */
static int skip_value(reader *r, const char *key, uint32_t type, clffn_gguf_kv *kv) {
    const uint8_t *at = NULL;
    uint64_t n;
    if (type == CLFFN_GGUF_STRING) { return string(r, "a string value", &at, &n); }
    if (type != CLFFN_GGUF_ARRAY) {
        const size_t size = value_size(type);
        if (!size) { return fail(r->err, "key '%s' has unknown value type %u", key, type); }
        return take(r, size, "a value", &at);
    }
    uint32_t elem;
    if (u32(r, "an array's type", &elem) != 0 || u64(r, "an array's length", &n) != 0) {
        return -1;
    }
    if (elem == CLFFN_GGUF_ARRAY) { return fail(r->err, "key '%s' is an array of arrays", key); }
    const size_t size = value_size(elem);
    if (elem != CLFFN_GGUF_STRING && !size) {
        return fail(r->err, "key '%s' is an array of unknown type %u", key, elem);
    }
    /* each element takes at least one byte (a string, eight): bounded by what remains */
    if (n > (r->len - r->pos) / (size ? size : 8)) {
        return fail(r->err, "key '%s': an array of %llu elements cannot fit in the file", key,
                    (unsigned long long)n);
    }
    kv->elem_type = elem;
    kv->count = n;
    if (size) { return take(r, (size_t)n * size, "an array", &at); }
    for (uint64_t i = 0; i < kv->count; ++i) {
        if (string(r, "an array's string", &at, &n) != 0) { return -1; }
    }
    return 0;
}

static int parse_kvs(reader *r, uint64_t count, clffn_gguf_file *f) {
    /* a key-value takes at least 13 bytes */
    if (count > (r->len - r->pos) / 13) {
        return fail(r->err, "%llu metadata entries cannot fit in the file",
                    (unsigned long long)count);
    }
    if (count && !(f->kvs = calloc((size_t)count, sizeof *f->kvs))) {
        return fail(r->err, "out of memory");
    }
    for (uint64_t i = 0; i < count; ++i) {
        clffn_gguf_kv *kv = &f->kvs[i];
        if (name_copy(r, "a metadata key", 65535, &kv->key) != 0) { return -1; }
        f->kv_count = (size_t)i + 1;
        if (u32(r, "a value type", &kv->type) != 0) { return -1; }
        kv->value = r->buf + r->pos;
        if (skip_value(r, kv->key, kv->type, kv) != 0) { return -1; }
        kv->value_len = (uint64_t)(r->buf + r->pos - kv->value);
    }
    return 0;
}

const clffn_gguf_kv *clffn_gguf_kv_find(const clffn_gguf_file *f, const char *key) {
    for (size_t i = 0; i < f->kv_count; ++i) {
        if (!strcmp(f->kvs[i].key, key)) { return &f->kvs[i]; }
    }
    return NULL;
}

int clffn_gguf_uint(const clffn_gguf_file *f, const char *key, uint64_t *out) {
    const clffn_gguf_kv *kv = clffn_gguf_kv_find(f, key);
    if (!kv) { return -1; }
    const size_t size = value_size(kv->type);
    const int is_signed = kv->type == 1 || kv->type == 3 || kv->type == 5 || kv->type == 11;
    if (!size || kv->type == CLFFN_GGUF_FLOAT32 || kv->type == CLFFN_GGUF_BOOL ||
        kv->type == CLFFN_GGUF_FLOAT64) {
        return -1;
    }
    const uint64_t v = le(kv->value, (int)size);
    if (is_signed && (v >> (8 * size - 1)) & 1) { return -1; } /* negative */
    *out = v;
    return 0;
}

int clffn_gguf_string(const clffn_gguf_file *f, const char *key, char *buf, size_t size) {
    const clffn_gguf_kv *kv = clffn_gguf_kv_find(f, key);
    if (!kv || kv->type != CLFFN_GGUF_STRING || size == 0) { return -1; }
    const uint64_t n = le(kv->value, 8);
    if (n >= size) { return -1; }
    memcpy(buf, kv->value + 8, (size_t)n);
    buf[n] = '\0';
    return 0;
}

/* Each name once: sorted pointers, neighbours compared (n log n, whatever a file claims). */
static int by_string(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int check_unique(const char **names, size_t n, const char *what, char *err) {
    qsort(names, n, sizeof *names, by_string);
    for (size_t i = 1; i < n; ++i) {
        if (!strcmp(names[i - 1], names[i])) {
            return fail(err, "%s '%s' appears twice", what, names[i]);
        }
    }
    return 0;
}

static int unique_keys_and_names(const clffn_gguf_file *f, char *err) {
    const size_t n = f->kv_count > f->count ? f->kv_count : f->count;
    const char **names = malloc((n ? n : 1) * sizeof *names);
    if (!names) { return fail(err, "out of memory"); }
    for (size_t i = 0; i < f->kv_count; ++i) { names[i] = f->kvs[i].key; }
    int rc = check_unique(names, f->kv_count, "metadata key", err);
    for (size_t i = 0; i < f->count; ++i) { names[i] = f->tensors[i].name; }
    if (rc == 0) { rc = check_unique(names, f->count, "tensor", err); }
    free(names);
    return rc;
}

/* general.alignment: a power of two (llama.cpp writes it as a u32), 32 without it. */
static int alignment(clffn_gguf_file *f, char *err) {
    f->alignment = 32;
    if (!clffn_gguf_kv_find(f, "general.alignment")) { return 0; }
    uint64_t a;
    if (clffn_gguf_uint(f, "general.alignment", &a) != 0 || a == 0 || (a & (a - 1)) ||
        a > ((uint64_t)1 << 30)) {
        return fail(err, "general.alignment is not a power of two up to 2^30");
    }
    f->alignment = a;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Tensors */

static int parse_tensor(reader *r, clffn_gguf_tensor *t) {
    if (name_copy(r, "a tensor name", 255, &t->name) != 0) { return -1; }
    uint32_t dims;
    if (u32(r, "a tensor's dimension count", &dims) != 0) { return -1; }
    if (dims == 0 || dims > CLFFN_GGUF_MAX_DIMS) {
        return fail(r->err, "tensor '%s' has %u dimensions (1 to %d)", t->name, dims,
                    CLFFN_GGUF_MAX_DIMS);
    }
    t->rank = dims;
    t->numel = 1;
    for (uint32_t d = 0; d < dims; ++d) {
        if (u64(r, "a tensor's dimension", &t->ne[d]) != 0) { return -1; }
        if (t->ne[d] != 0 && t->numel > UINT64_MAX / t->ne[d]) {
            return fail(r->err, "tensor '%s': its element count overflows", t->name);
        }
        t->numel *= t->ne[d];
    }
    for (uint32_t d = dims; d < CLFFN_GGUF_MAX_DIMS; ++d) { t->ne[d] = 1; }
    uint32_t block, bytes;
    if (u32(r, "a tensor's type", &t->type) != 0 || u64(r, "a tensor's offset", &t->offset) != 0) {
        return -1;
    }
    if (clffn_gguf_type_block(t->type, &block, &bytes) != 0) {
        return fail(r->err, "tensor '%s' has unknown type %u", t->name, t->type);
    }
    if (t->ne[0] % block) {
        return fail(r->err, "tensor '%s': rows of %llu values are not whole %s blocks of %u",
                    t->name, (unsigned long long)t->ne[0], types[t->type].name, block);
    }
    const uint64_t blocks = t->numel / block;
    if (blocks > UINT64_MAX / bytes) {
        return fail(r->err, "tensor '%s': its size overflows", t->name);
    }
    t->bytes = blocks * bytes;
    return 0;
}

static int by_offset(const void *a, const void *b) {
    const clffn_gguf_tensor *x = *(const clffn_gguf_tensor *const *)a,
                            *y = *(const clffn_gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Every tensor aligned, inside the data section, and none overlapping another. */
static int check_layout(const clffn_gguf_file *f, char *err) {
    const clffn_gguf_tensor **byoff = malloc((f->count ? f->count : 1) * sizeof *byoff);
    if (!byoff) { return fail(err, "out of memory"); }
    for (size_t i = 0; i < f->count; ++i) { byoff[i] = &f->tensors[i]; }
    qsort(byoff, f->count, sizeof *byoff, by_offset);
    int rc = 0;
    uint64_t end = 0;
    for (size_t i = 0; i < f->count && rc == 0; ++i) {
        const clffn_gguf_tensor *t = byoff[i];
        if (t->offset % f->alignment) {
            rc = fail(err, "tensor '%s' at offset %llu is not aligned to %llu bytes", t->name,
                      (unsigned long long)t->offset, (unsigned long long)f->alignment);
        } else if (t->offset > f->data_len || t->bytes > f->data_len - t->offset) {
            rc = fail(err,
                      "tensor '%s' (%llu bytes at offset %llu) runs past the data section "
                      "(%llu bytes)",
                      t->name, (unsigned long long)t->bytes, (unsigned long long)t->offset,
                      (unsigned long long)f->data_len);
        } else if (i > 0 && t->offset < end) {
            rc = fail(err, "tensor '%s' overlaps tensor '%s'", t->name, byoff[i - 1]->name);
        }
        end = t->offset + t->bytes;
    }
    free(byoff);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* The file */

int clffn_gguf_is(const uint8_t *buf, size_t len) { return len >= 4 && !memcmp(buf, "GGUF", 4); }

void clffn_gguf_close(clffn_gguf_file *f) {
    for (size_t i = 0; i < f->kv_count; ++i) { free(f->kvs[i].key); }
    for (size_t i = 0; i < f->count; ++i) { free(f->tensors[i].name); }
    free(f->kvs);
    free(f->tensors);
    if (f->map) { munmap(f->map, f->map_len); }
    memset(f, 0, sizeof *f);
}

/* The fixed header: magic, version (2 or 3, little-endian), the two counts. */
static int parse_head(reader *r, clffn_gguf_file *f, uint64_t *tensors, uint64_t *kvs) {
    if (!clffn_gguf_is(r->buf, r->len)) { return fail(r->err, "not a GGUF file (no magic)"); }
    r->pos = 4;
    if (u32(r, "the version", &f->version) != 0) { return -1; }
    if (f->version == 0x02000000u || f->version == 0x03000000u) {
        return fail(r->err, "a big-endian GGUF file: only little-endian ones are read");
    }
    if (f->version != 2 && f->version != 3) {
        return fail(r->err, "GGUF version %u is not read (versions 2 and 3 are)", f->version);
    }
    return u64(r, "the tensor count", tensors) != 0 || u64(r, "the metadata count", kvs) != 0 ? -1
                                                                                              : 0;
}

int clffn_gguf_parse(const uint8_t *buf, size_t len, clffn_gguf_file *out, char *err) {
    if (!buf) { return fail(err, "no data"); }
    reader r = {buf, len, 0, err};
    clffn_gguf_file f;
    memset(&f, 0, sizeof f);
    uint64_t nt = 0, nkv = 0;
    int rc = parse_head(&r, &f, &nt, &nkv);
    if (rc == 0) { rc = parse_kvs(&r, nkv, &f); }
    if (rc == 0 && nt > (r.len - r.pos) / 32) { /* a tensor's info takes at least 32 bytes */
        rc = fail(err, "%llu tensors cannot fit in the file", (unsigned long long)nt);
    }
    if (rc == 0 && nt && !(f.tensors = calloc((size_t)nt, sizeof *f.tensors))) {
        rc = fail(err, "out of memory");
    }
    for (uint64_t i = 0; rc == 0 && i < nt; ++i) {
        rc = parse_tensor(&r, &f.tensors[i]);
        f.count = (size_t)i + 1;
    }
    if (rc == 0) { rc = alignment(&f, err); }
    if (rc == 0) { rc = unique_keys_and_names(&f, err); }
    if (rc == 0) {
        const uint64_t start = (r.pos + f.alignment - 1) / f.alignment * f.alignment;
        if (start > len) {
            rc = fail(err, "the data section's start (byte %llu) is past the end of the file",
                      (unsigned long long)start);
        } else {
            f.data = buf + start;
            f.data_len = len - start;
        }
    }
    if (rc == 0) { rc = check_layout(&f, err); }
    if (rc != 0) {
        clffn_gguf_close(&f); /* the caller's struct stays as it was */
        return -1;
    }
    *out = f;
    return 0;
}

int clffn_gguf_open(const char *path, clffn_gguf_file *out, char *err) {
    void *map;
    size_t len;
    if (clffn__io_map(path, 24, "a GGUF file", &map, &len, err) != 0) { return -1; }
    clffn_gguf_file f;
    if (clffn_gguf_parse(map, len, &f, err) != 0) {
        munmap(map, len);
        return -1;
    }
    *out = f;
    out->map = map;
    out->map_len = len;
    return 0;
}

const clffn_gguf_tensor *clffn_gguf_find(const clffn_gguf_file *f, const char *name) {
    for (size_t i = 0; i < f->count; ++i) {
        if (!strcmp(f->tensors[i].name, name)) { return &f->tensors[i]; }
    }
    return NULL;
}

int clffn_gguf_block_bytes(const clffn_gguf_tensor *t, uint64_t rows, uint64_t cols, size_t *bytes,
                           char *err) {
    uint32_t block, size;
    if (clffn_gguf_type_block(t->type, &block, &size) != 0 || cols % block) {
        return fail(err, "tensor '%s': %llu values of a row are not whole %s blocks", t->name,
                    (unsigned long long)cols, clffn_gguf_type_name(t->type));
    }
    const uint64_t row = cols / block * size;
    if (rows && row > SIZE_MAX / rows) {
        return fail(err, "tensor '%s': block too large", t->name);
    }
    *bytes = (size_t)(rows * row);
    return 0;
}

int clffn_gguf_read_block(const clffn_gguf_file *f, const clffn_gguf_tensor *t, uint64_t row0,
                          uint64_t rows, uint64_t col0, uint64_t cols, void *dst, size_t dst_size,
                          char *err) {
    const uint64_t nrows = t->numel / (t->ne[0] ? t->ne[0] : 1);
    uint32_t block, size;
    size_t need;
    if (clffn_gguf_type_block(t->type, &block, &size) != 0 ||
        clffn_gguf_block_bytes(t, rows, cols, &need, err) != 0) {
        return -1;
    }
    if (row0 > nrows || rows > nrows - row0 || col0 > t->ne[0] || cols > t->ne[0] - col0) {
        return fail(err, "tensor '%s': block [%llu, +%llu) × [%llu, +%llu) is outside it", t->name,
                    (unsigned long long)row0, (unsigned long long)rows, (unsigned long long)col0,
                    (unsigned long long)cols);
    }
    if (col0 % block) {
        return fail(err, "tensor '%s': a slice starting at value %llu of a row cuts a %s block",
                    t->name, (unsigned long long)col0, clffn_gguf_type_name(t->type));
    }
    if (need > dst_size) { return fail(err, "tensor '%s': the buffer is too small", t->name); }
    const uint64_t row_bytes = t->ne[0] / block * size, skip = col0 / block * size;
    const size_t len = (size_t)(cols / block * size);
    const uint8_t *src = f->data + t->offset;
    for (uint64_t r = 0; r < rows; ++r) {
        memcpy((uint8_t *)dst + r * len, src + (row0 + r) * row_bytes + skip, len);
    }
    return 0;
}
