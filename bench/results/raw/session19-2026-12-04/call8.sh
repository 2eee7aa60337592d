#!/usr/bin/env bash
# Issue 28, session 19, call 8: the example with GEMM forms as laid (call 7 ran it with
# them measured), and racecheck on the mixed directions (batch 100: stepwise forward,
# persistent backward).
set -uo pipefail
here=$(pwd)
export CUDA_PATH=/usr/local/cuda LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PATH=/usr/local/cuda/bin:$PATH
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
bin=/tmp/gpu-check-bin; mkdir -p $bin
for b in gpu_graph_speed lstm; do xz -dc "$here/$b.xz" >$bin/$b && chmod +x $bin/$b; done
cc=/tmp/gpu-check-cubecl; mkdir -p $cc/cache
tar -xzf "$here/cubecl-cache.tar.gz" -C $cc/cache
printf '[autotune]\ncache = { file = "%s/cache/autotune" }\n[compilation]\ncache = { file = "%s/cache/ptx" }\n' $cc $cc >$cc/cubecl.toml
export BURN_GRAPH_CAPTURE_KERNEL_CACHE=$cc/cache/ptx
t0=$SECONDS
for route in on off; do for ex in fused gru; do
    (cd $cc && BURN_GRAPH_CAPTURE_GEMM_ROUTE=$route timeout 60 $bin/lstm --epochs 3 --$ex --compare --out /tmp/ex-$ex) >"$logs/example-$ex-$route.log" 2>&1
    echo "example $ex route $route rc=$? $((SECONDS - t0)) s: $(grep -hE 'steps/s' "$logs/example-$ex-$route.log" | tr '\n' ' ')" >>"$logs/rc.txt"
done; done
(cd $cc && timeout 200 compute-sanitizer --tool racecheck --print-limit 20 $bin/gpu_graph_speed profile fused-lstm 100/2/64) \
    >"$logs/racecheck-100-2-64.log" 2>&1
echo "racecheck 100/2/64 rc=$?: $(grep -E 'RACECHECK SUMMARY' "$logs/racecheck-100-2-64.log") $((SECONDS - t0)) s" >>"$logs/rc.txt"
cat "$logs/rc.txt"
tar -czf "$out/logs-call7.tgz" -C "$out" logs && rm -rf "$logs"
