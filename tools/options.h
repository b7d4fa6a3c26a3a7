/* The tools' command lines: one table per tool names every option, its value and its help, and
 * getopt_long parses from it, so `--opt value`, `--opt=value`, -h/--help and --version behave
 * the same in every tool and the help can never drift from what is parsed.
 *
 *   static const tool_option OPTIONS[] = {
 *       {"tokens", OPT_TOKENS, TOOL_VALUE, "T", "token rows (default 640)"},
 *       {"gated", OPT_GATED, TOOL_FLAG, NULL, "the GLU form"},
 *       {0}};
 *   static const tool_cli CLI = {"clffn-bench", "[options]", NULL, OPTIONS};
 *   tool_parser p = tool_parser_start(&CLI, argc, argv);
 *   for (int key; (key = tool_next(&p)) > 0;) { ... p.value ... }
 *   if (p.status >= 0) return p.status;   // --help, --version (0) or a usage error (2)
 *
 * Usage errors print one line and the hint "Try 'TOOL --help' for more.", and the tool exits 2;
 * a tool that refuses a value prints its own line and calls tool_usage_error() for the hint. */
#ifndef CLFFN_TOOLS_OPTIONS_H
#define CLFFN_TOOLS_OPTIONS_H

#include <stdio.h>

/* What an option takes after it. */
typedef enum tool_arg {
    TOOL_FLAG,     /* nothing */
    TOOL_VALUE,    /* a value: --opt V or --opt=V */
    TOOL_OPTIONAL, /* a value only as --opt=V */
} tool_arg;

/* One option. key is what tool_next() returns for it: a positive int below TOOL_KEY_RESERVED
 * other than 'h'; a letter or digit is also the option's short form (-k). help NULL hides an
 * internal option from --help (clffn-tune's child processes take some); help may hold '\n'
 * for more lines. */
typedef struct tool_option {
    const char *name; /* without the leading "--" */
    int key;
    tool_arg arg;
    const char *value; /* the value's name in the help, e.g. "N" */
    const char *help;
} tool_option;

/* A tool's command line: synopsis follows "usage: TOOL " (more lines start with "TOOL "),
 * notes follow the option list (exit statuses, examples); options end with a zero entry. */
typedef struct tool_cli {
    const char *tool;
    const char *synopsis;
    const char *notes;
    const tool_option *options;
} tool_cli;

enum { TOOL_MAX_OPTIONS = 48, TOOL_KEY_RESERVED = 0x10000 };

/* The parser's state (getopt_long's, which is process-wide: one parser at a time). */
typedef struct tool_parser {
    const tool_cli *cli;
    int argc;
    char **argv;
    const char *value; /* the value of the option tool_next() returned, or NULL */
    const char *name;  /* that option's long name */
    int status;        /* after the last tool_next(): -1 parsed, 0 help or version shown, 2 error */
    int n;
} tool_parser;

tool_parser tool_parser_start(const tool_cli *cli, int argc, char **argv);

/* The next option's key, with p->value and p->name set; 0 at the end of the options or when the
 * command line is done with (p->status then says how: -1 all parsed, 0 --help or --version
 * printed, 2 a usage error printed). Arguments that are not options are usage errors. */
int tool_next(tool_parser *p);

/* The next argument, when it is one of words (NULL-terminated), taken as the value of the
 * option tool_next() just returned; NULL otherwise. For a TOOL_OPTIONAL value that a tool has
 * always also taken as a separate word (clffn-bench-gemms --gemv-sweep rot). */
const char *tool_take_word(tool_parser *p, const char *const words[]);

/* The help, generated from the table: synopsis, every listed option with its value and help,
 * -h/--help and --version, then the notes. */
void tool_print_help(const tool_cli *cli, FILE *f);

/* After a tool's own one-line message about a bad value: the hint line. Returns 2, the exit
 * status of every usage error. */
int tool_usage_error(const tool_cli *cli);

#endif
