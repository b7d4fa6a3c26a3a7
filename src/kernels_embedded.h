/* The kernel sources, embedded at build time: kernels_embedded.c is generated from the .cl files
 * in cl/ (clffn_defs.h first, in program order) by cmake/embed_kernels.cmake. The bottom layer:
 * program.c reads them. */
#ifndef CLFFN_KERNELS_EMBEDDED_H
#define CLFFN_KERNELS_EMBEDDED_H

#include <stddef.h>

typedef struct clffn_kernel_source {
    const char *name; /* file name, e.g. "epilogue.cl" */
    const char *text;
} clffn_kernel_source;
extern const clffn_kernel_source clffn_embedded_sources[];
extern const size_t clffn_embedded_source_count;

#endif
