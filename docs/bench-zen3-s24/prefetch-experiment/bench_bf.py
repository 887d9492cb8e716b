import time, torch, sys
from torch.utils.cpp_extension import load
torch.set_num_threads(2)
m = load(name="bfexp", sources=["bfexp.cpp"], extra_cflags=["-O3","-mavx2","-mfma","-fopenmp"], extra_ldflags=["-fopenmp"], build_directory="/tmp/kexp/b", verbose=False)
for (N, K) in [(17920, 1536), (1536, 8960), (2048, 1536), (151936, 1536)]:
    per = N * K * 2
    copies = max(2, int(400e6 // per) + 1)
    ws = [torch.randn(N, K).to(torch.bfloat16) for _ in range(copies)]
    for R in (1, 2, 4):
        x = torch.randn(R, K)
        ref = torch.nn.functional.linear(x, ws[0].float())
        line = []
        for variant, pf in [(0, 0), (0, 1), (0, -1024), (0, -2048), (1, 1024), (1, 2048)]:
            if variant == 0 and pf == 1: pf = 4 * K * 2 if R <= 2 else (2*K*2 if R == 4 else K*2)
            y = m.gemv(x, ws[0], variant, pf, 64)
            assert torch.allclose(y, ref, rtol=1e-3, atol=1e-2), (variant, pf)
            ts = []
            for rep in range(5):
                t = time.perf_counter()
                for w in ws: m.gemv(x, w, variant, pf, 64)
                ts.append((time.perf_counter() - t) / len(ws))
            line.append(f"v{variant}/pf{pf}:{per / min(ts) / 1e9:5.1f}")
        print(N, K, R, " ".join(line), flush=True)
