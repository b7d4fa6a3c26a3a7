/* Helpers shared by the Criterion suites: random data, weight sets, device buffers with
 * canaries, and the tolerance check against the double-precision reference. */
#ifndef CLFFN_TEST_COMMON_H
#define CLFFN_TEST_COMMON_H

#include "clffn.h"
#include "internal.h"
#include "xgemm_sets.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stddef.h>

/* The core tolerance: |y − ref| ≤ RTOL·max|ref| + ATOL. */
#define TOL_RTOL 1e-5
#define TOL_ATOL 1e-6

/* Seconds added to the timeout of a test that may be the first to build kernels for a parameter
 * set: CLBlast's GEMM programs above all (clffn-tune's evaluations build clffn's weight kernels
 * and CLBlast's beside them). On a fresh machine POCL's kernel cache is empty, and when CLBlast
 * reads a program's binary back to keep it (as it does after every build), POCL compiles each of
 * the program's kernels: XgemmDirect's four, for the AVX2 profile's direct parameters, took 49 s
 * of a 2-core AVX2 host's compiler for every Xgemm set (its copy kernels and Xgemm 3 s). A test
 * that runs in seconds on a warm cache then took minutes on a cold one, two at a time under
 * ctest -j2, and ran past timeouts sized for the warm cache. */
#define TEST_COLD_GEMM_BUILDS 480

/* Canary floats around every device output; any change means a write out of bounds. */
#define CANARY 64
#define CANARY_VALUE (-12345.5f)

/* Deterministic test data, independent of the library's own generators. */
void fill_uniform(float *a, size_t n, float lo, float hi, uint64_t seed);

/* A weight set for a config, in a layout, owning its arrays. Values are chosen so hidden
 * pre-activations spread over [-2, 2]-ish and outputs are not mostly zero. */
typedef struct test_weights {
    float *w1, *b1, *v, *bv, *w2, *b2;
    clffn_host_weights host;
} test_weights;
void test_weights_make(test_weights *w, const clffn_config *c, clffn_layout layout, uint64_t seed);
void test_weights_free(test_weights *w);

/* A weight set's matrices in a stored type: the bytes (typed, to upload) and their exact f32
 * values (ref, for the reference), biases shared with the f32 set they came from. */
typedef struct typed_set {
    clffn_dtype dtype;
    clffn_layout layout;
    void *w1, *v, *w2;
    float *r1, *rv, *r2; /* dequantized */
    clffn_typed_weights typed;
    clffn_host_weights ref;
} typed_set;
void typed_make(typed_set *s, const clffn_config *c, const test_weights *w, clffn_dtype t,
                clffn_layout layout);
void typed_free(typed_set *s);

/* Rows of n values rounded to the inputs' type of a product over weights of type w, and back
 * (out: rows × n): q8_0 (n a multiple of 32) as GGUF's reference quantizer rounds them for q8_0
 * and q4_0 weights, bf16 for bf16 ones (clffn_convert_weights). */
void host_quantized_rows(clffn_dtype w, const float *x, size_t rows, size_t n, float *out);

/* T tokens of x through an FFN (OUT_IN layout, q8_0, q4_0 or bf16 weights s) whose context
 * quantizes the inputs: the hidden layer and y against the double reference on the rounded
 * inputs, and that the rounding moved y past the tolerance; with `exact`, y against the plain
 * reference. */
void assert_quantized_forward(clffn_ffn *ffn, const clffn_config *c, const typed_set *s, size_t T,
                              const float *x, int exact, const char *what);

/* Asserts that rounding the inputs shows: max|rounded − plain| > margin·TOL_RTOL·max|plain|,
 * so a check against the rounded reference could not pass on unrounded inputs (any margin past
 * 2 ensures it; q8_0's rounding clears 100, bf16's, 16 times finer, 10). */
void assert_rounding_shows(const double *rounded, const double *plain, size_t n, double margin,
                           const char *what);

clffn_context *test_context(void);
/* test_context() with every f32 product on CLBlast (its GEMV and SGEMM, by the GEMV crossover),
 * whatever the device's profile gives clffn's own kernels: for the tests of CLBlast's side, which
 * a profile that runs f32 through the kernels would otherwise leave untested (the kernels have
 * tests of their own, test_compressed.c). */
clffn_context *test_clblast_context(void);
/* A fresh folder of tuning profiles made from the template dir ("/tmp/…-XXXXXX") and set as
 * CLFFN_TUNE_DIR (CLFFN_NO_TUNING unset), and in path the profile file the test device reads
 * there; test_profile_dir_end removes both and unsets CLFFN_TUNE_DIR. */
void test_profile_dir(char *dir, char *path, size_t size);
void test_profile_dir_end(const char *dir, const char *path);
/* Writes text to the file at path (made or emptied first). */
void test_write_text(const char *path, const char *text);
/* Whether the device's profiling timestamps order three kernels that its in-order queue ran one
 * after the other (each starting at or after the last one's end): the tests' own probe, apart
 * from the library's, of whether stage times can exist on this device. */
int test_timestamps_ordered(clffn_context *ctx);
/* Skips the calling test, printing why, when the device's platform and driver have a known
 * defect that breaks it (the list in common.c, each entry explained in docs/RELIABILITY.md),
 * destroying ctx first since the skip ends the test; returns otherwise. The only way a test is
 * skipped for a platform. */
void test_skip_known_defect(clffn_context *ctx, const char *test);

/* The two sides of the small-batch crossover (clffn_context_set_gemv_max_tokens): every product
 * an SGEMM, then every one that can be a GEMV per token. Tests of the passes run on both. */
static const size_t test_gemv_sides[2] = {0, CLFFN_MAX_GEMV_TOKENS};
static inline const char *test_gemv_side_name(int side) { return side ? "gemv" : "gemm"; }
/* The tokens a case of T runs with on a side. The GEMV side makes one CLBlast GEMV call per token,
 * the same call at each token's offsets: three tokens (the first, a middle, the last) cover it,
 * more only repeat it, and each call builds a kernel object of its own (some 2 ms on Mesa's
 * rusticl, where the repeats were most of the forward and backward suites' time). The GEMM side
 * runs every T. */
static inline size_t test_side_tokens(int side, size_t T) { return side && T > 3 ? 3 : T; }

/* Asserts |y − ref| ≤ rtol·max|ref| + TOL_ATOL everywhere (callers pass TOL_RTOL or
 * act_rtol()); a NaN fails. Reports the first bad index and the worst error. */
void assert_close(const float *y, const double *ref, size_t n, double rtol, const char *what);

/* Asserts that at least `frac` of the values are non-zero, so a test is not vacuous. */
void assert_mostly_nonzero(const double *v, size_t n, double frac, const char *what);

/* A device buffer of n floats at a float offset, with CANARY floats of CANARY_VALUE before the
 * offset and after the end. */
typedef struct guarded {
    cl_mem mem;
    size_t offset, n, total;
} guarded;
guarded guarded_make(clffn_context *ctx, size_t offset, size_t n, const float *init);
void guarded_read(clffn_context *ctx, const guarded *g, float *out);
void guarded_assert_canaries(clffn_context *ctx, const guarded *g, const char *what);
void guarded_free(guarded *g);

/* The rtol for an activation's results: TOL_RTOL for every activation (each form, exp and erf
 * included, meets the core tolerance on the devices tested). The one place to change it for an
 * activation, with the reason, should a device need it. */
double act_rtol(clffn_activation a);

/* Runs T random tokens through clffn_forward_host with the FFN's current mode and asserts the
 * result against the double reference of c and w (OUT_IN layout). */
void assert_host_forward(clffn_ffn *ffn, const clffn_config *c, const test_weights *w, size_t T,
                         const char *what);

#define ASSERT_OK(expr)                                                                \
    do {                                                                               \
        int st_ = (int)(expr);                                                         \
        cr_assert_eq(st_, CLFFN_SUCCESS, "%s -> %s", #expr, clffn_status_string(st_)); \
    } while (0)

#define ASSERT_STATUS(expr, want)                                                                \
    do {                                                                                         \
        int st_ = (int)(expr);                                                                   \
        cr_assert_eq(st_, (int)(want), "%s -> %s, expected %s", #expr, clffn_status_string(st_), \
                     clffn_status_string((int)(want)));                                          \
    } while (0)

#endif
