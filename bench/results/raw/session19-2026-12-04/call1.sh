#!/usr/bin/env bash
# Issue 28, session 19, call 1: the stepwise LSTM's per-step GEMMs (item 2: parts summed
# in the cell kernel, cuBLAS with or without its workspace) side by side at the three
# sizes; the persistent/stepwise crossover at batches 64-128; the GRU at the example's
# size; PyTorch's anchors last, in the same call.
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
    for v in "" 1/no-workspace 2 4 2/no-workspace 4/no-workspace; do
        run "$s-step-${v:-plain}" $size fused-lstm-stepwise "$v" 
    done
done
} | tee "$logs/stepgemm.md"
echo "stepgemm: $((SECONDS - t0)) s"
{
for size in 64/64/256 96/32/512 128/32/512; do
    run "${size//\//-}-cross" $size fused-lstm,fused-lstm-persistent,fused-lstm-stepwise
done
run "32-64-32-gru" 32/64/32 fused-gru,fused-gru-stepwise,fused-gru-persistent,fused-lstm
} | tee "$logs/cross.md"
echo "cross: $((SECONDS - t0)) s"
(cd $cc && timeout 200 python3 "$here/torch_anchor.py") >"$logs/torch.log" 2>&1
echo "torch rc=$?" >>"$logs/rc.txt"
echo "total: $((SECONDS - t0)) s"
echo "================ summary"
cat "$logs/machine.txt" "$logs/rc.txt"
grep -h '"ms"' "$logs/torch.log"
cat "$logs/stepgemm.md" "$logs/cross.md"
tar -czf "$out/logs.tgz" -C "$out" logs
