/* Every tool's command line, parsed by getopt_long from its option table (tools/options.h):
 * --help and -h, --version, `--opt value` and `--opt=value` alike, an unknown option, a missing
 * value, a value given to a flag and a stray argument, each with its exit status and its one
 * line plus the hint. Nothing here opens a device: every command stops in the parser. */
#include "clffn.h"

#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *const TOOLS[][2] = {
    {"clffn-run", CLFFN_RUN_PATH},     {"clffn-devices", CLFFN_DEVICES_PATH},
    {"clffn-bench", CLFFN_BENCH_PATH}, {"clffn-bench-gemms", CLFFN_BENCH_GEMMS_PATH},
    {"clffn-tune", CLFFN_TUNE_PATH},   {"clffn-train", CLFFN_TRAIN_PATH},
};
enum { N_TOOLS = sizeof TOOLS / sizeof TOOLS[0] };

/* What one run printed and how it ended. */
typedef struct outcome {
    int status;
    char out[16384], err[4096];
} outcome;

static void slurp(const char *path, char *buf, size_t size) {
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    const size_t n = fread(buf, 1, size - 1, f);
    buf[n] = '\0';
    fclose(f);
}

/* Runs the tool with args (a shell word list), stdout and stderr apart. */
static outcome *run_tool(const char *path, const char *args) {
    static outcome o;
    char out_path[] = "/tmp/clffn-cli-out-XXXXXX", err_path[] = "/tmp/clffn-cli-err-XXXXXX";
    const int fo = mkstemp(out_path), fe = mkstemp(err_path);
    cr_assert(fo >= 0 && fe >= 0);
    close(fo), close(fe);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' %s >'%s' 2>'%s' </dev/null", path, args, out_path, err_path);
    const int st = system(cmd);
    o.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    slurp(out_path, o.out, sizeof o.out);
    slurp(err_path, o.err, sizeof o.err);
    remove(out_path), remove(err_path);
    return &o;
}

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; ++s) { n += *s == '\n'; }
    return n;
}

/* A usage error: exit 2, nothing on stdout, exactly "TOOL: what" and the hint on stderr. */
static void assert_usage_error(const outcome *o, const char *tool, const char *what) {
    char first[512], hint[128];
    snprintf(first, sizeof first, "%s: %s\n", tool, what);
    snprintf(hint, sizeof hint, "Try '%s --help' for more.\n", tool);
    cr_assert_eq(o->status, 2, "%s %s: exit %d\n%s", tool, what, o->status, o->err);
    cr_assert_str_empty(o->out, "%s: %s", tool, o->out);
    cr_assert_eq(count_lines(o->err), 2, "%s: one line and the hint:\n%s", tool, o->err);
    cr_assert(strncmp(o->err, first, strlen(first)) == 0, "%s: want '%s', got:\n%s", tool, first,
              o->err);
    cr_assert_str_eq(o->err + strlen(first), hint);
}

/* The help's text starts at one column (where --help's does), and an option's label ends
 * before it: a label that leaves no space there stands alone (at most "-x, --name VALUE") and
 * its text goes on the next line. */
static void assert_help_column(const char *tool, const char *out) {
    const char *h = strstr(out, "-h, --help");
    cr_assert(h);
    const char *text = strstr(h, "print this help");
    cr_assert(text);
    const size_t column = (size_t)(text - (h - 2));
    for (const char *line = out; *line;) {
        const char *end = strchr(line, '\n');
        const size_t len = end ? (size_t)(end - line) : strlen(line);
        int words = 0;
        for (size_t i = 2; i < len; ++i) { words += line[i] != ' ' && line[i - 1] == ' '; }
        const size_t lead = strspn(line, " ");
        if (len > column && lead >= 2 && lead < len && line[lead] == '-' && words > 3) {
            cr_assert(line[column - 1] == ' ' && line[column] != ' ',
                      "%s, help at column %zu:\n%.*s", tool, column, (int)len, line);
        }
        line += len + (end ? 1 : 0);
    }
}

Test(cli, help_lists_every_option_and_exits_0) {
    for (int i = 0; i < N_TOOLS; ++i) {
        for (int s = 0; s < 2; ++s) {
            const outcome *o = run_tool(TOOLS[i][1], s ? "-h" : "--help");
            char usage[64];
            snprintf(usage, sizeof usage, "usage: %s ", TOOLS[i][0]);
            cr_assert_eq(o->status, 0, "%s --help: %d\n%s", TOOLS[i][0], o->status, o->err);
            cr_assert(strncmp(o->out, usage, strlen(usage)) == 0, "%s", o->out);
            cr_assert(strstr(o->out, "-h, --help") && strstr(o->out, "--version"), "%s", o->out);
            cr_assert_str_empty(o->err);
            assert_help_column(TOOLS[i][0], o->out);
        }
    }
}

/* Every option the help lists is one the parser knows: given a value it either takes it, refuses
 * the value, or says it takes none, and the parse goes on to the next option, never reporting
 * the listed one as unknown. */
Test(cli, every_listed_option_is_parsed) {
    for (int i = 0; i < N_TOOLS; ++i) {
        char help[16384];
        snprintf(help, sizeof help, "%s", run_tool(TOOLS[i][1], "--help")->out);
        int listed = 0;
        for (char *at = strstr(help, "--"); at; at = strstr(at + 2, "--")) {
            if (at > help && at[-1] != ' ') { continue; }
            char name[64];
            if (sscanf(at + 2, "%63[a-z0-9-]", name) != 1 || !strcmp(name, "help") ||
                !strcmp(name, "version")) {
                continue;
            }
            char args[128], unknown[128];
            snprintf(args, sizeof args, "--%s=1 --no-such-option", name);
            snprintf(unknown, sizeof unknown, "unknown option '--%s", name);
            const outcome *o = run_tool(TOOLS[i][1], args);
            cr_assert_eq(o->status, 2, "%s %s: %d\n%s", TOOLS[i][0], args, o->status, o->err);
            cr_assert(strstr(o->err, unknown) == NULL, "%s %s:\n%s", TOOLS[i][0], args, o->err);
            ++listed;
        }
        cr_assert(listed >= 2, "%s lists %d options:\n%s", TOOLS[i][0], listed, help);
    }
}

Test(cli, version) {
    for (int i = 0; i < N_TOOLS; ++i) {
        const outcome *o = run_tool(TOOLS[i][1], "--version");
        char want[128];
        snprintf(want, sizeof want, "%s (clffn) %d.%d.%d\n", TOOLS[i][0], CLFFN_VERSION_MAJOR,
                 CLFFN_VERSION_MINOR, CLFFN_VERSION_PATCH);
        cr_assert_eq(o->status, 0);
        cr_assert_str_eq(o->out, want);
    }
}

Test(cli, unknown_option_one_line_and_the_hint) {
    for (int i = 0; i < N_TOOLS; ++i) {
        assert_usage_error(run_tool(TOOLS[i][1], "--frobnicate"), TOOLS[i][0],
                           "unknown option '--frobnicate'");
        assert_usage_error(run_tool(TOOLS[i][1], "-Q"), TOOLS[i][0], "unknown option '-Q'");
        assert_usage_error(run_tool(TOOLS[i][1], "stray"), TOOLS[i][0],
                           "unexpected argument 'stray'");
    }
}

Test(cli, missing_value_and_value_for_a_flag) {
    assert_usage_error(run_tool(CLFFN_RUN_PATH, "--weights"), "clffn-run",
                       "--weights needs a value");
    assert_usage_error(run_tool(CLFFN_BENCH_PATH, "--tokens"), "clffn-bench",
                       "--tokens needs a value");
    assert_usage_error(run_tool(CLFFN_RUN_PATH, "--verify=yes"), "clffn-run",
                       "--verify takes no value");
    assert_usage_error(run_tool(CLFFN_DEVICES_PATH, "--json=1"), "clffn-devices",
                       "--json takes no value");
    assert_usage_error(run_tool(CLFFN_TRAIN_PATH, "--help=1"), "clffn-train",
                       "--help takes no value");
}

/* `--opt value` and `--opt=value` are one option: the same refusal for the same bad value, and
 * the tool's own message for it. */
Test(cli, both_value_forms_alike) {
    static const struct {
        const char *path, *tool, *a, *b, *message;
    } cases[] = {
        {CLFFN_BENCH_PATH, "clffn-bench", "--tokens 0", "--tokens=0",
         "--tokens needs a positive integer"},
        {CLFFN_RUN_PATH, "clffn-run", "--dropout 1.5", "--dropout=1.5",
         "--dropout needs a probability in [0, 1], not '1.5'"},
        {CLFFN_RUN_PATH, "clffn-run", "--preset nope", "--preset=nope",
         "unknown preset 'nope' (annotated, labml, gpt2, bert, llama, mixtral, qwen_moe)"},
        {CLFFN_BENCH_GEMMS_PATH, "clffn-bench-gemms", "--reps 0", "--reps=0",
         "--reps needs an integer 1 ... 100000"},
        {CLFFN_TUNE_PATH, "clffn-tune", "--budget x", "--budget=x",
         "--budget needs a number of seconds, not 'x'"},
        {CLFFN_TUNE_PATH, "clffn-tune", "--large-shape 4096,100", "--large-shape=4096,100",
         "--large-shape needs D,F (multiples of 32) or none, not '4096,100'"},
        {CLFFN_TRAIN_PATH, "clffn-train", "--optimizer lion", "--optimizer=lion",
         "bad value for --optimizer: 'lion'"},
        {CLFFN_BENCH_PATH, "clffn-bench", "--weight-layout x", "--weight-layout=x",
         "--weight-layout takes out_in or in_out"},
        {CLFFN_BENCH_PATH, "clffn-bench", "--experts 4 --moe-counts x",
         "--experts 4 --moe-counts=x", "--moe-counts takes device, host or auto"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        assert_usage_error(run_tool(cases[i].path, cases[i].a), cases[i].tool, cases[i].message);
        assert_usage_error(run_tool(cases[i].path, cases[i].b), cases[i].tool, cases[i].message);
    }
}

/* A value that the tool checks after the parse (options that only go together) is refused with
 * its line and the hint, whichever form gave the options. */
Test(cli, checks_after_the_parse) {
    assert_usage_error(run_tool(CLFFN_RUN_PATH, "--activation=gelu"), "clffn-run",
                       "these options apply to --weights runs (the demo takes only --device)");
    assert_usage_error(run_tool(CLFFN_RUN_PATH, "--weights w --input=x"), "clffn-run",
                       "--weights, --input and --output go together");
    assert_usage_error(run_tool(CLFFN_BENCH_GEMMS_PATH, "--gemv-sweep=both"), "clffn-bench-gemms",
                       "--gemv-sweep takes fast or rot");
    assert_usage_error(run_tool(CLFFN_BENCH_PATH, "--moe-counts=host"), "clffn-bench",
                       "--top-k, --expert-split, --moe-counts and --moe-grouping go with "
                       "--experts");
}
