/* safetensors reading and writing.
 *
 *   [u64 little-endian N][N bytes of UTF-8 JSON header][data section]
 *
 * The header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]} with offsets
 * relative to the data section, plus an optional "__metadata__" object of strings. The JSON is
 * parsed by cJSON; everything the format promises is then checked here, since a checkpoint may
 * come from anywhere. */
#include "clffn_io.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define fail clffn__io_fail

/* Strict UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF. */
static size_t utf8_invalid_at(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        const uint8_t c = s[i];
        size_t len;
        uint32_t cp;
        if (c < 0x80) {
            ++i;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            len = 2, cp = c & 0x1f;
        } else if ((c & 0xf0) == 0xe0) {
            len = 3, cp = c & 0x0f;
        } else if ((c & 0xf8) == 0xf0) {
            len = 4, cp = c & 0x07;
        } else {
            return i;
        }
        if (n - i < len) { return i; }
        for (size_t k = 1; k < len; ++k) {
            if ((s[i + k] & 0xc0) != 0x80) { return i; }
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) { return i; }
        i += len;
    }
    return n;
}

static int parse_dtype(const char *s, clffn_io_dtype *out) {
    for (int d = 0; d < CLFFN_DT_COUNT_; ++d) {
        if (strcmp(s, clffn_io_dtype_name((clffn_io_dtype)d)) == 0) {
            *out = (clffn_io_dtype)d;
            return 0;
        }
    }
    return -1;
}

/* A JSON number that is a non-negative integer exactly representable in a double. */
static int json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) { return -1; }
    const double d = v->valuedouble;
    if (!(d >= 0.0) || d > 9007199254740992.0 || d != (double)(uint64_t)d) { return -1; }
    *out = (uint64_t)d;
    return 0;
}

static int by_range(const void *a, const void *b) {
    const clffn_st_tensor *x = a, *y = b;
    if (x->begin != y->begin) { return x->begin < y->begin ? -1 : 1; }
    return x->end < y->end ? -1 : x->end > y->end;
}

static int by_name(const void *a, const void *b) {
    return strcmp((*(const clffn_st_tensor *const *)a)->name,
                  (*(const clffn_st_tensor *const *)b)->name);
}

static void free_tensors(clffn_st_tensor *t, size_t n) {
    for (size_t i = 0; i < n; ++i) { free(t[i].name); }
    free(t);
}

static int parse_tensor(const cJSON *item, clffn_st_tensor *t, char *err) {
    const char *name = item->string;
    if (!cJSON_IsObject(item)) { return fail(err, "tensor '%s' is not a JSON object", name); }
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsString(dtype) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs)) {
        return fail(err, "tensor '%s' lacks a dtype string, a shape array or data_offsets", name);
    }
    if (parse_dtype(dtype->valuestring, &t->dtype) != 0) {
        return fail(err, "tensor '%s' has unknown dtype '%.32s'", name, dtype->valuestring);
    }
    const int rank = cJSON_GetArraySize(shape);
    if (rank > CLFFN_IO_MAX_RANK) {
        return fail(err, "tensor '%s' has %d dimensions (at most %d)", name, rank,
                    CLFFN_IO_MAX_RANK);
    }
    t->rank = (size_t)rank;
    t->numel = 1;
    int k = 0;
    const cJSON *dim;
    cJSON_ArrayForEach(dim, shape) {
        uint64_t v;
        if (json_uint(dim, &v) != 0) {
            return fail(err, "tensor '%s': shape entry %d is not a non-negative integer", name, k);
        }
        t->shape[k++] = v;
        if (v != 0 && t->numel > UINT64_MAX / v) {
            return fail(err, "tensor '%s': shape's element count overflows", name);
        }
        t->numel *= v;
    }
    if (cJSON_GetArraySize(offs) != 2 || json_uint(cJSON_GetArrayItem(offs, 0), &t->begin) != 0 ||
        json_uint(cJSON_GetArrayItem(offs, 1), &t->end) != 0) {
        return fail(err, "tensor '%s': data_offsets must be two non-negative integers", name);
    }
    if (t->end < t->begin) {
        return fail(err, "tensor '%s': data_offsets [%llu, %llu] end before they begin", name,
                    (unsigned long long)t->begin, (unsigned long long)t->end);
    }
    const uint64_t es = clffn_io_dtype_size(t->dtype);
    if (t->numel > UINT64_MAX / es || t->numel * es != t->end - t->begin) {
        return fail(err,
                    "tensor '%s': data_offsets [%llu, %llu] hold %llu bytes, but the shape "
                    "needs %llu × %s",
                    name, (unsigned long long)t->begin, (unsigned long long)t->end,
                    (unsigned long long)(t->end - t->begin), (unsigned long long)t->numel,
                    clffn_io_dtype_name(t->dtype));
    }
    return 0;
}

static int check_metadata(const cJSON *meta, char *err) {
    if (!cJSON_IsObject(meta)) { return fail(err, "__metadata__ is not an object"); }
    const cJSON *v;
    cJSON_ArrayForEach(v, meta) {
        if (!cJSON_IsString(v)) {
            return fail(err, "__metadata__ value '%s' is not a string", v->string);
        }
    }
    return 0;
}

/* The header's n bytes as a JSON object (UTF-8, padding after it allowed), into *root. */
static int parse_header(const uint8_t *hdr, size_t n, cJSON **root, char *err) {
    if (n == 0 || hdr[0] != '{') { return fail(err, "header does not start with '{'"); }
    const size_t bad = utf8_invalid_at(hdr, n);
    if (bad != n) { return fail(err, "header is not valid UTF-8 (byte %zu)", bad); }
    const char *end = NULL;
    cJSON *r = cJSON_ParseWithLengthOpts((const char *)hdr, n, &end, 0);
    if (!r) {
        const char *at = cJSON_GetErrorPtr();
        /* cJSON gives NULL for no memory too, and cannot say which */
        return fail(err,
                    "header is not valid JSON (near byte %ld), or there was no memory to parse it",
                    at ? (long)(at - (const char *)hdr) : -1L);
    }
    for (const char *p = end; p < (const char *)hdr + n; ++p) { /* padding may follow */
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(r);
            return fail(err, "header has bytes after its JSON object");
        }
    }
    if (!cJSON_IsObject(r)) {
        cJSON_Delete(r);
        return fail(err, "header is not a JSON object");
    }
    *root = r;
    return 0;
}

/* Every tensor name once. */
static int check_names(const clffn_st_tensor *ts, size_t count, char *err) {
    if (count == 0) { return 0; }
    const clffn_st_tensor **names = malloc(count * sizeof *names);
    if (!names) { return fail(err, "out of memory"); }
    for (size_t i = 0; i < count; ++i) { names[i] = &ts[i]; }
    qsort(names, count, sizeof *names, by_name);
    int rc = 0;
    for (size_t i = 1; i < count && rc == 0; ++i) {
        if (strcmp(names[i - 1]->name, names[i]->name) == 0) {
            rc = fail(err, "tensor '%s' appears twice", names[i]->name);
        }
    }
    free(names);
    return rc;
}

/* The data section is exactly the tensors, back to back (ts is sorted by range here). */
static int check_layout(clffn_st_tensor *ts, size_t count, uint64_t data_len, char *err) {
    qsort(ts, count, sizeof *ts, by_range);
    uint64_t expect = 0;
    for (size_t i = 0; i < count; ++i) {
        if (ts[i].begin != expect) {
            return fail(err, "tensor '%s' starts at byte %llu, not %llu: %s", ts[i].name,
                        (unsigned long long)ts[i].begin, (unsigned long long)expect,
                        ts[i].begin < expect ? "tensors overlap" : "a gap between tensors");
        }
        if (ts[i].end > data_len) {
            return fail(err, "tensor '%s' ends at byte %llu, past the data (%llu bytes)",
                        ts[i].name, (unsigned long long)ts[i].end, (unsigned long long)data_len);
        }
        expect = ts[i].end;
    }
    if (expect != data_len) {
        return fail(err, "%llu trailing bytes after the last tensor",
                    (unsigned long long)(data_len - expect));
    }
    return 0;
}

int clffn_st_parse(const uint8_t *buf, size_t len, clffn_st_file *out, char *err) {
    if (!buf || len < 8) { return fail(err, "too short for a safetensors file (%zu bytes)", len); }
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) { n = (n << 8) | buf[i]; }
    if (n > CLFFN_ST_MAX_HEADER) {
        return fail(err, "header length %llu exceeds the %llu-byte limit", (unsigned long long)n,
                    CLFFN_ST_MAX_HEADER);
    }
    if (n > len - 8) {
        return fail(err, "header length %llu runs past the end of the file (%zu bytes)",
                    (unsigned long long)n, len);
    }
    const uint8_t *hdr = buf + 8;
    cJSON *root = NULL;
    if (parse_header(hdr, (size_t)n, &root, err) != 0) { return -1; }
    const size_t total = (size_t)cJSON_GetArraySize(root);
    clffn_st_tensor *ts = calloc(total ? total : 1, sizeof *ts);
    if (!ts) {
        cJSON_Delete(root);
        return fail(err, "out of memory");
    }
    size_t count = 0;
    int rc = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, root) {
        if (strcmp(item->string, "__metadata__") == 0) {
            if ((rc = check_metadata(item, err)) != 0) { break; }
            continue;
        }
        clffn_st_tensor *t = &ts[count];
        if ((rc = parse_tensor(item, t, err)) != 0) { break; }
        if (!(t->name = strdup(item->string))) {
            rc = fail(err, "out of memory");
            break;
        }
        ++count;
    }
    cJSON_Delete(root);
    const uint64_t data_len = (uint64_t)(len - 8 - n);
    if (rc == 0) { rc = check_names(ts, count, err); }
    if (rc == 0) { rc = check_layout(ts, count, data_len, err); }
    if (rc != 0) {
        free_tensors(ts, count);
        return -1;
    }
    /* written only now: a refused file leaves the caller's struct as it was */
    memset(out, 0, sizeof *out);
    out->data = hdr + n;
    out->data_len = data_len;
    out->tensors = ts;
    out->count = count;
    return 0;
}

int clffn_st_open(const char *path, clffn_st_file *out, char *err) {
    void *map;
    size_t len;
    if (clffn__io_map(path, 8, "a safetensors file", &map, &len, err) != 0) { return -1; }
    clffn_st_file f;
    if (clffn_st_parse(map, len, &f, err) != 0) {
        munmap(map, len);
        return -1;
    }
    *out = f;
    out->map = map;
    out->map_len = len;
    return 0;
}

const clffn_st_tensor *clffn_st_find(const clffn_st_file *f, const char *name) {
    for (size_t i = 0; f && i < f->count; ++i) {
        if (strcmp(f->tensors[i].name, name) == 0) { return &f->tensors[i]; }
    }
    return NULL;
}

int clffn_st_read_f32(const clffn_st_file *f, const clffn_st_tensor *t, float *dst, char *err) {
    if (!clffn_io_dtype_is_convertible(t->dtype)) {
        return fail(err, "tensor '%s' is %s; only F32, F16, BF16 and F64 can be used", t->name,
                    clffn_io_dtype_name(t->dtype));
    }
    clffn_io_to_f32(t->dtype, f->data + t->begin, (size_t)t->numel, dst);
    return 0;
}

/* A block of rows x cols at (row0, col0) of a vector (one row) or a matrix, inside it. */
static int check_block(const clffn_st_tensor *t, uint64_t row0, uint64_t rows, uint64_t col0,
                       uint64_t cols, char *err) {
    if (t->rank != 1 && t->rank != 2) {
        return fail(err, "tensor '%s' has rank %zu; a block needs a vector or a matrix", t->name,
                    (size_t)t->rank);
    }
    const uint64_t R = t->rank == 2 ? t->shape[0] : 1, C = t->shape[t->rank - 1];
    if (row0 > R || rows > R - row0 || col0 > C || cols > C - col0) {
        return fail(
            err, "tensor '%s': block of %llu x %llu at (%llu, %llu) is outside its %llu x %llu",
            t->name, (unsigned long long)rows, (unsigned long long)cols, (unsigned long long)row0,
            (unsigned long long)col0, (unsigned long long)R, (unsigned long long)C);
    }
    return 0;
}

int clffn_st_read_f32_block(const clffn_st_file *f, const clffn_st_tensor *t, uint64_t row0,
                            uint64_t rows, uint64_t col0, uint64_t cols, float *dst, char *err) {
    if (!clffn_io_dtype_is_convertible(t->dtype)) {
        return fail(err, "tensor '%s' is %s; only F32, F16, BF16 and F64 can be used", t->name,
                    clffn_io_dtype_name(t->dtype));
    }
    if (check_block(t, row0, rows, col0, cols, err) != 0) { return -1; }
    const uint64_t C = t->shape[t->rank - 1];
    const size_t es = clffn_io_dtype_size(t->dtype);
    for (uint64_t r = 0; r < rows; ++r) { /* in bounds: the tensor's extent was checked on open */
        const uint8_t *src = f->data + t->begin + ((row0 + r) * C + col0) * es;
        clffn_io_to_f32(t->dtype, src, (size_t)cols, dst + r * cols);
    }
    return 0;
}

int clffn_st_read_block(const clffn_st_file *f, const clffn_st_tensor *t, uint64_t row0,
                        uint64_t rows, uint64_t col0, uint64_t cols, void *dst, char *err) {
    if (check_block(t, row0, rows, col0, cols, err) != 0) { return -1; }
    const uint64_t C = t->shape[t->rank - 1];
    const size_t es = clffn_io_dtype_size(t->dtype);
    for (uint64_t r = 0; r < rows; ++r) { /* in bounds: the tensor's extent was checked on open */
        memcpy((uint8_t *)dst + r * cols * es, f->data + t->begin + ((row0 + r) * C + col0) * es,
               (size_t)(cols * es));
    }
    return 0;
}

void clffn_st_close(clffn_st_file *f) {
    if (!f) { return; }
    free_tensors(f->tensors, f->count);
    if (f->map) { munmap(f->map, f->map_len); }
    memset(f, 0, sizeof *f);
}

/* Appends a number to a JSON array; 0 when out of memory (a header missing it would be a
 * corrupt file, so the caller must stop). */
static int add_number(cJSON *array, double v) {
    cJSON *num = cJSON_CreateNumber(v);
    if (!num) { return 0; }
    if (!cJSON_AddItemToArray(array, num)) {
        cJSON_Delete(num);
        return 0;
    }
    return 1;
}

int clffn_st_write(const char *path, const clffn_st_out *ts, size_t n, char *err) {
    cJSON *root = cJSON_CreateObject();
    if (!root) { return fail(err, "out of memory"); }
    uint64_t offset = 0;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; ++i) {
        cJSON *t = cJSON_AddObjectToObject(root, ts[i].name);
        cJSON *shape = t ? cJSON_AddArrayToObject(t, "shape") : NULL;
        cJSON *offs = t ? cJSON_AddArrayToObject(t, "data_offsets") : NULL;
        if (!t || !shape || !offs || !cJSON_AddStringToObject(t, "dtype", "F32")) {
            rc = fail(err, "out of memory");
            break;
        }
        uint64_t numel = 1;
        int ok = 1;
        for (size_t k = 0; k < ts[i].rank; ++k) {
            numel *= ts[i].shape[k];
            ok = ok && add_number(shape, (double)ts[i].shape[k]);
        }
        ok = ok && add_number(offs, (double)offset);
        offset += numel * sizeof(float);
        ok = ok && add_number(offs, (double)offset);
        if (!ok) { rc = fail(err, "out of memory"); }
    }
    char *json = rc == 0 ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (rc != 0) { return -1; }
    if (!json) { return fail(err, "out of memory"); }
    /* pad the header with spaces so the data starts 8-byte aligned, as the reference writer does */
    const size_t jlen = strlen(json), hlen = (jlen + 7) / 8 * 8;
    char *hdr = malloc(8 + hlen);
    if (!hdr) {
        free(json);
        return fail(err, "out of memory");
    }
    for (int i = 0; i < 8; ++i) { hdr[i] = (char)(((uint64_t)hlen >> (8 * i)) & 0xff); }
    memcpy(hdr + 8, json, jlen);
    memset(hdr + 8 + jlen, ' ', hlen - jlen);
    free(json);
    const void **parts = malloc((n + 1) * sizeof *parts);
    size_t *lens = malloc((n + 1) * sizeof *lens);
    if (!parts || !lens) {
        free(hdr), free(parts), free(lens);
        return fail(err, "out of memory");
    }
    parts[0] = hdr;
    lens[0] = 8 + hlen;
    for (size_t i = 0; i < n; ++i) {
        uint64_t numel = 1;
        for (size_t k = 0; k < ts[i].rank; ++k) { numel *= ts[i].shape[k]; }
        parts[i + 1] = ts[i].data;
        lens[i + 1] = (size_t)numel * sizeof(float); /* little-endian hosts only, like clffn */
    }
    rc = clffn_write_atomic(path, (const void *const *)parts, lens, n + 1, err);
    free(hdr), free(parts), free(lens);
    return rc;
}
