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


@pytest.fixture(scope="module")
def metaspace():
    """A SentencePiece-style BPE (Metaspace, byte fallback): spaces are "▁" and a word's
    leading space belongs to its first token; characters outside the vocabulary arrive as
    byte tokens, one per UTF-8 byte."""
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", "<eos>", *bytes_], show_progress=False
    )
    tok.train_from_iterator(["hello world, done and end naive cafe"] * 10, trainer)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>"
    )


def _encode(tokenizer, text):
    """Token ids of `text`, byte tokens standing in for what the vocabulary lacks."""
    ids = []
    for token in tokenizer.backend_tokenizer.encode(text).tokens:
        if token == "<unk>":
            continue
        ids.append(tokenizer.convert_tokens_to_ids(token))
    return ids


@pytest.mark.parametrize("every", [1, 3])  # a speculative step emits several tokens at once
@pytest.mark.parametrize("kind", ["byte_level", "metaspace"])
def test_deltas_are_prefixes_of_the_final_text(request, kind, every):
    tokenizer = request.getfixturevalue(kind)
    ids = tokenizer(TEXT)["input_ids"] if kind == "byte_level" else _encode(tokenizer, TEXT)
    final = tokenizer.decode(ids, skip_special_tokens=True)
    detok = IncrementalDetokenizer(tokenizer)
    shown = ""
    for end in range(every, len(ids) + every, every):
        shown += detok.delta(ids[:end])
        assert final.startswith(shown) and "\ufffd" not in shown
    assert shown + detok.finish(ids) == final
    assert len(shown) >= len(final) - 2  # the stream kept up: at most a character held


def test_special_tokens_never_reach_the_stream():
    tok = tiny_tokenizer()
    ids = tok("ab")["input_ids"] + [tok.eos_token_id] + tok("cd")["input_ids"]
    deltas, rest = _stream(tok, ids)
    assert "".join(deltas) + rest == "abcd"
