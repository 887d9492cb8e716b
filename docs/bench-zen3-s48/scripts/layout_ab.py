"""The bf16 engine with the native kernel's panel layout (this tree) against a commit before
it, as whole processes taking turns: plain decoding and a fixed speculative window on the
bench's code prompts, the decode phase timed inside each process.

    python docs/bench-zen3-s48/scripts/layout_ab.py [BEFORE] [TURNS]   # a857876, 3

BEFORE is checked out as a git worktree under /tmp and run with this tree's virtual
environment (PYTHONPATH first). Each process loads the bf16 1.5B and the int4 0.5B draft,
warms up on one prompt, then generates 128 tokens greedily for two code prompts, plain and
at k = 5; it prints decode tokens/s (generated tokens after the first, over the time after
the first token). The two builds alternate, A B B A ..., so a slow minute of the host
falls on both.
"""

import json
import os
import subprocess
import sys
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[3]
CHILD = r"""
import json, time, torch
from specdec import LLM, SamplingParams
from specdec.bench import workloads
torch.set_num_threads(2)
llm = LLM("qwen2.5-coder-1.5b-instruct", draft="qwen2.5-coder-0.5b-instruct",
          draft_quant="int4", speculate=5)
params = SamplingParams(max_tokens=128, temperature=0.0)
llm.generate(workloads.CODE_PROMPTS[3], SamplingParams(max_tokens=8, temperature=0.0), chat=True)
out = {}
for name, k in (("plain", 0), ("k5", 5)):
    llm.engine.window.k_max = k  # a FixedWindow: k = 0 decodes plainly
    tokens = seconds = 0.0
    for prompt in workloads.CODE_PROMPTS[:2]:
        t0 = time.perf_counter()
        res = llm.generate(prompt, params, chat=True)[0]
        tokens += len(res.token_ids) - 1
        seconds += time.perf_counter() - t0 - res.ttft_s
    out[name] = tokens / seconds
print("RESULT " + json.dumps(out), flush=True)
"""


def run(tree: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.run(  # run in the tree: `python -c` puts the working folder first
        [sys.executable, "-c", CHILD], env=env, cwd=tree, capture_output=True, text=True, check=True
    )
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


def main() -> None:
    before = sys.argv[1] if len(sys.argv) > 1 else "a857876"
    turns = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    old = Path(f"/tmp/layout_ab_{before}")
    if not old.exists():
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old), before], check=True
        )
    trees = {"before": old, "panels": ROOT}
    results: dict[str, list[dict]] = {name: [] for name in trees}
    for turn in range(turns):
        order = list(trees) if turn % 2 == 0 else list(trees)[::-1]
        for name in order:
            results[name].append(run(trees[name]))
            print(turn, name, results[name][-1], flush=True)
    for what in ("plain", "k5"):
        ratios = [
            p[what] / b[what] for p, b in zip(results["panels"], results["before"], strict=True)
        ]
        print(
            f"{what}: before {median(r[what] for r in results['before']):.2f} tok/s, panels "
            f"{median(r[what] for r in results['panels']):.2f}; per turn "
            + ", ".join(f"{r:.3f}" for r in ratios)
        )


if __name__ == "__main__":
    main()
