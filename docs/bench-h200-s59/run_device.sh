#!/bin/bash
# Device call (stop 59): tests/gpu after stops 53-58 (29 commits in specdec since stop 52's
# green run), then bench_gpu with graphs on (plain b1/8/32, v(k), c) to compare with stop 52.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"; } > $OUT/env.txt 2>&1
cat $OUT/env.txt
echo "== 1. tests/gpu"
timeout 240 python3 -m pytest -q tests/gpu -p no:cacheprovider --durations=5 2>&1 | grep -v "^DEBUG" > $OUT/test_gpu.log; tail -20 $OUT/test_gpu.log
echo "== 2. bench_gpu, graphs on"
timeout 150 python3 scripts/bench_gpu.py --repeats 3 --modes graphs_on --no-transformers --out $OUT/gpu.json 2>&1 | grep -v "Warning\|warn" | tee $OUT/bench_gpu.log | tail -40
