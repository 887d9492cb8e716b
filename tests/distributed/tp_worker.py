"""One rank of the tensor-parallel tests (started by torchrun or by test_tp.py itself).

    python tp_worker.py equivalence OUT MODEL_DIR   # all checks; rank 0 saves results to OUT
    python tp_worker.py raise|exit|hang OUT         # rank 1 fails mid-generation

`scenarios(None)` computes the same results in one process: the tests compare the two.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ (tiny.py)

from specdec.acceptors import GreedyAcceptor, RejectionSampler  # noqa: E402
from specdec.distributed import (  # noqa: E402
    build_sharded_transformer,
    shared_seeds,
    shared_window,
    tensor_parallel,
)
from specdec.drafters import DraftModelDrafter, NgramDrafter  # noqa: E402
from specdec.engine import Engine  # noqa: E402
from specdec.models.config import ModelConfig  # noqa: E402
from specdec.models.transformer import right_pad  # noqa: E402
from specdec.params import SamplingParams  # noqa: E402
from specdec.window import AdaptiveWindow, FixedWindow  # noqa: E402

from tiny import hf_tiny, native_from_hf, tiny_tokenizer  # noqa: E402

PROMPTS = [[5, 17, 42, 8], [60, 3, 3, 3, 3, 9, 12, 80, 81, 2, 44], [33], [7, 7, 8, 7, 7, 8, 7]]
N = 16
# Model variants: vocab 97 does not split in two (padded head); biases on every projection
# (row-parallel biases added once); a tied head (sliced from the embedding).
VARIANTS = {
    "qwen2": ("qwen2", {}),
    "llama-biases-tied": (
        "llama",
        dict(attention_bias=True, mlp_bias=True, tie_word_embeddings=True),
    ),
}


def build(kind: str, tp, seed: int = 0, **overrides):
    """The same random model on every rank: whole (tp None) or this rank's shard."""
    hf = hf_tiny(kind, seed=seed, **overrides)
    if tp is None:
        return native_from_hf(hf)
    cfg = ModelConfig.from_hf_dict(hf.config.to_dict())
    return build_sharded_transformer(cfg, hf.state_dict(), torch.float32, tp)


def logits_of(model) -> dict[str, torch.Tensor]:
    """A ragged prefill and a two-token step on top of it."""
    cache = model.new_cache(len(PROMPTS), 64)
    tokens, lengths = right_pad(PROMPTS)
    prefill = model(tokens, cache, num_new=lengths).logits
    step = model(torch.tensor([[1, 2]] * len(PROMPTS)), cache).logits
    return {"prefill": prefill, "step": step}


def mixed_layout_sum(tp) -> torch.Tensor:
    """Each rank's part of a sum, rank 0's as a transposed view (the layout `mv_mm`
    returns): ranks may tune different kernels, so a row-parallel layer's partial outputs
    reach the all-reduce in different layouts and must still add up row by row."""
    parts = [torch.arange(12.0).reshape(3, 4), torch.arange(12.0).reshape(3, 4) * 10]
    if tp is None:
        return parts[0] + parts[1]
    mine = parts[0].t().contiguous().t() if tp.rank == 0 else parts[1]  # [3, 4] each
    return tp.all_reduce(mine)


def scenarios(tp, model_dir: str | None = None) -> dict:
    tok = tiny_tokenizer()
    out: dict = {"all_reduce/mixed-layouts": mixed_layout_sum(tp)}
    for name, (kind, overrides) in VARIANTS.items():
        out[f"logits/{name}"] = logits_of(build(kind, tp, **overrides))
    target = build("qwen2", tp)
    draft = build("qwen2", None, seed=1, num_hidden_layers=1)  # replicated (draft_tp = 1)
    draft_sharded = build("qwen2", tp, seed=1, num_hidden_layers=1)  # draft_tp = tp

    def run(factory=None, k=0, params=None, window=None, acceptor=None):
        window = shared_window(window or FixedWindow(k), tp)
        engine = Engine(target, tok, frozenset(), 8, factory, acceptor, window)
        params = shared_seeds(params, len(PROMPTS), tp)
        return [c.token_ids for c in engine.generate(PROMPTS, params)]

    greedy = SamplingParams(temperature=0, max_tokens=N)
    sampled = SamplingParams(temperature=0.9, top_p=0.95, seed=42, max_tokens=N)
    model_drafter = lambda b, n: DraftModelDrafter(draft, 97, 97, b, n)  # noqa: E731
    sharded_drafter = lambda b, n: DraftModelDrafter(draft_sharded, 97, 97, b, n)  # noqa: E731
    out["greedy/plain"] = run(params=greedy)
    out["greedy/draft"] = run(model_drafter, 3, greedy, acceptor=GreedyAcceptor())
    out["greedy/draft-sharded"] = run(sharded_drafter, 3, greedy)
    out["greedy/ngram"] = run(lambda b, n: NgramDrafter(), 4, greedy)
    out["greedy/auto"] = run(model_drafter, params=greedy, window=AdaptiveWindow(k_max=4))
    out["sampled/plain"] = run(params=sampled)
    out["sampled/draft"] = run(model_drafter, 3, sampled, acceptor=RejectionSampler())
    out["sampled/draft-sharded"] = run(sharded_drafter, 4, sampled)
    # No seed: rank 0 draws one for every rank (compared across ranks, not with 1 process).
    out["unseeded"] = run(model_drafter, 2, SamplingParams(temperature=1.0, max_tokens=N))
    out["speculator/scripted-tree"] = scripted_tree(target, build("qwen2", None), tp)
    if model_dir is not None:
        out["cli"] = cli_lines(model_dir, tp)
        out |= speculator_runs(model_dir, tp)
    return out


# -- speculator heads ------------------------------------------------------------------------

SPECULATORS = {  # saved by `save_speculators` under MODEL_DIR/speculators/NAME
    "target-tables": {},  # the target's embedding and (gathered) vocabulary head
    "own-tables": dict(reuse_target=False, inner_dim=32),
}
SPEC_TREE = "3,2,2"


def save_speculators(model_dir: str) -> None:
    """Random (perturbed: adapters start at zero) speculators for the model in `model_dir`."""
    from specdec.heads import build_speculator
    from specdec.models.loading import load_transformer

    target = load_transformer(model_dir, "fp32")
    for name, options in SPECULATORS.items():
        spec = build_speculator(target, n_predict=3, **options)
        torch.manual_seed(1)
        with torch.no_grad():
            for p in spec.parameters():
                p.add_(torch.randn_like(p) * 0.3)
        spec.save(Path(model_dir) / "speculators" / name)


def speculator_runs(model_dir: str, tp) -> dict:
    """Saved speculator heads through `LLM(..., tp=N)`, chains and trees, greedy: the
    completions, their step counts and every proposal the heads made (the heads must see
    the same states and tables as in one process to propose the same tokens)."""
    from specdec.llm import LLM

    out = {}
    for name in SPECULATORS:
        for tree in (None, SPEC_TREE):
            llm = LLM(
                model_dir,
                draft=str(Path(model_dir) / "speculators" / name),
                dtype="fp32",
                speculate=3,
                acceptor="greedy" if tree else "rejection",
                tree=tree,
                tp=1 if tp is None else tp.world_size,
            )
            method = "propose_tree" if tree else "propose_greedy"
            proposals = []
            propose = getattr(llm.speculator, method)

            def recording(*args, propose=propose, proposals=proposals, tree=tree):
                result = propose(*args)
                proposals.append(result[0] if tree else result)  # paths [B, P, n] / [B, n]
                return result

            setattr(llm.speculator, method, recording)
            greedy = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)
            done = llm.engine.generate(PROMPTS, greedy)
            out[f"speculator/{name}/{'tree' if tree else 'chain'}"] = {
                "tokens": [c.token_ids for c in done],
                "steps": [c.stats.steps for c in done],
                "accepted": [c.stats.accepted for c in done],
                "proposals": proposals,
            }
    return out


def scripted_tree(target, whole, tp) -> dict:
    """Scripted tree heads (tests/equivalence/test_speculator_tree.py) over the sharded
    target: they locate the state `observe` gave them among the one-process model's
    states (so it must be the whole hidden state, on every rank) and put the true
    continuation second at every level, so the accepted path is never the first nodes
    and the KV compaction is exercised at every step."""
    from equivalence.test_speculator_tree import HEADS, TREE, ScriptedTreeSpeculator

    from specdec.drafters import SpeculatorDrafter

    greedy = SamplingParams(temperature=0, max_tokens=N)
    plain = Engine(whole, tiny_tokenizer(), frozenset()).generate(PROMPTS, greedy)
    refs = [c.token_ids for c in plain]
    spec = ScriptedTreeSpeculator(whole, PROMPTS, refs, lambda i: True)
    engine = Engine(
        target,
        tiny_tokenizer(),
        frozenset(),
        8,
        lambda b, n: SpeculatorDrafter(spec, b, tree=TREE),
        GreedyAcceptor(),
        shared_window(FixedWindow(5), tp),
        max_tree_nodes=math.prod(TREE) * HEADS,
    )
    done = engine.generate(PROMPTS, greedy)
    return {
        "tokens": [c.token_ids for c in done],
        "refs": refs,
        "steps": [c.stats.steps for c in done],
        "calls": spec.calls,
    }


def cli_lines(model_dir: str, tp) -> list[dict]:
    """`specdec generate --json` through the LLM API (with --tp 2 under TP)."""
    from specdec.cli import main

    argv = ["generate", "--model", model_dir, "--dtype", "fp32", "--json", "--max-tokens", "8"]
    argv += ["--ignore-eos", "--draft", "ngram", "--speculate", "2", "--temperature", "0.8"]
    argv += ["--seed", "5", "abcabc", "hello"]
    if tp is not None:
        argv += ["--tp", str(tp.world_size)]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(argv) == 0
    rows = [json.loads(line) for line in buf.getvalue().splitlines()]
    return [{k: r[k] for k in ("prompt", "text", "token_ids")} for r in rows]


def failing(mode: str, out_path: str) -> int:
    """Rank 1 fails in its third target forward; rank 0 records what it sees, and how long
    after its own third forward began (start-up on a loaded machine is not the report's)."""
    started = time.monotonic()
    try:
        with tensor_parallel(2, timeout_s=float(os.environ.get("TEST_TP_TIMEOUT", "120"))) as tp:
            target = build("qwen2", tp)
            calls = [0]

            def hook(module, args):
                nonlocal started
                calls[0] += 1
                if calls[0] != 3:
                    return
                started = time.monotonic()
                if tp.rank == 1:
                    if mode == "raise":
                        raise ValueError("injected failure on rank 1")
                    if mode == "exit":
                        os._exit(3)
                    time.sleep(120)  # hang

            target.layers[1].register_forward_pre_hook(hook)
            engine = Engine(target, tiny_tokenizer(), frozenset())
            engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=N))
    except Exception as err:
        if int(os.environ["RANK"]) == 0:
            Path(out_path).write_text(
                json.dumps(
                    {
                        "type": type(err).__name__,
                        "message": str(err),
                        "seconds": time.monotonic() - started,
                    }
                )
            )
        print(f"rank {os.environ['RANK']}: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    return 0


def main() -> int:
    torch.set_num_threads(1)
    mode, out_path = sys.argv[1], sys.argv[2]
    if mode != "equivalence":
        return failing(mode, out_path)
    with tensor_parallel(2) as tp:
        results = scenarios(tp, sys.argv[3])
        # Every rank must have computed the same thing (rank 1's results travel to rank 0).
        gathered = [None, None]
        torch.distributed.all_gather_object(gathered, results)
        if tp.is_leader:
            results["cli_rank1"] = gathered[1].pop("cli")  # rank 1 prints nothing
            gathered[0].pop("cli")
            results["ranks_agree"] = _same(gathered[0], gathered[1])
            torch.save(results, out_path)
    return 0


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


if __name__ == "__main__":
    sys.exit(main())
