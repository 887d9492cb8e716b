#!/usr/bin/env bash
# Issue 13's bf16 bar (speculation on code >= 2.5x own plain), stop 49/52/53/54's command, with
# the build named by $1 (avx512bf16: vdpbf16ps pair panels; avx512: stop 53's fp32-FMA
# panels) into bf16-code-128-$1$2/ ($2: a later round's suffix). Resumable like every bench.
set -u
cd "$(dirname "$0")/../.."
ISA=${1:-avx512bf16}
OUT=docs/bench-xeon-s55/bf16-code-128-$ISA${2:-}
echo "== $ISA $(date -u +%H:%M:%S)"
SPECDEC_NATIVE_ISA=$ISA .venv/bin/specdec bench --out "$OUT" --workloads code --batches 1 \
  --temperatures 0 --methods plain,draft-auto,draft-k4 --max-tokens 128 --prompts-per-point 4 \
  --repeats ${REPEATS:-3} --curve-ks 0,1,2,3,4,5,6,7 >> "$OUT.log" 2>&1
echo "   rc=$? $(date -u +%H:%M:%S)"
