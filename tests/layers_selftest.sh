#!/bin/sh
# tests/layers.sh can fail on a file that only reads the struct fields of a file above it: with
# inspect.c's object moved just below ffn.c's (inspect.c reads clffn_ffn's fields and calls
# nothing of ffn.c), no call goes upwards, and the check must still refuse the order.
#   tests/layers_selftest.sh OBJECT...      (in the library's layer order)
set -u
here=$(dirname "$0")
inspect=
for o in "$@"; do
    case $(basename "$o") in inspect.c.o | inspect.o) inspect=$o ;; esac
done
[ -n "$inspect" ] || { echo "FAIL: no inspect object among the arguments"; exit 1; }
reordered=
for o in "$@"; do
    case $(basename "$o") in
    inspect.c.o | inspect.o) ;;
    ffn.c.o | ffn.o) reordered="$reordered $inspect $o" ;;
    *) reordered="$reordered $o" ;;
    esac
done
# shellcheck disable=SC2086 # the list is word-split on purpose
if out=$(sh "$here/layers.sh" $reordered 2>&1); then
    echo "FAIL: layers.sh accepted inspect.c below the file whose struct it reads:"
    echo "$out"
    exit 1
fi
echo "$out"
case $out in
*"FAIL: includes upwards"*"inspect sees ffn.h"*) echo "PASS: the upward struct use was refused" ;;
*) echo "FAIL: refused, but not for the include of ffn.h" && exit 1 ;;
esac
