"""Per-token provenance for the stream: which streamed characters each token produced, and
whether that token was an accepted draft token or the target's own.

Opt-in (`stream_options.include_speculation`): each chunk's choice then carries
`speculation.tokens`, one record per token whose text the chunk completes:

    {"index": 7, "text": "def", "source": "draft", "kind": "accepted", "step": 3,
     "window": 4}

- `source`: "draft" (an accepted draft token) or "target" (the target's own token);
  `kind` says which: "accepted", "recovered" (sampled at the first rejection), "bonus"
  (after all of a step's drafts were kept) or "plain" (a step that verified no draft; the
  prefill's first token is step 0).
- `step`: the request's target pass the token came from; `window`: draft tokens this row
  verified in that pass.
- The `text` pieces of a chunk concatenate to exactly its content delta; a token whose text
  straddles two chunks (a stop string's held-back prefix) appears in both, with the same
  `index`; a token with no text (end-of-sequence, or cut by a stop string) has `text: ""`.
  So the pieces of a whole stream add up to the returned text, and counting distinct
  indices per `source` gives the request's usage figures. (An `echo`ed prompt's chunk has
  no records: its text is not generated.)

Why character offsets and not per-token decodes: a byte-level token may end inside a
character, and the detokenizer holds text back (partial characters, stop-string prefixes),
so text and tokens arrive out of step. Each token gets the offset where its text ends in
the decoded output, measured on a short tail (a few tokens of context) so the cost per
token stays constant; pieces are then slices of what the detokenizer really sent.
"""

from __future__ import annotations

CONTEXT = 4  # tokens decoded before the new ones, so merges across the boundary count
REPLACEMENT = "\ufffd"


def kinds(trace: list[tuple[int, int, int]], first_step: int) -> list[tuple[str, int, int]]:
    """(kind, step, window) per token emitted by the steps `trace` (drafted, kept, emitted
    per step, as `LiveSequence.trace` records them), numbered from `first_step`."""
    out = []
    for step, (drafted, kept, emitted) in enumerate(trace, start=first_step):
        own = "plain" if drafted == 0 else ("bonus" if kept == drafted else "recovered")
        out.extend(("accepted" if t < kept else own, step, drafted) for t in range(emitted))
    return out


class ProvenanceTracker:
    """Follows one choice's tokens and turns each text delta into per-token records."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ends: list[int] = []  # per token: where its text ends in the decoded output
        self.clean = [True]  # per boundary before token i: no partial character there
        self.origin: list[tuple[str, int, int]] = []  # per token: (kind, step, window)
        self.steps = 0  # trace entries seen
        self.cursor = 0  # first token not yet fully sent
        self.sent = 0  # characters sent

    def update(self, token_ids: list[int], trace: list[tuple[int, int, int]]) -> None:
        """Take the tokens generated so far (all of them) and the new steps' trace."""
        if not self.origin and token_ids:
            self.origin.append(("plain", 0, 0))  # the prefill's token
        self.origin += kinds(trace, self.steps + 1)
        self.steps += len(trace)
        new = len(token_ids) - len(self.ends)
        if new <= 0:
            return
        done = len(self.ends)
        # Decode from a clean boundary (the text before it has no partial character), a
        # few tokens back: a window starting inside a character would open with U+FFFD.
        start = max(0, done - CONTEXT)
        while not self.clean[start]:
            start -= 1
        ref = self.ends[-1] if self.ends else 0  # offset where token done-1's text ends

        def length(j: int) -> tuple[int, bool]:  # characters of tokens start..j-1 (a
            # trailing partial character not counted), and whether none was partial
            text = self.tokenizer.decode(token_ids[start:j], skip_special_tokens=True)
            whole = text.rstrip(REPLACEMENT)
            return len(whole), len(whole) == len(text)

        before, _ = length(done)
        for j in range(done + 1, len(token_ids) + 1):
            chars, clean = length(j)
            self.ends.append(max(ref + chars - before, self.ends[-1] if self.ends else 0))
            self.clean.append(clean)

    def records(self, delta: str, final: bool = False) -> list[dict]:
        """The records of the tokens `delta` (the next text sent) completes; with `final`,
        every remaining token too (those with no text left get empty pieces)."""
        out: list[dict] = []
        pos, end_sent = self.sent, self.sent + len(delta)
        i = self.cursor
        while i < len(self.ends):
            end = self.ends[i]
            if end > end_sent and not final:
                if pos < end_sent:  # part of this token's text now, the rest later
                    out.append(self._record(i, delta[pos - self.sent :]))
                    pos = end_sent
                break
            take = delta[pos - self.sent : max(pos, min(end, end_sent)) - self.sent]
            out.append(self._record(i, take))
            pos += len(take)
            i += 1
        if pos < end_sent:  # text the offsets did not account for: the last token's
            rest = delta[pos - self.sent :]
            if out:
                out[-1]["text"] += rest
            elif self.ends:
                out.append(self._record(min(i, len(self.ends) - 1), rest))
        self.cursor, self.sent = i, end_sent
        return out

    def _record(self, i: int, text: str) -> dict:
        kind, step, window = self.origin[i]
        source = "draft" if kind == "accepted" else "target"
        return {
            "index": i,
            "text": text,
            "source": source,
            "kind": kind,
            "step": step,
            "window": window,
        }
