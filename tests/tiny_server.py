"""A real `specdec serve` process on 127.0.0.1 over tiny fp32 models (tests only).

The target has a 4096-token context (long streams for the disconnect test) and a chat
template; the draft is a different random model, so drafts are sometimes rejected.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import torch

from tiny import hf_tiny, tiny_tokenizer

CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
MODEL = "tiny"  # --served-model-name


def save_tiny(path: Path, seed: int, noise: float = 0.0, **overrides) -> Path:
    """The tiny qwen2 of `seed` with its tokenizer; `noise` > 0 adds noise * std(weight) *
    N(0, 1) to every weight (a draft that agrees with the model of `seed` on some tokens)."""
    model = hf_tiny("qwen2", seed=seed, max_position_embeddings=4096, **overrides)
    if noise:
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * noise * p.std())
    model.save_pretrained(path)
    tok = tiny_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(path)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SERVE = [sys.executable, "-m", "specdec.cli", "serve"]
TORCHRUN_SERVE = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]


class Server:
    def __init__(self, *args: str, launcher: list[str] = SERVE) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        cmd = [*launcher, "--port", str(self.port), *args]
        self.log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"serve-{self.port}.log", "w+")
        self.proc = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.3)
        output = self.output()
        self.stop()
        raise RuntimeError(f"server did not come up: {output}")

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-4000:]

    def metric(self, name: str) -> float:
        for line in httpx.get(self.url + "/metrics").text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def stop(self) -> None:
        """Stop the server and anything it started (torchrun's ranks): its process group."""
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()


def serve_args(model_dirs, *extra: str) -> list[str]:
    target, draft = model_dirs
    return [
        "--model",
        str(target),
        "--served-model-name",
        MODEL,
        "--dtype",
        "fp32",
        "--draft",
        str(draft),
        "--draft-quant",
        "none",
        "--speculate",
        "3",
        "--max-batch-size",
        "8",
        *extra,
    ]
