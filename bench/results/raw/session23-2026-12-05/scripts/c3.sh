#!/bin/bash
export CUDA_PATH=/usr/local/cuda LD_LIBRARY_PATH=/usr/local/cuda/lib64
chmod +x .gpu/xtask; X=.gpu/xtask; R=$PWD
$X gpu run speed --sizes 32/64/256 --stacks fused,fused-lstm --work /tmp/g6 --out $OUT/sp --deadline 150 > $OUT/sp.log 2>&1
xz -dc .gpu/before/gpu_graph_speed.xz > /tmp/before-ggs; chmod +x /tmp/before-ggs
cd /tmp/g6/shared
for i in 1 2; do /tmp/before-ggs 32/64/256 fused,fused-lstm > $OUT/before-$i.log 2>&1; /tmp/g6/pack/bin/gpu_graph_speed 32/64/256 fused,fused-lstm > $OUT/after-$i.log 2>&1; done
cd $R; L=$(( 560 - SECONDS ))
$X gpu run tests --bins gpu_runtime,gpu_trainer -j 3 --work /tmp/g3 --out $OUT/re --deadline $L -- t1_smoke t8_lstm faults::cube::memory_is_flat > $OUT/re.log 2>&1 &
$X gpu run precision --work /tmp/g2 --out $OUT/pr --deadline $L > $OUT/pr.log 2>&1 &
wait
for f in before-1 after-1 before-2 after-2; do echo "== $f"; grep -iE "ms|graphed|fused" $OUT/$f.log | tail -6; done
for f in re pr; do echo "== $f"; tail -14 $OUT/$f.log; done
