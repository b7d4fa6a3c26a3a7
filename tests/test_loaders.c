/* The safetensors and .npy loaders on files the tests write: valid ones value for value, and
 * every malformed case each gets its refusal (never a crash). */
#include "clffn_io.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------ */
/* Building images in memory */

typedef struct image {
    uint8_t *buf;
    size_t len;
} image;

/* A safetensors image: the 8-byte length, the header text as given, then `data`. */
static image st_image(const char *header, const void *data, size_t data_len) {
    const size_t h = strlen(header);
    image im = {malloc(8 + h + data_len + 1), 8 + h + data_len};
    cr_assert(im.buf);
    for (int i = 0; i < 8; ++i) { im.buf[i] = (uint8_t)(((uint64_t)h >> (8 * i)) & 0xff); }
    memcpy(im.buf + 8, header, h);
    if (data_len) { memcpy(im.buf + 8 + h, data, data_len); }
    return im;
}

/* Parses an image that must be refused, with a message containing `needle`. */
static void st_refused(const char *header, size_t data_len, const char *needle) {
    uint8_t *zeros = calloc(data_len + 1, 1);
    image im = st_image(header, zeros, data_len);
    clffn_st_file f, before;
    memset(&f, 0x5A, sizeof f);
    before = f;
    char err[CLFFN_IO_ERR] = "";
    cr_assert_eq(clffn_st_parse(im.buf, im.len, &f, err), -1, "accepted: %s", header);
    cr_assert(strstr(err, needle) != NULL, "for %s: message '%s' lacks '%s'", header, err, needle);
    cr_assert(memcmp(&f, &before, sizeof f) == 0, "for %s: the caller's struct was written",
              header);
    free(im.buf);
    free(zeros);
}

/* An .npy image with the given version and header dict, padded as numpy does. */
static image npy_image(int major, const char *dict, const void *data, size_t data_len) {
    const size_t lead = major == 1 ? 10 : 12, d = strlen(dict);
    const size_t total = (lead + d + 1 + 63) / 64 * 64, hlen = total - lead;
    image im = {malloc(total + data_len + 1), total + data_len};
    cr_assert(im.buf);
    memcpy(im.buf, "\x93NUMPY", 6);
    im.buf[6] = (uint8_t)major;
    im.buf[7] = 0;
    for (size_t i = 0; i < lead - 8; ++i) { im.buf[8 + i] = (uint8_t)((hlen >> (8 * i)) & 0xff); }
    memcpy(im.buf + lead, dict, d);
    memset(im.buf + lead + d, ' ', hlen - d - 1);
    im.buf[total - 1] = '\n';
    if (data_len) { memcpy(im.buf + total, data, data_len); }
    return im;
}

static void npy_refused(image im, const char *needle) {
    clffn_npy a, before;
    memset(&a, 0x5A, sizeof a);
    before = a;
    char err[CLFFN_IO_ERR] = "";
    cr_assert_eq(clffn_npy_parse(im.buf, im.len, &a, err), -1, "accepted");
    cr_assert(strstr(err, needle) != NULL, "message '%s' lacks '%s'", err, needle);
    cr_assert(memcmp(&a, &before, sizeof a) == 0, "the caller's struct was written");
    free(im.buf);
}

/* ------------------------------------------------------------------------------------------ */
/* safetensors: valid files */

Test(safetensors, valid_with_metadata_and_every_float_type) {
    /* a: F32 [2,2] at 0..16; b: F16 [4] at 16..24; c: BF16 [2] 24..28; d: F64 [1] 28..36;
     * e: I32 [] */
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                      "\"b\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[16,24]},"
                      "\"c\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[24,28]},"
                      "\"d\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[28,36]},"
                      "\"e\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[36,40]}}   ";
    uint8_t data[40];
    const float a[4] = {1.5f, -2.0f, 3.25f, 0.0f};
    memcpy(data, a, 16);
    const uint16_t b[4] = {0x3c00, 0xc000, 0x0001, 0x7c00}; /* 1, -2, 2^-24, inf */
    memcpy(data + 16, b, 8);
    const uint16_t c[2] = {0x3f80, 0xc0a0}; /* 1, -5 */
    memcpy(data + 24, c, 4);
    const double d = 0.1;
    memcpy(data + 28, &d, 8); /* unaligned on purpose: no alignment is assumed */
    const int32_t e = 7;
    memcpy(data + 36, &e, 4);
    image im = st_image(hdr, data, sizeof data);
    clffn_st_file f;
    char err[CLFFN_IO_ERR];
    cr_assert_eq(clffn_st_parse(im.buf, im.len, &f, err), 0, "%s", err);
    cr_assert_eq(f.count, 5);
    float out[4];
    const clffn_st_tensor *t = clffn_st_find(&f, "a");
    cr_assert(t && t->rank == 2 && t->numel == 4);
    cr_assert_eq(clffn_st_read_f32(&f, t, out, err), 0);
    cr_assert(memcmp(out, a, sizeof a) == 0);
    cr_assert_eq(clffn_st_read_f32(&f, clffn_st_find(&f, "b"), out, err), 0);
    cr_assert(out[0] == 1.0f && out[1] == -2.0f && out[2] == ldexpf(1.0f, -24) && isinf(out[3]));
    cr_assert_eq(clffn_st_read_f32(&f, clffn_st_find(&f, "c"), out, err), 0);
    cr_assert(out[0] == 1.0f && out[1] == -5.0f);
    cr_assert_eq(clffn_st_read_f32(&f, clffn_st_find(&f, "d"), out, err), 0);
    cr_assert(out[0] == 0.1f);
    t = clffn_st_find(&f, "e");
    cr_assert(t && t->rank == 0 && t->numel == 1);
    cr_assert_eq(clffn_st_read_f32(&f, t, out, err), -1);
    cr_assert(strstr(err, "I32") != NULL, "%s", err);
    cr_assert_null(clffn_st_find(&f, "__metadata__"));
    clffn_st_close(&f);
    free(im.buf);
}

Test(safetensors, empty_header_is_valid) {
    image im = st_image("{}", NULL, 0);
    clffn_st_file f;
    char err[CLFFN_IO_ERR];
    cr_assert_eq(clffn_st_parse(im.buf, im.len, &f, err), 0, "%s", err);
    cr_assert_eq(f.count, 0);
    clffn_st_close(&f);
    free(im.buf);
}

Test(safetensors, half_conversions) {
    cr_assert(clffn_half_to_float(0x0000) == 0.0f && !signbit(clffn_half_to_float(0x0000)));
    cr_assert(clffn_half_to_float(0x8000) == 0.0f && signbit(clffn_half_to_float(0x8000)));
    cr_assert(clffn_half_to_float(0x3555) == 0x1.554p-2f);
    cr_assert(clffn_half_to_float(0x7bff) == 65504.0f);
    cr_assert(clffn_half_to_float(0x03ff) == 0x1.ff8p-15f); /* largest subnormal */
    cr_assert(isinf(clffn_half_to_float(0xfc00)) && clffn_half_to_float(0xfc00) < 0);
    cr_assert(isnan(clffn_half_to_float(0x7e00)));
    cr_assert(isnan(clffn_bf16_to_float(0x7fc0)));
    cr_assert(clffn_bf16_to_float(0x4049) == 3.140625f);
}

Test(safetensors, write_then_read_through_a_file) {
    char path[] = "/tmp/clffn-st-XXXXXX";
    const int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    const float w[6] = {1, 2, 3, 4, 5, 6}, b[3] = {-1, -2, -3};
    const uint64_t ws[2] = {2, 3}, bs[1] = {3};
    const clffn_st_out ts[2] = {{"layer.weight", 2, ws, w}, {"layer.bias", 1, bs, b}};
    char err[CLFFN_IO_ERR];
    cr_assert_eq(clffn_st_write(path, ts, 2, err), 0, "%s", err);
    clffn_st_file f;
    cr_assert_eq(clffn_st_open(path, &f, err), 0, "%s", err);
    cr_assert_eq(f.count, 2);
    const clffn_st_tensor *t = clffn_st_find(&f, "layer.weight");
    cr_assert(t && t->rank == 2 && t->shape[0] == 2 && t->shape[1] == 3);
    float out[6];
    cr_assert_eq(clffn_st_read_f32(&f, t, out, err), 0);
    cr_assert(memcmp(out, w, sizeof w) == 0);
    cr_assert_eq(clffn_st_read_f32(&f, clffn_st_find(&f, "layer.bias"), out, err), 0);
    cr_assert(memcmp(out, b, sizeof b) == 0);
    cr_assert_eq((8 + (f.data - (const uint8_t *)f.map - 8)) % 8, 0, "data not 8-byte aligned");
    /* blocks, as a tensor-parallel shard reads its slice: rows, a column band, a vector's part */
    float blk[6] = {0};
    cr_assert_eq(clffn_st_read_f32_block(&f, t, 0, 2, 1, 2, blk, err), 0, "%s", err);
    cr_assert(blk[0] == 2 && blk[1] == 3 && blk[2] == 5 && blk[3] == 6);
    cr_assert_eq(clffn_st_read_f32_block(&f, t, 1, 1, 0, 3, blk, err), 0, "%s", err);
    cr_assert(blk[0] == 4 && blk[1] == 5 && blk[2] == 6);
    cr_assert_eq(clffn_st_read_f32_block(&f, clffn_st_find(&f, "layer.bias"), 0, 1, 1, 2, blk, err),
                 0, "%s", err);
    cr_assert(blk[0] == -2 && blk[1] == -3);
    memset(blk, 0, sizeof blk);
    cr_assert_eq(clffn_st_read_f32_block(&f, t, 1, 2, 0, 3, blk, err), -1);
    cr_assert(strstr(err, "outside") != NULL, "%s", err);
    cr_assert_eq(clffn_st_read_f32_block(&f, t, 0, 1, 2, 2, blk, err), -1);
    cr_assert_eq(clffn_st_read_f32_block(&f, t, 0, 1, UINT64_MAX, 2, blk, err), -1);
    for (int i = 0; i < 6; ++i) { cr_assert(blk[i] == 0.0f); }
    clffn_st_close(&f);
    unlink(path);
    cr_assert_eq(clffn_st_open("/nonexistent/clffn.safetensors", &f, err), -1);
    cr_assert(strstr(err, "cannot open") != NULL);
    cr_assert_eq(clffn_st_open("/tmp", &f, err), -1);
    cr_assert(strstr(err, "regular file") != NULL, "%s", err);
}

/* ------------------------------------------------------------------------------------------ */
/* safetensors: every malformed case */

Test(safetensors, refuses_short_and_oversized_headers) {
    clffn_st_file f;
    char err[CLFFN_IO_ERR];
    const uint8_t tiny[5] = {1, 0, 0, 0, 0};
    cr_assert_eq(clffn_st_parse(tiny, sizeof tiny, &f, err), -1);
    cr_assert(strstr(err, "too short") != NULL);
    uint8_t big[16] = {0, 0, 0, 0, 0, 1, 0, 0, '{', '}'}; /* 2^40-byte header */
    cr_assert_eq(clffn_st_parse(big, sizeof big, &f, err), -1);
    cr_assert(strstr(err, "limit") != NULL, "%s", err);
    uint8_t past[16] = {200, 0, 0, 0, 0, 0, 0, 0, '{', '}'}; /* 200 bytes claimed, 8 present */
    cr_assert_eq(clffn_st_parse(past, sizeof past, &f, err), -1);
    cr_assert(strstr(err, "past the end") != NULL, "%s", err);
    uint8_t huge[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}; /* 2^64 − 1 */
    cr_assert_eq(clffn_st_parse(huge, sizeof huge, &f, err), -1);
    cr_assert(strstr(err, "limit") != NULL, "%s", err);
}

Test(safetensors, refuses_bad_json_and_encoding) {
    st_refused("[1,2]", 0, "start with '{'");
    st_refused(" {}", 0, "start with '{'");
    st_refused("{\"a\":", 0, "not valid JSON");
    st_refused("{} x", 0, "after its JSON object");
    st_refused("{\"\xc3\x28\":1}", 0, "UTF-8");     /* bad continuation byte */
    st_refused("{\"\xc0\xaf\":1}", 0, "UTF-8");     /* overlong '/' */
    st_refused("{\"\xed\xa0\x80\":1}", 0, "UTF-8"); /* a surrogate */
    st_refused("{\"a\":3}", 0, "not a JSON object");
    st_refused("{\"__metadata__\":{\"k\":1}}", 0, "__metadata__");
    st_refused("{\"__metadata__\":[]}", 0, "__metadata__");
}

Test(safetensors, refuses_bad_tensor_entries) {
    st_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "lacks");
    st_refused("{\"a\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
               "unknown dtype");
    st_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
               "non-negative");
    st_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4,
               "non-negative");
    st_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", 4,
               "non-negative");
    st_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
               "\"data_offsets\":[0,4]}}",
               4, "overflows");
    st_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"
               "\"data_offsets\":[0,4]}}",
               4, "dimensions");
    st_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8,
               "two non-negative");
    st_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, "end before");
    st_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, "needs");
    st_refused("{\"a\":1}", 4, "not a JSON object");
}

Test(safetensors, refuses_bad_layout_of_the_data) {
    /* past the end: a huge declared tensor in a small file */
    st_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[268435456],\"data_offsets\":[0,1073741824]}}",
               16, "past the data");
    /* a gap before the first tensor */
    st_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "gap");
    /* overlapping tensors */
    st_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
               8, "overlap");
    /* trailing bytes after the last tensor */
    st_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 12, "trailing");
    /* the same name twice */
    st_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
               8, "twice");
}

/* ------------------------------------------------------------------------------------------ */
/* .npy */

Test(npy, versions_1_2_3_and_types) {
    const float f4[6] = {1, 2, 3, 4, 5, 6};
    const double f8[6] = {1, 2, 3, 4, 5, 6};
    const uint16_t f2[6] = {0x3c00, 0x4000, 0x4200, 0x4400, 0x4500, 0x4600};
    const struct {
        int major;
        const char *descr;
        const void *data;
        size_t size;
    } cases[] = {{1, "<f4", f4, sizeof f4},
                 {2, "<f4", f4, sizeof f4},
                 {3, "<f4", f4, sizeof f4},
                 {1, "<f8", f8, sizeof f8},
                 {1, "<f2", f2, sizeof f2}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        char dict[128];
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (2, 3), }",
                 cases[i].descr);
        image im = npy_image(cases[i].major, dict, cases[i].data, cases[i].size);
        clffn_npy a;
        char err[CLFFN_IO_ERR];
        cr_assert_eq(clffn_npy_parse(im.buf, im.len, &a, err), 0, "case %zu: %s", i, err);
        cr_assert(a.rank == 2 && a.shape[0] == 2 && a.shape[1] == 3 && a.numel == 6);
        cr_assert(memcmp(a.data, f4, sizeof f4) == 0, "case %zu values", i);
        clffn_npy_free(&a);
        free(im.buf);
    }
}

Test(npy, shape_edge_cases) {
    const float one = 42.0f, three[3] = {1, 2, 3};
    char err[CLFFN_IO_ERR];
    clffn_npy a;
    image im = npy_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", &one, 4);
    cr_assert_eq(clffn_npy_parse(im.buf, im.len, &a, err), 0, "%s", err);
    cr_assert(a.rank == 0 && a.numel == 1 && a.data[0] == 42.0f);
    clffn_npy_free(&a);
    free(im.buf);
    im = npy_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", three, 12);
    cr_assert_eq(clffn_npy_parse(im.buf, im.len, &a, err), 0, "%s", err);
    cr_assert(a.rank == 1 && a.shape[0] == 3 && a.data[2] == 3.0f);
    clffn_npy_free(&a);
    free(im.buf);
    /* keys in another order, double quotes, no trailing comma, Python 2 longs */
    im =
        npy_image(1, "{\"shape\": (3L,), \"fortran_order\": False, \"descr\": \"<f4\"}", three, 12);
    cr_assert_eq(clffn_npy_parse(im.buf, im.len, &a, err), 0, "%s", err);
    cr_assert(a.rank == 1 && a.shape[0] == 3);
    clffn_npy_free(&a);
    free(im.buf);
    /* a zero-length dimension */
    im = npy_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 5), }", NULL, 0);
    cr_assert_eq(clffn_npy_parse(im.buf, im.len, &a, err), 0, "%s", err);
    cr_assert(a.numel == 0);
    clffn_npy_free(&a);
    free(im.buf);
}

Test(npy, fortran_order_is_transposed) {
    /* the C-order matrix [[1 2 3] [4 5 6]] stored column-major */
    const float col[6] = {1, 4, 2, 5, 3, 6};
    image im = npy_image(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", col, 24);
    clffn_npy a;
    char err[CLFFN_IO_ERR];
    cr_assert_eq(clffn_npy_parse(im.buf, im.len, &a, err), 0, "%s", err);
    for (int i = 0; i < 6; ++i) {
        cr_assert(a.data[i] == (float)(i + 1), "element %d is %g", i, (double)a.data[i]);
    }
    clffn_npy_free(&a);
    free(im.buf);
    /* rank 3: element (i, j, k) of shape (2, 2, 2) sits at i + 2j + 4k */
    float col3[8], want[8];
    for (int i = 0; i < 2; ++i) {
        for (int j = 0; j < 2; ++j) {
            for (int k = 0; k < 2; ++k) {
                col3[i + 2 * j + 4 * k] = (float)(100 * i + 10 * j + k);
                want[4 * i + 2 * j + k] = (float)(100 * i + 10 * j + k);
            }
        }
    }
    im = npy_image(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2, 2), }", col3, 32);
    cr_assert_eq(clffn_npy_parse(im.buf, im.len, &a, err), 0, "%s", err);
    cr_assert(memcmp(a.data, want, sizeof want) == 0);
    clffn_npy_free(&a);
    free(im.buf);
}

Test(npy, refusals) {
    const float d[4] = {0};
    npy_refused(npy_image(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (4,), }", d, 16),
                "big-endian");
    npy_refused(npy_image(1, "{'descr': '|O', 'fortran_order': False, 'shape': (4,), }", d, 16),
                "'|O'");
    npy_refused(npy_image(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (4,), }", d, 16),
                "'<i4'");
    npy_refused(
        npy_image(1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (4,), }", d, 16),
        "structured");
    npy_refused(npy_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", d, 12),
                "truncated");
    npy_refused(npy_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", d, 16),
                "after the data");
    npy_refused(npy_image(1,
                          "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, "
                          "4294967296, 4294967296), }",
                          d, 16),
                "overflows");
    npy_refused(
        npy_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }",
                  d, 16),
        "overflows 64 bits");
    npy_refused(
        npy_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2305843009213693952,), }",
                  d, 16),
        "truncated"); /* a huge declared size */
    npy_refused(npy_image(1, "{'descr': '<f4', 'fortran_order': False}", d, 16), "lacks");
    npy_refused(npy_image(1, "{'descr': '<f4', 'fortran_order': Maybe, 'shape': (4,), }", d, 16),
                "True or False");
    npy_refused(
        npy_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'x': 1}", d, 16),
        "unexpected key");
    npy_refused(npy_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': [4], }", d, 16),
                "not a tuple");
    npy_refused(npy_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4, -1), }", d, 16),
                "non-negative");
    npy_refused(npy_image(1, "('descr', '<f4')", d, 16), "not a dict");
    npy_refused(npy_image(4, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", d, 16),
                "version 4");
    image im = npy_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", d, 16);
    im.buf[1] = 'X';
    npy_refused(im, "magic");
    /* a header length that runs past the file */
    im = npy_image(2, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", d, 16);
    im.buf[11] = 0x7f;
    npy_refused(im, "truncated");
    uint8_t tiny[4] = {0x93, 'N', 'U', 'M'};
    clffn_npy a;
    char err[CLFFN_IO_ERR];
    cr_assert_eq(clffn_npy_parse(tiny, sizeof tiny, &a, err), -1);
}

/* Bytes from a damaged file reach the message escaped: an ESC or a stray high byte printed as it
 * is can rewrite the user's terminal. */
Test(npy, message_escapes_bytes_from_the_file) {
    const char *dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), "
                       "'\x1b[2J\xff': 1, }";
    const float one = 1.0f;
    image im = npy_image(1, dict, &one, sizeof one);
    char err[CLFFN_IO_ERR] = "";
    cr_assert_eq(clffn_npy_parse(im.buf, im.len, &(clffn_npy){0}, err), -1, "accepted");
    cr_assert(strstr(err, "\\x1b[2J\\xff") != NULL, "message '%s' lacks the escaped key", err);
    for (const unsigned char *c = (const unsigned char *)err; *c; ++c) {
        cr_assert(*c >= 0x20 && *c < 0x7f, "raw byte 0x%02x in the message", *c);
    }
    free(im.buf);
}

Test(npy, save_then_load_round_trip) {
    char path[] = "/tmp/clffn-npy-XXXXXX";
    const int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    const uint64_t shapes[3][3] = {{2, 3, 4}, {5, 0, 0}, {0, 0, 0}};
    const size_t ranks[3] = {3, 1, 0};
    float data[24];
    for (int i = 0; i < 24; ++i) { data[i] = (float)i * 0.5f - 3.0f; }
    for (int c = 0; c < 3; ++c) {
        char err[CLFFN_IO_ERR];
        cr_assert_eq(clffn_npy_save(path, data, ranks[c], shapes[c], err), 0, "%s", err);
        clffn_npy a;
        cr_assert_eq(clffn_npy_load(path, &a, err), 0, "%s", err);
        cr_assert_eq(a.rank, ranks[c]);
        for (size_t k = 0; k < a.rank; ++k) { cr_assert_eq(a.shape[k], shapes[c][k]); }
        cr_assert(memcmp(a.data, data, (size_t)a.numel * sizeof(float)) == 0);
        clffn_npy_free(&a);
        /* numpy's own reader needs the data 64-byte aligned and the header ending in '\n' */
        FILE *f = fopen(path, "rb");
        uint8_t head[10];
        cr_assert_eq(fread(head, 1, 10, f), 10);
        const size_t hlen = (size_t)head[8] | ((size_t)head[9] << 8);
        cr_assert_eq((10 + hlen) % 64, 0);
        fclose(f);
    }
    unlink(path);
    char err[CLFFN_IO_ERR];
    clffn_npy a;
    cr_assert_eq(clffn_npy_load("/nonexistent/x.npy", &a, err), -1);
    cr_assert(strstr(err, "cannot open") != NULL);
    cr_assert_eq(clffn_npy_save("/nonexistent/dir/y.npy", data, 1, shapes[1], err), -1);
}
