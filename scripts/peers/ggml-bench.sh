#!/usr/bin/env bash
# Builds ggml's CPU backend from a checkout (https://github.com/ggml-org/ggml, or llama.cpp's
# ggml/ folder) as llama.cpp builds it by default (Release, GGML_NATIVE: the host's instruction
# set), and links scripts/peers/ggml_ffn.c and ggml_moe.c against it.
#   scripts/peers/ggml-bench.sh GGML_DIR [OUT_DIR]   -> OUT_DIR/ggml_ffn, ggml_moe (default
#                                                      /tmp/ggml-peer)
set -euo pipefail
src=${1:?usage: ggml-bench.sh GGML_DIR [OUT_DIR]}
out=${2:-/tmp/ggml-peer}
here=$(cd "$(dirname "$0")" && pwd)
cmake -S "$src" -B "$out/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_OPENMP=OFF \
  -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >/dev/null
cmake --build "$out/build" -j "$(nproc)" >/dev/null
for prog in ggml_ffn ggml_moe; do
  cc -O2 -std=c11 -Wall -o "$out/$prog" "$here/$prog.c" -I"$src/include" \
    -L"$out/build/src" -lggml -lggml-cpu -lggml-base -lstdc++ -lm -lpthread
  echo "$out/$prog"
done
