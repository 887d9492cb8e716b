"""Streaming text: deltas never split a character, never show what a stop string cuts, and
add up to exactly the final text."""

import pytest
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from specdec.serving.detokenizer import IncrementalDetokenizer

from tiny import tiny_tokenizer

TEXT = "naïve café 世界 🙂🚀 done. Ünïcödé ✓ end"


@pytest.fixture(scope="module")
def byte_level():
    """A byte-level BPE with a tiny vocabulary: multi-byte characters span several tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(["hello world, done and end"] * 10, trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok)


def _stream(tokenizer, ids, stop=()):
    detok = IncrementalDetokenizer(tokenizer, stop)
    deltas = [detok.delta(ids[: i + 1]) for i in range(len(ids))]
    return deltas, detok.finish(ids)


def test_multibyte_characters_are_never_split(byte_level):
    ids = byte_level(TEXT)["input_ids"]
    partial = [byte_level.decode(ids[: i + 1]) for i in range(len(ids))]
    assert any(p.endswith("\ufffd") for p in partial)  # the tokenizer does split characters
    deltas, rest = _stream(byte_level, ids)
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) + rest == TEXT


def test_stop_string_prefixes_are_held_back():
    tok = tiny_tokenizer()
    text = "abc STOP def"
    ids = tok(text)["input_ids"]
    deltas, rest = _stream(tok, ids, stop=("STOP",))
    shown = ""
    for d in deltas:
        shown += d
        assert "S" not in shown  # no part of the stop string ever reaches the client
    assert shown + rest == "abc "
    deltas, rest = _stream(tok, tok("a SToP b")["input_ids"], stop=("STOP",))
    assert "".join(deltas) + rest == "a SToP b"  # a prefix that did not complete is released
