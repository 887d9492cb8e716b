"""Check an EAGLE-3 head in vLLM itself: vLLM's CPU build (its own virtual environment, as
the bench's vLLM peer runs it) loads the head with `speculative_config={"method": "eagle3",
"model": HEAD, "num_speculative_tokens": K}`, its greedy output must equal its plain
output, and its mean acceptance length (1 + accepted / drafts, from `llm.get_metrics()`)
is printed beside ours with the same head on the same prompts (greedy, a chain of K).

    flock /tmp/specdec-real.lock python scripts/check_eagle3_vllm.py \\
        --target ~/.cache/specdec/models/qwen2.5-coder-0.5b-instruct/bf16 \\
        --head HEAD_DIR --vllm-python VLLM_ENV/bin/python --out results.json

vLLM's side runs this same file under vLLM's interpreter (`--vllm-side SETUP.json`): it
imports vLLM and the standard library only. Exit status 1 when vLLM's speculative output
differs from its plain output.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHARE = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens")


def vllm_side(setup_file: str) -> None:
    """Under vLLM's interpreter: one LLM (plain, or with the head), greedy outputs of the
    prompts and the speculation counters, written as JSON to `setup["result"]`."""
    setup = json.loads(Path(setup_file).read_text())
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    options = {}
    if setup.get("head"):
        options["speculative_config"] = {
            "method": "eagle3",
            "model": setup["head"],
            "num_speculative_tokens": setup["k"],
        }
    started = time.perf_counter()
    llm = LLM(
        model=setup["target"],
        dtype=setup["dtype"],
        max_model_len=setup["max_model_len"],
        seed=0,
        disable_log_stats=False,  # else `get_metrics` has no speculation counters
        enforce_eager=True,  # no compiling (minutes on a 2-vCPU host); the same arithmetic
        **options,
    )
    loaded = time.perf_counter() - started
    params = SamplingParams(temperature=0, max_tokens=setup["max_tokens"], ignore_eos=True)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in setup["prompts"]]
    started = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - started
    counters, per_pos = {}, None
    for metric in llm.get_metrics():
        if metric.name in SHARE:
            counters[metric.name] = getattr(metric, "value", None)
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            per_pos = list(getattr(metric, "values", []) or [])
    result = {
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "load_s": round(loaded, 1),
        "generate_s": round(seconds, 2),
        "counters": counters,
        "accepted_per_pos": per_pos,
    }
    Path(setup["result"]).write_text(json.dumps(result))


def run_vllm(python: str, setup: dict, threads: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="specdec-eagle3-vllm-") as tmp:
        setup = {**setup, "result": str(Path(tmp) / "result.json")}
        (Path(tmp) / "setup.json").write_text(json.dumps(setup))
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{threads - 1}")
        env.pop("PYTHONPATH", None)  # vLLM's own environment, not ours
        argv = [python, __file__, "--vllm-side", str(Path(tmp) / "setup.json")]
        done = subprocess.run(argv, env=env, stdout=sys.stderr, stderr=sys.stderr)
        if done.returncode != 0:
            raise SystemExit(f"vLLM's side failed (exit {done.returncode}); its log is above")
        return json.loads(Path(setup["result"]).read_text())


def ours(target_dir: str, head_dir: str, prompts: list[list[int]], k: int, max_tokens: int):
    """Our greedy outputs plain and with the head (fp32 target, a fixed chain of k), and our
    mean acceptance length (tokens per target pass), through the public API."""
    from specdec import LLM, SamplingParams

    # the head dense, as vLLM runs it (on a CPU `LLM` would draft with its 4-bit form)
    llm = LLM(target_dir, dtype="fp32", draft=head_dir, speculate=k, draft_quant="none")
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    plain = llm.plain_engine().generate(prompts, params)
    spec = llm.engine.generate(prompts, params)
    stats = spec[0].stats
    for c in spec[1:]:
        stats = stats + c.stats
    return (
        [c.token_ids for c in plain],
        [c.token_ids for c in spec],
        round(stats.mean_accepted_length, 4),
        [round(a, 4) for a in stats.acceptance_per_position],
    )


def make_lens_head(
    target_dir: str, out: str, draft_vocab: int, aux_layers: tuple[int, ...] | None = None
) -> None:
    """A check head that needs no training: `fc` passes the last auxiliary state through
    (by default the input of layer L-3; `aux_layers` names others, written to the config as
    `eagle_aux_hidden_state_layer_ids`), the layer's own blocks are small random ones, and
    its norm and head are the target's (over the `draft_vocab` lowest ids): a "logit lens"
    a few layers early, which agrees with the target often enough for acceptance lengths to
    say something on some targets, and exercises every tensor."""
    import torch

    from specdec.heads.eagle3 import build_eagle3
    from specdec.models.loading import load_transformer

    target = load_transformer(Path(target_dir), "fp32", torch.device("cpu"))
    V, H = target.config.vocab_size, target.config.hidden_size
    vocab = torch.arange(min(draft_vocab, V)) if draft_vocab else None
    torch.manual_seed(0)
    head = build_eagle3(target, vocab, n_predict=3, aux_layer_ids=aux_layers)
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, 2 * H :] = torch.eye(H)
    head.save(out, torch.float32)
    print(f"wrote a lens head for {target_dir} to {out}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-side", help=argparse.SUPPRESS)
    parser.add_argument("--target", help="the target's HF directory")
    parser.add_argument("--head", help="the EAGLE-3 head's directory (vLLM's layout)")
    parser.add_argument("--vllm-python", help="vLLM's interpreter (vllm-cpu 0.32.0)")
    parser.add_argument("--prompts", type=int, default=8, help="held-out-style chat prompts")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", help="write the figures here (JSON)")
    parser.add_argument(
        "--make-lens-head",
        metavar="DIR",
        help="first write an untrained check head for --target to DIR and use it as --head",
    )
    parser.add_argument("--draft-vocab", type=int, default=32000, help="the lens head's ids")
    parser.add_argument(
        "--lens-layers",
        metavar="A,B,C",
        help="the lens head's auxiliary layers (default 2,L//2,L-3); it reads the last",
    )
    args = parser.parse_args()
    if args.vllm_side:
        vllm_side(args.vllm_side)
        return
    if args.make_lens_head:
        layers = None
        if args.lens_layers:
            try:
                layers = tuple(int(i) for i in args.lens_layers.split(","))
            except ValueError:
                parser.error(f"--lens-layers {args.lens_layers!r}: three integers, A,B,C")
        make_lens_head(args.target, args.make_lens_head, args.draft_vocab, layers)
        args.head = args.make_lens_head
    from specdec.data import sharegpt_prompts
    from specdec.tokenization import load_tokenizer

    tokenizer = load_tokenizer(Path(args.target))
    texts = sharegpt_prompts(args.prompts, seed=0)
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True
        )
        for t in texts
    ]
    prompts = [list(p["input_ids"]) if hasattr(p, "keys") else list(p) for p in prompts]
    setup = {
        "target": str(Path(args.target).expanduser()),
        "dtype": "float32",
        "max_model_len": 2048,
        "max_tokens": args.max_tokens,
        "prompts": prompts,
        "k": args.k,
    }
    plain = run_vllm(args.vllm_python, setup, args.threads)
    head = str(Path(args.head).expanduser())
    spec = run_vllm(args.vllm_python, {**setup, "head": head}, args.threads)
    drafts = spec["counters"].get(SHARE[0]) or 0
    accepted = spec["counters"].get(SHARE[1]) or 0
    vllm_length = 1 + accepted / drafts if drafts else None
    our_plain, our_spec, our_length, our_per_pos = ours(
        args.target, head, prompts, args.k, args.max_tokens
    )
    result = {
        "target": args.target,
        "head": head,
        "prompts": len(prompts),
        "max_tokens": args.max_tokens,
        "k": args.k,
        "vllm_greedy_equal_plain": spec["tokens"] == plain["tokens"],
        "vllm_mean_acceptance_length": None if vllm_length is None else round(vllm_length, 4),
        "vllm_accepted_per_pos": spec["accepted_per_pos"],
        "vllm_drafts": drafts,
        "vllm_plain_s": plain["generate_s"],
        "vllm_eagle3_s": spec["generate_s"],
        "ours_greedy_equal_plain": our_spec == our_plain,
        "ours_mean_acceptance_length": our_length,
        "ours_acceptance_per_position": our_per_pos,
        "same_plain_output_as_vllm": our_plain == plain["tokens"],
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    sys.exit(0 if result["vllm_greedy_equal_plain"] else 1)


if __name__ == "__main__":
    main()
