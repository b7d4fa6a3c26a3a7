/* Element types, float conversions, and atomic file writes for the loaders. */
#include "clffn_io.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Messages quote bytes from the file (keys, names, dtypes), and those must never reach a
 * terminal as they are: an escape sequence can rewrite it. Every byte outside printable ASCII
 * is written as \xNN. */
int clffn__io_fail(char *err, const char *fmt, ...) {
    char raw[CLFFN_IO_ERR];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)raw; *p; ++p) {
        const int plain = *p >= 0x20 && *p < 0x7f;
        if (n + (plain ? 1 : 4) >= CLFFN_IO_ERR) { break; }
        if (plain) {
            err[n++] = (char)*p;
        } else {
            n += (size_t)snprintf(err + n, CLFFN_IO_ERR - n, "\\x%02x", *p);
        }
    }
    err[n] = '\0';
    return -1;
}

int clffn__io_map(const char *path, size_t min_len, const char *what, void **map, size_t *len,
                  char *err) {
    const int fd = open(path, O_RDONLY);
    if (fd < 0) { return clffn__io_fail(err, "cannot open: %s", strerror(errno)); }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return clffn__io_fail(err, "not a regular file");
    }
    if ((uint64_t)sb.st_size < min_len) {
        close(fd);
        return clffn__io_fail(err, "too short for %s (%lld bytes)", what, (long long)sb.st_size);
    }
    void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd); /* the mapping keeps the file */
    if (m == MAP_FAILED) { return clffn__io_fail(err, "cannot map: %s", strerror(errno)); }
    *map = m;
    *len = (size_t)sb.st_size;
    return 0;
}

static const struct {
    const char *name;
    size_t size;
} dtypes[CLFFN_DT_COUNT_] = {
    [CLFFN_DT_F64] = {"F64", 8},         [CLFFN_DT_F32] = {"F32", 4},
    [CLFFN_DT_F16] = {"F16", 2},         [CLFFN_DT_BF16] = {"BF16", 2},
    [CLFFN_DT_I64] = {"I64", 8},         [CLFFN_DT_I32] = {"I32", 4},
    [CLFFN_DT_I16] = {"I16", 2},         [CLFFN_DT_I8] = {"I8", 1},
    [CLFFN_DT_U64] = {"U64", 8},         [CLFFN_DT_U32] = {"U32", 4},
    [CLFFN_DT_U16] = {"U16", 2},         [CLFFN_DT_U8] = {"U8", 1},
    [CLFFN_DT_BOOL] = {"BOOL", 1},       [CLFFN_DT_F8_E4M3] = {"F8_E4M3", 1},
    [CLFFN_DT_F8_E5M2] = {"F8_E5M2", 1},
};

const char *clffn_io_dtype_name(clffn_io_dtype dt) {
    return (unsigned)dt < CLFFN_DT_COUNT_ ? dtypes[dt].name : "?";
}

size_t clffn_io_dtype_size(clffn_io_dtype dt) {
    return (unsigned)dt < CLFFN_DT_COUNT_ ? dtypes[dt].size : 0;
}

int clffn_io_dtype_is_convertible(clffn_io_dtype dt) {
    return dt == CLFFN_DT_F64 || dt == CLFFN_DT_F32 || dt == CLFFN_DT_F16 || dt == CLFFN_DT_BF16;
}

static float bits_to_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float clffn_half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) { return bits_to_float(sign | 0x7f800000u | (man << 13)); } /* inf, NaN */
    if (exp == 0) {
        if (man == 0) { return bits_to_float(sign); }
        /* subnormal: normalise into float's range */
        int e = -1;
        do {
            ++e;
            man <<= 1;
        } while (!(man & 0x400u));
        return bits_to_float(sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13));
    }
    return bits_to_float(sign | ((exp + 127 - 15) << 23) | (man << 13));
}

float clffn_bf16_to_float(uint16_t b) { return bits_to_float((uint32_t)b << 16); }

/* Little-endian loads from unaligned memory (the format's byte order; the host's may differ). */
static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | ((uint64_t)le32(p + 4) << 32); }

void clffn_io_to_f32(clffn_io_dtype dt, const void *src, size_t n, float *dst) {
    const uint8_t *p = src;
    for (size_t i = 0; i < n; ++i) {
        switch (dt) {
        case CLFFN_DT_F32: dst[i] = bits_to_float(le32(p + 4 * i)); break;
        case CLFFN_DT_F16: dst[i] = clffn_half_to_float(le16(p + 2 * i)); break;
        case CLFFN_DT_BF16: dst[i] = clffn_bf16_to_float(le16(p + 2 * i)); break;
        case CLFFN_DT_F64: {
            const uint64_t u = le64(p + 8 * i);
            double d;
            memcpy(&d, &u, sizeof d);
            dst[i] = (float)d;
            break;
        }
        default: dst[i] = 0.0f; break; /* callers check convertibility first */
        }
    }
}

int clffn_write_atomic(const char *path, const void *const *parts, const size_t *lens,
                       size_t nparts, char *err) {
    const size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp) {
        snprintf(err, CLFFN_IO_ERR, "out of memory");
        return -1;
    }
    snprintf(tmp, plen + 16, "%s.tmpXXXXXX", path);
    const int fd = mkstemp(tmp);
    if (fd < 0) {
        snprintf(err, CLFFN_IO_ERR, "cannot create a file next to it: %s", strerror(errno));
        free(tmp);
        return -1;
    }
    FILE *f = fdopen(fd, "wb");
    int ok = f != NULL;
    for (size_t i = 0; ok && i < nparts; ++i) {
        ok = lens[i] == 0 || fwrite(parts[i], 1, lens[i], f) == lens[i];
    }
    if (f) {
        ok = fflush(f) == 0 && ok;
        ok = fclose(f) == 0 && ok;
    } else {
        close(fd);
    }
    if (ok && rename(tmp, path) != 0) { ok = 0; }
    if (!ok) {
        snprintf(err, CLFFN_IO_ERR, "cannot write: %s", strerror(errno));
        unlink(tmp);
    }
    free(tmp);
    return ok ? 0 : -1;
}
