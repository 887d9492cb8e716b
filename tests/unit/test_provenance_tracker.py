"""ProvenanceTracker: per-token records whose pieces are exactly the streamed text, with
byte-level tokens that split characters and stop strings that hold text back."""

import pytest
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from specdec.serving.detokenizer import IncrementalDetokenizer
from specdec.serving.provenance import ProvenanceTracker, kinds


@pytest.fixture(scope="module")
def byte_tokenizer():
    """One token per byte (a byte-level BPE with no merges): 'é' is two tokens."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok)


def stream(tokenizer, ids, per_event, stop=()):
    """Replay a generation as the server sees it: the prefill's token, then `per_event`
    tokens per step (all but the last an accepted draft token). Returns (delta, records)
    per event."""
    detok, tracker = IncrementalDetokenizer(tokenizer, stop), ProvenanceTracker(tokenizer)
    out, n = [], 0
    while n < len(ids):
        m = 1 if n == 0 else min(per_event, len(ids) - n)
        trace = [] if n == 0 else [(per_event - 1, m - 1, m)]
        n += m
        final = n == len(ids)
        tracker.update(ids[:n], trace)
        text = detok.finish(ids[:n]) if final else detok.delta(ids[:n])
        out.append((text, tracker.records(text, final)))
    return out


def test_kinds_from_the_trace():
    trace = [(3, 1, 2), (3, 3, 4), (0, 0, 1), (2, 2, 2)]  # last: ended on a draft token
    assert kinds(trace, 1) == [
        ("accepted", 1, 3), ("recovered", 1, 3),
        ("accepted", 2, 3), ("accepted", 2, 3), ("accepted", 2, 3), ("bonus", 2, 3),
        ("plain", 3, 0),
        ("accepted", 4, 2), ("accepted", 4, 2),
    ]  # fmt: skip


@pytest.mark.parametrize("per_event", [1, 2, 3])
def test_split_characters_belong_to_the_token_that_completes_them(byte_tokenizer, per_event):
    text = "héllo, 世界!"
    ids = byte_tokenizer(text)["input_ids"]
    assert len(ids) == len(text.encode())
    chunks = stream(byte_tokenizer, ids, per_event)
    for delta, records in chunks:
        assert "".join(r["text"] for r in records) == delta
    records = [r for _, rs in chunks for r in rs]
    assert [r["index"] for r in records] == list(range(len(ids)))
    assert "".join(r["text"] for r in records) == text
    first_byte_of_e = text.encode().index("é".encode())
    assert records[first_byte_of_e]["text"] == ""  # half a character: nothing yet
    assert records[first_byte_of_e + 1]["text"] == "é"


def test_a_held_back_stop_prefix_goes_out_with_its_tokens(tokenizer):
    """Text held back as a possible stop string goes out later: the pieces of each chunk
    still add up to it, and every token shows up once."""
    ids = tokenizer("abXYcdXZ")["input_ids"]
    chunks = stream(tokenizer, ids, 2, stop=("XZq",))
    assert any(delta.endswith("d") for delta, _ in chunks)  # "XZ" was held back
    for delta, records in chunks:
        assert "".join(r["text"] for r in records) == delta
    records = [r for _, rs in chunks for r in rs]
    assert "".join(r["text"] for r in records) == "abXYcdXZ"
    assert [r["index"] for r in records] == list(range(len(ids)))
    assert [r["kind"] for r in records][:3] == ["plain", "accepted", "bonus"]


def test_text_cut_by_a_stop_string_leaves_empty_pieces(tokenizer):
    ids = tokenizer("hello STOP more")["input_ids"]
    chunks = stream(tokenizer, ids, 1, stop=("STOP",))
    records = [r for _, rs in chunks for r in rs]
    assert "".join(r["text"] for r in records) == "hello "
    assert sorted({r["index"] for r in records}) == list(range(len(ids)))
