/* Device enumeration: every device of every platform, with what a user picking one wants to
 * know (ggml's backend listing is the model), and the capability checks behind its "supported"
 * column and behind opening a context. The host-level device choice uses it too. */
#include "devices.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* Capabilities */

int clffn__parse_cl_version(const char *s, int *major, int *minor) {
    if (!s || strncmp(s, "OpenCL ", 7) != 0) { return 0; }
    return sscanf(s + 7, "%d.%d", major, minor) == 2;
}

clffn_status clffn__device_caps_check(const clffn_device_caps *caps) {
    if (!caps) { return CLFFN_ERROR_NULL_ARGUMENT; }
    const int v = caps->version_major * 100 + caps->version_minor;
    if (!caps->available || !caps->compiler_available || v < 102) {
        return CLFFN_ERROR_DEVICE_UNSUPPORTED;
    }
    return CLFFN_SUCCESS;
}

clffn_status clffn__device_caps_query(cl_device_id device, clffn_device_caps *caps) {
    char version[256] = {0};
    cl_bool compiler = CL_FALSE, available = CL_FALSE;
    cl_int err = clGetDeviceInfo(device, CL_DEVICE_VERSION, sizeof version - 1, version, NULL);
    if (err == CL_SUCCESS) {
        err =
            clGetDeviceInfo(device, CL_DEVICE_COMPILER_AVAILABLE, sizeof compiler, &compiler, NULL);
    }
    if (err == CL_SUCCESS) {
        err = clGetDeviceInfo(device, CL_DEVICE_AVAILABLE, sizeof available, &available, NULL);
    }
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    caps->version_major = caps->version_minor = 0;
    clffn__parse_cl_version(version, &caps->version_major, &caps->version_minor);
    caps->compiler_available = compiler == CL_TRUE;
    caps->available = available == CL_TRUE;
    return CLFFN_SUCCESS;
}

void clffn__device_strings(cl_device_id device, char *platform, char *name, char *driver,
                           size_t size) {
    cl_platform_id p = NULL;
    platform[0] = name[0] = driver[0] = '\0';
    if (clGetDeviceInfo(device, CL_DEVICE_PLATFORM, sizeof p, &p, NULL) == CL_SUCCESS) {
        clGetPlatformInfo(p, CL_PLATFORM_NAME, size - 1, platform, NULL);
    }
    clGetDeviceInfo(device, CL_DEVICE_NAME, size - 1, name, NULL);
    clGetDeviceInfo(device, CL_DRIVER_VERSION, size - 1, driver, NULL);
    platform[size - 1] = name[size - 1] = driver[size - 1] = '\0';
}

/* ------------------------------------------------------------------------------------------ */
/* Enumeration */

size_t clffn_device_info_size(void) { return sizeof(clffn_device_info); }

const char *clffn_device_type_name(cl_device_type type) {
    if (type & CL_DEVICE_TYPE_GPU) { return "GPU"; }
    if (type & CL_DEVICE_TYPE_CPU) { return "CPU"; }
    if (type & CL_DEVICE_TYPE_ACCELERATOR) { return "accelerator"; }
#ifdef CL_DEVICE_TYPE_CUSTOM
    if (type & CL_DEVICE_TYPE_CUSTOM) { return "custom"; }
#endif
    return "other";
}

/* A device string, truncated to buf; an unanswered query leaves it empty. Returns 0 only when
 * out of memory. */
static int info_string(cl_device_id d, cl_device_info what, char *buf, size_t size) {
    buf[0] = '\0';
    size_t need = 0;
    if (clGetDeviceInfo(d, what, 0, NULL, &need) != CL_SUCCESS || need == 0) { return 1; }
    char *tmp = malloc(need + 1);
    if (!tmp) { return 0; }
    if (clGetDeviceInfo(d, what, need, tmp, NULL) == CL_SUCCESS) {
        tmp[need] = '\0';
        strncpy(buf, tmp, size - 1);
        buf[size - 1] = '\0';
    }
    free(tmp);
    return 1;
}

static clffn_status fill_info(clffn_device_info *info, cl_platform_id p, cl_device_id d,
                              unsigned pi, unsigned di) {
    memset(info, 0, sizeof *info);
    info->platform_index = pi;
    info->device_index = di;
    info->platform = p;
    info->device = d;
    size_t n = 0;
    if (clGetPlatformInfo(p, CL_PLATFORM_NAME, sizeof info->platform_name - 1, info->platform_name,
                          &n) != CL_SUCCESS) {
        info->platform_name[0] = '\0';
    }
    if (!info_string(d, CL_DEVICE_NAME, info->name, sizeof info->name) ||
        !info_string(d, CL_DEVICE_VENDOR, info->vendor, sizeof info->vendor) ||
        !info_string(d, CL_DRIVER_VERSION, info->driver_version, sizeof info->driver_version) ||
        !info_string(d, CL_DEVICE_VERSION, info->device_version, sizeof info->device_version) ||
        !info_string(d, CL_DEVICE_OPENCL_C_VERSION, info->opencl_c_version,
                     sizeof info->opencl_c_version)) {
        return CLFFN_ERROR_OUT_OF_HOST_MEMORY;
    }
    clGetDeviceInfo(d, CL_DEVICE_TYPE, sizeof info->type, &info->type, NULL);
    clGetDeviceInfo(d, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof info->compute_units,
                    &info->compute_units, NULL);
    clGetDeviceInfo(d, CL_DEVICE_MAX_CLOCK_FREQUENCY, sizeof info->clock_mhz, &info->clock_mhz,
                    NULL);
    clGetDeviceInfo(d, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof info->global_mem_bytes,
                    &info->global_mem_bytes, NULL);
    clGetDeviceInfo(d, CL_DEVICE_LOCAL_MEM_SIZE, sizeof info->local_mem_bytes,
                    &info->local_mem_bytes, NULL);
    clGetDeviceInfo(d, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof info->max_alloc_bytes,
                    &info->max_alloc_bytes, NULL);
    clGetDeviceInfo(d, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof info->max_work_group_size,
                    &info->max_work_group_size, NULL);
    char *ext = NULL;
    size_t ext_len = 0;
    if (clGetDeviceInfo(d, CL_DEVICE_EXTENSIONS, 0, NULL, &ext_len) == CL_SUCCESS) {
        if (!(ext = calloc(ext_len + 1, 1))) { return CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
        if (clGetDeviceInfo(d, CL_DEVICE_EXTENSIONS, ext_len, ext, NULL) == CL_SUCCESS) {
            info->fp16 = strstr(ext, "cl_khr_fp16") != NULL;
            info->fp64 = strstr(ext, "cl_khr_fp64") != NULL;
        }
        free(ext);
    }
    cl_device_fp_config dfp = 0;
    if (clGetDeviceInfo(d, CL_DEVICE_DOUBLE_FP_CONFIG, sizeof dfp, &dfp, NULL) == CL_SUCCESS &&
        dfp != 0) {
        info->fp64 = 1;
    }
    cl_device_fp_config sfp = 0;
    info->denormals =
        clGetDeviceInfo(d, CL_DEVICE_SINGLE_FP_CONFIG, sizeof sfp, &sfp, NULL) == CL_SUCCESS &&
        (sfp & CL_FP_DENORM) != 0;
    info->software = clffn__software_device(info->name);
    clffn_device_caps caps;
    info->supported = clffn__device_caps_query(d, &caps) == CLFFN_SUCCESS &&
                      clffn__device_caps_check(&caps) == CLFFN_SUCCESS;
    return CLFFN_SUCCESS;
}

int clffn__software_device(const char *name) {
    /* Mesa names its software drivers so, whatever the version: "llvmpipe (LLVM 15.0.6, 256
     * bits)", "softpipe" */
    static const char *const soft[] = {"llvmpipe", "softpipe"};
    for (size_t i = 0; i < sizeof soft / sizeof soft[0]; ++i) {
        if (!strncmp(name, soft[i], strlen(soft[i]))) { return 1; }
    }
    return 0;
}

int clffn__cpu_compiler_device(cl_device_type type, const char *name) {
    return (type & CL_DEVICE_TYPE_CPU) && !clffn__software_device(name);
}

/* The default's order: lower first (clffn_devices_default). */
static int default_rank(const clffn_device_info *d) {
    int r = 4;
    if (d->software) {
        r = 3;
    } else if (d->type & CL_DEVICE_TYPE_GPU) {
        r = 0;
    } else if (d->type & CL_DEVICE_TYPE_ACCELERATOR) {
        r = 1;
    } else if (d->type & CL_DEVICE_TYPE_CPU) {
        r = 2;
    }
    return d->supported ? r : r + 5;
}

clffn_status clffn_devices_default(const clffn_device_info *devs, size_t n, size_t *index) {
    if (!index || (n && !devs)) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if (n == 0) { return CLFFN_ERROR_DEVICE_NOT_FOUND; }
    size_t best = 0;
    for (size_t i = 1; i < n; ++i) {
        if (default_rank(&devs[i]) < default_rank(&devs[best])) { best = i; }
    }
    *index = best;
    return CLFFN_SUCCESS;
}

clffn_status clffn_devices_list(clffn_device_info *out, size_t capacity, size_t *count) {
    if (!count || (capacity && !out)) { return CLFFN_ERROR_NULL_ARGUMENT; }
    cl_uint np = 0;
    cl_int err = clGetPlatformIDs(0, NULL, &np);
    if (err == (cl_int)CLFFN_PLATFORM_NOT_FOUND || (err == CL_SUCCESS && np == 0)) {
        return CLFFN_PLATFORM_NOT_FOUND;
    }
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    cl_platform_id *plats = calloc(np, sizeof *plats);
    if (!plats) { return CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
    if ((err = clGetPlatformIDs(np, plats, NULL)) != CL_SUCCESS) {
        free(plats);
        return (clffn_status)err;
    }
    /* the descriptions go to scratch first: out is written only once every one succeeded */
    size_t room = 0;
    for (cl_uint p = 0; p < np; ++p) {
        cl_uint nd = 0;
        if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 0, NULL, &nd) == CL_SUCCESS) {
            room += nd;
        }
    }
    if (room > capacity) { room = capacity; }
    clffn_device_info *tmp = room ? calloc(room, sizeof *tmp) : NULL;
    if (room && !tmp) {
        free(plats);
        return CLFFN_ERROR_OUT_OF_HOST_MEMORY;
    }
    size_t total = 0;
    clffn_status st = CLFFN_SUCCESS;
    for (cl_uint p = 0; p < np && st == CLFFN_SUCCESS; ++p) {
        cl_uint nd = 0;
        /* a platform without devices answers CL_DEVICE_NOT_FOUND: it simply adds none */
        if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 0, NULL, &nd) != CL_SUCCESS || nd == 0) {
            continue;
        }
        cl_device_id *devs = calloc(nd, sizeof *devs);
        if (!devs) {
            st = CLFFN_ERROR_OUT_OF_HOST_MEMORY;
            break;
        }
        if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, nd, devs, NULL) == CL_SUCCESS) {
            for (cl_uint d = 0; d < nd && st == CLFFN_SUCCESS; ++d, ++total) {
                if (total < room) { st = fill_info(&tmp[total], plats[p], devs[d], p, d); }
            }
        }
        free(devs);
    }
    free(plats);
    if (st == CLFFN_SUCCESS) {
        if (tmp) { memcpy(out, tmp, (total < room ? total : room) * sizeof *tmp); }
        *count = total;
    }
    free(tmp);
    return st;
}
