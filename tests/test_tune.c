/* clffn-tune end to end: a profile file applied and printed, a short search and what it writes,
 * each kind of candidate evaluation its child process runs (the GEMMs, GEMV kernels, clffn's
 * own kernels, a few-tokens Xgemm set), and damaged profiles falling back. */
#include "common.h"
#include "tools_common.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A profile file (the format clffn-tune writes) is applied when a context opens the device,
 * and FFN results under its parameters stay right through both GEMM kernels. */
Test(clffn_tune, profile_file_is_applied) {
    make_dir();
    setenv("CLFFN_TUNE_DIR", dir, 1);
    clffn_context *ctx = test_context();
    char path[1300];
    ASSERT_OK(clffn_tuning_profile_path(clffn_context_cl_device(ctx), path, sizeof path));
    cr_assert(strncmp(path, dir, strlen(dir)) == 0, "%s", path);
    clffn_context_destroy(ctx);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs("{\"clblast\": {\"Xgemm\": {\"GEMMK\": 0, \"KREG\": 1, \"KWG\": 16, \"KWI\": 2,"
          " \"MDIMA\": 8, \"MDIMC\": 8, \"MWG\": 32, \"NDIMB\": 8, \"NDIMC\": 8, \"NWG\": 32,"
          " \"SA\": 0, \"SB\": 0, \"STRM\": 0, \"STRN\": 0, \"VWM\": 4, \"VWN\": 4},"
          " \"GemmRoutine\": {\"XGEMM_MIN_INDIRECT_SIZE\": 48},"
          " \"Xgemv\": {\"WGS1\": 32, \"WPT1\": 2},"
          " \"XgemvFast\": {\"WGS2\": 16, \"WPT2\": 2, \"VW2\": 2}},"
          " \"clffn\": {\"GEMM_K_BLOCK\": 64, \"GEMM_K_BLOCK_MIN_ROWS\": 100,"
          " \"GEMV_MAX_TOKENS\": 3, \"WEIGHT_LAYOUT\": 0}}",
          f);
    fclose(f);
    ctx = test_context();
    cr_assert_eq(clffn_tuning_has_profile(clffn_context_cl_device(ctx)), 1);
    cr_assert_eq(clffn_context_gemm_k_block(ctx), 64);
    cr_assert_eq(clffn_context_gemv_max_tokens(ctx), 3);
    cr_assert_eq(clffn_context_gemm_k_block_min_rows(ctx), 100);
    cr_assert_eq(clffn_context_weight_layout(ctx), CLFFN_LAYOUT_OUT_IN); /* not the default */
    char want[1400];
    snprintf(want, sizeof want, "profile %s", path);
    cr_assert_str_eq(clffn_context_tuning(ctx), want);
    /* 3 tokens run as GEMVs under that crossover, 200 as the tiled GEMM under that threshold */
    const size_t shapes[2][3] = {{3, 40, 72}, {200, 40, 72}};
    for (int s = 0; s < 2; ++s) {
        clffn_config c = clffn_config_default(shapes[s][1], shapes[s][2]);
        const size_t T = shapes[s][0], D = c.d_model;
        test_weights w;
        test_weights_make(&w, &c, CLFFN_LAYOUT_OUT_IN, 3);
        float *x = malloc(T * D * sizeof *x), *y = malloc(T * D * sizeof *y);
        double *ref = malloc(T * D * sizeof *ref);
        fill_uniform(x, T * D, -1, 1, 4);
        clffn_ffn *ffn = NULL;
        ASSERT_OK(clffn_ffn_create(ctx, &c, &ffn));
        ASSERT_OK(clffn_ffn_upload_weights(ffn, CLFFN_LAYOUT_OUT_IN, &w.host));
        ASSERT_OK(clffn_forward_host(ffn, T, x, T * D, y, T * D));
        ASSERT_OK(
            clffn_reference_forward(&c, CLFFN_LAYOUT_OUT_IN, &w.host, T, x, 0, 0, 0, ref, NULL));
        assert_close(y, ref, T * D, TOL_RTOL, "under a profile");
        clffn_ffn_destroy(ffn);
        free(x), free(y), free(ref);
        test_weights_free(&w);
    }
    clffn_context_destroy(ctx);
    remove_dir();
}

/* --print with no profile file: the path, what is applied, and the built-in profile whole. */
Test(clffn_tune, print_shows_the_builtin_profile) {
    make_dir();
    setenv("CLFFN_TUNE_DIR", dir, 1);
    clffn_context *ctx = test_context();
    const char *builtin = clffn_tuning_builtin_profile(clffn_context_cl_device(ctx));
    char cmd[1024], out[16384];
    snprintf(cmd, sizeof cmd, "CLFFN_TUNE_DIR='%s' '%s' --print", dir, CLFFN_TUNE_PATH);
    cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strncmp(out, dir, strlen(dir)) == 0, "the path first: %s", out);
    cr_assert(strstr(out, clffn_context_tuning(ctx)) != NULL, "%s", out);
    cr_assert(builtin ? strstr(out, builtin) != NULL : strchr(out, '{') == NULL, "%s", out);
    clffn_context_destroy(ctx);
    remove_dir();
}

/* On a CPU device (its kernel shapes a work-item a row) phase 9 also times the row-grouping
 * boundaries, and its findings (a profile, or the kernels' line) hold one of those timed, or
 * the default where none was 3% faster; elsewhere neither. */
static void assert_row_groups(const char *out) {
    const char *grouped = strstr(out, "rows grouped from");
    cr_assert((strstr(out, "kernel shape 1,8,64,1,4") != NULL) == (grouped != NULL), "%s", out);
    const char *key = strstr(out, "\"WGEMV_ROW_GROUP_COLS\":");
    cr_assert((key != NULL) == (grouped != NULL), "%s", out);
    if (key) {
        const size_t cols = strtoull(key + strlen("\"WGEMV_ROW_GROUP_COLS\":"), NULL, 10);
        char line[64];
        snprintf(line, sizeof line, "rows grouped from %9zu floats", cols);
        cr_assert(cols == CLFFN_DEFAULT_ROW_GROUP_COLS || strstr(out, line), "%zu: %s", cols, out);
    }
}

/* Phase 9 measured the weight kernels either way, and the large products' crossover on the
 * shape the search below gives, whose W2 has 131072 weights; and chose f32's layout with its
 * crossover after the forward in both: the layout's value (a clffn_layout) and the crossover. */
static void phase9_lines(const char *out, double *layout_value, long *f32_most) {
    cr_assert(strstr(out, "q4_0     1 tokens: kernels") != NULL, "%s", out);
    cr_assert(strstr(out, "q8_0     1 tokens, quantized inputs: kernels") != NULL, "%s", out);
    cr_assert(strstr(out, "f32      1 tokens: kernels") != NULL, "%s", out);
    cr_assert(strstr(out, "large products: 256 -> 512 gated, from 131072 weights") != NULL, "%s",
              out);
    assert_row_groups(out);
    const char *chosen = strstr(out, "f32   weights kept ");
    cr_assert(strstr(out, "f32   with the weights kept ") != NULL, "%s", out);
    cr_assert(strstr(out, "f32      1 tokens: weights kept [out, in] (kernels to ") ||
                  strstr(out, "f32      1 tokens: weights kept [in, out] (kernels to "),
              "%s", out);
    cr_assert(chosen &&
                  sscanf(chosen, "f32   weights kept [%*[^]]], kernels to %ld", f32_most) == 1,
              "%s", out);
    *layout_value = strncmp(chosen, "f32   weights kept [in, out]", 28) ? 0.0 : 1.0;
}

/* The profile file at path, its text in text[size] and parsed. */
static cJSON *read_profile(const char *path, char *text, size_t size) {
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    const size_t n = fread(text, 1, size - 1, f);
    text[n] = '\0';
    fclose(f);
    cJSON *o = cJSON_Parse(text);
    cr_assert_not_null(o, "%s", text);
    return o;
}

/* A written profile's GEMM sections: every kernel CLBlast's GEMMs run, clffn's block and
 * thresholds within the tuned shape's 48 tokens, and the search's GEMMs faster than before. */
static void assert_gemm_sections(const cJSON *o, const char *text) {
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(o, "clblast");
    const cJSON *own = cJSON_GetObjectItemCaseSensitive(o, "clffn");
    cr_assert(cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(k, "Xgemm")), "%s", text);
    cr_assert(cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(k, "XgemmDirect")), "%s", text);
    cr_assert(cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(k, "GemmRoutine")), "%s", text);
    const double kb = json_num(own, "GEMM_K_BLOCK"), rows = json_num(own, "GEMM_K_BLOCK_MIN_ROWS");
    cr_assert(kb >= 0, "%s", text);
    /* blocked from some row count up to the tuned shape's, or never blocked */
    cr_assert(rows >= 0 && rows <= 48 && (kb > 0 || rows == 0), "%s", text);
    const double gv = json_num(own, "GEMV_MAX_TOKENS");
    cr_assert(gv >= 0 && gv <= 48, "%s", text);
    /* a few-tokens Xgemm set comes with its threshold, or neither is written */
    const cJSON *few = cJSON_GetObjectItemCaseSensitive(o, "clblast_few_rows");
    const cJSON *fr = cJSON_GetObjectItemCaseSensitive(own, "XGEMM_FEW_ROWS");
    cr_assert((few == NULL) == (fr == NULL), "%s", text);
    cr_assert(!few || (cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(few, "Xgemm")) &&
                       cJSON_IsNumber(fr) && fr->valuedouble > 1),
              "%s", text);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "tuned_for");
    cr_assert(json_num(t, "gemm_gflops") > json_num(t, "gemm_gflops_before"), "%s", text);
}

/* The kernels' findings in a written profile: each shape and crossover in range, the large
 * products' size the search's, and f32's layout and crossover as phase 9 chose them. */
static void assert_kernel_keys(const cJSON *own, const char *text, double layout_value,
                               long f32_most) {
    static const char *const kernel_keys[] = {
        "WGEMV_ROW_SPLIT",         "WGEMV_ROW_ROWS",       "WGEMV_COL_WIDTH",
        "WGEMV_COL_SPLIT",         "WGEMV_COL_GROUPS",     "KERNEL_MAX_TOKENS",
        "KERNEL_MAX_TOKENS_F32",   "KERNEL_MAX_TOKENS_QX", "KERNEL_MAX_TOKENS_LARGE",
        "KERNEL_MAX_TOKENS_BLOCKS"};
    for (size_t i = 0; i < sizeof kernel_keys / sizeof kernel_keys[0]; ++i) {
        const double v = json_num(own, kernel_keys[i]); /* crossovers: a count measured, or all */
        cr_assert(v >= (i < 5 ? 1 : 0) && (v <= (i < 5 ? 256 : 1024) || v == 1073741824.0), "%s",
                  text);
    }
    cr_assert_eq(json_num(own, "KERNEL_LARGE_WEIGHTS"), 131072.0, "%s", text);
    cr_assert_eq(json_num(own, "WEIGHT_LAYOUT"), layout_value, "%s", text);
    cr_assert_eq(json_num(own, "KERNEL_MAX_TOKENS_F32"), (double)f32_most, "%s", text);
}

/* Where the GEMMs found lose to what is applied, the profile written (o) is the one the library
 * would apply without it (the built-in one, or CLBlast's defaults) with the kernels' findings
 * (the line clffn-tune printed, in out) over its "clffn" section: every other section and key
 * as there. */
static void assert_kept_gemms(const cJSON *o, const char *out) {
    clffn_context *ctx = test_context();
    const char *builtin = clffn_tuning_builtin_profile(clffn_context_cl_device(ctx));
    cJSON *base = cJSON_Parse(builtin ? builtin : "{\"clblast\":{}}");
    const char *line = strstr(out, "clffn's kernels: {");
    cr_assert(base && line, "%s", out);
    cJSON *found = cJSON_Parse(line + strlen("clffn's kernels: "));
    cr_assert(cJSON_IsObject(found) && cJSON_GetArraySize(found) >= 8, "%s", out);
    const cJSON *mine = cJSON_GetObjectItemCaseSensitive(o, "clffn"), *sec, *key;
    cJSON_ArrayForEach(sec, base) {
        if (strcmp(sec->string, "clffn") != 0) {
            cr_assert(cJSON_Compare(sec, cJSON_GetObjectItemCaseSensitive(o, sec->string), 1),
                      "%s: %s", sec->string, out);
            continue;
        }
        cJSON_ArrayForEach(key, sec) {
            if (!cJSON_GetObjectItemCaseSensitive(found, key->string)) {
                cr_assert_eq(json_num(mine, key->string), key->valuedouble, "%s", key->string);
            }
        }
    }
    cJSON_ArrayForEach(key, found) {
        cr_assert_eq(json_num(mine, key->string), key->valuedouble, "%s: %s", key->string, out);
    }
    cJSON_Delete(found);
    cJSON_Delete(base);
    clffn_context_destroy(ctx);
}

/* A short search runs its phases and either writes a profile whose GEMMs beat what was applied,
 * or keeps those and writes the kernels' findings into the profile that stays, or says that it
 * holds them already. */
Test(clffn_tune, short_search, .timeout = 400 + TEST_COLD_GEMM_BUILDS) {
    make_dir();
    char cmd[1024], out[16384];
    snprintf(
        cmd, sizeof cmd,
        "CLFFN_NO_TUNING=1 CLFFN_TUNE_DIR='%s' '%s' --budget 1 --tokens 48 --d-model 64 --d-ff 128"
        " --large-shape 256,512",
        dir, CLFFN_TUNE_PATH);
    cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
    char *at = strstr(out, "profile: ");
    const bool kept = strstr(out, "nothing found beats the GEMMs' parameters") != NULL;
    double layout_value;
    long f32_most;
    phase9_lines(out, &layout_value, &f32_most);
    if (!at) {
        cr_assert(kept && strstr(out, "holds them already; nothing written") != NULL, "%s", out);
        cr_assert(strstr(out, "\"KERNEL_MAX_TOKENS\":") != NULL, "%s", out);
        cr_assert(strstr(out, "\"KERNEL_LARGE_WEIGHTS\":131072") != NULL, "%s", out);
        char want[96];
        snprintf(want, sizeof want, "\"KERNEL_MAX_TOKENS_F32\":%ld,\"WEIGHT_LAYOUT\":%d", f32_most,
                 (int)layout_value);
        cr_assert(strstr(out, want) != NULL, "%s\n%s", want, out);
        remove_dir();
        return;
    }
    char path[1300], text[8192];
    cr_assert(sscanf(at, "profile: %1299s", path) == 1);
    cJSON *o = read_profile(path, text, sizeof text);
    if (kept) {
        cr_assert(strstr(out, "clffn's kernels written over ") != NULL, "%s", out);
        assert_kept_gemms(o, out);
    } else {
        assert_gemm_sections(o, text);
    }
    assert_kernel_keys(cJSON_GetObjectItemCaseSensitive(o, "clffn"), text, layout_value, f32_most);
    cJSON_Delete(o);
    remove_dir();
}

/* A search whose GEMMs lose to the built-in profile (resumed, past the GEMM phases, from a
 * progress file holding a set of 16 x 16 tiles one output a work-item, several times slower)
 * keeps that profile's GEMM parameters and writes the kernels' findings into it. Devices with no
 * built-in profile compare against CLBlast's defaults, which that set need not lose to: skipped
 * there. */
Test(clffn_tune, kernels_written_where_the_gemms_lose, .timeout = 600 + TEST_COLD_GEMM_BUILDS) {
    make_dir();
    setenv("CLFFN_TUNE_DIR", dir, 1);
    clffn_context *ctx = test_context();
    char path[1300], progress[1400], cmd[2048], out[16384];
    const int builtin = clffn_tuning_builtin_profile(clffn_context_cl_device(ctx)) != NULL;
    ASSERT_OK(clffn_tuning_profile_path(clffn_context_cl_device(ctx), path, sizeof path));
    clffn_context_destroy(ctx);
    if (!builtin) {
        remove_dir();
        cr_skip_test("no built-in profile for this device");
    }
    snprintf(progress, sizeof progress, "%s.progress", path);
    FILE *f = fopen(progress, "w");
    cr_assert_not_null(f);
    fputs("{\"phase\":3,\"index\":0,\"spent_s\":0,\"xgemm\":{\"GEMMK\":0,\"KREG\":1,"
          "\"KWG\":16,\"KWI\":2,\"MDIMA\":16,\"MDIMC\":16,\"MWG\":16,\"NDIMB\":16,\"NDIMC\":16,"
          "\"NWG\":16,\"SA\":0,\"SB\":0,\"STRM\":0,\"STRN\":0,\"VWM\":1,\"VWN\":1},\"xgemm_s\":1,"
          "\"direct\":{\"KWID\":2,\"MDIMAD\":8,\"MDIMCD\":8,\"NDIMBD\":16,\"NDIMCD\":16,"
          "\"PADA\":0,\"PADB\":1,\"VWMD\":1,\"VWND\":1,\"WGD\":64},\"direct_s\":1}",
          f);
    fclose(f);
    snprintf(cmd, sizeof cmd,
             "env -u CLFFN_NO_TUNING CLFFN_TUNE_DIR='%s' '%s' --budget 1 --tokens 48 --d-model 64"
             " --d-ff 128 --large-shape none",
             dir, CLFFN_TUNE_PATH);
    cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "nothing found beats the GEMMs' parameters") != NULL, "%s", out);
    cr_assert(strstr(out, "clffn's kernels written over the built-in profile") != NULL, "%s", out);
    cr_assert(access(progress, F_OK) != 0, "the progress file is gone once written");
    char text[8192];
    cJSON *o = read_profile(path, text, sizeof text);
    assert_kept_gemms(o, out);
    cJSON_Delete(o);
    remove_dir();
}

/* A candidate is checked before it is timed, GEMV kernels included: one evaluation (the child
 * clffn-tune runs per candidate) with good GEMV parameters prints a time; with XgemvFastRot's
 * tile longer than its work-group (CLBlast's kernel then loads part of the vector and computes
 * wrong results) it exits 3, wrong result, instead of timing it, whatever the crossover (1 token,
 * the weight layout phase's, included). */
Test(clffn_tune, gemv_candidate_checked, .timeout = 120 + TEST_COLD_GEMM_BUILDS) {
    char cmd[1024], out[4096], err[4096];
    const char *specs[3] = {"65536:16,16,16,8,2,2", "65536:16,16,16,4,8,4", "1:16,16,16,4,8,4"};
    for (int i = 0; i < 3; ++i) {
        snprintf(cmd, sizeof cmd,
                 "'%s' --eval --routine 0 --tokens 1 --d-model 64 --d-ff 128 --gemv %s",
                 CLFFN_TUNE_PATH, specs[i]);
        const int rc = run_split(cmd, out, sizeof out, err, sizeof err);
        if (i == 0) {
            double t = 0;
            cr_assert_eq(rc, 0, "%s%s", out, err);
            cr_assert(sscanf(out, "%lf", &t) == 1 && t > 0, "%s%s", out, err);
        } else {
            cr_assert_eq(rc, 3, "%s%s", out, err);
        }
    }
}

/* Phase 9's child: with "cross", the two paths agree first, then a time each through the
 * kernels and without at 1, 2, 4 ... 1024 tokens up to the first count the kernels lose; with
 * "shapes", a time per shape; with "groups", a time per row-grouping boundary (the rows grouped
 * and not checked to agree first); a malformed spec or type is refused. The times are standard
 * output alone: POCL's compiler prints "N warnings generated." to standard error as it builds a
 * kernel the first time on a CPU without AVX-512 (the float16 ABI), and that is no time. */
Test(clffn_tune, kernel_evaluation, .timeout = 180 + TEST_COLD_GEMM_BUILDS) {
    char cmd[1024], out[4096], err[4096];
    static const char *const specs[8] = {"q4_0:cross:1,8,64,1,4",
                                         "f16:shapes:1,8,64,1,4;1,4,32,1,8",
                                         "q5_k:cross:1,8,64,1,4",
                                         "f16:cross:1,8,64",
                                         "q8_0:groups:1,8,64,1,4;0,512,18446744073709551615",
                                         "f16:groups:1,8,64,1,4",
                                         "f16:groups:1,8,64,1,4;",
                                         "f16:groups:1,8,64,1,4;64,x"};
    static const int counts[8] = {-1, 2, 0, 0, 3, 0, 0, 0}; /* -1: pairs to the first loss */
    for (int i = 0; i < 8; ++i) {
        snprintf(cmd, sizeof cmd,
                 "'%s' --eval --tokens 1 --d-model 64 --d-ff 128 --gated --kernels '%s'",
                 CLFFN_TUNE_PATH, specs[i]);
        const int rc = run_split(cmd, out, sizeof out, err, sizeof err);
        if (!counts[i]) {
            cr_assert_eq(rc, 1, "%s: %s%s", specs[i], out, err);
            continue;
        }
        cr_assert_eq(rc, 0, "%s: %s%s", specs[i], out, err);
        const char *p = out;
        double v[32];
        int n = 0;
        for (char *end; n < 32; p = end, ++n) {
            v[n] = strtod(p, &end);
            if (end == p) { break; }
            cr_assert(v[n] > 0, "%s: %s", specs[i], out);
        }
        if (counts[i] > 0) {
            cr_assert_eq(n, counts[i], "%s: %s", specs[i], out);
            continue;
        }
        /* 1, 2, 4 ... 1024 tokens, through the kernels and not: pairs won by the kernels up
         * to the first they lose, which ends the line early, after one more pair at three
         * quarters of its count from 4 tokens on */
        cr_assert(n >= 2 && n % 2 == 0 && n <= 24, "%s: %s", specs[i], out);
        int won = 0;
        while (2 * won < n && v[2 * won] < v[2 * won + 1]) { ++won; }
        if (2 * won == n) {
            cr_assert_eq(n, 22, "every count won: %s: %s", specs[i], out);
        } else {
            cr_assert_eq(n / 2 - won - 1, won >= 2 ? 1 : 0, "%s: %s", specs[i], out);
        }
    }
}

/* An evaluation with a few-tokens Xgemm set beside the candidate's runs both (the child checks
 * a product on each side of the threshold before it times); a malformed set fails it. The
 * parameters it does not evaluate are CLBlast's defaults, not the device's profile: with the
 * AVX2 profile's direct kernel (64-wide tiles, 8-deep K steps) its first compile alone took the
 * child 105 s on a 2-core host, 30 s with the defaults. */
Test(clffn_tune, few_tokens_set_evaluated, .timeout = 120 + TEST_COLD_GEMM_BUILDS) {
    char cmd[1024], out[4096], err[4096], wide[128] = "", narrow[128] = "";
    for (int i = 0; i < 16; ++i) {
        const size_t n = strlen(wide), m = strlen(narrow);
        snprintf(wide + n, sizeof wide - n, "%s%zu", i ? "," : "", test_xgemm_wide[i]);
        snprintf(narrow + m, sizeof narrow - m, "%s%zu", i ? "," : "", test_xgemm_narrow[i]);
    }
    for (int i = 0; i < 2; ++i) {
        snprintf(cmd, sizeof cmd,
                 "CLFFN_NO_TUNING=1 '%s' --eval --xgemm %s --routine 0 --tokens 8 --d-model 64"
                 " --d-ff 128 --few 12:%s",
                 CLFFN_TUNE_PATH, wide, i ? "8,1,64" : narrow);
        const int rc = run_split(cmd, out, sizeof out, err, sizeof err);
        double t = 0;
        if (i == 0) {
            cr_assert_eq(rc, 0, "%s%s", out, err);
            cr_assert(sscanf(out, "%lf", &t) == 1 && t > 0, "%s%s", out, err);
        } else {
            cr_assert_eq(rc, 1, "%s%s", out, err);
        }
    }
}

Test(clffn_tune, damaged_profile_falls_back_and_opt_out) {
    make_dir();
    setenv("CLFFN_TUNE_DIR", dir, 1);
    clffn_context *ctx = test_context();
    char path[1300];
    ASSERT_OK(clffn_tuning_profile_path(clffn_context_cl_device(ctx), path, sizeof path));
    clffn_context_destroy(ctx);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs("{\"clblast\": {\"Xgemm\": {\"MWG\": \"lots\"}}", f); /* damaged */
    fclose(f);
    ctx = test_context();
    cr_assert(strncmp(clffn_context_tuning(ctx), "profile", 7) != 0, "%s",
              clffn_context_tuning(ctx));
    const size_t fallback_kb = clffn_context_gemm_k_block(ctx); /* the built-in profile's, or 0 */
    const size_t fallback_gemv = clffn_context_gemv_max_tokens(ctx);
    const size_t fallback_rows = clffn_context_gemm_k_block_min_rows(ctx);
    const clffn_layout fallback_layout = clffn_context_weight_layout(ctx);
    clffn_context_destroy(ctx);
    /* a clffn section with a misspelt name, a fraction, a negative number, or not an object:
     * the whole profile is refused, so no half of it takes effect */
    const char *bad_sections[] = {"{\"GEMM_K_BLOK\": 64}",
                                  "{\"GEMM_K_BLOCK\": 64.5}",
                                  "{\"GEMM_K_BLOCK\": -64}",
                                  "{\"GEMM_K_BLOCK\": \"64\"}",
                                  "64",
                                  "{\"GEMM_K_BLOCK\": 1e12}",
                                  "{\"GEMV_MAX_TOKENS\": -1}",
                                  "{\"GEMV_MAX_TOKENS\": 1e9}",
                                  "{\"GEMM_K_BLOCK_MIN_ROWS\": -5}",
                                  "{\"GEMM_K_BLOCK_MIN_ROWS\": 1e9}",
                                  "{\"WEIGHT_LAYOUT\": 2}",
                                  "{\"WEIGHT_LAYOUT\": \"in_out\"}",
                                  "{\"WEIGHT_LAYOUT\": 0, \"WEIGHT_LAYOUT\": -1}"};
    for (size_t i = 0; i < sizeof bad_sections / sizeof bad_sections[0]; ++i) {
        f = fopen(path, "w");
        cr_assert_not_null(f);
        fprintf(
            f, "{\"clblast\": {\"GemmRoutine\": {\"XGEMM_MIN_INDIRECT_SIZE\": 48}}, \"clffn\": %s}",
            bad_sections[i]);
        fclose(f);
        ctx = test_context();
        cr_assert(strstr(clffn_context_tuning(ctx), "could not be applied") != NULL, "%s: %s",
                  bad_sections[i], clffn_context_tuning(ctx));
        cr_assert_eq(clffn_context_gemm_k_block(ctx), fallback_kb, "%s", bad_sections[i]);
        cr_assert_eq(clffn_context_gemv_max_tokens(ctx), fallback_gemv, "%s", bad_sections[i]);
        cr_assert_eq(clffn_context_gemm_k_block_min_rows(ctx), fallback_rows, "%s",
                     bad_sections[i]);
        cr_assert_eq(clffn_context_weight_layout(ctx), fallback_layout, "%s", bad_sections[i]);
        clffn_context_destroy(ctx);
    }
    setenv("CLFFN_NO_TUNING", "1", 1);
    ctx = test_context();
    cr_assert(strncmp(clffn_context_tuning(ctx), "none", 4) == 0, "%s", clffn_context_tuning(ctx));
    cr_assert_eq(clffn_context_gemm_k_block(ctx), 0, "no profile, no blocking");
    cr_assert_eq(clffn_context_weight_layout(ctx), CLFFN_DEFAULT_WEIGHT_LAYOUT);
    clffn_context_destroy(ctx);
    unsetenv("CLFFN_NO_TUNING");
    char small[4];
    ASSERT_STATUS(clffn_tuning_profile_path(NULL, small, sizeof small), CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(clffn_tuning_dir(small, sizeof small), CLFFN_ERROR_BUFFER_TOO_SMALL);
    remove_dir();
}
