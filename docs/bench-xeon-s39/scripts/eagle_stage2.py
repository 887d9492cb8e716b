"""Stage 2 for the eagle head: the target's own answers to ShareGPT chat prompts.

phase gen:    greedy continuations of prompts from the middle of the training split by the
              int4 target (batch 8, 96 new tokens), appended to gen.jsonl (resumes after
              the prompts done); the trainer's 8 held-out prompts and the bench's 4 are
              excluded.
phase states: prompt + continuation documents packed into 4 x 256 rows, the bf16
              target's states and greedy labels, as stage-1 shards (shard-s2-*.safetensors);
              with QUANT int4, the int4 target's (shard-s2q4-*.safetensors), the states an
              int4 engine hands its head.

    python eagle_stage2.py gen MINUTES [OUT [SKIP]]   # SKIP: prompts an earlier OUT took
    python eagle_stage2.py states [OUT [QUANT]]
(stop 40 added OUT and SKIP: more answers, from the prompts after stop 39's, in a new folder;
stop 41 added QUANT.)
"""

import json
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, "docs/bench-xeon-s38/scripts")
from eagle_probe import corpus_split, load_target  # noqa: E402

OUT = Path("bench-out/s39/eagle2")
torch.set_num_threads(2)


def phase_gen(minutes: float, skip: int = 0) -> None:
    from specdec import LLM
    from specdec.bench import workloads
    from specdec.config import SamplingParams
    from specdec.tokenization import encode_prompt

    llm = LLM("qwen2.5-coder-1.5b-instruct", quant="int4", max_batch=8)
    tok = llm.tokenizer
    corpus, _, train_docs = corpus_split(tok)
    bench = {tuple(encode_prompt(tok, t, True)) for t in workloads.sharegpt_prompts(4, seed=0)}
    gen = OUT / "gen.jsonl"
    done = sum(1 for _ in gen.open()) if gen.is_file() else 0
    # from the middle of the order: past the stage-1 documents (the front) and away from
    # bench_learn.py's replay stream (the tail)
    order = train_docs[len(train_docs) // 2 :]
    prompts: list = []
    for i in order:
        p = corpus.prompt_ids(i)
        if 8 <= len(p) <= 384 and tuple(p) not in bench:
            prompts.append((i, p))
    prompts = prompts[skip:]
    print(f"{len(prompts)} prompts after the {skip} skipped; {done} done", flush=True)
    params = SamplingParams(temperature=0, max_tokens=96)
    started, made = time.perf_counter(), 0
    cursor = done
    while time.perf_counter() - started < minutes * 60 and cursor < len(prompts):
        batch = prompts[cursor : cursor + 8]
        outs = llm.engine.generate([p for _, p in batch], params)
        with gen.open("a") as fh:
            for (i, p), o in zip(batch, outs, strict=True):
                fh.write(json.dumps({"doc": i, "prompt": p, "out": o.token_ids}) + "\n")
                made += len(o.token_ids)
        cursor += len(batch)
        print(
            f"{cursor} prompts, {made / (time.perf_counter() - started):.1f} gen tok/s", flush=True
        )


def phase_states(quant: str = "bf16") -> None:
    from specdec.speculator.train import TargetStates, target_labels

    if quant == "bf16":
        target, tok, _ = load_target()
        prefix = "shard-s2"
    else:
        from specdec import LLM

        llm = LLM("qwen2.5-coder-1.5b-instruct", quant=quant)
        target, tok = llm.engine.model.eval().requires_grad_(False), llm.tokenizer
        prefix = f"shard-s2q{quant.removeprefix('int')}"
    docs = [json.loads(line) for line in (OUT / "gen.jsonl").open()]
    stream: list[int] = []
    for d in docs:
        stream += d["prompt"] + d["out"] + [tok.eos_token_id]
    rows = len(stream) // 256
    data = torch.tensor(stream[: rows * 256]).view(rows, 256)
    states = TargetStates(target)
    started = time.perf_counter()
    for n, start in enumerate(range(0, rows - 31, 32)):
        file = OUT / f"{prefix}-{n:05d}.safetensors"
        if file.is_file():
            continue
        toks, hids, labs = [], [], []
        for b in range(start, start + 32, 4):
            tokens = data[b : b + 4]
            hidden = states(tokens)
            toks.append(tokens)
            hids.append(hidden)
            labs.append(target_labels(target, hidden, tokens))
        save_file(
            {
                "tokens": torch.cat(toks),
                "hidden": torch.cat(hids).contiguous(),
                "labels": torch.cat(labs),
            },
            str(file.with_suffix(".tmp")),
        )
        file.with_suffix(".tmp").rename(file)
        print(
            f"shard {n}: {(n + 1) * 32 * 256} positions, {time.perf_counter() - started:.0f} s",
            flush=True,
        )


if __name__ == "__main__":
    if sys.argv[1] == "gen":
        OUT = Path(sys.argv[3]) if len(sys.argv) > 3 else OUT
        OUT.mkdir(parents=True, exist_ok=True)
        phase_gen(float(sys.argv[2]), int(sys.argv[4]) if len(sys.argv) > 4 else 0)
    else:
        OUT = Path(sys.argv[2]) if len(sys.argv) > 2 else OUT
        phase_states(sys.argv[3] if len(sys.argv) > 3 else "bf16")
