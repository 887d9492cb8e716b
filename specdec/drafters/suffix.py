"""Suffix decoding (Oliaro et al., Arctic Inference 2025): draft the continuation of the
longest suffix of a row's history found in this request or in past requests' prompts
and outputs, as long as that continuation stays likely. Needs no model; deterministic,
so q is one-hot.

It pays off where traffic repeats itself across requests (agents, code edits): a past
answer re-emitted with small changes is drafted tens of tokens at a time.

`SuffixStore` holds every row's tokens (a segment per request) and, once a request
finishes, keeps its segment among the past ones, evicting the oldest past segments past
its token budget. Its index maps the n tokens before a position (n in `ANCHORS`) to the
latest positions they preceded, so a lookup is a few dictionary probes, then a
comparison of at most `MAX_CANDIDATES` candidates over at most `MAX_DEPTH` tokens, then a
walk forward over the candidates that matched longest: no scan of the store.

The speculation length adapts to the match, as in the paper: at most `alpha` times the
match length, and only while the continuation's probability stays at or above
`min_prob`. That probability is the product, position by position, of the share of the
matched occurrences that agree with the draft (the paper's empirical probability) and of
the rate at which the target kept drafted tokens of matches of that kind (`Calibration`,
learnt from the verdicts): a match seen once reads as certain by its counts alone, and in
chat a short one seldom is.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Sequence

import torch

from specdec.acceptors import Draft
from specdec.errors import InvalidParameterError

# Lengths of the contexts indexed at every position, longest first: a lookup takes the
# longest one that occurred before, so a frequent short context does not hide a long match.
ANCHORS = (16, 8, 4, 2)
MAX_CANDIDATES = 16  # latest positions kept per indexed context
MAX_DEPTH = 64  # the longest suffix compared (a longer match drafts no differently)
# The most tokens of past requests a store may keep. Measured with tracemalloc over a store
# of 64K tokens: 0.73 KB a token where no context repeats (random ids; 4 index entries a
# token), 0.14 KB where requests repeat each other; so the bound is at most ~3 GB.
MAX_STORE_TOKENS = 1 << 22
DEFAULT_STORE_TOKENS = 1 << 16
# Match kinds `Calibration` learns a rate for: the match length's bucket (these lower
# bounds) and whether it occurred once or more.
LENGTH_BUCKETS = (1, 4, 8, 16, 32)
_SHIFT = 32  # an index entry is segment << _SHIFT | position
_MASK = (1 << _SHIFT) - 1


class SuffixStore:
    """The tokens of live and past requests and the index over them; shared by every
    drafter of one process (an engine rebuilds its drafter as its batch grows) so that
    requests learn from the ones before."""

    def __init__(self, max_tokens: int = DEFAULT_STORE_TOKENS) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
            raise InvalidParameterError(
                f"the suffix store's budget must be a whole number of tokens, got {max_tokens!r}"
            )
        if not 0 <= max_tokens <= MAX_STORE_TOKENS:
            raise InvalidParameterError(
                f"the suffix store's budget must be 0..{MAX_STORE_TOKENS} tokens, got "
                f"{max_tokens} (a token of past requests takes up to 0.73 KB)"
            )
        self.max_tokens = max_tokens
        self.segments: dict[int, list[int]] = {}
        self.past: OrderedDict[int, None] = OrderedDict()  # finished segments, oldest first
        self.past_tokens = 0
        self._next_id = 0
        # Per anchor length n: hash of n tokens -> entries of the positions they preceded.
        self._index: dict[int, dict[int, list[int]]] = {n: {} for n in ANCHORS}
        self.calibration = Calibration()  # learnt by every drafter that drafts from here

    # ------------------------------------------------------------------ segments

    def open(self, tokens: Sequence[int]) -> int:
        """A new live segment holding `tokens`; returns its id."""
        seg = self._next_id
        self._next_id += 1
        if seg > _MASK:
            raise InvalidParameterError("the suffix store ran out of segment ids")
        self.segments[seg] = []
        self.extend(seg, tokens)
        return seg

    def extend(self, seg: int, tokens: Sequence[int]) -> None:
        """Append tokens to a live segment, indexing the contexts each new token follows."""
        seq = self.segments[seg]
        base = seg << _SHIFT
        longest = ANCHORS[0]
        for token in tokens:
            p = len(seq)  # the position the contexts ending at p - 1 precede
            context = tuple(seq[max(0, p - longest) : p])
            for n in ANCHORS:
                if p < n:
                    continue
                table = self._index[n]
                key = hash(context[-n:])
                entries = table.get(key)
                if entries is None:
                    table[key] = [base | p]
                else:
                    entries.append(base | p)
                    if len(entries) > MAX_CANDIDATES:
                        del entries[0]
            seq.append(token)

    def close(self, seg: int) -> None:
        """A request finished: its segment joins the past ones (or goes, with no budget)."""
        if seg not in self.segments or seg in self.past:
            return
        self.past[seg] = None
        self.past_tokens += len(self.segments[seg])
        while self.past_tokens > self.max_tokens and self.past:
            self._evict(next(iter(self.past)))

    def _evict(self, seg: int) -> None:
        """Drop a past segment and its index entries."""
        seq = self.segments.pop(seg)
        del self.past[seg]
        self.past_tokens -= len(seq)
        for n in ANCHORS:
            table = self._index[n]
            for p in range(n, len(seq)):
                key = hash(tuple(seq[p - n : p]))
                entries = table.get(key)
                if entries is None:
                    continue  # already dropped with an earlier position of this segment
                kept = [e for e in entries if e >> _SHIFT != seg]
                if kept:
                    table[key] = kept
                else:
                    del table[key]

    def num_entries(self) -> int:
        """Index entries held (what the budget bounds, with the tokens)."""
        return sum(len(e) for table in self._index.values() for e in table.values())

    # ------------------------------------------------------------------ drafting

    def match(self, context: list[int]) -> tuple[int, list[tuple[list[int], int]]]:
        """The longest suffix of `context` (at most `MAX_DEPTH` tokens) that occurred
        before, among the latest occurrences of its last `n` tokens for the longest `n`
        in `ANCHORS` that occurred: (its length, [(segment tokens, position after it)]
        for every occurrence of that length). (0, []) when nothing matches."""
        size = len(context)
        for n in ANCHORS:
            if size < n:
                continue
            entries = self._index[n].get(hash(tuple(context[-n:])))
            if not entries:
                continue
            best, found = 0, []
            for entry in reversed(entries):  # latest first
                seq = self.segments[entry >> _SHIFT]
                p = entry & _MASK
                m = _common_suffix(seq, p, context, MAX_DEPTH)
                if m < n:
                    continue  # a hash collision
                if m > best:
                    best, found = m, [(seq, p)]
                elif m == best:
                    found.append((seq, p))
            if found:
                return best, found
        return 0, []


class Calibration:
    """Per kind of match, the share of drafted tokens the target kept when the ones before
    them were kept: kept / tested with one of each as a prior (0.5 before any verdict),
    the counts halved past `HORIZON` tests so that the rate follows the traffic."""

    HORIZON = 64.0

    def __init__(self) -> None:
        self.kept: dict[tuple[int, bool], float] = {}
        self.tested: dict[tuple[int, bool], float] = {}

    @staticmethod
    def kind(length: int, occurrences: int) -> tuple[int, bool]:
        bucket = sum(length >= b for b in LENGTH_BUCKETS) - 1
        return bucket, occurrences > 1

    def rate(self, kind: tuple[int, bool]) -> float:
        return (self.kept.get(kind, 0.0) + 1) / (self.tested.get(kind, 0.0) + 2)

    def record(self, kind: tuple[int, bool], drafted: int, accepted: int) -> None:
        """A draft of `drafted` tokens of which the target kept the first `accepted`."""
        tested = self.tested.get(kind, 0.0) + min(accepted + 1, drafted)
        kept = self.kept.get(kind, 0.0) + accepted
        if tested > self.HORIZON:
            tested, kept = tested / 2, kept / 2
        self.tested[kind], self.kept[kind] = tested, kept


def _common_suffix(seq: list[int], end: int, context: list[int], most: int) -> int:
    """How many tokens before `end` in `seq` equal the last ones of `context` (<= most)."""
    most = min(most, end, len(context))
    if seq[end - most : end] == context[-most:]:  # one comparison in C: the usual case
        return most
    m = 0
    while m < most and seq[end - 1 - m] == context[-1 - m]:
        m += 1
    return m


def continuation(
    found: list[tuple[list[int], int]], limit: int, min_prob: float, rate: float = 1.0
) -> list[int]:
    """The draft of `weighed_continuation` (see there)."""
    return weighed_continuation(found, limit, min_prob, rate)[0]


def weighed_continuation(
    found: list[tuple[list[int], int]], limit: int, min_prob: float, rate: float = 1.0
) -> tuple[list[int], float]:
    """The likeliest continuation of the matched occurrences, at most `limit` tokens: at
    each position the token most of the occurrences still on the path agree on, while
    the product of those shares, each times `rate` (the chance the target keeps a drafted
    token of such a match), stays >= min_prob. An occurrence whose segment ends (a live
    request's own latest tokens) leaves the vote. Also returns the draft's expected accepted
    length, the sum of those products (the chance each position is reached and kept)."""
    draft: list[int] = []
    prob, active, expected = 1.0, found, 0.0
    for j in range(limit):
        votes: dict[int, int] = {}
        for seq, p in active:
            if p + j < len(seq):
                votes[seq[p + j]] = votes.get(seq[p + j], 0) + 1
        if not votes:
            break
        token = max(votes, key=votes.__getitem__)
        prob *= rate * votes[token] / sum(votes.values())
        if prob < min_prob:
            break
        draft.append(token)
        expected += prob
        if len(votes) > 1 or len(active) > votes[token]:
            active = [(seq, p) for seq, p in active if p + j < len(seq) and seq[p + j] == token]
    return draft, expected


class SuffixDrafter:
    """Drafts from a `SuffixStore` (a private one unless given the process's shared one).

    alpha: the draft is at most alpha x the match length (a long match is trusted further).
    min_prob: stop where the continuation's probability drops below this.
    min_match: draft nothing for a match shorter than this (a token or two of chat
        matches often, and a wrong draft widens the verify pass for nothing).
    calibrated: weigh the counts by the store's learnt acceptance per kind of match
        (`Calibration`); False drafts by the counts alone, as the paper does.
    """

    def __init__(
        self,
        store: SuffixStore | None = None,
        alpha: float = 1.0,
        min_prob: float = 0.1,
        min_match: int = 2,
        calibrated: bool = True,
    ) -> None:
        if not alpha > 0:
            raise InvalidParameterError(f"suffix drafter: alpha must be > 0, got {alpha}")
        if not 0 <= min_prob <= 1:
            raise InvalidParameterError(
                f"suffix drafter: min_prob must be in [0, 1], got {min_prob}"
            )
        if not 1 <= min_match <= MAX_DEPTH:
            raise InvalidParameterError(
                f"suffix drafter: min_match must be 1..{MAX_DEPTH}, got {min_match}"
            )
        self.store = store if store is not None else SuffixStore()
        self.alpha, self.min_prob, self.min_match = alpha, min_prob, min_match
        self.calibrated = calibrated
        self.rows: list[int | None] = []  # each row's segment in the store
        self._last: list[list[int]] = []  # the proposal of the current step, per row
        self._kinds: list[tuple[int, bool] | None] = []  # the kind of match each row drafted
        # Rows still live when the drafter goes (an engine's reset) count as finished.
        weakref.finalize(self, _close_all, self.store, self.rows)

    def tokens(self, row: int) -> list[int]:
        seg = self.rows[row]
        return [] if seg is None else self.store.segments[seg]

    def admit(self, histories: Sequence[Sequence[int]]) -> None:
        self.rows.extend(self.store.open(h) for h in histories)

    def lookup(self, row: int, k: int) -> list[int]:
        """Up to k tokens continuing row `row`'s history (see the module's docstring)."""
        return self._lookup(row, k)[0]

    def _lookup(self, row: int, k: int) -> tuple[list[int], tuple[int, bool] | None]:
        """The draft and its kind of match (None where nothing is drafted)."""
        draft, kind, _ = self.weighed_lookup(row, k)
        return draft, kind

    def weighed_lookup(self, row: int, k: int) -> tuple[list[int], tuple[int, bool] | None, float]:
        """(draft, kind of match or None, expected accepted length): the length is the
        match's frequency-adapted one (`weighed_continuation`), what a hybrid compares
        with its other drafter's."""
        if k <= 0:
            return [], None, 0.0
        length, found = self.store.match(self.tokens(row))
        if length < self.min_match:
            return [], None, 0.0
        kind = Calibration.kind(length, len(found))
        rate = self.store.calibration.rate(kind) if self.calibrated else 1.0
        limit = min(k, int(self.alpha * length))
        draft, expected = weighed_continuation(found, limit, self.min_prob, rate)
        return draft, kind if draft else None, expected

    def drafted(self, drafts: list[list[int]], kinds: list[tuple[int, bool] | None]) -> None:
        """What each row really drafted this step (a hybrid's other drafter drafted some):
        `commit` adds the kept ones to the store and calibrates on this drafter's own."""
        self._last, self._kinds = drafts, kinds

    def propose(self, k, params, generators) -> Draft:
        if k < 0:
            raise InvalidParameterError(f"a draft of {k} tokens: k must be >= 0")
        looked = [self._lookup(row, k) for row in range(len(self.rows))]
        self._last = [draft for draft, _ in looked]
        self._kinds = [kind for _, kind in looked]
        tokens = torch.zeros(len(self.rows), k, dtype=torch.long)  # [B, k]
        for row, found in enumerate(self._last):
            tokens[row, : len(found)] = torch.tensor(found, dtype=torch.long)
        lengths = torch.tensor([len(f) for f in self._last], dtype=torch.long)  # [B]
        return Draft(tokens=tokens, probs=None, lengths=lengths)

    def commit(self, num_accepted, next_tokens) -> None:
        pairs = zip(num_accepted.tolist(), next_tokens.tolist(), strict=True)
        for row, (n, nxt) in enumerate(pairs):
            seg = self.rows[row]
            if seg is not None:
                self.store.extend(seg, self._last[row][:n] + [nxt])
            if self._kinds and self._kinds[row] is not None:
                self.store.calibration.record(self._kinds[row], len(self._last[row]), n)

    def move_row(self, src: int, dst: int) -> None:
        """Row dst finished (the engine moves its last row there)."""
        self._close(dst)
        self.rows[dst] = self.rows[src]
        self.rows[src] = None
        self.reset_row(src)

    def reset_row(self, row: int) -> None:
        """Row `row` finished: its tokens join the past requests."""
        self._close(row)
        if row == len(self.rows) - 1:
            self.rows.pop()
        else:
            self.rows[row] = None

    def _close(self, row: int) -> None:
        seg = self.rows[row]
        if seg is not None:
            self.store.close(seg)
            self.rows[row] = None


def suffix_factory(store: SuffixStore, **options):
    """An engine's `drafter_factory` whose drafters all share `store`."""
    return lambda max_batch, max_len: SuffixDrafter(store, **options)


def _close_all(store: SuffixStore, rows: list[int | None]) -> None:
    for seg in rows:
        if seg is not None:
            store.close(seg)
