"""Transparent huge pages for torch's CPU allocations (`THP_MEM_ALLOC_ENABLE=1`, read once
per process at its first allocation), paired across two processes: one with, one without,
both loaded and alive, taking turns (the order alternating) on the same new prompt each
turn: its prefill (TTFT) and `NEW` greedy tokens after it. A 1,024-token int4 prefill took
250-350k minor page faults and 7-16% of its CPU in the kernel here (stop 57); with the
variable set, 24-45k, but one process per mode minutes apart could not say what that did
to wall time on a host whose speed swings 2x.
Usage: python thp_ab.py [turns] [len] [rows] [quant] [new tokens]"""

import json
import os
import statistics
import subprocess
import sys

MODES = ("default", "thp")


def child(mode: str, length: int, rows: int, quant: str, new: int) -> None:
    import resource
    import time

    import torch

    from specdec import LLM, SamplingParams
    from specdec.bench import workloads

    torch.set_num_threads(2)
    llm = LLM("qwen2.5-coder-1.5b-instruct", quant=quant)
    params = [SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True)] * rows
    warm = [workloads.synthetic_prompt(llm.tokenizer, 64, seed=10_000 + i) for i in range(rows)]
    llm.engine.generate(warm, params)
    print(json.dumps({"ready": mode}), flush=True)
    for line in sys.stdin:
        turn = int(line)
        prompts = [
            workloads.synthetic_prompt(llm.tokenizer, length, seed=100 * turn + i)
            for i in range(rows)
        ]
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        outs = llm.engine.generate(prompts, params)
        wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
        ttft = max(o.ttft_s for o in outs)
        huge = 0
        with open("/proc/self/smaps_rollup") as f:
            for row in f:
                if row.startswith("AnonHugePages:"):
                    huge = int(row.split()[1]) // 1024
        result = dict(
            wall=wall,
            ttft=ttft,
            decode_ms=1e3 * (wall - ttft) / max(1, new - 1),
            sys=r1.ru_stime - r0.ru_stime,
            cpu=r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime,
            faults_k=(r1.ru_minflt - r0.ru_minflt) / 1e3,
            huge_mb=huge,
            tokens=[o.token_ids for o in outs],
        )
        print(json.dumps(result), flush=True)


def main(turns: int, length: int, rows: int, quant: str, new: int) -> None:
    procs = {}
    for mode in MODES:
        env = dict(os.environ)
        env.pop("THP_MEM_ALLOC_ENABLE", None)
        if mode == "thp":
            env["THP_MEM_ALLOC_ENABLE"] = "1"
        args = [sys.executable, __file__, "--child", mode, str(length), str(rows), quant, str(new)]
        procs[mode] = subprocess.Popen(
            args, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        # Loaded one after the other: two loads at once would each take both cores.
        while "ready" not in json.loads(procs[mode].stdout.readline()):
            pass
    seen = {mode: [] for mode in MODES}
    for turn in range(turns):
        order = MODES if turn % 2 == 0 else MODES[::-1]
        for mode in order:
            procs[mode].stdin.write(f"{turn}\n")
            procs[mode].stdin.flush()
            row = json.loads(procs[mode].stdout.readline())
            seen[mode].append(row)
            shown = {k: v for k, v in row.items() if k != "tokens"}
            print(turn, mode.ljust(8), " ".join(f"{k} {v:.3f}" for k, v in shown.items()))
            sys.stdout.flush()
        same = seen["thp"][-1]["tokens"] == seen["default"][-1]["tokens"]
        print(f"   same tokens: {same}", flush=True)
    for proc in procs.values():
        proc.stdin.close()
        proc.wait()
    print("medians; per-turn ratios thp / default (time: below 1 is faster with huge pages)")
    for mode, rows_ in seen.items():
        keys = [k for k in rows_[0] if k != "tokens"]
        medians = {k: statistics.median(r[k] for r in rows_) for k in keys}
        print(mode.ljust(8), " ".join(f"{k} {v:.3f}" for k, v in medians.items()))
    for key in ("ttft", "decode_ms", "wall", "cpu"):
        xs = [t[key] / d[key] for t, d in zip(seen["thp"], seen["default"], strict=True)]
        print(f"{key}: median {statistics.median(xs):.3f} [{min(xs):.2f}-{max(xs):.2f}]")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        mode, length, rows, quant, new = sys.argv[2:7]
        child(mode, int(length), int(rows), quant, int(new))
    else:
        argv = sys.argv[1:]
        main(
            int(argv[0]) if argv else 10,
            int(argv[1]) if len(argv) > 1 else 1024,
            int(argv[2]) if len(argv) > 2 else 1,
            argv[3] if len(argv) > 3 else "int4",
            int(argv[4]) if len(argv) > 4 else 33,
        )
