#!/usr/bin/env bash
# GPU checks of CudaGraphRuntime (issues 3 and 5), in two halves:
#
#   scripts/gpu-check.sh pack [DEST]   on the build machine (Rust, no GPU): builds the
#       release GPU test binaries (gpu_runtime, gpu_capture) and the eager bench with
#       --features cuda, strips and
#       xz-compresses them into DEST (default: .gpu/ in this checkout), with this script.
#   bash .gpu/gpu-check.sh run [WHAT]  on the GPU machine (no Rust): unpacks them, runs the
#       GPU tests, compute-sanitizer memcheck and the bench, and prints a summary table
#       last. WHAT (default "all") is one of: all, smoke, tests, trainer, speed, memcheck, bench.
#
# Results land in $OUT when it is set (the device tool fetches it), else in .gpu/out.
set -uo pipefail

mode=${1:-run}
here=$(cd "$(dirname "$0")" && pwd)

# Builds one release test (or, with KIND=bench, benchmark) binary of PACKAGE and prints
# its path.
test_binary() {
    local package=$1 test=$2 kind=${3:-test}
    cargo test --release --no-run --features cuda -p "$package" "--$kind" "$test" \
        --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except Exception: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$test"
}

pack() {
    local dest=${1:-.gpu}
    mkdir -p "$dest"
    export CUDARC_CUDA_VERSION=${CUDARC_CUDA_VERSION:-13000}
    local runtime_bin capture_bin trainer_bin speed_bin
    runtime_bin=$(test_binary burn-graph-capture gpu_runtime)
    capture_bin=$(test_binary burn-graph-capture gpu_capture)
    trainer_bin=$(test_binary integration-tests gpu_trainer)
    speed_bin=$(test_binary integration-tests gpu_graph_speed bench)
    for bin in "$runtime_bin" "$capture_bin" "$trainer_bin" "$speed_bin"; do
        [ -n "$bin" ] || { echo "build of a GPU test binary failed"; exit 1; }
    done
    cargo build --release --features cuda -p burn-graph-capture --example runtime_eager_bench \
        || { echo "build of the bench failed"; exit 1; }
    local bench_bin="${CARGO_TARGET_DIR:-target}/release/examples/runtime_eager_bench"
    for pair in "$runtime_bin:gpu_runtime" "$capture_bin:gpu_capture" \
        "$trainer_bin:gpu_trainer" "$speed_bin:gpu_graph_speed" "$bench_bin:runtime_eager_bench"; do
        local src=${pair%%:*} name=${pair##*:}
        cp "$src" "$dest/$name"
        strip "$dest/$name" 2>/dev/null || true
        xz -T2 -6 -f "$dest/$name"
    done
    cp "$here/gpu-check.sh" "$dest/gpu-check.sh"
    ls -la "$dest"
}

run() {
    local what=${1:-all}
    local dir=$here
    local out=${OUT:-$dir/out}
    mkdir -p "$out"
    export CUDA_PATH=${CUDA_PATH:-/usr/local/cuda}
    export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
    export PATH=$CUDA_PATH/bin:$PATH
    local bin=/tmp/gpu-check-bin
    mkdir -p "$bin"
    for name in gpu_runtime gpu_capture gpu_trainer gpu_graph_speed runtime_eager_bench; do
        if [ -f "$dir/$name.xz" ]; then
            xz -dc "$dir/$name.xz" >"$bin/$name" 2>/dev/null \
                || python3 -c "import lzma,sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())" "$dir/$name.xz" >"$bin/$name"
            chmod +x "$bin/$name"
        fi
    done
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/machine.txt"
    nvcc --version | tail -1 | tee -a "$out/machine.txt"
    date -u | tee -a "$out/machine.txt"

    declare -A status
    # Cold runs are slow: every kernel is NVRTC-compiled and every matmul shape autotuned,
    # for both runtimes (about 150 s per LSTM configuration on the H200, 2026-11-30). The
    # autotune results persist under ./target, so later stages (the bench) start warm.
    local t_tests=${TESTS_TIMEOUT:-540} t_mem=${MEMCHECK_TIMEOUT:-540} t_bench=${BENCH_TIMEOUT:-300}
    if [[ $what == smoke ]]; then
        timeout 200 "$bin/gpu_runtime" --ignored --test-threads=1 --nocapture smoke random_and_sync op_parity_plain 2>&1 | tee "$out/smoke.log"
        status[smoke]=${PIPESTATUS[0]}
    fi
    if [[ $what == all || $what == tests ]]; then
        # One test at a time: tests share the device servers, and timings inside autotune
        # are distorted by neighbours.
        timeout "$t_tests" "$bin/gpu_runtime" --include-ignored --test-threads=1 --nocapture 2>&1 | tee "$out/tests.log"
        status[tests]=${PIPESTATUS[0]}
        # Capture windows, retention, arena, replay (issue 5); small and fast (~3 s warm).
        timeout 200 "$bin/gpu_capture" --include-ignored --test-threads=1 --nocapture 2>&1 | tee "$out/capture.log"
        status[capture]=${PIPESTATUS[0]}
    fi
    if [[ $what == all || $what == tests || $what == trainer ]]; then
        # GraphTrainer end to end (issue-5 acceptance): replays vs eager training, guards,
        # memory. Two LSTM sizes per stack, so a cold run compiles and autotunes more.
        timeout "${TRAINER_TIMEOUT:-540}" "$bin/gpu_trainer" --include-ignored --test-threads=1 --nocapture 2>&1 | tee "$out/trainer.log"
        status[trainer]=${PIPESTATUS[0]}
    fi
    if [[ $what == all || $what == bench || $what == speed ]]; then
        # Graphed vs eager LSTM step on this runtime ("all" sizes unless SPEED_SIZES is set).
        timeout "${SPEED_TIMEOUT:-400}" "$bin/gpu_graph_speed" "${SPEED_SIZES:-all}" 2>&1 | tee "$out/speed.log"
        status[speed]=${PIPESTATUS[0]}
    fi
    if [[ $what == all || $what == bench ]]; then
        timeout "$t_bench" "$bin/runtime_eager_bench" "${BENCH_STEPS:-30}" 2>&1 | tee "$out/bench.log"
        status[bench]=${PIPESTATUS[0]}
    fi
    if [[ $what == all || $what == memcheck ]]; then
        # Last: under the sanitizer every kernel runs 10-100x slower, so only the small tests.
        timeout "$t_mem" compute-sanitizer --tool memcheck --error-exitcode 17 --print-limit 20 \
            "$bin/gpu_runtime" --ignored --test-threads=1 smoke random_and_sync op_parity lstm_parity_small \
            >"$out/memcheck.log" 2>&1
        status[memcheck]=$?
        tail -5 "$out/memcheck.log"
        timeout 200 compute-sanitizer --tool memcheck --error-exitcode 17 --print-limit 20 \
            "$bin/gpu_capture" --ignored --test-threads=1 >"$out/memcheck-capture.log" 2>&1
        status[memcheck_capture]=$?
        tail -3 "$out/memcheck-capture.log"
        # GraphTrainer guard tests (small LSTM sizes, for the sanitizer's slowdown).
        timeout "${MEMCHECK_TRAINER_TIMEOUT:-400}" compute-sanitizer --tool memcheck --error-exitcode 17 --print-limit 20 \
            "$bin/gpu_trainer" --ignored --test-threads=1 guards:: >"$out/memcheck-trainer.log" 2>&1
        status[memcheck_trainer]=$?
        tail -3 "$out/memcheck-trainer.log"
    fi

    echo
    echo "================ summary ================"
    cat "$out/machine.txt"
    for log in smoke tests capture trainer; do
        [ -f "$out/$log.log" ] && grep -E "^test result|^test .*(ok|FAILED)$|(smoke|op parity|lstm \(|graphed vs eager)" "$out/$log.log"
    done
    [ -f "$out/memcheck.log" ] && grep -E "ERROR SUMMARY|test result" "$out/memcheck.log"
    [ -f "$out/memcheck-capture.log" ] && grep -E "ERROR SUMMARY|test result" "$out/memcheck-capture.log"
    [ -f "$out/memcheck-trainer.log" ] && grep -E "ERROR SUMMARY|test result" "$out/memcheck-trainer.log"
    [ -f "$out/bench.log" ] && sed -n '/^| b\/t\/h/,$p' "$out/bench.log"
    [ -f "$out/speed.log" ] && sed -n '/^| b\/t\/h/,$p' "$out/speed.log"
    echo "| check | exit status |"
    echo "|---|---|"
    for k in "${!status[@]}"; do echo "| $k | ${status[$k]} |"; done
}

case $mode in
pack) shift; pack "$@" ;;
run) shift; run "$@" ;;
*) echo "usage: $0 pack [DEST] | run [all|smoke|tests|trainer|speed|memcheck|bench]"; exit 2 ;;
esac
