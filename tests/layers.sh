#!/bin/sh
# The library's files call only downwards: given its object files in layer order (bottom first,
# as CMakeLists.txt lists them), every call from one file into another must go to a file listed
# before it. That makes circles impossible; tsort confirms it independently. Reads the symbol
# tables (nm), so it checks what was compiled, not what the headers promise.
#   tests/layers.sh OBJECT...
set -eu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
i=0
for o in "$@"; do
    i=$((i + 1))
    f=$(basename "$o" | sed 's/\.c\.o$//; s/\.o$//')
    echo "$f $i" >>"$tmp/rank"
    nm -g --defined-only "$o" | awk -v f="$f" 'NF == 3 { print $3, f }' >>"$tmp/defs"
    nm -u "$o" | awk -v f="$f" '{ print $NF, f }' >>"$tmp/uses"
done
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
if ! tsort "$tmp/edges" >/dev/null 2>"$tmp/loops"; then
    echo "FAIL: a circle among the files:"
    cat "$tmp/loops"
    exit 1
fi
echo "calls between files (caller -> callee):"
awk '{ print "  " $1 " -> " $2 }' "$tmp/edges"
echo "PASS: $i files, $(wc -l <"$tmp/edges") file-to-file call pairs, all downwards, no circle"
