"""An in-process server whose drafter follows a script, and whose acceptor records every
decision: the provenance stream (and the page that colours it) can then be checked
against what the engine really decided, token for token (tests only).

The drafter is the target drafting for itself (fp32, greedy: every draft token is the
target's argmax, so all would be kept) with one token spoiled per step where the script
says: a request's step s keeps exactly SCRIPT[s % len(SCRIPT)] draft tokens (all k when
that is >= k).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import replace

import uvicorn

from specdec.acceptors import GreedyAcceptor
from specdec.drafters import DraftModelDrafter
from specdec.engine import Engine
from specdec.serving.app import build_app
from specdec.window import FixedWindow

from tiny import hf_tiny, native_from_hf, tiny_tokenizer
from tiny_server import CHAT_TEMPLATE, MODEL, free_port

SCRIPT = (2, 0, 3, 1, 3, 0)  # draft tokens kept at steps 0, 1, 2, ... (cycling)
K = 3


class ScriptedDrafter(DraftModelDrafter):
    def __init__(self, *args, script=SCRIPT, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.script, self.steps = script, 0

    def admit(self, histories) -> None:
        super().admit(histories)
        self.steps = 0  # the script restarts with each request (tests send one at a time)

    def propose(self, k, params, generators):
        draft = super().propose(k, params, generators)  # tokens [B, k]
        keep = self.script[self.steps % len(self.script)]
        self.steps += k > 0
        if keep < k:  # spoil position `keep` of every row: the target rejects it there
            tokens = draft.tokens.clone()
            tokens[:, keep] = (tokens[:, keep] + 1) % self.usable_vocab
            draft = replace(draft, tokens=tokens)
        return draft


class RecordingAcceptor(GreedyAcceptor):
    """Greedy acceptance that logs (drafted, accepted) per row of every call: the
    prefill's call (nothing drafted) comes first, then one per decode step."""

    def __init__(self) -> None:
        self.log: list[list[tuple[int, int]]] = []

    def __call__(self, draft, target_probs, generators):
        verdict = super().__call__(draft, target_probs, generators)
        pairs = zip(draft.lengths.tolist(), verdict.num_accepted.tolist(), strict=True)
        self.log.append(list(pairs))
        return verdict


def scripted_engine(k: int = K, drafter: bool = True) -> tuple[Engine, RecordingAcceptor]:
    tok = tiny_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    target = native_from_hf(hf_tiny("qwen2", max_position_embeddings=1024))
    acceptor = RecordingAcceptor()
    factory = None
    if drafter:
        factory = lambda b, length: ScriptedDrafter(target, 97, 97, b, length)  # noqa: E731
    engine = Engine(
        target,
        tok,
        frozenset({tok.eos_token_id}),
        max_batch=4,
        drafter_factory=factory,
        acceptor=acceptor,
        window=FixedWindow(k if drafter else 0),
        max_len=512,
    )
    return engine, acceptor


@contextmanager
def serving(engine: Engine, api_key: str | None = None):
    """`build_app` over `engine` on a free port, in a uvicorn thread; yields the base URL."""
    app = build_app(engine, MODEL, api_key=api_key)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the in-process server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def decisions(acceptor: RecordingAcceptor) -> list[tuple[int, int]]:
    """(drafted, accepted) of each decode step of a single-request run."""
    return [row[0] for row in acceptor.log[1:]]
