#!/usr/bin/env bash
# The tree's style, checked as CI checks it:
#   - every C file of src/, include/, tools/ and tests/ formatted as .clang-format says;
#   - no line over 100 columns in the C sources and the kernels;
#   - in src/ (the library) and tools/ (the installed programs): no file over 500 lines and no
#     function over 80 lines;
#   - in tests/: no file over 800 lines and no function over 80 lines, Criterion's Test and
#     ParameterizedTest bodies counted as functions.
#   scripts/check-style.sh [clang-format binary]      (exits non-zero and names each offence)
set -euo pipefail
cd "$(dirname "$0")/.."
fmt=${1:-clang-format}
export LC_ALL=C.UTF-8 # columns are characters, not bytes
fail=0
# git's pathspecs: '*' matches across folders, so tools/*.c takes tools/clffn-run/main.c too
files() { git ls-files --cached --others --exclude-standard "$@"; }

mapfile -t c_files < <(files 'src/*.[ch]' 'include/*.h' 'tools/*.[ch]' 'tests/*.[ch]')
if ! "$fmt" --dry-run --Werror "${c_files[@]}" 2>/tmp/clffn-format.$$; then
    echo "== not formatted as .clang-format says (run: $fmt -i FILE):"
    grep -E '^[^ ].*: (error|warning):' /tmp/clffn-format.$$ | cut -d: -f1 | sort -u | sed 's/^/  /'
    fail=1
fi
rm -f /tmp/clffn-format.$$

mapfile -t all_files < <(files 'src/*.[ch]' 'include/*.h' 'tools/*.[ch]' 'tests/*.[ch]' 'cl/*')
if long=$(grep -nE '^.{101,}' "${all_files[@]}"); then
    echo "== lines over 100 columns:"
    cut -d: -f1,2 <<<"$long" | sed 's/^/  /'
    fail=1
fi

# sizes PATHSPEC MAX_FILE_LINES MAX_FUNCTION_LINES
sizes() {
    local f n
    for f in $(files "$1"); do
        n=$(wc -l <"$f")
        if ((n > $2)); then
            echo "== $f: $n lines (at most $2)"
            fail=1
        fi
        # a function: from the line that starts its declaration at column 0 to its closing
        # brace at column 0 (the formatter puts both there); Test(suite, name) { … } and
        # ParameterizedTest(…) { … } start the same way, so their bodies count too
        awk -v f="$f" -v max="$3" '
            /^[A-Za-z_].*\(/ && !/;$/ && !in_fn { start = FNR; name = $0 }
            /^\{$/ || /\) \{$/ { if (start && !in_fn) in_fn = 1 }
            /^}/ && in_fn {
                len = FNR - start + 1
                if (len > max) {
                    printf "== %s:%d: function of %d lines (at most %d): %s\n", f, start, len,
                           max, name
                    bad = 1
                }
                in_fn = 0; start = 0
            }
            END { exit bad }' "$f" || fail=1
    done
}
sizes 'src/*.[ch]' 500 80
sizes 'tools/*.[ch]' 500 80
sizes 'tests/*.[ch]' 800 80

if ((fail)); then exit 1; fi
echo "style: ${#c_files[@]} C files formatted, no line over 100 columns, src/ and tools/ within" \
    "500 lines a file and 80 a function, tests/ within 800 and 80"
