"""Does compiling the decoder layers (TorchInductor fuses the elementwise work) shrink a
graph-replayed pass on a GPU? Times one pass of 1 and of 9 tokens at batch 1 (random
weights of the default pair's shapes, bf16, 256 cached tokens), graphs on, with the
layers eager and compiled, and a plain decode run of each; prints the ratios.

    python scripts/gpu_compile_probe.py --out bench-out/gpu_compile.json   # a GPU
    python scripts/gpu_compile_probe.py --device cpu --quick                # smoke test
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from specdec.bench.costs import forward_seconds

sys.path.insert(0, str(Path(__file__).parent))  # scripts/ is no package: its siblings
from bench_gpu import pair_shapes, random_pair  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--mode", default="default", help="torch.compile mode")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    device = torch.device(args.device)
    shapes = pair_shapes(args.quick)
    graphs = device.type == "cuda"
    context = 16 if args.quick else 256
    result = {
        "device": torch.cuda.get_device_name() if graphs else "cpu",
        "torch": torch.__version__,
        "mode": args.mode,
    }
    for name, cfg, seed in (("target", shapes[0], 0), ("draft", shapes[1], 1)):
        _, model = random_pair(cfg, torch.bfloat16, device, seed)
        for compiled in (False, True):
            if compiled:
                for layer in model.layers:
                    layer.compile(dynamic=False, mode=None if args.mode == "default" else args.mode)
            t0 = time.perf_counter()
            s = forward_seconds(
                model, 1, (1, 9), context, args.repeats, static_passes=True, cuda_graphs=graphs
            )
            key = f"{name}_{'compiled' if compiled else 'eager'}"
            result[key] = {
                "step_ms": round(s[1] * 1e3, 3),
                "v8": round(s[9] / s[1], 4),
                "measure_s": round(time.perf_counter() - t0, 1),
            }
            print(key, result[key], flush=True)
        del model
    for kind in ("eager", "compiled"):
        result[f"c_{kind}"] = round(
            result[f"draft_{kind}"]["step_ms"] / result[f"target_{kind}"]["step_ms"], 4
        )
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
