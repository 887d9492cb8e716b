"""Grammar-constrained decoding through llguidance: which tokens a request may emit next.

llguidance (a Rust grammar engine with a token trie) computes the set of tokens that keep
the output inside a JSON schema or a Lark/regex grammar in tens of microseconds, takes a
token at a time and rolls back any number of them: what a verify pass needs, whose
positions follow draft tokens that may be rolled back. It was chosen over xgrammar 0.2.8,
which pulls triton and a TVM runtime into a CPU install; llguidance 1.9.1 is one wheel.

`GrammarCompiler` is built once per engine (the token table takes up to a second over a
150k vocabulary, so lazily, at the first constrained request); `compile` checks a grammar
and caches its compiled form; `matcher` starts one request's `LLMatcher`.
"""

from __future__ import annotations

import json
from copy import copy

import numpy as np
import torch

from specdec.errors import InvalidParameterError
from specdec.params import Grammar

ANY_OBJECT = '{"type": "object"}'
# JSON without free whitespace (a schema's "x-guidance" may allow it): a model cannot pad
# its answer with blanks up to max_tokens.
COMPACT = {"whitespace_flexible": False}


class GrammarCompiler:
    """Grammars over one tokenizer and a logits width of `vocab_size` columns."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids: frozenset[int]) -> None:
        self.hf_tokenizer = tokenizer
        self.vocab_size = vocab_size
        # The ids that end a constrained answer (a model's config may name ids past its
        # logits, which no pass can emit).
        self.eos_ids = sorted(t for t in eos_ids if t < vocab_size) or [tokenizer.eos_token_id]
        self._ll = None
        self._compiled: dict[tuple[str, str], str] = {}  # the latest grammars, compiled

    @property
    def tokenizer(self):
        """llguidance's view of the tokenizer (built at first use)."""
        if self._ll is None:
            self._ll = _ll_tokenizer(self.hf_tokenizer, self.vocab_size, self.eos_ids)
        return self._ll

    def compile(self, grammar: Grammar) -> str:
        """llguidance's grammar for `grammar`; InvalidParameterError if it cannot compile."""
        key = (grammar.kind, grammar.text)
        if key not in self._compiled:
            if len(self._compiled) >= 64:
                self._compiled.pop(next(iter(self._compiled)))
            self._compiled[key] = _compiled(self.tokenizer, *key)
        return self._compiled[key]

    def matcher(self, grammar: Grammar):
        import llguidance

        return llguidance.LLMatcher(self.tokenizer, self.compile(grammar), log_level=0)


def _compiled(ll_tokenizer, kind: str, text: str) -> str:
    import llguidance

    try:
        if kind in ("json_object", "json_schema"):
            schema = ANY_OBJECT if kind == "json_object" else text
            json.loads(schema)  # a clear message for what is not JSON at all
            source = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=COMPACT)
        else:
            source = llguidance.grammar_from(kind, text)
    except (ValueError, TypeError) as err:
        raise InvalidParameterError(f"the {kind} grammar does not compile: {err}") from None
    bad, messages = llguidance.LLMatcher.validate_grammar_with_warnings(source, ll_tokenizer)
    if bad:
        raise InvalidParameterError(f"the {kind} grammar does not compile: {messages}")
    return source


def allowed(matcher, vocab_size: int) -> torch.Tensor:
    """`[V]` bool: the tokens the matcher accepts next (EOS only once it is done)."""
    bits = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
    return torch.from_numpy(np.unpackbits(bits, bitorder="little")[:vocab_size].astype(bool))


def _ll_tokenizer(tokenizer, vocab_size: int, eos_ids: list[int]):
    """llguidance's tokenizer: from the tokenizer's own JSON (`backend_tokenizer`, a
    `LightTokenizer`'s or a transformers fast tokenizer's, added tokens included) where
    llguidance reads its decoder (byte-level BPE, SentencePiece), else from each token's
    decoded bytes (a tokenizer whose tokens decode one by one, as the tests'
    character-level one). Not through `llguidance.hf`, which imports transformers."""
    import llguidance

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        backend = copy(backend)
        backend.no_padding()
        backend.no_truncation()
        try:
            return llguidance.LLTokenizer(backend.to_str(), n_vocab=vocab_size, eos_token=eos_ids)
        except ValueError:
            pass
    special = set(tokenizer.all_special_ids)

    class Table:
        eos_token_id = eos_ids[0]
        bos_token_id = tokenizer.bos_token_id
        tokens = [
            b"" if i in special or i >= len(tokenizer) else tokenizer.decode([i]).encode()
            for i in range(vocab_size)
        ]
        special_token_ids = sorted(special)

        def __call__(self, text):
            if isinstance(text, bytes):
                text = text.decode("utf-8", errors="replace")
            return tokenizer(text, add_special_tokens=False)["input_ids"]

    wrapper = llguidance.TokenizerWrapper(Table())
    return llguidance.LLTokenizer(wrapper, n_vocab=vocab_size, eos_token=eos_ids)
