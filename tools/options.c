/* The tools' command lines, parsed by getopt_long from each tool's table (options.h). */
#include "options.h"

#include "clffn.h"

#include <ctype.h>
#include <getopt.h>
#include <string.h>

enum { KEY_HELP = 'h', KEY_VERSION = TOOL_KEY_RESERVED };

/* getopt_long's tables for the parser in use: the tool's options, then help and version. */
static struct option longs[TOOL_MAX_OPTIONS + 3];
static char shorts[2 * TOOL_MAX_OPTIONS + 8];

static int has_short(int key) { return key > 0 && key < 128 && isalnum(key); }

tool_parser tool_parser_start(const tool_cli *cli, int argc, char **argv) {
    tool_parser p = {cli, argc, argv, NULL, NULL, -1, 0};
    size_t s = 0;
    shorts[s++] = ':'; /* a missing value is told apart from an unknown option */
    for (const tool_option *o = cli->options; o->name && p.n < TOOL_MAX_OPTIONS; ++o, ++p.n) {
        const int has = o->arg == TOOL_VALUE      ? required_argument
                        : o->arg == TOOL_OPTIONAL ? optional_argument
                                                  : no_argument;
        longs[p.n] = (struct option){o->name, has, NULL, o->key};
        if (has_short(o->key)) {
            shorts[s++] = (char)o->key;
            if (o->arg != TOOL_FLAG) { shorts[s++] = ':'; }
            if (o->arg == TOOL_OPTIONAL) { shorts[s++] = ':'; }
        }
    }
    longs[p.n] = (struct option){"help", no_argument, NULL, KEY_HELP};
    longs[p.n + 1] = (struct option){"version", no_argument, NULL, KEY_VERSION};
    longs[p.n + 2] = (struct option){NULL, 0, NULL, 0};
    shorts[s++] = 'h';
    shorts[s] = '\0';
    optind = 1;
    opterr = 0; /* the messages are ours: one line each, then the hint */
    return p;
}

static const tool_option HELP = {"help", KEY_HELP, TOOL_FLAG, NULL, "print this help and exit"};
static const tool_option VERSION = {"version", KEY_VERSION, TOOL_FLAG, NULL,
                                    "print the version and exit"};

static const tool_option *by_key(const tool_cli *cli, int key) {
    for (const tool_option *o = cli->options; o->name; ++o) {
        if (o->key == key) { return o; }
    }
    return key == KEY_HELP ? &HELP : key == KEY_VERSION ? &VERSION : NULL;
}

int tool_usage_error(const tool_cli *cli) {
    fprintf(stderr, "Try '%s --help' for more.\n", cli->tool);
    return 2;
}

/* A usage error: its one line and the hint; ends the parse. */
static int refuse(tool_parser *p, const char *what, const char *arg) {
    fprintf(stderr, "%s: %s '%s'\n", p->cli->tool, what, arg);
    p->status = tool_usage_error(p->cli);
    return 0;
}

int tool_next(tool_parser *p) {
    if (p->status >= 0) { return 0; }
    p->value = p->name = NULL;
    int idx = -1;
    const int c = getopt_long(p->argc, p->argv, shorts, longs, &idx);
    const tool_option *o = c > 0 && c != '?' && c != ':' ? by_key(p->cli, c) : NULL;
    if (c == -1) {
        if (optind < p->argc) { return refuse(p, "unexpected argument", p->argv[optind]); }
        p->status = -1;
        return 0;
    }
    if (c == ':' || (c == '?' && optopt && by_key(p->cli, optopt))) {
        /* optopt is the option's key: its value is missing, or a flag was given one */
        const tool_option *k = by_key(p->cli, optopt);
        fprintf(stderr, "%s: --%s %s\n", p->cli->tool, k ? k->name : "?",
                c == ':' ? "needs a value" : "takes no value");
        p->status = tool_usage_error(p->cli);
        return 0;
    }
    if (c == '?') {
        char letter[3] = {'-', (char)optopt, '\0'};
        return refuse(p, "unknown option", optopt ? letter : p->argv[optind - 1]);
    }
    if (c == KEY_HELP) {
        tool_print_help(p->cli, stdout);
        p->status = 0;
        return 0;
    }
    if (c == KEY_VERSION) {
        printf("%s (clffn) %s\n", p->cli->tool, clffn_version_string());
        p->status = 0;
        return 0;
    }
    p->value = optarg;
    p->name = o ? o->name : "?";
    return c;
}

const char *tool_take_word(tool_parser *p, const char *const words[]) {
    if (optind >= p->argc) { return NULL; }
    for (const char *const *w = words; *w; ++w) {
        if (!strcmp(p->argv[optind], *w)) { return p->argv[optind++]; }
    }
    return NULL;
}

/* "  -k, --name VALUE" or "      --name[=VALUE]" into buf; returns its length. */
static int option_label(const tool_option *o, char *buf, size_t size) {
    const char *fmt = o->arg == TOOL_VALUE      ? "%s--%s %s"
                      : o->arg == TOOL_OPTIONAL ? "%s--%s[=%s]"
                                                : "%s--%s";
    char head[8] = "    ";
    if (has_short(o->key)) { snprintf(head, sizeof head, "-%c, ", o->key); }
    return snprintf(buf, size, fmt, head, o->name, o->value ? o->value : "V");
}

/* text's lines, the first after the label, the rest indented to the help column */
static void print_lines(FILE *f, const char *text, int column) {
    for (const char *line = text; *line;) {
        const char *end = strchr(line, '\n');
        const int len = end ? (int)(end - line) : (int)strlen(line);
        fprintf(f, "%.*s\n", len, line);
        if (!end) { break; }
        line = end + 1;
        fprintf(f, "%*s", column, "");
    }
}

/* One option's help line(s), the help at column, a space at least after the label (or on the
 * next line when the label leaves none). */
static void print_option(FILE *f, const tool_option *o, int column) {
    char label[128];
    const int w = option_label(o, label, sizeof label);
    if (w + 3 > column) {
        fprintf(f, "  %s\n%*s", label, column, "");
    } else {
        fprintf(f, "  %-*s", column - 2, label);
    }
    print_lines(f, o->help, column);
}

void tool_print_help(const tool_cli *cli, FILE *f) {
    enum { WIDEST = 26 }; /* a wider label puts its help on the next line */
    const char *syn = cli->synopsis;
    for (int first = 1; syn && *syn; first = 0) {
        const char *end = strchr(syn, '\n');
        const int len = end ? (int)(end - syn) : (int)strlen(syn);
        fprintf(f, "%s%s %.*s\n", first ? "usage: " : "       ", cli->tool, len, syn);
        syn = end ? end + 1 : syn + len;
    }
    int column = (int)strlen("    --version");
    char label[128];
    for (const tool_option *o = cli->options; o->name; ++o) {
        const int w = option_label(o, label, sizeof label);
        if (o->help && w <= WIDEST && w > column) { column = w; }
    }
    column += 4;
    fprintf(f, "options:\n");
    for (const tool_option *o = cli->options; o->name; ++o) {
        if (o->help) { print_option(f, o, column); }
    }
    print_option(f, &HELP, column);
    print_option(f, &VERSION, column);
    if (cli->notes) { fputs(cli->notes, f); }
}
