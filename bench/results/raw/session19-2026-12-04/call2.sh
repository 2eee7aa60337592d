#!/usr/bin/env bash
# Issue 28, session 19, call 2: the per-step GEMMs without cuBLAS's workspace (call 1's
# labels broke on '/'), ncu's kernel tables of one replay, racecheck on the persistent
# kernels (40/8/64: two rows a warp).
set -uo pipefail
here=$(pwd)
export CUDA_PATH=/usr/local/cuda LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PATH=/usr/local/cuda/bin:$PATH
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
bin=/tmp/gpu-check-bin; mkdir -p $bin
xz -dc "$here/gpu_graph_speed.xz" >$bin/gpu_graph_speed && chmod +x $bin/gpu_graph_speed
cc=/tmp/gpu-check-cubecl; mkdir -p $cc/cache
tar -xzf "$here/cubecl-cache.tar.gz" -C $cc/cache
printf '[autotune]\ncache = { file = "%s/cache/autotune" }\n[compilation]\ncache = { file = "%s/cache/ptx" }\n' $cc $cc >$cc/cubecl.toml
export BURN_GRAPH_CAPTURE_KERNEL_CACHE=$cc/cache/ptx
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$logs/machine.txt"
date -u >>"$logs/machine.txt"
t0=$SECONDS
run() { # label size stacks [step-gemm]
    (cd $cc && BURN_GRAPH_CAPTURE_STEP_GEMM=${4:-} timeout 100 $bin/gpu_graph_speed "$2" "$3") >"$logs/speed-$1.log" 2>&1
    echo "$1 rc=$?" >>"$logs/rc.txt"
    sed -n '/^| b\/t\/h/,$p' "$logs/speed-$1.log" | grep -E "^\| [0-9]" | sed "s/^/| $1 /"
}
{
for size in 32/64/256 8/64/128 128/32/512; do
    s=${size//\//-}
    for v in "" 1/no-workspace 2/no-workspace 4/no-workspace 8/no-workspace; do
        run "$s-step-${v//\//-}" $size fused-lstm-stepwise "$v"
    done
done
} | tee "$logs/stepgemm.md"
echo "stepgemm: $((SECONDS - t0)) s"
t1=$SECONDS
prof() { # label target size [recurrence] [step-gemm]
    local csv=$logs/ncu-$1.csv
    (cd $cc && BURN_GRAPH_CAPTURE_RECURRENCE=${4:-auto} BURN_GRAPH_CAPTURE_STEP_GEMM=${5:-} timeout 120 ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum \
        --csv --print-units base --log-file "$csv" $bin/gpu_graph_speed profile $2 $3) >>"$logs/ncu-run.log" 2>&1
    echo "ncu $1 rc=$?" >>"$logs/rc.txt"
    python3 "$here/ncu_sum.py" "$csv" "$1" $3 0 | tee -a "$logs/ncu.log"
}
for size in 32/64/256 8/64/128 128/32/512; do
    prof "fused-lstm-${size//\//-}" fused-lstm-replay $size
done
prof "fused-lstm-stepwise-128-32-512" fused-lstm-replay 128/32/512 stepwise
prof "fused-lstm-stepwise-nows-128-32-512" fused-lstm-replay 128/32/512 stepwise 1/no-workspace
prof "fused-gru-32-64-256" fused-gru-replay 32/64/256
echo "ncu: $((SECONDS - t1)) s"
for target in fused-lstm fused-gru; do
    (cd $cc && timeout 100 compute-sanitizer --tool racecheck --print-limit 20 $bin/gpu_graph_speed profile $target 40/8/64) \
        >"$logs/racecheck-$target.log" 2>&1
    echo "racecheck $target rc=$?: $(grep -E 'RACECHECK SUMMARY' "$logs/racecheck-$target.log")" | tee -a "$logs/rc.txt"
done
echo "total: $((SECONDS - t0)) s"
echo "================ summary"
cat "$logs/machine.txt" "$logs/rc.txt" "$logs/stepgemm.md" "$logs/ncu.log"
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
