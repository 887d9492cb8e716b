"""vLLM as a benchmark peer, run by vLLM's own interpreter (`specdec bench --vllm-python`).

vLLM pins its own torch and transformers, so it lives in a virtual environment of its own
and this file runs there as a script: it imports vLLM and the standard library, never
specdec. `specdec.bench.vllm_peer` starts it, and they talk in JSON lines:

    argv:   one JSON object: {"model": DIR, "draft": DIR or null, "k": int,
                              "dtype": "bfloat16" or "float32", "max_model_len": int,
                              "max_num_batched_tokens": int, "seed": int}
    stdout: {"ready": true} once the model is loaded; then one reply per request line
    stdin:  {"prompts": [[ids]], "max_tokens": n, "temperature": t, "stop_ids": [ids],
             "ignore_eos": bool, "batch": b}
            -> {"tokens": [[new ids]]}  (prompts go b at a time; the bench times the call)

Anything vLLM prints, its engine processes included, goes to stderr: the protocol keeps a
duplicate of the original stdout and file descriptor 1 is pointed at stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time


def main() -> None:
    setup = json.loads(sys.argv[1])
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # children inherit descriptor 1: vLLM's engine core prints too
    sys.stdout = sys.stderr
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    options = {}
    if setup.get("draft"):
        options["speculative_config"] = {
            "method": "draft_model",
            "model": setup["draft"],
            "num_speculative_tokens": setup["k"],
        }
    _exit_with_parent()
    llm = LLM(
        model=setup["model"],
        dtype=setup.get("dtype", "bfloat16"),
        max_model_len=setup["max_model_len"],
        # Prefill in chunks of this many tokens: also the size of vLLM's warm-up pass, which
        # at its default (thousands of tokens) takes minutes on a CPU without bf16 matmuls.
        max_num_batched_tokens=setup.get("max_num_batched_tokens", 512),
        seed=setup.get("seed", 0),
        **options,
    )
    _reply(protocol, {"ready": True})
    for line in sys.stdin:
        if not line.strip():
            continue
        ask = json.loads(line)
        params = SamplingParams(
            temperature=ask["temperature"],
            max_tokens=ask["max_tokens"],
            min_tokens=ask["max_tokens"] if ask["ignore_eos"] else 0,
            ignore_eos=ask["ignore_eos"],
            stop_token_ids=ask["stop_ids"],
            seed=setup.get("seed", 0),
        )
        prompts = [TokensPrompt(prompt_token_ids=ids) for ids in ask["prompts"]]
        b = max(1, ask.get("batch", len(prompts)))
        tokens = []
        for i in range(0, len(prompts), b):
            outs = llm.generate(prompts[i : i + b], params, use_tqdm=False)
            tokens += [list(o.outputs[0].token_ids) for o in outs]
        _reply(protocol, {"tokens": tokens})


def _exit_with_parent() -> None:
    """If the bench dies, end this process group (vLLM's engine processes too) rather than
    leave a model spinning on the cores of whatever is measured next."""
    import signal
    import threading

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1)
        if os.getpgid(0) == os.getpid():  # the group is ours alone (the bench made it so)
            os.killpg(0, signal.SIGKILL)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _reply(stream, message: dict) -> None:
    stream.write(json.dumps(message) + "\n")
    stream.flush()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
        main()
