"""The int4 kernel with a run-time prefetch distance (rows ahead, 0 = none), GB/s of the
bytes each call reads over weights cycled through 400 MB: the experiment behind
PREFETCH_ROWS. The variant is made from the kernel as it stood before prefetching (git
revision 518b203~1), with the edits below, so only those edits differ from what shipped.

    .venv/bin/python docs/bench-zen3-s24/prefetch-experiment/bench_q4.py
"""

import subprocess
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

from specdec.models.quant import q4_quantize

REV, NATIVE = "518b203~1", "specdec/models/native"
EDITS = {
    "q4_kernel.h": [
        ("namespace q4 {", "namespace q4 {\ninline int64_t PF_ROWS = 0;"),
        (
            "    const uint8_t* scn = sc + n * G;\n    for (int64_t s = 0; s < S; ++s) {",
            "    const uint8_t* scn = sc + n * G;\n"
            "    const char* ahead = reinterpret_cast<const char*>(qn + PF_ROWS * (K / 2));\n"
            "    if (PF_ROWS) {\n"
            "      _mm_prefetch((const char*)(sc + (n + PF_ROWS) * G), _MM_HINT_T0);\n"
            "      _mm_prefetch((const char*)(mn + (n + PF_ROWS) * G), _MM_HINT_T0);\n"
            "    }\n"
            "    for (int64_t s = 0; s < S; ++s) {\n"
            "      if (PF_ROWS) {\n"
            "        _mm_prefetch(ahead + s * 128, _MM_HINT_T0);\n"
            "        _mm_prefetch(ahead + s * 128 + 64, _MM_HINT_T0);\n"
            "      }",
        ),
    ],
    "q4_gemv.cpp": [
        (
            "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {",
            "void setpf(int64_t p) { q4::PF_ROWS = p; }\n"
            'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n  m.def("setpf", &setpf);',
        )
    ],
}


def variant(build: Path):
    for name, edits in EDITS.items():
        text = subprocess.check_output(["git", "show", f"{REV}:{NATIVE}/{name}"], text=True)
        for old, new in edits:
            assert old in text, (name, old)
            text = text.replace(old, new)
        (build / name).write_text(text)
    flags = ["-O3", "-mavx2", "-mfma", "-fopenmp"]
    return load(
        name="q4_prefetch_variant",
        sources=[str(build / "q4_gemv.cpp")],
        extra_cflags=flags,
        extra_ldflags=["-fopenmp"],
        build_directory=str(build),
    )


def main() -> None:
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as build:
        m = variant(Path(build))
        for n, k in [(17920, 1536), (1536, 8960), (2048, 1536), (151936, 1536)]:
            w0 = [t.contiguous() for t in q4_quantize(torch.randn(n, k)).tensors()]
            per = sum(t.numel() * t.element_size() for t in w0)
            ws = [w0] + [[t.clone() for t in w0] for _ in range(int(400e6 // per))]
            for rows in (1, 2, 4, 5, 8):
                x = torch.randn(rows, k)
                m.setpf(0)
                ref = m.q4_gemv(x, *ws[0])
                line = []
                for pf in (0, 1, 2, 4, 8):
                    m.setpf(pf)
                    assert torch.equal(m.q4_gemv(x, *ws[0]), ref)  # prefetching changes no result
                    times = []
                    for _ in range(5):
                        start = time.perf_counter()
                        for w in ws:
                            m.q4_gemv(x, *w)
                        times.append((time.perf_counter() - start) / len(ws))
                    line.append(f"pf{pf}:{per / min(times) / 1e9:5.1f}")
                print(n, k, rows, " ".join(line), flush=True)


if __name__ == "__main__":
    main()
