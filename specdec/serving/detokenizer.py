"""Incremental detokenization for streaming: text deltas that never split a character and
never show text a stop string will later cut.

A byte-level BPE token can end in the middle of a UTF-8 character; decoding then yields
U+FFFD until the next token completes it. A stop string can also arrive over several
tokens. So each delta holds back (a) a trailing replacement character and (b) the longest
tail of the text that could still grow into a stop string. Concatenated deltas equal the
final text exactly: the same `decode` of all tokens, cut before the first stop string.
"""

from __future__ import annotations

from specdec.tokenization import StopChecker


class IncrementalDetokenizer:
    def __init__(self, tokenizer, stop: tuple[str, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self._cutter = StopChecker(tokenizer, stop)
        self.sent = ""  # text already handed out

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def delta(self, token_ids: list[int]) -> str:
        """New text safe to send, given all tokens generated so far."""
        text = self._cutter.cut(self._decode(token_ids))
        end = len(text)
        while end > len(self.sent) and text[end - 1] == "\ufffd":
            end -= 1
        end -= self._stop_prefix_tail(text[:end])
        return self._advance(text, end)

    def finish(self, token_ids: list[int]) -> str:
        """The rest of the text once the sequence is finished (stop strings cut)."""
        text = self._cutter.cut(self._decode(token_ids))
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
