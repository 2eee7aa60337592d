#!/bin/bash
# Call 1, side by side: the cube stack's flat-memory fault test | precision |
# runtime t1 smoke | examples | reliability. Then one bundle of every run.
export CUDA_PATH=/usr/local/cuda LD_LIBRARY_PATH=/usr/local/cuda/lib64
chmod +x .gpu/xtask
X=.gpu/xtask; O=/tmp/o; D=${D:-530}
mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt 2>&1
$X gpu run tests --bins gpu_trainer --work /tmp/g1 --out $O/flat --deadline $D -- faults::cube::memory_is_flat > $O/flat.log 2>&1 &
$X gpu run precision --work /tmp/g2 --out $O/prec --deadline $D > $O/prec.log 2>&1 &
$X gpu run tests --bins gpu_runtime --work /tmp/g3 --out $O/t1 --deadline $D -- t1_smoke > $O/t1.log 2>&1 &
$X gpu run examples --work /tmp/g4 --out $O/ex --deadline $D > $O/ex.log 2>&1 &
$X gpu run reliability --work /tmp/g5 --out $O/rel --deadline $D > $O/rel.log 2>&1 &
wait
for f in flat prec t1 ex rel; do echo "== $f"; tail -12 $O/$f.log; done
$X gpu bundle $O --out $OUT
