cd /work/main
E=~/.cache/specdec/runs/qwen15-eagle-s38
C="--workloads sharegpt --batches 1 --temperatures 0 --max-tokens 64 --prompts-per-point 4 --no-peers"
.venv/bin/specdec bench --out bench-out/s38/eagle-int4-auto --quant int4 --heads $E $C --methods plain,draft-auto,heads-k1,heads-k2,heads-auto --repeats 3 --curve-ks 0,1,2,3
.venv/bin/specdec bench --out bench-out/s38/eagle-bf16-auto --heads $E $C --methods plain,draft-auto,heads-k1,heads-k3,heads-auto --repeats 2 --curve-ks 0,1,3
echo ALL DONE
