/* Helpers every layer of the host library may use; this header and text.c call nothing else of
 * clffn's. */
#ifndef CLFFN_COMMON_H
#define CLFFN_COMMON_H

#ifndef CLFFN_HOOKS
#define CLFFN_HOOKS /* the library implements the hooks too */
#endif
#include "clffn.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* a·b into *out, or false when it would overflow size_t. */
static inline bool clffn__mul_ok(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) { return false; }
    *out = a * b;
    return true;
}

/* N1, the width of the first layer's product: d_ff, or 2·d_ff when V is stacked beside W1. */
static inline size_t clffn__n1(const clffn_config *c) { return c->gated ? 2 * c->d_ff : c->d_ff; }

/* A whole text file (smaller than max_bytes), NUL-terminated, or NULL; *oom tells "no memory"
 * apart from "no readable file". Caller frees. Kernel sources and tuning profiles. */
char *clffn__read_text(const char *path, long max_bytes, int *oom);

#endif
