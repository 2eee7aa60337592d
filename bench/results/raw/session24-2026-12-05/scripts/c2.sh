#!/bin/bash
# Call 2, alone: memcheck over the cube stack's trainer tests (ten processes).
export CUDA_PATH=/usr/local/cuda LD_LIBRARY_PATH=/usr/local/cuda/lib64
chmod +x .gpu/xtask
X=.gpu/xtask; O=/tmp/o2; D=${D:-540}
mkdir -p $O
$X gpu run memcheck --bins gpu_trainer --stack cube --work /tmp/g6 --out $O/mem --deadline $D > $O/mem.log 2>&1
tail -40 $O/mem.log
$X gpu bundle $O --out $OUT
