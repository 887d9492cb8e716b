#!/usr/bin/env bash
# Issue 13's batch-1 bars on the machine at hand, one bench after another (stop 53).
# Each bench writes its own folder and resumes it (finished points are kept, a stopped
# group goes on at its next turn), so rerunning the script goes on where it stopped.
# bf16-peers-t4/ is an earlier run, before the bf16 kernel's panels (5132643), of
# plain,hf-generate,draft-auto,draft-k4,vllm,vllm-draft-k4 in one bench; with the panels
# a bf16 model holds 3.1 GB more, so transformers and vLLM now go in benches of their own.
set -u
cd "$(dirname "$0")/../.."
OUT=docs/bench-zen4-s53
SD=.venv/bin/specdec
VLLM=${SPECDEC_VLLM_PYTHON:-/work/vllm-env/bin/python}
run() {  # name, then the bench's arguments
  local name=$1; shift
  echo "== $name $(date -u +%H:%M:%S)"
  $SD bench --out "$OUT/$name" "$@" >> "$OUT/$name.log" 2>&1
  echo "   rc=$? $(date -u +%H:%M:%S)"
}
# bf16 against transformers, and speculation on the bf16 target
run bf16-hf --workloads code,sharegpt --batches 1 --temperatures 0 \
  --methods plain,hf-generate,draft-auto,draft-k4 --max-tokens 64 \
  --prompts-per-point 4 --repeats 3 --curve-ks 0,1,2,4
# bf16 against vLLM's CPU build, plain
run bf16-vllm --workloads code,sharegpt --batches 1 --temperatures 0 \
  --methods plain,vllm --max-tokens 64 --prompts-per-point 4 --repeats 3 --curve-ks 0 \
  --vllm-python "$VLLM"
# bf16 speculation on code against our own plain (stop 49 / 52's command)
run bf16-code-128 --workloads code --batches 1 --temperatures 0 \
  --methods plain,draft-auto,draft-k4 --max-tokens 128 --prompts-per-point 4 --repeats 3 \
  --curve-ks 0,1,2,3,4,5,6,7
# int4 against llama.cpp on the same Q4_K_M file and vLLM's draft-model speculation
run int4-peers --quant int4 --workloads code,sharegpt --batches 1 --temperatures 0 \
  --methods plain,draft-auto,draft-k3,ngram-auto,llamacpp,vllm-draft-k4 --max-tokens 64 \
  --prompts-per-point 4 --repeats 4 --curve-ks 0,1,2,3,4,5,6,7,8 --vllm-python "$VLLM"
# every registry model against transformers, plain (the 1.5B is in bf16-hf)
run smollm2-vs-hf --model smollm2-135m-instruct --draft smollm2-135m-instruct --workloads code \
  --batches 1 --temperatures 0 --methods plain,hf-generate --max-tokens 64 --prompts-per-point 4 \
  --repeats 3 --curve-ks 0
run qwen05-vs-hf --model qwen2.5-coder-0.5b-instruct --draft qwen2.5-coder-0.5b-instruct \
  --workloads code --batches 1 --temperatures 0 --methods plain,hf-generate --max-tokens 64 \
  --prompts-per-point 4 --repeats 3 --curve-ks 0
