#!/bin/sh
# clffn-run on the Oclgrind device, checked and then left: it must exit 0 with the result within
# tolerance, and nothing may be reported on the way out, neither by Oclgrind nor by valgrind.
# Usage: exit.sh oclgrind|valgrind CLFFN_RUN FIXTURE OCLGRIND_RT
set -eu
mode=$1 run=$2 fixture=$3 rt=$4
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$fixture" "$dir"
set -- "$run" --weights "$dir/w.safetensors" --input "$dir/x.npy" --output "$dir/y.npy" --verify
case $mode in
  oclgrind) oclgrind --check-api --data-races --uninitialized "$@" ;;
  # Oclgrind's runtime in place of the ICD loader's, the process under valgrind: a release of
  # an OpenCL object after the runtime's teardown is an invalid access valgrind reports
  valgrind) LD_PRELOAD=$rt valgrind --error-exitcode=97 --quiet "$@" ;;
esac
test -s "$dir/y.npy"
echo "exit.sh: clffn-run exited cleanly under $mode"
