#!/bin/sh
# The library's files work only downwards: given its object files in layer order (bottom first,
# as CMakeLists.txt lists them), every file may use only the files listed before it.
#   - calls: every call from one file into another must go to a file listed before it. Read from
#     the symbol tables (nm), so it checks what was compiled, not what the headers promise.
#   - structs: a file's structs (and inline helpers) are defined in its own header, X.h for X.c,
#     and nothing else holds a struct's fields; a file may include only the headers of files
#     listed before it. Read from the compiler's dependency files (X.c.o.d beside each object),
#     so a header reached through another counts too: a file that could use the fields of a
#     file above it fails, as one that calls it does.
# Both together make circles impossible; tsort confirms it independently.
#   tests/layers.sh OBJECT...
set -eu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ $# -lt 2 ]; then
    echo "FAIL: $# object files given; the library has more (one argument per file)"
    exit 1
fi
i=0
for o in "$@"; do
    if [ ! -f "$o" ]; then
        echo "FAIL: no object file '$o'"
        exit 1
    fi
    i=$((i + 1))
    f=$(basename "$o" | sed 's/\.c\.o$//; s/\.o$//')
    echo "$f $i" >>"$tmp/rank"
    nm -g --defined-only "$o" | awk -v f="$f" 'NF == 3 { print $3, f }' >>"$tmp/defs"
    nm -u "$o" | awk -v f="$f" '{ print $NF, f }' >>"$tmp/uses"
    if [ -f "$o.d" ]; then
        # the src/ headers it includes, directly or not: "file header"
        tr ' \\' '\n\n' <"$o.d" | grep '/src/[^/]*\.h$' | sed 's#.*/##; s/\.h$//' | sort -u |
            awk -v f="$f" '{ print f, $1 }' >>"$tmp/includes"
    elif [ "$f" != kernels_embedded ]; then
        echo "FAIL: no dependency file $o.d (the struct check reads what the compiler included)"
        exit 1
    fi
done
touch "$tmp/includes"
# caller callee, one line per pair of files
awk 'NR == FNR { def[$1] = $2; next } ($1 in def) && def[$1] != $2 { print $2, def[$1] }' \
    "$tmp/defs" "$tmp/uses" | sort -u >"$tmp/edges"
bad=$(awk 'NR == FNR { rank[$1] = $2; next } rank[$2] > rank[$1] { print "  " $1 " -> " $2 }' \
    "$tmp/rank" "$tmp/edges")
if [ -n "$bad" ]; then
    echo "FAIL: calls upwards, against the layer order:"
    echo "$bad"
    exit 1
fi
# includer owner, for the headers of files in the list (X.h belongs to X.c)
awk 'NR == FNR { rank[$1] = $2; next } ($2 in rank) && $1 != $2 { print $1, $2 }' \
    "$tmp/rank" "$tmp/includes" | sort -u >"$tmp/sees"
bad=$(awk 'NR == FNR { rank[$1] = $2; next } rank[$2] > rank[$1] {
              print "  " $1 " sees " $2 ".h, the struct fields of a file above it" }' \
    "$tmp/rank" "$tmp/sees")
if [ -n "$bad" ]; then
    echo "FAIL: includes upwards, against the layer order:"
    echo "$bad"
    exit 1
fi
# a header that belongs to no file may hold no struct: its fields would belong to no layer
src=$(dirname "$0")/../src
for h in $(awk '{ print $2 }' "$tmp/includes" | sort -u); do
    grep -q "^$h " "$tmp/rank" && continue
    if grep -qE '^(typedef )?(struct|union) [A-Za-z_0-9]* *\{' "$src/$h.h"; then
        echo "FAIL: src/$h.h defines a struct but belongs to no file of the library (X.h for X.c)"
        exit 1
    fi
done
cat "$tmp/edges" "$tmp/sees" | sort -u >"$tmp/all"
if ! tsort "$tmp/all" >/dev/null 2>"$tmp/loops"; then
    echo "FAIL: a circle among the files:"
    cat "$tmp/loops"
    exit 1
fi
echo "calls between files (caller -> callee):"
awk '{ print "  " $1 " -> " $2 }' "$tmp/edges"
echo "PASS: $i files, $(wc -l <"$tmp/edges") file-to-file call pairs and" \
    "$(wc -l <"$tmp/sees") includes of other files' headers, all downwards, no circle"
