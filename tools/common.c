/* Helpers the command-line tools share (see common.h). */
#include "common.h"

#include "clffn.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static const char *const MOE_COUNTS[] = {"device", "host", "auto"}; /* clffn_moe_counts' order */

int tool_parse_moe_counts(const char *s, clffn_moe_counts *out) {
    for (int i = 0; i < 3; ++i) {
        if (!strcmp(s, MOE_COUNTS[i])) {
            *out = (clffn_moe_counts)i;
            return 0;
        }
    }
    return -1;
}

const char *tool_moe_counts_name(clffn_moe_counts c) {
    return (unsigned)c < 3 ? MOE_COUNTS[c] : "?";
}

int tool_parse_on_off(const char *s, int *on) {
    if (strcmp(s, "on") && strcmp(s, "off")) { return -1; }
    *on = !strcmp(s, "on");
    return 0;
}

cl_int tool_finish(cl_command_queue q) {
    cl_event done = NULL;
    cl_int err = clEnqueueMarkerWithWaitList(q, 0, NULL, &done);
    if (err == CL_SUCCESS) { err = clWaitForEvents(1, &done); }
    if (done) { clReleaseEvent(done); }
    const cl_int fin = clFinish(q);
    return err != CL_SUCCESS ? err : fin;
}

int tool_device_span_short(double device_s, double host_s) {
    return device_s < 0.5 * host_s && host_s - device_s > 1e-3;
}

double tool_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double tool_error(float y, double ref) {
    if (isnan(ref)) { return isnan(y) ? 0.0 : INFINITY; }
    if ((double)y == ref) { return 0.0; }
    const double e = fabs((double)y - ref);
    return isfinite(e) ? e : INFINITY;
}

tool_comparison tool_compare(const float *y, const double *ref, size_t n, double rtol,
                             double atol) {
    tool_comparison c = {0.0, 0.0, 0.0, 0};
    for (size_t i = 0; i < n; ++i) {
        if (isfinite(ref[i])) { c.max_ref = fmax(c.max_ref, fabs(ref[i])); }
        c.max_err = fmax(c.max_err, tool_error(y[i], ref[i]));
    }
    c.tol = rtol * c.max_ref + atol;
    c.pass = c.max_err <= c.tol;
    return c;
}

int tool_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out) {
    if (!s || *s < '0' || *s > '9') { return -1; }
    const int hex = s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
    char *end;
    errno = 0;
    const unsigned long long v = strtoull(s, &end, hex ? 16 : 10);
    if (errno || *end || v < min || v > max) { return -1; }
    *out = (uint64_t)v;
    return 0;
}

int tool_parse_size(const char *s, size_t min, size_t max, size_t *out) {
    uint64_t v;
    if (tool_parse_u64(s, min, max, &v) != 0) { return -1; }
    *out = (size_t)v;
    return 0;
}

int tool_parse_double(const char *s, double min, double max, double *out) {
    if (!s || !*s) { return -1; }
    char *end;
    errno = 0;
    const double v = strtod(s, &end);
    if (errno || *end || !isfinite(v) || v < min || v > max) { return -1; }
    *out = v;
    return 0;
}

int tool_exit(const char *tool, int status) {
    const clffn_status st = clffn_release_all();
    if (st == CLFFN_SUCCESS) { return status; }
    fprintf(stderr, "%s: releasing clffn at exit: %s\n", tool, clffn_status_string(st));
    return status ? status : 1;
}

int tool_spawn_self(char *const argv[], char *const envp[], int quiet, char *line, size_t size) {
    int out[2];
    if (pipe(out) != 0) { return -1; }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    if (quiet) { posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0); }
    pid_t pid;
    const int rc = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, envp ? envp : environ);
    posix_spawn_file_actions_destroy(&fa);
    close(out[1]);
    size_t got = 0;
    ssize_t r;
    while (rc == 0 && got + 1 < size &&
           ((r = read(out[0], line + got, size - 1 - got)) > 0 || (r < 0 && errno == EINTR))) {
        if (r > 0) { got += (size_t)r; }
    }
    line[got] = '\0';
    close(out[0]);
    int status = 0;
    if (rc != 0) { return -1; }
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}
