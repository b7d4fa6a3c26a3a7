#!/bin/sh
# valgrind memcheck over the Criterion suites, every worker process included:
#   tests/valgrind/run.sh build [suite ...]     (default: every suite)
# A suite passes when its tests pass and no process reports a memcheck error or a definite
# leak beyond tests/valgrind/clffn.supp. Slow: valgrind's CPU has no AVX-512, so POCL builds its
# kernels again for that CPU (cached afterwards in POCL's cache), and everything runs ~50x slower.
# The RLIMIT_AS tests of test_memory skip themselves (valgrind manages the address space).
set -u
build=${1:?usage: run.sh BUILD_DIR [suite ...]}
shift
here=$(cd "$(dirname "$0")" && pwd)
suites=${*:-"loaders philox errors api faults threads ieee memory dropout backward forward tools"}
logs=$(mktemp -d)
status=0
for s in $suites; do
  rm -f "$logs"/*.log
  start=$(date +%s)
  valgrind --trace-children=yes --trace-children-skip='/usr/*,/bin/*' --leak-check=full \
    --show-leak-kinds=definite --errors-for-leak-kinds=definite --error-exitcode=99 \
    --suppressions="$here/clffn.supp" --log-file="$logs/%p.log" \
    "$build/tests/test_$s" --jobs 1 >"$logs/out.txt" 2>&1
  rc=$?
  errors=$(grep -h "ERROR SUMMARY" "$logs"/*.log | awk '{s += $4} END {print s + 0}')
  procs=$(ls "$logs"/*.log | wc -l)
  verdict=ok
  if [ "$rc" -ne 0 ] || [ "$errors" -ne 0 ]; then verdict=FAIL; status=1; fi
  echo "$s: $verdict (exit $rc, $errors errors in $procs processes, $(( $(date +%s) - start )) s)"
  if [ "$verdict" = FAIL ]; then
    grep -h -A12 "ERROR SUMMARY: [1-9]\|definitely lost in\|Invalid\|uninitialised" "$logs"/*.log | head -60
    tail -5 "$logs/out.txt"
  fi
done
rm -rf "$logs"
exit $status
