#!/bin/bash
# Device call 2: the race of three layer stacks (model's, fused, fused + memory-efficient
# attention), one per model; tests/gpu; host profile of a plain step. Writes under $OUT.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"; } > $OUT/env.txt 2>&1
cat $OUT/env.txt
echo "== 1. bench_gpu, graphs on (the race)"
timeout 130 python3 scripts/bench_gpu.py --repeats 3 --modes graphs_on --no-transformers --out $OUT/gpu.json 2>&1 | grep -v "Warning\|warn" | tee $OUT/bench_gpu.log
echo "== 2. tests/gpu"
timeout 160 python3 -m pytest -q tests/gpu -p no:cacheprovider --durations=5 2>&1 | grep -v "^DEBUG" | tee $OUT/test_gpu.log | tail -22
echo "== 3. kernels per pass, host time per step"
timeout 70 python3 scripts/gpu_pass_profile.py --top 14 --out $OUT/gpu_profile.json 2>&1 | grep -v "USDT\|Warning\|warn" | tee $OUT/profile.log | grep -A16 "engine"
