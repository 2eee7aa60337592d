#!/usr/bin/env bash
# Session 13, call E (gpu_graph_speed and gpu_trainer of 6be9d48, lstm of 29ffe96):
# FusedLstm's final speed at three sizes with PyTorch's anchors, alone; the example with
# --dropout 0.3 --compare, alone; then the fused_lstm and dropout tests and memcheck on
# fused_lstm (the small-batch hidden gradient) side by side.
export CUDA_PATH=/usr/local/cuda LD_LIBRARY_PATH=/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0
L=$OUT/logs; mkdir -p $L
SPEED_TIMEOUT=90 SPEED_SIZES=32/64/256,8/64/128,128/32/512 SPEED_STACKS=fused-lstm bash gpu-check.sh run speed >$L/run-speed.log 2>&1
cp $OUT/speed.log $L/speed.log
TORCH_TIMEOUT=200 bash gpu-check.sh run torch >$L/run-torch.log 2>&1
cp $OUT/torch.log $L/torch.log
xz -dc lstm.xz >/tmp/lstm && chmod +x /tmp/lstm
(cd /tmp/gpu-check-cubecl 2>/dev/null || cd /tmp; timeout 200 /tmp/lstm --epochs 3 --dropout 0.3 --compare --out $L/lstm-dropout >$L/lstm-dropout.log 2>&1)
PARALLEL_STAGES="suite" SUITE_PARTS="fused_lstm dropout" SUITE_MEMCHECK="fused_lstm" SUITE_RUNTIME=0 SUITE_TIMEOUT=300 \
  PARALLEL_TIMEOUT=310 bash gpu-check.sh run parallel >$L/run-parallel.log 2>&1
mkdir -p $OUT/x && tar -xzf $OUT/parallel-logs.tar.gz -C $OUT/x 2>/dev/null
for d in $OUT/x/*/; do tar -xzf $d/suite-logs.tar.gz -C $d 2>/dev/null; rm -f $d/suite-logs.tar.gz $d/*capture*.log $d/speed-summary.md; done
grep -h '"bench":"speed"' $L/speed.log | python3 -c '
import json,sys
for l in sys.stdin:
    m=json.loads(l); print(m["size"],m["stack"],m["mode"],round(m["pipelined_ms"],3),round(m["per_step_ms"],3),m.get("graph_launches"),m.get("modes"))'
grep -h '"graphed": true' $L/torch.log
grep -vE "^\s*$" $L/lstm-dropout.log | grep -v "━\|epoch" | tail -6
for f in $(find $OUT/x -name 'trainer-*.log' -o -name 'memcheck-trainer-*.log'); do echo "== $f"; grep -E "^test |^test result|ERROR SUMMARY|panicked" $f | cut -c1-250 | tail -12; done
rm -f $OUT/*.log $OUT/*.md $OUT/cubecl-cache.tar.gz
tar -czf $OUT/callE-logs.tar.gz -C $OUT logs x && rm -rf $OUT/x $OUT/logs $OUT/parallel-logs.tar.gz
