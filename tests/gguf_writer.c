/* The tests' GGUF writer (gguf_writer.h). */
#include "gguf_writer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct out {
    uint8_t *buf;
    size_t len, cap;
} out;

static void put(out *o, const void *p, size_t n) {
    if (o->len + n > o->cap) {
        o->cap = (o->len + n) * 2 + 64;
        o->buf = realloc(o->buf, o->cap);
        if (!o->buf) { abort(); }
    }
    if (n) { memcpy(o->buf + o->len, p, n); }
    o->len += n;
}

static void put_le(out *o, uint64_t v, int bytes) {
    uint8_t b[8];
    for (int i = 0; i < bytes; ++i) { b[i] = (uint8_t)(v >> (8 * i)); }
    put(o, b, (size_t)bytes);
}

static void put_str(out *o, const char *s) {
    put_le(o, strlen(s), 8);
    put(o, s, strlen(s));
}

static void put_kv(out *o, const gw_kv *kv) {
    static const int width[11] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8};
    put_str(o, kv->key);
    put_le(o, kv->type, 4);
    if (kv->type == 8) {
        put_str(o, kv->str);
    } else if (kv->type == 9) { /* u32 array of kv->u elements 0, 1, 2, ... */
        put_le(o, 4, 4);
        put_le(o, kv->u, 8);
        for (uint64_t i = 0; i < kv->u; ++i) { put_le(o, i, 4); }
    } else {
        put_le(o, kv->u, width[kv->type]);
    }
}

static size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

uint8_t *gw_image(uint32_t version, uint32_t alignment, const gw_kv *kvs, size_t nkv,
                  const gw_tensor *ts, size_t nt, size_t *len) {
    const size_t a = alignment ? alignment : 32;
    out o = {NULL, 0, 0};
    put(&o, "GGUF", 4);
    put_le(&o, version, 4);
    put_le(&o, nt, 8);
    put_le(&o, nkv + (alignment ? 1 : 0), 8);
    for (size_t i = 0; i < nkv; ++i) { put_kv(&o, &kvs[i]); }
    if (alignment) {
        const gw_kv al = {"general.alignment", 4, alignment, NULL};
        put_kv(&o, &al);
    }
    size_t off = 0;
    for (size_t i = 0; i < nt; ++i) {
        put_str(&o, ts[i].name);
        put_le(&o, ts[i].dims, 4);
        for (uint32_t d = 0; d < ts[i].dims; ++d) { put_le(&o, ts[i].ne[d], 8); }
        put_le(&o, ts[i].type, 4);
        put_le(&o, off + (uint64_t)ts[i].shift, 8);
        off = align_up(off + ts[i].bytes, a);
    }
    const size_t start = align_up(o.len, a);
    while (o.len < start) { put(&o, "", 1); }
    for (size_t i = 0; i < nt; ++i) {
        put(&o, ts[i].data, ts[i].bytes);
        while ((o.len - start) % a) { put(&o, "", 1); }
    }
    *len = o.len;
    return o.buf;
}

int gw_write(const char *path, const uint8_t *img, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) { return -1; }
    const int ok = fwrite(img, 1, len, f) == len;
    return fclose(f) == 0 && ok ? 0 : -1;
}
