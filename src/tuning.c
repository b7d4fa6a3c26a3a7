/* Tuning profiles: CLBlast's GEMM parameters per device.
 *
 * CLBlast ships tuned parameters for many GPUs but none for POCL, and has no per-device cache of
 * its own, so clffn keeps one: a JSON file per (platform, device, driver) under
 * $CLFFN_TUNE_DIR, else $XDG_CACHE_HOME/clffn, else ~/.cache/clffn, written by clffn-tune. When a
 * context opens a device, the device's file is applied through CLBlastOverrideParameters; without
 * one, a built-in profile measured for the device family (POCL on x86-64, Mesa's llvmpipe,
 * NVIDIA's H100 and H200) is applied; otherwise CLBlast's own database decides. Set
 * CLFFN_NO_TUNING=1 to skip all of this. */
#include "tuning.h"

#include "clffn_defs.h"
#include "devices.h"

#include <cjson/cJSON.h>
#include <clblast_c.h>
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* Built-in profiles, from clffn-tune on the machines named (see docs/PERFORMANCE.md) */

typedef struct builtin_profile {
    const char *platform_substr; /* matched case-sensitively against the platform name */
    const char *device_substr;   /* and the device name */
    const char *json;            /* the profile, in the format clffn-tune writes */
} builtin_profile;

#include "tuning_builtin.h"

/* ------------------------------------------------------------------------------------------ */
/* Where profiles live */

static void sanitize(const char *in, char *out, size_t size) {
    size_t n = 0;
    for (; *in && n + 1 < size; ++in) {
        const unsigned char c = (unsigned char)*in;
        out[n++] = (char)(isalnum(c) || c == '.' || c == '-' ? c : '_');
    }
    out[n] = '\0';
}

clffn_status clffn_tuning_dir(char *buf, size_t size) {
    if (!buf) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if (size == 0) { return CLFFN_ERROR_INVALID_SIZE; }
    const char *dir = getenv("CLFFN_TUNE_DIR"), *xdg = getenv("XDG_CACHE_HOME"),
               *home = getenv("HOME");
    int n;
    if (dir && *dir) {
        n = snprintf(buf, size, "%s", dir);
    } else if (xdg && *xdg) {
        n = snprintf(buf, size, "%s/clffn", xdg);
    } else if (home && *home) {
        n = snprintf(buf, size, "%s/.cache/clffn", home);
    } else {
        return CLFFN_ERROR_INVALID_ARGUMENT; /* nowhere to look */
    }
    return n >= 0 && (size_t)n < size ? CLFFN_SUCCESS : CLFFN_ERROR_BUFFER_TOO_SMALL;
}

clffn_status clffn_tuning_profile_path(cl_device_id device, char *buf, size_t size) {
    if (!device || !buf) { return CLFFN_ERROR_NULL_ARGUMENT; }
    char dir[1024], platform[256], name[256], driver[256], a[128], b[128], c[96];
    clffn_status st = clffn_tuning_dir(dir, sizeof dir);
    if (st != CLFFN_SUCCESS) { return st; }
    clffn__device_strings(device, platform, name, driver, sizeof platform);
    sanitize(platform, a, sizeof a);
    sanitize(name, b, sizeof b);
    sanitize(driver, c, sizeof c);
    const int n = snprintf(buf, size, "%s/%s__%s__%s.json", dir, a, b, c);
    return n >= 0 && (size_t)n < size ? CLFFN_SUCCESS : CLFFN_ERROR_BUFFER_TOO_SMALL;
}

/* ------------------------------------------------------------------------------------------ */
/* Applying a profile */

/* A whole number in [0, max], or -1. */
static double whole_in(const cJSON *p, double max) {
    if (!cJSON_IsNumber(p) || p->valuedouble < 0 || p->valuedouble > max ||
        p->valuedouble != (double)(size_t)p->valuedouble) {
        return -1.0;
    }
    return p->valuedouble;
}

/* clffn's own values where no profile sets them ("applied" is left alone). */
static void own_defaults(clffn_tuning *t) {
    t->gemm_k_block = 0;
    t->gemv_max_tokens = CLFFN_DEFAULT_GEMV_MAX_TOKENS;
    t->gemm_k_block_min_rows = 0;
    t->weight_layout = CLFFN_DEFAULT_WEIGHT_LAYOUT;
    t->xgemm.have = 0;
    t->xgemm_few.have = 0;
    t->xgemm_few_rows = 0;
    t->kernel_max_tokens[0] = CLFFN_DEFAULT_KERNEL_MAX_TOKENS_F32;
    t->kernel_max_tokens[1] = CLFFN_DEFAULT_KERNEL_MAX_TOKENS;
    t->kernel_max_tokens[2] = CLFFN_DEFAULT_KERNEL_MAX_TOKENS;
    t->kernel_max_tokens[3] = CLFFN_DEFAULT_KERNEL_MAX_TOKENS;
    t->kernel_max_tokens[4] = CLFFN_DEFAULT_KERNEL_MAX_TOKENS;
    t->kernel_large_weights = CLFFN_DEFAULT_KERNEL_LARGE_WEIGHTS;
    t->row_group_cols = CLFFN_DEFAULT_ROW_GROUP_COLS;
    memset(t->wgemv, 0, sizeof t->wgemv);
    t->fused_epilogues = -1;
}

const char *const clffn__wgemv_names[CLFFN_WGEMV_PARAMS] = {
    "WGEMV_ROW_SPLIT", "WGEMV_ROW_ROWS", "WGEMV_COL_WIDTH", "WGEMV_COL_SPLIT", "WGEMV_COL_GROUPS"};

static bool pow2_upto(size_t v, size_t max) { return v >= 1 && v <= max && !(v & (v - 1)); }

bool clffn__wgemv_valid(const size_t p[CLFFN_WGEMV_PARAMS], size_t max_wg) {
    const size_t width = p[2];
    const bool width_ok = width == 8 || width == 16 || (width % 32 == 0 && width && width <= 256);
    return pow2_upto(p[0], 256) && p[1] >= 1 && p[1] <= 256 && width_ok && pow2_upto(p[3], 256) &&
           p[4] >= 1 && p[4] <= 256 &&
           (!max_wg || (p[0] * p[1] <= max_wg && p[3] * p[4] <= max_wg));
}

/* One of the "clffn" section's kernel shapes or crossovers: 1 taken, 0 not one of them, -1 a
 * bad value. */
static int take_kernel_value(const cJSON *p, clffn_tuning *out) {
    for (int i = 0; i < CLFFN_WGEMV_PARAMS; ++i) {
        if (strcmp(p->string, clffn__wgemv_names[i])) { continue; }
        const double v = whole_in(p, 256);
        if (v < 1) { return -1; }
        out->wgemv[i] = (size_t)v;
        return 1;
    }
    static const char *const crossovers[CLFFN_KERNEL_CLASSES] = {
        "KERNEL_MAX_TOKENS_F32", "KERNEL_MAX_TOKENS", "KERNEL_MAX_TOKENS_QX",
        "KERNEL_MAX_TOKENS_LARGE", "KERNEL_MAX_TOKENS_BLOCKS"};
    for (int i = 0; i < CLFFN_KERNEL_CLASSES; ++i) {
        if (strcmp(p->string, crossovers[i])) { continue; }
        const double v = whole_in(p, CLFFN_KERNEL_MAX_TOKENS_MOST);
        if (v < 0) { return -1; }
        out->kernel_max_tokens[i] = (size_t)v;
        return 1;
    }
    if (!strcmp(p->string, "WGEMV_ROW_GROUP_COLS")) {
        const double v = whole_in(p, CLFFN_KERNEL_MAX_TOKENS_MOST);
        if (v < 0) { return -1; }
        out->row_group_cols = (size_t)v;
        return 1;
    }
    if (!strcmp(p->string, "KERNEL_LARGE_WEIGHTS")) {
        const double v = whole_in(p, 9007199254740992.0); /* 2^53: any size a double holds */
        if (v < 0 || v > (double)SIZE_MAX) { return -1; }
        out->kernel_large_weights = (size_t)v;
        return 1;
    }
    return 0;
}

/* Takes a parsed profile's own values, keeping what *out says was applied. */
static void own_take(clffn_tuning *out, const clffn_tuning *own) {
    char applied[sizeof out->applied];
    memcpy(applied, out->applied, sizeof applied);
    *out = *own;
    memcpy(out->applied, applied, sizeof applied);
}

/* The profile's own "clffn" section: {"GEMM_K_BLOCK": n, "GEMM_K_BLOCK_MIN_ROWS": n,
 * "GEMV_MAX_TOKENS": n, "WEIGHT_LAYOUT": n, "XGEMM_FEW_ROWS": n, "FUSED_EPILOGUES": 0|1}
 * (clffn__sgemm's inner-dimension block, 0 for none; the fewest token rows a product needs to
 * be blocked; the most tokens that run as matrix-vector products; the clffn_layout uploads keep
 * weights in; the row count below which products run with the "clblast_few_rows" Xgemm set, 0
 * for none; whether few-token products apply the epilogues), with the kernels' shapes and
 * crossovers (take_kernel_value). A missing name keeps its default (own_defaults); an unknown
 * name or a bad value makes the whole profile invalid, so a typo is reported instead of
 * silently doing nothing. */
static clffn_status parse_clffn_section(const cJSON *root, clffn_tuning *out) {
    own_defaults(out);
    const cJSON *sec = cJSON_GetObjectItemCaseSensitive(root, "clffn");
    if (!sec) { return CLFFN_SUCCESS; }
    if (!cJSON_IsObject(sec)) { return CLFFN_ERROR_INVALID_ARGUMENT; }
    const cJSON *p;
    cJSON_ArrayForEach(p, sec) {
        double v;
        const int kernel = take_kernel_value(p, out);
        if (kernel < 0) { return CLFFN_ERROR_INVALID_ARGUMENT; }
        if (kernel > 0) { continue; }
        if (!strcmp(p->string, "GEMM_K_BLOCK") &&
            (v = whole_in(p, (double)CLFFN_MAX_GEMM_K_BLOCK)) >= 0) {
            out->gemm_k_block = (size_t)v;
        } else if (!strcmp(p->string, "GEMV_MAX_TOKENS") &&
                   (v = whole_in(p, (double)CLFFN_MAX_GEMV_TOKENS)) >= 0) {
            out->gemv_max_tokens = (size_t)v;
        } else if (!strcmp(p->string, "GEMM_K_BLOCK_MIN_ROWS") &&
                   (v = whole_in(p, (double)CLFFN_MAX_GEMM_K_BLOCK_MIN_ROWS)) >= 0) {
            out->gemm_k_block_min_rows = (size_t)v;
        } else if (!strcmp(p->string, "XGEMM_FEW_ROWS") &&
                   (v = whole_in(p, (double)CLFFN_MAX_XGEMM_FEW_ROWS)) >= 0) {
            out->xgemm_few_rows = (size_t)v;
        } else if (!strcmp(p->string, "FUSED_EPILOGUES") && (v = whole_in(p, 1)) >= 0) {
            out->fused_epilogues = (int)v;
        } else if (!strcmp(p->string, "WEIGHT_LAYOUT") &&
                   (v = whole_in(p, (double)CLFFN_LAYOUT_IN_OUT)) >= 0) {
            out->weight_layout = v > 0 ? CLFFN_LAYOUT_IN_OUT : CLFFN_LAYOUT_OUT_IN;
        } else {
            return CLFFN_ERROR_INVALID_ARGUMENT;
        }
    }
    static const char *const follow[3] = {"KERNEL_MAX_TOKENS_QX", "KERNEL_MAX_TOKENS_LARGE",
                                          "KERNEL_MAX_TOKENS_BLOCKS"};
    for (int i = 0; i < 3; ++i) { /* where the profile gives none: the compressed one */
        if (!cJSON_GetObjectItemCaseSensitive(sec, follow[i])) {
            out->kernel_max_tokens[2 + i] = out->kernel_max_tokens[1];
        }
    }
    /* the kernel shapes come all together or not at all, each within its range */
    size_t given = 0;
    for (int i = 0; i < CLFFN_WGEMV_PARAMS; ++i) { given += out->wgemv[i] != 0; }
    if (given && (given < CLFFN_WGEMV_PARAMS || !clffn__wgemv_valid(out->wgemv, 0))) {
        return CLFFN_ERROR_INVALID_ARGUMENT;
    }
    return CLFFN_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Xgemm parameter sets, and which one each device has */

const char *const clffn__xgemm_names[CLFFN_XGEMM_PARAMS] = {
    "GEMMK", "KREG", "KWG", "KWI", "MDIMA", "MDIMC", "MWG", "NDIMB",
    "NDIMC", "NWG",  "SA",  "SB",  "STRM",  "STRN",  "VWM", "VWN"};

clffn_status clffn__xgemm_set_from(size_t n, const char *const *names, const size_t *values,
                                   clffn_xgemm_set *out) {
    if (!names || !values || !out) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if (n != CLFFN_XGEMM_PARAMS) { return CLFFN_ERROR_INVALID_ARGUMENT; }
    clffn_xgemm_set set = {1, {0}};
    unsigned seen = 0;
    for (size_t i = 0; i < n; ++i) {
        size_t j = 0;
        while (j < CLFFN_XGEMM_PARAMS && (!names[i] || strcmp(names[i], clffn__xgemm_names[j]))) {
            ++j;
        }
        if (j == CLFFN_XGEMM_PARAMS || (seen & (1u << j))) { return CLFFN_ERROR_INVALID_ARGUMENT; }
        seen |= 1u << j;
        set.values[j] = values[i];
    }
    *out = set;
    return CLFFN_SUCCESS;
}

/* One device's lock and the set clffn last applied to it. Entries are never removed: a device
 * id that comes back is the same key in CLBlast's own cache of overrides. */
struct clffn_xgemm_hold {
    cl_device_id device;
    pthread_mutex_t lock;
    int known; /* values is what the device has */
    size_t values[CLFFN_XGEMM_PARAMS];
};

#define MAX_XGEMM_DEVICES 64
static pthread_mutex_t xgemm_table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct clffn_xgemm_hold xgemm_devices[MAX_XGEMM_DEVICES];
static size_t xgemm_n_devices;
/* shared by devices beyond the table: never known, so every product applies its set */
static struct clffn_xgemm_hold xgemm_overflow = {NULL, PTHREAD_MUTEX_INITIALIZER, 0, {0}};
static unsigned long xgemm_n_changes;

static struct clffn_xgemm_hold *xgemm_entry(cl_device_id device) {
    pthread_mutex_lock(&xgemm_table_lock);
    struct clffn_xgemm_hold *e = &xgemm_overflow;
    size_t i = 0;
    while (i < xgemm_n_devices && xgemm_devices[i].device != device) { ++i; }
    if (i < xgemm_n_devices) {
        e = &xgemm_devices[i];
    } else if (i < MAX_XGEMM_DEVICES && pthread_mutex_init(&xgemm_devices[i].lock, NULL) == 0) {
        e = &xgemm_devices[i];
        e->device = device;
        e->known = 0;
        xgemm_n_devices = i + 1;
    }
    pthread_mutex_unlock(&xgemm_table_lock);
    return e;
}

clffn_status clffn__xgemm_hold(cl_device_id device, const clffn_xgemm_set *set,
                               clffn_xgemm_hold **held) {
    *held = NULL;
    struct clffn_xgemm_hold *e = xgemm_entry(device);
    pthread_mutex_lock(&e->lock);
    if (!e->known || memcmp(e->values, set->values, sizeof e->values) != 0) {
        const CLBlastStatusCode cs =
            CLBlastOverrideParameters(device, "Xgemm", CLBlastPrecisionSingle, CLFFN_XGEMM_PARAMS,
                                      (const char **)clffn__xgemm_names, set->values);
        pthread_mutex_lock(&xgemm_table_lock);
        ++xgemm_n_changes;
        pthread_mutex_unlock(&xgemm_table_lock);
        e->known = cs == CLBlastSuccess && e != &xgemm_overflow;
        if (cs != CLBlastSuccess) {
            pthread_mutex_unlock(&e->lock);
            return (clffn_status)cs;
        }
        memcpy(e->values, set->values, sizeof e->values);
    }
    *held = e;
    return CLFFN_SUCCESS;
}

void clffn__xgemm_release(clffn_xgemm_hold *held) {
    if (held) { pthread_mutex_unlock(&held->lock); }
}

unsigned long clffn__xgemm_changes(void) {
    pthread_mutex_lock(&xgemm_table_lock);
    const unsigned long n = xgemm_n_changes;
    pthread_mutex_unlock(&xgemm_table_lock);
    return n;
}

/* A profile's {"PARAM": value, ...} for Xgemm into *out. */
static clffn_status xgemm_from_json(const cJSON *k, clffn_xgemm_set *out) {
    const char *names[CLFFN_XGEMM_PARAMS];
    size_t values[CLFFN_XGEMM_PARAMS], n = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, k) {
        if (n == CLFFN_XGEMM_PARAMS || !cJSON_IsNumber(p) || p->valuedouble < 0 ||
            p->valuedouble > 1e9) {
            return CLFFN_ERROR_INVALID_ARGUMENT;
        }
        names[n] = p->string;
        values[n++] = (size_t)p->valuedouble;
    }
    return cJSON_IsObject(k) ? clffn__xgemm_set_from(n, names, values, out)
                             : CLFFN_ERROR_INVALID_ARGUMENT;
}

/* "clblast_few_rows": {"Xgemm": {...}}, which must come with "XGEMM_FEW_ROWS" > 0 and a main
 * Xgemm set to return to (and neither without it), so that a half-written pair is reported. */
static clffn_status parse_few_rows(const cJSON *root, const cJSON *kernels, clffn_tuning *own) {
    const cJSON *few = cJSON_GetObjectItemCaseSensitive(root, "clblast_few_rows");
    const int main_set = cJSON_GetObjectItemCaseSensitive(kernels, "Xgemm") != NULL;
    if (!few) { return own->xgemm_few_rows == 0 ? CLFFN_SUCCESS : CLFFN_ERROR_INVALID_ARGUMENT; }
    if (!cJSON_IsObject(few) || cJSON_GetArraySize(few) != 1 || !main_set ||
        own->xgemm_few_rows == 0) {
        return CLFFN_ERROR_INVALID_ARGUMENT;
    }
    return xgemm_from_json(cJSON_GetObjectItemCaseSensitive(few, "Xgemm"), &own->xgemm_few);
}

/* Applies {"clblast": {"Kernel": {"PARAM": value, …}, …}, "clblast_few_rows": {"Xgemm": {…}},
 * "clffn": {…}}: every kernel's parameters at once, since CLBlast wants a kernel's full set, and
 * the clffn section and both Xgemm sets into *own. Returns the first refusal, if any; the clffn
 * section and the few-rows set are checked before anything reaches CLBlast. Xgemm goes through
 * clffn__xgemm_hold, so that contexts switching sets know what the device has. */
static clffn_status apply_json(cl_device_id device, const char *text, int trusted,
                               clffn_tuning *own) {
    cJSON *root = cJSON_Parse(text);
    /* cJSON says NULL for bad JSON and for no memory alike; our own built-in text is valid JSON,
     * so its failing to parse can only be the latter */
    if (!root) { return trusted ? CLFFN_ERROR_OUT_OF_HOST_MEMORY : CLFFN_ERROR_INVALID_ARGUMENT; }
    const cJSON *kernels = cJSON_GetObjectItemCaseSensitive(root, "clblast");
    clffn_status st =
        cJSON_IsObject(kernels) ? parse_clffn_section(root, own) : CLFFN_ERROR_INVALID_ARGUMENT;
    if (st == CLFFN_SUCCESS) { st = parse_few_rows(root, kernels, own); }
    const cJSON *k;
    cJSON_ArrayForEach(k, kernels) {
        if (st != CLFFN_SUCCESS) { break; }
        const int n = cJSON_GetArraySize(k);
        if (!cJSON_IsObject(k) || n <= 0 || n > 64) {
            st = CLFFN_ERROR_INVALID_ARGUMENT;
            break;
        }
        if (!strcmp(k->string, "Xgemm")) {
            clffn_xgemm_hold *held = NULL;
            st = xgemm_from_json(k, &own->xgemm);
            if (st == CLFFN_SUCCESS) { st = clffn__xgemm_hold(device, &own->xgemm, &held); }
            clffn__xgemm_release(held);
            continue;
        }
        const char *names[64];
        size_t values[64];
        int i = 0;
        const cJSON *p;
        cJSON_ArrayForEach(p, k) {
            if (!cJSON_IsNumber(p) || p->valuedouble < 0 || p->valuedouble > 1e9) {
                st = CLFFN_ERROR_INVALID_ARGUMENT;
                break;
            }
            names[i] = p->string;
            values[i++] = (size_t)p->valuedouble;
        }
        if (st == CLFFN_SUCCESS) {
            const CLBlastStatusCode cs = CLBlastOverrideParameters(
                device, k->string, CLBlastPrecisionSingle, (size_t)i, names, values);
            if (cs != CLBlastSuccess) { st = (clffn_status)cs; }
        }
    }
    cJSON_Delete(root);
    return st;
}

const char *clffn__builtin_profile_for(const char *platform, const char *name) {
    for (size_t i = 0; i < sizeof builtin_profiles / sizeof builtin_profiles[0]; ++i) {
        if (strstr(platform, builtin_profiles[i].platform_substr) &&
            strstr(name, builtin_profiles[i].device_substr)) {
            return builtin_profiles[i].json;
        }
    }
    return NULL;
}

const char *clffn__builtin_profile(cl_device_id device) {
    char platform[256], name[256], driver[256];
    clffn__device_strings(device, platform, name, driver, sizeof platform);
    return clffn__builtin_profile_for(platform, name);
}

const char *clffn__builtin_profile_at(size_t i) {
    return i < sizeof builtin_profiles / sizeof builtin_profiles[0] ? builtin_profiles[i].json
                                                                    : NULL;
}

const char *clffn_tuning_builtin_profile(cl_device_id device) {
    return device ? clffn__builtin_profile(device) : NULL;
}

int clffn_tuning_has_profile(cl_device_id device) {
    if (!device) { return 0; }
    char path[1200];
    if (clffn_tuning_profile_path(device, path, sizeof path) == CLFFN_SUCCESS) {
        FILE *f = fopen(path, "rb");
        if (f) {
            fclose(f);
            return 1;
        }
    }
    return clffn__builtin_profile(device) ? 2 : 0;
}

/* CLBlast 1.5 fills its built-in parameter database on the first Database it constructs, without
 * a lock: threads whose first CLBlast routines start together (tensor-parallel shards on one
 * device, and no tuning profile to apply first) copied it while it was being filled, and got
 * std::length_error or std::bad_alloc (seen on rusticl, docs/RELIABILITY.md). An override with
 * no parameters constructs that Database and is refused before it stores anything; done once,
 * here, under a lock, before any of clffn's contexts runs CLBlast. */
static void clblast_database_init(cl_device_id device) {
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static int done;
    pthread_mutex_lock(&lock);
    if (!done) {
        (void)CLBlastOverrideParameters(device, "Xgemm", CLBlastPrecisionSingle, 0, NULL, NULL);
        done = 1;
    }
    pthread_mutex_unlock(&lock);
}

clffn_status clffn__tuning_apply(cl_device_id device, clffn_tuning *out) {
    clblast_database_init(device);
    own_defaults(out);
    const char *off = getenv("CLFFN_NO_TUNING");
    if (off && *off && strcmp(off, "0") != 0) {
        snprintf(out->applied, sizeof out->applied, "none (CLFFN_NO_TUNING is set)");
        return CLFFN_SUCCESS;
    }
    char path[1200];
    clffn_tuning own;
    const char *skipped = NULL; /* a profile file that exists but was not applied */
    if (clffn_tuning_profile_path(device, path, sizeof path) == CLFFN_SUCCESS) {
        int oom;
        char *text = clffn__read_text(path, 1 << 20, &oom); /* profiles are small */
        if (oom) { return CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
        if (text) {
            const clffn_status st = apply_json(device, text, 0, &own);
            free(text);
            if (st == CLFFN_SUCCESS) {
                own_take(out, &own);
                snprintf(out->applied, sizeof out->applied, "profile %s", path);
                return CLFFN_SUCCESS;
            }
            /* a damaged or stale file must not stop the device from working: fall through,
             * and say so */
            skipped = path;
        }
    }
    const char *builtin = clffn__builtin_profile(device);
    const clffn_status st =
        builtin ? apply_json(device, builtin, 1, &own) : CLFFN_ERROR_INVALID_ARGUMENT;
    if (st == CLFFN_ERROR_OUT_OF_HOST_MEMORY) { return st; }
    if (st == CLFFN_SUCCESS) { own_take(out, &own); }
    snprintf(out->applied, sizeof out->applied, "%s%s%s%s",
             st == CLFFN_SUCCESS ? "built-in profile" : "none (CLBlast's defaults)",
             skipped ? " (" : "", skipped ? skipped : "",
             skipped ? " could not be applied: damaged, stale, or no memory to parse it)" : "");
    return CLFFN_SUCCESS;
}
