#!/usr/bin/env bash
# The decoding shape (1 token, 4096 -> 11008, SwiGLU) in every weight type, side by side in one
# run: clffn (clffn-bench), ggml's CPU backend (ggml_ffn from ggml-bench.sh) on the same number
# of threads as the machine has cores, and OpenBLAS's f32 FFN (clffn-bench --compare-cpu, the
# faster of its detected core and the best the CPU's flags allow), all without biases, as
# ggml_ffn and the models of that shape have them. Each round runs every contender once, in
# turn; the table gives the best of the rounds, in ms.
#   scripts/peers/decode-compare.sh BUILD_DIR GGML_FFN [rounds] [reps]
set -euo pipefail
build=${1:?usage: decode-compare.sh BUILD_DIR GGML_FFN [rounds] [reps]}
ggml=${2:?usage: decode-compare.sh BUILD_DIR GGML_FFN [rounds] [reps]}
rounds=${3:-3}
reps=${4:-20}
bench="$build/clffn-bench"
shape=(--tokens 1 --d-model 4096 --d-ff 11008 --activation swiglu --bias off)
threads=$(nproc)
field() { awk -v k="\"$1\":" '{ for (i = 1; i <= NF; ++i) if ($i == k) { gsub(/[,"]/, "", $(i+1)); print $(i+1); exit } }'; }
declare -A best
keep() { # keep KEY MS: the smaller
  if [[ -z ${best[$1]:-} ]] || awk -v a="$2" -v b="${best[$1]}" 'BEGIN { exit !(a < b) }'; then best[$1]=$2; fi
}
types=(f32 f16 bf16 q8_0 q4_0)
for ((r = 1; r <= rounds; ++r)); do
  for t in "${types[@]}"; do
    extra=()
    [[ $t == f32 ]] && extra=(--compare-cpu)
    j=$("$bench" --json --reps "$reps" --weights-dtype "$t" "${shape[@]}" "${extra[@]}")
    keep "clffn $t" "$(awk -v s="$(field best_s <<<"$j")" 'BEGIN { printf "%.3f", s * 1e3 }')"
    keep "copy" "$(awk -v g="$(field copy_gbps <<<"$j")" 'BEGIN { printf "%.3f", 1000 / g }')"
    if [[ $t == f32 ]]; then
      cb=$(awk '/"cpu_blas"/{f=1} f && /"best_s":/{gsub(/,/,"",$2); print $2; exit}' <<<"$j")
      keep "openblas" "$(awk -v s="$cb" 'BEGIN { printf "%.3f", s * 1e3 }')"
      core=$(field core <<<"$j")
      j=$("$bench" --json --reps "$reps" "${shape[@]}" --weight-layout out_in --kernel-max 16)
      keep "clffn f32 out_in" "$(awk -v s="$(field best_s <<<"$j")" 'BEGIN { printf "%.3f", s * 1e3 }')"
    fi
    g=$("$ggml" "$t" 1 4096 11008 "$threads" "$reps")
    keep "ggml $t" "$(sed -E 's/.*best ([0-9.]+) ms.*/\1/' <<<"$g")"
  done
done
echo "OpenBLAS f32 FFN: ${best[openblas]} ms (core $core); device copy bandwidth $(awk -v m="${best[copy]}" 'BEGIN { printf "%.1f", 1000 / m }') GB/s (best of the rounds)"
echo
echo "| weights | clffn (ms) | ggml, $threads threads (ms) | clffn speed / ggml speed | clffn speed / OpenBLAS f32 speed |"
echo "|---|---|---|---|---|"
for t in "${types[@]}"; do
  c=${best["clffn $t"]}; g=${best["ggml $t"]}
  awk -v t="$t" -v c="$c" -v g="$g" -v o="${best[openblas]}" \
    'BEGIN { printf "| %s | %.2f | %.2f | **%.2f×** | %.1f× |\n", t, c, g, g / c, o / c }'
done
c=${best["clffn f32 out_in"]}; g=${best["ggml f32"]}
awk -v c="$c" -v g="$g" -v o="${best[openblas]}" \
  'BEGIN { printf "| f32, kept [out, in], --kernel-max 16 | %.2f | %.2f | **%.2f×** | %.1f× |\n", c, g, g / c, o / c }'
