/* Which device clffn opens when none is named, on every platform the machine has: the rule on
 * lists made up here (every order of a GPU, POCL's CPU device and Mesa's llvmpipe), then the
 * real platforms through clffn-devices and the demo, whatever order the ICD loader gives them. */
#include "common.h"
#include "tools_common.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

static clffn_device_info fake(unsigned p, const char *platform, const char *name,
                              cl_device_type type, int supported) {
    clffn_device_info d;
    memset(&d, 0, sizeof d);
    d.platform_index = p;
    snprintf(d.platform_name, sizeof d.platform_name, "%s", platform);
    snprintf(d.name, sizeof d.name, "%s", name);
    d.type = type;
    d.supported = supported;
    d.software = !strncmp(name, "llvmpipe", 8);
    return d;
}

/* The name of the device the rule picks from devs[order[0]], devs[order[1]], … */
static const char *pick(const clffn_device_info *devs, const int *order, size_t n) {
    clffn_device_info list[4];
    for (size_t i = 0; i < n; ++i) { list[i] = devs[order[i]]; }
    size_t k = n;
    ASSERT_OK(clffn_devices_default(list, n, &k));
    cr_assert(k < n);
    return devs[order[k]].name;
}

Test(devices, default_rule_in_every_order) {
    const clffn_device_info devs[3] = {
        fake(0, "rusticl", "llvmpipe (LLVM 15.0.6, 256 bits)", CL_DEVICE_TYPE_CPU, 1),
        fake(1, "Portable Computing Language", "pthread-skylake-avx512", CL_DEVICE_TYPE_CPU, 1),
        fake(2, "NVIDIA CUDA", "NVIDIA H100 80GB HBM3", CL_DEVICE_TYPE_GPU, 1)};
    static const int orders[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2},
                                     {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    for (int o = 0; o < 6; ++o) {
        /* a GPU wins wherever it is; without one, POCL comes before llvmpipe either way */
        cr_assert_str_eq(pick(devs, orders[o], 3), devs[2].name, "order %d", o);
        int two[2], m = 0;
        for (int i = 0; i < 3; ++i) {
            if (orders[o][i] != 2) { two[m++] = orders[o][i]; }
        }
        cr_assert_str_eq(pick(devs, two, 2), devs[1].name, "order %d", o);
    }
    /* llvmpipe alone is still a device; an unsupported GPU is passed over; among equals the
     * first in list order */
    const int lone[1] = {0};
    cr_assert_str_eq(pick(devs, lone, 1), devs[0].name);
    const clffn_device_info more[3] = {
        fake(0, "old", "a GPU with OpenCL 1.1", CL_DEVICE_TYPE_GPU, 0),
        fake(1, "Portable Computing Language", "cpu one", CL_DEVICE_TYPE_CPU, 1),
        fake(2, "Portable Computing Language", "cpu two", CL_DEVICE_TYPE_CPU, 1)};
    const int in_order[3] = {0, 1, 2}, swapped[3] = {0, 2, 1};
    cr_assert_str_eq(pick(more, in_order, 3), "cpu one");
    cr_assert_str_eq(pick(more, swapped, 3), "cpu two");
    const int unsupported_only[1] = {0};
    cr_assert_str_eq(pick(more, unsupported_only, 1), more[0].name); /* opening it says why */
    size_t k = 7;
    cr_assert_eq(clffn_devices_default(devs, 0, &k), CLFFN_ERROR_DEVICE_NOT_FOUND);
    cr_assert_eq(clffn_devices_default(NULL, 2, &k), CLFFN_ERROR_NULL_ARGUMENT);
    cr_assert_eq(clffn_devices_default(devs, 3, NULL), CLFFN_ERROR_NULL_ARGUMENT);
    cr_assert_eq(k, 7);
}

/* The real platforms: clffn-devices marks one default, the one the rule picks from its own
 * list (independently of the library: the first GPU, else the first CPU device that is not
 * llvmpipe, else the first); with POCL and llvmpipe both present it is POCL's. The demo opens
 * it, and runs on every device named with --device. The demo on rusticl's llvmpipe, on a 2-core
 * AVX2 host beside a second suite, ran past 300 s. */
Test(devices, default_and_every_device_run, .timeout = 600) {
    static char out[65536], err[4096];
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' --json", CLFFN_DEVICES_PATH);
    cr_assert_eq(run_split(cmd, out, sizeof out, err, sizeof err), 0, "%s%s", out, err);
    cJSON *root = cJSON_Parse(out);
    cr_assert_not_null(root, "not JSON: %s%s", out, err);
    const cJSON *devs = cJSON_GetObjectItemCaseSensitive(root, "devices");
    const int n = cJSON_GetArraySize(devs);
    cr_assert(n >= 1, "%s", out);
    int marked = -1, gpu = -1, cpu = -1, pocl = 0, llvmpipe = 0;
    for (int i = 0; i < n; ++i) {
        const cJSON *d = cJSON_GetArrayItem(devs, i);
        const char *type = cJSON_GetObjectItemCaseSensitive(d, "type")->valuestring;
        const char *name = cJSON_GetObjectItemCaseSensitive(d, "name")->valuestring;
        const char *plat = cJSON_GetObjectItemCaseSensitive(d, "platform")->valuestring;
        const int soft = !strncmp(name, "llvmpipe", 8);
        cr_assert_eq(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(d, "software")), soft, "%s",
                     name);
        cr_assert(cJSON_IsBool(cJSON_GetObjectItemCaseSensitive(d, "denormals")));
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(d, "default"))) {
            cr_assert_eq(marked, -1, "two defaults: %s", out);
            marked = i;
        }
        if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(d, "supported"))) { continue; }
        if (gpu < 0 && !strcmp(type, "GPU") && !soft) { gpu = i; }
        if (cpu < 0 && !strcmp(type, "CPU") && !soft) { cpu = i; }
        pocl += !strcmp(plat, "Portable Computing Language");
        llvmpipe += soft;
    }
    const int expect = gpu >= 0 ? gpu : cpu >= 0 ? cpu : 0;
    cr_assert_eq(marked, expect, "%s", out);
    const cJSON *def = cJSON_GetArrayItem(devs, marked);
    const char *def_name = cJSON_GetObjectItemCaseSensitive(def, "name")->valuestring;
    if (pocl && llvmpipe && gpu < 0) {
        cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(def, "platform")->valuestring,
                         "Portable Computing Language", "%s", out);
    }
    /* the demo on the default device, then on each device by its index */
    static char demo[8192];
    snprintf(cmd, sizeof cmd, "env -u CLFFN_DEVICE '%s'", CLFFN_RUN_PATH);
    cr_assert_eq(run(cmd, demo, sizeof demo), 0, "%s", demo);
    char line[256];
    snprintf(line, sizeof line, "device:        %s\n", def_name);
    cr_assert(strstr(demo, line) != NULL, "default %s, demo said: %s", def_name, demo);
    for (int i = 0; i < n; ++i) {
        const cJSON *d = cJSON_GetArrayItem(devs, i);
        if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(d, "supported"))) { continue; }
        const char *index = cJSON_GetObjectItemCaseSensitive(d, "index")->valuestring;
        snprintf(cmd, sizeof cmd, "'%s' --device %s", CLFFN_RUN_PATH, index);
        cr_assert_eq(run(cmd, demo, sizeof demo), 0, "--device %s: %s", index, demo);
        snprintf(line, sizeof line, "device:        %s\n",
                 cJSON_GetObjectItemCaseSensitive(d, "name")->valuestring);
        cr_assert(strstr(demo, line) != NULL, "--device %s: %s", index, demo);
    }
    cJSON_Delete(root);
}

/* The context says whether its device keeps subnormals, as its single-precision config does:
 * the kernels' results on subnormals are defined by it (clffn.h). */
Test(devices, denormals_as_the_device_says) {
    clffn_context *ctx = test_context();
    cl_device_fp_config fp = 0;
    cr_assert_eq(clGetDeviceInfo(clffn_context_cl_device(ctx), CL_DEVICE_SINGLE_FP_CONFIG,
                                 sizeof fp, &fp, NULL),
                 CL_SUCCESS);
    cr_assert_eq(clffn_context_denormals(ctx), (fp & CL_FP_DENORM) != 0);
    cr_assert_eq(clffn_context_denormals(NULL), 0);
    clffn_context_destroy(ctx);
}
