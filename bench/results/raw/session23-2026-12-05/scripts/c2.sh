#!/bin/bash
# Call 2: memcheck | the rest of gpu_trainer, four at a time.
export CUDA_PATH=/usr/local/cuda LD_LIBRARY_PATH=/usr/local/cuda/lib64
chmod +x .gpu/xtask
X=.gpu/xtask
W=/tmp/g4; [ -d /tmp/g1 ] && W=/tmp/g1
$X gpu run memcheck --work /tmp/g5 --out $OUT/mem --deadline ${D:-540} > $OUT/mem.log 2>&1 &
$X gpu run tests --bins gpu_trainer -j 4 -E 'not test(/^soak::/)' --work $W --out $OUT/tr --deadline ${D:-540} > $OUT/tr.log 2>&1 &
wait
for f in mem tr; do echo "== $f"; tail -30 $OUT/$f.log; done
