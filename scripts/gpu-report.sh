#!/usr/bin/env bash
# The GPU section of docs/PERFORMANCE.md and the checks behind it, on a machine with a GPU driver
# but none of Debian's OpenCL packages: a build made elsewhere, with its shared libraries bundled
# in BUILD/gpu-lib and a BUILD/gpu-env.sh that points the bundled ICD loader at the vendor's
# OpenCL driver, is run here through that driver.
#   scripts/gpu-report.sh BUILD OUT STEPS...
# STEPS, in the order given: env (driver, clffn-devices, --check), tests (every Criterion program
# run directly, as ctest's files hold the building machine's paths; the logs of failing ones
# kept), erf (the exhaustive erf sweep, in the background; `wait` ends it), bench (clffn-bench
# on the shapes of the table, then PyTorch's fp32 FFN on the same shapes), gemms
# (clffn-bench-gemms), tune (clffn-tune into OUT/tune, BUDGET seconds, on TUNE_SHAPE; its log in
# OUT/tune.log), compare (each shape with CLBlast's defaults, with each profile folder of COMPARE
# (default OUT/tune; a folder with no profile for the device means the built-in one), then
# PyTorch, in turn), decode (one token, 4096 -> 11008 SwiGLU: f32 through the profile's path and
# through clffn's kernel, every stored type with the weights kept either way, then PyTorch in
# fp32, fp16 and bf16), kernels (clffn-tune's own children: the few-token kernels' shapes at one
# token and their crossovers, on that shape, f32 inputs and quantized ones), moe (Mixtral's layer, D 4096, F 14336, 8 experts,
# top-2, at 1 and 512 tokens in f32, f16 and q8_0, then scripts/torch-moe-bench.py), prefill (the
# seed and SwiGLU shapes with each stored type), fewrows (a few-rows Xgemm set of the device's
# own, as the H200's profile has: clffn-tune's Xgemm search on the seed shape, stopped after
# FEW_BUDGET seconds (default 115) or at its end, its winner set below FEW_ROWS tokens (2048) over
# the profile that applies now, with the direct kernel below FEW_CROSS³ (768); that profile in
# OUT/fewrows-profile.json, timed against the one applied now from 64 to 2048 tokens (FEW_COUNTS)
# on the seed and BERT widths and on the BERT and SwiGLU shapes, then PyTorch; FEW_SET, a profile
# file, takes its few-rows set (else its Xgemm set) in place of the search), hostcosts (the host's time
# in the driver's enqueue calls per forward, scripts/cl-host-costs.c preloaded: one decoding token
# of 4096 -> 11008 SwiGLU and Mixtral's layer with 8 (its counts on the device with its experts
# grouped, then one at a time, then the counts on the host) and with 2 experts, f16 and q8_0;
# the medians of each forward's launches, enqueue, argument and wait times), fused (the
# epilogues in the few-token products' kernels against launches of their own,
# --fused-epilogues on and off alternated in ROUNDS rounds (default 3): one decoding token of
# 4096 -> 11008 SwiGLU in f16, q8_0 and f32 through clffn's kernel, Mixtral's layer and Qwen3's
# (D 2048, F 768, 128 experts, top-8) at one token in f16 and q8_0; then PyTorch fp16 and fp32
# on the decoding shape), bars (the targets alone, in about five minutes where a machine is lent
# for minutes, not hours: one decoding token in f32 through clffn's kernel and in f16, each with
# the epilogues fused and not, and in q8_0; PyTorch fp32 and fp16 on it; the seed shape beside
# PyTorch fp32; Mixtral's layer at one token in f16 and q8_0 and at 512 in f16, each beside the
# dense FFN, then PyTorch's layer in fp16; prefill, the seed and 2048-token SwiGLU shapes in f32,
# f16 and q8_0), variants (forms of the few-token kernels that cl/weights.cl's #defines choose,
# timed on one decoding token in f16 and bf16, alternated over ROUNDS rounds (default 3), then
# PyTorch fp16: VARIANTS, names each with its defines, "name:NAME=VALUE,NAME=VALUE" or a bare
# name for the kernels as they are, each made a kernel folder from cl/ for CLFFN_KERNEL_DIR).
# Every step has its own time limit; a failing step does not stop the others.
set -uo pipefail
build=${1:?usage: gpu-report.sh BUILD OUT STEPS...}
out=${2:?usage: gpu-report.sh BUILD OUT STEPS...}
shift 2
reps=${REPS:-20}
budget=${BUDGET:-150}
tune_shape=${TUNE_SHAPE:---tokens 4096 --d-model 768 --d-ff 3072}
mkdir -p "$out"
# shellcheck disable=SC1091
source "$build/gpu-env.sh"
# the tools' tests find the tools by the paths compiled in on the building machine: that path,
# where it does not exist here, becomes a link to this build
built=$(sed -n 's/^CMAKE_CACHEFILE_DIR:INTERNAL=//p' "$build/CMakeCache.txt")
if [[ -n $built && ! -e $built ]]; then
    mkdir -p "$(dirname "$built")" && ln -sfn "$(cd "$build" && pwd)" "$built" ||
        echo "gpu-report: no link at $built: the tools' tests will not find the tools" >&2
fi

shapes=("640 512 2048 relu" "4096 768 3072 gelu" "2048 1024 2816 swiglu" "1 4096 11008 swiglu")

clffn_bench() { # clffn_bench T D F ACT [env...]: one JSON line of the fields the table needs
    local t=$1 d=$2 f=$3 act=$4
    timeout 120 "$build/clffn-bench" --json --reps "$reps" --tokens "$t" --d-model "$d" \
        --d-ff "$f" --activation "$act" |
        python3 -c 'import json,sys; j=json.load(sys.stdin); s=j["stages"];
print(json.dumps({"shape": "%d,%d,%d,%s" % (j["tokens"], j["d_model"], j["d_ff"], j["activation"] + ("+gate" if j["gated"] else "")),
  "tuning": j["tuning"], "best_ms": round(j["best_s"]*1e3, 4), "median_ms": round(j["median_s"]*1e3, 4),
  "gflops": round(j["gflops"], 1), "gemm_ms": round((s["gemm1_s"]+s["gemm2_s"])*1e3, 4),
  "epilogue_share": round((s["epilogue1_s"]+s["epilogue2_s"])/s["total_s"], 4),
  "stage_total_ms": round(s["total_s"]*1e3, 4), "weights_gbps": round(j["weights_gbps"], 1),
  "copy_gbps": round(j["copy_gbps"], 1), "backward_ms": round(j["backward_best_s"]*1e3, 4),
  "startup_s": round(j["startup_s"], 3)}))'
}

bench_text() { # bench_text LABEL ARGS...: the lines of clffn-bench's report that the tables need
    local label=$1
    shift
    echo "--- $label"
    timeout 240 "$build/clffn-bench" --reps "$reps" "$@" 2>&1 |
        grep -E '^(forward|weights read|stages|backward|own kernels|weights kept|GEMVs up|layer|dense FFN|clffn-bench)'
}

kernel_children() { # kernel_children MODE:ARG: clffn-tune's kernel child per type and layout
    local kept t
    for kept in 0 1; do
        for t in q4_0 q8_0 f16 f32; do
            [[ $kept == 1 && $t == q* ]] && continue # quantized rows are [out, in] only
            echo "$t kept $kept: $(timeout 120 "$build/clffn-tune" --eval --kernels "$t:$1" \
                --tokens 1 --d-model 4096 --d-ff 11008 --gated --gemv 1 --kept $kept)"
        done
    done
}

torch_bench() {
    local args=()
    for s in "$@"; do read -r t d f act <<<"$s"; args+=("$t,$d,$f,$act"); done
    timeout 180 python3 scripts/torch-ffn-bench.py --json --reps "$reps" "${args[@]}"
}

for step in "$@"; do
    echo "=== $step $(date -u +%T)"
    case $step in
    env)
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.sm \
            --format=csv 2>&1
        python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
        timeout 60 "$build/clffn-devices" 2>&1
        timeout 120 "$build/clffn-devices" --check 2>&1
        echo "clffn-devices --check: exit $?"
        ;;
    tests)
        for t in "$build"/tests/test_*; do
            case ${t##*/} in test_oclgrind | test_mpi) continue ;; esac
            [[ -x $t ]] || continue
            echo "--- ${t##*/}"
            log=/tmp/gpu-report-${t##*/}.log
            timeout 200 "$t" --jobs 8 >"$log" 2>&1
            rc=$?
            echo "exit $rc: $(grep -a 'Synthesis' "$log")"
            if [[ $rc -ne 0 ]]; then
                grep -a -E '\[FAIL\]|CRASH|Assertion|assert' "$log" | head -20
                cp "$log" "$out/"
            fi
        done
        ;;
    erf)
        CLFFN_ERF_EXHAUSTIVE=1 timeout 400 "$build/tests/test_erf" --filter 'erf/exhaustive' \
            >"$out/erf-exhaustive.txt" 2>&1 &
        ;;
    wait) wait ;;
    bench)
        for s in "${shapes[@]}"; do clffn_bench $s; done
        torch_bench "${shapes[@]}"
        ;;
    gemms)
        for s in "640 512 2048" "4096 768 3072" "2048 1024 2816 --gated"; do
            read -r t d f g <<<"$s"
            timeout 60 "$build/clffn-bench-gemms" --reps "$reps" --tokens "$t" --d-model "$d" \
                --d-ff "$f" $g 2>&1
        done
        ;;
    tune)
        # shellcheck disable=SC2086
        CLFFN_TUNE_DIR=$out/tune timeout $((budget + 120)) "$build/clffn-tune" --budget "$budget" \
            $tune_shape 2>&1 | tr '\r' '\n' | grep -v '^\s*$' >"$out/tune.log"
        grep -v $'^\t' "$out/tune.log"
        ;;
    compare)
        for s in "${shapes[@]}"; do
            CLFFN_NO_TUNING=1 clffn_bench $s
            for dir in ${COMPARE:-$out/tune}; do
                CLFFN_TUNE_DIR=$dir clffn_bench $s
            done
            torch_bench "$s"
        done
        ;;
    decode)
        d=(--tokens 1 --d-model 4096 --d-ff 11008 --activation swiglu)
        bench_text "f32, the profile's path" "${d[@]}"
        for l in in_out out_in; do
            bench_text "f32 kernel, $l" "${d[@]}" --kernel-max 1 --weight-layout $l
            for t in f16 bf16; do bench_text "$t, $l" "${d[@]}" --weights-dtype $t --weight-layout $l; done
        done
        for t in q8_0 q4_0; do bench_text "$t" "${d[@]}" --weights-dtype $t; done
        for t in fp32 fp16 bf16; do
            timeout 120 python3 scripts/torch-ffn-bench.py --dtype $t --reps "$reps" 1,4096,11008,swiglu
        done
        ;;
    kernels)
        shapes=${SHAPES:-"32,4,8,16,8;32,8,8,32,8;16,8,8,32,8;32,2,8,32,4;64,2,8,32,8;8,16,8,32,8;32,4,16,32,8;32,16,8,64,4"}
        echo "shapes: $shapes (seconds, best of 4 rounds, one token)"
        kernel_children "shapes:$shapes"
        for c in ${CROSS:-32,4,8,16,8}; do
            echo "crossovers (kernels, other path) at 1, 2, 4 ... 1024 tokens (in passes of 16" \
                "past 16) up to the kernels' first loss, shape $c:"
            kernel_children "cross:$c"
            for t in q8_0 bf16; do # KERNEL_MAX_TOKENS_QX
                echo "$t quantized inputs: $(timeout 120 "$build/clffn-tune" --eval --kernels \
                    "$t:crossqx:$c" --tokens 1 --d-model 4096 --d-ff 11008 --gated --gemv 1 --kept 0)"
            done
        done
        ;;
    moe)
        # no biases, as Mixtral's experts and torch-moe-bench.py's
        m=(--d-model 4096 --d-ff 14336 --activation swiglu --experts 8 --top-k 2 --bias off)
        for t in f32 f16 q8_0; do bench_text "MoE, 1 token, $t" --tokens 1 "${m[@]}" --weights-dtype $t; done
        for t in f32 f16; do bench_text "MoE, 512 tokens, $t" --tokens 512 "${m[@]}" --weights-dtype $t; done
        for t in fp32 fp16; do
            timeout 240 python3 scripts/torch-moe-bench.py --dtype $t --reps "$reps" 1,4096,14336,8,2 \
                512,4096,14336,8,2
        done
        ;;
    prefill)
        for s in "640 512 2048 relu" "2048 1024 2816 swiglu"; do
            read -r t d f a <<<"$s"
            for ty in f32 f16 bf16 q8_0 q4_0; do
                bench_text "$ty, $s" --tokens "$t" --d-model "$d" --d-ff "$f" --activation "$a" --weights-dtype $ty
            done
        done
        timeout 120 python3 scripts/torch-ffn-bench.py --reps "$reps" 640,512,2048,relu 2048,1024,2816,swiglu
        ;;
    fewrows)
        rm -rf /tmp/gr-seed /tmp/gr-few /tmp/gr-now && mkdir -p /tmp/gr-seed /tmp/gr-few /tmp/gr-now
        if [[ -n ${FEW_SET:-} ]]; then # a set found elsewhere: another GPU's profile, say
            python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))
x=p.get("clblast_few_rows", {}).get("Xgemm") or p.get("xgemm") or p["clblast"]["Xgemm"]
print(json.dumps({"xgemm": x}))' "$FEW_SET" >/tmp/gr-seed/given.progress ||
                { echo "fewrows: no Xgemm set in $FEW_SET"; continue; }
        else
            CLFFN_TUNE_DIR=/tmp/gr-seed timeout -s INT "${FEW_BUDGET:-115}" "$build/clffn-tune" \
                --budget 150 --tokens 640 --d-model 512 --d-ff 2048 >"$out/fewrows-tune.log" 2>&1
        fi
        progress=$(ls /tmp/gr-seed/*.progress 2>/dev/null | head -1)
        # a search that ended within the time leaves its profile instead
        [[ -n $progress ]] || progress=$(ls /tmp/gr-seed/*.json 2>/dev/null | head -1)
        if [[ -z $progress ]]; then
            echo "fewrows: the search saved neither progress nor a profile (OUT/fewrows-tune.log)"
            continue
        fi
        # the profile that applies now: a file under the usual folder, else the built-in one (an
        # empty folder applies it; --print shows its text on its third line)
        now=$("$build/clffn-tune" --print | sed -n '1p')
        if [[ -f $now ]]; then
            nowdir=$(dirname "$now") && cp "$now" /tmp/gr-now.json
        else
            nowdir=/tmp/gr-now
            CLFFN_TUNE_DIR=$nowdir "$build/clffn-tune" --print | sed -n '3p' >/tmp/gr-now.json
        fi
        few=$(CLFFN_TUNE_DIR=/tmp/gr-few "$build/clffn-tune" --print | sed -n '1p')
        if [[ -z $few ]]; then
            echo "fewrows: clffn-tune --print gave no profile path"
            continue
        fi
        FEW_ROWS=${FEW_ROWS:-2048} FEW_CROSS=${FEW_CROSS:-768} python3 - "$progress" \
            /tmp/gr-now.json >"$few" <<'PY' || { echo "fewrows: no profile made"; continue; }
import json, os, sys
found = json.load(open(sys.argv[1]))
won = found["xgemm"] if "xgemm" in found else found["clblast"]["Xgemm"]
text = open(sys.argv[2]).read().strip()
p = json.loads(text) if text else {"clblast": {"Xgemm": won}}
p["clblast"].setdefault("Xgemm", won)
p["clblast"].setdefault("GemmRoutine", {})["XGEMM_MIN_INDIRECT_SIZE"] = int(os.environ["FEW_CROSS"])
p.setdefault("clffn", {})["XGEMM_FEW_ROWS"] = int(os.environ["FEW_ROWS"])
p["clblast_few_rows"] = {"Xgemm": won}
print(json.dumps(p))
PY
        cp "$few" "$out/fewrows-profile.json"
        for t in ${FEW_COUNTS:-64 128 256 512 640 1024 2048}; do
            for s in "512 2048 relu" "768 3072 gelu"; do
                read -r d f a <<<"$s"
                CLFFN_TUNE_DIR=$nowdir clffn_bench "$t" "$d" "$f" "$a"
                CLFFN_TUNE_DIR=/tmp/gr-few clffn_bench "$t" "$d" "$f" "$a"
            done
        done
        for s in "4096 768 3072 gelu" "2048 1024 2816 swiglu"; do
            CLFFN_TUNE_DIR=$nowdir clffn_bench $s
            CLFFN_TUNE_DIR=/tmp/gr-few clffn_bench $s
        done
        torch_bench "640 512 2048 relu" "1024 768 3072 gelu" "4096 768 3072 gelu" "2048 1024 2816 swiglu"
        ;;
    hostcosts)
        # cl-host-costs.c needs only OpenCL's types: Debian's headers, else the CUDA toolkit's
        if ! cc -O2 -shared -fPIC -I/usr/local/cuda/include -o /tmp/cl-host-costs.so \
            scripts/cl-host-costs.c -ldl; then
            echo "hostcosts: scripts/cl-host-costs.c did not build here"
            continue
        fi
        for s in "--d-ff 11008" "--d-ff 14336 --experts 8 --top-k 2" \
            "--d-ff 14336 --experts 8 --top-k 2 --moe-grouping off" \
            "--d-ff 14336 --experts 8 --top-k 2 --moe-counts host" \
            "--d-ff 14336 --experts 2 --top-k 2"; do
            for t in f16 q8_0; do
                echo "--- $t, one token, 4096, $s"
                rm -f /tmp/costs.txt
                # shellcheck disable=SC2086
                CL_HOST_COSTS=/tmp/costs.txt LD_PRELOAD=/tmp/cl-host-costs.so timeout 200 \
                    "$build/clffn-bench" --reps "$reps" --tokens 1 --d-model 4096 $s \
                    --activation swiglu --weights-dtype $t | grep -E '^(forward|dense FFN)'
                python3 - /tmp/costs.txt <<'PY'
import collections, statistics, sys
# one line a forward; the layer's and the dense FFN's differ in their launches
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    rows[int(f[1])].append({f[i]: float(f[i + 1]) for i in range(2, len(f), 2)})
for n, rs in sorted(rows.items()):
    if len(rs) < 5:
        continue
    med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
    print("  %d launches (%d forwards), medians: %s" % (n, len(rs),
          ", ".join("%s %.1f" % (k, v) for k, v in med.items())))
PY
            done
        done
        ;;
    fused)
        d=(--tokens 1 --d-model 4096 --d-ff 11008 --activation swiglu)
        mx=(--tokens 1 --d-model 4096 --d-ff 14336 --activation swiglu --experts 8 --top-k 2 --bias off)
        qw=(--tokens 1 --d-model 2048 --d-ff 768 --activation swiglu --experts 128 --top-k 8 --bias off)
        for ((r = 1; r <= ${ROUNDS:-3}; ++r)); do
            for f in on off; do
                for t in f16 q8_0; do
                    bench_text "decode $t, fused $f" "${d[@]}" --weights-dtype $t --fused-epilogues $f
                    bench_text "Mixtral $t, fused $f" "${mx[@]}" --weights-dtype $t --fused-epilogues $f
                    bench_text "Qwen3 $t, fused $f" "${qw[@]}" --weights-dtype $t --fused-epilogues $f
                done
                bench_text "decode f32 kernel, fused $f" "${d[@]}" --kernel-max 1 --weight-layout out_in \
                    --fused-epilogues $f
            done
        done
        for t in fp16 fp32; do
            timeout 120 python3 scripts/torch-ffn-bench.py --dtype $t --reps "$reps" 1,4096,11008,swiglu
        done
        ;;
    bars)
        d=(--tokens 1 --d-model 4096 --d-ff 11008 --activation swiglu)
        mx=(--d-model 4096 --d-ff 14336 --activation swiglu --experts 8 --top-k 2 --bias off)
        for f in on off; do
            bench_text "decode f32 kernel, out_in, fused $f" "${d[@]}" --kernel-max 1 \
                --weight-layout out_in --fused-epilogues $f
            bench_text "decode f16, fused $f" "${d[@]}" --weights-dtype f16 --fused-epilogues $f
        done
        bench_text "decode q8_0" "${d[@]}" --weights-dtype q8_0
        for t in fp32 fp16; do
            timeout 120 python3 scripts/torch-ffn-bench.py --dtype $t --reps "$reps" 1,4096,11008,swiglu
        done
        clffn_bench 640 512 2048 relu
        torch_bench "640 512 2048 relu"
        for t in f16 q8_0; do bench_text "Mixtral, 1 token, $t" --tokens 1 "${mx[@]}" --weights-dtype $t; done
        bench_text "Mixtral, 512 tokens, f16" --tokens 512 "${mx[@]}" --weights-dtype f16
        timeout 180 python3 scripts/torch-moe-bench.py --dtype fp16 --reps "$reps" 1,4096,14336,8,2 \
            512,4096,14336,8,2
        for s in "640 512 2048 relu" "2048 1024 2816 swiglu"; do
            read -r t dm ff act <<<"$s"
            for ty in f32 f16 q8_0; do
                bench_text "prefill $t, $dm -> $ff, $ty" --tokens "$t" --d-model "$dm" --d-ff "$ff" \
                    --activation "$act" --weights-dtype $ty
            done
        done
        ;;
    variants)
        d=(--tokens 1 --d-model 4096 --d-ff 11008 --activation swiglu)
        vs="now float4:CLFFN_ROW_RAW=0 raw8:CLFFN_ROW_FLIGHT=8"
        vs=${VARIANTS:-"$vs raw16:CLFFN_ROW_FLIGHT=16"}
        for v in $vs; do
            dir=/tmp/gr-variants/${v%%:*}
            rm -rf "$dir" && mkdir -p "$dir" && cp cl/* "$dir"/
            if [[ $v == *:* ]]; then
                defs=${v#*:}
                { tr ',' '\n' <<<"$defs" | sed 's/^\([^=]*\)=\(.*\)$/#define \1 \2/'
                  cat cl/weights.cl; } >"$dir/weights.cl"
            fi
        done
        for r in $(seq "${ROUNDS:-3}"); do
            for t in f16 bf16; do
                for v in $vs; do
                    CLFFN_KERNEL_DIR=/tmp/gr-variants/${v%%:*} bench_text "round $r, $t, ${v%%:*}" \
                        "${d[@]}" --weights-dtype $t
                done
            done
            timeout 120 python3 scripts/torch-ffn-bench.py --dtype fp16 --reps "$reps" 1,4096,11008,swiglu
        done
        ;;
    *) echo "gpu-report: unknown step $step" >&2 ;;
    esac
done 2>&1 | tee -a "$out/report.txt"
