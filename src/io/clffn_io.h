/* clffn_io: the checkpoint and array loaders behind clffn-run — safetensors and GGUF in, .npy in
 * and out.
 *
 * A small library of its own (libclffn_io.a), used by the tools and tested alone. Every function
 * that can fail returns 0 on success or -1 with one line of explanation in err (which never names
 * the file: the caller knows it and prefixes it). Nothing here aborts, and a damaged or hostile
 * file only ever gets a message: sizes are checked for overflow, offsets for bounds. */
#ifndef CLFFN_IO_H
#define CLFFN_IO_H

#include <stddef.h>
#include <stdint.h>

#define CLFFN_IO_ERR 256     /* size of an error buffer */
#define CLFFN_IO_MAX_RANK 16 /* more dimensions than any checkpoint uses: refused */

/* Formats one line into err (CLFFN_IO_ERR bytes) and returns -1: every loader error goes
 * through it. */
int clffn__io_fail(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Maps a regular file of at least min_len bytes read-only into *map (*len bytes); what names
 * the format in the message when the file is shorter ("a GGUF file"). */
int clffn__io_map(const char *path, size_t min_len, const char *what, void **map, size_t *len,
                  char *err);

/* ------------------------------------------------------------------------------------------ */
/* Element types */

typedef enum clffn_io_dtype {
    CLFFN_DT_F64,
    CLFFN_DT_F32,
    CLFFN_DT_F16,
    CLFFN_DT_BF16,
    CLFFN_DT_I64,
    CLFFN_DT_I32,
    CLFFN_DT_I16,
    CLFFN_DT_I8,
    CLFFN_DT_U64,
    CLFFN_DT_U32,
    CLFFN_DT_U16,
    CLFFN_DT_U8,
    CLFFN_DT_BOOL,
    CLFFN_DT_F8_E4M3,
    CLFFN_DT_F8_E5M2,
    CLFFN_DT_COUNT_
} clffn_io_dtype;

/* safetensors' name of a dtype ("F32"), and its size in bytes. */
const char *clffn_io_dtype_name(clffn_io_dtype dt);
size_t clffn_io_dtype_size(clffn_io_dtype dt);
/* 1 for the floating types clffn converts to float32: F64, F32, F16, BF16. */
int clffn_io_dtype_is_convertible(clffn_io_dtype dt);

/* IEEE binary16 and bfloat16 to float, exactly (subnormals, infinities and NaN included). */
float clffn_half_to_float(uint16_t h);
float clffn_bf16_to_float(uint16_t b);

/* Converts n little-endian elements of dt at src (any alignment) to float. dt must be
 * convertible. */
void clffn_io_to_f32(clffn_io_dtype dt, const void *src, size_t n, float *dst);

/* ------------------------------------------------------------------------------------------ */
/* safetensors */

typedef struct clffn_st_tensor {
    char *name;
    clffn_io_dtype dtype;
    size_t rank;
    uint64_t shape[CLFFN_IO_MAX_RANK];
    uint64_t numel;      /* product of shape (1 for rank 0) */
    uint64_t begin, end; /* byte range in the data section */
} clffn_st_tensor;

typedef struct clffn_st_file {
    const uint8_t *data; /* the data section (after the header) */
    uint64_t data_len;
    clffn_st_tensor *tensors; /* sorted by begin */
    size_t count;
    void *map; /* the mapping, when opened from a file */
    size_t map_len;
} clffn_st_file;

/* The largest header accepted, as the reference implementation caps it. */
#define CLFFN_ST_MAX_HEADER 100000000ull

/* Parses a safetensors image in memory (buf stays the caller's and must outlive out). Checks:
 * header length within the cap and the buffer; the header is UTF-8 JSON of one object;
 * `__metadata__` (an object of strings) allowed; each tensor has a known dtype, a shape of
 * non-negative integers whose product does not overflow, data_offsets [begin, end] with
 * end − begin = numel × dtype size, inside the data section; tensors contiguous from 0 without
 * overlap or gaps, the last ending at the end of the buffer; no duplicate names. No alignment
 * is assumed. Returns 0, or -1 with a message in err and *out as it was (nothing to close). */
int clffn_st_parse(const uint8_t *buf, size_t len, clffn_st_file *out, char *err);

/* Maps the file read-only and parses it: a multi-GB checkpoint is not read to use one layer. */
int clffn_st_open(const char *path, clffn_st_file *out, char *err);

/* The tensor of that name, or NULL. */
const clffn_st_tensor *clffn_st_find(const clffn_st_file *f, const char *name);

/* Copies a tensor into dst as float32, converting F64/F16/BF16; other dtypes are refused. */
int clffn_st_read_f32(const clffn_st_file *f, const clffn_st_tensor *t, float *dst, char *err);

/* Copies the block rows [row0, row0 + rows) × columns [col0, col0 + cols) of a matrix tensor
 * (rank 2; a rank-1 tensor is one row) into dst, row by row, as float32: one shard's slice of a
 * layer, read from the mapping so that only the pages under the block are touched. A block
 * outside the tensor or a dtype that is not convertible is refused. */
int clffn_st_read_f32_block(const clffn_st_file *f, const clffn_st_tensor *t, uint64_t row0,
                            uint64_t rows, uint64_t col0, uint64_t cols, float *dst, char *err);

/* The same block as stored (any dtype), clffn_io_dtype_size bytes a value, row by row. */
int clffn_st_read_block(const clffn_st_file *f, const clffn_st_tensor *t, uint64_t row0,
                        uint64_t rows, uint64_t col0, uint64_t cols, void *dst, char *err);

void clffn_st_close(clffn_st_file *f);

/* A float32 tensor to write. */
typedef struct clffn_st_out {
    const char *name;
    size_t rank;
    const uint64_t *shape;
    const float *data;
} clffn_st_out;

/* Writes F32 tensors as a safetensors file (header padded to 8 bytes with spaces). The file is
 * written under a temporary name and renamed, so a failure leaves no partial file. */
int clffn_st_write(const char *path, const clffn_st_out *tensors, size_t n, char *err);

/* ------------------------------------------------------------------------------------------ */
/* GGUF (llama.cpp's model files), versions 2 and 3 */

/* GGUF's metadata value types */
enum {
    CLFFN_GGUF_UINT8 = 0,
    CLFFN_GGUF_INT8,
    CLFFN_GGUF_UINT16,
    CLFFN_GGUF_INT16,
    CLFFN_GGUF_UINT32,
    CLFFN_GGUF_INT32,
    CLFFN_GGUF_FLOAT32,
    CLFFN_GGUF_BOOL,
    CLFFN_GGUF_STRING,
    CLFFN_GGUF_ARRAY,
    CLFFN_GGUF_UINT64,
    CLFFN_GGUF_INT64,
    CLFFN_GGUF_FLOAT64
};

/* ggml's tensor types clffn keeps on a device (the others are named in messages) */
enum {
    CLFFN_GGML_F32 = 0,
    CLFFN_GGML_F16 = 1,
    CLFFN_GGML_Q4_0 = 2,
    CLFFN_GGML_Q8_0 = 8,
    CLFFN_GGML_BF16 = 30
};

#define CLFFN_GGUF_MAX_DIMS 4

typedef struct clffn_gguf_tensor {
    char *name;
    uint32_t type; /* ggml's number */
    size_t rank;
    uint64_t ne[CLFFN_GGUF_MAX_DIMS]; /* GGUF's order: ne[0] runs fastest (a row), 1 past rank */
    uint64_t numel;
    uint64_t offset, bytes; /* in the data section */
} clffn_gguf_tensor;

typedef struct clffn_gguf_kv {
    char *key;
    uint32_t type;        /* CLFFN_GGUF_* */
    uint32_t elem_type;   /* an array's */
    uint64_t count;       /* an array's elements */
    const uint8_t *value; /* the value's bytes in the image (a string: its u64 length first) */
    uint64_t value_len;
} clffn_gguf_kv;

typedef struct clffn_gguf_file {
    uint32_t version;
    uint64_t alignment; /* general.alignment, 32 without it */
    clffn_gguf_kv *kvs;
    size_t kv_count;
    clffn_gguf_tensor *tensors;
    size_t count;
    const uint8_t *data; /* the data section */
    uint64_t data_len;
    void *map; /* the mapping, when opened from a file */
    size_t map_len;
} clffn_gguf_file;

/* Whether an image starts with GGUF's magic. */
int clffn_gguf_is(const uint8_t *buf, size_t len);

/* ggml's name of a type ("Q4_K"), or NULL for a number no ggml defines; its values and bytes
 * per block (0, or -1 for an unknown type). */
const char *clffn_gguf_type_name(uint32_t type);
int clffn_gguf_type_block(uint32_t type, uint32_t *block, uint32_t *bytes);

/* Parses a GGUF image in memory (buf stays the caller's and must outlive out). Checks: magic,
 * version 2 or 3, little-endian; every string, array and count within the bytes that remain;
 * keys and tensor names unique, without NUL; arrays of one known type (no arrays of arrays);
 * 1 to 4 dimensions whose product does not overflow; a known ggml type whose blocks tile each
 * row; general.alignment a power of two; each tensor aligned, inside the data section, and
 * overlapping no other. Returns 0, or -1 with a message in err and *out as it was. */
int clffn_gguf_parse(const uint8_t *buf, size_t len, clffn_gguf_file *out, char *err);

/* Maps the file read-only and parses it: a model's tensors are read from the mapping, so a
 * tensor-parallel rank touches only the pages of its slice. */
int clffn_gguf_open(const char *path, clffn_gguf_file *out, char *err);

void clffn_gguf_close(clffn_gguf_file *f);

const clffn_gguf_tensor *clffn_gguf_find(const clffn_gguf_file *f, const char *name);
const clffn_gguf_kv *clffn_gguf_kv_find(const clffn_gguf_file *f, const char *key);

/* A non-negative integer value of any of GGUF's integer types: 0, or -1 (absent, another type,
 * negative). */
int clffn_gguf_uint(const clffn_gguf_file *f, const char *key, uint64_t *out);

/* A string value, NUL-terminated, into buf: 0, or -1 (absent, another type, too long). */
int clffn_gguf_string(const clffn_gguf_file *f, const char *key, char *buf, size_t size);

/* The bytes of `rows` rows × `cols` values of a tensor as stored (cols whole blocks). */
int clffn_gguf_block_bytes(const clffn_gguf_tensor *t, uint64_t rows, uint64_t cols, size_t *bytes,
                           char *err);

/* Copies rows [row0, row0 + rows) of the tensor seen as rows of ne[0] values (the higher
 * dimensions flattened into rows), and of each the values [col0, col0 + cols), as stored, into
 * dst: one shard's slice of a layer. For the block types col0 and cols must be whole blocks
 * (a slice that would cut one is refused). dst_size must hold clffn_gguf_block_bytes. */
int clffn_gguf_read_block(const clffn_gguf_file *f, const clffn_gguf_tensor *t, uint64_t row0,
                          uint64_t rows, uint64_t col0, uint64_t cols, void *dst, size_t dst_size,
                          char *err);

/* ------------------------------------------------------------------------------------------ */
/* .npy */

typedef struct clffn_npy {
    size_t rank;
    uint64_t shape[CLFFN_IO_MAX_RANK];
    uint64_t numel;
    float *data; /* C order, converted to float32; malloc'd */
} clffn_npy;

/* Parses an .npy image: format versions 1, 2 and 3; descr '<f4', '<f8' or '<f2' (others are
 * refused by name, '|O' always); fortran_order arrays are transposed to C order; shape overflow
 * and truncated or trailing data are refused. Returns 0, or -1 with a message in err and *out
 * as it was (nothing to free). */
int clffn_npy_parse(const uint8_t *buf, size_t len, clffn_npy *out, char *err);
int clffn_npy_load(const char *path, clffn_npy *out, char *err);
void clffn_npy_free(clffn_npy *a);

/* Writes a float32 C-order array (a version 1 header: rank ≤ 16 always fits), through a
 * temporary file renamed into place. */
int clffn_npy_save(const char *path, const float *data, size_t rank, const uint64_t *shape,
                   char *err);

/* Writes the bytes to path via a temporary file in the same folder and a rename. */
int clffn_write_atomic(const char *path, const void *const *parts, const size_t *lens,
                       size_t nparts, char *err);

#endif
