/* Helpers the tools' end-to-end suites share: running a tool, a scratch folder, and small
 * safetensors checkpoints in any float dtype. */
#ifndef CLFFN_TEST_TOOLS_COMMON_H
#define CLFFN_TEST_TOOLS_COMMON_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

/* Runs a shell command; returns its exit status and (if out) its stdout+stderr. */
int run(const char *cmd, char *out, size_t out_len);

/* The same with stdout in out and stderr in err, for output a test parses: a driver may write
 * warnings to stderr (Mesa's compiler does, on a cold shader cache), which must not reach a
 * JSON parser. */
int run_split(const char *cmd, char *out, size_t out_len, char *err, size_t err_len);

/* A scratch folder for one test (make_dir), removed with what it holds (remove_dir). */
extern char dir[64];
void make_dir(void);
void remove_dir(void);

/* One tensor of a checkpoint to write. */
typedef struct tensor {
    char name[96];
    const char *dtype;
    size_t rank;
    uint64_t shape[2];
    const float *values; /* exactly representable in every dtype used (k/64 values) */
} tensor;

/* Writes a safetensors checkpoint of the tensors, each in its dtype. */
void write_checkpoint(const char *path, const tensor *ts, size_t n);

/* Values k/64·scale, k in [-48, 48]: exact in F16, BF16, F32 and F64. */
float *exact_values(size_t n, float scale, uint64_t seed);
/* o's number k, asserted present. */
double json_num(const cJSON *o, const char *k);

#endif
