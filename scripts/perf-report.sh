#!/usr/bin/env bash
# Measures the performance tables of docs/PERFORMANCE.md in one run: each shape through clffn and,
# in the same process, through OpenBLAS (clffn-bench --compare-cpu, which also tries the best
# OpenBLAS core the CPU's flags allow and keeps the faster), with the tuning profile the library
# applies and with CLBlast's own parameters (CLFFN_NO_TUNING=1); then the decoding shape with the
# weights in each stored type against the same OpenBLAS f32 FFN.
#   scripts/perf-report.sh [build-dir] [reps]
set -euo pipefail
build=${1:-build}
reps=${2:-10}
bench="$build/clffn-bench"

field() { # field NAME < json: the first value after "NAME": (quotes and commas dropped)
  awk -v k="\"$1\":" '{ for (i = 1; i <= NF; ++i) if ($i == k) { gsub(/[,"]/, "", $(i+1)); print $(i+1); exit } }'
}

row() { # row LABEL ARGS...
  local label=$1; shift
  local tuned plain
  tuned=$("$bench" --json --compare-cpu --reps "$reps" "$@")
  plain=$(CLFFN_NO_TUNING=1 "$bench" --json --reps "$reps" "$@")
  local g c r epi g1 e1 g2 e2 tot d core
  g=$(field gflops <<<"$tuned"); r=$(field ratio_vs_cpu_blas <<<"$tuned")
  core=$(field core <<<"$tuned")
  c=$(awk '/"cpu_blas"/{f=1} f && /"gflops":/{gsub(/,/,"",$2); print $2; exit}' <<<"$tuned")
  d=$(field gflops <<<"$plain")
  g1=$(field gemm1_s <<<"$tuned"); e1=$(field epilogue1_s <<<"$tuned")
  g2=$(field gemm2_s <<<"$tuned"); e2=$(field epilogue2_s <<<"$tuned"); tot=$(field total_s <<<"$tuned")
  epi=$(awk -v a="$e1" -v b="$e2" -v t="$tot" 'BEGIN { printf "%.1f", 100 * (a + b) / t }')
  printf '| %s | %.1f | %.1f | %.1f (%s) | **%.2f×** | %s%% |\n' "$label" "$d" "$g" "$c" "$core" "$r" "$epi"
}

echo "| shape | clffn, CLBlast defaults (GFLOP/s) | clffn, tuned (GFLOP/s) | OpenBLAS FFN (GFLOP/s, core) | clffn tuned / OpenBLAS | epilogues' share |"
echo "|---|---|---|---|---|---|"
row "640 tokens, 512 → 2048, ReLU (seed example)" --tokens 640 --d-model 512 --d-ff 2048 --activation relu
row "4096 tokens, 768 → 3072, GELU (BERT-base)" --tokens 4096 --d-model 768 --d-ff 3072 --activation gelu
row "2048 tokens, 1024 → 2816, SwiGLU" --tokens 2048 --d-model 1024 --d-ff 2816 --activation swiglu
row "1 token, 4096 → 11008, SwiGLU (decoding)" --tokens 1 --d-model 4096 --d-ff 11008 --activation swiglu

# The decoding shape with the weights in each type, against OpenBLAS's f32 FFN in the same process.
decode=(--tokens 1 --d-model 4096 --d-ff 11008 --activation swiglu)
echo
echo "| weights | clffn forward (ms) | OpenBLAS f32 FFN (ms, core) | OpenBLAS / clffn | weights read (GB/s) | copy bandwidth (GB/s) | read / copy |"
echo "|---|---|---|---|---|---|---|"
for t in f32 f16 bf16 q8_0 q4_0; do
  j=$("$bench" --json --compare-cpu --reps "$reps" --weights-dtype "$t" "${decode[@]}")
  best=$(field best_s <<<"$j"); wg=$(field weights_gbps <<<"$j"); cp=$(field copy_gbps <<<"$j")
  cb=$(awk '/"cpu_blas"/{f=1} f && /"best_s":/{gsub(/,/,"",$2); print $2; exit}' <<<"$j")
  core=$(field core <<<"$j"); r=$(field ratio_vs_cpu_blas <<<"$j")
  awk -v t="$t" -v b="$best" -v c="$cb" -v core="$core" -v r="$r" -v w="$wg" -v p="$cp" \
    'BEGIN { printf "| %s | %.2f | %.1f (%s) | **%.2f×** | %.1f | %.1f | %.0f%% |\n", t, b * 1e3, c * 1e3, core, r, w, p, 100 * w / p }'
done
