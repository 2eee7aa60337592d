#!/usr/bin/env bash
# Issue 28, session 19, calls 5 and 6 (perf, tests): FusedLstm's projection time-major, one
# bias sum, outputs as row slices; the LSTM's backward persistent up to batch 128 (forward
# up to 96); the transposed warp sum in the persistent backward; GEMM forms measured per
# shape (item 4). Speed of the three recurrence stacks at the issue's sizes
# and PyTorch's anchors in the same call; ncu of one replay at 128/32/512; the fused_lstm
# and fused_gru GPU suites (parity with nn::Lstm/nn::Gru, 200 replayed steps against
# eager); the example with --fused and --gru, each against its eager run.
set -uo pipefail
here=$(pwd)
export CUDA_PATH=/usr/local/cuda LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PATH=/usr/local/cuda/bin:$PATH
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
bin=/tmp/gpu-check-bin; mkdir -p $bin
for b in gpu_graph_speed gpu_trainer lstm; do [ -f "$here/$b.xz" ] || continue; xz -dc "$here/$b.xz" >$bin/$b && chmod +x $bin/$b; done
cc=/tmp/gpu-check-cubecl; mkdir -p $cc/cache
tar -xzf "$here/cubecl-cache.tar.gz" -C $cc/cache
printf '[autotune]\ncache = { file = "%s/cache/autotune" }\n[compilation]\ncache = { file = "%s/cache/ptx" }\n' $cc $cc >$cc/cubecl.toml
export BURN_GRAPH_CAPTURE_KERNEL_CACHE=$cc/cache/ptx
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$logs/machine.txt"
date -u >>"$logs/machine.txt"
t0=$SECONDS
stage=${1:-perf}
if [ "$stage" = perf ]; then
(cd $cc && timeout 240 $bin/gpu_graph_speed 32/64/256,8/64/128,128/32/512,96/32/512 fused,fused-lstm,fused-lstm-stepwise,fused-lstm-persistent,fused-gru) >"$logs/speed.log" 2>&1
echo "speed rc=$? $((SECONDS - t0)) s" >>"$logs/rc.txt"
# Issue 28 item 4 side by side: every GEMM as laid, unmeasured.
(cd $cc && BURN_GRAPH_CAPTURE_GEMM_ROUTE=off timeout 150 $bin/gpu_graph_speed 32/64/256,8/64/128,128/32/512 fused,fused-lstm) >"$logs/speed-route-off.log" 2>&1
echo "speed route off rc=$? $((SECONDS - t0)) s" >>"$logs/rc.txt"
(cd $cc && timeout 200 python3 "$here/torch_anchor.py") >"$logs/torch.log" 2>&1
echo "torch rc=$? $((SECONDS - t0)) s" >>"$logs/rc.txt"
prof() { # label target size recurrence
    local csv=$logs/ncu-$1.csv
    (cd $cc && BURN_GRAPH_CAPTURE_RECURRENCE=$4 timeout 120 ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum \
        --csv --print-units base --log-file "$csv" $bin/gpu_graph_speed profile $2 $3) >>"$logs/ncu-run.log" 2>&1
    echo "ncu $1 rc=$?" >>"$logs/rc.txt"
    python3 "$here/ncu_sum.py" "$csv" "$1" $3 0 >>"$logs/ncu.log"
}
for size in 32/64/256 8/64/128 128/32/512; do prof "fused-lstm-${size//\//-}" fused-lstm-replay $size auto; done
prof "fused-lstm-persistent-128-32-512" fused-lstm-replay 128/32/512 persistent
prof "fused-gru-32-64-256" fused-gru-replay 32/64/256 auto
prof "fused-8-64-128" fused-replay 8/64/128 auto
elif [ "$stage" = tests ]; then
(cd $cc && timeout 330 $bin/gpu_trainer --ignored --test-threads=1 fused_lstm:: fused_gru:: matmul:: correctness::) >"$logs/suite.log" 2>&1
echo "suite rc=$? $((SECONDS - t0)) s" >>"$logs/rc.txt"
elif [ "$stage" = sanitize ]; then
# The GRU twice: call A of session 18 had its graphed run slower than its eager one; the
# second run finds every kernel in the on-disk caches.
for ex in fused gru gru; do
    n=$(ls "$logs"/example-$ex*.log 2>/dev/null | wc -l)
    (cd $cc && timeout 60 $bin/lstm --epochs 3 --$ex --compare --out /tmp/ex-$ex) >"$logs/example-$ex-$n.log" 2>&1
    echo "example $ex ($n) rc=$? $((SECONDS - t0)) s" >>"$logs/rc.txt"
done
(cd $cc && timeout 200 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 17 --print-limit 20 \
    $bin/gpu_trainer --ignored --test-threads=1 fused_lstm::fused::both_recurrences fused_lstm::fused::replays) >"$logs/memcheck-lstm.log" 2>&1
echo "memcheck lstm rc=$? $((SECONDS - t0)) s: $(grep -E 'ERROR SUMMARY|test result' "$logs/memcheck-lstm.log" | tr '\n' ' ')" >>"$logs/rc.txt"
for size in 40/8/64 128/4/512; do
    (cd $cc && timeout 70 compute-sanitizer --tool racecheck --print-limit 20 $bin/gpu_graph_speed profile fused-lstm $size) \
        >"$logs/racecheck-${size//\//-}.log" 2>&1
    echo "racecheck $size rc=$?: $(grep -E 'RACECHECK SUMMARY' "$logs/racecheck-${size//\//-}.log")" >>"$logs/rc.txt"
done
fi
echo "================ summary"
cat "$logs/machine.txt" "$logs/rc.txt"
grep -h '"ms"' "$logs/torch.log" 2>/dev/null
sed -n '/^| b\/t\/h/,$p' "$logs/speed.log" | grep -E "^\| [0-9]"
sed -n '/^| b\/t\/h/,$p' "$logs/speed-route-off.log" | grep -E "^\| [0-9]" | sed 's/^/| route off /' 
cut -c1-200 "$logs/ncu.log"
grep -E "^test |test result" "$logs/suite.log" 2>/dev/null
grep -hE "steps/s|bit-exact" "$logs"/example-*.log 2>/dev/null
tar -czf "$out/logs-$stage.tgz" -C "$out" logs && rm -rf "$logs"
