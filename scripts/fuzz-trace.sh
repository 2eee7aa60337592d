#!/usr/bin/env bash
# Traces fuzz programs on the GPU machine, each in a fresh process of its own with
# cubecl's autotune log in its output: for each stack and seed (FUZZ_TRACE_SEEDS),
# every event of the graphed and the eager run, and which kernels each step tuned first.
# Usage there: bash .gpu/fuzz-trace.sh (logs in $OUT/fuzz-trace.tar.gz).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$here/out}
mkdir -p "$out/trace" /tmp/fuzz-trace-bin
export CUDA_PATH=${CUDA_PATH:-/usr/local/cuda} LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
xz -dc "$here/fuzz.xz" >/tmp/fuzz-trace-bin/fuzz && chmod +x /tmp/fuzz-trace-bin/fuzz
for stack in ${FUZZ_TRACE_STACKS:-cube fused}; do
    for seed in ${FUZZ_TRACE_SEEDS:-38 14}; do
        dir=/tmp/fuzz-trace-$stack-$seed
        rm -rf "$dir" && mkdir -p "$dir"
        printf '[autotune]\ncache = { file = "%s/autotune" }\nlogger = { stdout = true, level = "minimal" }\n' "$dir" >"$dir/cubecl.toml"
        (cd "$dir" && FUZZ_TRACE=1 FUZZ_SEED=$seed FUZZ_PROGRAMS=1 timeout "${FUZZ_TRACE_TIMEOUT:-300}" \
            /tmp/fuzz-trace-bin/fuzz --ignored --test-threads=1 --nocapture "gpu::${stack}_" \
            >"$out/trace/$stack-$seed.log" 2>&1) &
    done
done
wait
grep -hE "^(graphed|eager) [0-9]+ Step|seed .* fails|programs" "$out"/trace/*.log | head -80
tar -czf "$out/fuzz-trace.tar.gz" -C "$out" trace && rm -rf "$out/trace"
