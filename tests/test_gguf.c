/* The GGUF reader (src/io/gguf.c) against images from the tests' own writer: the fields of
 * valid files of both versions and alignments, slices read as stored, and every kind of damage
 * refused with a line that says what is wrong. */
#include "clffn_io.h"
#include "gguf_writer.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

static uint8_t pattern[4096];

static void fill_pattern(void) {
    for (size_t i = 0; i < sizeof pattern; ++i) { pattern[i] = (uint8_t)(i * 37 + 11); }
}

/* A file of each type clffn reads, a 3-D one, and metadata of each kind the writer makes. */
static const gw_kv KVS[] = {{"general.architecture", 8, 0, "llama"},
                            {"llama.block_count", 4, 2, NULL},
                            {"llama.expert_used_count", 2, 2, NULL},
                            {"x.big", 10, (uint64_t)1 << 40, NULL},
                            {"x.list", 9, 5, NULL}};

static gw_tensor tensor(const char *name, uint32_t type, uint32_t dims, uint64_t ne0, uint64_t ne1,
                        uint64_t ne2, size_t bytes) {
    const gw_tensor t = {name, type, dims, {ne0, ne1, ne2, 1}, pattern, bytes, 0};
    return t;
}

static void sample_tensors(gw_tensor ts[6]) {
    ts[0] = tensor("blk.0.ffn_gate.weight", CLFFN_GGML_Q8_0, 2, 64, 3, 1, 3 * 2 * 34);
    ts[1] = tensor("blk.0.ffn_up.weight", CLFFN_GGML_Q4_0, 2, 64, 3, 1, 3 * 2 * 18);
    ts[2] = tensor("blk.0.ffn_down.weight", CLFFN_GGML_F16, 2, 3, 64, 1, 3 * 64 * 2);
    ts[3] = tensor("w.bf16", CLFFN_GGML_BF16, 1, 7, 1, 1, 14);
    ts[4] = tensor("w.f32", CLFFN_GGML_F32, 2, 2, 2, 1, 16);
    ts[5] = tensor("blk.0.ffn_up_exps.weight", CLFFN_GGML_Q8_0, 3, 32, 2, 4, 8 * 34);
}

static int parse(const uint8_t *img, size_t len, clffn_gguf_file *f, char *err) {
    memset(err, 0, CLFFN_IO_ERR);
    return clffn_gguf_parse(img, len, f, err);
}

Test(gguf, valid_files_of_both_versions_and_alignments) {
    fill_pattern();
    gw_tensor ts[6];
    sample_tensors(ts);
    const uint32_t versions[2] = {2, 3}, aligns[3] = {0, 64, 1};
    for (int v = 0; v < 2; ++v) {
        for (int a = 0; a < 3; ++a) {
            size_t len;
            uint8_t *img = gw_image(versions[v], aligns[a], KVS, 5, ts, 6, &len);
            clffn_gguf_file f;
            char err[CLFFN_IO_ERR];
            cr_assert_eq(parse(img, len, &f, err), 0, "v%u align %u: %s", versions[v], aligns[a],
                         err);
            cr_assert_eq(f.version, versions[v]);
            cr_assert_eq(f.alignment, aligns[a] ? aligns[a] : 32);
            cr_assert_eq(f.count, 6);
            for (int i = 0; i < 6; ++i) {
                const clffn_gguf_tensor *t = clffn_gguf_find(&f, ts[i].name);
                cr_assert_not_null(t, "%s", ts[i].name);
                cr_assert_eq(t->type, ts[i].type);
                cr_assert_eq(t->rank, ts[i].dims);
                for (uint32_t d = 0; d < 4; ++d) { cr_assert_eq(t->ne[d], ts[i].ne[d]); }
                cr_assert_eq(t->bytes, ts[i].bytes);
                cr_assert(memcmp(f.data + t->offset, pattern, t->bytes) == 0, "%s", t->name);
            }
            uint64_t u = 0;
            char s[16];
            cr_assert(clffn_gguf_uint(&f, "llama.block_count", &u) == 0 && u == 2);
            cr_assert(clffn_gguf_uint(&f, "llama.expert_used_count", &u) == 0 && u == 2);
            cr_assert(clffn_gguf_uint(&f, "x.big", &u) == 0 && u == (uint64_t)1 << 40);
            cr_assert(clffn_gguf_string(&f, "general.architecture", s, sizeof s) == 0);
            cr_assert_str_eq(s, "llama");
            cr_assert_eq(clffn_gguf_string(&f, "general.architecture", s, 5), -1, "too small");
            cr_assert_eq(clffn_gguf_uint(&f, "general.architecture", &u), -1, "not a number");
            cr_assert_eq(clffn_gguf_uint(&f, "nope", &u), -1);
            const clffn_gguf_kv *list = clffn_gguf_kv_find(&f, "x.list");
            cr_assert(list && list->type == CLFFN_GGUF_ARRAY && list->count == 5);
            clffn_gguf_close(&f);
            free(img);
        }
    }
}

/* A slice of rows and of whole blocks along a row, as stored; a slice that cuts a block, runs
 * outside the tensor or overflows its buffer is refused. */
Test(gguf, slices_as_stored) {
    fill_pattern();
    gw_tensor ts[6];
    sample_tensors(ts);
    size_t len;
    uint8_t *img = gw_image(3, 0, KVS, 0, ts, 6, &len);
    clffn_gguf_file f;
    char err[CLFFN_IO_ERR];
    cr_assert_eq(parse(img, len, &f, err), 0, "%s", err);
    const clffn_gguf_tensor *q8 = clffn_gguf_find(&f, "blk.0.ffn_gate.weight");
    uint8_t got[256];
    size_t need;
    cr_assert_eq(clffn_gguf_block_bytes(q8, 2, 32, &need, err), 0);
    cr_assert_eq(need, 2 * 34);
    /* rows 1..2, the second block of each: bytes 34·(2r + 1) of the tensor */
    cr_assert_eq(clffn_gguf_read_block(&f, q8, 1, 2, 32, 32, got, sizeof got, err), 0, "%s", err);
    cr_assert(memcmp(got, pattern + 34 * 3, 34) == 0 &&
              memcmp(got + 34, pattern + 34 * 5, 34) == 0);
    cr_assert_eq(clffn_gguf_read_block(&f, q8, 0, 1, 16, 32, got, sizeof got, err), -1);
    cr_assert(strstr(err, "cuts a Q8_0 block"), "%s", err);
    cr_assert_eq(clffn_gguf_read_block(&f, q8, 2, 2, 0, 32, got, sizeof got, err), -1);
    cr_assert(strstr(err, "outside"), "%s", err);
    cr_assert_eq(clffn_gguf_read_block(&f, q8, 0, 3, 0, 64, got, 100, err), -1);
    cr_assert(strstr(err, "too small"), "%s", err);
    const clffn_gguf_tensor *exps = clffn_gguf_find(&f, "blk.0.ffn_up_exps.weight");
    cr_assert_eq(clffn_gguf_read_block(&f, exps, 5, 3, 0, 32, got, sizeof got, err), 0, "%s", err);
    cr_assert(memcmp(got, pattern + 5 * 34, 3 * 34) == 0, "rows of the flattened experts");
    clffn_gguf_close(&f);
    free(img);
}

/* Every prefix of a valid file is refused with a message or, when only padding was cut, parsed
 * with every tensor inside what remains (never read past the end: ASan runs this too). */
Test(gguf, every_truncation) {
    fill_pattern();
    gw_tensor ts[6];
    sample_tensors(ts);
    size_t len;
    uint8_t *img = gw_image(3, 64, KVS, 5, ts, 6, &len);
    for (size_t n = 0; n < len; ++n) {
        uint8_t *cut = malloc(n ? n : 1);
        memcpy(cut, img, n);
        clffn_gguf_file f;
        char err[CLFFN_IO_ERR];
        if (parse(cut, n, &f, err) != 0) {
            cr_assert(err[0] != '\0', "prefix %zu refused without a message", n);
        } else {
            for (size_t i = 0; i < f.count; ++i) {
                cr_assert(f.tensors[i].offset + f.tensors[i].bytes <= f.data_len);
            }
            clffn_gguf_close(&f);
        }
        free(cut);
    }
    free(img);
}

/* ---- damage ----------------------------------------------------------------------------- */

/* The image of the sample with ts adjusted by the caller, then one patch of bytes at the first
 * occurrence of `find` (or at byte `at` when find is NULL), and the refusal's message must hold
 * `want`. */
typedef struct damage {
    const char *what;
    void (*adjust)(gw_tensor ts[6], uint32_t *align);
    const char *find;
    size_t at;
    const char *bytes;
    size_t n;
    const char *want;
} damage;

static void unknown_type(gw_tensor ts[6], uint32_t *a) { ts[3].type = 99, (void)a; }
static void no_dims(gw_tensor ts[6], uint32_t *a) { ts[4].dims = 0, (void)a; }
static void partial_block(gw_tensor ts[6], uint32_t *a) {
    ts[0].ne[0] = 48, ts[0].bytes = 3 * 34, (void)a;
}
static void misaligned(gw_tensor ts[6], uint32_t *a) { ts[2].shift = 4, (void)a; }
static void overlapping(gw_tensor ts[6], uint32_t *a) { ts[1].shift = -64, (void)a; }
static void past_the_end(gw_tensor ts[6], uint32_t *a) { ts[5].shift = 4096, (void)a; }
static void same_names(gw_tensor ts[6], uint32_t *a) { ts[4].name = ts[3].name, (void)a; }
static void alignment_3(gw_tensor ts[6], uint32_t *a) { *a = 3, (void)ts; }
static void overflowing(gw_tensor ts[6], uint32_t *a) {
    ts[4].dims = 3, ts[4].ne[0] = (uint64_t)1 << 32, ts[4].ne[1] = (uint64_t)1 << 32;
    ts[4].ne[2] = (uint64_t)1 << 33, (void)a;
}

/* The first place `needle` stands in buf, or NULL. */
static const uint8_t *find_bytes(const uint8_t *buf, size_t len, const char *needle) {
    const size_t n = strlen(needle);
    for (size_t i = 0; i + n <= len; ++i) {
        if (!memcmp(buf + i, needle, n)) { return buf + i; }
    }
    return NULL;
}

static const damage DAMAGE[] = {
    {"magic", NULL, NULL, 0, "GGUX", 4, "not a GGUF file"},
    {"version 1", NULL, NULL, 4, "\1\0\0\0", 4, "version 1 is not read"},
    {"version 4", NULL, NULL, 4, "\4\0\0\0", 4, "version 4 is not read"},
    {"big-endian", NULL, NULL, 4, "\0\0\0\3", 4, "big-endian"},
    {"tensor count", NULL, NULL, 8, "\377\377\377\377\377\377\0\0", 8, "cannot fit"},
    {"metadata count", NULL, NULL, 16, "\377\377\377\377\377\0\0\0", 8, "cannot fit"},
    {"key length", NULL, NULL, 24, "\377\377\377\377\0\0\0\0", 8, "runs past the end"},
    {"value type", NULL, "llama.block_count", 17, "\15", 1, "unknown value type 13"},
    {"array of arrays", NULL, "x.list", 10, "\11", 1, "array of arrays"},
    {"array length", NULL, "x.list", 14, "\377\377\377\377\377\377\377\0", 8, "cannot fit"},
    {"NUL in a name", NULL, "w.f32", 1, "\0", 1, "NUL"},
    {"unknown type", unknown_type, NULL, 0, NULL, 0, "unknown type 99"},
    {"no dimensions", no_dims, NULL, 0, NULL, 0, "0 dimensions"},
    {"a partial block", partial_block, NULL, 0, NULL, 0, "not whole Q8_0 blocks"},
    {"misaligned", misaligned, NULL, 0, NULL, 0, "not aligned"},
    {"overlapping", overlapping, NULL, 0, NULL, 0, "overlaps"},
    {"past the data", past_the_end, NULL, 0, NULL, 0, "runs past the data section"},
    {"a name twice", same_names, NULL, 0, NULL, 0, "appears twice"},
    {"alignment 3", alignment_3, NULL, 0, NULL, 0, "power of two"},
    {"an overflowing count", overflowing, NULL, 0, NULL, 0, "overflows"},
};

Test(gguf, damage_is_refused_with_a_message) {
    fill_pattern();
    for (size_t d = 0; d < sizeof DAMAGE / sizeof DAMAGE[0]; ++d) {
        const damage *dm = &DAMAGE[d];
        gw_tensor ts[6];
        sample_tensors(ts);
        uint32_t align = 0;
        if (dm->adjust) { dm->adjust(ts, &align); }
        size_t len;
        uint8_t *img = gw_image(3, align, KVS, 5, ts, 6, &len);
        if (dm->bytes) {
            size_t at = dm->at;
            if (dm->find) {
                const uint8_t *p = find_bytes(img, len, dm->find);
                cr_assert_not_null(p, "%s", dm->find);
                at += (size_t)(p - img);
            }
            cr_assert(at + dm->n <= len);
            memcpy(img + at, dm->bytes, dm->n);
        }
        clffn_gguf_file f;
        memset(&f, 0x5a, sizeof f);
        char err[CLFFN_IO_ERR];
        cr_assert_eq(parse(img, len, &f, err), -1, "%s was accepted", dm->what);
        cr_assert(strstr(err, dm->want) != NULL, "%s: '%s' lacks '%s'", dm->what, err, dm->want);
        cr_assert_eq(f.version, 0x5a5a5a5au, "%s: the caller's struct was written", dm->what);
        free(img);
    }
}

Test(gguf, type_names) {
    cr_assert_str_eq(clffn_gguf_type_name(CLFFN_GGML_Q8_0), "Q8_0");
    cr_assert_str_eq(clffn_gguf_type_name(12), "Q4_K");
    cr_assert_str_eq(clffn_gguf_type_name(CLFFN_GGML_BF16), "BF16");
    cr_assert_null(clffn_gguf_type_name(4));
    cr_assert_null(clffn_gguf_type_name(1000));
    uint32_t b, s;
    cr_assert(clffn_gguf_type_block(CLFFN_GGML_Q4_0, &b, &s) == 0 && b == 32 && s == 18);
    cr_assert_eq(clffn_gguf_type_block(5, &b, &s), -1);
}
