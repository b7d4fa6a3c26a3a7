/* The context's settings and the tuning profiles that set them: the SGEMM's K-block, the weight
 * layout, the GEMV and few-token kernels' crossovers, the Xgemm sets, and the built-in profiles,
 * each read back after a setter or a profile, bad values refused without changing anything. */
#include "common.h"
#include "clffn_defs.h"
#include "tuning.h"

#include <clblast_c.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

/* A size setting of the context: a good value read back, one past `most` refused with
 * INVALID_SIZE leaving it, 0 taken, NULL refused and read as 0. */
static void assert_size_setting(clffn_context *ctx, clffn_status (*set)(clffn_context *, size_t),
                                size_t (*get)(const clffn_context *), size_t good, size_t most,
                                const char *what) {
    ASSERT_OK(set(ctx, good));
    cr_assert_eq(get(ctx), good, "%s", what);
    ASSERT_STATUS(set(ctx, most + 1), CLFFN_ERROR_INVALID_SIZE);
    cr_assert_eq(get(ctx), good, "%s", what);
    ASSERT_OK(set(ctx, 0));
    cr_assert_eq(get(ctx), 0, "%s", what);
    ASSERT_STATUS(set(NULL, good), CLFFN_ERROR_NULL_ARGUMENT);
    cr_assert_eq(get(NULL), 0, "%s", what);
}

/* The block is the context's: set, read back, bad values refused without changing it; the
 * rows threshold likewise. */
Test(settings, gemm_k_block_setting) {
    clffn_context *ctx = test_context();
    assert_size_setting(ctx, clffn_context_set_gemm_k_block, clffn_context_gemm_k_block, 192,
                        CLFFN_MAX_GEMM_K_BLOCK, "K-block");
    assert_size_setting(ctx, clffn_context_set_gemm_k_block_min_rows,
                        clffn_context_gemm_k_block_min_rows, 300, CLFFN_MAX_GEMM_K_BLOCK_MIN_ROWS,
                        "K-block rows");
    /* quantized inputs: off until asked for; any non-zero is on */
    cr_assert_eq(clffn_context_quantized_inputs(ctx), 0);
    ASSERT_OK(clffn_context_set_quantized_inputs(ctx, 7));
    cr_assert_eq(clffn_context_quantized_inputs(ctx), 1);
    ASSERT_OK(clffn_context_set_quantized_inputs(ctx, 0));
    cr_assert_eq(clffn_context_quantized_inputs(ctx), 0);
    ASSERT_STATUS(clffn_context_set_quantized_inputs(NULL, 1), CLFFN_ERROR_NULL_ARGUMENT);
    cr_assert_eq(clffn_context_quantized_inputs(NULL), 0);
    clffn_context_destroy(ctx);
}

/* A context on the suite's device with no tuning profile applied: the library's defaults. */
static clffn_context *untuned_context(void) {
    setenv("CLFFN_NO_TUNING", "1", 1);
    clffn_context *ctx = test_context();
    unsetenv("CLFFN_NO_TUNING");
    return ctx;
}

/* The layout uploads keep weights in is the context's: taken by the next upload, not by
 * weights already on the device; bad values change nothing. */
Test(settings, weight_layout_setting) {
    clffn_context *ctx = test_context();
    clffn_config c = clffn_config_default(24, 40);
    c.gated = 1;
    test_weights w;
    test_weights_make(&w, &c, CLFFN_LAYOUT_OUT_IN, 5);
    clffn_ffn *ffn = NULL;
    ASSERT_OK(clffn_ffn_create(ctx, &c, &ffn));
    for (int kept = 0; kept < 2; ++kept) {
        ASSERT_OK(clffn_context_set_weight_layout(ctx, (clffn_layout)kept));
        cr_assert_eq(clffn_context_weight_layout(ctx), (clffn_layout)kept);
        ASSERT_OK(clffn_ffn_upload_weights(ffn, CLFFN_LAYOUT_OUT_IN, &w.host));
        /* the other layout for later uploads: these weights stay as they were kept */
        ASSERT_OK(clffn_context_set_weight_layout(ctx, (clffn_layout)!kept));
        assert_host_forward(ffn, &c, &w, 5, kept ? "kept in_out" : "kept out_in");
    }
    ASSERT_STATUS(clffn_context_set_weight_layout(ctx, (clffn_layout)2),
                  CLFFN_ERROR_INVALID_LAYOUT);
    ASSERT_STATUS(clffn_context_set_weight_layout(ctx, (clffn_layout)-1),
                  CLFFN_ERROR_INVALID_LAYOUT);
    cr_assert_eq(clffn_context_weight_layout(ctx), CLFFN_LAYOUT_OUT_IN); /* the loop's last */
    ASSERT_STATUS(clffn_context_set_weight_layout(NULL, CLFFN_LAYOUT_OUT_IN),
                  CLFFN_ERROR_NULL_ARGUMENT);
    cr_assert_eq(clffn_context_weight_layout(NULL), CLFFN_DEFAULT_WEIGHT_LAYOUT);
    clffn_ffn_destroy(ffn);
    test_weights_free(&w);
    clffn_context_destroy(ctx);
    ctx = untuned_context();
    cr_assert_eq(clffn_context_weight_layout(ctx), CLFFN_DEFAULT_WEIGHT_LAYOUT);
    clffn_context_destroy(ctx);
}

/* The small-batch crossover is the context's too; with no profile saying otherwise it is one
 * token. */
Test(settings, gemv_max_tokens_setting) {
    clffn_context *ctx = test_context();
    assert_size_setting(ctx, clffn_context_set_gemv_max_tokens, clffn_context_gemv_max_tokens, 12,
                        CLFFN_MAX_GEMV_TOKENS, "GEMV crossover");
    clffn_context_destroy(ctx);
    ctx = untuned_context();
    cr_assert_eq(clffn_context_gemv_max_tokens(ctx), CLFFN_DEFAULT_GEMV_MAX_TOKENS);
    clffn_context_destroy(ctx);
}

/* clffn_context_set_xgemm takes whole sets by name in any order; a missing, repeated or unknown
 * name, a wrong count, a few-rows set without a main one, or a threshold too large changes
 * nothing. */
Test(settings, xgemm_sets_setting) {
    clffn_context *ctx = untuned_context();
    cr_assert_eq(clffn_context_xgemm_few_rows(ctx), 0);
    const char *const *n = test_xgemm_names;
    ASSERT_OK(clffn_context_set_xgemm(ctx, 16, n, test_xgemm_wide, test_xgemm_narrow, 40));
    cr_assert_eq(clffn_context_xgemm_few_rows(ctx), 40);
    const char *swapped[16], *repeated[16], *unknown[16];
    size_t wide_swapped[16];
    for (int i = 0; i < 16; ++i) {
        swapped[i] = n[15 - i], wide_swapped[i] = test_xgemm_wide[15 - i];
        repeated[i] = unknown[i] = n[i];
    }
    repeated[3] = n[2], unknown[7] = "NDIMX";
    ASSERT_OK(clffn_context_set_xgemm(ctx, 16, swapped, wide_swapped, wide_swapped, 41));
    cr_assert_eq(clffn_context_xgemm_few_rows(ctx), 41);
    const size_t *w = test_xgemm_wide;
    ASSERT_STATUS(clffn_context_set_xgemm(ctx, 16, repeated, w, w, 9),
                  CLFFN_ERROR_INVALID_ARGUMENT);
    ASSERT_STATUS(clffn_context_set_xgemm(ctx, 16, unknown, w, NULL, 9),
                  CLFFN_ERROR_INVALID_ARGUMENT);
    ASSERT_STATUS(clffn_context_set_xgemm(ctx, 15, n, w, w, 9), CLFFN_ERROR_INVALID_ARGUMENT);
    ASSERT_STATUS(clffn_context_set_xgemm(ctx, 16, n, NULL, w, 9), CLFFN_ERROR_INVALID_ARGUMENT);
    ASSERT_STATUS(clffn_context_set_xgemm(ctx, 16, NULL, w, w, 9), CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(clffn_context_set_xgemm(ctx, 16, n, w, w, CLFFN_MAX_XGEMM_FEW_ROWS + 1),
                  CLFFN_ERROR_INVALID_SIZE);
    ASSERT_STATUS(clffn_context_set_xgemm(NULL, 16, n, w, w, 9), CLFFN_ERROR_NULL_ARGUMENT);
    cr_assert_eq(clffn_context_xgemm_few_rows(ctx), 41, "a refused call changed the context");
    ASSERT_OK(clffn_context_set_xgemm(ctx, 16, n, w, NULL, 41)); /* no few set: no threshold */
    cr_assert_eq(clffn_context_xgemm_few_rows(ctx), 0);
    ASSERT_OK(clffn_context_set_xgemm(ctx, 0, NULL, NULL, NULL, 0)); /* none of its own */
    cr_assert_eq(clffn_context_xgemm_few_rows(NULL), 0);
    clffn_context_destroy(ctx);
}

/* A profile's few-rows set comes with its threshold and a main set, or the profile is damaged
 * (and the device falls back to what it has without the file, saying so) rather than half
 * applied. */
Test(settings, xgemm_few_rows_profile) {
    char dir[] = "/tmp/clffn-few-XXXXXX", path[1400];
    test_profile_dir(dir, path, sizeof path);
    clffn_context *ctx = test_context();
    const size_t fallback = clffn_context_xgemm_few_rows(ctx); /* the built-in's, if any */
    clffn_context_destroy(ctx);
    const char *xg = "{\"GEMMK\":0,\"KREG\":1,\"KWG\":64,\"KWI\":8,\"MDIMA\":4,\"MDIMC\":4,"
                     "\"MWG\":128,\"NDIMB\":1,\"NDIMC\":1,\"NWG\":8,\"SA\":0,\"SB\":0,"
                     "\"STRM\":0,\"STRN\":1,\"VWM\":16,\"VWN\":8}";
    char good[1200], no_rows[1200], no_set[1200], no_main[1200];
    snprintf(good, sizeof good,
             "{\"clblast\":{\"Xgemm\":%s},\"clblast_few_rows\":{\"Xgemm\":%s},"
             "\"clffn\":{\"XGEMM_FEW_ROWS\":48}}",
             xg, xg);
    snprintf(no_rows, sizeof no_rows,
             "{\"clblast\":{\"Xgemm\":%s},\"clblast_few_rows\":{\"Xgemm\":%s}}", xg, xg);
    snprintf(no_set, sizeof no_set, "{\"clblast\":{\"Xgemm\":%s},\"clffn\":{\"XGEMM_FEW_ROWS\":4}}",
             xg);
    snprintf(
        no_main, sizeof no_main,
        "{\"clblast\":{},\"clblast_few_rows\":{\"Xgemm\":%s},\"clffn\":{\"XGEMM_FEW_ROWS\":4}}",
        xg);
    const char *texts[4] = {good, no_rows, no_set, no_main};
    for (int i = 0; i < 4; ++i) {
        test_write_text(path, texts[i]);
        ctx = test_context();
        const char *applied = clffn_context_tuning(ctx);
        if (i == 0) {
            cr_assert(strncmp(applied, "profile", 7) == 0, "not applied: %s", applied);
            cr_assert_eq(clffn_context_xgemm_few_rows(ctx), 48);
        } else {
            cr_assert(strstr(applied, "could not be applied"), "text %d: %s", i, applied);
            cr_assert_eq(clffn_context_xgemm_few_rows(ctx), fallback, "text %d", i);
        }
        clffn_context_destroy(ctx);
    }
    test_profile_dir_end(dir, path);
}

/* The built-in profile a device matches: what a context applies where no profile file is. */
Test(settings, builtin_profile_of_the_device) {
    char dir[] = "/tmp/clffn-builtin-XXXXXX";
    cr_assert(mkdtemp(dir));
    setenv("CLFFN_TUNE_DIR", dir, 1);
    unsetenv("CLFFN_NO_TUNING");
    cr_assert_null(clffn_tuning_builtin_profile(NULL));
    clffn_context *ctx = test_context();
    const cl_device_id dev = clffn_context_cl_device(ctx);
    const char *b = clffn_tuning_builtin_profile(dev);
    cr_assert_eq(b != NULL, clffn_tuning_has_profile(dev) == 2);
    cr_assert_eq(b != NULL, !strcmp(clffn_context_tuning(ctx), "built-in profile"), "%s",
                 clffn_context_tuning(ctx));
    cr_assert_eq(b, clffn__builtin_profile(dev));
    clffn_context_destroy(ctx);
    rmdir(dir);
}

/* Which built-in profile a device's names pick: POCL names an AMD EPYC with AVX-512 after the
 * Skylake target it compiles for, so the vendor in the name, not the target, tells Intel's
 * cores (rows grouped from 512 floats) from AMD's (the context's default boundary). Both run
 * the kernels at every count, f32's over weights kept [out, in] too. AVX2 targets (a Zen 3 EPYC
 * that POCL calls "haswell", client Skylake: not "skylake-avx512") share one profile of their
 * own, which runs f32's kernels at every count too but compressed ones to 192 tokens (48 with
 * quantized inputs) below the large products; a target without AVX2 gets none. */
Test(settings, builtin_profile_by_name) {
    enum { NONE = -1, AMD512, INTEL512, AVX2 };
    static const struct {
        const char *name;
        int kind;
    } cases[] = {
        {"pthread-skylake-avx512-Intel(R) Xeon(R) Processor", INTEL512},
        {"pthread-cooperlake-Intel(R) Xeon(R) Gold 6348", INTEL512},
        {"pthread-skylake-avx512-AMD EPYC 9R14 96-Core Processor", AMD512},
        {"pthread-znver4-AMD EPYC 9654", AMD512},
        {"pthread-haswell-AMD EPYC", AVX2},
        {"pthread-haswell-Intel(R) Core(TM) i7", AVX2},
        {"pthread-znver3-AMD Ryzen 7 5800X 8-Core Processor", AVX2},
        {"pthread-skylake-Intel(R) Core(TM) i5-6500 CPU @ 3.20GHz", AVX2},
        {"pthread-sandybridge-Intel(R) Xeon(R) CPU E5-2670 0 @ 2.60GHz", NONE},
    };
    const char *avx2 = clffn__builtin_profile_for("Portable Computing Language", "haswell");
    cr_assert_not_null(avx2);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        const char *json = clffn__builtin_profile_for("Portable Computing Language", cases[i].name);
        if (cases[i].kind == NONE) {
            cr_assert_null(json, "%s", cases[i].name);
            continue;
        }
        cr_assert_not_null(json, "%s", cases[i].name);
        cr_assert_eq(json == avx2, cases[i].kind == AVX2, "%s", cases[i].name);
        const char *f32 = "\"WEIGHT_LAYOUT\":0,\"KERNEL_MAX_TOKENS_F32\":1073741824,";
        const char *f32_avx2 = "\"KERNEL_MAX_TOKENS_F32\":1073741824,\"WEIGHT_LAYOUT\":0,";
        if (cases[i].kind == AVX2) {
            cr_assert(strstr(json, f32_avx2) != NULL, "%s: %s", cases[i].name, json);
            cr_assert(strstr(json, "\"KERNEL_MAX_TOKENS\":256,") != NULL, "%s", json);
            cr_assert(strstr(json, "\"KERNEL_MAX_TOKENS_QX\":192,") != NULL, "%s", json);
            cr_assert(strstr(json, "\"KERNEL_MAX_TOKENS_LARGE\":1073741824,") != NULL, "%s", json);
            cr_assert(strstr(json, "\"KERNEL_MAX_TOKENS_BLOCKS\":1073741824,") != NULL, "%s", json);
            cr_assert(strstr(json, "\"WGEMV_ROW_GROUP_COLS\":4097,") != NULL, "%s", json);
            continue;
        }
        const int grouped = strstr(json, "\"WGEMV_ROW_GROUP_COLS\":") != NULL;
        cr_assert_eq(grouped, cases[i].kind == INTEL512, "%s", cases[i].name);
        cr_assert(!grouped || strstr(json, "\"WGEMV_ROW_GROUP_COLS\":512") != NULL, "%s", json);
        const char *crossovers =
            "\"KERNEL_MAX_TOKENS\":1073741824,\"KERNEL_MAX_TOKENS_LARGE\":1073741824,";
        cr_assert(strstr(json, crossovers) != NULL, "%s: %s", cases[i].name, json);
        cr_assert(strstr(json, "\"KERNEL_MAX_TOKENS_QX\":1073741824,") != NULL, "%s", json);
        cr_assert(strstr(json, f32) != NULL, "%s: %s", cases[i].name, json);
    }
    /* llvmpipe's: the tiled SGEMM from 204^3 with the AVX2 set, the direct kernel CLBlast's */
    const char *lp = clffn__builtin_profile_for("rusticl", "llvmpipe (LLVM 15.0.6, 256 bits)");
    cr_assert_not_null(lp);
    cr_assert(strstr(lp, "\"XGEMM_MIN_INDIRECT_SIZE\":204") && strstr(lp, "\"MWG\":128,"), "%s",
              lp);
    cr_assert_null(strstr(lp, "XgemmDirect"), "%s", lp);
    cr_assert_null(clffn__builtin_profile_for("Portable Computing Language", "llvmpipe"));
}

/* A number of a profile's section, which every built-in profile holds. */
static size_t param(const cJSON *obj, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    cr_assert(cJSON_IsNumber(v), "%s", key);
    return (size_t)v->valuedouble;
}

/* The local memory a profile's CLBlast kernels take for their tiles, in bytes: Xgemm's tiles of A
 * and B where SA and SB put them there, XgemmDirect's two padded WGD-square tiles (CLBlast's
 * formulas, src/tuning/kernels/xgemm.hpp and xgemm_direct.hpp), the most of either section; of
 * the sections named in `which` (1 Xgemm, 2 XgemmDirect). */
static size_t profile_tiles_bytes(const char *json, int which) {
    cJSON *o = cJSON_Parse(json);
    cr_assert_not_null(o, "%s", json);
    size_t most = 0;
    const char *sections[] = {"clblast", "clblast_few_rows"};
    for (int i = 0; i < 2; ++i) {
        const cJSON *sec = cJSON_GetObjectItemCaseSensitive(o, sections[i]);
        const cJSON *g = cJSON_GetObjectItemCaseSensitive(sec, "Xgemm");
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(sec, "XgemmDirect");
        if (g && (which & 1)) {
            const size_t kwg = param(g, "KWG");
            const size_t n =
                param(g, "SA") * kwg * param(g, "MWG") + param(g, "SB") * kwg * param(g, "NWG");
            most = n > most ? n : most;
        }
        if (d && (which & 2)) {
            const size_t wgd = param(d, "WGD");
            const size_t n = wgd * (wgd + param(d, "PADA")) + wgd * (wgd + param(d, "PADB"));
            most = n > most ? n : most;
        }
    }
    cJSON_Delete(o);
    return most * sizeof(float);
}

/* Tiles that fill a device's whole local memory leave its kernels none for the rest: CLBlast
 * refuses them (the AVX2 profile's 32 KiB direct tiles on llvmpipe's 32 KiB), a limit of that
 * device, not a broken profile; any other refusal fails. CLBlast keeps a process's overrides for
 * the device, so a profile without direct parameters (llvmpipe's) runs with the last ones set. */
static void assert_local_memory_refusal(cl_device_id dev, const char *json, const char *direct,
                                        size_t i) {
    cl_ulong local = 0;
    clGetDeviceInfo(dev, CL_DEVICE_LOCAL_MEM_SIZE, sizeof local, &local, NULL);
    size_t tiles = profile_tiles_bytes(json, 1);
    const size_t dt = direct ? profile_tiles_bytes(direct, 2) : 0;
    tiles = dt > tiles ? dt : tiles;
    cr_assert_geq(tiles, local, "built-in profile %zu", i);
    cr_log_info("built-in profile %zu: its tiles take %zu bytes of local memory, the device has "
                "%lu: not run here",
                i, tiles, (unsigned long)local);
}

/* Every built-in profile (POCL's, the H100's, ...) is accepted whole by CLBlast and computes the
 * FFN right on the device at hand, so a typo or a parameter set that breaks a kernel shows on
 * POCL in CI, not first on the machine the profile is for. Each text is written as this device's
 * profile file; the forward runs at 1 token (the GEMVs), 37 (the direct kernel, or the tiled
 * one, by the profile's crossover; a few-rows Xgemm set's side) and 130 (above the few-rows
 * threshold, 128 on POCL), then with the crossover moved so the tiled kernel takes every
 * product. */
Test(settings, every_builtin_profile_computes_here, .timeout = 300 + 2 * TEST_COLD_GEMM_BUILDS) {
    char dir[] = "/tmp/clffn-builtin-XXXXXX", path[1400];
    cr_assert(mkdtemp(dir));
    setenv("CLFFN_TUNE_DIR", dir, 1);
    unsetenv("CLFFN_NO_TUNING");
    clffn_config c = clffn_config_default(48, 160);
    c.activation = CLFFN_ACT_GELU;
    c.gated = 1;
    test_weights w;
    test_weights_make(&w, &c, CLFFN_LAYOUT_OUT_IN, 23);
    const char *last = NULL, *direct = NULL; /* the last profile that set XgemmDirect */
    size_t checked = 0;
    for (size_t i = 0; clffn__builtin_profile_at(i); ++i) {
        const char *json = clffn__builtin_profile_at(i);
        if (json == last) { continue; } /* one text, several device names */
        last = json;
        clffn_context *ctx = test_context();
        const cl_device_id dev = clffn_context_cl_device(ctx);
        ASSERT_OK(clffn_tuning_profile_path(dev, path, sizeof path));
        FILE *f = fopen(path, "wb");
        cr_assert(f);
        fputs(json, f);
        fclose(f);
        clffn_context_destroy(ctx);
        ctx = test_context(); /* opens the device again: the file is applied now */
        cr_assert(strncmp(clffn_context_tuning(ctx), "profile", 7) == 0,
                  "built-in profile %zu was not applied: %s", i, clffn_context_tuning(ctx));
        /* the profile's CLBlast parameters at every count, where its f32 crossover would hand
         * 37 and 130 tokens to clffn's kernels */
        ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, CLFFN_KERNELS_F32, 0));
        clffn_ffn *ffn = NULL;
        ASSERT_OK(clffn_ffn_create(ctx, &c, &ffn));
        ASSERT_OK(clffn_ffn_upload_weights(ffn, CLFFN_LAYOUT_OUT_IN, &w.host));
        float *probe = calloc(2 * 37 * c.d_model, sizeof *probe);
        cr_assert_not_null(probe);
        const clffn_status st = clffn_forward_host(ffn, 37, probe, 37 * c.d_model,
                                                   probe + 37 * c.d_model, 37 * c.d_model);
        free(probe);
        if (strstr(json, "\"XgemmDirect\"")) { direct = json; }
        if (st == (clffn_status)CLBlastInvalidLocalMemUsage) {
            assert_local_memory_refusal(dev, json, direct, i);
            clffn_ffn_destroy(ffn);
            clffn_context_destroy(ctx);
            remove(path);
            continue;
        }
        ASSERT_OK(st);
        char what[64];
        snprintf(what, sizeof what, "built-in profile %zu, 1 token", i);
        assert_host_forward(ffn, &c, &w, 1, what);
        snprintf(what, sizeof what, "built-in profile %zu, 37 tokens", i);
        assert_host_forward(ffn, &c, &w, 37, what);
        snprintf(what, sizeof what, "built-in profile %zu, 130 tokens", i);
        assert_host_forward(ffn, &c, &w, 130, what);
        const char *name = "XGEMM_MIN_INDIRECT_SIZE";
        const size_t one = 1;
        cr_assert_eq(
            CLBlastOverrideParameters(dev, "GemmRoutine", CLBlastPrecisionSingle, 1, &name, &one),
            CLBlastSuccess);
        snprintf(what, sizeof what, "built-in profile %zu, 37 tokens, tiled", i);
        assert_host_forward(ffn, &c, &w, 37, what);
        clffn_ffn_destroy(ffn);
        clffn_context_destroy(ctx);
        remove(path);
        ++checked;
    }
    cr_assert_geq(checked, 2, "the POCL and H100 profiles at least");
    test_weights_free(&w);
    rmdir(dir);
    unsetenv("CLFFN_TUNE_DIR");
}

/* A profile's few-token crossovers, each class's own: the quantized inputs', the large
 * products' and q8_0's and q4_0's blocks' where given, else the compressed one, with the large
 * products' threshold; a profile
 * without them, or no profile, gives the defaults; a count past any forward's, a negative or a
 * fractional value damages the profile. The setter takes any count (past
 * CLFFN_MAX_KERNEL_TOKENS the kernels run in passes). */
Test(settings, kernel_crossovers_from_a_profile) {
    char dir[] = "/tmp/clffn-cross-XXXXXX", path[1400];
    test_profile_dir(dir, path, sizeof path);
    static const char *const texts[8] = {
        "{\"clblast\":{},\"clffn\":{\"KERNEL_MAX_TOKENS\":100,\"KERNEL_MAX_TOKENS_QX\":5000,"
        "\"KERNEL_MAX_TOKENS_F32\":3,\"KERNEL_MAX_TOKENS_LARGE\":300,"
        "\"KERNEL_MAX_TOKENS_BLOCKS\":700,\"KERNEL_LARGE_WEIGHTS\":5000000000}}",
        "{\"clblast\":{},\"clffn\":{\"KERNEL_MAX_TOKENS\":40}}",
        "{\"clblast\":{}}",
        "{\"clblast\":{},\"clffn\":{\"KERNEL_MAX_TOKENS_QX\":-1}}",
        "{\"clblast\":{},\"clffn\":{\"KERNEL_MAX_TOKENS\":2e9}}",
        "{\"clblast\":{},\"clffn\":{\"KERNEL_LARGE_WEIGHTS\":-4}}",
        "{\"clblast\":{},\"clffn\":{\"KERNEL_MAX_TOKENS_LARGE\":0.5}}",
        "{\"clblast\":{},\"clffn\":{\"KERNEL_MAX_TOKENS_BLOCKS\":-2}}"};
    enum { GOOD = 3, TEXTS = sizeof texts / sizeof texts[0] };
    /* per class (clffn_kernel_class), then the large products' threshold */
    static const size_t want[GOOD][6] = {
        {3, 100, 5000, 300, 700, 5000000000},
        {CLFFN_DEFAULT_KERNEL_MAX_TOKENS_F32, 40, 40, 40, 40, CLFFN_DEFAULT_KERNEL_LARGE_WEIGHTS},
        {CLFFN_DEFAULT_KERNEL_MAX_TOKENS_F32, CLFFN_DEFAULT_KERNEL_MAX_TOKENS,
         CLFFN_DEFAULT_KERNEL_MAX_TOKENS, CLFFN_DEFAULT_KERNEL_MAX_TOKENS,
         CLFFN_DEFAULT_KERNEL_MAX_TOKENS, CLFFN_DEFAULT_KERNEL_LARGE_WEIGHTS}};
    for (int i = 0; i < TEXTS; ++i) {
        test_write_text(path, texts[i]);
        clffn_context *ctx = test_context();
        const char *applied = clffn_context_tuning(ctx);
        if (i < GOOD) {
            cr_assert(strncmp(applied, "profile", 7) == 0, "text %d not applied: %s", i, applied);
            for (int k = 0; k < 5; ++k) {
                cr_assert_eq(clffn_context_kernel_max_tokens(ctx, k), want[i][k], "text %d, %d", i,
                             k);
            }
            cr_assert_eq(clffn_context_kernel_large_weights(ctx), want[i][5], "text %d", i);
        } else {
            cr_assert(strstr(applied, "could not be applied"), "text %d: %s", i, applied);
        }
        clffn_context_destroy(ctx);
    }
    setenv("CLFFN_NO_TUNING", "1", 1); /* no profile at all: the defaults */
    clffn_context *ctx = test_context();
    unsetenv("CLFFN_NO_TUNING");
    for (int k = 0; k < 5; ++k) {
        cr_assert_eq(clffn_context_kernel_max_tokens(ctx, k), want[GOOD - 1][k], "no profile, %d",
                     k);
    }
    cr_assert_eq(clffn_context_kernel_large_weights(ctx), CLFFN_DEFAULT_KERNEL_LARGE_WEIGHTS);
    ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, CLFFN_KERNELS_QUANTIZED, SIZE_MAX));
    cr_assert_eq(clffn_context_kernel_max_tokens(ctx, CLFFN_KERNELS_QUANTIZED), SIZE_MAX);
    ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, 7, 33)); /* nonzero: compressed */
    cr_assert_eq(clffn_context_kernel_max_tokens(ctx, CLFFN_KERNELS_COMPRESSED), 33);
    /* the compressed crossover sets the large products' and the blocks' too; theirs alone
     * leaves it */
    cr_assert_eq(clffn_context_kernel_max_tokens(ctx, CLFFN_KERNELS_COMPRESSED_LARGE), 33);
    cr_assert_eq(clffn_context_kernel_max_tokens(ctx, CLFFN_KERNELS_BLOCKS), 33);
    ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, CLFFN_KERNELS_COMPRESSED_LARGE, 50));
    ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, CLFFN_KERNELS_BLOCKS, 60));
    cr_assert_eq(clffn_context_kernel_max_tokens(ctx, CLFFN_KERNELS_COMPRESSED_LARGE), 50);
    cr_assert_eq(clffn_context_kernel_max_tokens(ctx, CLFFN_KERNELS_BLOCKS), 60);
    cr_assert_eq(clffn_context_kernel_max_tokens(ctx, CLFFN_KERNELS_COMPRESSED), 33);
    ASSERT_OK(clffn_context_set_kernel_large_weights(ctx, 77));
    cr_assert_eq(clffn_context_kernel_large_weights(ctx), 77);
    ASSERT_STATUS(clffn_context_set_kernel_max_tokens(NULL, 1, 4), CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(clffn_context_set_kernel_large_weights(NULL, 4), CLFFN_ERROR_NULL_ARGUMENT);
    cr_assert_eq(clffn_context_kernel_max_tokens(NULL, 1), 0);
    cr_assert_eq(clffn_context_kernel_large_weights(NULL), 0);
    clffn_context_destroy(ctx);
    test_profile_dir_end(dir, path);
}

/* y of T tokens through an f16 gated FFN, 1088 -> 96 (W1 and V: 192 rows of 1088 values, W2: 1088
 * rows of 96), its row kernels grouping rows from `group` floats of x. */
static void grouped_forward(clffn_context *ctx, size_t group, size_t T, float *y, double *ref) {
    clffn_config c = clffn_config_default(1088, 96);
    c.gated = 1, c.activation = CLFFN_ACT_SILU;
    test_weights w;
    typed_set ts;
    test_weights_make(&w, &c, CLFFN_LAYOUT_OUT_IN, 31);
    typed_make(&ts, &c, &w, CLFFN_DTYPE_F16, CLFFN_LAYOUT_OUT_IN);
    ASSERT_OK(clffn_context_set_row_group_cols(ctx, group));
    clffn_ffn *ffn = NULL;
    ASSERT_OK(clffn_ffn_create(ctx, &c, &ffn));
    ASSERT_OK(clffn_ffn_upload_weights_typed(ffn, CLFFN_LAYOUT_OUT_IN, &ts.typed));
    float *x = malloc(T * c.d_model * sizeof *x);
    cr_assert(x);
    fill_uniform(x, T * c.d_model, -1, 1, 77 + T);
    ASSERT_OK(clffn_forward_host(ffn, T, x, T * c.d_model, y, T * c.d_model));
    ASSERT_OK(clffn_reference_forward(&c, CLFFN_LAYOUT_OUT_IN, &ts.ref, T, x, 0, 0, 0, ref, NULL));
    free(x);
    clffn_ffn_destroy(ffn);
    typed_free(&ts);
    test_weights_free(&w);
}

/* "WGEMV_ROW_GROUP_COLS": where a CPU's row kernels take rows several a work-item. A profile's
 * value is applied, none gives CLFFN_DEFAULT_ROW_GROUP_COLS, a negative or fractional one
 * damages the profile; the setter's value is read back, NULL refused. The rows going one (a
 * boundary past any x) or several (every x) a work-item, at 1, 3 and 8 tokens (rows in fours,
 * then in twos on a CPU), both match the reference. On a CPU (a work-item a row) the rows in
 * fours differ from the rows one by one in some bits, their sums added in another order: the
 * boundary took effect. */
Test(settings, row_group_from_a_profile, .timeout = 300) {
    char dir[] = "/tmp/clffn-group-XXXXXX", path[1400];
    test_profile_dir(dir, path, sizeof path);
    static const char *const texts[4] = {
        "{\"clblast\":{},\"clffn\":{\"WGEMV_ROW_GROUP_COLS\":1024}}", "{\"clblast\":{}}",
        "{\"clblast\":{},\"clffn\":{\"WGEMV_ROW_GROUP_COLS\":-1}}",
        "{\"clblast\":{},\"clffn\":{\"WGEMV_ROW_GROUP_COLS\":0.5}}"};
    static const size_t want[2] = {1024, CLFFN_DEFAULT_ROW_GROUP_COLS};
    for (int i = 0; i < 4; ++i) {
        test_write_text(path, texts[i]);
        clffn_context *ctx = test_context();
        const char *applied = clffn_context_tuning(ctx);
        if (i < 2) {
            cr_assert(strncmp(applied, "profile", 7) == 0, "text %d not applied: %s", i, applied);
            cr_assert_eq(clffn_context_row_group_cols(ctx), want[i], "text %d", i);
        } else {
            cr_assert(strstr(applied, "could not be applied"), "text %d: %s", i, applied);
        }
        clffn_context_destroy(ctx);
    }
    test_profile_dir_end(dir, path);
    clffn_context *ctx = test_context();
    ASSERT_OK(clffn_context_set_row_group_cols(ctx, 0));
    cr_assert_eq(clffn_context_row_group_cols(ctx), 0);
    ASSERT_STATUS(clffn_context_set_row_group_cols(NULL, 1), CLFFN_ERROR_NULL_ARGUMENT);
    cr_assert_eq(clffn_context_row_group_cols(NULL), 0);
    size_t shape[CLFFN_WGEMV_PARAMS];
    clffn_context_wgemv(ctx, shape);
    cl_device_type type = 0;
    cr_assert_eq(
        clGetDeviceInfo(clffn_context_cl_device(ctx), CL_DEVICE_TYPE, sizeof type, &type, NULL),
        CL_SUCCESS);
    const int groups = (type & CL_DEVICE_TYPE_CPU) && shape[0] == 1;
    static const size_t counts[3] = {1, 3, 8};
    for (int i = 0; i < 3; ++i) {
        const size_t T = counts[i], n = T * 1088;
        float *one = malloc(n * sizeof *one), *several = malloc(n * sizeof *several);
        double *ref = malloc(n * sizeof *ref);
        cr_assert(one && several && ref);
        grouped_forward(ctx, SIZE_MAX, T, one, ref);
        grouped_forward(ctx, 1, T, several, ref);
        char what[64];
        snprintf(what, sizeof what, "%zu tokens, rows one a work-item", T);
        assert_close(one, ref, n, act_rtol(CLFFN_ACT_SILU), what);
        snprintf(what, sizeof what, "%zu tokens, rows grouped", T);
        assert_close(several, ref, n, act_rtol(CLFFN_ACT_SILU), what);
        if (groups && T <= 4) {
            cr_assert(memcmp(one, several, n * sizeof *one) != 0, "%s: same bits", what);
        }
        free(one), free(several), free(ref);
    }
    clffn_context_destroy(ctx);
}
