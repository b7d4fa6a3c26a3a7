#!/bin/sh
# The weight kernels (cl/weights.cl) compiled by clang for the x86 CPUs whose forms they hold, as
# POCL compiles them for its CPU device: AVX2 alone (haswell), AVX-512BW (skylake-avx512), and
# AVX-512 with VNNI and BF16 (sapphirerapids), every weight type at 1 and 16 tokens; the
# quantized types also at 1 and 4 tokens in their AVX2 form on the AVX-512 targets
# (-DCLFFN_QX_AVX512=0, which clffn__set_cpu_dot_products(2) asks for). The suite's POCL runs
# only its own host's target, so a form for another CPU would otherwise reach no compiler here.
# To IR, unoptimized: what fails is the source (an undeclared function, a builtin the target
# lacks), not the speed. The options are src/program.c's for a CPU device, with its
# activations' and weight types' ids as -DCLFFN_ACT_<NAME> and -DCLFFN_WTYPE_<NAME>, read from
# the public header's enums.
# Usage: x86_kernels.sh CLANG SOURCE_DIR
set -u
clang=$1 top=$2
src=$(mktemp)
trap 'rm -f "$src" "$src.err"' EXIT
cat "$top/cl/clffn_defs.h" "$top/cl/activation.cl" "$top/cl/weights.cl" >"$src" || exit 1
enums=$(sed -n -E -e 's/^ *CLFFN_ACT_([A-Z_]+) = ([0-9]+),.*/-DCLFFN_ACT_\1=\2/p' \
  -e 's/^ *CLFFN_DTYPE_([A-Z0-9_]+) = ([0-9]+),.*/-DCLFFN_WTYPE_\1=\2/p' "$top/include/clffn.h")
[ -n "$enums" ] || { echo "x86_kernels.sh: no enums in $top/include/clffn.h"; exit 1; }
failed=0 built=0
build() { # build MARCH VNNI_AND_BF16 WTYPE TOKENS [EXTRA]
  # shellcheck disable=SC2086
  if "$clang" -x cl -cl-std=CL1.2 -Xclang -finclude-default-header -w \
      -target x86_64-unknown-linux-gnu -march="$1" -O0 -emit-llvm -c "$src" -o /dev/null \
      -DCLFFN_ACT=3 -DCLFFN_GATED=1 -DCLFFN_DROPOUT=0 -DCLFFN_WTYPE="$3" -DCLFFN_WTOKENS="$4" \
      -DCLFFN_ROW_SPLIT=1 -DCLFFN_ROW_ROWS=4 -DCLFFN_COL_WIDTH=32 -DCLFFN_COL_SPLIT=1 \
      -DCLFFN_COL_GROUPS=8 -DCLFFN_SOFT_HALF=1 -DCLFFN_QX_VNNI="$2" -DCLFFN_CPU_BF16="$2" \
      -DCLFFN_ROW_DIRECT=1 ${5:-} $enums 2>"$src.err"; then
    built=$((built + 1))
  else
    echo "x86_kernels.sh: -march=$1 vnni/bf16 $2 type $3 tokens $4 ${5:-}: failed"
    head -20 "$src.err"
    failed=1
  fi
}
for target in haswell:0 skylake-avx512:0 sapphirerapids:1; do
  march=${target%:*} dots=${target#*:}
  for t in 0 1 2 3 4; do
    for tokens in 1 16; do build "$march" "$dots" "$t" "$tokens"; done
  done
  if [ "$march" != haswell ]; then
    for t in 3 4; do
      for tokens in 1 4; do build "$march" 0 "$t" "$tokens" -DCLFFN_QX_AVX512=0; done
    done
  fi
done
[ "$failed" = 0 ] && echo "x86_kernels.sh: $built programs built"
exit "$failed"
