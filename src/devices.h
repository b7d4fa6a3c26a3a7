/* Devices: enumeration (clffn_devices_list, public) and the capabilities clffn relies on. The
 * bottom of the device stack: calls nothing else of clffn's. */
#ifndef CLFFN_DEVICES_H
#define CLFFN_DEVICES_H

#include "common.h"

/* Device capabilities clffn relies on, split out so the decision is testable without a device
 * lacking them. */
typedef struct clffn_device_caps {
    int version_major, version_minor; /* from CL_DEVICE_VERSION "OpenCL M.m ..." */
    int compiler_available;
    int available;
} clffn_device_caps;

/* DEVICE_UNSUPPORTED unless the device is available, has a compiler and OpenCL ≥ 1.2. */
clffn_status clffn__device_caps_check(const clffn_device_caps *caps);
clffn_status clffn__device_caps_query(cl_device_id device, clffn_device_caps *caps);

/* 1 when a device of this name is a GPU driver stack run in software (Mesa's llvmpipe). */
int clffn__software_device(const char *name);

/* 1 for a CPU device other than those (POCL, Oclgrind): one whose compiler takes the CPU forms
 * of clffn's weight kernels (the direct sums, the column strips) quickly, where llvmpipe's took
 * several times longer over them and ran the strips slower. */
int clffn__cpu_compiler_device(cl_device_type type, const char *name);

/* Parses "OpenCL M.m ..." into major/minor; returns 0 on failure. */
int clffn__parse_cl_version(const char *s, int *major, int *minor);

/* The device's platform name, name and driver version, each NUL-terminated in `size` bytes;
 * a query that fails leaves its string empty. */
void clffn__device_strings(cl_device_id device, char *platform, char *name, char *driver,
                           size_t size);

#endif
