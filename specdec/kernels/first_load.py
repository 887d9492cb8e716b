"""A load's machine-specific work, shown as it goes: native builds, then kernel tuning.

On a fresh machine a load first builds the native kernels (~80 s on two cores), then
settles each kernel choice: from this machine's measurements where it has
them, else from the plan predicted for its CPU (`kernel_plans`), measuring the uncertain
choices while the tuning budget lasts (`tuning_budget`), shown as a tqdm bar on stderr
(`tuning_budget.progress_enabled`): what is being timed, how many steps are left, an ETA.
"""

from __future__ import annotations

from specdec.kernels import decode_stack, native, tuning, tuning_budget
from specdec.kernels.quantize import with_decode_stack


def build_native() -> None:
    """Build (or load the earlier build of) the native kernels: one module, which says when
    it compiles (`make demo` builds it while it pulls the models)."""
    native.q4_gemv()


def prepare_cpu() -> None:
    """Before a CPU model loads: the native builds, and the bf16 panel layout weights
    are packed in (this machine's measured one, else the predicted one)."""
    build_native()
    tuning.use_stored_bf16_panels()


def tune_model(model, label: str) -> None:
    """`llm._tuned`'s steps for a whole `Transformer` (`label`: "the target", ...)."""
    tuning_budget.plan_steps(tuning.pending_steps(model), label)
    try:
        tuning.tune_prefetch(model)  # how the tiles stream, before plans are timed
        repacked = tuning.tune_bf16_panels(model)
        layouts = tuning.tune_layout(model).values()
        if any(not entry["tiles"] for entry in layouts) or repacked:
            with_decode_stack(model)  # built with tiles some groups dropped, or other panels
        tuning.tune_kernels(model)
        # The stack as built now (its key names the layouts just settled): announced here,
        # not up front, where a stack about to be rebuilt read as untimed at every load.
        tuning_budget.plan_steps(decode_stack.pending(model), label)
        decode_stack.tune_stack(model)  # where the native stack beats the eager layers
        tuning.time_certain_groups(model)  # for the cost model, budget permitting
    finally:
        tuning_budget.close()


def tune_layers(module, label: str) -> None:
    """`tune_model` for what is not a whole Transformer (no decode stack)."""
    tuning_budget.plan_steps(tuning.pending_steps(module), label)
    try:
        tuning.tune_prefetch(module)
        tuning.tune_bf16_panels(module)
        tuning.tune_layout(module)
        tuning.tune_kernels(module)
        tuning.time_certain_groups(module)
    finally:
        tuning_budget.close()
