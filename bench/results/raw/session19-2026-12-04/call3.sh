#!/usr/bin/env bash
# Issue 28, session 19, call 3: ncu of one replay per direction's recurrence, persistent
# and stepwise forced, at the batches where Auto's crossover lies.
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
t0=$SECONDS
prof() { # label target size recurrence
    local csv=$logs/ncu-$1.csv
    (cd $cc && BURN_GRAPH_CAPTURE_RECURRENCE=$4 timeout 120 ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum \
        --csv --print-units base --log-file "$csv" $bin/gpu_graph_speed profile $2 $3) >>"$logs/ncu-run.log" 2>&1
    echo "ncu $1 rc=$?" >>"$logs/rc.txt"
    python3 "$here/ncu_sum.py" "$csv" "$1" $3 0 | tee -a "$logs/ncu.log"
}
for size in 128/32/512 96/32/512 64/64/256 32/64/256; do
    for rec in persistent stepwise; do
        prof "lstm-$rec-${size//\//-}" fused-lstm-replay $size $rec
    done
done
echo "total: $((SECONDS - t0)) s"
cat "$logs/rc.txt"
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
