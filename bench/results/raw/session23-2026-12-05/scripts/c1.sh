#!/bin/bash
# Call 1: soak (both stacks) | precision, then reliability | runtime+capture, then examples.
export CUDA_PATH=/usr/local/cuda LD_LIBRARY_PATH=/usr/local/cuda/lib64
chmod +x .gpu/xtask
X=.gpu/xtask
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt 2>&1
$X gpu run tests --bins gpu_trainer -j 2 --work /tmp/g1 --out $OUT/soak --deadline ${D:-540} -- soak:: > $OUT/soak.log 2>&1 &
$X gpu run precision reliability --work /tmp/g2 --out $OUT/prec --deadline ${D:-540} > $OUT/prec.log 2>&1 &
$X gpu run tests --bins gpu_runtime,gpu_capture -j 2 --work /tmp/g3 --out $OUT/rc --deadline 380 > $OUT/rc.log 2>&1 && \
$X gpu run examples --work /tmp/g3 --out $OUT/ex --deadline $(( ${D:-540} - SECONDS )) > $OUT/ex.log 2>&1 &
wait
for f in soak prec rc ex; do echo "== $f"; tail -25 $OUT/$f.log; done
