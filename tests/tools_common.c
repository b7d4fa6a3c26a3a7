/* Helpers the tools' end-to-end suites share (tools_common.h). */
#include "tools_common.h"
#include "common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs a shell command; returns its exit status and (if out) its stdout+stderr. */
int run(const char *cmd, char *out, size_t out_len) {
    char full[4096];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    cr_assert_not_null(p);
    size_t n = 0;
    char buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, p)) > 0) {
        if (out && n + 1 < out_len) {
            const size_t k = got < out_len - 1 - n ? got : out_len - 1 - n;
            memcpy(out + n, buf, k);
            n += k;
        }
    }
    if (out) { out[n] = '\0'; }
    const int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int run_split(const char *cmd, char *out, size_t out_len, char *err, size_t err_len) {
    char path[] = "/tmp/clffn-stderr-XXXXXX", full[4096];
    const int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    snprintf(full, sizeof full, "%s 2>'%s'", cmd, path);
    FILE *p = popen(full, "r");
    cr_assert_not_null(p);
    const size_t n = fread(out, 1, out_len - 1, p);
    out[n] = '\0';
    char rest[4096];
    while (fread(rest, 1, sizeof rest, p) > 0) {} /* the child must not block on a full pipe */
    const int st = pclose(p);
    FILE *e = fopen(path, "r");
    cr_assert_not_null(e);
    const size_t m = fread(err, 1, err_len - 1, e);
    err[m] = '\0';
    fclose(e);
    unlink(path);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

char dir[64];

void make_dir(void) {
    snprintf(dir, sizeof dir, "/tmp/clffn-tools-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

void remove_dir(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

/* ------------------------------------------------------------------------------------------ */
/* Writing checkpoints in any float dtype */

static size_t dtype_bytes(const char *dt) {
    return !strcmp(dt, "F64") ? 8 : !strcmp(dt, "F32") ? 4 : 2;
}

static void encode(const char *dt, float v, uint8_t *p) {
    uint32_t u;
    memcpy(&u, &v, 4);
    if (!strcmp(dt, "F32")) {
        memcpy(p, &u, 4);
    } else if (!strcmp(dt, "F64")) {
        const double d = v;
        memcpy(p, &d, 8);
    } else if (!strcmp(dt, "BF16")) {
        const uint16_t h = (uint16_t)(u >> 16);
        memcpy(p, &h, 2);
    } else { /* F16 of a normal float with a short mantissa, or zero */
        const uint32_t sign = (u >> 16) & 0x8000u, exp = (u >> 23) & 0xffu, man = u & 0x7fffffu;
        const uint16_t h =
            exp == 0 ? (uint16_t)sign : (uint16_t)(sign | ((exp - 127 + 15) << 10) | (man >> 13));
        memcpy(p, &h, 2);
    }
}

void write_checkpoint(const char *path, const tensor *ts, size_t n) {
    char hdr[8192];
    size_t h = 0;
    uint64_t off = 0;
    h += (size_t)snprintf(hdr + h, sizeof hdr - h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = 0; i < n; ++i) {
        uint64_t numel = 1;
        for (size_t k = 0; k < ts[i].rank; ++k) { numel *= ts[i].shape[k]; }
        const uint64_t bytes = numel * dtype_bytes(ts[i].dtype);
        h += (size_t)snprintf(hdr + h, sizeof hdr - h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                              ts[i].name, ts[i].dtype);
        for (size_t k = 0; k < ts[i].rank; ++k) {
            h += (size_t)snprintf(hdr + h, sizeof hdr - h, "%s%llu", k ? "," : "",
                                  (unsigned long long)ts[i].shape[k]);
        }
        h += (size_t)snprintf(hdr + h, sizeof hdr - h, "],\"data_offsets\":[%llu,%llu]}",
                              (unsigned long long)off, (unsigned long long)(off + bytes));
        off += bytes;
    }
    h += (size_t)snprintf(hdr + h, sizeof hdr - h, "}");
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) { len[i] = (uint8_t)(((uint64_t)h >> (8 * i)) & 0xff); }
    fwrite(len, 1, 8, f);
    fwrite(hdr, 1, h, f);
    for (size_t i = 0; i < n; ++i) {
        uint64_t numel = 1;
        for (size_t k = 0; k < ts[i].rank; ++k) { numel *= ts[i].shape[k]; }
        for (uint64_t e = 0; e < numel; ++e) {
            uint8_t b[8];
            encode(ts[i].dtype, ts[i].values[e], b);
            fwrite(b, 1, dtype_bytes(ts[i].dtype), f);
        }
    }
    fclose(f);
}

float *exact_values(size_t n, float scale, uint64_t seed) {
    float *a = malloc(n * sizeof *a);
    cr_assert(a);
    fill_uniform(a, n, -48.5f, 48.5f, seed);
    for (size_t i = 0; i < n; ++i) { a[i] = roundf(a[i]) / 64.0f * scale; }
    return a;
}

double json_num(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    cr_assert(cJSON_IsNumber(v), "no number '%s'", k);
    return v->valuedouble;
}
