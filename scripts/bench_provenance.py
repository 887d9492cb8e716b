"""The server-side CPU cost of per-token provenance, without the noise of a loaded machine.

    .venv/bin/python scripts/bench_provenance.py --model smollm2-135m-instruct

Replays what `_stream` does for one choice over a real text and a real tokenizer, in steps
of 1-5 tokens (as speculation emits them): the incremental detokenizer and the chunk's JSON
alone (what every stream pays), then with the provenance tracker and its records. Prints
microseconds per token for both and the bytes per token on the wire. End-to-end
throughput is `specdec bench-serve --provenance off,on` (docs/guide/serving.md); this isolates
the part that option adds, which a busy 2-core machine cannot resolve to a few percent.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from specdec.hub import resolve
from specdec.serving.detokenizer import IncrementalDetokenizer
from specdec.serving.provenance import ProvenanceTracker
from specdec.tokenization import load_tokenizer

TEXT = '''def merge(a: list[int], b: list[int]) -> list[int]:
    """Merge two sorted lists into one sorted list (stable: ties keep a's first)."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        if b[j] < a[i]:
            out.append(b[j]); j += 1
        else:
            out.append(a[i]); i += 1
    return out + a[i:] + b[j:]  # one of the two is empty here: naïve but correct ✓
'''


def replay(tokenizer, ids, steps, provenance: bool) -> tuple[float, int]:
    """Seconds and bytes for one stream of `ids` arriving in `steps` (tokens per event)."""
    detok = IncrementalDetokenizer(tokenizer)
    tracker = ProvenanceTracker(tokenizer) if provenance else None
    n, sent, start = 0, 0, time.perf_counter()
    for size in steps:
        n = min(n + size, len(ids))
        trace = [] if size == 1 and n == 1 else [(4, size - 1, size)]
        final = n == len(ids)
        text = detok.finish(ids[:n]) if final else detok.delta(ids[:n])
        choice = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}
        if tracker is not None:
            tracker.update(ids[:n], trace)
            choice["speculation"] = {"tokens": tracker.records(text, final)}
        body = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 0}
        body |= {"model": "m", "choices": [choice]}
        sent += len(f"data: {json.dumps(body, separators=(',', ':'))}\n\n")
        if final:
            break
    return time.perf_counter() - start, sent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--tokens", type=int, default=256, help="stream length (text repeated)")
    args = p.parse_args()
    tokenizer = load_tokenizer(resolve(args.model))
    ids = tokenizer(TEXT * 8)["input_ids"][: args.tokens]
    rng = random.Random(0)
    steps = [1] + [rng.randint(1, 5) for _ in range(len(ids))]
    rows = {}
    for provenance in (False, True, False, True):  # alternate: a neighbour's burst hits both
        for _ in range(args.repeat):
            seconds, sent = replay(tokenizer, ids, steps, provenance)
            best = rows.get(provenance, (float("inf"), 0))
            rows[provenance] = (min(best[0], seconds), sent)
    for provenance, (seconds, sent) in rows.items():
        name = "with provenance" if provenance else "stream only    "
        print(
            f"{name}: {1e6 * seconds / len(ids):7.1f} us/token, {sent / len(ids):6.1f} bytes/token"
            f" ({len(ids)} tokens, best of {2 * args.repeat})"
        )
    extra = (rows[True][0] - rows[False][0]) / len(ids)
    print(f"provenance adds {1e6 * extra:.1f} us of server CPU per token")


if __name__ == "__main__":
    main()
