"""Learning while serving, measured: a stream of ShareGPT chats replayed one request at a
time through `LLM(..., learn=True)` (the engine, drafter and learner that `specdec serve
--learn` runs; the learner trains between engine steps within its budget), recording per
request how many tokens each target pass emitted, which heads version drafted, and the
learner's loss and training seconds.

The stream is the tail of the speculator trainer's own seed-0 order of ShareGPT
conversations (`train.Corpus` over `sharegpt`, shuffled with `TrainConfig.seed`): the
trainer takes its held-out prompts from the head of that order and its documents from
there on, so a run that trained on fewer than `len(corpus) - requests` documents (every
run measured for docs/benchmarks.md: 240 and 50) never saw a request of the stream.

Modes (`--mode`):
  learn   the heads learn from the stream and are swapped in as they improve;
  frozen  the learner trains on the stream but never publishes: the heads that draft stay
          the starting ones, so the time against `off` is what learning costs the engine;
  off     no learner, the starting heads.
  cost    in one process, request by request in turn: an engine with no learner, one whose
          learner records the traffic but never trains, and one whose learner trains at
          `--budget` but never publishes (the same heads draft in all three), so the
          ratios of their wall times are what recording and learning cost, side by side.
`frozen`, `off` and `cost` work on a scratch copy of `--heads`, which they never change.

Each finished request is appended to OUT/requests-MODE.jsonl, and a run started again
skips the requests already there (the learner resumes from the checkpoint it keeps in
the heads folder), so a long replay can be stopped and resumed. `--report` reads the
files and writes OUT/summary.json and OUT/learning.png: tokens per target pass per window
of `--window` requests, and the modes' tokens/s side by side.

    .venv/bin/python scripts/bench_learn.py --model smollm2-135m-instruct \\
        --heads runs/learn-smollm2 --out bench-out/learn-smollm2 --requests 500
    .venv/bin/python scripts/bench_learn.py --out bench-out/learn-smollm2 --report
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from specdec.kernels.tuning import machine
from specdec.llm import LLM
from specdec.params import SamplingParams
from specdec.training.online import LearnConfig
from specdec.training.stages import (
    Corpus,
    TrainConfig,
    document_order,
    load_records,
    most_frequent_ids,
)

MODES = ("learn", "frozen", "off")  # and "cost" (`measure_cost`)
COST_ENGINES = ("off", "record", "train")
NEVER = 10**9  # publish_every of a learner whose heads never reach the drafter


def replay_stream(tokenizer, n: int, max_prompt_tokens: int) -> list[tuple[int, list[int]]]:
    """`n` (document index, chat prompt ids), from the end of the trainer's order."""
    corpus = Corpus(load_records("sharegpt"), tokenizer)
    stream = []
    for doc in reversed(document_order(len(corpus), TrainConfig.seed)):
        ids = corpus.prompt_ids(doc)
        if 1 <= len(ids) <= max_prompt_tokens:
            stream.append((doc, ids))
            if len(stream) == n:
                return stream
    return stream


def new_heads(model: str, path: Path, heads: int, draft_vocab: int, docs: int = 2000) -> None:
    """Untrained heads in `path` (the target's tables, as `--learn` starts them) scoring
    the `draft_vocab` ids most frequent in the first `docs` training documents of the
    trainer's order (disjoint from the stream), plus the end-of-turn ids: a head step and
    a training step over 16k of Qwen's 152k ids cost a tenth of the full vocabulary's."""
    from specdec.heads.mlp import build_speculator
    from specdec.hub import resolve
    from specdec.models.loading import load_transformer
    from specdec.tokenization import eos_token_ids, load_tokenizer

    source = resolve(model)
    tokenizer = load_tokenizer(source)
    corpus = Corpus(load_records("sharegpt"), tokenizer)
    first = TrainConfig.eval_prompts  # the trainer's first training document
    training = document_order(len(corpus), TrainConfig.seed)[first : first + docs]
    target = load_transformer(source, "bf16")
    frequent = most_frequent_ids(corpus, training, draft_vocab, target.config.vocab_size)
    ids = set(frequent.tolist()) | set(eos_token_ids(source, tokenizer))
    vocab = torch.tensor(sorted(ids), dtype=torch.long)
    with torch.random.fork_rng():
        torch.manual_seed(TrainConfig.seed)
        build_speculator(target, n_predict=heads, draft_vocab=vocab).save(path)


def _scratch_copy(heads: Path) -> Path:
    """A copy of the heads folder that a run may change (the starting heads stay as
    they are)."""
    scratch = Path(tempfile.mkdtemp(prefix="specdec-heads-"))
    # (not the trainer's stage-1 cache or checkpoint: gigabytes no learner reads)
    skip = shutil.ignore_patterns("stage1", "checkpoint")
    return Path(shutil.copytree(heads, scratch / "heads", ignore=skip))


def _todo(args, tokenizer, done: set[int]) -> list[tuple[int, int, list[int]]]:
    """(request, document, prompt ids) still to replay: from `--first`, not in `done`, at
    most `--limit` of them."""
    stream = replay_stream(tokenizer, args.requests, args.max_prompt_tokens)
    todo = [(i, d, ids) for i, (d, ids) in enumerate(stream) if i >= args.first and i not in done]
    return todo[: args.limit] if args.limit else todo


def _done(path: Path) -> set[int]:
    if not path.exists():
        return set()
    return {json.loads(line)["request"] for line in path.read_text().splitlines() if line}


def replay(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / f"requests-{args.mode}.jsonl"
    done = _done(log)
    heads = Path(args.heads)
    if args.mode == "learn" and args.draft_vocab and not (heads / "config.json").exists():
        new_heads(args.model, heads, args.learn_heads, args.draft_vocab)
    if args.mode != "learn":  # the starting heads, untouched by this run
        heads = _scratch_copy(heads)
    # A checkpoint every 10 training steps (not 50), and a stop by SIGTERM runs the
    # `finally` below like Ctrl-C: a replay cut short resumes with the heads and optimizer
    # its logged requests trained, not an older checkpoint's.
    config = LearnConfig(
        budget=args.budget,
        lr=args.lr,
        publish_every=NEVER if args.mode == "frozen" else 5,
        checkpoint_every=10,
        replay_share=args.replay,
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    llm = LLM(
        args.model,
        draft=str(heads),
        speculate=args.speculate,
        tree=args.tree,
        quant=args.quant,
        dtype=args.dtype,
        learn=args.mode != "off",
        learn_config=config,
        learn_heads=args.learn_heads,
    )
    todo = _todo(args, llm.tokenizer, done)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    print(f"{args.mode}: {len(done)} done, {len(todo)} to go, heads {heads}", flush=True)
    try:
        with log.open("a") as f:
            for i, doc, ids in todo:
                version = llm.learner.version if llm.learner else 0
                started = time.perf_counter()
                [c] = llm.engine.generate([ids], [params])
                wall = time.perf_counter() - started
                learner = llm.learner.metrics() if llm.learner else {}
                row = {
                    "request": i,
                    "doc": doc,
                    "prompt_tokens": len(ids),
                    "generated": c.num_generated,
                    "steps": c.stats.steps,
                    "accepted": c.stats.accepted,
                    "drafted": c.stats.drafted,
                    "wall_s": round(wall, 4),
                    "ttft_s": round(c.ttft_s, 4),
                    "heads_version": version,
                    "learner_steps": learner.get("steps"),
                    "train_s": learner.get("train_s"),
                    "loss": learner.get("loss"),
                    "error": learner.get("error"),
                }
                f.write(json.dumps(row) + "\n")
                f.flush()
                print(json.dumps(row), flush=True)
    finally:
        if llm.learner is not None:
            llm.learner.close()  # the checkpoint a resumed run starts from
    meta = out / "run.json"
    runs = json.loads(meta.read_text()) if meta.exists() else []
    runs.append(
        {
            "mode": args.mode,
            "args": vars(args),
            "machine": machine(),
            "threads": torch.get_num_threads(),
            "requests": len(todo),
        }
    )
    meta.write_text(json.dumps(runs, indent=1))


def measure_cost(args) -> None:
    """The three engines of `--mode cost` on one loaded target, each request on each of
    them in a rotating order (so none always runs first), logged as wall seconds each."""
    from specdec.drafters import SpeculatorDrafter
    from specdec.engine import Engine
    from specdec.llm import build_acceptor
    from specdec.training.online import OnlineLearner
    from specdec.window import FixedWindow

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "requests-cost.jsonl"
    done = _done(log)
    heads_dir = _scratch_copy(Path(args.heads))
    llm = LLM(args.model, draft=str(heads_dir), quant=args.quant, dtype=args.dtype)
    heads = llm.speculator
    learners = {
        "off": None,
        "record": OnlineLearner(heads, LearnConfig(min_tokens=1 << 62, publish_every=NEVER)),
        "train": OnlineLearner(heads, LearnConfig(budget=args.budget, publish_every=NEVER)),
    }

    def engine(learner):
        def drafter(rows: int, length: int):
            return SpeculatorDrafter(heads, rows, learner=learner)

        window = FixedWindow(args.speculate)
        acceptor = build_acceptor("rejection")
        return Engine(
            llm.model, llm.tokenizer, llm.eos_ids, 1, drafter, acceptor, window,
            **llm.engine_options,
        )  # fmt: skip

    engines = {name: engine(learner) for name, learner in learners.items()}
    todo = _todo(args, llm.tokenizer, done)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    print(f"cost: {len(done)} done, {len(todo)} to go", flush=True)
    if todo:
        engines["off"].generate([todo[0][2]], [params])  # warm the kernels
    with log.open("a") as f:
        for n, (i, doc, ids) in enumerate(todo):
            walls, generated, trained_before = {}, set(), learners["train"].train_s
            for name in COST_ENGINES[n % 3 :] + COST_ENGINES[: n % 3]:
                if learners[name] is not None:
                    learners[name].restart_clock()  # the others' time earns it nothing
                started = time.perf_counter()
                [c] = engines[name].generate([ids], [params])
                walls[name] = round(time.perf_counter() - started, 4)
                generated.add(c.num_generated)
            train = learners["train"]
            row = {"request": i, "doc": doc, "prompt_tokens": len(ids)}
            row |= {"generated": generated.pop(), "same_length": not generated, "wall_s": walls}
            row |= {"train_s": round(train.train_s - trained_before, 4)}  # in this request
            row |= {"learner_steps": train.steps}
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(json.dumps(row), flush=True)


def cost_summary(rows: list[dict]) -> dict:
    """Throughput with a recording and with a training learner, over none, on the same
    requests (ratios of summed wall time), and the share of wall time spent training."""
    wall = {name: sum(r["wall_s"][name] for r in rows) for name in COST_ENGINES}
    return {
        "requests": len(rows),
        "generated": sum(r["generated"] for r in rows),
        "wall_s": {name: round(w, 3) for name, w in wall.items()},
        "throughput_record_over_off": round(wall["off"] / wall["record"], 4),
        "throughput_train_over_off": round(wall["off"] / wall["train"], 4),
        "train_share_of_wall": round(sum(r["train_s"] for r in rows) / wall["train"], 4),
    }


def _rows(out: Path, mode: str) -> list[dict]:
    path = out / f"requests-{mode}.jsonl"
    if not path.exists():
        return []
    rows = {r["request"]: r for r in map(json.loads, path.read_text().splitlines())}
    return [rows[i] for i in sorted(rows)]


def tokens_per_pass(rows: list[dict]) -> float | None:
    """Decode tokens per target pass over `rows` (the prefill's token and pass left out)."""
    steps = sum(r["steps"] for r in rows)
    return round(1 + sum(r["accepted"] for r in rows) / steps, 4) if steps else None


def decode_tok_s(rows: list[dict]) -> float | None:
    """Tokens after the first per second after the first token, over `rows`."""
    seconds = sum(r["wall_s"] - r["ttft_s"] for r in rows)
    return round(sum(r["generated"] - 1 for r in rows) / seconds, 3) if seconds > 0 else None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def report(args) -> None:
    out = Path(args.out)
    summary = {"window": args.window, "modes": {}}
    for mode in MODES:
        rows = _rows(out, mode)
        if not rows:
            continue
        windows = [rows[i : i + args.window] for i in range(0, len(rows), args.window)]
        summary["modes"][mode] = {
            "requests": len(rows),
            "tokens_per_pass": tokens_per_pass(rows),
            "decode_tok_s": decode_tok_s(rows),
            "windows": [
                {
                    "first": w[0]["request"],
                    "last": w[-1]["request"],
                    "tokens_per_pass": tokens_per_pass(w),
                    "decode_tok_s": decode_tok_s(w),
                    "heads_version": w[-1]["heads_version"],
                    "loss": _median([r["loss"] for r in w if r["loss"] is not None]),
                }
                for w in windows
            ],
        }
    both = [_rows(out, m) for m in ("frozen", "off")]
    common = set.intersection(*({r["request"] for r in rows} for rows in both))
    if common:  # what learning costs: the same requests and heads, learner on vs off
        frozen, off = ([r for r in rows if r["request"] in common] for rows in both)
        summary["learning_cost"] = {
            "requests": len(common),
            "frozen_decode_tok_s": decode_tok_s(frozen),
            "off_decode_tok_s": decode_tok_s(off),
            "ratio": round(decode_tok_s(frozen) / decode_tok_s(off), 4),
        }
    cost_rows = _rows(out, "cost")
    if cost_rows:
        summary["learning_cost_in_process"] = cost_summary(cost_rows)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    if summary["modes"]:
        plot(summary, out / "learning.png")


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    for mode, data in summary["modes"].items():
        ends = [w["last"] + 1 for w in data["windows"]]
        ax.plot(ends, [w["tokens_per_pass"] for w in data["windows"]], marker="o", label=mode)
        bx.plot(ends, [w["decode_tok_s"] for w in data["windows"]], marker="o", label=mode)
    ax.set_ylabel(f"tokens per target pass (window of {summary['window']} requests)")
    bx.set_ylabel("decode tokens/s")
    for a in (ax, bx):
        a.set_xlabel("requests replayed")
        a.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--report", action="store_true", help="summarize OUT and plot; no replay")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--heads", help="heads folder (empty or missing: untrained heads)")
    ap.add_argument("--mode", choices=(*MODES, "cost"), default="learn")
    ap.add_argument("--requests", type=int, default=500, help="length of the stream")
    ap.add_argument("--limit", type=int, default=0, help="replay at most this many now")
    ap.add_argument("--first", type=int, default=0, help="start the replay at this request")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-prompt-tokens", type=int, default=384)
    ap.add_argument("--speculate", default="3", help="K or auto")
    ap.add_argument("--tree", default=None)
    ap.add_argument("--quant", default="none")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--budget", type=float, default=0.25)
    ap.add_argument("--lr", type=float, default=None, help="the learner's rate (LearnConfig.lr)")
    ap.add_argument("--learn-heads", type=int, default=3)
    ap.add_argument(
        "--replay",
        type=float,
        default=LearnConfig.replay_share,
        help="share of windows from the heads folder's stage2/ data (LearnConfig.replay_share)",
    )
    ap.add_argument("--window", type=int, default=50)
    ap.add_argument(
        "--draft-vocab", type=int, default=0, help="new heads score this many ids (0: all)"
    )
    args = ap.parse_args(argv)
    if args.report:
        return report(args)
    if not args.heads:
        ap.error("--heads is required to replay")
    args.speculate = args.speculate if args.speculate == "auto" else int(args.speculate)
    if args.mode == "cost":
        if args.speculate == "auto":
            ap.error("--mode cost drafts a fixed window: give --speculate K")
        return measure_cost(args)
    replay(args)


if __name__ == "__main__":
    main()
