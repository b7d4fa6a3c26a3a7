/* A small GGUF writer for the tests: an image of metadata and tensors, laid out as llama.cpp
 * lays them out (tensor data aligned, the data section after the aligned end of the infos). Its
 * own code, not the reader's, so that the reader is checked against an independent encoder. */
#ifndef CLFFN_TEST_GGUF_WRITER_H
#define CLFFN_TEST_GGUF_WRITER_H

#include <stddef.h>
#include <stdint.h>

/* One metadata entry: an unsigned integer of GGUF value type `type` (0, 2, 4, 10), a string
 * (type 8), or an array of u32 (type 9). */
typedef struct gw_kv {
    const char *key;
    uint32_t type;
    uint64_t u;
    const char *str;
} gw_kv;

/* One tensor: ggml type, 1 to 4 dims (ne[0] first), its bytes as stored; the offset written
 * in its info is the one the layout gives plus `shift` (nonzero only to damage a file). */
typedef struct gw_tensor {
    const char *name;
    uint32_t type;
    uint32_t dims;
    uint64_t ne[4];
    const void *data;
    size_t bytes;
    int64_t shift;
} gw_tensor;

/* The image (malloc'd, *len bytes): version, alignment (0: none written, 32 used). */
uint8_t *gw_image(uint32_t version, uint32_t alignment, const gw_kv *kvs, size_t nkv,
                  const gw_tensor *ts, size_t nt, size_t *len);

/* Writes an image to a file; 0 or -1. */
int gw_write(const char *path, const uint8_t *img, size_t len);

#endif
