"""The int4 kernel's row layout before and after the group scales by byte shuffle (stop 47),
built side by side in one process.

Builds `q4_gemv.cpp` with the native sources as of BEFORE (a commit) and as in the working
tree, as two extensions; checks that both give bitwise the same products for 1-19 rows on
several shapes; then times both on the 0.5B's and 1.5B's shapes, weights cycled through
~400 MB (nothing cache-resident), the builds taking turns, 7 repeats, median. Prints GB/s
of int4 bytes, before -> after.

    python docs/bench-zen3-s47/scripts/q4_scales.py [BEFORE]   # BEFORE defaults to 7d8ba21
"""

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

from specdec.models.quant import q4_quantize

ROOT = Path(__file__).resolve().parents[3]
NATIVE = "specdec/models/native"
before = sys.argv[1] if len(sys.argv) > 1 else "7d8ba21"
work = Path(tempfile.mkdtemp(prefix="q4_scales_"))


def build(name: str, commit: str | None):
    folder = work / name
    folder.mkdir()
    for file in ("q4_gemv.cpp", "q4_kernel.h", "simd.h"):
        if commit is None:
            text = (ROOT / NATIVE / file).read_text()
        else:
            show = ["git", "-C", str(ROOT), "show", f"{commit}:{NATIVE}/{file}"]
            text = subprocess.run(show, check=True, capture_output=True, text=True).stdout
        (folder / file).write_text(text)
    flags = ["-O3", "-mavx2", "-mfma", "-fopenmp"]
    return load(
        name=f"q4_scales_{name}",
        sources=[str(folder / "q4_gemv.cpp")],
        extra_cflags=flags,
        extra_ldflags=["-fopenmp"],
        build_directory=str(folder),
    ).q4_gemv


torch.set_num_threads(2)
builds = {"before": build("before", before), "after": build("after", None)}
torch.manual_seed(0)
for n, k in [(40, 512), (65, 896), (33, 1536), (48, 8960)]:
    weights = q4_quantize(torch.randn(n, k)).tensors()
    for r in range(1, 20):
        x = torch.randn(r, k)
        outs = [op(x, *weights, None, None) for op in builds.values()]
        assert torch.equal(*outs), (n, k, r)
print("bitwise equal: 4 shapes x 1-19 rows")
shapes = {
    "0.5B qkv": (1152, 896),
    "0.5B o": (896, 896),
    "0.5B gate_up": (9728, 896),
    "0.5B down": (896, 4864),
    "1.5B qkv": (2048, 1536),
    "1.5B gate_up": (17920, 1536),
    "1.5B down": (1536, 8960),
    "0.5B head": (151936, 896),
}
for name, (n, k) in shapes.items():
    weights = q4_quantize(torch.randn(n, k)).tensors()
    nbytes = sum(t.numel() * t.element_size() for t in weights)
    copies = max(2, int(400e6 // nbytes))
    cycle = [[t.clone() for t in weights] for _ in range(copies)]
    line = []
    for r in (1, 2, 4, 8):
        x = torch.randn(r, k)
        times = {key: [] for key in builds}
        for _ in range(7):
            for key, op in builds.items():
                start = time.perf_counter()
                for w in cycle:
                    op(x, *w, None, None)
                times[key].append((time.perf_counter() - start) / copies)
        gbs = {key: nbytes / sorted(t)[3] / 1e9 for key, t in times.items()}
        line.append(f"{r}: {gbs['before']:4.1f} -> {gbs['after']:4.1f}")
    print(f"{name:13s}", " | ".join(line), flush=True)
