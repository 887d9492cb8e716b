"""Logprobs in OpenAI's two response shapes, from the engine's `TokenLogprob` entries.

Chat: `choices[].logprobs = {"content": [{token, logprob, bytes, top_logprobs: [{token,
logprob, bytes}]}], "refusal": None}`. Completions (the legacy shape): `choices[].logprobs
= {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}`. A token's text
is its own bytes (llguidance's table, exact for byte-level BPE), decoded with U+FFFD where
it ends inside a character; `bytes` gives them exactly. A log probability of -inf (a token
top-k, top-p or a grammar ruled out) is sent as -9999.0, as JSON has no infinity.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from specdec.logprobs import TokenLogprob

FLOOR = -9999.0


class LogprobFormatter:
    """Token texts and bytes over one engine's tokenizer (cached per id)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self._bytes: dict[int, bytes] = {}

    def token_bytes(self, token: int) -> bytes:
        if token not in self._bytes:
            raw = self.engine.grammars.tokenizer.decode_bytes([token])
            if not raw:  # a special token: its name
                raw = (self.engine.tokenizer.convert_ids_to_tokens(token) or "").encode()
            self._bytes[token] = raw
        return self._bytes[token]

    def text(self, token: int) -> str:
        return self.token_bytes(token).decode("utf-8", errors="replace")

    def _entry(self, token: int, logprob: float) -> dict:
        return {
            "token": self.text(token),
            "logprob": _finite(logprob),
            "bytes": list(self.token_bytes(token)),
        }

    def chat(self, entries: Sequence[TokenLogprob]) -> dict:
        content = [
            {**self._entry(e.token, e.logprob), "top_logprobs": [self._entry(*t) for t in e.top]}
            for e in entries
        ]
        return {"content": content, "refusal": None}

    def completion(self, entries: Sequence[TokenLogprob], offset: int) -> tuple[dict, int]:
        """The legacy shape for `entries`, their text starting at `offset` characters into
        the choice's text; returns it and the offset after them."""
        tokens, offsets = [], []
        for e in entries:
            tokens.append(self.text(e.token))
            offsets.append(offset)
            offset += len(tokens[-1])
        body = {
            "tokens": tokens,
            "token_logprobs": [_finite(e.logprob) for e in entries],
            "top_logprobs": [{self.text(t): _finite(lp) for t, lp in e.top} for e in entries],
            "text_offset": offsets,
        }
        return body, offset


def _finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else FLOOR
