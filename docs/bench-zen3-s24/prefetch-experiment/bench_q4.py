import time, torch
from torch.utils.cpp_extension import load
from specdec.models.quant import q4_quantize
torch.set_num_threads(2)
m = load(name="q4x", sources=["q4x.cpp"], extra_cflags=["-O3","-mavx2","-mfma","-fopenmp","-I/tmp/kexp"], extra_ldflags=["-fopenmp"], build_directory="/tmp/kexp/b", verbose=False)
for (N, K) in [(17920, 1536), (1536, 8960), (2048, 1536), (151936, 1536)]:
    w0 = q4_quantize(torch.randn(N, K))
    ts0 = [t.contiguous() for t in w0.tensors()]
    per = sum(t.numel() * t.element_size() for t in ts0)
    copies = max(2, int(400e6 // per) + 1)
    ws = [ts0] + [[t.clone() for t in ts0] for _ in range(copies - 1)]
    for R in (1, 2, 4, 5, 8):
        x = torch.randn(R, K)
        line = []
        m.setpf(0, 16); ref = m.q4_gemv(x, *ws[0])
        for pf in (0, 1, 2, 4, 8):
            m.setpf(pf, 16)
            assert torch.equal(m.q4_gemv(x, *ws[0]), ref)
            ts = []
            for rep in range(5):
                t = time.perf_counter()
                for w in ws: m.q4_gemv(x, *w)
                ts.append((time.perf_counter() - t) / len(ws))
            line.append(f"pf{pf}:{per / min(ts) / 1e9:5.1f}")
        print(N, K, R, " ".join(line), flush=True)
