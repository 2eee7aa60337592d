#!/bin/bash
# Call 3, side by side: the GPU suites but the soaks (and call 1's flat-memory test),
# four at a time | memcheck over the fused trainer modules | memcheck over runtime and capture.
export CUDA_PATH=/usr/local/cuda LD_LIBRARY_PATH=/usr/local/cuda/lib64
chmod +x .gpu/xtask
X=.gpu/xtask; O=/tmp/o3; D=${D:-540}
mkdir -p $O
$X gpu run tests --bins gpu_runtime,gpu_capture,gpu_trainer -j 4 \
  -E 'not test(/^soak::/) and not test(=faults::cube::memory_is_flat_over_100_injected_failures)' \
  --work /tmp/g7 --out $O/all --deadline $D > $O/all.log 2>&1 &
$X gpu run memcheck --bins gpu_trainer --stack fused --work /tmp/g8 --out $O/memf --deadline $D > $O/memf.log 2>&1 &
$X gpu run memcheck --bins gpu_runtime,gpu_capture --work /tmp/g9 --out $O/memrc --deadline $D > $O/memrc.log 2>&1 &
wait
for f in all memf memrc; do echo "== $f"; tail -22 $O/$f.log; done
$X gpu bundle $O --out $OUT
