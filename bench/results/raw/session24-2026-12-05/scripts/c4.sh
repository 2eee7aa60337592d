#!/bin/bash
# Call 4, after the autotune-cache fix (b375adf): every gpu_runtime test at once, again
# from a fresh work folder if 150 s are left | precision.
export CUDA_PATH=/usr/local/cuda LD_LIBRARY_PATH=/usr/local/cuda/lib64
chmod +x .gpu/xtask
X=.gpu/xtask; O=/tmp/o4; D=${D:-290}
mkdir -p $O
( $X gpu run tests --bins gpu_runtime -j 8 --work /tmp/g10 --out $O/rt1 --deadline $D > $O/rt1.log 2>&1
  L=$(( D - SECONDS )); [ $L -gt 150 ] && \
  $X gpu run tests --bins gpu_runtime -j 8 --work /tmp/g11 --out $O/rt2 --deadline $L > $O/rt2.log 2>&1 ) &
$X gpu run precision --work /tmp/g12 --out $O/prec --deadline $D > $O/prec.log 2>&1 &
wait
for f in rt1 rt2 prec; do echo "== $f"; tail -14 $O/$f.log 2>/dev/null; done
$X gpu bundle $O --out $OUT
