#!/bin/bash
# Device call (stop 52): tests/gpu after the emulate_precision_casts fix (stop 51's one
# failure, bf16 self-draft acceptance); the race of three stacks with the tuple fix; kernels
# per pass and a plain step's host time after the host-work commit. Writes under $OUT.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"; } > $OUT/env.txt 2>&1
cat $OUT/env.txt
echo "== 1. tests/gpu"
timeout 200 python3 -m pytest -q tests/gpu -p no:cacheprovider --durations=5 2>&1 | grep -v "^DEBUG" > $OUT/test_gpu.log; tail -14 $OUT/test_gpu.log
echo "== 2. bench_gpu, graphs on (the race of three stacks)"
timeout 140 python3 scripts/bench_gpu.py --repeats 3 --modes graphs_on --no-transformers --out $OUT/gpu.json 2>&1 | grep -v "Warning\|warn" | tee $OUT/bench_gpu.log | tail -40
echo "== 3. kernels per pass, host time per step"
timeout 75 python3 scripts/gpu_pass_profile.py --top 14 --out $OUT/gpu_profile.json 2>&1 | grep -v "USDT\|Warning\|warn" | tee $OUT/profile.log | grep -A16 "engine"
