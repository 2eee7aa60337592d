#!/usr/bin/env bash
# Issue 28, session 19, call 9: the differential fuzzer on both stacks with GEMM forms
# measured per shape (regression seeds, then FUZZ_PROGRAMS programs each), side by side.
set -uo pipefail
here=$(pwd)
export CUDA_PATH=/usr/local/cuda LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PATH=/usr/local/cuda/bin:$PATH
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
bin=/tmp/gpu-check-bin; mkdir -p $bin
xz -dc "$here/fuzz.xz" >$bin/fuzz && chmod +x $bin/fuzz
t0=$SECONDS
for part in fused cube; do
    cc=/tmp/cc-$part; mkdir -p $cc/cache; tar -xzf "$here/cubecl-cache.tar.gz" -C $cc/cache
    printf '[autotune]\ncache = { file = "%s/cache/autotune" }\n[compilation]\ncache = { file = "%s/cache/ptx" }\n' $cc $cc >$cc/cubecl.toml
    (cd $cc && BURN_GRAPH_CAPTURE_KERNEL_CACHE=$cc/cache/ptx FUZZ_KEEP_GOING=1 FUZZ_PROGRAMS=${FUZZ_PROGRAMS:-100} \
        timeout 270 $bin/fuzz --ignored --test-threads=1 --nocapture "gpu::${part}_" >"$logs/fuzz-$part.log" 2>&1; \
        echo "fuzz $part rc=$? $((SECONDS - t0)) s" >>"$logs/rc.txt") &
done
wait
cat "$logs/rc.txt"
grep -hE "programs matched|programs failed|^test .*(ok|FAILED)$|seed .* fails|panicked" "$logs"/fuzz-*.log | head -40
tar -czf "$out/logs-call9.tgz" -C "$out" logs && rm -rf "$logs"
