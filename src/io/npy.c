/* .npy reading and writing (numpy's NEP 1 format).
 *
 *   "\x93NUMPY" major minor | header length (u16 in v1, u32 in v2/v3) | header | data
 *
 * The header is a Python dict literal, e.g. {'descr': '<f4', 'fortran_order': False,
 * 'shape': (3, 4), } padded with spaces and a newline. No Debian library parses that literal, so
 * a small recursive-descent reader for exactly this grammar lives here. */
#include "clffn_io.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define fail clffn__io_fail

typedef struct cursor {
    const char *p, *end;
} cursor;

static void skip_ws(cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) {
        ++c->p;
    }
}

static int eat(cursor *c, char ch) {
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        ++c->p;
        return 1;
    }
    return 0;
}

/* A quoted string ('…' or "…", no escapes: numpy never writes them in these keys) into buf. */
static int read_str(cursor *c, char *buf, size_t size) {
    skip_ws(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) { return -1; }
    const char q = *c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != q) {
        if (*c->p == '\\' || n + 1 >= size) { return -1; }
        buf[n++] = *c->p++;
    }
    if (c->p >= c->end) { return -1; }
    ++c->p;
    buf[n] = '\0';
    return 0;
}

static int read_word(cursor *c, const char *w) {
    skip_ws(c);
    const size_t n = strlen(w);
    if ((size_t)(c->end - c->p) >= n && memcmp(c->p, w, n) == 0) {
        c->p += n;
        return 1;
    }
    return 0;
}

static int read_uint(cursor *c, uint64_t *out) {
    skip_ws(c);
    if (c->p >= c->end || *c->p < '0' || *c->p > '9') { return -1; }
    uint64_t v = 0;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
        const uint64_t d = (uint64_t)(*c->p++ - '0');
        if (v > (UINT64_MAX - d) / 10) { return -2; }
        v = v * 10 + d;
    }
    if (c->p < c->end && (*c->p == 'L' || *c->p == 'l')) { ++c->p; } /* Python 2's long */
    *out = v;
    return 0;
}

typedef struct header {
    char descr[32];
    int fortran;
    size_t rank;
    uint64_t shape[CLFFN_IO_MAX_RANK];
    int have_descr, have_fortran, have_shape;
} header;

static int parse_shape(cursor *c, header *h, char *err) {
    if (!eat(c, '(')) { return fail(err, "header: shape is not a tuple"); }
    h->rank = 0;
    if (eat(c, ')')) { return 0; }
    for (;;) {
        uint64_t v;
        const int r = read_uint(c, &v);
        if (r == -2) { return fail(err, "header: a shape entry overflows 64 bits"); }
        if (r != 0) { return fail(err, "header: shape entries must be non-negative integers"); }
        if (h->rank == CLFFN_IO_MAX_RANK) {
            return fail(err, "header: more than %d dimensions", CLFFN_IO_MAX_RANK);
        }
        h->shape[h->rank++] = v;
        if (eat(c, ')')) { return 0; }
        if (!eat(c, ',')) { return fail(err, "header: malformed shape tuple"); }
        if (eat(c, ')')) { return 0; } /* (3,) */
    }
}

static int parse_header(const char *s, size_t n, header *h, char *err) {
    cursor c = {s, s + n};
    memset(h, 0, sizeof *h);
    if (!eat(&c, '{')) { return fail(err, "header is not a dict"); }
    while (!eat(&c, '}')) {
        char key[32];
        if (read_str(&c, key, sizeof key) != 0 || !eat(&c, ':')) {
            return fail(err, "header: malformed dict entry");
        }
        if (strcmp(key, "descr") == 0) {
            if (read_str(&c, h->descr, sizeof h->descr) != 0) {
                return fail(err, "header: descr is not a simple type string (structured arrays "
                                 "are not supported)");
            }
            h->have_descr = 1;
        } else if (strcmp(key, "fortran_order") == 0) {
            if (read_word(&c, "True")) {
                h->fortran = 1;
            } else if (read_word(&c, "False")) {
                h->fortran = 0;
            } else {
                return fail(err, "header: fortran_order is not True or False");
            }
            h->have_fortran = 1;
        } else if (strcmp(key, "shape") == 0) {
            if (parse_shape(&c, h, err) != 0) { return -1; }
            h->have_shape = 1;
        } else {
            return fail(err, "header: unexpected key '%s'", key);
        }
        if (!eat(&c, ',')) {
            if (!eat(&c, '}')) { return fail(err, "header: expected ',' or '}'"); }
            break;
        }
    }
    skip_ws(&c);
    if (c.p != c.end) { return fail(err, "header: bytes after the dict"); }
    if (!h->have_descr || !h->have_fortran || !h->have_shape) {
        return fail(err, "header lacks descr, fortran_order or shape");
    }
    return 0;
}

/* The element type a descr names, or a message saying why it is refused. */
static int descr_dtype(const char *descr, clffn_io_dtype *dt, char *err) {
    if (strcmp(descr, "<f4") == 0) {
        *dt = CLFFN_DT_F32;
    } else if (strcmp(descr, "<f8") == 0) {
        *dt = CLFFN_DT_F64;
    } else if (strcmp(descr, "<f2") == 0) {
        *dt = CLFFN_DT_F16;
    } else if (descr[0] == '|' && descr[1] == 'O') {
        return fail(err, "object arrays ('|O') are never loaded");
    } else if (descr[0] == '>') {
        return fail(err, "dtype '%s' is big-endian; save it as '<%s'", descr, descr + 1);
    } else {
        return fail(err,
                    "unsupported dtype '%s' (use float32 '<f4', float64 '<f8' or float16 '<f2')",
                    descr);
    }
    return 0;
}

/* numel elements of dt at src into float32 data, in C order. */
static void convert_data(const header *h, clffn_io_dtype dt, const uint8_t *src, uint64_t numel,
                         float *data) {
    if (!h->fortran || h->rank < 2) {
        clffn_io_to_f32(dt, src, (size_t)numel, data);
        return;
    }
    /* Fortran order: the first index varies fastest. Walk C order and gather. */
    const size_t es = clffn_io_dtype_size(dt);
    uint64_t idx[CLFFN_IO_MAX_RANK] = {0};
    for (uint64_t i = 0; i < numel; ++i) {
        uint64_t off = 0, stride = 1;
        for (size_t k = 0; k < h->rank; ++k) {
            off += idx[k] * stride;
            stride *= h->shape[k];
        }
        clffn_io_to_f32(dt, src + off * es, 1, data + i);
        for (size_t k = h->rank; k-- > 0;) { /* next C-order index */
            if (++idx[k] < h->shape[k]) { break; }
            idx[k] = 0;
        }
    }
}

int clffn_npy_parse(const uint8_t *buf, size_t len, clffn_npy *out, char *err) {
    if (!buf || len < 10 || memcmp(buf, "\x93NUMPY", 6) != 0) {
        return fail(err, "not an .npy file (no \\x93NUMPY magic)");
    }
    const unsigned major = buf[6];
    size_t hlen, start;
    if (major == 1) {
        hlen = (size_t)buf[8] | ((size_t)buf[9] << 8);
        start = 10;
    } else if (major == 2 || major == 3) {
        if (len < 12) { return fail(err, "truncated .npy header"); }
        hlen = (size_t)buf[8] | ((size_t)buf[9] << 8) | ((size_t)buf[10] << 16) |
               ((size_t)buf[11] << 24);
        start = 12;
    } else {
        return fail(err, "unsupported .npy format version %u.%u", major, buf[7]);
    }
    if (hlen > len - start) { return fail(err, "truncated .npy header"); }
    header h;
    if (parse_header((const char *)buf + start, hlen, &h, err) != 0) { return -1; }
    clffn_io_dtype dt = CLFFN_DT_F32;
    if (descr_dtype(h.descr, &dt, err) != 0) { return -1; }
    uint64_t numel = 1;
    for (size_t k = 0; k < h.rank; ++k) {
        if (h.shape[k] != 0 && numel > UINT64_MAX / h.shape[k]) {
            return fail(err, "shape's element count overflows");
        }
        numel *= h.shape[k];
    }
    const size_t es = clffn_io_dtype_size(dt), data_len = len - start - hlen;
    if (numel > (uint64_t)(SIZE_MAX / 4) || numel > UINT64_MAX / es) {
        return fail(err, "shape's byte size overflows");
    }
    if ((uint64_t)data_len < numel * es) {
        return fail(err, "truncated: shape needs %llu bytes of data, file has %zu",
                    (unsigned long long)(numel * es), data_len);
    }
    if ((uint64_t)data_len > numel * es) {
        return fail(err, "%llu bytes after the data", (unsigned long long)(data_len - numel * es));
    }
    float *data = malloc((size_t)(numel ? numel : 1) * sizeof *data);
    if (!data) { return fail(err, "out of memory for %llu elements", (unsigned long long)numel); }
    convert_data(&h, dt, buf + start + hlen, numel, data);
    /* written only now: a refused file leaves the caller's struct as it was */
    memset(out, 0, sizeof *out);
    out->rank = h.rank;
    memcpy(out->shape, h.shape, sizeof h.shape);
    out->numel = numel;
    out->data = data;
    return 0;
}

int clffn_npy_load(const char *path, clffn_npy *out, char *err) {
    FILE *f = fopen(path, "rb");
    if (!f) { return fail(err, "cannot open: %s", strerror(errno)); }
    uint8_t *buf = NULL;
    long n = -1;
    int rc = -1;
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fail(err, "cannot read: not a regular file");
    } else if (!(buf = malloc((size_t)n + 1))) {
        fail(err, "out of memory");
    } else if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fail(err, "cannot read: %s", strerror(errno));
    } else {
        rc = clffn_npy_parse(buf, (size_t)n, out, err);
    }
    free(buf);
    fclose(f);
    return rc;
}

void clffn_npy_free(clffn_npy *a) {
    if (!a) { return; }
    free(a->data);
    memset(a, 0, sizeof *a);
}

int clffn_npy_save(const char *path, const float *data, size_t rank, const uint64_t *shape,
                   char *err) {
    if (rank > CLFFN_IO_MAX_RANK) {
        return fail(err, "more than %d dimensions", CLFFN_IO_MAX_RANK);
    }
    char dict[64 + 24 * CLFFN_IO_MAX_RANK];
    size_t n =
        (size_t)snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (");
    uint64_t numel = 1;
    for (size_t k = 0; k < rank; ++k) {
        n += (size_t)snprintf(dict + n, sizeof dict - n, "%llu,%s", (unsigned long long)shape[k],
                              k + 1 < rank ? " " : "");
        numel *= shape[k];
    }
    if (rank > 1) { --n; } /* (3,) keeps its comma; (3, 4) does not */
    n += (size_t)snprintf(dict + n, sizeof dict - n, "), }");
    /* pad with spaces and a final newline so the data starts 64-byte aligned */
    uint8_t pre[12 + sizeof dict + 64];
    const size_t lead = 10, total = (lead + n + 1 + 63) / 64 * 64, hlen = total - lead;
    memcpy(pre, "\x93NUMPY\x01\x00", 8);
    pre[8] = (uint8_t)(hlen & 0xff);
    pre[9] = (uint8_t)(hlen >> 8);
    memcpy(pre + lead, dict, n);
    memset(pre + lead + n, ' ', hlen - n - 1);
    pre[total - 1] = '\n';
    const void *parts[2] = {pre, data};
    const size_t lens[2] = {total, (size_t)numel * sizeof(float)};
    return clffn_write_atomic(path, parts, lens, 2, err);
}
