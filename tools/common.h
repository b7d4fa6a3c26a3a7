/* Helpers the command-line tools share: timing, comparison against the double reference (one
 * NaN rule for every tool), and argument parsing. */
#ifndef CLFFN_TOOLS_COMMON_H
#define CLFFN_TOOLS_COMMON_H

#include "clffn.h" /* cl_command_queue */

#include <stddef.h>
#include <stdint.h>

/* Seconds on the monotonic clock. */
double tool_now_s(void);

/* The error of y against ref, with one NaN rule: a NaN reference is matched only by a NaN (the
 * formula itself gives NaN there, e.g. -Inf·0), equal values agree (equal infinities too), and
 * any other NaN or infinity in y is an infinite error. */
double tool_error(float y, double ref);

/* y[n] against ref[n] under |y − ref| ≤ rtol·max|ref| + atol, max|ref| over the finite
 * references. */
typedef struct tool_comparison {
    double max_err, max_ref, tol;
    int pass;
} tool_comparison;
tool_comparison tool_compare(const float *y, const double *ref, size_t n, double rtol, double atol);

/* An integer in [min, max], decimal or 0x-hexadecimal (no sign, no trailing characters): 0, or
 * -1 with *out unchanged. */
int tool_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out);
int tool_parse_size(const char *s, size_t min, size_t max, size_t *out);
/* A finite number in [min, max]: 0, or -1 with *out unchanged. */
int tool_parse_double(const char *s, double min, double max, double *out);

/* --moe-counts: "device", "host" or "auto" as clffn_moe_counts (0, or -1 with *out unchanged),
 * and the name of one. */
int tool_parse_moe_counts(const char *s, clffn_moe_counts *out);
const char *tool_moe_counts_name(clffn_moe_counts c);
/* "on" → 1, "off" → 0 into *on: 0, or -1 (*on unchanged) for anything else. */
int tool_parse_on_off(const char *s, int *on);

/* Waits until every command enqueued on q so far has run: a marker's event, then clFinish. Mesa's
 * rusticl returns from clFinish at once when the queue was flushed before (docs/RELIABILITY.md;
 * a 512 -> 2048 forward on llvmpipe came back after 1-5 ms, its output ready 20-30 ms later),
 * which made timed loops report impossible speeds; an event's wait holds. OpenCL's status. */
cl_int tool_finish(cl_command_queue q);

/* Whether a span the device's profiling timestamps give (device_s) falls far short of the time
 * the host's clock saw the same work take on an idle queue (host_s): under half of it and more
 * than a millisecond under (the host's span adds only the launch and the wake-up). Drivers whose
 * timestamps are not times do this (Mesa's rusticl on llvmpipe: a forward that takes seconds
 * spans a fraction of a millisecond); their host clock is then the time. */
int tool_device_span_short(double device_s, double host_s);

/* A tool's exit status after clffn_release_all(), which every tool calls last so that no OpenCL
 * object is released after main returns (include/clffn.h says why). A failure there means a
 * context of the tool's was never destroyed: printed, and the status becomes 1 if it was 0. */
int tool_exit(const char *tool, int status);

/* Runs this program again (/proc/self/exe, no shell) with argv and envp (NULL: this process's
 * environment), its stderr to /dev/null when quiet, and reads its output into line (size bytes,
 * NUL-terminated, the rest dropped). 0 when it exited 0, else -1. */
int tool_spawn_self(char *const argv[], char *const envp[], int quiet, char *line, size_t size);

#endif
