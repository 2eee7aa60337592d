#!/usr/bin/env bash
# GPU checks of CudaGraphRuntime (issues 3 and 5), in two halves:
#
#   scripts/gpu-check.sh pack [DEST]   on the build machine (Rust, no GPU): builds the
#       release GPU test binaries (gpu_runtime, gpu_capture) and the eager bench with
#       --features cuda, strips and
#       xz-compresses them into DEST (default: .gpu/ in this checkout), with this script.
#   bash .gpu/gpu-check.sh run [WHAT]  on the GPU machine (no Rust): unpacks them, runs the
#       GPU tests, compute-sanitizer memcheck and the bench, and prints a summary table
#       last. WHAT (default "all") is one of: all, smoke, tests (= runtime + trainer),
#       suite (every GPU test and memcheck side by side, see suite_stage),
#       cold (issue 11: COLD_PROCS fresh-cache trainer processes side by side, see cold_stage),
#       parallel (several stages side by side in one call, one tar of logs: parallel_stage),
#       runtime (gpu_runtime and gpu_capture), trainer, speed, ncu, torch,
#       perf (= speed + ncu + torch), memcheck (= memcheck-runtime, on gpu_runtime and
#       gpu_capture, + memcheck-trainer, on gpu_trainer), bench (= perf + the eager runtime bench),
#       conformance (CubeCL's own suites, from the separate workspace conformance/),
#       precision (matmul/sum of both stacks against an f64 reference),
#       matmul (CubeCL's matmul against cuBLAS at the LSTM step's shapes; GPU_PACK must
#       include gpu_matmul).
#
# Issue 5 speed stages (see the comment above `speed_stages` for their environment):
#   speed  tests/benches/gpu_graph_speed: graphed/eager/stock ms per step, capture cost, memory;
#   ncu    one profiled step per target and size: kernel count and summed GPU kernel time;
#   torch  bench/anchors/torch_anchor.py (PyTorch's anchors in the same run).
# With any of them, speed_summary.py prints the issue's table last (also $OUT/speed-summary.md).
#
# Results land in $OUT when it is set (the device tool fetches it), else in .gpu/out.
set -uo pipefail

mode=${1:-run}
here=$(cd "$(dirname "$0")" && pwd)

# Builds one release test (or, with KIND=bench, benchmark) binary of PACKAGE and prints
# its path. FEATURES defaults to cuda; an empty one passes none.
test_binary() {
    local package=$1 test=$2 kind=${3:-test} features=${4-cuda}
    cargo test --release --no-run ${features:+--features "$features"} -p "$package" "--$kind" "$test" \
        --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except Exception: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$test"
}

# GPU_PACK (default: all) names the binaries to build, space-separated, out of:
# gpu_runtime gpu_precision gpu_capture gpu_trainer gpu_graph_speed runtime_eager_bench
# gpu_conformance stock_ddp lstm lstm-learner charlm fuzz threads shared_embedding (lstm,
# lstm-learner and charlm: the examples, for the `examples` stage; fuzz, threads and
# shared_embedding: the `reliability` stage). A stage whose binary is not packed fails to start.
pack() {
    local dest=${1:-.gpu}
    mkdir -p "$dest"
    export CUDARC_CUDA_VERSION=${CUDARC_CUDA_VERSION:-13000}
    local wanted=${GPU_PACK:-gpu_runtime gpu_precision gpu_capture gpu_trainer gpu_graph_speed runtime_eager_bench gpu_conformance}
    local name src
    for name in $wanted; do
        case $name in
        gpu_runtime | gpu_precision | gpu_capture) src=$(test_binary burn-graph-capture "$name") ;;
        # With the fault-injection hooks (armed only by its `faults::` tests).
        gpu_trainer) src=$(test_binary integration-tests gpu_trainer test "cuda fault-injection") ;;
        fuzz | threads | shared_embedding) src=$(test_binary integration-tests "$name") ;;
        gpu_graph_speed | gpu_matmul) src=$(test_binary integration-tests "$name" bench) ;;
        runtime_eager_bench)
            cargo build --release --features cuda -p burn-graph-capture --example runtime_eager_bench \
                && src="${CARGO_TARGET_DIR:-target}/release/examples/runtime_eager_bench" ;;
        # CubeCL conformance suites: a workspace of its own (see conformance/Cargo.toml).
        gpu_conformance) src=$(cd "$here/../conformance" && test_binary gpu-conformance gpu_conformance test "") ;;
        lstm | lstm-learner | charlm)
            cargo build --release --features cuda -p lstm-example --bin "$name" \
                && src="${CARGO_TARGET_DIR:-target}/release/$name" ;;
        # Eager DDP on stock burn-cuda (Burn's `distributed` feature): a workspace of its own.
        stock_ddp)
            (cd "$here/../bench/stock-ddp" && CARGO_TARGET_DIR="$here/../target/stock-ddp" cargo build --release) \
                && src="$here/../target/stock-ddp/release/stock-ddp" ;;
        *) echo "unknown binary $name"; exit 2 ;;
        esac
        [ -n "$src" ] && [ -f "$src" ] || { echo "build of $name failed"; exit 1; }
        cp "$src" "$dest/$name"
        strip "$dest/$name" 2>/dev/null || true
        xz -T2 -6 -f "$dest/$name"
    done
    cp "$here/gpu-check.sh" "$here/fuzz-trace.sh" "$dest/"
    cp "$here/ncu_sum.py" "$here/speed_summary.py" "$here/../bench/anchors/torch_anchor.py" \
        "$here/../bench/anchors/torch_ddp_anchor.py" "$dest/"
    ls -la "$dest"
}

# cubecl 0.10 reads its settings from the first cubecl.toml (or burn.toml, section [cubecl])
# found walking up from the working directory; stock cubecl-cuda and this crate's runtime
# share that one global config. No environment variable sets the cache locations (the
# only CUBECL_* variables are CUBECL_AUTOTUNE_LEVEL, CUBECL_DEBUG_LOG, CUBECL_DEBUG_OPTION),
# so the speed stages run from a directory holding their own cubecl.toml that puts:
# - [autotune] cache: the autotune results (cubecl's default is ./target of the nearest
#   Cargo.toml). Both stacks look every matmul (and fused-kernel) choice up here first;
#   a hit skips compiling and benchmarking the candidates, which is most of the ~150 s a
#   cold configuration costs per stack. The same kernels are chosen as when tuned afresh.
# - [compilation] cache: stock cubecl-cuda's PTX cache. Only stock burn-cuda reads it (this
#   crate's runtime compiles with NVRTC on each start), so it shortens the stock half of a
#   cold start only; no reported number includes compile time (all are after warmup).
# The cache is restored from $here/cubecl-cache.tar.gz (copy it into the carried .gpu/
# folder from a previous run's $OUT) and saved to $OUT/cubecl-cache.tar.gz after each stage.
# CUBECL_AUTOTUNE_LEVEL=minimal (cubecl's default is balanced) would tune fewer candidates,
# for both stacks alike, but may pick other (slower) matmuls than the anchors did:
# leave it unset for reported numbers.
cubecl_setup() {
    cubecl_dir=${CUBECL_DIR:-/tmp/gpu-check-cubecl}
    mkdir -p "$cubecl_dir/cache"
    if [ -z "$(ls -A "$cubecl_dir/cache")" ] && [ -f "$here/cubecl-cache.tar.gz" ]; then
        tar -xzf "$here/cubecl-cache.tar.gz" -C "$cubecl_dir/cache" && echo "cubecl cache restored"
    fi
    # This runtime's NVRTC output (runtime/ptx_cache.rs) travels with the autotune cache.
    export BURN_GRAPH_CAPTURE_KERNEL_CACHE=$cubecl_dir/cache/ptx
    cat >"$cubecl_dir/cubecl.toml" <<EOF
[autotune]
cache = { file = "$cubecl_dir/cache/autotune" }

[compilation]
cache = { file = "$cubecl_dir/cache/ptx" }
EOF
}

cubecl_save() {
    tar -czf "$out/cubecl-cache.tar.gz" -C "$cubecl_dir/cache" . 2>/dev/null || true
}

# Issue 5's speed stages, in one run so that every ratio comes from one machine and hour.
#   SPEED_SIZES    all (default) or b/t/h,b/t/h     SPEED_STACKS  fused,stock,cube,fused-lstm (default)
#   SPEED_TIMEOUT  seconds per size (default 540); each size runs in a process of its own
#   NCU_TARGETS    fused (default); also stock, cube (the eager step after warmup), and
#                  fused-replay, cube-replay (one graph replay; ncu profiles graph kernel
#                  nodes one by one), space-separated
#   NCU_SIZES      32/64/256 (default), space-separated   NCU_TIMEOUT  seconds per profile (300)
#   NCU_FLAGS      extra ncu flags, e.g. "--cache-control none" (by default ncu flushes the
#                  caches before each kernel, as for the 21.1 ms anchor in bench/results)
#   TORCH_TIMEOUT  seconds (default 400)
#   SPEED_RESULTS  where each stage keeps its latest log for the table (/tmp/gpu-check-speed);
#                  the table combines the latest speed, ncu and torch logs found there, so
#                  `run speed` then `run ncu` then `run torch` on one warm machine make one
#                  table. Remove it (or start a fresh machine) to drop older logs.
# Expected wall time on the H200 with a warm autotune cache: speed ~1-2 min (~20 s of timed
# steps per size for the three stacks, plus NVRTC compiles); cold, ~150 s per size and
# stack, so run one SPEED_SIZES at a time. ncu: start-up and warmup as in speed, then ncu
# replays each of ~3,700 kernels (estimated 10-30 ms each: ~40-110 s per target and size;
# the stage prints the measured wall time per profile). torch: ~1-2 min.
speed_stages() {
    local what=$1
    local speed=0 ncu=0 torch=0
    mkdir -p "$results"
    [[ $what == all || $what == bench || $what == perf || $what == speed ]] && speed=1
    [[ $what == all || $what == bench || $what == perf || $what == ncu ]] && ncu=1
    [[ $what == all || $what == bench || $what == perf || $what == torch ]] && torch=1
    if ((speed || ncu)); then cubecl_setup; fi
    local start
    if ((speed)); then
        start=$SECONDS
        # One process per size: eager memory is the growth of fresh pools, so a size run
        # after a larger one in the same process would find its pages already reserved.
        local sizes=${SPEED_SIZES:-all} size rc
        [[ $sizes == all ]] && sizes=32/64/256,8/64/128,128/32/512
        : >"$out/speed.log"
        status[speed]=0
        for size in ${sizes//,/ }; do
            (cd "$cubecl_dir" && timeout "${SPEED_TIMEOUT:-540}" "$bin/gpu_graph_speed" \
                "$size" "${SPEED_STACKS:-fused,stock,cube,fused-lstm}") 2>&1 | tee -a "$out/speed.log"
            rc=${PIPESTATUS[0]}
            ((rc)) && status[speed]=$rc
        done
        seconds[speed]=$((SECONDS - start))
        cp "$out/speed.log" "$results/"
        cubecl_save
    fi
    if ((ncu)); then
        start=$SECONDS
        : >"$out/ncu.log"
        status[ncu]=0
        local target size csv t0 rc
        for target in ${NCU_TARGETS:-fused}; do
            for size in ${NCU_SIZES:-32/64/256}; do
                csv=/tmp/gpu-check-ncu-$target-${size//\//-}.csv
                t0=$SECONDS
                # shellcheck disable=SC2086 # NCU_FLAGS is a list of flags
                (cd "$cubecl_dir" && timeout "${NCU_TIMEOUT:-300}" ncu --profile-from-start off \
                    --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
                    ${NCU_FLAGS:-} --log-file "$csv" "$bin/gpu_graph_speed" profile "$target" "$size") \
                    >>"$out/ncu.log" 2>&1
                rc=$?
                ((rc)) && status[ncu]=$rc
                grep -E "^==(ERROR|WARNING)==" "$csv" | head -5 | tee -a "$out/ncu.log"
                python3 "$here/ncu_sum.py" "$csv" "$target" "$size" $((SECONDS - t0)) | tee -a "$out/ncu.log"
            done
        done
        seconds[ncu]=$((SECONDS - start))
        cp "$out/ncu.log" "$results/"
        cubecl_save
    fi
    if ((torch)); then
        start=$SECONDS
        PYTHONUNBUFFERED=1 timeout "${TORCH_TIMEOUT:-400}" python3 "$here/torch_anchor.py" 2>&1 | tee "$out/torch.log"
        status[torch]=${PIPESTATUS[0]}
        seconds[torch]=$((SECONDS - start))
        cp "$out/torch.log" "$results/"
    fi
}

# The issue's table from the latest speed, ncu and torch logs of this machine (each stage
# leaves a copy in $results, so stages run by separate commands on one warm machine still
# meet in one table; the sources line says when each log was written).
speed_summary() {
    local logs=("$results/speed.log" "$results/ncu.log" "$results/torch.log") log
    [ -f "${logs[0]}" ] || [ -f "${logs[1]}" ] || [ -f "${logs[2]}" ] || return 0
    echo
    for log in "${logs[@]}"; do
        [ -f "$log" ] && echo "source: $(basename "$log") written $(date -u -r "$log" +%H:%M:%SZ)"
    done
    echo
    python3 "$here/speed_summary.py" "${logs[@]}" | tee "$out/speed-summary.md"
}

run() {
    local what=${1:-all}
    local dir=$here
    local out=${OUT:-$dir/out}
    local results=${SPEED_RESULTS:-/tmp/gpu-check-speed}
    mkdir -p "$out"
    export CUDA_PATH=${CUDA_PATH:-/usr/local/cuda}
    export LD_LIBRARY_PATH=$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}
    export PATH=$CUDA_PATH/bin:$PATH
    # Two stages may run side by side on one machine (e.g. memcheck-trainer beside tests)
    # when each has its own GPU_CHECK_BIN: a binary is not rewritten while it runs.
    local bin=${GPU_CHECK_BIN:-/tmp/gpu-check-bin}
    mkdir -p "$bin"
    for name in gpu_runtime gpu_capture gpu_trainer gpu_graph_speed gpu_matmul runtime_eager_bench gpu_conformance gpu_precision stock_ddp lstm lstm-learner charlm fuzz threads shared_embedding; do
        if [ -f "$dir/$name.xz" ]; then
            xz -dc "$dir/$name.xz" >"$bin/$name" 2>/dev/null \
                || python3 -c "import lzma,sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())" "$dir/$name.xz" >"$bin/$name"
            chmod +x "$bin/$name"
        fi
    done
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/machine.txt"
    nvcc --version | tail -1 | tee -a "$out/machine.txt"
    date -u | tee -a "$out/machine.txt"

    declare -A status seconds
    # Cold runs are slow: every kernel is NVRTC-compiled and every matmul shape autotuned,
    # for both runtimes (about 150 s per LSTM configuration on the H200, 2026-11-30). The
    # autotune results persist under ./target, so later stages (the bench) start warm.
    local t_tests=${TESTS_TIMEOUT:-540} t_mem=${MEMCHECK_TIMEOUT:-540} t_bench=${BENCH_TIMEOUT:-300}
    if [[ $what == all || $what == smoke || $what == tests || $what == runtime || $what == memcheck* ]]; then
        # Parity tests run ours in child processes whose autotune results then seed stock's
        # (tests/gpu_common/child.rs); keep ours' results in the carried cache, so each
        # shape is tuned once across tests, binaries and runs.
        cubecl_setup
        export GPU_OURS_AUTOTUNE=$cubecl_dir/cache/autotune
    fi
    if [[ $what == smoke ]]; then
        timeout 200 "$bin/gpu_runtime" --ignored --test-threads=1 --nocapture smoke random_and_sync op_parity_plain 2>&1 | tee "$out/smoke.log"
        status[smoke]=${PIPESTATUS[0]}
    fi
    if [[ $what == all || $what == tests || $what == runtime ]]; then
        # One test at a time: tests share the device servers, and timings inside autotune
        # are distorted by neighbours.
        timeout "$t_tests" "$bin/gpu_runtime" --include-ignored --test-threads=1 --nocapture 2>&1 | tee "$out/tests.log"
        status[tests]=${PIPESTATUS[0]}
        # Capture windows, retention, arena, replay (issue 5); small and fast (~3 s warm).
        timeout 200 "$bin/gpu_capture" --include-ignored --test-threads=1 --nocapture 2>&1 | tee "$out/capture.log"
        status[capture]=${PIPESTATUS[0]}
        cubecl_save
    fi
    if [[ $what == all || $what == tests || $what == trainer ]]; then
        # GraphTrainer end to end (issue-5 acceptance): replays vs eager training, guards,
        # memory. Two LSTM sizes per stack, so a cold run compiles and autotunes more.
        timeout "${TRAINER_TIMEOUT:-540}" "$bin/gpu_trainer" --include-ignored --test-threads=1 --nocapture 2>&1 | tee "$out/trainer.log"
        status[trainer]=${PIPESTATUS[0]}
    fi
    if [[ $what == suite ]]; then
        suite_stage
    fi
    if [[ $what == reliability ]]; then
        reliability_stage
    fi
    if [[ $what == cold ]]; then
        cold_stage
    fi
    if [[ $what == parallel ]]; then
        parallel_stage
    fi
    if [[ $what == examples ]]; then
        cubecl_setup
        examples_stage "$bin" "$out"
        # Models and checkpoints stay behind: the device tool brings back small files only.
        tar -czf "$out/examples.tar.gz" -C "$out" --exclude '*.mpk' --exclude checkpoint examples &&
            rm -rf "$out/examples"
        cubecl_save
    fi
    if [[ $what == startup ]]; then
        startup_stage
    fi
    if [[ $what == ddp ]]; then
        ddp_stage
    fi
    if [[ $what == matmul ]]; then
        # CubeCL's matmul against cuBLAS at the LSTM step's GEMM shapes, with errors
        # against an f64 reference (issue 12, part 2). About a minute warm.
        cubecl_setup
        (cd "$cubecl_dir" && timeout "${MATMUL_TIMEOUT:-300}" "$bin/gpu_matmul") 2>&1 | tee "$out/matmul.log"
        status[matmul]=${PIPESTATUS[0]}
        cubecl_save
    fi
    speed_stages "$what"
    if [[ $what == all || $what == bench ]]; then
        timeout "$t_bench" "$bin/runtime_eager_bench" "${BENCH_STEPS:-60}" 2>&1 | tee "$out/bench.log"
        status[bench]=${PIPESTATUS[0]}
    fi
    if [[ $what == all || $what == precision ]]; then
        # Matmul and sum/mean of both stacks against an f64 reference; every stack runs in a
        # fresh child process with an empty autotune cache, stock twice (issue 3).
        timeout "${PRECISION_TIMEOUT:-540}" "$bin/gpu_precision" --ignored --nocapture 2>&1 | tee "$out/precision.log"
        status[precision]=${PIPESTATUS[0]}
    fi
    if [[ $what == all || $what == conformance ]]; then
        # CubeCL's own suites (issue 3, check 0): one process per runtime, so a crash in one
        # leaves the other's results; libtest's default parallelism, as cubecl runs them.
        for rt in stock ours; do
            timeout "${CONFORMANCE_TIMEOUT:-270}" "$bin/gpu_conformance" "$rt::" >"$out/conformance-$rt.log" 2>&1
            status[conformance_$rt]=$?
            grep -E "^test result" "$out/conformance-$rt.log"
        done
        conformance_table "$out" >"$out/conformance.md"
        # The regression count, or a failure when stock ran nothing (nothing to compare).
        if [ -s "$out/conformance-stock.ok" ]; then
            status[conformance]=$(grep -c . "$out/conformance-regressions.txt")
        else
            status[conformance]="no stock test passed"
        fi
    fi
    if [[ $what == all || $what == memcheck || $what == memcheck-runtime ]]; then
        # Last: under the sanitizer every kernel runs 10-100x slower, so only the small tests.
        # The parity tests measure in child processes: the sanitizer follows them too.
        timeout "$t_mem" compute-sanitizer --tool memcheck --target-processes all --error-exitcode 17 --print-limit 20 \
            "$bin/gpu_runtime" --ignored --test-threads=1 smoke random_and_sync op_parity lstm_parity_small \
            >"$out/memcheck.log" 2>&1
        status[memcheck]=$?
        tail -5 "$out/memcheck.log"
        timeout 200 compute-sanitizer --tool memcheck --error-exitcode 17 --print-limit 20 \
            "$bin/gpu_capture" --ignored --test-threads=1 >"$out/memcheck-capture.log" 2>&1
        status[memcheck_capture]=$?
        tail -3 "$out/memcheck-capture.log"
    fi
    if [[ $what == all || $what == memcheck || $what == memcheck-trainer ]]; then
        # The whole GraphTrainer suite, one sanitizer process per module side by side
        # (the guards alone took 400 s): GPU_TRAINER_SHORT cuts the 200-step and
        # 1,000-replay runs to a tenth (same code paths; kernels run 10-100x slower here).
        # MEMCHECK_TRAINER_PARTS picks modules (default: all four).
        local part
        local -A pids
        for part in ${MEMCHECK_TRAINER_PARTS:-guards correctness memory inputs}; do
            GPU_TRAINER_SHORT=1 timeout "${MEMCHECK_TRAINER_TIMEOUT:-540}" compute-sanitizer --tool memcheck \
                --error-exitcode 17 --print-limit 20 "$bin/gpu_trainer" --ignored --test-threads=1 \
                "$part::" >"$out/memcheck-trainer-$part.log" 2>&1 &
            pids[$part]=$!
        done
        for part in "${!pids[@]}"; do
            wait "${pids[$part]}"
            status[memcheck_trainer_$part]=$?
        done
        tail -3 "$out"/memcheck-trainer-*.log
    fi

    echo
    echo "================ summary ================"
    cat "$out/machine.txt"
    for log in "$out"/smoke.log "$out"/tests.log "$out"/capture.log "$out"/trainer*.log; do
        [ -f "$log" ] && echo "-- $(basename "$log")" && grep -E "^test result|^test .*(ok|FAILED)$|(smoke|op parity|lstm \(|graphed vs eager|snapshots \[)" "$log"
    done
    [ -f "$out/conformance.md" ] && cat "$out/conformance.md"
    [ -f "$out/precision.log" ] && grep -E "^\| |^test result" "$out/precision.log"
    [ -f "$out/memcheck.log" ] && grep -E "ERROR SUMMARY|test result" "$out/memcheck.log"
    [ -f "$out/memcheck-capture.log" ] && grep -E "ERROR SUMMARY|test result" "$out/memcheck-capture.log"
    for log in "$out"/memcheck-trainer-*.log; do
        [ -f "$log" ] && grep -E "ERROR SUMMARY|test result" "$log"
    done
    [ -f "$out/bench.log" ] && sed -n '/^| b\/t\/h/,$p' "$out/bench.log"
    [ -f "$out/speed.log" ] && sed -n '/^| b\/t\/h/,$p' "$out/speed.log"
    echo "| check | exit status |"
    echo "|---|---|"
    for k in "${!status[@]}"; do echo "| $k | ${status[$k]} |"; done
    for k in "${!seconds[@]}"; do echo "stage $k: ${seconds[$k]} s"; done
    speed_summary
}

# NAME CMD...: runs CMD in /tmp/suite-NAME, a directory with its own cubecl.toml and
# autotune cache (so no two processes write one cache), logging to $out/NAME.log.
isolated() {
    local name=$1 dir=/tmp/suite-$1
    shift
    mkdir -p "$dir/cache"
    printf '[autotune]\ncache = { file = "%s/cache/autotune" }\n' "$dir" >"$dir/cubecl.toml"
    # AUTOTUNE_LOG=1: cubecl prints each key it tunes (and its pick) into the log, among
    # the tests' own lines (issue 11's cold runs: which kernels each phase met first).
    [[ ${AUTOTUNE_LOG:-0} == 1 ]] && printf 'logger = { stdout = true, level = "minimal" }\n' >>"$dir/cubecl.toml"
    (cd "$dir" && GPU_OURS_AUTOTUNE=$dir/cache/autotune BURN_GRAPH_CAPTURE_KERNEL_CACHE=$dir/cache/ptx "$@") \
        >"$out/$name.log" 2>&1
}

# Issue 14 on the GPU, side by side (isolated processes): trainers on several threads;
# two trainers sharing an Embedding at depth;
# the differential fuzzer on each stack (FUZZ_PROGRAMS each, default 300; every failing
# seed is reported and the run goes on, FUZZ_KEEP_GOING); and
# FUZZ_MEMCHECK_PROGRAMS of them (default 20) under compute-sanitizer. FUZZ_TIMEOUT
# seconds each (default 540). The fuzzer prints its progress every 50 programs.
reliability_stage() {
    local -A pids
    local t=${FUZZ_TIMEOUT:-540} part
    isolated threads timeout "$t" "$bin/threads" --ignored --test-threads=1 --nocapture gpu:: &
    pids[threads]=$!
    # The seed scenario at depth: two trainers sharing an Embedding, t = 64, 256, 512.
    for part in fused_pairs_sharing_an fused_pairs_sharing_nothing cube_pairs_sharing_an \
        cube_pairs_sharing_nothing; do
        isolated "shared-embedding-$part" timeout "$t" "$bin/shared_embedding" --ignored \
            --test-threads=1 --nocapture "gpu::${part}" &
        pids[$part]=$!
    done
    for part in fused cube; do
        FUZZ_KEEP_GOING=1 FUZZ_PROGRAMS=${FUZZ_PROGRAMS:-300} isolated "fuzz-$part" timeout "$t" "$bin/fuzz" --ignored \
            --test-threads=1 --nocapture "gpu::${part}_" &
        pids[fuzz_$part]=$!
    done
    # FUZZ_TRACE_SEED: that one program again on each stack, every event of both runs
    # printed (where a failing seed's runs part).
    if [[ -n ${FUZZ_TRACE_SEED:-} ]]; then
        for part in fused cube; do
            FUZZ_TRACE=1 FUZZ_SEED=$FUZZ_TRACE_SEED FUZZ_PROGRAMS=1 isolated "fuzz-trace-$part" \
                timeout "$t" "$bin/fuzz" --ignored --test-threads=1 --nocapture "gpu::${part}_" &
            pids[fuzz_trace_$part]=$!
        done
    fi
    FUZZ_PROGRAMS=${FUZZ_MEMCHECK_PROGRAMS:-20} isolated fuzz-memcheck timeout "$t" compute-sanitizer \
        --tool memcheck --error-exitcode 17 --print-limit 20 "$bin/fuzz" --ignored --test-threads=1 \
        --nocapture gpu::fused_ &
    pids[fuzz_memcheck]=$!
    for part in "${!pids[@]}"; do
        wait "${pids[$part]}"
        status[$part]=$?
    done
    grep -hE "programs matched|programs failed|^test .*(ok|FAILED)$|ERROR SUMMARY|seed .* fails|panicked" \
        "$out"/threads.log "$out"/shared-embedding-*.log "$out"/fuzz-*.log
}

# Every GPU test side by side in one call (the device machine has 16 cores and the tests
# use a fraction of the GPU): the trainer modules at full length, each under
# compute-sanitizer memcheck at a tenth (GPU_TRAINER_SHORT), gpu_capture with and without
# the sanitizer, and gpu_runtime. Each process runs in a directory of its own, with its
# own cubecl.toml, so that no two write one autotune cache.
#   SUITE_PARTS     trainer modules at full length (default: inputs correctness guards memory;
#                   also faults, fused_lstm, layouts, soak: 10,000 replays of
#                   b32/t64/h256, about 3 min per stack warm). A part may name one stack,
#                   e.g. faults::fused (faults takes over 9 min for both stacks side by side
#                   with other parts: split it)
#   SUITE_MEMCHECK  trainer modules under memcheck (default: the same four)
#   SUITE_RUNTIME   1 (default) to run gpu_runtime too; SUITE_TIMEOUT seconds each (560)
suite_stage() {
    local -A pids
    local t=${SUITE_TIMEOUT:-560} part dir
    for part in ${SUITE_PARTS:-inputs correctness guards memory}; do
        # Log names without "::" (the device tool does not bring such names back).
        isolated "trainer-${part//::/-}" timeout "$t" "$bin/gpu_trainer" --include-ignored --test-threads=1 \
            --nocapture "$part::" &
        pids[trainer-$part]=$!
    done
    for part in ${SUITE_MEMCHECK:-inputs correctness guards memory}; do
        GPU_TRAINER_SHORT=1 isolated "memcheck-trainer-${part//::/-}" timeout "$t" compute-sanitizer --tool memcheck \
            --error-exitcode 17 --print-limit 20 "$bin/gpu_trainer" --ignored --test-threads=1 "$part::" &
        pids[memcheck-trainer-$part]=$!
    done
    isolated capture timeout 200 "$bin/gpu_capture" --include-ignored --test-threads=1 --nocapture &
    pids[capture]=$!
    isolated memcheck-capture timeout 300 compute-sanitizer --tool memcheck --error-exitcode 17 \
        --print-limit 20 "$bin/gpu_capture" --ignored --test-threads=1 &
    pids[memcheck_capture]=$!
    if [[ ${SUITE_RUNTIME:-1} == 1 ]]; then
        isolated tests timeout "$t" "$bin/gpu_runtime" --include-ignored --test-threads=1 --nocapture &
        pids[tests]=$!
    fi
    for part in "${!pids[@]}"; do
        wait "${pids[$part]}"
        status[$part]=$?
    done
    tar -czf "$out/suite-logs.tar.gz" -C "$out" --exclude suite-logs.tar.gz . 2>/dev/null || true
}

# Pass/fail counts of each runtime's conformance run, then the tests that pass on stock
# cubecl-cuda but not on ours (failed, or never reached because the process died); those go
# to conformance-regressions.txt too (the stage's status is their count).
conformance_table() {
    local out=$1 rt
    echo "| conformance | passed | failed | ignored |"
    echo "|---|---|---|---|"
    for rt in stock ours; do
        local log=$out/conformance-$rt.log
        sed -nE "s/^test $rt::([^ ]+) \.\.\. ok$/\1/p" "$log" | sort >"$out/conformance-$rt.ok"
        echo "| $rt | $(grep -cE "^test $rt::.* \.\.\. ok$" "$log") \
| $(grep -cE "^test $rt::.* \.\.\. FAILED$" "$log") | $(grep -cE "^test $rt::.* \.\.\. ignored" "$log") |"
    done
    comm -23 "$out/conformance-stock.ok" "$out/conformance-ours.ok" >"$out/conformance-regressions.txt"
    echo "pass on stock, not on ours: $(grep -c . "$out/conformance-regressions.txt")"
    sed 's/^/  /' "$out/conformance-regressions.txt"
}

# The examples on the GPU (issue 13's acceptance): the sunspot LSTM graphed, eagerly
# through this crate and on stock burn-cuda with Burn's Adam (--compare --stock), the same
# model through burn-train's Learner (graphed, eager, stock), and the character LM. Each
# writes its files into $OUT/examples/<name> (tarred into examples.tar.gz), running in
# the cubecl config directory so autotune results persist; the summary comes last.
# EXAMPLES (default: lstm lstm-fused learner charlm) picks which runs, in that order.
# Several stages side by side in one device call, each in its own output, binary and
# cubecl folders (examples keep the default cubecl folder, so a later `run examples` on
# the same machine finds its autotune cache warm). PARALLEL_STAGES (default: cold
# reliability suite) and PARALLEL_TIMEOUT (480 s, each); the stages' own timeouts default
# lower here, so every stage ends, and the logs come back as one parallel-logs.tar.gz.
parallel_stage() {
    local stage dirs=()
    local -A pids
    export COLD_TIMEOUT=${COLD_TIMEOUT:-400} FUZZ_TIMEOUT=${FUZZ_TIMEOUT:-420} \
        SUITE_TIMEOUT=${SUITE_TIMEOUT:-420} EXAMPLE_TIMEOUT=${EXAMPLE_TIMEOUT:-200}
    for stage in ${PARALLEL_STAGES:-cold reliability suite}; do
        local cubecl=/tmp/gpu-check-cubecl-$stage
        [[ $stage == examples ]] && cubecl=${CUBECL_DIR:-/tmp/gpu-check-cubecl}
        (OUT=$out/$stage GPU_CHECK_BIN=/tmp/gpu-check-bin-$stage CUBECL_DIR=$cubecl \
            timeout "${PARALLEL_TIMEOUT:-480}" bash "$here/gpu-check.sh" run "$stage" \
            >"$out/$stage.txt" 2>&1) &
        pids[$stage]=$!
        dirs+=("$stage" "$stage.txt")
    done
    for stage in "${!pids[@]}"; do
        wait "${pids[$stage]}"
        status[$stage]=$?
        echo "== $stage"
        sed -n '/==== summary/,$p' "$out/$stage.txt" | grep -E "^\|" | grep -v "^| check\|^|---"
    done
    tar -czf "$out/parallel-logs.tar.gz" -C "$out" --exclude 'cubecl-cache.tar.gz' --exclude '*.mpk' --exclude checkpoint "${dirs[@]}" 2>/dev/null &&
        rm -rf "${dirs[@]/#/$out/}"
}

# Issue 11's intermittent divergence: COLD_PROCS (12) gpu_trainer processes side by side,
# each in a directory of its own with an empty autotune cache, each running the tests
# that COLD_FILTER (default: the fused MLP tests of inputs::) selects. Prints how many
# processes passed and each process's first losses next to the CPU's; logs in
# $out/cold-logs.tar.gz. COLD_FILTERS (space-separated, one filter each) instead runs
# COLD_PROCS processes per filter, all side by side, counted per filter (the bisecting
# tests `inputs::fused::first_steps_*` each need to run first in a cold process).
cold_stage() {
    local n=${COLD_PROCS:-12} i k filter
    local -a pids logs names filters
    if [[ -n ${COLD_FILTERS:-} ]]; then
        read -ra filters <<<"$COLD_FILTERS"
    else
        filters=("${COLD_FILTER:-inputs::fused::batch_norm inputs::fused::tied inputs::fused::eager_mlp}")
    fi
    for ((k = 0; k < ${#filters[@]}; k++)); do
        for ((i = 0; i < n; i++)); do
            local name="cold-$k-$i"
            rm -rf "/tmp/suite-$name" # empty caches are the point of this stage
            # shellcheck disable=SC2086 # a filter may list several test paths
            isolated "$name" timeout "${COLD_TIMEOUT:-400}" "$bin/gpu_trainer" --ignored \
                --test-threads=1 --nocapture ${filters[k]} &
            pids+=($!)
            names+=("$k")
            logs+=("$name.log")
        done
    done
    local -A passed
    for ((i = 0; i < ${#pids[@]}; i++)); do
        wait "${pids[i]}" && passed[${names[i]}]=$((${passed[${names[i]}]:-0} + 1))
    done
    for ((k = 0; k < ${#filters[@]}; k++)); do
        local key=cold
        ((${#filters[@]} > 1)) && key="cold ${filters[k]}"
        status[$key]="${passed[$k]:-0} of $n processes passed"
    done
    (cd "$out" && grep -hE "^test .*(ok|FAILED)$|differ" "${logs[@]}" | sort | uniq -c)
    (cd "$out" && grep -H "step-0 loss\|first difference" "${logs[@]}")
    # Loss digests across processes: equal lines mean equal bits (cold runs of one build).
    (cd "$out" && grep -ho "digest \[.*" "${logs[@]}" | sort | uniq -c)
    tar -czf "$out/cold-logs.tar.gz" -C "$out" "${logs[@]}" && (cd "$out" && rm -f "${logs[@]}")
}

# NCCL for this runtime: cudarc opens `libnccl.so`, and the image's NCCL (PyTorch's
# nvidia-nccl wheel) ships only `libnccl.so.2`: a link named libnccl.so is made in a
# directory put first on LD_LIBRARY_PATH. NVLink multicast stays off in every process.
nccl_setup() {
    local lib
    lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
    if [ ! -f "$lib/libnccl.so.2" ]; then
        lib=$(dirname "$(ldconfig -p | awk '/libnccl\.so\.2/ {print $NF; exit}')")
    fi
    mkdir -p /tmp/nccl-lib
    ln -sf "$lib/libnccl.so.2" /tmp/nccl-lib/libnccl.so
    export LD_LIBRARY_PATH=/tmp/nccl-lib:$lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0
    echo "NCCL: $(readlink -f /tmp/nccl-lib/libnccl.so)"
}

# Issue 16 on the machine at hand. Side by side (unless DDP_TESTS=0): the data_parallel
# tests (one rank; each stack), the same under compute-sanitizer memcheck
# (GPU_TRAINER_SHORT; API errors are not counted: NCCL's init probes kernels built for
# other GPUs and gets "no kernel image" back, which it handles, 136 such reports in
# session 14), and PyTorch's DDP anchor on DDP_WORLD GPUs (default: every visible one).
# With two GPUs or more, then the two_gpus tests and their memcheck. Then alone, so that
# nothing shares the GPUs while they are timed (unless DDP_SPEED=0): the speed bench's
# plain and one-rank data-parallel steps, and with two GPUs the two-rank ones, at
# DDP_SIZES (default 32/64/256); then eager DDP on stock burn-cuda (Burn's own
# `distributed` machinery, `bench/stock-ddp`) on every GPU, if `stock_ddp` is packed.
ddp_stage() {
    nccl_setup
    cubecl_setup
    local -A pids
    local t=${DDP_TIMEOUT:-420} part
    local world=${DDP_WORLD:-$(nvidia-smi -L | wc -l)}
    if [[ ${DDP_TESTS:-1} == 1 ]]; then
        isolated ddp-tests timeout "$t" "$bin/gpu_trainer" --ignored --test-threads=1 --nocapture data_parallel:: &
        pids[ddp_tests]=$!
        GPU_TRAINER_SHORT=1 isolated memcheck-ddp timeout "$t" compute-sanitizer --tool memcheck \
            --report-api-errors no --error-exitcode 17 --print-limit 20 "$bin/gpu_trainer" --ignored \
            --test-threads=1 data_parallel:: &
        pids[memcheck_ddp]=$!
        (PYTHONUNBUFFERED=1 timeout "$t" python3 "$here/torch_ddp_anchor.py" \
            --world "$world" >"$out/torch-ddp.log" 2>&1) &
        pids[torch_ddp]=$!
    fi
    for part in "${!pids[@]}"; do
        wait "${pids[$part]}"
        status[$part]=$?
    done
    if [[ ${DDP_TESTS:-1} == 1 ]] && ((world >= 2)); then
        # Issue 16's two-GPU acceptance: two ranks against one GPU on the combined batch
        # (both models, both stacks), a killed rank process; then the two-rank tests under
        # memcheck. (`rank_process` is the killed test's child, not a test to run alone.)
        isolated two-gpus timeout "$t" "$bin/gpu_trainer" --ignored --test-threads=1 --nocapture \
            two_gpus:: --skip two_gpus::rank_process
        status[two_gpus]=$?
        GPU_TRAINER_SHORT=1 isolated memcheck-two-gpus timeout "$t" compute-sanitizer --tool memcheck \
            --report-api-errors no --error-exitcode 17 --print-limit 20 "$bin/gpu_trainer" --ignored \
            --test-threads=1 two_gpus::fused::two_ranks_of
        status[memcheck_two_gpus]=$?
    fi
    if [[ ${DDP_SPEED:-1} == 1 ]]; then
        local stacks=fused-lstm,fused-lstm-ddp1,fused,ddp1
        ((world >= 2)) && stacks=$stacks,fused-lstm-ddp2,ddp2
        (cd "$cubecl_dir" && timeout "${SPEED_TIMEOUT:-540}" "$bin/gpu_graph_speed" "${DDP_SIZES:-32/64/256}" \
            "${DDP_STACKS:-$stacks}") >"$out/ddp-speed.log" 2>&1
        status[ddp_speed]=$?
        cubecl_save
        # Eager DDP through Burn's own machinery, on every GPU, without and with fusion
        # (stock_ddp packed): on stock burn-cuda, then on this crate's runtime.
        if [ -x "$bin/stock_ddp" ]; then
            local size fusion runtime
            for size in ${DDP_SIZES:-32/64/256}; do
                for runtime in stock ours; do
                    for fusion in "" --fusion; do
                        # shellcheck disable=SC2086 # $fusion is one flag or none
                        (cd "$cubecl_dir" && timeout "${STOCK_DDP_TIMEOUT:-300}" "$bin/stock_ddp" --world "$world" \
                            --size "$size" --runtime "$runtime" $fusion) >>"$out/ddp-speed.log" 2>&1
                        status[burn_ddp_${runtime}${fusion}]=$?
                    done
                done
            done
        fi
    fi
    grep -hE "^test .*(ok|FAILED)$|one rank|two ranks|round [0-9]|rank [0-9][:,]|panicked|ERROR SUMMARY|test result" \
        "$out"/ddp-tests.log "$out"/memcheck-ddp.log "$out"/two-gpus.log "$out"/memcheck-two-gpus.log 2>/dev/null
    grep -h "anchor\|torch" "$out/torch-ddp.log" 2>/dev/null
    [ -f "$out/ddp-speed.log" ] && sed -n '/^| b\/t\/h/,$p' "$out/ddp-speed.log" && grep -h stock-ddp "$out/ddp-speed.log"
}

# Issue 12's start-up report: the sunspot example (`lstm`, STARTUP_ARGS, default one
# epoch) in a process with empty kernel (PTX) and autotune caches, then again with the
# caches the first left: the process's wall time each, and the loop's own time from its
# log. Needs `lstm` packed; run it alone on the machine.
startup_stage() {
    local dir=/tmp/gpu-check-startup run t0 t1
    rm -rf "$dir" && mkdir -p "$dir/cache"
    printf '[autotune]\ncache = { file = "%s/cache/autotune" }\n' "$dir" >"$dir/cubecl.toml"
    : >"$out/startup.txt"
    for run in cold warm; do
        t0=$(date +%s.%N)
        # shellcheck disable=SC2086 # STARTUP_ARGS is a list of words
        (cd "$dir" && BURN_GRAPH_CAPTURE_KERNEL_CACHE=$dir/cache/ptx timeout "${STARTUP_TIMEOUT:-240}" \
            "$bin/lstm" ${STARTUP_ARGS:---epochs 1} --out "$dir/$run" >"$out/startup-$run.log" 2>&1)
        status[startup_$run]=$?
        t1=$(date +%s.%N)
        echo "$run start: $(python3 -c "print(round($t1 - $t0, 1))") s wall; $(grep -h 'steps in' "$out/startup-$run.log")" |
            tee -a "$out/startup.txt"
    done
}

# The examples with --compare --stock, one after another (their speeds are compared).
# A cold machine autotunes every shape of three trainings per binary (~150 s each on
# the H200, 2026-12-01): with EXAMPLE_WARMUP=1 each binary first runs one discarded
# epoch side by side with the others, so the timed runs find a warm autotune cache.
examples_stage() {
    local bin=$1 out=$2 epochs=${EXAMPLE_EPOCHS:-3}
    mkdir -p "$out/examples"
    local name rc
    for name in lstm lstm-learner charlm; do
        [ -x "$bin/$name" ] || { echo "$name not packed"; continue; }
    done
    if [[ ${EXAMPLE_WARMUP:-0} == 1 ]]; then
        (cd "$cubecl_dir" && timeout "${EXAMPLE_TIMEOUT:-240}" "$bin/lstm" --epochs 1 --compare --stock \
            --out /tmp/examples-warmup/lstm >/dev/null 2>&1) &
        (cd "$cubecl_dir" && timeout "${EXAMPLE_TIMEOUT:-240}" "$bin/lstm" --epochs 1 --fused --compare \
            --stock --out /tmp/examples-warmup/fused >/dev/null 2>&1) &
        (cd "$cubecl_dir" && timeout "${EXAMPLE_TIMEOUT:-240}" "$bin/lstm-learner" --epochs 1 --compare \
            --stock --out /tmp/examples-warmup/learner >/dev/null 2>&1) &
        wait
        echo "examples warmed up"
    fi
    local -A args=(
        [lstm]="lstm --epochs $epochs --compare --stock"
        [lstm-fused]="lstm --epochs $epochs --fused --compare --stock"
        [lstm-gru]="lstm --epochs $epochs --gru --compare"
        [learner]="lstm-learner --epochs $epochs --compare --stock"
        [charlm]="charlm"
    )
    # EXAMPLES (default all four) picks the runs, in order.
    for name in ${EXAMPLES:-lstm lstm-fused learner charlm}; do
        # shellcheck disable=SC2086 # the command line is a list of words
        (cd "$cubecl_dir" && timeout "${EXAMPLE_TIMEOUT:-240}" $bin/${args[$name]} \
            --out "$out/examples/$name" >"$out/examples/$name.log" 2>&1
        echo "$name rc=$?" >>"$out/examples/rc.txt")
    done
    echo "== examples: summary"
    cat "$out/examples/rc.txt"
    for log in ${EXAMPLES:-lstm lstm-fused learner charlm}; do
        echo "-- $log"
        grep -E "RMSE|bits per|steps|eager|stock|bit-identical|captured|error|panicked" "$out/examples/$log.log" | tail -12
    done
}

case $mode in
pack) shift; pack "$@" ;;
run) shift; run "$@" ;;
*) echo "usage: $0 pack [DEST] | run [all|smoke|tests|runtime|trainer|suite|cold|parallel|examples|startup|matmul|ddp|reliability|speed|ncu|torch|perf|memcheck|memcheck-runtime|memcheck-trainer|bench|conformance|precision]"; exit 2 ;;
esac
