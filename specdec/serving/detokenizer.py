"""Incremental detokenization for streaming: text deltas that never split a character and
never show text a stop string will later cut.

`tokenizers`' `DecodeStream` turns the tokens into text as they come: it holds back a
token that ends inside a UTF-8 character (a byte-level BPE's, a byte-fallback's) until
the next completes it, and applies the tokenizer's own decoder to each step. On top of it
each delta holds back the longest tail of the text that could still grow into a stop
string. `finish` ends with the same `decode` of all tokens that the completion's text is
(cut before the first stop string), so concatenated deltas equal it exactly.
"""

from __future__ import annotations

from tokenizers.decoders import DecodeStream

from specdec.tokenization import StopChecker


class IncrementalDetokenizer:
    def __init__(self, tokenizer, stop: tuple[str, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self._cutter = StopChecker(tokenizer, stop)
        self._backend = tokenizer.backend_tokenizer  # the `tokenizers.Tokenizer`
        self._stream = DecodeStream(skip_special_tokens=True)
        self._fed = 0  # tokens given to the stream
        self._text = ""  # what the stream has decoded
        self.sent = ""  # text already handed out

    def delta(self, token_ids: list[int]) -> str:
        """New text safe to send, given all tokens generated so far."""
        new = token_ids[self._fed :]
        if new:
            self._text += self._stream.step(self._backend, new) or ""
            self._fed = len(token_ids)
        text = self._cutter.cut(self._text)
        return self._advance(text, len(text) - self._stop_prefix_tail(text))

    def finish(self, token_ids: list[int]) -> str:
        """The rest of the text once the sequence is finished (stop strings cut)."""
        text = self._cutter.cut(self.tokenizer.decode(token_ids, skip_special_tokens=True))
        return self._advance(text, len(text))

    def _advance(self, text: str, end: int) -> str:
        # If an earlier character changed (a tokenizer clean-up rule), what was sent stays
        # sent: carry on after it.
        out = text[len(self.sent) : end] if end > len(self.sent) else ""
        self.sent += out
        return out

    def _stop_prefix_tail(self, text: str) -> int:
        """Length of the longest end of `text` that is a proper prefix of a stop string."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best
