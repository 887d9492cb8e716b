"""The int4 kernels side by side on the 1.5B's projection shapes: the native Q4_K kernel
(`q4_native`, int8 activations), torch's int4 kernel and, for scale, the native bf16 kernel
on the same layers in bf16. Layers are swept (6-24 of a shape, beyond the caches) and the
fastest of `--repeats` sweeps is kept; ms per layer and GB/s of the bytes each reads.

    .venv/bin/python scripts/bench_q4.py
"""

from __future__ import annotations

import argparse
import time

import torch

from specdec.kernels import native
from specdec.kernels.quant import Int4Linear, _torch_int4, _torch_int4_pack
from specdec.kernels.tuning import machine

SHAPES = [(17920, 1536, 6), (1536, 8960, 6), (2048, 1536, 24)]  # out, in, layers swept


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def kernels(x, bf16, q4, packed, q4_gemv, bf16_gemv):
    """One sweep of each kernel over the layers, as functions of no arguments."""
    xb = x.bfloat16()
    return (
        lambda: [q4_gemv(x, w.qs, w.sc, w.mn, w.d, w.dmin) for w in q4],
        lambda: [_torch_int4(w, f, xb) for w, f in zip(q4, packed, strict=True)],
        lambda: [[bf16_gemv(x[i : i + 8], w.weight) for i in range(0, len(x), 8)] for w in bf16],
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", default="1,2,4,8,9,16")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    q4_gemv, bf16_gemv = native.q4_gemv(), native.bf16_gemv()
    if q4_gemv is None or bf16_gemv is None:
        raise SystemExit("the native kernels did not build on this machine")
    print(machine())
    torch.manual_seed(0)
    for n, k, count in SHAPES:
        bf16 = [torch.nn.Linear(k, n, bias=False).to(torch.bfloat16) for _ in range(count)]
        q4 = [Int4Linear(layer) for layer in bf16]
        packed = [_torch_int4_pack(layer) for layer in q4]
        q4_bytes, bf16_bytes = q4[0].stored_bytes(), n * k * 2
        for rows in map(int, args.rows.split(",")):
            x = torch.randn(rows, k)
            t_q4, t_torch, t_bf16 = (
                best_of(run, args.repeats)
                for run in kernels(x, bf16, q4, packed, q4_gemv, bf16_gemv)
            )
            t_q4, t_torch, t_bf16 = t_q4 / count, t_torch / count, t_bf16 / count
            print(
                f"{n}x{k} rows {rows:2d}: q4_native {t_q4 * 1e3:6.3f} ms "
                f"({q4_bytes / t_q4 / 1e9:5.1f} GB/s) | torch int4 {t_torch * 1e3:6.3f} ms "
                f"({q4_bytes / t_torch / 1e9:5.1f}) | native bf16 {t_bf16 * 1e3:6.3f} ms "
                f"({bf16_bytes / t_bf16 / 1e9:5.1f})",
                flush=True,
            )


if __name__ == "__main__":
    main()
