"""Int4 passes of the 1.5B's projection shapes (28 layers of qkv, o, gate/up, down) from
4-bit weights alone, in the row layout and the tile layout (`native.q4_tiles`): the time of
an r-row pass against a one-row pass in rows (a verify pass's cost), and the many-row
products a prefill makes. Random 4-bit blocks (the arithmetic does
not depend on the values); ways take turns within each repeat so a neighbour's busy spell
slows them alike; medians and spread over `--repeats`.

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_int4_rows.py --rows 1,9 --prefill 256
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdec.kernels import native
from specdec.kernels.q4 import Q4Weights

# (out, in) per layer of Qwen2.5-Coder-1.5B: qkv, o, gate/up, down
SHAPES = [(2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960)]
LAYERS = 28


def random_blocks(n: int, k: int, gen: torch.Generator) -> Q4Weights:
    s = -(-k // 256)

    def u8(*shape):
        return torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen)

    return Q4Weights(
        qs=u8(n, k // 2),
        sc=u8(n, 8 * s) >> 2,
        mn=u8(n, 8 * s) >> 2,
        d=torch.rand(n, s, generator=gen) * 1e-3,
        dmin=torch.rand(n, s, generator=gen) * 1e-3,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", default="1,9")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--layers", type=int, default=LAYERS)
    ap.add_argument("--prefill", type=int, default=0, help="also time a pass of this many rows")
    args = ap.parse_args()
    q4_gemv = native.q4_gemv()
    if q4_gemv is None:
        raise SystemExit("the native int4 kernel did not build on this machine")
    gen = torch.Generator().manual_seed(0)
    layers = [random_blocks(n, k, gen) for _ in range(args.layers) for n, k in SHAPES]
    print(f"threads {torch.get_num_threads()}, {sum(w.qs.nbytes for w in layers) / 1e9:.2f} GB")
    widths = [int(r) for r in args.rows.split(",")]
    xs = {r: {k: torch.randn(r, k, generator=gen) for _, k in SHAPES} for r in widths}

    to_tiles = native.q4_tiles()
    tiles = [to_tiles(*w.tensors()) for w in layers] if to_tiles else [None] * len(layers)
    layouts = ["rows", "tiles"] if to_tiles else ["rows"]

    def sweep(rows: int, layout: str) -> float:
        start = time.perf_counter()
        for w, t in zip(layers, tiles, strict=True):
            q4_gemv(xs[rows][w.shape[1]], *w.tensors(), None, t if layout == "tiles" else None)
        return time.perf_counter() - start

    seconds = {(r, lay): [] for r in widths for lay in layouts}
    for repeat in range(args.repeats + 1):
        for r in widths:
            for lay in layouts:
                t = sweep(r, lay)
                if repeat:  # the first round warms up
                    seconds[r, lay].append(t)
    one = statistics.median(seconds[widths[0], "rows"])
    for lay in layouts:
        for r in widths:
            med = statistics.median(seconds[r, lay])
            print(
                f"{lay:5s} {r:3d} rows: median {med * 1e3:7.1f} ms (min "
                f"{min(seconds[r, lay]) * 1e3:.1f}, max {max(seconds[r, lay]) * 1e3:.1f}), "
                f"{med / one:.2f}x {widths[0]} row(s) in rows"
            )
    if args.prefill:
        r = args.prefill
        x = {k: torch.randn(r, k, generator=gen) for _, k in SHAPES}
        few = layers[: 4 * 2]  # two layers: a prefill is compute-bound
        for name, fn in prefill_ways(few, x).items():
            times = []
            for _ in range(3):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            per_row = min(times) / len(few) * 4 * LAYERS / r
            print(f"prefill {r} rows, {name}: {per_row * 1e3:.2f} ms a row over 28 layers")


def prefill_ways(layers, x):
    """The ways a prefill's product from 4-bit weights can run, by name."""
    q4_gemv = native.q4_gemv()
    ways = {"q4_native": lambda: [q4_gemv(x[w.shape[1]], *w.tensors()) for w in layers]}
    if native.q4_tiles() is not None:
        tiles = [native.q4_tiles()(*w.tensors()) for w in layers]
        pairs = list(zip(layers, tiles, strict=True))
        ways["q4_native, tiles"] = lambda: [
            q4_gemv(x[w.shape[1]], *w.tensors(), None, t) for w, t in pairs
        ]
    from specdec.kernels.quant import Int4Linear, _q4_panels

    int4 = [Int4Linear.from_blocks(w, torch.float32, tiles=False) for w in layers]
    ways["q4_panels"] = lambda: [_q4_panels(w, None, x[w.in_features]) for w in int4]
    dense = [w.dequantize().bfloat16() for w in layers]

    def bf16_panels():
        from specdec.kernels.linear import Linear, _fp32_panels

        for w in dense:
            _fp32_panels(Linear.over(w), None, x[w.shape[1]])

    ways["bf16_fp32_panels (today's prefill)"] = bf16_panels
    return ways


if __name__ == "__main__":
    main()
