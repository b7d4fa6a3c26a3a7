/* Whole-file text reading, for kernel sources and tuning profiles. */
#include "common.h"

#include <stdio.h>
#include <stdlib.h>

char *clffn__read_text(const char *path, long max_bytes, int *oom) {
    *oom = 0;
    FILE *f = fopen(path, "rb");
    if (!f) { return NULL; }
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && n < max_bytes &&
        fseek(f, 0, SEEK_SET) == 0) {
        if (!(buf = malloc((size_t)n + 1))) {
            *oom = 1;
        } else if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
            free(buf);
            buf = NULL;
        } else {
            buf[n] = '\0';
        }
    }
    fclose(f);
    return buf;
}
