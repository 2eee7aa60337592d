#!/usr/bin/env bash
# Session 13, call F (gpu_trainer of 6be9d48): the rest of the GPU suite with the device
# generator in every trainer: inputs, correctness, guards, memory, layouts, side by side,
# and memcheck on guards and layouts.
export CUDA_PATH=/usr/local/cuda LD_LIBRARY_PATH=/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0
L=$OUT/logs; mkdir -p $L
PARALLEL_STAGES="suite" SUITE_PARTS="inputs correctness guards memory layouts" SUITE_MEMCHECK="guards layouts" SUITE_RUNTIME=0 SUITE_TIMEOUT=420 \
  PARALLEL_TIMEOUT=440 bash gpu-check.sh run parallel >$L/run-parallel.log 2>&1
mkdir -p $OUT/x && tar -xzf $OUT/parallel-logs.tar.gz -C $OUT/x 2>/dev/null
for d in $OUT/x/*/; do tar -xzf $d/suite-logs.tar.gz -C $d 2>/dev/null; rm -f $d/suite-logs.tar.gz $d/*capture*.log $d/speed-summary.md; done
for f in $(find $OUT/x -name 'trainer-*.log' -o -name 'memcheck-trainer-*.log'); do echo "== $f"; grep -E "FAILED|panicked|^test result|ERROR SUMMARY" $f | cut -c1-250 | tail -8; done
rm -f $OUT/*.log $OUT/*.md $OUT/cubecl-cache.tar.gz
tar -czf $OUT/callF-logs.tar.gz -C $OUT logs x && rm -rf $OUT/x $OUT/logs $OUT/parallel-logs.tar.gz
