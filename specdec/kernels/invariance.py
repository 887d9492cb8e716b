"""Whether bf16 passes on the CPU are batch-invariant: a row's result the same whatever
the number of rows that share its pass (the default; `SPECDEC_BF16_INVARIANT=0` turns it off).

Why: greedy speculative decoding emits plain decoding's tokens only if a verify pass of
k + 1 tokens scores each token bitwise as a one-token step does, and a request in a busy
server emits its alone-output only if a batched step scores its row as a step of that row
alone. In bf16 the tuned kernels broke both: each bucket of row counts took the kernel
timed fastest for it (the native kernel for steps, fp32 GEMMs for prefills, oneDNN where it
packs bf16), the native decode stack took small steps and the eager layers (PyTorch's
attention, whose reduction order follows the number of query rows) the others; a near-tie
then flipped a token (greedy bf16 speculation differed from plain on 2 of 3 code prompts,
and 4 of 6 batched streams from the request alone; docs/benchmarks.md, "Milestones").

In this mode every bf16 pass of a model the native decode stack serves runs through the
stack, whatever its rows (decode steps, verify passes, batched steps, prefills), and every
bf16 projection outside it (the vocabulary head) through the native bf16 kernel. Both sum
each (row, output) in one fixed order (native/bf16_kernel.h, native/decode_stack.cpp), so
the tokens are the same whatever else shares the pass. The int4 path is batch-invariant
already (native/q4_kernel.h); fp32 models keep their tuned kernels (greedy equality in fp32
holds in practice and is tested). Where the native kernels do not build (no compiler, no
AVX2) bf16 keeps PyTorch's kernels, which are not batch-invariant.
"""

from __future__ import annotations

import os

ENV = "SPECDEC_BF16_INVARIANT"


def enabled() -> bool:
    """Whether bf16 CPU passes take only the batch-invariant kernels (see the module doc)."""
    return os.environ.get(ENV, "1") != "0"
