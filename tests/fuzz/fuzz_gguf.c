/* libFuzzer harness for the GGUF parser: any bytes must parse or be refused with a message,
 * never crash; a parsed file's tensors lie inside the data section, each name finds its tensor,
 * its integer and string metadata read within their bounds, and a block of its first rows (in
 * whole blocks of its type) copies exactly those bytes. */
#include "clffn_io.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void read_some(const clffn_gguf_file *f, const clffn_gguf_tensor *t) {
    char err[CLFFN_IO_ERR];
    uint32_t block, bytes;
    if (clffn_gguf_type_block(t->type, &block, &bytes) != 0) { abort(); }
    const uint64_t rows = t->numel / (t->ne[0] ? t->ne[0] : 1);
    const uint64_t r = rows < 2 ? rows : 2, c = t->ne[0] < 4 * block ? t->ne[0] : 4 * block;
    size_t need;
    if (clffn_gguf_block_bytes(t, r, c, &need, err) != 0 || need > 1 << 16) { return; }
    void *dst = malloc(need ? need : 1);
    if (dst && clffn_gguf_read_block(f, t, rows - r, r, 0, c, dst, need, err) != 0) { abort(); }
    free(dst);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    clffn_gguf_file f;
    char err[CLFFN_IO_ERR];
    if (clffn_gguf_parse(data, size, &f, err) != 0) {
        if (memchr(err, '\0', sizeof err) == NULL || err[0] == '\0') { abort(); }
        return 0;
    }
    for (size_t i = 0; i < f.kv_count; ++i) {
        uint64_t v;
        char s[64];
        clffn_gguf_uint(&f, f.kvs[i].key, &v);
        clffn_gguf_string(&f, f.kvs[i].key, s, sizeof s);
        if (clffn_gguf_kv_find(&f, f.kvs[i].key) != &f.kvs[i]) { abort(); }
    }
    for (size_t i = 0; i < f.count; ++i) {
        const clffn_gguf_tensor *t = &f.tensors[i];
        if (t->offset > f.data_len || t->bytes > f.data_len - t->offset ||
            clffn_gguf_find(&f, t->name) != t || t->offset % f.alignment) {
            abort();
        }
        read_some(&f, t);
    }
    clffn_gguf_close(&f);
    return 0;
}
