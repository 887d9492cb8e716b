#!/bin/bash
# One device call: issue 14's fused layers on a GPU. Every step writes under $OUT.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"; nproc; } > $OUT/env.txt 2>&1
cat $OUT/env.txt
echo "== 1. fused layers on CUDA: correctness first"
timeout 100 python3 -m pytest -q -x tests/gpu/test_cuda_graphs.py -k "fused or replayed" -p no:cacheprovider 2>&1 | tee $OUT/test_fused.log | tail -15
echo "== 2. bench_gpu"
timeout 210 python3 scripts/bench_gpu.py --repeats 3 --modes graphs_on,graphs_on_eager_layers --out $OUT/gpu.json 2>&1 | grep -v Warning | tee $OUT/bench_gpu.log
echo "== 3. kernels per pass"
timeout 50 python3 scripts/gpu_pass_profile.py --out $OUT/gpu_profile.json 2>&1 | grep -v "USDT\|Warning" | tee $OUT/profile.log
echo "== 4. tests/gpu"
timeout 130 python3 -m pytest -q tests/gpu -p no:cacheprovider --durations=5 2>&1 | tee $OUT/test_gpu.log | tail -25
