"""Peer implementations run in the same process as ours, for side-by-side figures."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

import torch


def hf_greedy(
    model, prompt: Sequence[int], max_tokens: int, eos: Sequence[int] | None = None, assistant=None
) -> list[int]:
    """transformers' greedy `generate` (assisted generation when `assistant` is given):
    the new token ids. With `eos=None` it generates exactly `max_tokens`."""
    return hf_generate(model, [prompt], max_tokens, eos, assistant=assistant)[0]


def hf_generate(
    model,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    eos: Sequence[int] | None = None,
    temperature: float = 0.0,
    assistant=None,
    seed: int = 0,
) -> list[list[int]]:
    """transformers `generate` on a batch (left-padded, as it expects), greedy at
    temperature 0 and plain sampling otherwise: each row's new tokens up to and including
    its first EOS. Assisted generation (`assistant`) only takes one row.

    transformers samples from the global RNG: it is seeded inside `fork_rng`, so the
    caller's random state is left as it was."""
    pad = eos[0] if eos else 0
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts])  # [B, width]
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    sample = temperature > 0
    with torch.random.fork_rng(devices=[]), torch.inference_mode():
        torch.manual_seed(seed)
        out = model.generate(
            ids.to(model.device),
            attention_mask=mask.to(model.device),
            do_sample=sample,
            temperature=temperature if sample else None,
            top_k=0 if sample else None,
            top_p=1.0 if sample else None,
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens if eos is None else None,
            eos_token_id=list(eos) if eos else None,
            pad_token_id=pad,
            assistant_model=assistant,
        )
    rows = []
    stops = set(eos or ())
    for row in out[:, width:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in stops), len(row))
        rows.append(row[:cut])
    return rows


def llamacpp_available() -> bool:
    """llama-cpp-python is an optional extra (it builds llama.cpp from source)."""
    return importlib.util.find_spec("llama_cpp") is not None


# llama-cpp-python 0.3.36 built for the CPU it builds on (pip's default) takes llama.cpp's AMX
# path on a CPU with AMX, and that path crashes the process inside its first decode on the
# Qwen Q4_K_M file (segmentation fault in ggml_backend_amx_mul_mat, on a 2-vCPU Xeon with
# AMX, 2026-11-25). Built without AMX it runs its AVX-512 kernels and works. The rebuild
# takes no dependencies (forcing them would reinstall numpy too), so a second install adds
# the ones missing (diskcache, jinja2) without building again: with the first alone, a
# fresh environment's build did not import.
LLAMACPP_NO_AMX = (
    "CMAKE_ARGS='-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON "
    "-DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON "
    "-DGGML_AVX_VNNI=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF' "
    "pip install --force-reinstall --no-deps --no-cache-dir llama-cpp-python==0.3.36 "
    "&& pip install llama-cpp-python==0.3.36"
)


def llamacpp_amx_problem(system_info: str, cpu_flags: set[str]) -> str | None:
    """Why llama.cpp cannot run here, or None: a build whose AMX path is on, on a CPU that
    has AMX (the crash above takes the whole bench with it, so it is refused up front)."""
    if "amx_int8" in cpu_flags and "AMX_INT8 = 1" in system_info:
        return (
            "this llama-cpp-python build uses llama.cpp's AMX kernels, which crash on this CPU "
            f"(segmentation fault in its first decode); rebuild it without AMX: {LLAMACPP_NO_AMX}"
        )
    return None


def llamacpp_model(gguf: Path, context: int):
    """llama.cpp's model on the GGUF file the registry model was converted from, loaded
    once per run of the bench (outside the timed runs, as our models are).

    A package that is installed but cannot be imported is a RuntimeError the bench
    reports as the point's reason: built with `pip install --no-deps`, llama-cpp-python
    0.3.36 lacks `diskcache` and `jinja2`, and that import error took the whole bench
    with it (Zen 3)."""
    try:
        import llama_cpp
    except ImportError as err:
        raise RuntimeError(
            f"llama-cpp-python is installed but does not import ({err}); install its "
            "dependencies: pip install llama-cpp-python==0.3.36 (without --no-deps)"
        ) from err

    from specdec.kernels.cpu import cpu_info

    info = llama_cpp.llama_print_system_info().decode(errors="replace")
    problem = llamacpp_amx_problem(info, set(cpu_info()[1].split()))
    if problem:
        raise RuntimeError(problem)
    return llama_cpp.Llama(
        model_path=str(gguf), n_ctx=context, n_threads=torch.get_num_threads(), verbose=False
    )


def llamacpp_generate(
    llm, prompts: Sequence[Sequence[int]], max_tokens: int, temperature: float, first: int = 0
) -> list[list[int]]:
    """Each prompt's new token ids from a `llamacpp_model`, one prompt at a time (its
    high-level API decodes a single sequence), prompt i seeded with `first` + i. A run's
    first prompt (`first` = 0) resets its state, so a run starts cold as ours does (a
    fresh engine, empty prefix stores); within the run it reuses the previous prompt's
    prefix, as our prefix cache does."""
    if first == 0:
        llm.reset()
    rows = []
    for i, prompt in enumerate(prompts):
        llm.set_seed(first + i)
        tokens = []
        # Untruncated sampling at temperature 1 (its defaults are top-k 40, top-p 0.95).
        stream = llm.generate(list(prompt), temp=temperature, top_k=0, top_p=1.0, reset=True)
        for token in stream:
            tokens.append(token)
            if token == llm.token_eos() or len(tokens) >= max_tokens:
                break
        rows.append(tokens)
    return rows
