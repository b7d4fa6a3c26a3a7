/* clffn-devices: every OpenCL platform and device, as a table or one JSON document; with
 * --check, a small FFN on each device against the CPU reference.
 *
 * Exit status: 0 success (and, with --check, every supported device passed), 1 no platform or a
 * device failed, 2 usage. */
#define CLFFN_HOOKS /* the CPU reference, for --check */
#include "clffn.h"
#include "common.h"
#include "options.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const NO_PLATFORM =
    "clffn-devices: no OpenCL platform is installed; for the CPU, install POCL "
    "(`sudo apt-get install pocl-opencl-icd`) or your GPU vendor's OpenCL driver.\n";

typedef struct check_result {
    int ran, pass;
    double max_err, tol, seconds;
    clffn_status status;
} check_result;

/* A gated GELU FFN of odd size (so no tile happens to fit) on one device, against the reference. */
static check_result check_device(const clffn_device_info *d) {
    enum { T = 37, D = 72, F = 200 };
    check_result r = {1, 0, 0.0, 0.0, 0.0, CLFFN_SUCCESS};
    clffn_context *ctx = NULL;
    clffn_ffn *ffn = NULL;
    clffn_config c = clffn_config_default(D, F);
    c.activation = CLFFN_ACT_GELU;
    c.gated = 1;
    static float w[3 * D * F + 2 * F + D], x[T * D], y[T * D];
    static double ref[T * D];
    const clffn_weight_arrays wa = {
        w, w + 3 * D * F, w + D * F, w + 3 * D * F + F, w + 2 * D * F, w + 3 * D * F + 2 * F};
    const clffn_host_weights hw = {wa.w1, wa.b1, wa.v, wa.bv, wa.w2, wa.b2};
    char spec[32];
    snprintf(spec, sizeof spec, "%u:%u", d->platform_index, d->device_index);
    const double t0 = tool_now_s();
    clffn_status st = clffn_context_create_for_device(spec, &ctx);
    if (st == CLFFN_SUCCESS) { st = clffn_ffn_create(ctx, &c, &ffn); }
    if (st == CLFFN_SUCCESS) {
        st = clffn_init_weights_host(&c, CLFFN_INIT_TORCH_LINEAR, 7, CLFFN_LAYOUT_OUT_IN, &wa);
    }
    if (st == CLFFN_SUCCESS) { st = clffn_ffn_upload_weights(ffn, CLFFN_LAYOUT_OUT_IN, &hw); }
    for (size_t i = 0; i < T * D; ++i) { x[i] = (float)sin(0.37 * (double)i); }
    if (st == CLFFN_SUCCESS) { st = clffn_forward_host(ffn, T, x, T * D, y, T * D); }
    r.seconds = tool_now_s() - t0;
    if (st == CLFFN_SUCCESS) {
        st = clffn_reference_forward(&c, CLFFN_LAYOUT_OUT_IN, &hw, T, x, 0, 0, 0, ref, NULL);
    }
    r.status = st;
    if (st == CLFFN_SUCCESS) {
        const tool_comparison cmp = tool_compare(y, ref, T * D, 1e-5, 1e-6);
        r.max_err = cmp.max_err;
        r.tol = cmp.tol;
        r.pass = cmp.pass;
    }
    clffn_ffn_destroy(ffn);
    clffn_context_destroy(ctx);
    return r;
}

static double mib(cl_ulong b) { return (double)b / (1024.0 * 1024.0); }

/* Whether clffn-tune's profile (or a built-in one) exists for the device. */
static const char *tuning_of(const clffn_device_info *d) {
    switch (clffn_tuning_has_profile(d->device)) {
    case 1: return "profile";
    case 2: return "built-in";
    default: return "none";
    }
}

/* The position of the device clffn opens when none is named, or n when there is none. */
static size_t default_index(const clffn_device_info *ds, size_t n) {
    size_t k = n;
    return clffn_devices_default(ds, n, &k) == CLFFN_SUCCESS ? k : n;
}

static void print_table(const clffn_device_info *ds, size_t n, const check_result *checks) {
    const size_t def = default_index(ds, n);
    for (size_t i = 0; i < n; ++i) {
        const clffn_device_info *d = &ds[i];
        if (i == 0 || d->platform_index != ds[i - 1].platform_index) {
            printf("%sPlatform %u: %s\n", i ? "\n" : "", d->platform_index, d->platform_name);
        }
        printf("  [%u:%u] %s%s\n", d->platform_index, d->device_index, d->name,
               i == def ? "   (the default device)" : "");
        printf("        vendor          %s\n", d->vendor);
        printf("        type            %s\n", clffn_device_type_name(d->type));
        printf("        driver          %s\n", d->driver_version);
        printf("        OpenCL          %s; %s\n", d->device_version, d->opencl_c_version);
        printf("        compute units   %u at %u MHz\n", d->compute_units, d->clock_mhz);
        printf("        global memory   %.0f MiB (max allocation %.0f MiB)\n",
               mib(d->global_mem_bytes), mib(d->max_alloc_bytes));
        printf("        local memory    %.0f KiB\n", (double)d->local_mem_bytes / 1024.0);
        printf("        max work-group  %zu\n", d->max_work_group_size);
        printf("        fp16 / fp64     %s / %s\n", d->fp16 ? "yes" : "no", d->fp64 ? "yes" : "no");
        printf("        subnormals      %s\n", d->denormals ? "kept" : "flushed to zero");
        if (d->software) { printf("        software        a GPU driver run on the CPU\n"); }
        printf("        tuning          %s\n", tuning_of(d));
        printf("        usable by clffn %s\n",
               d->supported ? "yes" : "no (needs OpenCL 1.2 and an online compiler)");
        if (checks && checks[i].ran) {
            const check_result *r = &checks[i];
            if (r->status != CLFFN_SUCCESS) {
                printf("        check           FAIL: %s\n", clffn_status_string(r->status));
            } else {
                printf("        check           %s: max error %.3g (tolerance %.3g), %.3f s\n",
                       r->pass ? "PASS" : "FAIL", r->max_err, r->tol, r->seconds);
            }
        }
    }
}

static int print_json(const clffn_device_info *ds, size_t n, const check_result *checks) {
    cJSON *root = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(root, "devices");
    cJSON_AddStringToObject(root, "clffn_version", clffn_version_string());
    const size_t def = default_index(ds, n);
    for (size_t i = 0; i < n; ++i) {
        const clffn_device_info *d = &ds[i];
        cJSON *o = cJSON_CreateObject();
        char index[32];
        snprintf(index, sizeof index, "%u:%u", d->platform_index, d->device_index);
        cJSON_AddStringToObject(o, "index", index);
        cJSON_AddStringToObject(o, "platform", d->platform_name);
        cJSON_AddStringToObject(o, "name", d->name);
        cJSON_AddStringToObject(o, "vendor", d->vendor);
        cJSON_AddStringToObject(o, "type", clffn_device_type_name(d->type));
        cJSON_AddStringToObject(o, "driver_version", d->driver_version);
        cJSON_AddStringToObject(o, "device_version", d->device_version);
        cJSON_AddStringToObject(o, "opencl_c_version", d->opencl_c_version);
        cJSON_AddNumberToObject(o, "compute_units", d->compute_units);
        cJSON_AddNumberToObject(o, "clock_mhz", d->clock_mhz);
        cJSON_AddNumberToObject(o, "global_mem_bytes", (double)d->global_mem_bytes);
        cJSON_AddNumberToObject(o, "local_mem_bytes", (double)d->local_mem_bytes);
        cJSON_AddNumberToObject(o, "max_alloc_bytes", (double)d->max_alloc_bytes);
        cJSON_AddNumberToObject(o, "max_work_group_size", (double)d->max_work_group_size);
        cJSON_AddBoolToObject(o, "fp16", d->fp16);
        cJSON_AddBoolToObject(o, "fp64", d->fp64);
        cJSON_AddBoolToObject(o, "supported", d->supported);
        cJSON_AddBoolToObject(o, "denormals", d->denormals);
        cJSON_AddBoolToObject(o, "software", d->software);
        cJSON_AddBoolToObject(o, "default", i == def);
        cJSON_AddStringToObject(o, "tuning", tuning_of(d));
        if (checks && checks[i].ran) {
            cJSON *c = cJSON_AddObjectToObject(o, "check");
            cJSON_AddBoolToObject(c, "pass", checks[i].status == CLFFN_SUCCESS && checks[i].pass);
            cJSON_AddStringToObject(c, "status", clffn_status_string(checks[i].status));
            cJSON_AddNumberToObject(c, "max_error", checks[i].max_err);
            cJSON_AddNumberToObject(c, "tolerance", checks[i].tol);
            cJSON_AddNumberToObject(c, "seconds", checks[i].seconds);
        }
        cJSON_AddItemToArray(arr, o);
    }
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    if (!s) {
        fprintf(stderr, "clffn-devices: out of memory\n");
        return 1;
    }
    puts(s);
    free(s);
    return 0;
}

enum { OPT_JSON = 256, OPT_CHECK };

static const tool_option OPTIONS[] = {
    {"json", OPT_JSON, TOOL_FLAG, NULL, "one JSON document instead of the table"},
    {"check", OPT_CHECK, TOOL_FLAG, NULL,
     "run a small FFN on every device against the CPU reference"},
    {0},
};

static const tool_cli CLI = {
    "clffn-devices",
    "[--json] [--check]",
    "Exit status: 0 success (with --check, every usable device passed), 1 no platform or a\n"
    "device failed, 2 usage.\n",
    OPTIONS,
};

static int tool_main(int argc, char **argv) {
    int json = 0, check = 0;
    tool_parser p = tool_parser_start(&CLI, argc, argv);
    for (int key; (key = tool_next(&p)) > 0;) {
        json |= key == OPT_JSON;
        check |= key == OPT_CHECK;
    }
    if (p.status >= 0) { return p.status; }
    size_t n = 0;
    clffn_status st = clffn_devices_list(NULL, 0, &n);
    if (st == CLFFN_PLATFORM_NOT_FOUND) {
        fputs(NO_PLATFORM, stderr);
        return 1;
    }
    if (st != CLFFN_SUCCESS) {
        fprintf(stderr, "clffn-devices: listing devices failed: %s\n", clffn_status_string(st));
        return 1;
    }
    clffn_device_info *ds = calloc(n ? n : 1, sizeof *ds);
    check_result *checks = check ? calloc(n ? n : 1, sizeof *checks) : NULL;
    if (!ds || (check && !checks)) {
        fprintf(stderr, "clffn-devices: out of memory\n");
        return 1;
    }
    if ((st = clffn_devices_list(ds, n, &n)) != CLFFN_SUCCESS) {
        fprintf(stderr, "clffn-devices: listing devices failed: %s\n", clffn_status_string(st));
        return 1;
    }
    int failed = 0;
    for (size_t i = 0; check && i < n; ++i) {
        if (!ds[i].supported) { continue; }
        checks[i] = check_device(&ds[i]);
        failed |= checks[i].status != CLFFN_SUCCESS || !checks[i].pass;
    }
    int rc = 0;
    if (json) {
        rc = print_json(ds, n, checks);
    } else {
        if (n == 0) { printf("No OpenCL devices.\n"); }
        print_table(ds, n, checks);
    }
    free(ds);
    free(checks);
    return rc ? rc : failed;
}

int main(int argc, char **argv) { return tool_exit("clffn-devices", tool_main(argc, argv)); }
